"""The one place ddlsim calls a private torch API: the autograd engine, without the checks.

``Tensor.backward()`` and ``torch.autograd.grad`` normalise their arguments (grad tensors,
inputs, retain flags) and then call ``torch.autograd.graph._engine_run_backward``. The
replay's arguments are always the same (one scalar output, a ready seed), so calling the
engine directly skips that work: measured on this project's 2-core machine (digits MLP,
μ = 4) ≈ 20–25 µs of a ≈ 180 µs gradient (docs/replay.md). Results are the same engine's,
bit for bit.

What breaks it: a torch release that renames or re-signs ``_engine_run_backward``. Then the
import fails or the call raises ``TypeError``, and these functions fall back to the public
calls (slower, same numbers). ``tests/test_replay.py`` checks both paths give identical
gradients.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

try:
    from torch.autograd.graph import _engine_run_backward
except ImportError:  # pragma: no cover - another torch: the public path
    _engine_run_backward = None  # type: ignore[assignment]

FAST = _engine_run_backward is not None


def backward(loss: Tensor, seed: Tensor) -> None:
    """``loss.backward(seed)``: accumulate the gradients into the leaves' ``.grad``."""
    if FAST:
        _engine_run_backward((loss,), (seed,), False, False, (), allow_unreachable=True, accumulate_grad=True)
    else:
        loss.backward(seed)


def gradients(total: Tensor, inputs: tuple[Tensor, ...], seed: Tensor) -> tuple[Any, ...]:
    """``torch.autograd.grad(total, inputs, seed, allow_unused=True)``: None for an unused input."""
    if FAST:
        return _engine_run_backward((total,), (seed,), False, False, inputs, allow_unreachable=True,
                                    accumulate_grad=False)
    return torch.autograd.grad(total, inputs, seed, allow_unused=True)
