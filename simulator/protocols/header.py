"""The trace header of a simulated or live run of a scenario point (docs/trace.md)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..network_profile import without_profile_key
from ..trace import LOCAL_SCHEMA, SCHEMA_VERSION
from .catalog import LOCAL_PROTOCOLS, elide_late_defaults

GLOBAL_SLICE = "global_slice"  # learner i's k-th minibatch is slice i of global batch k
SHARD = "shard"                # each learner walks its own shard of every epoch


def clean_point(point: dict[str, Any]) -> dict[str, Any]:
    """The point without bookkeeping keys (those starting with ``_``)."""
    return {k: v for k, v in point.items() if not k.startswith("_")}


# keys the simulation does not depend on: points differing only in these share one simulation
NOT_SIMULATED = ("name", "description", "backend", "optimizer", "live", "replicates")
NOT_SIMULATED_WORKLOAD = ("target_error", "final_evals")


def simulation_point(point: dict[str, Any]) -> dict[str, Any]:
    """The point as the simulator sees it: without bookkeeping and :data:`NOT_SIMULATED` keys."""
    out = elide_late_defaults({k: v for k, v in clean_point(without_profile_key(point)).items()
                               if k not in NOT_SIMULATED})
    out["workload"] = {k: v for k, v in out["workload"].items() if k not in NOT_SIMULATED_WORKLOAD}
    return out


def schema_of(point: dict[str, Any]) -> int:
    """The trace schema a simulation of ``point`` writes: :data:`..trace.LOCAL_SCHEMA` for local
    SGD, DiLoCo and a compressed all-reduce (outer ops, the ``averaging`` header field), the
    first version for everything else (their traces are unchanged)."""
    proto = point["protocol"]
    if proto["name"] in LOCAL_PROTOCOLS or proto.get("compression", "none") != "none":
        return LOCAL_SCHEMA
    return SCHEMA_VERSION


def sim_id(point: dict[str, Any]) -> str:
    """A name for the simulation of ``point``: protocol, λ, μ and a hash of its simulated keys
    and the trace schema (equal for points that share one simulation)."""
    blob = json.dumps({"v": schema_of(point), "p": simulation_point(point)}, sort_keys=True, separators=(",", ":"),
                      default=str)
    c = point["cluster"]
    return f"sim-{point['protocol']['name']}-l{c['learners']}-m{c['minibatch']}-" \
           f"{hashlib.sha256(blob.encode()).hexdigest()[:10]}"


def header_for(point: dict[str, Any], nodes: int, layout: str) -> dict[str, Any]:
    """The trace header: schema, the simulation's id and point, seed, sizes and data order."""
    wl = point["workload"]
    return {
        "schema_version": schema_of(point),
        "run_id": sim_id(point),
        "protocol": point["protocol"]["name"],
        "nodes": nodes,
        "seed": point["seed"],
        "param_count": wl["param_count"],
        "data_seed": point["seed"],
        "samples_per_epoch": wl["samples_per_epoch"],
        "data_layout": layout,
        "point": simulation_point(point),
    }
