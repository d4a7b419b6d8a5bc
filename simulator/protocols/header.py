"""The trace header of a simulated or live run of a scenario point (docs/trace.md)."""

from __future__ import annotations

from typing import Any

from ..trace import SCHEMA_VERSION

GLOBAL_SLICE = "global_slice"  # learner i's k-th minibatch is slice i of global batch k
SHARD = "shard"                # each learner walks its own shard of every epoch


def clean_point(point: dict[str, Any]) -> dict[str, Any]:
    """The point without bookkeeping keys (those starting with ``_``)."""
    return {k: v for k, v in point.items() if not k.startswith("_")}


def header_for(point: dict[str, Any], nodes: int, layout: str) -> dict[str, Any]:
    """The trace header: schema, scenario point, seed, sizes and data order."""
    wl = point["workload"]
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": point.get("_id", ""),
        "protocol": point["protocol"]["name"],
        "nodes": nodes,
        "seed": point["seed"],
        "param_count": wl["param_count"],
        "data_seed": point["seed"],
        "samples_per_epoch": wl["samples_per_epoch"],
        "data_layout": layout,
        "point": clean_point(point),
    }
