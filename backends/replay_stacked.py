"""Stacked replay of multi-node (decentralized) traces: dataflow batches over a pool of rows.

Same semantics as the generic interpreter (:class:`.replay_generic.Replayer`, docs/replay.md):
results equal it to float rounding (tests/test_gossip_replay.py checks 1e-5). What differs
is the order of execution and how many calls it takes (docs/replay.md, "Multi-node traces"):

* **A pool of rows.** Every live weights version ``(node, version)`` is one row of one
  ``R × P`` tensor; rows ``0..N−1`` and ``N..2N−1`` are each node's two *home* rows, more
  are added when needed. The PushSum weights ``w`` depend on the trace only and are computed
  up front (``w ← self_coef·w + coef·w_src``, the generic path's own float arithmetic).
  Versions stay immutable snapshots: a row is written when its version is created and
  recycled after the version's last reader (reference counts from NumPy). A read of an
  older version — an SGP message reads the sender's post-step version, already superseded
  by the sender's own share; an AD-PSGD reply the passive node's pre-average state; a stale
  gradient — is a read of a row still alive; no read ever sees a newer version.
* **Mixes collapse.** A run of mixes on one node whose intermediate versions nobody else
  reads (SGP: keep one share, add this boundary's messages; D-PSGD: one mix per neighbour;
  all-reduce: the copy of node 0) is one sum ``x ← Σ_t a_t · x_t`` (float64 coefficients).
* **Dataflow batches.** Ops become ready when the versions and gradients they read exist.
  The scheduler runs every ready mix run, else every ready apply, else the evals, and only
  when nothing else is ready the ready gradients (one ``vmap`` call, up to the batch cap):
  gradients then run in rounds equal to the op graph's gradient depth, so the N gradients
  of an iteration share one call even when the nodes reach it at different trace positions
  (:func:`gradient_rounds` predicts the count exactly).
* **Contiguous batches.** Applies overwrite a version only the apply still reads, in place;
  mix runs write each node's other home row (ping-pong between the two regions), so in a
  synchronous iteration every batch is a slice of the pool: gradients read ``pool[a:a+N]``,
  the optimizer steps rows and per-node state rows in place, a mix run is one multiply
  plus one gather and ``addcmul`` per message column. Small (< ``SMALL_BATCH``) or scattered
  batches go op by op on views of their rows (gathers would cost more than they save).
* **Bounded bookkeeping.** Ops are released to the scheduler in trace order, a window of
  ``RELEASE_CHUNK`` at a time, so Python memory does not grow with the trace length.

Divergence: a non-finite minibatch loss, evaluated state or final state makes the stacked
run stop and the *generic* interpreter replay the trace from the start, so the partial
curves and ``diverged_at_update`` are exactly the generic path's (``fallback`` says so).
Models that cannot be batched (batch norm) and single-node traces use the generic path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from ..simulator.trace import APPLY, EVAL, GRAD, MIX, Trace
from .flatmodel import FlatModel
from .optim import Optimizer
from .replay_data import Diverged, LossLog, Minibatches
from .replay_generic import RUN_CHUNK, Replayer
from .replay_plan import BATCH_CAP, LOOKAHEAD, Plan, capped, check_header, plan_trace
from .workloads import Data


class GenericOptions(TypedDict):
    """What the stacked replay hands to the generic interpreter when it falls back to it."""

    batched: bool
    batch_cap: int
    lookahead: int


RELEASE_CHUNK = 1 << 14     # trace ops released to the scheduler at a time
SMALL_BATCH = 4             # fewer applies / mix runs than this: one by one, on views of rows


@dataclass(slots=True, eq=False)
class GradRec:
    """A consumed gradient: computed at ``x / w`` of state ``sid`` on the ``size`` samples
    at stream position ``start``, scaled by ``coef``; its loss counts towards eval ``interval``.
    ``reads``: what it waits for (state ids; gradient values are ``n_states + grad op``)."""

    op: int
    reads: tuple[int, ...]
    sid: int
    size: int
    start: int
    coef: float
    interval: int
    kind: ClassVar[int] = GRAD


@dataclass(slots=True, eq=False)
class ApplyRec:
    """State ``sid`` of ``node`` steps on ``Σ coefs · g(gops)`` with learning rate ``lr``."""

    op: int
    reads: tuple[int, ...]
    node: int
    sid: int
    gops: tuple[int, ...]
    coefs: tuple[float, ...]
    lr: float
    kind: ClassVar[int] = APPLY


@dataclass(slots=True, eq=False)
class ComboRec:
    """A collapsed run of mixes: ``node``'s new version ``new_sid = Σ_t coefs[t] · reads[t]``."""

    op: int
    reads: tuple[int, ...]
    node: int
    new_sid: int
    coefs: tuple[float, ...]
    kind: ClassVar[int] = MIX


@dataclass(slots=True, eq=False)
class EvalRec:
    """Eval ``ordinal`` of ``node``'s state (``reads[0]``) or of the average (node −1)."""

    op: int
    reads: tuple[int, ...]
    node: int
    ordinal: int
    kind: ClassVar[int] = EVAL


def _by_node(rec: ComboRec) -> int:
    return rec.node


def _by_state(rec: GradRec | ApplyRec) -> int:
    """Sort key of grad and apply records: the state id they read (node order, then version)."""
    return rec.sid


class StackedReplayer:
    """Replays a multi-node trace with batched gradients, applies and mixes (module doc).

    Same interface as :class:`.replay_generic.Replayer`: :meth:`run`, ``curves``, ``diverged``,
    ``diverged_at_update``, ``updates``, ``peak_live_states``, ``peak_live_grads``,
    :meth:`final_states`; plus ``grad_calls`` (gradient computations: vmap calls),
    ``op_calls`` (batched apply / combination calls) and ``fallback`` (None, or why the
    generic interpreter ran instead: "single node", "not batchable", "diverged").
    """

    def __init__(self, trace: Trace, model: nn.Module, data: Data, opt: Optimizer, *,
                 batched: bool = True, batch_cap: int = BATCH_CAP, lookahead: int = LOOKAHEAD) -> None:
        check_header(trace)
        self.trace, self.data, self.opt = trace, data, opt
        self.flat = FlatModel(model)
        # the generic plan without lookahead batching: lifetimes, coefficients, learning rates
        self.plan: Plan = plan_trace(trace, opt, False, capped(self.flat.size, batch_cap), lookahead)
        self.nodes = int(trace.header["nodes"])
        self.device = data.train_x.device
        self.minibatches = Minibatches(data, int(trace.header["data_seed"]), int(trace.header["samples_per_epoch"]))
        self.losses = LossLog(len(self.plan.evals), self.device)
        self.curves: list[dict[str, Any]] = []
        self.diverged = False
        self.diverged_at_update: int | None = None
        self.updates = 0
        self.peak_live_states = 0
        self.peak_live_grads = 0
        self._hooked = type(self).on_grad_reads is not StackedReplayer.on_grad_reads
        self._generic_kw = GenericOptions(batched=batched, batch_cap=batch_cap, lookahead=lookahead)
        self.fallback: str | None = None
        if self.nodes == 1:
            self.fallback = "single node"
        elif not (batched and self.flat.batchable):
            self.fallback = "not batchable"
        self.cap = capped(self.flat.size, batch_cap)
        self.grad_calls = 0
        self.op_calls = 0
        self._final: dict[int, tuple[Tensor, float]] = {}

    # -- public -------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        """Execute every op; return the curves (divergence: the generic replay's, see module doc)."""
        if self.fallback is not None:
            return self._run_generic()
        x0 = self.flat.work.detach().clone()
        try:
            self._prepare()
            self._run_stacked(x0)
        except Diverged:
            self.flat.work.detach().copy_(x0)  # the generic replay starts from the model's weights
            self.fallback = "diverged"
            return self._run_generic()
        return self.curves

    def final_states(self) -> dict[int, tuple[Tensor, float]]:
        """Each node's latest (x, w) (after :meth:`run`: the final weights)."""
        return self._final

    progress: Callable[[float], None] | None = None  # called after each eval with its epoch

    def on_grad_reads(self, ops: list[int], x: Tensor, w: list[float]) -> None:
        """Hook, a no-op here (as :meth:`.replay_generic.Replayer.on_grad_reads`)."""

    def _run_generic(self) -> list[dict[str, Any]]:
        rep = Replayer(self.trace, self.flat.model, self.data, self.opt, **self._generic_kw)
        rep.progress = self.progress
        rep.run()
        self._generic = rep
        for k in ("curves", "diverged", "diverged_at_update", "updates", "peak_live_states", "peak_live_grads"):
            setattr(self, k, getattr(rep, k))
        self._final = rep.final_states()
        self.grad_calls = rep.plan.calls
        return self.curves

    # -- preparation (NumPy over the whole trace) ---------------------------------------
    def _prepare(self) -> None:
        """Per-state readers and PushSum weights, evals' reads, which mixes fold into the next."""
        ops, plan, N = self.trace.ops, self.plan, self.nodes
        kind = ops["kind"]
        node = ops["node"].astype(np.int64)
        n = len(kind)
        offset = plan.offset
        mut = np.flatnonzero((kind == APPLY) | (kind == MIX))
        per_node = np.bincount(node[mut], minlength=N)
        n_states = int(per_node.sum() + N)
        sid_in = np.full(n, -1, np.int64)
        has = (kind != GRAD) & (node >= 0)
        sid_in[has] = offset[node[has]] + ops["version"][has].astype(np.int64)
        mixes = np.flatnonzero(kind == MIX)
        src_sid = np.full(n, -1, np.int64)
        src_sid[mixes] = offset[ops["src_node"][mixes].astype(np.int64)] + ops["src_version"][mixes]
        created = np.full(n_states, -1, np.int64)
        created[sid_in[mut] + 1] = mut
        mut_of = np.full(n_states, -1, np.int64)
        mut_of[sid_in[mut]] = mut
        # an eval also reads every node's latest version at its point (the average, the distance)
        evals = plan.evals
        latest_at = np.empty((len(evals), N), np.int64)
        keys = np.sort(node[mut] * (n + 1) + mut)  # (node, op) as one sorted key: no pass over mut per node
        first = np.searchsorted(keys, np.arange(N, dtype=np.int64) * (n + 1))
        for k in range(N):  # node k's mutations before each eval
            latest_at[:, k] = offset[k] + np.searchsorted(keys, k * (n + 1) + evals) - first[k]
        own = evals[node[evals] >= 0]
        # readers of every state: its mutation, grads, mixes (as sender), evals, the end
        readers = np.bincount(sid_in[mut], minlength=n_states)
        readers += np.bincount(plan.sid[plan.grads], minlength=n_states)
        readers += np.bincount(src_sid[mixes], minlength=n_states)
        readers += np.bincount(sid_in[own], minlength=n_states)
        readers += np.bincount(latest_at.ravel(), minlength=n_states)
        latest = offset + per_node
        readers[latest] += 1
        # a mix whose new version only the node's next mix reads is folded into that mix
        collapse = np.zeros(n, bool)
        s_out = sid_in[mixes] + 1
        nxt = mut_of[s_out]
        collapse[mixes] = (readers[s_out] == 1) & (nxt >= 0) & (kind[np.maximum(nxt, 0)] == MIX)
        # PushSum weights of every state, with the generic path's own float arithmetic
        w = [1.0] * n_states
        for lo in range(0, len(mut), RUN_CHUNK):
            m = mut[lo:lo + RUN_CHUNK]
            for s, is_mix, sc, cf, ss in zip(sid_in[m].tolist(), (kind[m] == MIX).tolist(),
                                             ops["self_coef"][m].tolist(), ops["coef"][m].tolist(),
                                             src_sid[m].tolist()):
                w[s + 1] = sc * w[s] + cf * w[ss] if is_mix else w[s]
        self._w = np.array(w)
        self._w_one = bool((self._w == 1.0).all())  # regular graphs without overlap: no de-biasing
        del w
        consumed = np.zeros(n, bool)
        consumed[plan.grads] = True
        self._exec = np.flatnonzero(consumed | (kind == APPLY) | (kind == EVAL) | ((kind == MIX) & ~collapse))
        is_apply = (kind == APPLY).astype(np.int64)
        self._updates_before = np.cumsum(is_apply) - is_apply
        self._eval_ordinal = np.full(n, -1, np.int64)
        self._eval_ordinal[evals] = np.arange(len(evals))
        self._latest_at = latest_at
        self._sid_in, self._src_sid, self._created, self._collapse = sid_in, src_sid, created, collapse
        self._readers, self._latest, self._n_states = readers, latest, n_states

    # -- execution ------------------------------------------------------------------------
    def _run_stacked(self, x0: Tensor) -> None:
        N, P = self.nodes, self.flat.size
        # rows 0..N−1 and N..2N−1: each node's two home rows; more rows are added as needed
        self._pool = x0.new_empty((2 * N, P))
        self._pool[:N] = x0
        self._home_free = bytearray([0] * N + [1] * N)
        self._home_sid = self.plan.offset.tolist() + [-1] * N  # the version in each home row
        self._free: list[int] = []   # free rows beyond the home rows
        self._row: dict[int, int] = {int(s): k for k, s in enumerate(self.plan.offset.tolist())}
        self._refs: dict[int, int] = {s: int(self._readers[s]) for s in self._row}
        self._gvals: dict[int, tuple[Tensor, int]] = {}    # grad value → (batch tensor, row)
        self._waiting: dict[int, list[Any]] = {}           # value → records waiting for it
        self._missing: dict[int, int] = {}                 # op → values it still waits for
        self._ready: dict[int, list[Any]] = {GRAD: [], APPLY: [], MIX: [], EVAL: []}
        self._released = 0                                 # position in self._exec
        self._unfinished = 0                               # released, not executed
        self._eval_rows: dict[int, dict[str, Any]] = {}
        opt = self.opt
        self._buf = opt.state_rows(N, self._pool)  # the nodes' optimizer state rows (None: no state)
        self.peak_live_states = N
        n_exec, ready = len(self._exec), self._ready
        while True:
            if self._released < n_exec and self._unfinished < RELEASE_CHUNK // 2:
                self._release()
            if ready[MIX]:
                self._combos(self._take(MIX))
            elif ready[APPLY]:
                self._applies(self._take(APPLY))
            elif ready[EVAL]:
                for rec in self._take(EVAL):
                    self._eval(rec)
            elif ready[GRAD]:
                self._grads(self._take_grads())
            elif self._released < n_exec:
                self._release()
            else:
                break
        if self._unfinished:
            raise RuntimeError(f"stacked replay: {self._unfinished} ops never became ready")
        self.losses.flush()
        pool, row, w = self._pool, self._row, self._w
        self._final = {k: (pool[row[s]], float(w[s])) for k, s in enumerate(self._latest.tolist())}
        if any(not bool(torch.isfinite(x).all()) for x, _ in self._final.values()):
            raise Diverged
        self.updates = int((self.trace.ops["kind"] == APPLY).sum())
        self.curves = []
        for j in sorted(self._eval_rows):
            r = self._eval_rows[j]
            r["train_loss"] = self.losses.mean(j)
            r["consensus_distance"] = r.pop("consensus_distance")  # the generic path's key order
            self.curves.append(r)

    def _take(self, k: int) -> list[Any]:
        recs = self._ready[k]
        self._ready[k] = []
        return recs

    def _take_grads(self) -> list[Any]:
        """Up to the cap of the ready gradients that share the first one's minibatch size."""
        ready = self._ready[GRAD]
        size = ready[0].size
        if len(ready) <= self.cap and all(rec.size == size for rec in ready):
            take, self._ready[GRAD] = ready, []
        else:
            take, keep = [], list[Any]()
            for rec in ready:
                (take if rec.size == size and len(take) < self.cap else keep).append(rec)
            self._ready[GRAD] = keep
        take.sort(key=_by_state)  # node order: the applies then take the batch as it is
        return take

    def _release(self) -> None:
        """Turn the next window of executable ops into records (:class:`GradRec`,
        :class:`ApplyRec`, :class:`ComboRec`, :class:`EvalRec`); queue them, or make them wait
        for what they read (state ids and, for gradients, ``n_states + grad op``).
        """
        ops, plan, inp = self.trace.ops, self.plan, self.trace.inputs
        lo = self._released
        hi = min(len(self._exec), lo + RELEASE_CHUNK)
        pos = self._exec[lo:hi]
        self._released = hi
        self._unfinished += hi - lo
        cols = zip(pos.tolist(), ops["kind"][pos].tolist(), ops["node"][pos].tolist(), self._sid_in[pos].tolist(),
                   plan.sid[pos].tolist(), ops["sample_start"][pos].tolist(), ops["batch_size"][pos].tolist(),
                   plan.coef[pos].tolist(), plan.interval[pos].tolist(), ops["in_start"][pos].tolist(),
                   ops["in_count"][pos].tolist(), plan.lr[pos].tolist(), self._eval_ordinal[pos].tolist())
        GV, row, gvals = self._n_states, self._row, self._gvals
        waiting, missing, ready = self._waiting, self._missing, self._ready
        for i, k, nd, sid, gsid, start, size, coef, interval, s, c, lr, j in cols:
            if k == GRAD:
                rec: Any = GradRec(i, (gsid,), gsid, size, start, coef, interval)
            elif k == APPLY:
                gops = tuple(inp["grad_op"][s:s + c].tolist())
                coefs = (1.0,) if c == 1 else tuple(plan.coefs[s:s + c].tolist())  # a single one is pre-scaled
                rec = ApplyRec(i, (sid, *[GV + g for g in gops]), nd, sid, gops, coefs, lr)
            elif k == MIX:
                sids, mix_coefs = self._chain(i)
                rec = ComboRec(i, tuple(sids), nd, sid + 1, tuple(mix_coefs))
            else:
                latest = self._latest_at[j].tolist()
                rec = EvalRec(i, tuple(latest) if nd < 0 else (sid, *latest), nd, j)
            wait = 0
            for v in rec.reads:
                if v not in (row if v < GV else gvals):
                    wait += 1
                    waiting.setdefault(v, []).append(rec)
            if wait:
                missing[i] = wait
            else:
                ready[k].append(rec)

    def _chain(self, i: int) -> tuple[list[int], list[float]]:
        """Reads and float64 coefficients of the run of mixes ending at op ``i``, as one sum."""
        ops = self.trace.ops
        sids: list[int] = []
        coefs: list[float] = []
        mult = 1.0
        while True:
            sids.append(int(self._src_sid[i]))
            coefs.append(float(ops["coef"][i]) * mult)
            mult *= float(ops["self_coef"][i])
            s = int(self._sid_in[i])
            p = int(self._created[s])
            if p >= 0 and self._collapse[p]:
                i = p
                continue
            sids.append(s)
            coefs.append(mult)
            return sids, coefs

    # -- rows -------------------------------------------------------------------------------
    def _target(self, node: int, region: int) -> int:
        """A free row for a new version of ``node``: its home row in ``region`` (0 or 1) if free,
        else its other home row, else a row beyond the home rows (the pool grows if needed)."""
        hf, N = self._home_free, self.nodes
        for r in (region * N + node, (1 - region) * N + node):
            if hf[r]:
                hf[r] = 0
                return r
        if not self._free:
            old = self._pool
            self._pool = torch.cat([old, torch.empty_like(old[:max(N, len(old) // 2)])])
            self._free = list(range(len(self._pool) - 1, len(old) - 1, -1))
        return self._free.pop()

    def _region(self, rows: list[int]) -> int:
        """The home region (0: rows 0..N−1, 1: rows N..2N−1) most of ``rows`` lie in."""
        N = self.nodes
        ones = sum(1 for r in rows if N <= r < 2 * N)
        zeros = sum(1 for r in rows if r < N)
        return 1 if ones > zeros else 0

    def _view(self, rows: list[int]) -> tuple[Tensor, bool]:
        """The pool rows ``rows``: a view when they are consecutive (True), else a gathered copy."""
        r0 = rows[0]
        if rows[-1] - r0 == len(rows) - 1 and rows == list(range(r0, r0 + len(rows))):
            return self._pool[r0:r0 + len(rows)], True
        return self._pool.index_select(0, torch.tensor(rows, device=self.device)), False

    def _out(self, rows: list[int]) -> Tensor | None:
        """A view of the pool rows ``rows`` to write into, when they are consecutive."""
        r0 = rows[0]
        if rows[-1] - r0 == len(rows) - 1 and rows == list(range(r0, r0 + len(rows))):
            return self._pool[r0:r0 + len(rows)]
        return None

    def _write(self, rows: list[int], values: Tensor) -> None:
        out = self._out(rows)
        if out is None:
            self._pool.index_copy_(0, torch.tensor(rows, device=self.device), values)
        elif out.data_ptr() != values.data_ptr():
            out.copy_(values)

    def _debias(self, x: Tensor, ws: np.ndarray) -> Tensor:
        """``x / w`` row by row (a new tensor), or ``x`` itself when every w is 1."""
        if not self._w_one and (ws != 1.0).any():
            return x / torch.from_numpy(ws).to(x)[:, None]
        return x

    # -- bookkeeping ----------------------------------------------------------------------
    def _done(self, recs: list[Any]) -> None:
        """Count the reads of executed records; free versions and gradients nobody reads any more."""
        refs, row, free, GV, gvals = self._refs, self._row, self._free, self._n_states, self._gvals
        hf, home = self._home_free, 2 * self.nodes
        for rec in recs:
            for v in rec.reads:
                if v >= GV:
                    del gvals[v]
                    continue
                c = refs[v] - 1
                if c:
                    refs[v] = c
                else:
                    del refs[v]
                    r = row.pop(v)
                    if r < home:
                        hf[r] = 1
                        self._home_sid[r] = -1
                    else:
                        free.append(r)
        self._unfinished -= len(recs)

    def _wake(self, v: int) -> None:
        """Value ``v`` exists now: queue the records that waited only for it."""
        recs = self._waiting.pop(v, None)
        if recs:
            missing, ready = self._missing, self._ready
            for rec in recs:
                i = rec.op
                c = missing[i] - 1
                if c:
                    missing[i] = c
                else:
                    del missing[i]
                    ready[rec.kind].append(rec)

    def _created_states(self, sids: list[int], rows: list[int]) -> None:
        """The new versions ``sids`` now live in ``rows``: register them, wake their readers."""
        row, refs, readers = self._row, self._refs, self._readers
        hf, hs, home = self._home_free, self._home_sid, 2 * self.nodes
        for s, r in zip(sids, rows):
            row[s] = r
            refs[s] = int(readers[s])
            if r < home:
                hf[r] = 0
                hs[r] = s
        if len(row) > self.peak_live_states:
            self.peak_live_states = len(row)
        for s in sids:
            self._wake(s)

    # -- the batched ops ---------------------------------------------------------------
    def _grads(self, recs: list[Any]) -> None:
        """One vmap call for the gradients of ``recs`` at x / w of the versions they read."""
        sids = [rec.sid for rec in recs]
        row = self._row
        x, _ = self._view([row[s] for s in sids])
        ws = self._w[sids]
        if self._hooked:
            self.on_grad_reads([rec.op for rec in recs], x, ws.tolist())
        z = self._debias(x, ws)
        xb, yb = self.minibatches.many(np.array([rec.start for rec in recs]), recs[0].size)
        coef = [rec.coef for rec in recs]
        scale = None if all(c == 1.0 for c in coef) else torch.tensor(coef, dtype=z.dtype, device=self.device)
        g, lt = self.flat.grad_batch(z, xb, yb, scale)
        self.grad_calls += 1
        self.losses.add_many([rec.interval for rec in recs], lt, 0)
        GV, gvals = self._n_states, self._gvals
        for b, rec in enumerate(recs):
            gvals[GV + rec.op] = (g, b)
        if len(gvals) > self.peak_live_grads:
            self.peak_live_grads = len(gvals)
        self._done(recs)
        for rec in recs:
            self._wake(GV + rec.op)

    def _combined(self, recs: list[Any]) -> Tensor:
        """(A, P): each apply's Σ coef · g (a lone gradient was scaled when it was computed)."""
        GV, gvals = self._n_states, self._gvals
        if all(len(rec.gops) == 1 for rec in recs):
            pairs = [gvals[GV + rec.gops[0]] for rec in recs]
            first = pairs[0][0]
            if all(t is first for t, _ in pairs):
                rows = [b for _, b in pairs]
                if rows == list(range(len(first))):
                    return first
                return first.index_select(0, torch.tensor(rows, device=self.device))
        groups: dict[int, tuple[Tensor, np.ndarray]] = {}
        for a, rec in enumerate(recs):
            for g, c in zip(rec.gops, rec.coefs):
                t, b = gvals[GV + g]
                entry = groups.get(id(t))
                if entry is None:
                    entry = groups[id(t)] = (t, np.zeros((len(recs), len(t))))
                entry[1][a, b] += c
        total: Tensor | None = None
        for t, cm in groups.values():
            part = torch.from_numpy(cm).to(t) @ t
            total = part if total is None else total.add_(part)
        assert total is not None
        return total

    def _applies(self, recs: list[Any]) -> None:
        """One optimizer step for every ready apply: rows of the pool, per-node state rows.

        The rule is :meth:`.optim.Optimizer.step_rows_` (the generic path's arithmetic, row by
        row). A version only the apply still reads is overwritten in place.
        """
        recs.sort(key=_by_state)
        sids = [rec.sid for rec in recs]
        row, refs = self._row, self._refs
        rows = [row[s] for s in sids]
        if len(recs) < SMALL_BATCH or self._out(rows) is None:
            for rec in recs:  # few, or scattered rows: gathers would cost more than they save
                self._apply_one(rec)
            return
        opt = self.opt
        x, is_view = self._view(rows)
        in_place = all(refs[s] == 1 for s in sids)
        if in_place:
            targets = rows
        else:
            region = self._region(rows)
            targets = [self._target(rec.node, region) for rec in recs]
        if is_view and not in_place:
            x = x.clone()  # the versions read stay as they are
        g = self._combined(recs)
        ws = self._w[sids]
        w = ws if opt.weight_decay and not self._w_one and (ws != 1.0).any() else None
        lrs = [rec.lr for rec in recs]
        lr = lrs[0] if all(v == lrs[0] for v in lrs) else torch.tensor(lrs, dtype=x.dtype, device=self.device)
        buf, state, nidx = self._buf, None, None
        if buf is not None:  # the nodes' state rows: a view when all nodes step, else a gathered copy
            nodes = [rec.node for rec in recs]
            if nodes == list(range(self.nodes)):
                state = buf
            else:
                nidx = torch.tensor(nodes, device=self.device)
                state = buf.index_select(0, nidx)
        opt.step_rows_(x, g, state, lr, w)
        if nidx is not None and buf is not None and state is not None:  # the gathered rows, back
            buf.index_copy_(0, nidx, state)
        self._write(targets, x)
        self.op_calls += 1
        if in_place:
            for s in sids:  # the row passes to the new version
                del refs[s]
                del row[s]
            self._unfinished -= len(recs)
            for rec in recs:
                for v in rec.reads[1:]:
                    del self._gvals[v]
        else:
            self._done(recs)
        self._created_states([s + 1 for s in sids], targets)

    def _combos(self, recs: list[Any]) -> None:
        """Every ready run of mixes at once, term by term: ``out = a_0 ⊙ x_self + Σ_t a_t ⊙ x_t``.

        Column 0 holds each combination's own previous version, column t its t-th message from
        the end (a shorter run is padded with its own version and coefficient 0, which keeps
        the generic path's NaN propagation). Each column is a view of the pool or one gather.
        """
        recs.sort(key=_by_node)
        row, N = self._row, self.nodes
        own = [row[rec.reads[-1]] for rec in recs]
        if len(recs) < SMALL_BATCH or self._out(own) is None:
            for rec in recs:  # few, or scattered rows: gathers would cost more than they save
                self._combo_one(rec)
            return
        width = max(len(rec.reads) for rec in recs)
        cols = [own]
        coefs = [[rec.coefs[-1] for rec in recs]]
        for t in range(2, width + 1):
            cols.append([row[rec.reads[-t]] if len(rec.reads) >= t else cols[0][a] for a, rec in enumerate(recs)])
            coefs.append([rec.coefs[-t] if len(rec.reads) >= t else 0.0 for rec in recs])
        # new rows: each node's home row in the region its own version is not in (ping-pong), also
        # when a version that dies with this batch sits there (then through a temporary)
        hf, hs, refs = self._home_free, self._home_sid, self._refs
        reads: dict[int, int] = {}
        for rec in recs:
            for s in rec.reads:
                reads[s] = reads.get(s, 0) + 1
        region = 1 - self._region(cols[0])
        targets, alias = [], False
        for rec in recs:
            r = region * N + rec.node
            if hf[r]:
                hf[r] = 0
            else:
                s = hs[r]
                if s >= 0 and refs[s] == reads.get(s, 0):
                    alias = True
                else:
                    r = self._target(rec.node, region)
            targets.append(r)
        out = None if alias else self._out(targets)
        acc = None
        for rows, cf in zip(cols, coefs):
            x, _ = self._view(rows)
            c0 = cf[0]
            a = c0 if all(c == c0 for c in cf) else torch.tensor(cf, dtype=x.dtype, device=self.device)[:, None]
            if acc is None:
                acc = torch.mul(x, a, out=out) if out is not None else torch.mul(x, a)
            elif isinstance(a, float):
                acc.add_(x, alpha=a)
            else:
                acc.addcmul_(x, a)
        assert acc is not None
        if out is None:
            self._write(targets, acc)
        self.op_calls += 1
        self._done(recs)
        self._created_states([rec.new_sid for rec in recs], targets)

    def _apply_one(self, rec: ApplyRec) -> None:
        """One apply on views of its pool row and optimizer-state row (a small batch)."""
        row, refs = self._row, self._refs
        nd, sid = rec.node, rec.sid
        r = row[sid]
        in_place = refs[sid] == 1
        t = r if in_place else self._target(nd, self._region([r]))
        pool = self._pool  # after _target, which may have grown it
        x = pool[r]
        GV, gvals = self._n_states, self._gvals
        if len(rec.gops) == 1:
            gt, b = gvals[GV + rec.gops[0]]
            g = gt[b]
        else:
            g = None
            for go, c in zip(rec.gops, rec.coefs):
                gt, b = gvals[GV + go]
                g = gt[b] * c if g is None else g.add_(gt[b], alpha=c)
        assert g is not None  # an apply has at least one gradient
        state = None if self._buf is None else self._buf[nd]
        self.opt.step_rows_(x, g, state, rec.lr, float(self._w[sid]), None if in_place else pool[t])
        self.op_calls += 1
        if in_place:
            del refs[sid], row[sid]
            self._unfinished -= 1
            for v in rec.reads[1:]:
                del gvals[v]
        else:
            self._done([rec])
        self._created_states([sid + 1], [t])

    def _combo_one(self, rec: ComboRec) -> None:
        """One run of mixes on views of pool rows (a small batch); its new row is a free one."""
        row = self._row
        sids, coefs, nd = rec.reads, rec.coefs, rec.node
        r_self = row[sids[-1]]
        t = self._target(nd, 1 - self._region([r_self]))
        pool = self._pool  # _target may have grown the pool
        out = pool[t]
        torch.mul(pool[r_self], coefs[-1], out=out)
        for s, c in zip(sids[:-1], coefs[:-1]):
            out.add_(pool[row[s]], alpha=c)
        self.op_calls += 1
        self._done([rec])
        self._created_states([rec.new_sid], [t])

    def _eval(self, rec: Any) -> None:
        """Test error of a version (or of the nodes' average) and the nodes' consensus distance."""
        i, sids, k, j = rec.op, rec.reads, rec.node, rec.ordinal
        self.losses.flush()
        row = self._row
        x, _ = self._view([row[s] for s in sids])
        z = self._debias(x, self._w[list(sids)])
        latest = z if k < 0 else z[1:]
        mean = latest.mean(0)
        if not bool(torch.isfinite(mean if k < 0 else z[0]).all()):
            raise Diverged
        ops = self.trace.ops
        self._eval_rows[j] = {
            "epoch": float(ops["epoch"][i]), "updates": int(self._updates_before[i]),
            "sim_time_s": float(ops["t_end"][i]),
            "test_error": self.flat.test_error(mean if k < 0 else z[0], self.data.test_x, self.data.test_y),
            "consensus_distance": float(torch.linalg.vector_norm(latest - mean, dim=1).mean()),
        }
        if self.progress is not None:
            self.progress(float(ops["epoch"][i]))
        self._done([rec])


def gradient_rounds(trace: Trace, plan: Any, cap: int) -> int:
    """The vmap calls the stacked replay makes for the consumed gradients of ``trace``.

    It computes gradients only when nothing else is ready, so a gradient runs in round
    1 + the latest round among the gradients its version depends on (the gradient depth of the
    op graph); a round's gradients are grouped by minibatch size, ``cap`` per call. Exact when
    each round's gradients of one size fit in one call (gossip traces: N ≤ cap); otherwise an
    upper bound (leftovers join the next round). One pass over the mutations and gradients.
    """
    ops, inp = trace.ops, trace.inputs
    kind = ops["kind"]
    n = len(kind)
    offset = plan.offset
    mut = (kind == APPLY) | (kind == MIX)
    n_states = int(mut.sum()) + len(offset)
    depth = [0] * n_states          # gradient rounds before a version exists
    gdepth: dict[int, int] = {}     # consumed grad op → its round (until its apply)
    count: dict[tuple[int, int], int] = {}
    consumed = np.zeros(n, bool)
    consumed[plan.grads] = True
    rel = np.flatnonzero(consumed | mut)
    grad_op = inp["grad_op"]
    for lo in range(0, len(rel), RUN_CHUNK):
        pos = rel[lo:lo + RUN_CHUNK]
        node = ops["node"][pos].astype(np.int64)
        sid = np.where(kind[pos] == GRAD, plan.sid[pos], offset[node] + ops["version"][pos])
        src = offset[np.maximum(ops["src_node"][pos], 0).astype(np.int64)] + ops["src_version"][pos]
        for i, k, s, ss, size, a, c in zip(pos.tolist(), kind[pos].tolist(), sid.tolist(), src.tolist(),
                                           ops["batch_size"][pos].tolist(), ops["in_start"][pos].tolist(),
                                           ops["in_count"][pos].tolist()):
            if k == GRAD:
                d = depth[s] + 1
                gdepth[i] = d
                count[(d, size)] = count.get((d, size), 0) + 1
            elif k == APPLY:
                d = depth[s]
                for g in grad_op[a:a + c].tolist():
                    d = max(d, gdepth.pop(g))
                depth[s + 1] = d
            else:
                depth[s + 1] = max(depth[s], depth[ss])
    return sum(-(-c // cap) for c in count.values())
