"""Where a backend computes: the device, and torch's thread count for one scope.

Importing this module does not import torch (the command line checks ``--device`` early
and ``ddlsim simulate`` never needs torch).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any
from collections.abc import Iterator

from .base import BackendError


def resolve_device(device: str | None) -> Any:
    """``device`` as a ``torch.device``; None (no option given) is cuda when available, else
    cpu. An empty name, or an unknown or unavailable device, is a :class:`BackendError`."""
    import torch

    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not device.strip():
        raise BackendError(f"device {device!r}: an empty device name (use cpu, cuda or cuda:N, or leave "
                           "--device out for cuda when available)")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise BackendError(f"device {device!r}: not a device (use cpu, cuda or cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise BackendError(f"device {device!r}: ddlsim runs on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendError(f"device {device!r} requested but CUDA is not available here")
    return dev


@contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run the block with ``threads`` intra-op threads (None or ≤ 0: unchanged); restore after."""
    import torch

    before = torch.get_num_threads()
    if threads and threads > 0 and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)

