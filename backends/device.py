"""Where a backend computes: the device, and torch's thread count for one scope.

Importing this module does not import torch (the command line checks ``--device`` early
and ``ddlsim simulate`` never needs torch).
"""

from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
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


@lru_cache(maxsize=8)
def numerics(device: str | None = None) -> str:
    """What a replay's floating-point rounding depends on besides the scenario and its seeds:
    torch's version and, on the CPU, the vector kernels torch dispatches to there and the CPU's
    vendor and architecture (its BLAS picks its code path by them); on CUDA, the GPU and the
    CUDA and cuDNN versions. On CPUs, runs with equal strings gave equal numbers (docs/demo.md);
    on CUDA they need not (cuDNN may pick other algorithms from run to run). A device this
    module does not resolve (a third-party backend's) is named as given."""
    import platform

    import torch

    try:
        dev = resolve_device(device)
    except BackendError:
        return f"torch {torch.__version__} on {device}"
    if dev.type == "cuda":
        return (f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()} on "
                f"{torch.cuda.get_device_name(dev)}")
    return (f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()} CPU kernels, "
            f"{_cpu_vendor() or 'unknown vendor'} {platform.machine()}")


def _cpu_vendor() -> str:
    """The CPU's vendor as Linux reports it (``vendor_id`` of /proc/cpuinfo, first 64 KiB), else
    ``platform.processor()`` (on macOS an architecture, on Windows a model string)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            text = f.read(1 << 16)
    except OSError:
        return platform.processor()
    for line in text.splitlines():
        if line.startswith("vendor_id"):
            return line.split(":", 1)[1].strip()
    return platform.processor()
