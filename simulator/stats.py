"""Staleness figures of a trace (pure NumPy): the summary's σ columns and the histogram."""

from __future__ import annotations

import numpy as np

from .trace import Trace


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
