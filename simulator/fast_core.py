"""What every fast engine is built from: the :func:`kernel` decorator, the numba primitives
(FIFO reservation, the event heap, the stall walk, a short sort, the eval cadence, the shard
layout, transfer time) and the Python side's draw buffers and trace-row folding.

Each primitive is the njit twin of one rule the SimPy engines keep in plain Python, and the
fast kernels call these by their public names:

* :func:`reserve` is :meth:`.resources.FifoServer.reserve` on a row of a ``(rows, 5)`` array
  (columns :data:`FREE_AT`, :data:`BUSY`, :data:`WAIT`, :data:`SERVED`, :data:`LAST_ARRIVAL`);
  an arrival before the previous one raises ``ValueError``, as ``FifoServer`` does;
* :func:`heap_push` / :func:`heap_pop`: a min-heap on (time, schedule counter), SimPy's order;
* :func:`advance_stall`, :func:`walk_stalls`, :func:`finish_work`: :class:`.compute.LearnerClock`'s stall walk,
  resumable when the stall draws run out;
* :func:`cadence_due` (:func:`next_mark`), :func:`shard_start`, :func:`slice_start`: the
  eval cadence's and the data layouts' own functions (:func:`.protocols.cadence.next_mark`,
  :func:`.dataorder.shard_position`, :func:`.dataorder.slice_position`), compiled;
  :func:`transfer_time`: :func:`.collectives.transfer_time`'s twin.

``kernel`` compiles a function with ``numba.njit(cache=True, nogil=True, error_model="numpy")``; with the
environment variable ``DDLSIM_NO_NUMBA=1`` (read at import), or ``kernel(python=True)``, it
returns the function unchanged: the same code runs as plain Python (slow; for a debugger or a
coverage run). Without numba installed the fast engines are unavailable (their ``covers``).
The kernels index with :data:`ix` wherever their invariants keep an index ≥ 0 (numba then skips
Python's wrap-around of negative indices).

numba's on-disk cache of a module is invalidated by that module's own source only, while the
kernels that call these primitives hold compiled copies of them: importing this module runs
:func:`.kernel_cache.refresh`, which drops every cached kernel once any source the fast engines
are built from has changed. :func:`.run.kernels_to_compile` counts this module as a source of
every kernel module.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

from . import dataorder, kernel_cache
from .protocols import cadence
from .stats import histogram, merge_histograms
from .trace import INPUT_COLUMNS, NONE_IS_MINUS_ONE, OP_COLUMNS, blank_columns, eval_schedule

try:  # numba is a dependency; without it (an unusual install) the fast engines are unavailable
    import numba
except ImportError:  # pragma: no cover
    numba = None  # type: ignore[assignment]

kernel_cache.refresh()  # before any kernel loads its cache: none is older than a source it was built from

PLAIN = os.environ.get("DDLSIM_NO_NUMBA", "") not in ("", "0")  # run the kernels as plain Python

F = TypeVar("F", bound=Callable[..., Any])


def kernel(fn: F | None = None, *, python: bool = False, inline: bool = False) -> Any:
    """``numba.njit(cache=True, nogil=True, error_model="numpy")`` of ``fn``; ``fn`` itself when
    ``python`` is true, ``DDLSIM_NO_NUMBA`` is set or numba is missing. Usable bare
    (``@kernel``) or called (``kernel(f, python=True)``). NumPy's error model drops the
    division-by-zero check of every ``/``, ``//`` and ``%`` (no kernel divides by zero: every
    divisor is a count or size ≥ 1); the same floats otherwise, and a fifth to a quarter off
    the PS kernel's CPU time on benchmarks/simulator.py's async λ = 32 (paired runs).
    ``inline``: numba inlines the function into each caller (``inline="always"``): for a helper
    of many array arguments called once an event, whose call would cost more than its body."""
    def wrap(f: F) -> F:
        if python or PLAIN or numba is None:
            return f
        return cast(F, numba.njit(cache=True, nogil=True, error_model="numpy",
                                  inline="always" if inline else "never")(f))
    return wrap if fn is None else wrap(fn)


# the status codes every kernel shares (a kernel's own codes are 5 and up)
DONE, NEED_WORK, NEED_STALL, NEED_ROWS, NEED_POOL = 0, 1, 2, 3, 4
STALL_MARGIN = 256    # stall draws a learner must have left before it starts a minibatch
FLUSH_OPS = 1 << 20   # summary-only runs keep this many trace rows at a time

# a FIFO row: FifoServer's fields
FREE_AT, BUSY, WAIT, SERVED, LAST_ARRIVAL = 0, 1, 2, 3, 4
FIFO_FIELDS = 5
# a learner's stall row: the current stall's start and end (LearnerClock._s, _e)
STALL_START, STALL_END = 0, 1
# where a stall walk that ran out of draws keeps its (t, work left), in the float row it is given
WALK_T, WALK_LEFT = 6, 7


ix = np.uint64
"""``a[ix(k)]``: index ``a`` with ``k`` known to be ≥ 0. numba gives a signed index Python's
meaning (``k + len(a)`` when ``k < 0``): a sign test, a mask of the length and an add at every
access, which LLVM drops only where it proves ``k ≥ 0``, rarely for an index read from an array
(a learner from the heap, a row counter). An unsigned index is used as it is: about a third of
the PS kernel's event loop (benchmarks/simulator.py, paired). Only for indices the kernel's
invariants keep ≥ 0 (a negative one reads out of bounds: run ``DDLSIM_NO_NUMBA=1``, where NumPy
refuses it); never in arithmetic (numba computes int64 with uint64 in floats)."""


@kernel
def transfer_time(nbytes: float, bandwidth: float) -> float:
    """:func:`.collectives.transfer_time`: ``nbytes / bandwidth``, 0 on a free link."""
    return 0.0 if math.isinf(bandwidth) else nbytes / bandwidth


@kernel
def reserve(fifo: np.ndarray, s: int, arrival: float, service: float) -> float:
    """FifoServer.reserve for row ``s`` of ``fifo`` (:data:`FREE_AT` … :data:`LAST_ARRIVAL`):
    the request's end. An arrival before the previous one (beyond 1e-9) raises ValueError and
    changes nothing."""
    if arrival < fifo[s, LAST_ARRIVAL] - 1e-9:
        raise ValueError("fast engine: a FIFO reservation arrived before the previous one")
    fifo[s, LAST_ARRIVAL] = arrival
    free = fifo[s, FREE_AT]
    start = free if free > arrival else arrival
    end = start + service
    fifo[s, FREE_AT] = end
    fifo[s, BUSY] += service
    fifo[s, WAIT] += start - arrival
    fifo[s, SERVED] += 1.0
    return end


@kernel
def advance_stall(i: int, stall: np.ndarray, sdraw: np.ndarray, spos: np.ndarray, slen: np.ndarray,
            scale_gap: float, scale_len: float) -> bool:
    """LearnerClock._advance: the next stall (two exponential draws); False when out of draws."""
    p = spos[i]
    if p + 2 > slen[i]:
        return False
    stall[i, STALL_START] += scale_gap * sdraw[i, p]
    e = stall[i, STALL_START] + scale_len * sdraw[i, p + 1]
    if e > stall[i, STALL_END]:
        stall[i, STALL_END] = e
    spos[i] = p + 2
    return True


@kernel
def walk_stalls(i: int, t: float, left: float, stall: np.ndarray, sdraw: np.ndarray, spos: np.ndarray,
         slen: np.ndarray, scale_gap: float, scale_len: float, keep: np.ndarray) -> float:
    """LearnerClock._walk from (t, left); −1 when the stall draws ran out, the walk's (t, left)
    then kept in ``keep[WALK_T]``, ``keep[WALK_LEFT]``. A failed :func:`advance_stall` changes
    nothing, and every place it can fail is followed by the loop's head, so resuming from the
    kept (t, left) replays the failed step and goes on as one uninterrupted walk would."""
    while True:
        while stall[i, STALL_END] <= t:
            if not advance_stall(i, stall, sdraw, spos, slen, scale_gap, scale_len):
                keep[WALK_T], keep[WALK_LEFT] = t, left
                return -1.0
        if stall[i, STALL_START] <= t:
            t = stall[i, STALL_END]
            if not advance_stall(i, stall, sdraw, spos, slen, scale_gap, scale_len):
                keep[WALK_T], keep[WALK_LEFT] = t, left
                return -1.0
            continue
        if t + left <= stall[i, STALL_START]:
            return t + left
        left -= stall[i, STALL_START] - t
        t = stall[i, STALL_END]
        if not advance_stall(i, stall, sdraw, spos, slen, scale_gap, scale_len):
            keep[WALK_T], keep[WALK_LEFT] = t, left
            return -1.0


@kernel
def finish_work(i: int, start: float, work: float, stall: np.ndarray, sdraw: np.ndarray, spos: np.ndarray,
           slen: np.ndarray, scale_gap: float, scale_len: float, keep: np.ndarray) -> float:
    """LearnerClock.finish: when ``work`` seconds begun at ``start`` end; −1 as :func:`walk_stalls`."""
    if stall[i, STALL_START] == math.inf:
        return start + work
    return walk_stalls(i, start, work, stall, sdraw, spos, slen, scale_gap, scale_len, keep)


@kernel
def heap_push(ht: np.ndarray, hk: np.ndarray, hs: np.ndarray, n: int, t: float, key: int, slot: int) -> int:
    """Push event ``slot`` at (time t, counter key); return the new size. A min-heap on (t, key)."""
    pos = n
    while pos > 0:
        parent = (pos - 1) >> 1
        if ht[ix(parent)] < t or (ht[ix(parent)] == t and hk[ix(parent)] < key):
            break
        ht[ix(pos)] = ht[ix(parent)]
        hk[ix(pos)] = hk[ix(parent)]
        hs[ix(pos)] = hs[ix(parent)]
        pos = parent
    ht[ix(pos)] = t
    hk[ix(pos)] = key
    hs[ix(pos)] = slot
    return n + 1


@kernel
def heap_pop(ht: np.ndarray, hk: np.ndarray, hs: np.ndarray, n: int) -> int:
    """Remove the root (the caller read it first); return the new size."""
    last = n - 1
    t, key, slot = ht[ix(last)], hk[ix(last)], hs[ix(last)]
    pos = 0
    while True:
        child = 2 * pos + 1
        if child >= last:
            break
        right = child + 1
        if right < last:
            tr, tc = ht[ix(right)], ht[ix(child)]
            if tr < tc or (tr == tc and hk[ix(right)] < hk[ix(child)]):
                child = right
        if t < ht[ix(child)] or (t == ht[ix(child)] and key < hk[ix(child)]):
            break
        ht[ix(pos)] = ht[ix(child)]
        hk[ix(pos)] = hk[ix(child)]
        hs[ix(pos)] = hs[ix(child)]
        pos = child
    ht[ix(pos)] = t
    hk[ix(pos)] = key
    hs[ix(pos)] = slot
    return last


@kernel
def sort_prefix(a: np.ndarray, n: int) -> None:
    """Sort a[:n] in place (a round's waiting learners): insertion sort when short, else NumPy's."""
    if n > 32:
        a[:n] = np.sort(a[:n])
        return
    for x in range(1, n):
        v = a[x]
        y = x - 1
        while y >= 0 and a[y] > v:
            a[y + 1] = a[y]
            y -= 1
        a[y + 1] = v


next_mark = kernel(cadence.next_mark)
shard_start = kernel(dataorder.shard_position)
slice_start = kernel(dataorder.slice_position)


@kernel
def cadence_due(mark: np.ndarray, at: int, every: float, samples: float, end: float) -> bool:
    """EvalCadence.due on the mark ``mark[at]`` (the cadence's ``next``; ``end`` its end, or
    ``inf``): True when an eval is due, the mark then moved on (:func:`.protocols.cadence.next_mark`)."""
    m = next_mark(mark[at], every, samples, end)
    if m == mark[at]:
        return False
    mark[at] = m
    return True


# ---------------------------------------------------------------------------------------------
# the Python side

class Buffers:
    """Per-learner draw buffers (2-D, refilled by whole chunks from the learner's own stream)."""

    def __init__(self, rows: int, cap: int) -> None:
        self.data = np.zeros((rows, cap))
        self.pos = np.zeros(rows, np.int64)
        self.len = np.zeros(rows, np.int64)

    def grow_row(self, i: int, values: np.ndarray) -> None:
        """Append ``values`` to row ``i``, first dropping the draws it has used (the kernel reads
        row i from ``pos[i]``), so that a long run's buffers stay the size of a chunk or two."""
        used = int(self.pos[i])
        if used:
            n = int(self.len[i]) - used
            self.data[i, :n] = self.data[i, used:used + n]
            self.len[i], self.pos[i] = n, 0
        end = int(self.len[i]) + len(values)
        if end > self.data.shape[1]:
            bigger = np.zeros((self.data.shape[0], max(end, 2 * self.data.shape[1])))
            bigger[:, :self.data.shape[1]] = self.data
            self.data = bigger
        self.data[i, self.len[i]:end] = values
        self.len[i] = end


def stall_state(point: dict[str, Any], clocks: list, chunk: int) -> tuple[np.ndarray, Buffers, float, float]:
    """The learners' transient stalls as the kernels walk them: each clock's current stall
    (start, end), its next ``4 · chunk`` exponential draws (standard; scaled by the mean gap and
    the mean length, as ``LearnerClock._advance`` draws them), and those two scales."""
    stalled = clocks[0]._s != math.inf
    strag = point["cluster"]["stragglers"]
    scale_gap = 1 / strag["stall_rate_per_s"] if stalled else 0.0
    scale_len = float(strag["stall_mean_s"]) if stalled else 0.0
    stall = np.array([[c._s, c._e] for c in clocks], dtype=np.float64)
    draws = Buffers(len(clocks), 4 * chunk if stalled else 1)
    if stalled:
        for i, clock in enumerate(clocks):
            draws.grow_row(i, clock._rng.standard_exponential(4 * chunk))
    return stall, draws, scale_gap, scale_len


def _block(n: int, spec: dict[str, str]) -> dict[str, np.ndarray]:
    """Zeroed columns of ``n`` rows of ``spec``'s dtypes as views of one allocation (widest
    dtypes first, so every column is aligned to its item size)."""
    order = sorted(spec, key=lambda name: -np.dtype(spec[name]).itemsize)  # (a stable sort)
    block = np.zeros(sum(n * np.dtype(spec[name]).itemsize for name in spec), np.uint8)
    cols, at = {}, 0
    for name in order:
        size = n * np.dtype(spec[name]).itemsize
        cols[name] = block[at:at + size].view(spec[name])
        at += size
    return {name: cols[name] for name in spec}


def block_columns(n_ops: int, n_inputs: int, defaults: bool = True
                  ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """:func:`.trace.blank_columns`'s columns (the same names, dtypes and defaults), each table
    one allocation: a table of separately allocated columns costs an allocation and its page
    faults per column, about ten times the fill at 50k–500k rows (this machine).
    ``defaults=False``: every column zero (buffers of rows that never form a trace, only folded
    by :func:`fold_rows`): no fill, so the pages no kernel writes are never touched."""
    ops = _block(n_ops, OP_COLUMNS)
    if defaults:
        for name in NONE_IS_MINUS_ONE:
            ops[name].fill(-1)
        ops["self_coef"].fill(1.0)
    return ops, _block(n_inputs, INPUT_COLUMNS)


def fold_rows(hist: list[tuple[int, int]], evals: list[tuple[float, float]], ops: dict[str, np.ndarray],
              inputs: dict[str, np.ndarray], n_ops: int, n_in: int) -> list[tuple[int, int]]:
    """A summary-only run's first ``n_ops`` ops and ``n_in`` inputs folded away: their evals
    appended to ``evals``; the histogram with their staleness added."""
    evals.extend(eval_schedule(ops, n_ops))
    return merge_histograms(hist, value_counts(inputs["staleness"][:n_in]))


def value_counts(values: np.ndarray) -> list[tuple[int, int]]:
    """:func:`.stats.histogram` of integer ``values``: (value, count) pairs, values ascending;
    counted in one pass (``np.bincount``) when they lie in 0 … 2¹⁶ − 1, as staleness does."""
    if len(values) and values.min() >= 0 and values.max() < 1 << 16:
        return nonzero_counts(np.bincount(values))
    return histogram(values)


def nonzero_counts(counts: np.ndarray) -> list[tuple[int, int]]:
    """The histogram of an array of counts by value (``counts[v]``: how often v occurred):
    (value, count) pairs of the values that occurred, ascending."""
    at = np.flatnonzero(counts)
    return list(zip(at.tolist(), counts[at].tolist()))


def doubled_columns(ops: dict[str, np.ndarray], inputs: dict[str, np.ndarray]
                    ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The columns followed by as many blank rows (a kept trace longer than its estimate)."""
    more_ops, more_in = blank_columns(len(ops["kind"]), len(inputs["grad_op"]))
    return ({k: np.concatenate([v, more_ops[k]]) for k, v in ops.items()},
            {k: np.concatenate([v, more_in[k]]) for k, v in inputs.items()})


def make_room(keep: bool, ops: dict[str, np.ndarray], inputs: dict[str, np.ndarray], n_ops: int, n_in: int,
              hist: list[tuple[int, int]], evals: list[tuple[float, float]]
              ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[tuple[int, int]], bool]:
    """Room for a kernel that ran out of trace rows holding ``n_ops`` ops and ``n_in`` inputs:
    twice the columns when the trace is kept, or when there is nothing to fold (buffers smaller
    than one event needs even empty); else those rows folded into the histogram and ``evals``.
    Returns ``(ops, inputs, hist, folded)``; the caller starts its rows over when folded."""
    if keep or n_ops == n_in == 0:
        ops, inputs = doubled_columns(ops, inputs)
        return ops, inputs, hist, False
    return ops, inputs, fold_rows(hist, evals, ops, inputs, n_ops, n_in), True
