"""The generic replay: execute a trace's ops in trace order with real gradients.

The interpreter never knows which protocol wrote the trace (docs/replay.md):

* ``grad``: the cross-entropy gradient of the op's minibatch (:class:`.replay_data.Minibatches`)
  at ``x / w`` of the state it reads;
* ``apply``: ``x ← opt(x, Σ_i coef_i · g_i)`` with the apply's staleness-aware learning rate
  (:func:`.optim.step_rates`: the policy scales the rate of the step); ``w`` is unchanged;
* ``mix``: ``x ← self_coef·x + coef·x_src``, ``w ← self_coef·w + coef·w_src``;
* ``eval``: the test error of ``x / w`` of a state, or (node −1) of the mean over nodes of
  each node's latest ``x / w``.

Memory: a state (node, version) is freed after the last op that reads it; a gradient is
freed by the apply that consumes it; gradients no apply consumes are never computed
(:mod:`.replay_plan`). Batching: an apply's gradients that all read one version (a hardsync
round), or versions provably equal to it (an all-reduce round: each node's copy of the same
weights, :func:`.replay_plan.equal_states`), are computed *fused*, by one forward and backward
over all their samples, each weighted by its gradient's coefficient over its minibatch size;
otherwise, when the replay reaches a gradient not yet computed, it computes it together with
later gradients whose states already exist (same batch size) in one batched call, when
:func:`.replay_plan.batch_rows` says such row batches pay for this model on this device. It
never computes a gradient later than its own op.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable, Generator

import numpy as np
import torch
from torch import Tensor, nn

from ..simulator.trace import APPLY, GRAD, MIX, Trace
from .flatmodel import FlatModel
from .optim import Optimizer
from .replay_data import Diverged, LossLog, Minibatches
from .replay_plan import (ALONE, BATCH_CAP, FUSED_IN_BUFFER, IN_BUFFER, LOOKAHEAD, ROWS, batch_rows, capped,
                          check_header, plan_trace)
from .workloads import Data

RUN_CHUNK = 1 << 16         # ops whose columns are turned into Python lists at a time
BATCHING = ("auto", "always")
FUSED_ROW = -2              # a stored gradient that is a fused batch's combined gradient


@dataclass(slots=True, eq=False)
class GradRequest:
    """A batch of gradients a replay needs computed (:meth:`Replayer.compute` computes it).

    Rows (``fused`` False): row b is the mean cross-entropy gradient of minibatch (xb[b],
    yb[b]) at ``zs[b]`` (``zs`` of one: every row reads it) times ``scale[b]`` (None: 1).
    Fused: one gradient of ``Σ_s scale[s] · ℓ_s`` at ``zs[0]`` over the samples (xb, yb),
    ``in_buffer``: it may be left in the model's gradient buffer. ``b`` is the plan's batch,
    ``gops`` its grad ops (fused: by stream position), ``sizes`` their minibatch sizes when
    they differ (fused)."""

    b: int
    fused: bool
    zs: list[Tensor]
    xb: Tensor
    yb: Tensor
    scale: Tensor | None
    in_buffer: bool
    gops: np.ndarray
    sizes: list[int] | None


class Replayer:
    """Executes one trace once, starting every node from ``model``'s current weights (the
    model is rewired by :class:`FlatModel`). After :meth:`run`: ``curves``, ``diverged``,
    ``diverged_at_update``, ``updates``, ``peak_live_states`` / ``peak_live_grads`` (most
    weights versions / gradients held at once) and :meth:`final_states`.

    ``batched``: batch gradients at all (False: every gradient alone, by plain autograd);
    ``batching``: "auto" (row batches as :func:`.replay_plan.batch_rows` decides for this
    model and device) or "always" (row batches up to the memory cap whatever they cost);
    ``fuse``: fused batches of an apply's gradients on one version or equal ones (with ``batched``).
    """

    def __init__(self, trace: Trace, model: nn.Module, data: Data, opt: Optimizer, *,
                 batched: bool = True, batch_cap: int = BATCH_CAP, lookahead: int = LOOKAHEAD,
                 batching: str = "auto", fuse: bool = True) -> None:
        check_header(trace)
        if batching not in BATCHING:
            raise ValueError(f"batching {batching!r}: expected one of {', '.join(BATCHING)}")
        self.trace, self.data, self.opt = trace, data, opt
        self.flat = FlatModel(model)
        self.batched = batched and self.flat.batchable
        self.device = data.train_x.device
        self.rows = (capped(self.flat.size, batch_cap) if batching == "always" else
                     batch_rows(self.flat.size, self.flat.work.element_size(), self.device.type, self.flat.kernel,
                                batch_cap))
        # gradients one at a time by the model's own kernels where row batches do not pay
        self.flat.row_kernel = self.batched and self.rows == 1
        self.plan = plan_trace(trace, opt, self.batched, self.rows, lookahead, self.batched and fuse)
        self.nodes = int(trace.header["nodes"])
        self.minibatches = Minibatches(data, int(trace.header["data_seed"]), int(trace.header["samples_per_epoch"]))
        self.losses = LossLog(len(self.plan.evals), self.device)
        self.states: dict[int, tuple[Tensor, float]] = {}
        self.grads: dict[int, tuple[Tensor, int]] = {}
        self.curves: list[dict[str, Any]] = []
        self.diverged = False
        self.diverged_at_update: int | None = None
        self._finite_seen: Tensor | None = None  # the last state a copy mix found finite
        self.updates = 0
        self.peak_live_states = 0
        self.peak_live_grads = 0
        self._current: list[int] = self.plan.offset.tolist()  # each node's latest state id
        self._freed = 0  # states freed so far (a position in plan.free_order)
        self._hooked = type(self).on_grad_reads is not Replayer.on_grad_reads

    progress: Callable[[float], None] | None = None  # called after each eval with its epoch

    def on_grad_reads(self, ops: list[int], x: Tensor, w: list[float]) -> None:
        """Hook, a no-op here: called before the gradients of grad ops ``ops`` are computed,
        with the PushSum numerators ``x`` (one row per op; do not modify, clone to keep) and
        weights ``w`` of the versions they read. Tests subclass it to observe the states."""

    # -- states -------------------------------------------------------------------------
    def _z(self, sid: int) -> Tensor:
        x, w = self.states[sid]
        return x if w == 1.0 else x / w

    def final_states(self) -> dict[int, tuple[Tensor, float]]:
        """Each node's latest (x, w) (after :meth:`run`: the final weights)."""
        return {k: self.states[s] for k, s in enumerate(self._current)}

    # -- ops ----------------------------------------------------------------------------
    def _request(self, b: int) -> GradRequest:
        """What batch ``b`` needs computed: its weights, samples and coefficients."""
        plan, gops = self.plan, self.plan.batches[b]
        ops, data = self.trace.ops, self.data
        if plan.kinds[b] != ROWS:
            return self._fused_request(b)
        size = int(ops["batch_size"][gops[0]])
        xb, yb = self.minibatches.many(ops["sample_start"][gops], size)
        sids = plan.sid[gops].tolist()
        zs = [self._z(sids[0])] if min(sids) == max(sids) else [self._z(s) for s in sids]
        if self._hooked:
            self.on_grad_reads(gops.tolist(), torch.stack([self.states[s][0] for s in sids]),
                               [self.states[s][1] for s in sids])
        coef = plan.coef[gops]
        scale = torch.from_numpy(coef).to(data.train_x) if (coef != 1.0).any() else None
        return GradRequest(b, False, zs, xb, yb, scale, False, gops, None)

    def _fused_request(self, b: int) -> GradRequest:
        """Fused batch ``b``: ``Σ_j coef_j · g_j`` over its gradients (one apply's, all on one
        version or on versions equal to it: :func:`.replay_plan.equal_states`) as one gradient
        over all their samples, sample s of gradient j weighted ``coef_j / size_j``; computed
        at the state its first grad op reads (which exists then)."""
        plan, gops = self.plan, self.plan.batches[b]
        ops = self.trace.ops
        sizes = ops["batch_size"][gops]
        starts = ops["sample_start"][gops]
        sid = int(plan.sid[gops[0]])
        x, w = self.states[sid]
        if self._hooked:
            self.on_grad_reads(gops.tolist(), x.unsqueeze(0).expand(len(gops), -1), [w] * len(gops))
        order = np.argsort(starts, kind="stable")  # by stream position: a round's minibatches tile a range
        gops, sizes, starts = gops[order], sizes[order], starts[order]
        coef = plan.coef[gops]
        size = int(sizes[0])
        uniform = bool((sizes == size).all())
        if (starts[1:] == starts[:-1] + sizes[:-1]).all():  # one stretch of the stream: a slice
            xb, yb = self.minibatches.one(int(starts[0]), int(sizes.sum()))
        elif uniform:
            xb, yb = self.minibatches.many(starts, size)
            xb, yb = xb.reshape(-1, *xb.shape[2:]), yb.reshape(-1)
        else:  # minibatches of several sizes, apart in the stream
            idx = np.concatenate([self.minibatches.indices(np.array([s]), int(k))[0]
                                  for s, k in zip(starts.tolist(), sizes.tolist())])
            t = torch.from_numpy(idx).to(self.device)
            xb, yb = self.data.train_x[t], self.data.train_y[t]
        weights = torch.from_numpy(np.repeat(coef / sizes, sizes)).to(self.data.train_x)
        return GradRequest(b, True, [x if w == 1.0 else x / w], xb, yb, weights, plan.kinds[b] == FUSED_IN_BUFFER,
                           gops, None if uniform else sizes.tolist())

    def compute(self, req: GradRequest) -> tuple[Tensor, Tensor]:
        """``req``'s gradients and losses, by this replay's model: rows (B, P) and losses (B,),
        or a fused batch's one gradient (P,) and its per-sample losses (N,)."""
        if req.fused:
            assert req.scale is not None  # a fused request weighs its samples
            return self.flat.grad_weighted(req.zs[0], req.xb, req.yb, req.scale, req.in_buffer)
        return self.flat.grad_batch(req.zs, req.xb, req.yb, req.scale)

    def _finish(self, req: GradRequest, result: tuple[Tensor, Tensor]) -> None:
        """Keep ``req``'s gradients until their applies; count their losses."""
        g, lt = result
        gops = req.gops
        if req.fused:
            if req.sizes is None:
                lt = lt.view(len(gops), -1).mean(1)
            else:
                lt = torch.stack([part.mean() for part in lt.split(req.sizes)])
            self.losses.add_many(self.plan.interval[gops].tolist(), lt, self.updates)
            for op in gops.tolist():
                self.grads[op] = (g, FUSED_ROW)
        else:
            self.losses.add_many(self.plan.interval[gops].tolist(), lt, self.updates)
            for row, op in enumerate(gops.tolist()):
                self.grads[op] = (g, row)
        self.peak_live_grads = max(self.peak_live_grads, len(self.grads))

    def _compute_one(self, op: int, start: int, size: int, sid: int, j: int, coef: float,
                     in_place: bool = False) -> None:
        """Compute the gradient of grad op ``op`` alone (plain autograd; the lean path);
        ``in_place``: leave it in the model's gradient buffer (its apply comes first)."""
        xb, yb = self.minibatches.one(start, size)
        x, w = self.states[sid]
        if self._hooked:
            self.on_grad_reads([op], x.unsqueeze(0), [w])
        g, loss = self.flat.grad(x if w == 1.0 else x / w, xb, yb, coef, in_place)
        self.losses.add_one(j, loss, self.updates)
        self.grads[op] = (g, -1)
        if len(self.grads) > self.peak_live_grads:
            self.peak_live_grads = len(self.grads)

    def _combined_grad(self, s: int, c: int) -> Tensor:
        """Σ coef_j · g_j over inputs s .. s+c−1 (one gemv per batch the gradients came from);
        zero for an apply with no inputs (the optimizer still steps: momentum carries on)."""
        pop, coefs = self.grads.pop, self.plan.coefs
        groups: dict[int, tuple[Tensor, list[int], list[float]]] = {}
        for j, op in enumerate(self.trace.inputs["grad_op"][s:s + c].tolist()):
            g, row = pop(op)
            if row == FUSED_ROW:  # already Σ coef_j · g_j over its batch: added once
                groups.setdefault(id(g), (g, [], []))
                continue
            if row < 0:
                g, row = g.unsqueeze(0), 0
            entry = groups.setdefault(id(g), (g, [], []))
            entry[1].append(row)
            entry[2].append(float(coefs[s + j]))
        total: Tensor | None = None
        for g, rows, cs in groups.values():
            if not rows:
                part = g
            else:
                cv = torch.tensor(cs, dtype=g.dtype, device=g.device)
                part = cv @ (g if rows == list(range(len(g))) else g[rows])
            total = part if total is None else total + part
        return total if total is not None else torch.zeros_like(self.flat.work)  # an apply of no inputs

    def average_state(self) -> Tensor:
        """Mean over nodes of each node's latest ``x / w`` (what an eval of node −1 measures)."""
        if self.nodes == 1:
            return self._z(self._current[0])
        mean = torch.zeros_like(self.flat.work)
        for s in self._current:
            mean.add_(self._z(s))
        return mean.div_(self.nodes)

    def consensus_distance(self, mean: Tensor) -> float:
        """Mean over nodes of ‖z_n − mean‖ (Euclidean) for the nodes' latest de-biased states."""
        total = torch.zeros((), dtype=mean.dtype, device=mean.device)
        for s in self._current:
            total += torch.linalg.vector_norm(self._z(s) - mean)
        return float(total) / self.nodes

    def _eval(self, i: int) -> None:
        ops, plan = self.trace.ops, self.plan
        self.losses.flush()
        k = int(ops["node"][i])
        z = self._z(int(plan.offset[k] + ops["version"][i])) if k >= 0 else self.average_state()
        if not bool(torch.isfinite(z).all()):
            raise Diverged
        j = len(self.curves)
        row: dict[str, Any] = {
            "epoch": float(ops["epoch"][i]), "updates": self.updates, "sim_time_s": float(ops["t_end"][i]),
            "test_error": self.flat.test_error(z, self.data.test_x, self.data.test_y),
            "train_loss": self.losses.mean(j),
        }
        if self.nodes > 1:
            row["consensus_distance"] = self.consensus_distance(z if k < 0 else self.average_state())
        self.curves.append(row)
        if self.progress is not None:
            self.progress(row["epoch"])

    def run(self) -> list[dict[str, Any]]:
        """Execute every op; return the curves (divergence stops the run, never raises)."""
        steps = self.steps()
        try:
            req = next(steps)
            while True:
                req = steps.send(self.compute(req))
        except StopIteration:
            pass
        return self.curves

    def steps(self) -> Generator[GradRequest, tuple[Tensor, Tensor], None]:
        """:meth:`run` as a generator: it yields every batch of gradients it needs and must be
        sent :meth:`compute`'s result for it (or the same values computed otherwise:
        :func:`.replay_multi.replay_many` computes several replays' requests in one call)."""
        x0 = self.flat.work.detach().clone()
        self.states.update({int(s): (x0, 1.0) for s in self.plan.offset})
        self.peak_live_states = len(self.states)
        try:
            for base in range(0, self.trace.n_ops, RUN_CHUNK):
                yield from self._run_ops(base, min(self.trace.n_ops, base + RUN_CHUNK))
            self.losses.flush()
            finals = {id(x): x for x, _ in self.final_states().values()}  # copies share a tensor: once each
            if any(not bool(torch.isfinite(x).all()) for x in finals.values()):
                raise Diverged
        except Diverged:
            if self.losses.updates_at_divergence is not None:  # where it was computed, not noticed
                self.updates = self.losses.updates_at_divergence
            self.diverged, self.diverged_at_update = True, self.updates

    def _run_ops(self, lo: int, hi: int) -> Generator[GradRequest, tuple[Tensor, Tensor], None]:
        """Execute ops ``lo .. hi−1`` (their columns as Python lists: the hot loop); yield each
        batch's request and take its result."""
        ops, plan, states = self.trace.ops, self.plan, self.states
        pop, step, current, grad_op = self.grads.pop, self.opt.step, self._current, self.trace.inputs["grad_op"]
        starts = ops["in_start"][lo:hi]
        has_input = ops["in_count"][lo:hi] > 0
        first = np.full(hi - lo, -1, np.int64)  # an apply's first input's grad op (−1: none)
        first[has_input] = grad_op[starts[has_input]]
        cols = [ops[c][lo:hi].tolist() for c in ("kind", "node", "version")] + [first.tolist()]
        cols += [ops[c][lo:hi].tolist() for c in ("in_count", "sample_start", "batch_size")]
        cols += [a[lo:hi].tolist() for a in (plan.lead, plan.sid, plan.interval, plan.coef, plan.lr)]
        counts = plan.free_count[lo:hi].tolist()
        f0 = self._freed
        self._freed += sum(counts)
        free = plan.free_order[f0:self._freed].tolist()
        offset, fp = plan.offset.tolist(), 0
        mixes = ops["kind"][lo:hi] == MIX
        copy = (mixes & (ops["self_coef"][lo:hi] == 0.0) & (ops["coef"][lo:hi] == 1.0)).tolist()
        copy_src = np.where(mixes, plan.offset[np.maximum(ops["src_node"][lo:hi], 0)] + ops["src_version"][lo:hi],
                            -1).tolist()
        for r, (k, nd, ver, g0, c, start, size, lead, sid, j, coef, lr) in enumerate(zip(*cols)):
            i = lo + r
            if k == APPLY:
                sid = offset[nd] + ver
                x, w = states[sid]
                if c == 1:  # its coefficient was applied when it was computed
                    g, row = pop(g0)
                    if row >= 0:
                        g = g[row]
                else:
                    g = self._combined_grad(int(starts[r]), c)
                states[sid + 1] = (step(nd, x, g, lr, w), w)
                current[nd] = sid + 1
                self.updates += 1
            elif k == GRAD:
                if lead <= ALONE:
                    self._compute_one(i, start, size, sid, j, coef, lead == IN_BUFFER)
                elif lead >= 0:
                    req = self._request(lead)
                    self._finish(req, (yield req))
            elif k == MIX:
                if copy[r]:  # the source's own tensor and weight (_mix's rule, for a finite state)
                    self._check_finite(states[offset[nd] + ver])
                    states[offset[nd] + ver + 1] = states[copy_src[r]]
                    current[nd] = offset[nd] + ver + 1
                else:
                    self._mix(i, offset)
            else:
                self._eval(i)
            if len(states) > self.peak_live_states:
                self.peak_live_states = len(states)
            c = counts[r]
            if c:
                for f in free[fp:fp + c]:
                    del states[f]
                fp += c

    def _check_finite(self, state: tuple[Tensor, float]) -> None:
        """Raise :class:`Diverged` when the state a copy mix replaces is not finite: there
        ``0·x + x_src`` is NaN, not the source, and the run has diverged. The last tensor found
        finite is remembered (an all-reduce round's receivers replace one shared tensor)."""
        x, w = state
        if x is self._finite_seen:
            return
        if not (math.isfinite(w) and bool(torch.isfinite(x).all())):
            raise Diverged
        self._finite_seen = x

    def _mix(self, i: int, offset: list[int]) -> None:
        """``x ← self_coef·x + coef·x_src``, ``w`` likewise. (A copy, self_coef 0 and coef 1, is
        handled in :meth:`_run_ops`: the source's own tensor and weight, which this arithmetic
        gives for finite weights, :func:`.replay_plan.equal_states`; versions are never written
        once created.)"""
        ops = self.trace.ops
        nd, sc, cf = int(ops["node"][i]), float(ops["self_coef"][i]), float(ops["coef"][i])
        sid = offset[nd] + int(ops["version"][i])
        x, w = self.states[sid]
        xs, ws = self.states[offset[int(ops["src_node"][i])] + int(ops["src_version"][i])]
        self.states[sid + 1] = (torch.add(x if sc == 1.0 else x * sc, xs, alpha=cf), sc * w + cf * ws)
        self._current[nd] = sid + 1
