"""The replay backend: execute a protocol trace with real gradients on one device.

The replay interprets ops in trace order and never knows which protocol wrote them
(docs/replay.md):

* ``grad``: the cross-entropy gradient of the minibatch ``SampleStream(data_seed,
  samples_per_epoch).indices(sample_start, batch_size)`` at ``x / w`` of the state it reads;
* ``apply``: ``x ← opt(x, Σ_i weight_i · scale_i · g_i)`` with ``lr_at(epoch of the apply)``;
  ``w`` is unchanged;
* ``mix``: ``x ← self_coef·x + coef·x_src``, ``w ← self_coef·w + coef·w_src``;
* ``eval``: the test error of ``x / w`` of a state, or (node −1) of the mean over nodes of
  each node's latest ``x / w``.

Memory: a state (node, version) is freed after the last op that reads it (computed up
front); a gradient is freed by the apply that consumes it; gradients no apply consumes
are never computed. Batching: when the replay reaches a gradient not yet computed, it
computes it together with later gradients whose states already exist (same batch size),
in one ``vmap`` call; it never computes a gradient later than its own op.

Multi-node traces may instead be replayed by the stacked replay (:mod:`.replay_stacked`:
dataflow batches over one tensor of weights rows); :func:`make_replayer` picks the path
(docs/replay.md, "Multi-node traces").
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

try:  # what Tensor.backward() calls once it has normalised its arguments (docs/replay.md)
    from torch.autograd.graph import _engine_run_backward
except ImportError:  # pragma: no cover - another torch: the public path
    _engine_run_backward = None

from ..simulator.dataorder import permutation
from ..simulator.trace import APPLY, EVAL, GRAD, MIX, Trace
from .base import BackendError, BackendResult, RunOptions
from .optim import Optimizer, mean_staleness
from .workloads import Data, build_model, load_data

BATCH_CAP = 64              # most gradients in one vmap call
LOOKAHEAD = 256             # grad ops scanned ahead for a batch
BATCH_BUDGET_FLOATS = 1 << 26  # stacked weights + gradients of one batch (256 MiB in fp32)
EVAL_CHUNK = 2048
RUN_CHUNK = 1 << 16         # ops whose columns are turned into Python lists at a time
PENDING_LOSSES = 256        # losses kept on an accelerator before they are read
EPOCH_COPY_MAX_BYTES = 64 << 20  # smaller training sets are also kept in each epoch's order


@dataclass
class Plan:
    """What the replay needs to know up front, derived from the trace with NumPy.

    States are numbered ``sid = offset[node] + version``. ``free_order`` lists state ids
    by the op after which they are freed (``free_count[i]`` of them after op ``i``); a
    node's latest version lives to the end. ``grads``: the consumed grad ops. Per op:
    ``lead`` is −2 for a gradient computed alone at its op, −3 for one computed alone whose
    apply (its only input) comes before any other gradient is computed (it stays in the
    model's gradient buffer, scaled in place), ``b ≥ 0`` for the op at which the
    multi-gradient batch ``batches[b]`` (grad op indices) is computed, −1 otherwise;
    ``sid`` the state a grad reads, ``interval`` the number of evals before it, ``coef``
    the factor weight·scale applied when it is computed (1 unless it is its apply's only
    input); ``lr`` an apply's learning rate. ``coefs``: weight·scale of every apply input.
    """

    offset: np.ndarray
    free_order: np.ndarray
    free_count: np.ndarray
    grads: np.ndarray
    lead: np.ndarray
    batches: list[np.ndarray]
    sid: np.ndarray
    interval: np.ndarray
    coef: np.ndarray
    lr: np.ndarray
    coefs: np.ndarray
    evals: np.ndarray

    @property
    def calls(self) -> int:
        """Gradient computations: batched calls plus gradients computed alone."""
        return len(self.batches) + int((self.lead <= -2).sum())


def plan_trace(trace: Trace, opt: Optimizer, batched: bool, cap: int = BATCH_CAP,
               lookahead: int = LOOKAHEAD) -> Plan:
    """Derive state lifetimes, gradient batches and apply coefficients from ``trace``."""
    ops, inp = trace.ops, trace.inputs
    kind, node, version = ops["kind"], ops["node"].astype(np.int64), ops["version"].astype(np.int64)
    src_node, src_ver = ops["src_node"].astype(np.int64), ops["src_version"].astype(np.int64)
    n, nodes = len(kind), int(trace.header["nodes"])
    mut = np.flatnonzero((kind == APPLY) | (kind == MIX))
    per_node = np.bincount(node[mut], minlength=nodes)
    offset = np.concatenate([[0], np.cumsum(per_node + 1)[:-1]]).astype(np.int64)
    n_states = int(per_node.sum() + nodes)
    created = np.full(n_states, -1, np.int64)
    created[offset[node[mut]] + version[mut] + 1] = mut
    last = np.full(n_states, -1, np.int64)
    last[offset[node[mut]] + version[mut]] = mut          # the mutation reads its state
    last[offset + per_node] = n                            # latest versions live to the end
    applies = np.flatnonzero(kind == APPLY)
    owner = np.repeat(applies, ops["in_count"][applies])
    consumer = np.full(n, -1, np.int64)
    consumer[inp["grad_op"]] = owner
    grads = np.flatnonzero((kind == GRAD) & (consumer >= 0))
    sid = np.full(n, -1, np.int64)
    sid[grads] = offset[src_node[grads]] + src_ver[grads]
    np.maximum.at(last, sid[grads], grads)
    mixes = np.flatnonzero(kind == MIX)
    np.maximum.at(last, offset[src_node[mixes]] + src_ver[mixes], mixes)
    evals = np.flatnonzero(kind == EVAL)
    ev_state = evals[node[evals] >= 0]
    np.maximum.at(last, offset[node[ev_state]] + version[ev_state], ev_state)

    lead = np.full(n, -1, np.int64)
    lead[grads] = -2
    batches: list[np.ndarray] = []
    if batched and cap > 1:
        ready, sizes = created[sid[grads]], ops["batch_size"][grads]
        done = np.zeros(len(grads), bool)
        for k in range(len(grads)):
            if done[k]:
                continue
            hi = min(len(grads), k + 1 + lookahead)
            ok = ~done[k + 1:hi] & (ready[k + 1:hi] < grads[k]) & (sizes[k + 1:hi] == sizes[k])
            more = k + 1 + np.flatnonzero(ok)[:cap - 1]
            done[k] = True
            if len(more):
                done[more] = True
                lead[grads[more]] = -1
                lead[grads[k]] = len(batches)
                batches.append(grads[np.concatenate([[k], more])])

    coefs = inp["weight"] * opt.scales(inp["staleness"])
    # a gradient that is its apply's only input is scaled once, when it is computed
    single = np.repeat(ops["in_count"][applies] == 1, ops["in_count"][applies])
    # ... and, computed alone, stays in the gradient buffer if its apply comes first
    computed = grads[lead[grads] != -1]
    alone = computed[lead[computed] == -2]
    nxt = np.append(computed, n)[np.searchsorted(computed, alone, side="right")]
    sole = np.zeros(n, bool)
    sole[inp["grad_op"][single]] = True
    lead[alone[sole[alone] & (consumer[alone] < nxt)]] = -3
    coef = np.ones(n)
    coef[inp["grad_op"][single]] = coefs[single]
    lr = np.zeros(n)
    lr[applies] = opt.lr(ops["epoch"][applies])
    interval = np.zeros(n, np.int64)
    interval[grads] = np.searchsorted(evals, grads)
    return Plan(offset, np.argsort(last, kind="stable"), np.bincount(last, minlength=n + 1)[:n], grads,
                lead, batches, sid, interval, coef, lr, coefs, evals)


class FlatModel:
    """A model whose parameters are views into one flat vector ``work``.

    ``grad`` computes one minibatch gradient with plain autograd; ``grad_batch`` computes
    several at once with ``functional_call`` + ``vmap`` over stacked flat weights.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model.train()
        named = list(model.named_parameters())
        self.names = [k for k, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [p.shape for p in self.params]
        self.sizes = [p.numel() for p in self.params]
        self.size = sum(self.sizes)
        self.work = torch.cat([p.detach().reshape(-1) for p in self.params]).clone()
        self.grad_buf = torch.zeros_like(self.work)
        o = 0
        for p, k in zip(self.params, self.sizes):
            p.data = self.work[o:o + k].view_as(p)
            p.grad = self.grad_buf[o:o + k].view_as(p)  # backward() accumulates here, in place
            o += k
        self.batchable = not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        self._vforward = vmap(lambda ps, xb: functional_call(self.model, ps, (xb,)))
        self._loaded: Tensor | None = None
        self._seed = torch.ones((), device=self.work.device)

    def load(self, z: Tensor) -> None:
        """Make the model's parameters equal ``z``."""
        if z is not self._loaded:
            self.work.copy_(z)  # work is no autograd leaf: the parameters are views of it
            self._loaded = z

    def grad(self, z: Tensor, xb: Tensor, yb: Tensor, scale: float = 1.0,
             in_place: bool = False) -> tuple[Tensor, Tensor]:
        """``scale`` × the flat gradient of the mean cross-entropy of (xb, yb) at ``z``, and
        that loss. The gradient is a new tensor, or with ``in_place`` the model's gradient
        buffer itself (valid until the next call). The scale multiplies the finished
        gradient (not the backward seed), so the result is bit-identical to a live server's
        ``gradient × scale``."""
        self.load(z)
        buf = self.grad_buf
        buf.zero_()
        loss = F.cross_entropy(self.model(xb), yb)
        if _engine_run_backward is not None:  # = loss.backward(seed) without ~20 µs of checks
            _engine_run_backward((loss,), (self._seed,), False, False, (),
                                 allow_unreachable=True, accumulate_grad=True)
        else:
            loss.backward(self._seed)
        if in_place:
            return (buf if scale == 1.0 else buf.mul_(scale)), loss
        return (buf.clone() if scale == 1.0 else buf * scale), loss

    def grad_batch(self, zs: list[Tensor] | Tensor, xb: Tensor, yb: Tensor,
                   scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Gradients (B, P), row b scaled by ``scale[b]`` (default 1), and losses (B,) of
        minibatch b at ``zs[b]`` (one vmap call). ``zs`` of length 1: all read the same weights;
        a (B, P) tensor: the weights already stacked (it is used as is, not copied).
        """
        b = xb.shape[0]
        if isinstance(zs, Tensor):
            stacked = zs.detach().requires_grad_()
        elif len(zs) == 1:
            stacked = zs[0].detach().requires_grad_().expand(b, self.size)
        else:
            stacked = torch.stack(zs).requires_grad_()
        views, o = {}, 0
        for name, shape, k in zip(self.names, self.shapes, self.sizes):
            views[name] = stacked[:, o:o + k].view(b, *shape)
            o += k
        logits = self._vforward(views, xb)
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1),
                                 reduction="none").view(b, -1).mean(1)
        total = losses.sum() if scale is None else losses @ scale
        inputs = tuple(views.values())
        if _engine_run_backward is not None:  # = torch.autograd.grad(total, inputs), fewer checks
            gs = _engine_run_backward((total,), (self._seed,), False, False, inputs,
                                      allow_unreachable=True, accumulate_grad=False)
        else:
            gs = torch.autograd.grad(total, inputs)
        out = torch.empty(b, self.size, dtype=stacked.dtype, device=stacked.device)
        o = 0
        for g, k in zip(gs, self.sizes):  # one strided copy each (no contiguous() + cat)
            if g is None:  # a parameter the loss does not reach
                out[:, o:o + k].zero_()
            else:
                out[:, o:o + k].view(g.shape).copy_(g)
            o += k
        return out, losses.detach()

    @torch.no_grad()
    def test_error(self, z: Tensor, x: Tensor, y: Tensor) -> float:
        """Fraction of (x, y) misclassified at weights ``z`` (model in eval mode)."""
        self.load(z)
        self.model.eval()
        try:
            wrong = sum(int((self.model(x[i:i + EVAL_CHUNK]).argmax(1) != y[i:i + EVAL_CHUNK]).sum())
                        for i in range(0, len(y), EVAL_CHUNK))
        finally:
            self.model.train()
        return wrong / max(1, len(y))


class _Diverged(Exception):
    pass


class Replayer:
    """Executes one trace once, starting every node from ``model``'s current weights (the
    model is rewired by :class:`FlatModel`). After :meth:`run`: ``curves``, ``diverged``,
    ``diverged_at_update``, ``updates``, ``peak_live_states`` / ``peak_live_grads`` (most
    weights versions / gradients held at once) and :meth:`final_states`.
    """

    def __init__(self, trace: Trace, model: nn.Module, data: Data, opt: Optimizer, *,
                 batched: bool = True, batch_cap: int = BATCH_CAP, lookahead: int = LOOKAHEAD) -> None:
        for key in ("nodes", "data_seed", "samples_per_epoch"):
            if key not in trace.header:
                raise BackendError(f"trace header lacks {key!r}: cannot replay it")
        self.trace, self.data, self.opt = trace, data, opt
        self.flat = FlatModel(model)
        cap = max(1, min(batch_cap, BATCH_BUDGET_FLOATS // (2 * self.flat.size)))
        self.batched = batched and self.flat.batchable
        self.plan = plan_trace(trace, opt, self.batched, cap, lookahead)
        self.nodes = int(trace.header["nodes"])
        self.seed = int(trace.header["data_seed"])
        self.spe = int(trace.header["samples_per_epoch"])
        self.n_train = len(data.train_y)
        self.device = data.train_x.device
        self._perms: dict[int, np.ndarray] = {}
        self._epoch_cache: dict[int, tuple[Tensor, Tensor]] = {}
        self._copy_epochs = data.train_x.element_size() * data.train_x.numel() <= EPOCH_COPY_MAX_BYTES
        self.states: dict[int, tuple[Tensor, float]] = {}
        self.grads: dict[int, tuple[Tensor, int]] = {}
        self.curves: list[dict[str, Any]] = []
        self.diverged = False
        self.diverged_at_update: int | None = None
        self.updates = 0
        self.peak_live_states = 0
        self.peak_live_grads = 0
        # on an accelerator, losses stay on the device and are read in groups (no sync per grad)
        self._lazy_losses = self.device.type != "cpu"
        self._pending: list[tuple[list[int], Tensor, int]] = []
        self._loss_sum = [0.0] * (len(self.plan.evals) + 1)
        self._loss_n = [0] * (len(self.plan.evals) + 1)
        self._current: list[int] = self.plan.offset.tolist()  # each node's latest state id
        self._freed = 0  # states freed so far (a position in plan.free_order)
        self._hooked = type(self).on_grad_reads is not Replayer.on_grad_reads

    def on_grad_reads(self, ops: list[int], x: Tensor, w: list[float]) -> None:
        """Hook, a no-op here: called before the gradients of grad ops ``ops`` are computed,
        with the PushSum numerators ``x`` (one row per op; do not modify, clone to keep) and
        weights ``w`` of the versions they read. Tests subclass it to observe the states."""

    # -- data ---------------------------------------------------------------------------
    def _perm(self, epoch: int) -> np.ndarray:
        p = self._perms.get(epoch)
        if p is None:
            if len(self._perms) >= 8:
                self._perms.pop(min(self._perms))
            p = self._perms[epoch] = permutation(self.seed, epoch, self.spe)
        return p

    def batch_data(self, starts: np.ndarray, size: int) -> tuple[Tensor, Tensor]:
        """Inputs (B, size, …) and labels (B, size) of the minibatches at stream positions
        ``starts``: one gather. (Slicing the cached epoch order instead was measured: no gain
        on 8-node SGP, 5 % slower on the ASGD benchmark.)"""
        idx = torch.from_numpy(self.sample_indices(starts, size)).to(self.device)
        return self.data.train_x[idx], self.data.train_y[idx]

    def sample_indices(self, starts: np.ndarray, size: int) -> np.ndarray:
        """Rows (len(starts), size) of the minibatches at stream positions ``starts``
        (= ``SampleStream.indices``; positions past the data set's size wrap around)."""
        pos = starts[:, None] + np.arange(size)
        ep, off = np.divmod(pos, self.spe)
        lo, hi = int(ep.min()), int(ep.max())
        if lo == hi:
            idx = self._perm(lo)[off]
        else:
            idx = np.empty_like(pos)
            for e in range(lo, hi + 1):
                m = ep == e
                idx[m] = self._perm(e)[off[m]]
        return idx % self.n_train if self.spe > self.n_train else idx

    # -- states -------------------------------------------------------------------------
    def _z(self, sid: int) -> Tensor:
        x, w = self.states[sid]
        return x if w == 1.0 else x / w

    def final_states(self) -> dict[int, tuple[Tensor, float]]:
        """Each node's latest (x, w) (after :meth:`run`: the final weights)."""
        return {k: self.states[s] for k, s in enumerate(self._current)}

    # -- ops ----------------------------------------------------------------------------
    def _compute_batch(self, b: int) -> None:
        """Compute the gradients of batch ``b`` in one call; keep them until their applies."""
        plan, gops = self.plan, self.plan.batches[b]
        ops, data = self.trace.ops, self.data
        size = int(ops["batch_size"][gops[0]])
        xb, yb = self.batch_data(ops["sample_start"][gops], size)
        sids = plan.sid[gops].tolist()
        zs = [self._z(sids[0])] if min(sids) == max(sids) else [self._z(s) for s in sids]
        if self._hooked:
            self.on_grad_reads(gops.tolist(), torch.stack([self.states[s][0] for s in sids]),
                               [self.states[s][1] for s in sids])
        coef = plan.coef[gops]
        scale = torch.from_numpy(coef).to(data.train_x) if (coef != 1.0).any() else None
        g, lt = self.flat.grad_batch(zs, xb, yb, scale)
        if self._lazy_losses:
            self._pending.append((plan.interval[gops].tolist(), lt, self.updates))
            if len(self._pending) >= PENDING_LOSSES:
                self._flush_losses()
        else:
            self._add_losses(plan.interval[gops].tolist(), lt.tolist(), self.updates)
        for row, op in enumerate(gops.tolist()):
            self.grads[op] = (g, row)
        self.peak_live_grads = max(self.peak_live_grads, len(self.grads))

    def _compute_one(self, op: int, start: int, size: int, sid: int, j: int, coef: float,
                     in_place: bool = False) -> None:
        """Compute the gradient of grad op ``op`` alone (plain autograd; the lean path);
        ``in_place``: leave it in the model's gradient buffer (its apply comes first)."""
        e, off = divmod(start, self.spe)
        if off + size <= self.spe and self._copy_epochs:
            xs, ys = self._epoch_cache.get(e) or self._epoch_data(e)
            xb, yb = xs[off:off + size], ys[off:off + size]
        else:
            idx = torch.from_numpy(self.sample_indices(np.array([start]), size)[0]).to(self.device)
            xb, yb = self.data.train_x.index_select(0, idx), self.data.train_y.index_select(0, idx)
        x, w = self.states[sid]
        if self._hooked:
            self.on_grad_reads([op], x.unsqueeze(0), [w])
        g, loss = self.flat.grad(x if w == 1.0 else x / w, xb, yb, coef, in_place)
        if self._lazy_losses:
            self._pending.append(([j], loss.detach(), self.updates))
            if len(self._pending) >= PENDING_LOSSES:
                self._flush_losses()
        else:
            v = loss.item()
            if not math.isfinite(v):
                raise _Diverged
            self._loss_sum[j] += v
            self._loss_n[j] += 1
        self.grads[op] = (g, -1)
        if len(self.grads) > self.peak_live_grads:
            self.peak_live_grads = len(self.grads)

    def _add_losses(self, intervals: list[int], losses: list[float], updates: int) -> None:
        """Count minibatch losses towards their evals' train_loss; a non-finite one diverges."""
        if not all(math.isfinite(v) for v in losses):
            self.updates = updates  # where it was computed, not where it was noticed
            raise _Diverged
        for j, v in zip(intervals, losses):
            self._loss_sum[j] += v
            self._loss_n[j] += 1

    def _flush_losses(self) -> None:
        """Read the losses kept on the device (one synchronisation for many gradients)."""
        pending, self._pending = self._pending, []
        if pending:
            values = torch.cat([t.reshape(-1) for _, t, _ in pending]).tolist()
            at = 0
            for intervals, _, updates in pending:
                self._add_losses(intervals, values[at:at + len(intervals)], updates)
                at += len(intervals)

    def _epoch_data(self, epoch: int) -> tuple[Tensor, Tensor]:
        """The training set in the order of ``epoch``'s permutation (a few epochs cached), so
        that a minibatch of consecutive stream positions is a slice, not a gather."""
        d = self._epoch_cache.get(epoch)
        if d is None:
            if len(self._epoch_cache) >= 3:
                self._epoch_cache.pop(min(self._epoch_cache))
            p = self._perm(epoch)
            idx = torch.from_numpy(p % self.n_train if self.spe > self.n_train else p).to(self.device)
            d = self._epoch_cache[epoch] = (self.data.train_x.index_select(0, idx),
                                            self.data.train_y.index_select(0, idx))
        return d

    def _combined_grad(self, s: int, c: int) -> Tensor:
        """Σ coef_j · g_j over inputs s .. s+c−1 (one gemv per batch the gradients came from);
        zero for an apply with no inputs (the optimizer still steps: momentum carries on)."""
        pop, coefs = self.grads.pop, self.plan.coefs
        groups: dict[int, tuple[Tensor, list[int], list[float]]] = {}
        for j, op in enumerate(self.trace.inputs["grad_op"][s:s + c].tolist()):
            g, row = pop(op)
            if row < 0:
                g, row = g.unsqueeze(0), 0
            entry = groups.setdefault(id(g), (g, [], []))
            entry[1].append(row)
            entry[2].append(float(coefs[s + j]))
        total: Tensor | None = None
        for g, rows, cs in groups.values():
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
        self._flush_losses()
        k = int(ops["node"][i])
        z = self._z(int(plan.offset[k] + ops["version"][i])) if k >= 0 else self.average_state()
        if not bool(torch.isfinite(z).all()):
            raise _Diverged
        j = len(self.curves)
        n = self._loss_n[j]
        row: dict[str, Any] = {
            "epoch": float(ops["epoch"][i]), "updates": self.updates, "sim_time_s": float(ops["t_end"][i]),
            "test_error": self.flat.test_error(z, self.data.test_x, self.data.test_y),
            "train_loss": self._loss_sum[j] / n if n else math.nan,
        }
        if self.nodes > 1:
            row["consensus_distance"] = self.consensus_distance(z if k < 0 else self.average_state())
        self.curves.append(row)

    def run(self) -> list[dict[str, Any]]:
        """Execute every op; return the curves (divergence stops the run, never raises)."""
        x0 = self.flat.work.detach().clone()
        self.states.update({int(s): (x0, 1.0) for s in self.plan.offset})
        self.peak_live_states = len(self.states)
        try:
            for base in range(0, self.trace.n_ops, RUN_CHUNK):
                self._run_ops(base, min(self.trace.n_ops, base + RUN_CHUNK))
            self._flush_losses()
            if any(not bool(torch.isfinite(x).all()) for x, _ in self.final_states().values()):
                raise _Diverged
        except _Diverged:
            self.diverged, self.diverged_at_update = True, self.updates
        return self.curves

    def _run_ops(self, lo: int, hi: int) -> None:
        """Execute ops ``lo .. hi−1`` (their columns as Python lists: the hot loop)."""
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
                if lead <= -2:
                    self._compute_one(i, start, size, sid, j, coef, lead == -3)
                elif lead >= 0:
                    self._compute_batch(lead)
            elif k == MIX:
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

    def _mix(self, i: int, offset: list[int]) -> None:
        ops = self.trace.ops
        nd, sc, cf = int(ops["node"][i]), float(ops["self_coef"][i]), float(ops["coef"][i])
        sid = offset[nd] + int(ops["version"][i])
        x, w = self.states[sid]
        xs, ws = self.states[offset[int(ops["src_node"][i])] + int(ops["src_version"][i])]
        x_new = torch.add(x if sc == 1.0 else x * sc, xs, alpha=cf)
        self.states[sid + 1] = (x_new, sc * w + cf * ws)
        self._current[nd] = sid + 1


STACKED_MODES = ("auto", "on", "off")
STACKED_ENV = "DDLSIM_REPLAY_STACKED"  # overrides the default mode ("auto")
# auto: stacked when it saves at least this many gradient calls per gradient. Measured (CPU,
# digits MLP, docs/replay.md): a saved vmap call is worth ≈ 0.7 ms, the stacked path's extra
# bookkeeping costs ≈ 15 µs per gradient, so break-even is ≈ 1/45; 1/20 keeps a 2× margin.
STACKED_MIN_SAVED = 1 / 20


def make_replayer(trace: Trace, model: nn.Module, data: Data, opt: Optimizer, *, batched: bool = True,
                  stacked: str | None = None, **kw: Any) -> Replayer:
    """The interpreter for ``trace``: the generic :class:`Replayer` or, for a multi-node trace,
    the stacked one (:mod:`.replay_stacked`; docs/replay.md, "Multi-node traces").

    ``stacked``: "off" (generic), "on" (stacked whenever it applies: several nodes, a batchable
    model, ``batched``) or "auto" (the default, or the environment variable
    ``DDLSIM_REPLAY_STACKED``): stacked when it applies and makes at least ``STACKED_MIN_SAVED``
    × (gradients) fewer vmap calls than the generic path (predicted by
    :func:`.replay_stacked.gradient_rounds`) — the measured condition for it to be faster.
    """
    mode = stacked or os.environ.get(STACKED_ENV, "auto") or "auto"
    if mode not in STACKED_MODES:
        raise BackendError(f"stacked replay mode {mode!r}: expected one of {', '.join(STACKED_MODES)}")
    nodes = int(trace.header.get("nodes", 1))
    if mode == "off" or nodes <= 1 or not batched:
        return Replayer(trace, model, data, opt, batched=batched, **kw)
    from .replay_stacked import StackedReplayer, gradient_rounds

    if mode == "on":
        return StackedReplayer(trace, model, data, opt, batched=batched, **kw)
    rep = Replayer(trace, model, data, opt, batched=batched, **kw)
    if not rep.batched:
        return rep
    cap = max(1, min(kw.get("batch_cap", BATCH_CAP), BATCH_BUDGET_FLOATS // (2 * rep.flat.size)))
    need = STACKED_MIN_SAVED * len(rep.plan.grads)
    best = -(-len(rep.plan.grads) // min(cap, nodes))  # one call per iteration
    if rep.plan.calls - best < need or rep.plan.calls - gradient_rounds(trace, rep.plan, cap) < need:
        return rep
    return StackedReplayer(trace, model, data, opt, batched=batched, **kw)


def summarize(curves: list[dict[str, Any]], target_error: float, diverged: bool,
              diverged_at_update: int | None) -> dict[str, Any]:
    """The summary keys of :class:`BackendResult` from the measured curves."""
    errors = [r["test_error"] for r in curves]
    hit = next((r["sim_time_s"] for r in curves if r["test_error"] <= target_error), None)
    return {
        "final_test_error": errors[-1] if errors else math.nan,
        "best_test_error": min(errors) if errors else math.nan,
        "time_to_target_s": hit,
        "diverged": bool(diverged),
        "diverged_at_update": diverged_at_update if diverged else None,
    }


def resolve_device(device: str | None) -> torch.device:
    """``device``, or cuda when available, else cpu; an unavailable cuda is a BackendError."""
    if not device:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BackendError(f"device {device!r}: not a device (use cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise BackendError(f"device {device!r}: ddlsim runs on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} requested but CUDA is not available here")
    return dev


class ReplayBackend:
    """Backend "replay": executes a simulated (or live) trace on one device."""

    name = "replay"

    def run(self, trace: Trace, point: dict[str, Any], options: RunOptions | None = None) -> BackendResult:
        """Replay ``trace`` for scenario ``point``; see :class:`BackendResult` for the keys."""
        options = options or RunOptions()
        device = resolve_device(options.device)
        threads = torch.get_num_threads()
        if options.threads and options.threads > 0:
            torch.set_num_threads(options.threads)
        try:
            data = load_data(point, options.data_dir, options.download, device=device)
            model = build_model(point).to(device)
            # a measured (live) trace carries the ⟨σ⟩ its run used; else the trace's own mean
            sigma = trace.header.get("mean_staleness", mean_staleness(trace.inputs["staleness"]))
            opt = Optimizer(point["optimizer"], float(sigma))
            rep = make_replayer(trace, model, data, opt, batched=options.batched, stacked=options.stacked)
            curves = rep.run()
        finally:
            torch.set_num_threads(threads)
        summary = summarize(curves, point["workload"]["target_error"], rep.diverged, rep.diverged_at_update)
        return BackendResult(curves=curves, summary=summary, trace=None)
