"""What a compressed all-reduce puts on the wire, per node and step (torch-free; docs/compression.md).

A node contributes one payload to each all-reduce of a step; these functions count that
payload (the all-reduce algorithm's cost model, :mod:`collectives`, turns it into time).
Gradients are float32 (``dtype_bytes`` 4) unless told otherwise. ``shapes`` are the
model's parameter shapes, in the order the gradients are given.

* ``"none"``: every element at ``dtype_bytes``.
* ``"fp16"`` / ``"bf16"`` (DDP's ``fp16_compress_hook`` / ``bf16_compress_hook``): every
  element at 2 bytes, one all-reduce.
* ``"powersgd"`` (Vogels et al. 2019; DDP's ``powerSGD_hook``, one bucket): a tensor of
  ``ndim ≥ 2`` is viewed as the ``n × m`` matrix ``(shape[0], rest)``; with the effective
  rank ``r' = min(n, m, r)`` it is compressed when
  ``r'·(n + m) · min_compression_rate < n·m`` (the hook's ``_should_compress``) and then
  sends ``P`` (``n·r'``) and ``Q`` (``m·r'``) elements; every other tensor (vectors,
  scalars, matrices not worth compressing: a rank at or above the smaller side always
  sends the matrix exactly) is sent uncompressed. The hook runs three all-reduces in
  turn: the uncompressed tensors, then all ``P``, then all ``Q``
  (:func:`allreduce_payloads`); :func:`bytes_sent` is their sum.
  During the first ``warmup`` steps (the hook's ``start_powerSGD_iter``) the step is a
  plain all-reduce of everything (:func:`compression_active`).

``MIN_COMPRESSION_RATE`` is 1 (compress whenever it sends fewer elements); torch's own
default is 2, and the live backend passes ddlsim's value to the hook.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
HALF_BYTES = 2
MIN_COMPRESSION_RATE = 1.0

Shape = Sequence[int]


def check_compression(compression: str) -> None:
    """Raise ValueError naming ``protocol.compression`` unless it is one of :data:`COMPRESSIONS`."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"protocol.compression = {compression!r}: expected one of {', '.join(COMPRESSIONS)}")


def check_rank(rank: int) -> None:
    """Raise ValueError naming ``protocol.powersgd_rank`` unless it is an integer ≥ 1."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"protocol.powersgd_rank = {rank!r}: expected an integer ≥ 1")


def numel(shape: Shape) -> int:
    """Elements of a tensor of ``shape`` (1 for a scalar)."""
    return math.prod(int(s) for s in shape)


def matrix_view(shape: Shape) -> tuple[int, int] | None:
    """``(n, m) = (shape[0], Π shape[1:])`` for a tensor of ``ndim ≥ 2``; None for vectors and scalars."""
    if len(shape) < 2:
        return None
    n = int(shape[0])
    return n, numel(shape) // n if n else 0


def effective_rank(n: int, m: int, rank: int) -> int:
    """``min(n, m, rank)``: the rank PowerSGD uses on an ``n × m`` matrix."""
    return min(n, m, rank)


def powersgd_compresses(shape: Shape, rank: int, min_compression_rate: float = MIN_COMPRESSION_RATE) -> bool:
    """Whether PowerSGD compresses a tensor of ``shape`` (module doc: a matrix whose
    ``r'·(n + m)·min_compression_rate < n·m``)."""
    nm = matrix_view(shape)
    if nm is None:
        return False
    n, m = nm
    return effective_rank(n, m, rank) * (n + m) * min_compression_rate < n * m


def compression_active(compression: str, step: int, warmup: int = 0) -> bool:
    """Whether step ``step`` (0-based) is compressed: fp16/bf16 always, PowerSGD from step
    ``warmup`` on (the hook's ``state.iter ≥ start_powerSGD_iter``), ``none`` never."""
    check_compression(compression)
    if compression == "none":
        return False
    return compression != "powersgd" or step >= warmup


def allreduce_payloads(shapes: Sequence[Shape], compression: str, rank: int = 1, *, dtype_bytes: int = 4,
                       min_compression_rate: float = MIN_COMPRESSION_RATE) -> tuple[int, ...]:
    """Bytes a node contributes to each all-reduce of one compressed step, in the order they
    run: ``(all,)`` for none/fp16/bf16; ``(uncompressed, P, Q)`` for PowerSGD (an entry may be 0)."""
    check_compression(compression)
    total = sum(numel(s) for s in shapes)
    if compression == "none":
        return (total * dtype_bytes,)
    if compression in ("fp16", "bf16"):
        return (total * HALF_BYTES,)
    check_rank(rank)
    plain = p = q = 0
    for s in shapes:
        if powersgd_compresses(s, rank, min_compression_rate):
            nm = matrix_view(s)
            assert nm is not None
            n, m = nm
            r = effective_rank(n, m, rank)
            p += n * r
            q += m * r
        else:
            plain += numel(s)
    return (plain * dtype_bytes, p * dtype_bytes, q * dtype_bytes)


def bytes_sent(shapes: Sequence[Shape], compression: str, rank: int = 1, *, dtype_bytes: int = 4,
               min_compression_rate: float = MIN_COMPRESSION_RATE) -> int:
    """Bytes one node contributes to a compressed step's all-reduces (the sum of
    :func:`allreduce_payloads`); fp16/bf16 are half of float32, PowerSGD ``r'·(n + m)`` per
    compressed ``n × m`` matrix plus the rest uncompressed."""
    return sum(allreduce_payloads(shapes, compression, rank, dtype_bytes=dtype_bytes,
                                  min_compression_rate=min_compression_rate))


def powersgd_flops(shapes: Sequence[Shape], rank: int,
                   min_compression_rate: float = MIN_COMPRESSION_RATE) -> int:
    """Floating-point operations of one node's PowerSGD step (multiply-adds counted as 2):
    ``P = M Q``, ``Q = Mᵀ P̂`` and ``P̂ Qᵀ`` are ``2·n·m·r'`` each; orthogonalising ``P``
    (Gram-Schmidt) ``≈ 4·n·r'²``; error feedback two additions per element of a compressed matrix."""
    flops = 0
    for s in shapes:
        if powersgd_compresses(s, rank, min_compression_rate):
            nm = matrix_view(s)
            assert nm is not None
            n, m = nm
            r = effective_rank(n, m, rank)
            flops += 3 * 2 * n * m * r + 4 * n * r * r + 2 * n * m
    return flops
