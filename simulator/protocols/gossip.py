"""The decentralized family's trace encoding and shared rules, without time.

``N`` nodes each hold a state ``(x_i, w_i)`` (trace versions 0, 1, …) and run
:func:`iterations` iterations. What a run writes (docs/decentralized.md has the full
write-up of each protocol):

* a gradient of node ``i``'s ``k``-th minibatch (its own shard of the data order, or for
  AllReduce-SGD slice ``i`` of global batch ``k``) on the state it read;
* an apply of one gradient to node ``i`` (σ as the protocol defines it);
* a mix ``x_i ← self_coef·x_i + coef·x_src(src_version)`` (w likewise);
* AllReduce-SGD's round: the ``N`` gradients, one apply on node 0 with all of them at
  weight ``1/N`` (a gradient is applied once, so node 0 stands for everyone), then on every
  other node a mix copying node 0's new version (``self_coef = 0, coef = 1``);
* evals of the nodes' average (node −1) at t = 0, on the cadence of
  :class:`.cadence.EvalCadence` and at the end (after the last messages are mixed).

:class:`GossipRecorder` is that encoding; the SimPy engines (:mod:`ddlsim.simulator.gossip`)
and the live nodes' log merger (:mod:`ddlsim.backends.live_gossip`) both write through it.
What each protocol sends to whom, with which weights and when a node advances is
:mod:`.gossip_rules` (on the graphs of :mod:`..topology` and the weights of :mod:`..mixing`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..dataorder import ShardLayout, global_slice_start
from ..trace import EVAL, TraceBuilder
from .cadence import EvalCadence
from .gossip_rules import allreduce_weights
from .header import header_for

AVERAGE = -1  # eval node (and version) meaning "the average of the nodes' latest states"


def iterations(point: dict[str, Any]) -> int:
    """Iterations per node: enough for the epochs at N·μ samples per iteration."""
    n, mu = point["cluster"]["learners"], point["cluster"]["minibatch"]
    return max(1, math.ceil(point["workload"]["epochs"] * point["workload"]["samples_per_epoch"] / (n * mu)))


def trace_header(point: dict[str, Any], layout: str) -> dict[str, Any]:
    """A decentralized run's trace header: the point's, with its nodes and iterations per node."""
    header = header_for(point, point["cluster"]["learners"], layout)
    header["iterations"] = iterations(point)
    return header


def run_figures(n: int, K: int, T: float, grads: int, applies: int, compute_s: float, link_in: float,
                link_out: float, bytes_sent: float, messages: int, blocked_s: float, delay_sum: int,
                delay_count: int) -> dict[str, Any]:
    """A decentralized run's summary figures (summary.csv columns) from its totals: ``n`` nodes,
    ``K`` iterations each, ``T`` simulated seconds, the NICs' mean utilisations."""
    return {
        "gradients": grads,
        "updates": applies,
        "iterations": K,
        "sim_time_s": T,
        "iteration_time_s": T / K,
        "gradients_per_s": grads / T if T > 0 else math.inf,
        "server_utilization": 0.0,          # no server in the decentralized family
        "server_wait_mean_s": math.nan,
        "link_in_utilization": link_in,
        "link_out_utilization": link_out,
        "compute_utilization": compute_s / (n * T) if T > 0 else 0.0,
        "bytes_sent_per_node_per_iter": bytes_sent / (n * K),
        "messages": messages,
        "blocked_mean_s": blocked_s / (n * K),
        "message_delay_mean_iters": delay_sum / delay_count if delay_count else 0.0,
    }


class GossipRecorder:
    """Writes a decentralized run's ops into ``tb``; tracks every node's version and progress."""

    def __init__(self, point: dict[str, Any], tb: TraceBuilder | None = None) -> None:
        cl, wl = point["cluster"], point["workload"]
        self.n = cl["learners"]
        self.mu = cl["minibatch"]
        self.spe = wl["samples_per_epoch"]
        self.K = iterations(point)
        self.shards = ShardLayout(self.n, self.mu, self.spe)
        self.tb = tb if tb is not None else TraceBuilder()
        self.version = [0] * self.n
        self.samples = 0
        self.grads = 0
        self.applies = 0
        # the eval due at the very end is the final one, after every message is mixed
        self.cadence = EvalCadence(self.spe, wl["evals_per_epoch"], end=self.K * self.n * self.mu)

    def begin(self) -> None:
        """The run starts with an eval of the nodes' average."""
        self.tb.eval(AVERAGE, AVERAGE, 0.0, 0.0)

    def grad(self, i: int, k: int, v: int, t_start: float, t_end: float) -> int:
        """Node ``i``'s gradient of its ``k``-th minibatch (its shard) on its version ``v``."""
        self.grads += 1
        start = self.shards.start(k, i)
        return self.tb.grad(i, i, v, start, self.mu, k, t_start, t_end, self.samples / self.spe)

    def apply(self, i: int, gop: int, staleness: int, t: float, epoch: float | None = None) -> None:
        """Node ``i`` applies gradient ``gop``. ``epoch``: the progress its learning rate
        followed (default: the samples applied by all nodes; a live node knows only its own)."""
        self.samples += self.mu
        self.applies += 1
        self.tb.apply(i, self.version[i], (gop,), (1.0,), (staleness,), t,
                      self.samples / self.spe if epoch is None else epoch)
        self.version[i] += 1
        self._maybe_eval(t)

    def mix(self, i: int, src: int, src_version: int, coef: float, self_coef: float,
            t_start: float, t_end: float) -> None:
        """``x_i ← self_coef·x_i + coef·x_src(src_version)`` (w likewise)."""
        self.tb.mix(i, self.version[i], src, src_version, coef, self_coef, t_start, t_end,
                    self.samples / self.spe)
        self.version[i] += 1

    def allreduce_round(self, k: int, starts: Sequence[float], ends: Sequence[float], t: float,
                        weights: Sequence[float] | None = None) -> None:
        """AllReduce-SGD's iteration ``k``: node ``i`` computed from ``starts[i]`` to ``ends[i]``
        on version ``k``; the reduced average (``weights``, default
        :func:`.gossip_rules.allreduce_weights`) was applied everywhere at ``t``."""
        n, mu, tb = self.n, self.mu, self.tb
        epoch = self.samples / self.spe
        gops = [tb.grad(i, i, k, global_slice_start(k, i, n, mu), mu, k, starts[i], ends[i], epoch)
                for i in range(n)]
        self.grads += n
        self.samples += n * mu
        self.applies += 1
        epoch = self.samples / self.spe
        tb.apply(0, k, gops, allreduce_weights(n) if weights is None else list(weights), [0] * n, t, epoch)
        for i in range(1, n):
            tb.mix(i, k, 0, k + 1, 1.0, 0.0, t, t, epoch)
        for i in range(n):
            self.version[i] = k + 1
        self._maybe_eval(t)

    def finish(self, t: float) -> None:
        """The run ends at ``t`` with an eval of the nodes' average (unless it just had one)."""
        if self.tb.last_kind != EVAL:
            self.tb.eval(AVERAGE, AVERAGE, t, self.samples / self.spe)

    def _maybe_eval(self, t: float) -> None:
        if self.cadence.due(self.samples):
            self.tb.eval(AVERAGE, AVERAGE, t, self.samples / self.spe)
