"""The arithmetic of compressed gradient averaging, as DDP's comm hooks do it (docs/compression.md).

Pure functions on lists of tensors, no process group: ``per_node[i][k]`` is node ``i``'s
gradient of tensor ``k`` (every node the same shapes, in the same order); each function
returns the list every node receives (the decompressed mean). Sums over nodes run in node
order, one rounding per addition (what a 2-rank gloo all-reduce computes exactly). Every
function also runs on one live node: given its own gradients, the world size and a
:data:`Reduce` that all-reduces (sums) over the nodes, it returns what the pure form returns
(:mod:`.live_local`), so the replay and the live run share one definition of the arithmetic.

* :func:`mean_average` is ``allreduce_hook`` (and PowerSGD's warm-up steps):
  ``Σ_i (g_i / n)``.
* :func:`half_average` is ``fp16_compress_hook`` / ``bf16_compress_hook``: each node casts
  to the half type and divides by ``n`` there, the casts are summed in the half type, and
  the sum is cast back. :func:`round_trip` is one tensor's cast and back (what is sent).
* :class:`PowerSGDState` is ``powerSGD_hook`` with error feedback and warm start on, all
  gradients in one bucket, ``batch_tensors_with_same_shape`` off: per node ``M_i = g_i + e_i``
  for every tensor; a compressed tensor (:func:`ddlsim.simulator.compression_bytes.powersgd_compresses`)
  viewed as ``n × m`` gets ``P = Σ_i M_i Q``, ``P̂ = orth(P)``, ``Q = (Σ_i M_iᵀ P̂) / n``,
  ``approx = P̂ Qᵀ``; the others ``Σ_i M_i / n``; then ``e_i = M_i − received`` for every
  tensor (the hook keeps the error of the whole bucket, uncompressed tensors included).
  ``Q`` starts as standard normals drawn in the hook's order (tensors grouped by shape, in
  order of first appearance of their ``n × m`` view) from ``torch.manual_seed(RandomState(seed).randint(10⁹))``,
  orthogonalised, identical on every node; later steps reuse the previous step's averaged
  ``Q`` (warm start), re-orthogonalised. ``orth`` is Gram-Schmidt (with ``epsilon`` added to
  each column norm) for ranks ≤ 2, ``torch.linalg.qr`` above, as the hook decides.
  Steps before ``warmup`` are :func:`mean_average` with no error memory (the hook's
  ``start_powerSGD_iter``).

:meth:`PowerSGDState.average` has two forms, as ``torch.optim`` keeps foreach and
single-tensor loops: ``batched=False`` (the default) runs each node's products as the hook
does (one ``torch.bmm`` per tensor and node, bit for bit the hook's on two nodes);
``batched=True`` stacks the nodes' matrices of each tensor into one ``matmul`` (equal to
float rounding). Measured on one CPU thread (rank 2, paired and interleaved, 9 rounds),
per-tensor time / batched time: 1.30 for the digits MLP on 16 nodes, 0.80–0.84 for a
784-512-512-10 MLP on 4 and 16 nodes (the stack copies every node's matrix), hence the default.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

from ..simulator.compression_bytes import (
    COMPRESSIONS,
    MIN_COMPRESSION_RATE,
    bytes_sent,
    check_compression,
    check_rank,
    compression_active,
    effective_rank,
    matrix_view,
    powersgd_compresses,
)

__all__ = ["COMPRESSIONS", "HALF_DTYPES", "PowerSGDState", "average", "bytes_sent", "compression_active",
           "half_average", "mean_average", "orthogonalize_", "round_trip"]

HALF_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
SEED_BOUND = 1_000_000_000  # the hook's torch.manual_seed(rng.randint(1_000_000_000))


def round_trip(t: Tensor, compression: str) -> Tensor:
    """``t`` cast to the half type of ``compression`` (``"fp16"``/``"bf16"``) and back."""
    return t.to(HALF_DTYPES[compression]).to(t.dtype)


Reduce = Callable[[Tensor], Tensor]


def node_sum(stack: Tensor) -> Tensor:
    """``stack[0] + stack[1] + …`` over the first dimension, in order (a new tensor): the sum
    over nodes when every node's tensor is here (a :data:`Reduce`)."""
    acc = stack[0].clone()
    for t in stack[1:]:
        acc.add_(t)
    return acc


def mean_average(per_node: Sequence[Sequence[Tensor]], reduce: Reduce = node_sum,
                 world: int | None = None) -> list[Tensor]:
    """``Σ_i (g_i / n)`` per tensor (DDP's ``allreduce_hook``: divide, then all-reduce).

    ``reduce`` sums a stack of the nodes' tensors held here over every node (default: they are
    all here; a live node passes its all-reduce and its one gradient list), ``world`` is n."""
    n = world or len(per_node)
    return [reduce(torch.stack([g[k] / n for g in per_node])) for k in range(len(per_node[0]))]


def half_average(per_node: Sequence[Sequence[Tensor]], compression: str, reduce: Reduce = node_sum,
                 world: int | None = None) -> list[Tensor]:
    """``fp16_compress_hook`` / ``bf16_compress_hook``: ``Σ_i half(g_i) / n`` summed in the
    half type (each division and addition rounded there), cast back to each tensor's dtype;
    ``reduce`` and ``world`` as in :func:`mean_average`."""
    dtype = HALF_DTYPES[compression]
    n = world or len(per_node)
    out = []
    for k in range(len(per_node[0])):
        summed = reduce(torch.stack([g[k].to(dtype).div_(n) for g in per_node]))
        out.append(summed.to(per_node[0][k].dtype))
    return out


def orthogonalize_(matrices: Tensor, epsilon: float = 0.0) -> Tensor:
    """Orthonormalise the columns of each matrix of the batch ``matrices`` (B, n, r), r ≤ n,
    in place, as the hook's ``_orthogonalize``: Gram-Schmidt for r ≤ 2 or half types (each
    column divided by its norm + ``epsilon``, then removed from the later columns), else
    the Q of ``torch.linalg.qr``."""
    if matrices.dim() != 3 or matrices.shape[2] > matrices.shape[1]:
        raise ValueError(f"orthogonalize_: expected (B, n, r) with r ≤ n, got {tuple(matrices.shape)}")
    r = matrices.shape[2]
    if r <= 2 or matrices.dtype in (torch.float16, torch.bfloat16):
        for i in range(r):
            col = matrices[:, :, i:i + 1]
            norm = torch.linalg.vector_norm(col, dim=1, keepdim=True)
            col /= norm + epsilon if epsilon else norm
            if i + 1 < r:
                rest = matrices[:, :, i + 1:]
                rest -= torch.sum(col * rest, dim=1, keepdim=True) * col
    else:
        q, _ = torch.linalg.qr(matrices)
        matrices.copy_(q)
    return matrices


class PowerSGDState:
    """Per-node PowerSGD state (error memory, warm-start ``Q``) and the module doc's rule.

    ``rank`` r ≥ 1; ``warmup`` uncompressed steps first; ``seed`` the hook's ``random_seed``;
    ``min_compression_rate`` and ``epsilon`` the hook's ``min_compression_rate`` and
    ``orthogonalization_epsilon``. The state binds to the tensor shapes and node count of
    its first compressed step.
    """

    def __init__(self, rank: int, warmup: int = 0, seed: int = 0, *,
                 min_compression_rate: float = MIN_COMPRESSION_RATE, epsilon: float = 0.0,
                 batched: bool = False) -> None:
        check_rank(rank)
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise ValueError(f"protocol.powersgd_warmup = {warmup!r}: expected an integer ≥ 0")
        self.rank = rank
        self.warmup = warmup
        self.seed = seed
        self.min_compression_rate = float(min_compression_rate)
        self.epsilon = float(epsilon)
        self.batched = batched
        self.rng = np.random.RandomState(seed)
        self.errors: list[list[Tensor]] | None = None  # errors[i][k]: node i, tensor k
        self.qs: dict[int, Tensor] = {}  # tensor index → averaged Q (1, m, r') of the last step
        self.compressed: list[int] = []  # indices of the compressed tensors

    def compresses(self, shape: Sequence[int]) -> bool:
        """Whether a tensor of ``shape`` is compressed (a matrix worth it at this rank)."""
        return powersgd_compresses(shape, self.rank, self.min_compression_rate)

    def _init_qs(self, grads: Sequence[Tensor]) -> None:
        """Random orthonormal ``Q`` for every compressed tensor, drawn in the hook's order."""
        by_shape: dict[tuple[int, int] | None, list[int]] = defaultdict(list)
        for k in self.compressed:
            by_shape[matrix_view(grads[k].shape)].append(k)
        gen = torch.Generator().manual_seed(int(self.rng.randint(SEED_BOUND)))
        for ks in by_shape.values():
            for k in ks:
                nm = matrix_view(grads[k].shape)
                assert nm is not None
                n, m = nm
                q = torch.randn(1, m, effective_rank(n, m, self.rank), generator=gen, dtype=grads[k].dtype)
                self.qs[k] = orthogonalize_(q.to(grads[k].device), self.epsilon)

    def average(self, per_node_grads: Sequence[Sequence[Tensor]], step: int, reduce: Reduce = node_sum,
                world: int | None = None) -> list[Tensor]:
        """The decompressed mean every node receives at step ``step`` (0-based) for the
        nodes' gradients ``per_node_grads[i][k]``; updates the error memory and ``Q``.

        As the hook, three sums over the nodes, each of one flat vector: the uncompressed
        tensors, all ``P``, all ``Q``; ``reduce`` and ``world`` as in :func:`mean_average` (a
        live node keeps the state of its own gradients only)."""
        n = world or len(per_node_grads)
        if step < self.warmup:
            return mean_average(per_node_grads, reduce, n)
        here = len(per_node_grads)
        first = per_node_grads[0]
        if self.errors is None:
            self.compressed = [k for k, g in enumerate(first) if self.compresses(g.shape)]
            self.errors = [[torch.zeros_like(g) for g in grads] for grads in per_node_grads]
            self._init_qs(first)
        elif len(self.errors) != here:
            raise ValueError(f"PowerSGD state of {len(self.errors)} nodes given {here} nodes' gradients")
        else:
            for q in self.qs.values():
                orthogonalize_(q, self.epsilon)
        mats = [[g + e for g, e in zip(grads, errs)] for grads, errs in zip(per_node_grads, self.errors)]
        comp = self.compressed
        is_comp = set(comp)
        plain = [k for k in range(len(first)) if k not in is_comp]
        out: list[Tensor | None] = [None] * len(first)
        if plain:
            summed = reduce(torch.stack([torch.cat([m[k].reshape(-1) for k in plain]) for m in mats])).div_(n)
            for k, part in zip(plain, _split_flat(summed, [first[k] for k in plain])):
                out[k] = part
        if comp:
            views = [[m[k].reshape(1, first[k].shape[0], -1) for k in comp] for m in mats]  # node → (1, n, m)
            p_all = reduce(self._products(views, [self.qs[k] for k in comp], transpose=False))
            ps = _split_flat(p_all, [self.qs[k].new_empty(1, v.shape[1], self.qs[k].shape[2])
                                     for k, v in zip(comp, views[0])])
            self._orthogonalize_all(ps)
            q_all = reduce(self._products(views, ps, transpose=True)).div_(n)
            qs = _split_flat(q_all, [self.qs[k] for k in comp])
            for k, p, q in zip(comp, ps, qs):
                self.qs[k] = q
                out[k] = torch.bmm(p, q.transpose(1, 2)).reshape(first[k].shape)
        result = [t for t in out if t is not None]
        for i in range(here):
            self.errors[i] = [mats[i][k] - result[k] for k in range(len(first))]
        return result

    def _products(self, views: list[list[Tensor]], factors: list[Tensor], transpose: bool) -> Tensor:
        """Every node's ``M_k F_k`` (or ``M_kᵀ F_k``) for each compressed tensor k, flattened
        and concatenated: one row per node (the batched form stacks the nodes per tensor)."""
        here = len(views)
        if self.batched:
            cols = []
            for j, f in enumerate(factors):
                stack = torch.stack([views[i][j] for i in range(here)])  # (nodes, 1, n, m)
                prod = torch.matmul(stack.transpose(2, 3) if transpose else stack, f)
                cols.append(prod.reshape(here, -1))
            return torch.cat(cols, dim=1)
        rows = []
        for i in range(here):
            rows.append(torch.cat([torch.bmm(v.transpose(1, 2) if transpose else v, f).reshape(-1)
                                   for v, f in zip(views[i], factors)]))
        return torch.stack(rows)

    def _orthogonalize_all(self, ps: list[Tensor]) -> None:
        """Orthogonalise each ``P`` in place: one at a time (the hook), or same shapes together (batched)."""
        if not self.batched:
            for p in ps:
                orthogonalize_(p, self.epsilon)
            return
        groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for j, p in enumerate(ps):
            groups[tuple(p.shape)].append(j)
        for js in groups.values():
            if len(js) == 1:
                orthogonalize_(ps[js[0]], self.epsilon)
                continue
            batch = orthogonalize_(torch.cat([ps[j] for j in js]), self.epsilon)
            for b, j in enumerate(js):
                ps[j].copy_(batch[b:b + 1])


def _split_flat(flat: Tensor, like: Sequence[Tensor]) -> list[Tensor]:
    """``flat`` cut into consecutive pieces shaped as the tensors of ``like`` (views)."""
    out, at = [], 0
    for t in like:
        k = t.numel()
        out.append(flat[at:at + k].view(t.shape))
        at += k
    return out


def average(per_node_grads: Sequence[Sequence[Tensor]], compression: str,
            powersgd: PowerSGDState | None = None, step: int = 0, reduce: Reduce = node_sum,
            world: int | None = None) -> list[Tensor]:
    """The mean every node receives under ``compression`` (``powersgd`` holds PowerSGD's
    state; ``reduce`` and ``world`` as in :func:`mean_average`)."""
    check_compression(compression)
    if compression == "none":
        return mean_average(per_node_grads, reduce, world)
    if compression in HALF_DTYPES:
        return half_average(per_node_grads, compression, reduce, world)
    if powersgd is None:
        raise ValueError("compression 'powersgd' needs a PowerSGDState")
    return powersgd.average(per_node_grads, step, reduce, world)
