"""Staleness figures of a trace (pure NumPy): the summary's σ columns and the histogram."""

from __future__ import annotations

import numpy as np

from .trace import Trace


def staleness_stats(staleness: np.ndarray) -> dict[str, float]:
    """Mean, median, 99th percentile and maximum of σ (NaN when there is none); the same
    numbers as :func:`stats_from_histogram` of its histogram."""
    values, counts = np.unique(np.asarray(staleness), return_counts=True)
    return stats_from_histogram(list(zip(values.tolist(), counts.tolist())))


def stats_from_histogram(hist: list[tuple[int, int]]) -> dict[str, float]:
    """The σ columns from (σ, count) pairs, σ ascending: the exact mean (an integer sum, one
    rounding) and NumPy's ``percentile`` (method "linear") of the values the pairs stand for,
    so that a run simulated without keeping its trace reports the same numbers."""
    n = sum(c for _, c in hist)
    if n == 0:
        return {"staleness_mean": float("nan"), "staleness_p50": float("nan"),
                "staleness_p99": float("nan"), "staleness_max": float("nan")}
    return {
        "staleness_mean": sum(int(v) * int(c) for v, c in hist) / n,
        "staleness_p50": _percentile(hist, n, 50.0),
        "staleness_p99": _percentile(hist, n, 99.0),
        "staleness_max": float(hist[-1][0]),
    }


def _percentile(hist: list[tuple[int, int]], n: int, q: float) -> float:
    """numpy.percentile(values, q) for the sorted values ``hist`` stands for (NumPy's linear
    interpolation, including its form for weights ≥ 0.5)."""
    pos = (np.float64(q) / 100) * (n - 1)
    lo = int(np.floor(pos))
    t = float(pos - lo)
    a, b = float(_at(hist, lo)), float(_at(hist, min(lo + 1, n - 1)))
    return b - (b - a) * (1 - t) if t >= 0.5 else a + (b - a) * t


def _at(hist: list[tuple[int, int]], k: int) -> int:
    """The k-th smallest value (0-based) of the values ``hist`` stands for."""
    seen = 0
    for v, c in hist:
        seen += c
        if k < seen:
            return v
    return hist[-1][0]


def staleness_histogram(trace: Trace) -> list[tuple[int, int]]:
    """(σ, count) pairs of every applied gradient, σ ascending."""
    return histogram(trace.inputs["staleness"])


def histogram(staleness: np.ndarray) -> list[tuple[int, int]]:
    """(σ, count) pairs of ``staleness``, σ ascending."""
    values, counts = np.unique(staleness, return_counts=True)
    return [(int(v), int(c)) for v, c in zip(values, counts)]


def merge_histograms(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The histogram of both halves of a run."""
    out: dict[int, int] = dict(a)
    for v, c in b:
        out[v] = out.get(v, 0) + c
    return sorted(out.items())
