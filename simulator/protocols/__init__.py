"""The protocol core: every protocol's rules once, without SimPy, torch or time.

* :mod:`.catalog` — what each protocol is (family, update rule, live capabilities);
* :mod:`.ps` — the parameter-server rules (:class:`~.ps.PSCore`);
* :mod:`.gossip` — the decentralized family's trace encoding (:class:`~.gossip.GossipRecorder`);
* :mod:`.gossip_rules` — the decentralized protocols' rules (SGP, D-PSGD, AD-PSGD, AllReduce-SGD:
  who sends what to whom, with which weights, when a node may advance), shared with the fast
  engines as tables and numba-compiled functions;
* :mod:`.cadence` — when a run evaluates; :mod:`.header` — the trace header of a point.

The SimPy engines supply time and ask the core what happens; the live backend's server and
nodes are receive loops around the same objects (docs/design-notes.md).
"""

from .cadence import EvalCadence
from .catalog import (GOSSIP, GOSSIP_PROTOCOLS, PROTOCOLS, PS, PS_PROTOCOLS, SPECS, ProtocolSpec, is_ps,
                      live_refusal, spec_of)
from .gossip import AVERAGE, GossipRecorder, iterations
from .header import GLOBAL_SLICE, SHARD, clean_point, header_for, sim_id, simulation_point
from .ps import PSCore, gradients_per_update, total_gradients

__all__ = ["EvalCadence", "GOSSIP", "GOSSIP_PROTOCOLS", "PROTOCOLS", "PS", "PS_PROTOCOLS", "SPECS",
           "ProtocolSpec", "is_ps", "live_refusal", "spec_of", "AVERAGE", "GossipRecorder", "iterations",
           "GLOBAL_SLICE", "SHARD", "clean_point", "header_for", "sim_id", "simulation_point", "PSCore",
           "gradients_per_update", "total_gradients"]
