"""Update rules for the trace backends (DESIGN.md, "Learning-rate policies").

Everything here works on *flat* parameter vectors. The update functions are pure: they
return new tensors and never modify their arguments (unless ``own_state=True`` lets them
update the caller's optimizer state in place, as :class:`Optimizer` does with its own), so
a backend may keep an old weights version alive for stale readers. Rules kept:

* :func:`sgd_update` is ``torch.optim.SGD`` with dampening 0: ``d = g + wd·x``;
  ``buf ← d + m·buf`` (``buf`` starts at 0, which equals torch's ``buf = d`` on the first
  step); the step is ``d + m·buf`` (Nesterov) or ``buf``; ``x ← x − lr·step``.
* :func:`adagrad_update` is ``torch.optim.Adagrad`` with ``lr_decay = 0``, initial
  accumulator 0, ``eps = 1e-10``: ``d = g + wd·x``; ``acc ← acc + d²``;
  ``x ← x − lr·d / (√acc + eps)``.
* :func:`lr_at`: ``α0 · min(1, epoch / warmup_epochs) · Π factor`` over the milestones
  with ``epoch ≥ milestone`` (cumulative).
* :func:`staleness_scale`: ``constant`` 1; ``mean_staleness`` 1/⟨σ⟩ (1 when ⟨σ⟩ < 1);
  ``per_gradient`` 1/σ_i (1 when σ_i = 0).
* An apply (:meth:`Optimizer.step`) takes ``g = Σ_i weight_i · scale_i · g_i`` (summed by
  the caller), adds weight decay and steps with ``lr_at(epoch of the apply)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

ADAGRAD_EPS = 1e-10
POLICIES = ("constant", "mean_staleness", "per_gradient")


def sgd_update(x: Tensor, g: Tensor, buf: Tensor | None, lr: float, momentum: float = 0.0,
               nesterov: bool = False, weight_decay: float = 0.0, *,
               own_state: bool = False) -> tuple[Tensor, Tensor | None]:
    """One SGD step (torch.optim.SGD semantics); return ``(new x, new momentum buffer)``.

    ``buf`` None means a zero buffer; with ``momentum == 0`` the buffer stays None.
    ``own_state``: the caller owns ``buf``, which is then updated in place (saves a copy).
    """
    d = g if weight_decay == 0 else torch.add(g, x, alpha=weight_decay)
    if momentum == 0:
        return torch.add(x, d, alpha=-lr), buf
    if buf is None:
        new_buf = d.clone()
    else:
        new_buf = torch.add(d, buf, alpha=momentum, out=buf if own_state else None)
    step = torch.add(d, new_buf, alpha=momentum) if nesterov else new_buf
    return torch.add(x, step, alpha=-lr), new_buf


def adagrad_update(x: Tensor, g: Tensor, acc: Tensor | None, lr: float, weight_decay: float = 0.0,
                   eps: float = ADAGRAD_EPS, *, own_state: bool = False) -> tuple[Tensor, Tensor]:
    """One AdaGrad step (torch.optim.Adagrad semantics); return ``(new x, new sum of squares)``.

    ``acc`` None means a zero accumulator; ``own_state``: ``acc`` is updated in place.
    """
    d = g if weight_decay == 0 else torch.add(g, x, alpha=weight_decay)
    if acc is None:
        new_acc = d * d
    else:
        new_acc = torch.addcmul(acc, d, d, out=acc if own_state else None)
    return torch.addcdiv(x, d, new_acc.sqrt().add_(eps), value=-lr), new_acc


def lr_at(epoch: float | np.ndarray, opt_cfg: dict[str, Any]) -> float | np.ndarray:
    """Learning rate at ``epoch`` (scalar or array): α0, linear warm-up, cumulative milestones."""
    e = np.asarray(epoch, dtype=np.float64)
    lr = np.full(e.shape, float(opt_cfg["lr"]))
    warm = float(opt_cfg.get("warmup_epochs", 0.0) or 0.0)
    if warm > 0:
        lr = lr * np.clip(e / warm, 0.0, 1.0)
    for milestone, factor in opt_cfg.get("milestones", []) or []:
        lr = np.where(e >= milestone, lr * factor, lr)
    return float(lr) if lr.ndim == 0 else lr


def mean_staleness(staleness: np.ndarray) -> float:
    """⟨σ⟩ over all apply inputs of a trace (0 when there are none)."""
    return float(np.mean(staleness)) if len(staleness) else 0.0


def staleness_scale(policy: str, staleness: np.ndarray, mean_sigma: float) -> np.ndarray:
    """Per-gradient learning-rate factor of ``policy`` for gradients of staleness ``staleness``."""
    s = np.asarray(staleness, dtype=np.float64)
    if policy == "constant":
        return np.ones_like(s)
    if policy == "mean_staleness":
        return np.full_like(s, 1.0 if mean_sigma < 1 else 1.0 / mean_sigma)
    if policy == "per_gradient":
        return np.where(s > 0, 1.0 / np.maximum(s, 1.0), 1.0)
    raise ValueError(f"unknown lr_policy {policy!r} (expected one of {', '.join(POLICIES)})")


class Optimizer:
    """Per-node optimizer state (momentum buffer or AdaGrad sum) and the scenario's rule.

    ``opt_cfg`` is the scenario's ``optimizer`` table; ``mean_sigma`` the trace's ⟨σ⟩.
    State of node ``n`` lives in ``self.state[n]`` (absent until its first step).
    """

    def __init__(self, opt_cfg: dict[str, Any], mean_sigma: float = 0.0) -> None:
        self.cfg = dict(opt_cfg)
        self.name: str = opt_cfg["name"]
        if self.name not in ("sgd", "nesterov", "adagrad"):
            raise ValueError(f"unknown optimizer {self.name!r}")
        self.policy: str = opt_cfg.get("lr_policy", "constant")
        self.momentum = float(opt_cfg.get("momentum", 0.0)) if self.name != "adagrad" else 0.0
        self.weight_decay = float(opt_cfg.get("weight_decay", 0.0))
        self.nesterov = self.name == "nesterov"
        self.mean_sigma = float(mean_sigma)
        self.state: dict[int, Tensor | None] = {}

    def lr(self, epoch: float | np.ndarray) -> float | np.ndarray:
        """The scheduled learning rate at ``epoch``."""
        return lr_at(epoch, self.cfg)

    def scales(self, staleness: np.ndarray) -> np.ndarray:
        """The staleness policy's factor for each gradient."""
        return staleness_scale(self.policy, staleness, self.mean_sigma)

    def step(self, node: int, x: Tensor, g: Tensor, lr: float, w: float = 1.0) -> Tensor:
        """Return node ``node``'s new ``x`` after a step on the combined gradient ``g``.

        Weight decay acts on the de-biased weights ``x / w`` (``x`` when ``w == 1``).
        """
        wd = self.weight_decay
        if wd and w != 1.0:
            g = torch.add(g, x, alpha=wd / w)
            wd = 0.0
        if self.name == "adagrad":
            new_x, self.state[node] = adagrad_update(x, g, self.state.get(node), lr, wd, own_state=True)
        else:
            new_x, self.state[node] = sgd_update(x, g, self.state.get(node), lr, self.momentum,
                                                 self.nesterov, wd, own_state=True)
        return new_x
