"""Simulate one scenario point: pick the protocol's engine, build the trace and summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .trace import SCHEMA_VERSION, Trace

PS_FAMILY = ("hardsync", "softsync", "async", "ssp")


@dataclass
class SimResult:
    """A simulated run: its ``trace`` and the ``summary`` figures (summary.csv columns)."""

    trace: Trace
    summary: dict[str, Any]


def clean_point(point: dict[str, Any]) -> dict[str, Any]:
    """The point without bookkeeping keys (those starting with ``_``)."""
    return {k: v for k, v in point.items() if not k.startswith("_")}


def staleness_stats(staleness: np.ndarray) -> dict[str, float]:
    """Mean, median, 99th percentile and maximum of σ (NaN when there is none)."""
    if len(staleness) == 0:
        return {"staleness_mean": float("nan"), "staleness_p50": float("nan"),
                "staleness_p99": float("nan"), "staleness_max": float("nan")}
    s = staleness.astype(np.float64)
    return {
        "staleness_mean": float(s.mean()),
        "staleness_p50": float(np.percentile(s, 50)),
        "staleness_p99": float(np.percentile(s, 99)),
        "staleness_max": float(s.max()),
    }


def staleness_histogram(trace: Trace) -> list[tuple[int, int]]:
    """(σ, count) pairs of every applied gradient, σ ascending."""
    values, counts = np.unique(trace.inputs["staleness"], return_counts=True)
    return [(int(v), int(c)) for v, c in zip(values, counts)]


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


def simulate(point: dict[str, Any]) -> SimResult:
    """Run the simulator for a validated scenario point."""
    name = point["protocol"]["name"]
    if name in PS_FAMILY:
        from .ps import PSRun

        engine = PSRun(point)
        builder = engine.run()
        layout = "global_slice" if name == "hardsync" else "shard"
        trace = builder.build(header_for(point, 1, layout))
        summary = engine.stats()
    else:
        from .gossip import simulate_gossip  # decentralized family

        trace, summary = simulate_gossip(point)
    summary.update(staleness_stats(trace.inputs["staleness"]))
    return SimResult(trace, summary)
