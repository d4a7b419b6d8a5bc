"""Replay of traces with outer ops or compressed averaging (schema 2): local SGD, DiLoCo, PowerSGD.

:class:`LocalReplayer` executes the ops in trace order with the semantics of docs/trace.md:

* ``grad``, ``eval`` and ``mix`` as the generic replay (:mod:`.replay_generic`); a mix whose
  ``batch_index`` is a fragment p ≥ 0 copies only that fragment's tensors (coef 1, self_coef 0);
* ``apply`` of one input: the node's own optimizer step on its gradient (the step's
  learning rate and coefficients from :meth:`.optim.Optimizer.rates`, as the generic replay);
* ``apply`` of several inputs under the header's ``averaging.compression``: the gradients
  (each scaled by its coefficient × their count) are averaged as the compressed all-reduce
  does (:func:`.compression.average`: fp16/bf16 rounding of what is sent; PowerSGD's low-rank
  approximation with per-learner error feedback and warm-started Q, its warm-up counted in
  these applies), then one optimizer step on node 0. Every rank of that all-reduce steps its
  own optimizer on the same mean from the same weights (``PostLocalSGDOptimizer``), so every
  node's optimizer state is node 0's: before the next apply of one input (local SGD's first
  local step after its warm-up) each other node takes a copy of it;
* ``outer`` on node 0 (fragment p = ``batch_index``, −1 the whole model): the pseudo-gradient
  of every node ``Δ_i = a − x_i`` over the fragment (``a`` the anchor state (src_node,
  src_version), ``x_i`` each node's latest state) averaged under the compression (its own
  PowerSGD state per fragment), then the outer step ``a − lr · step`` with
  ``step`` Nesterov SGD's on ``mean Δ`` (momentum ``self_coef``, learning rate ``coef``:
  :class:`.optim.OuterOptimizer`, one per fragment, its buffer kept across outer steps;
  uncompressed, ``mean Δ`` is :func:`.optim.pseudo_gradient`'s ``a − Σ_i x_i / n``); the
  rest of node 0's state stays.

Gradients of consecutive grad ops of one minibatch size are computed in one batched call
(:meth:`.flatmodel.FlatModel.grad_batch`: the nodes' local steps share a call) when the model
batches; otherwise one by one. Every state is freed after the last op that reads it.
"""

from __future__ import annotations

from typing import Any
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor, nn

from ..simulator.trace import APPLY, EVAL, GRAD, LOCAL_SCHEMA, MIX, OUTER, Trace
from .compression import PowerSGDState, average
from .flatmodel import FlatModel
from .optim import Optimizer, OuterOptimizer
from .replay_data import Diverged, LossLog, Minibatches
from .replay_plan import check_header
from .workloads import Data


def needs_local_replay(trace: Trace) -> bool:
    """Whether ``trace`` holds what only :class:`LocalReplayer` executes: outer ops, fragment
    mixes, a compressed averaging, or (schema 2) all-reduce applies of several inputs followed
    by a node's own applies (local SGD after warm-up: the nodes' optimizer states are shared)."""
    avg = trace.header.get("averaging")
    if isinstance(avg, dict) and avg.get("compression", "none") != "none":
        return True
    kind = trace.ops["kind"]
    if trace.n_ops and bool((kind == OUTER).any()):
        return True
    if trace.header.get("schema_version") != LOCAL_SCHEMA or not trace.n_ops:
        return False  # (a mix's batch_index names a fragment only in schema 2)
    if bool(((kind == MIX) & (trace.ops["batch_index"] >= 0)).any()):
        return True
    counts = trace.ops["in_count"][kind == APPLY]
    return bool((counts > 1).any() and (counts == 1).any())


class LocalReplayer:
    """Executes one schema-2 trace once from ``model``'s weights (module doc). After
    :meth:`run`: ``curves``, ``diverged``, ``diverged_at_update``, ``updates`` and
    :meth:`final_states`."""

    progress: Callable[[float], None] | None = None

    def __init__(self, trace: Trace, model: nn.Module, data: Data, opt: Optimizer, *, batched: bool = True,
                 **_: Any) -> None:
        check_header(trace)
        self.trace, self.data, self.opt = trace, data, opt
        self.flat = FlatModel(model)
        self.batched = batched and self.flat.batchable
        self.device = data.train_x.device
        h = trace.header
        self.nodes = int(h["nodes"])
        self.schema = h.get("schema_version")
        found = h.get("averaging")
        avg: dict[str, Any] = found if isinstance(found, dict) else {}
        self.compression = str(avg.get("compression", "none"))
        self.rank = int(avg.get("powersgd_rank", 1))
        self.ps_warmup = int(avg.get("powersgd_warmup", 0))
        self.seed = int(h.get("seed", 0)) if isinstance(h.get("seed", 0), int) else 0
        sizes = self.flat.sizes
        tensors = avg.get("tensors")
        if tensors is None:
            tensors = [0] * len(sizes)
        if len(tensors) != len(sizes):
            raise ValueError(f"trace header 'averaging.tensors' names {len(tensors)} tensors; the model has "
                             f"{len(sizes)}")
        self.fragment_of = [int(t) for t in tensors]
        bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.bounds = bounds
        self.slices: dict[int, tuple[int, int, list[int]]] = {}  # fragment → (lo, hi, its tensors)
        for f in sorted(set(self.fragment_of)):
            ks = [k for k, t in enumerate(self.fragment_of) if t == f]
            self.slices[f] = (int(bounds[ks[0]]), int(bounds[ks[-1] + 1]), ks)
        self.slices[-1] = (0, int(bounds[-1]), list(range(len(sizes))))
        self.minibatches = Minibatches(data, int(h["data_seed"]), int(h["samples_per_epoch"]))
        ops, inp = trace.ops, trace.inputs
        kind = ops["kind"]
        self.evals = np.flatnonzero(kind == EVAL)
        self.losses = LossLog(len(self.evals), self.device)
        applies = np.flatnonzero(kind == APPLY)
        counts = ops["in_count"][applies]
        coefs, base = opt.rates(inp["weight"], inp["staleness"], counts)
        self.coefs = coefs
        self.lr = np.zeros(trace.n_ops)
        if len(applies):
            self.lr[applies] = opt.lr(ops["epoch"][applies], base)
        self.states: dict[tuple[int, int], Tensor] = {}
        self.latest = [0] * self.nodes
        self.grads: dict[int, Tensor] = {}
        self.powersgd: dict[tuple[str, int], PowerSGDState] = {}
        self.rounds: dict[tuple[str, int], int] = {}
        self.outer: dict[int, OuterOptimizer] = {}  # one outer optimizer (its momentum buffer) per fragment
        self.shared_state: int | None = None  # the node whose optimizer state every node holds (module doc)
        self.curves: list[dict[str, Any]] = []
        self.diverged = False
        self.diverged_at_update: int | None = None
        self.updates = 0
        self._last_read = self._reads()

    # -- memory ------------------------------------------------------------------------------
    def _reads(self) -> dict[tuple[int, int], int]:
        """The last op that names each state it reads (grad, mix source, outer anchor, eval)."""
        ops = self.trace.ops
        kind, node, ver = ops["kind"], ops["node"], ops["version"]
        src, sver = ops["src_node"], ops["src_version"]
        last: dict[tuple[int, int], int] = {}
        for i in np.flatnonzero((kind == GRAD) | (kind == MIX) | (kind == OUTER)).tolist():
            last[(int(src[i]), int(sver[i]))] = i
        for i in np.flatnonzero((kind == EVAL) & (node >= 0)).tolist():
            last[(int(node[i]), int(ver[i]))] = i
        return last

    def _set(self, nd: int, v: int, x: Tensor, i: int) -> None:
        """Node ``nd``'s version ``v + 1`` is ``x`` (op ``i``); version ``v`` goes unless read later."""
        self.states[(nd, v + 1)] = x
        self.latest[nd] = v + 1
        if self._last_read.get((nd, v), -1) <= i:
            self.states.pop((nd, v), None)

    def _free_read(self, key: tuple[int, int], i: int) -> None:
        if self._last_read.get(key, -1) <= i and self.latest[key[0]] != key[1]:
            self.states.pop(key, None)

    def final_states(self) -> dict[int, tuple[Tensor, float]]:
        """Each node's latest (x, w) (w is 1: these protocols keep no PushSum weights)."""
        return {k: (self.states[(k, v)], 1.0) for k, v in enumerate(self.latest)}

    # -- arithmetic ----------------------------------------------------------------------------
    def _split(self, x: Tensor, tensors: list[int]) -> list[Tensor]:
        b, shapes = self.bounds, self.flat.shapes
        return [x[int(b[k]):int(b[k + 1])].view(shapes[k]) for k in tensors]

    def _average(self, flats: list[Tensor], tensors: list[int], what: str, fragment: int) -> Tensor:
        """The mean of ``flats`` (one flat vector per node over ``tensors``' elements) as the
        compressed all-reduce delivers it."""
        key = (what, fragment)
        step = self.rounds.get(key, 0)
        self.rounds[key] = step + 1
        state = None
        if self.compression == "powersgd":
            state = self.powersgd.get(key)
            if state is None:
                state = self.powersgd[key] = PowerSGDState(self.rank, self.ps_warmup, self.seed)
        lo = int(self.bounds[tensors[0]])
        per_node = [self._split_local(f, tensors, lo) for f in flats]
        out = average(per_node, self.compression, state, step)
        return torch.cat([t.reshape(-1) for t in out])

    def _split_local(self, f: Tensor, tensors: list[int], lo: int) -> list[Tensor]:
        b, shapes = self.bounds, self.flat.shapes
        return [f[int(b[k]) - lo:int(b[k + 1]) - lo].view(shapes[k]) for k in tensors]

    # -- ops ---------------------------------------------------------------------------------
    def _grads(self, i: int, hi: int) -> int:
        """Compute the gradients of the grad ops from ``i`` on (while they are grad ops of one
        minibatch size, at most up to ``hi``) in one call; return the next op."""
        ops = self.trace.ops
        kind, size = ops["kind"], int(ops["batch_size"][i])
        j = i + 1
        if self.batched:
            while j < hi and kind[j] == GRAD and int(ops["batch_size"][j]) == size:
                j += 1
        rows = list(range(i, j))
        zs = [self.states[(int(ops["src_node"][r]), int(ops["src_version"][r]))] for r in rows]
        intervals = np.searchsorted(self.evals, rows).tolist()
        if len(rows) == 1:
            xb, yb = self.minibatches.one(int(ops["sample_start"][i]), size)
            g, loss = self.flat.grad(zs[0], xb, yb)
            self.grads[i] = g
            self.losses.add_one(intervals[0], loss, self.updates)
        else:
            xb, yb = self.minibatches.many(ops["sample_start"][rows], size)
            g, losses = self.flat.grad_batch(zs, xb, yb)
            for b, r in enumerate(rows):
                self.grads[r] = g[b]
            self.losses.add_many(intervals, losses, self.updates)
        for r in rows:
            self._free_read((int(ops["src_node"][r]), int(ops["src_version"][r])), r)
        return j

    def _apply(self, i: int) -> None:
        ops, inp = self.trace.ops, self.trace.inputs
        nd, v = int(ops["node"][i]), int(ops["version"][i])
        s, c = int(ops["in_start"][i]), int(ops["in_count"][i])
        gops = inp["grad_op"][s:s + c].tolist()
        coefs = self.coefs[s:s + c]
        if c == 0:
            g = torch.zeros_like(self.flat.work)
        elif c == 1:
            if self.shared_state is not None:
                for k in range(self.nodes):
                    if k != self.shared_state:
                        self.opt.copy_state(self.shared_state, k)
                self.shared_state = None
            g = self.grads.pop(gops[0])
            if coefs[0] != 1.0:
                g = g * float(coefs[0])
        elif self.compression == "none":
            g = sum((self.grads.pop(op) * float(cf) for op, cf in zip(gops, coefs)), torch.zeros_like(self.flat.work))
        else:  # the compressed all-reduce of the learners' gradients, in learner order
            order = sorted(range(c), key=lambda k: int(ops["node"][gops[k]]))
            flats = [self.grads.pop(gops[k]) * float(coefs[k] * c) for k in order]
            g = self._average(flats, self.slices[-1][2], "apply", -1)
        x = self.states[(nd, v)]
        self._set(nd, v, self.opt.step(nd, x, g, float(self.lr[i])), i)
        if c > 1:
            self.shared_state = nd
        self.updates += 1

    def _mix(self, i: int) -> None:
        ops = self.trace.ops
        nd, v = int(ops["node"][i]), int(ops["version"][i])
        key = (int(ops["src_node"][i]), int(ops["src_version"][i]))
        x, xs = self.states[(nd, v)], self.states[key]
        frag = int(ops["batch_index"][i]) if self.schema == LOCAL_SCHEMA else -1
        if frag >= 0:
            lo, hi, _ = self.slices[frag]
            new = x.clone()
            new[lo:hi] = xs[lo:hi]
        else:
            sc, cf = float(ops["self_coef"][i]), float(ops["coef"][i])
            new = torch.add(x if sc == 1.0 else x * sc, xs, alpha=cf)
        self._set(nd, v, new, i)
        self._free_read(key, i)

    def _outer(self, i: int) -> None:
        ops = self.trace.ops
        nd, v = int(ops["node"][i]), int(ops["version"][i])
        frag = int(ops["batch_index"][i])
        lo, hi, tensors = self.slices[frag]
        akey = (int(ops["src_node"][i]), int(ops["src_version"][i]))
        anchor = self.states[akey][lo:hi]
        outer = self.outer.get(frag)
        if outer is None:
            outer = self.outer[frag] = OuterOptimizer(float(ops["coef"][i]), float(ops["self_coef"][i]))
        locals_ = [self.states[(k, self.latest[k])][lo:hi] for k in range(self.nodes)]
        if self.compression == "none":
            step = outer.step(anchor, locals_)
        else:
            mean = self._average([anchor - x for x in locals_], tensors, "outer", frag)
            step = outer.step_delta(anchor, mean)
        new = self.states[(nd, v)].clone()
        new[lo:hi] = step
        self._set(nd, v, new, i)
        self._free_read(akey, i)

    def average_state(self) -> Tensor:
        """Mean over nodes of each node's latest state (an eval of node −1)."""
        xs = [self.states[(k, v)] for k, v in enumerate(self.latest)]
        return torch.stack(xs).mean(0) if len(xs) > 1 else xs[0]

    def _eval(self, i: int) -> None:
        ops = self.trace.ops
        self.losses.flush()
        k = int(ops["node"][i])
        z = self.states[(k, int(ops["version"][i]))] if k >= 0 else self.average_state()
        if not bool(torch.isfinite(z).all()):
            raise Diverged
        j = len(self.curves)
        row: dict[str, Any] = {
            "epoch": float(ops["epoch"][i]), "updates": self.updates, "sim_time_s": float(ops["t_end"][i]),
            "test_error": self.flat.test_error(z, self.data.test_x, self.data.test_y),
            "train_loss": self.losses.mean(j),
        }
        if self.nodes > 1:
            mean = z if k < 0 else self.average_state()
            row["consensus_distance"] = sum(float(torch.linalg.vector_norm(self.states[(n, v)] - mean))
                                            for n, v in enumerate(self.latest)) / self.nodes
        self.curves.append(row)
        if k >= 0:
            self._free_read((k, int(ops["version"][i])), i)
        if self.progress is not None:
            self.progress(row["epoch"])

    def run(self) -> list[dict[str, Any]]:
        """Execute every op; return the curves (divergence stops the run, never raises)."""
        x0 = self.flat.work.detach().clone()
        for k in range(self.nodes):
            self.states[(k, 0)] = x0
        kind = self.trace.ops["kind"].tolist()
        n = len(kind)
        try:
            i = 0
            while i < n:
                k = kind[i]
                if k == GRAD:
                    i = self._grads(i, n)
                    continue
                if k == APPLY:
                    self._apply(i)
                elif k == MIX:
                    self._mix(i)
                elif k == OUTER:
                    self._outer(i)
                else:
                    self._eval(i)
                i += 1
            self.losses.flush()
            if any(not bool(torch.isfinite(x).all()) for x, _ in self.final_states().values()):
                raise Diverged
        except Diverged:
            if self.losses.updates_at_divergence is not None:
                self.updates = self.losses.updates_at_divergence
            self.diverged, self.diverged_at_update = True, self.updates
        return self.curves
