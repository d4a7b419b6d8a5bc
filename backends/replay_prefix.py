"""A replay cut at an epoch: the rungs of successive halving (``ddlsim advise``, ``run --prune``).

Rule kept here: the replay of a trace's prefix measures exactly what the full replay measures
up to the cut. The prefix keeps every op up to and including the evaluation at the cut
(:func:`cut_index`), so each state before it is computed from the same ops in the same order;
the header keeps the whole trace's ⟨σ⟩ (``mean_staleness`` divides the rate by the run's mean
staleness, not the prefix's); and the replay takes the path (generic or stacked) that the whole
trace would take. Test errors, epochs, times and updates of every evaluation are then the full
replay's, bit for bit; only the train loss of the last one can differ (it averages the
minibatches computed by then, and the full replay computes the gradients in flight at the cut
earlier, with its batches).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..simulator.trace import APPLY, EVAL, Trace

UNTIL_EPOCH = "_until_epoch"  # a point's key: replay its trace up to the evaluation at this epoch
EPS = 1e-9                    # slack on "at or before epoch e" (epochs are float sums)


def cut_index(epochs: list[float] | np.ndarray, until: float) -> int:
    """Which evaluation a replay to epoch ``until`` ends at, given the evaluations' epochs in
    trace order: the last one at or before ``until``, but at least the first after training
    starts (epoch > 0); the last one when none is after the start."""
    e = np.asarray(epochs, dtype=float)
    if not len(e):
        raise ValueError("a trace without evaluations cannot be cut at an epoch")
    trained = np.flatnonzero(e > 0)
    first = int(trained[0]) if len(trained) else len(e) - 1
    within = np.flatnonzero(e <= until + EPS)
    return max(first, int(within[-1]) if len(within) else first)


def prefix(trace: Trace, until: float) -> Trace:
    """``trace`` up to and including its evaluation at epoch ``until`` (:func:`cut_index`);
    ``trace`` itself when that is its last evaluation."""
    ops = trace.ops
    evals = np.flatnonzero(ops["kind"] == EVAL)
    j = cut_index(ops["epoch"][evals], until)
    if j == len(evals) - 1:
        return trace
    end = int(evals[j]) + 1
    kept = {c: v[:end] for c, v in ops.items()}
    applies = kept["kind"] == APPLY
    n_in = int(kept["in_count"][applies].sum())  # inputs are in apply order: a prefix of them
    header = dict(trace.header)
    from .optim import mean_staleness  # (torch: not at import, so advise's argument checks stay quick)

    header.setdefault("mean_staleness", mean_staleness(trace.inputs["staleness"]))
    return Trace(header, kept, {c: v[:n_in] for c, v in trace.inputs.items()})


def until_of(point: dict[str, Any]) -> float | None:
    """The epoch a point's replay is cut at, or None (the whole trace)."""
    v = point.get(UNTIL_EPOCH)
    return None if v is None else float(v)
