"""Update rules for the trace backends (DESIGN.md, "Learning-rate policies").

Everything here works on *flat* parameter vectors. Each update rule has two forms side by
side, as ``torch.optim`` keeps ``_single_tensor_*`` and ``_multi_tensor_*``:

* the per-tensor form (:func:`sgd_update`, :func:`adagrad_update`) is pure: it returns new
  tensors and never modifies its arguments (unless ``own_state=True`` lets it update the
  caller's optimizer state in place, as :class:`Optimizer` does with its own), so a backend
  may keep an old weights version alive for stale readers;
* the row-batched form (:func:`sgd_update_rows_`, :func:`adagrad_update_rows_`) steps ``A``
  nodes' rows at once, in place (the stacked replay's pool of weights rows), with one
  learning rate or one per row; each row gets exactly the per-tensor form's arithmetic.

:class:`Optimizer` dispatches to both (:meth:`Optimizer.step`, :meth:`Optimizer.step_rows_`);
no other module spells an update rule. Rules kept:

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


def weight_decayed(g: Tensor, x: Tensor, weight_decay: float, w: float | np.ndarray | None = None) -> Tensor:
    """``d = g + wd · x / w``: ``w`` None or 1 (x is the weights), a float (one PushSum
    state), or one weight per row of ``x`` (rows); ``g`` itself when ``wd`` is 0."""
    if weight_decay == 0:
        return g
    if w is None:
        return torch.add(g, x, alpha=weight_decay)
    if isinstance(w, float):
        return torch.add(g, x, alpha=weight_decay / w if w != 1.0 else weight_decay)
    return torch.addcmul(g, torch.from_numpy(weight_decay / w).to(x)[:, None], x)


def sgd_update(x: Tensor, g: Tensor, buf: Tensor | None, lr: float, momentum: float = 0.0,
               nesterov: bool = False, weight_decay: float = 0.0, *,
               own_state: bool = False) -> tuple[Tensor, Tensor | None]:
    """One SGD step (torch.optim.SGD semantics); return ``(new x, new momentum buffer)``.

    ``buf`` None means a zero buffer; with ``momentum == 0`` the buffer stays None.
    ``own_state``: the caller owns ``buf``, which is then updated in place (saves a copy).
    """
    d = weight_decayed(g, x, weight_decay)
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
    d = weight_decayed(g, x, weight_decay)
    if acc is None:
        new_acc = d * d
    else:
        new_acc = torch.addcmul(acc, d, d, out=acc if own_state else None)
    return torch.addcdiv(x, d, new_acc.sqrt().add_(eps), value=-lr), new_acc


def _descend_(x: Tensor, step: Tensor, lr: float | Tensor, out: Tensor | None) -> None:
    """``x ← x − lr · step`` in place (or into ``out``); ``lr`` a float or one per row (no ``out``)."""
    if isinstance(lr, Tensor):
        x.addcmul_(lr[:, None], step, value=-1.0)
    elif out is None:
        x.add_(step, alpha=-lr)
    else:
        torch.add(x, step, alpha=-lr, out=out)


def sgd_update_rows_(x: Tensor, g: Tensor, buf: Tensor | None, lr: float | Tensor, momentum: float = 0.0,
                     nesterov: bool = False, weight_decay: float = 0.0, w: float | np.ndarray | None = None,
                     out: Tensor | None = None) -> None:
    """:func:`sgd_update` on rows, in place: ``x`` (or ``out``) and the momentum rows ``buf``
    (zeros before a row's first step; None when ``momentum`` is 0) are updated; ``lr`` is a
    float or a tensor of one rate per row; ``w`` as in :func:`weight_decayed`."""
    d = weight_decayed(g, x, weight_decay, w)
    if buf is None:
        step = d
    else:
        torch.add(d, buf, alpha=momentum, out=buf)
        step = torch.add(d, buf, alpha=momentum) if nesterov else buf
    _descend_(x, step, lr, out)


def adagrad_update_rows_(x: Tensor, g: Tensor, acc: Tensor, lr: float | Tensor, weight_decay: float = 0.0,
                         w: float | np.ndarray | None = None, eps: float = ADAGRAD_EPS,
                         out: Tensor | None = None) -> None:
    """:func:`adagrad_update` on rows, in place: ``x`` (or ``out``) and the sums of squares
    ``acc`` (zeros before a row's first step) are updated; ``lr`` and ``w`` as in
    :func:`sgd_update_rows_`."""
    d = weight_decayed(g, x, weight_decay, w)
    acc.addcmul_(d, d)
    den = acc.sqrt().add_(eps)
    if isinstance(lr, Tensor):
        x.addcmul_(lr[:, None], d / den, value=-1.0)
    elif out is None:
        x.addcdiv_(d, den, value=-lr)
    else:
        torch.addcdiv(x, d, den, value=-lr, out=out)


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
            g = weight_decayed(g, x, wd, w)
            wd = 0.0
        if self.name == "adagrad":
            new_x, self.state[node] = adagrad_update(x, g, self.state.get(node), lr, wd, own_state=True)
        else:
            new_x, self.state[node] = sgd_update(x, g, self.state.get(node), lr, self.momentum,
                                                 self.nesterov, wd, own_state=True)
        return new_x

    @property
    def has_state(self) -> bool:
        """Whether a step keeps per-node state (a momentum buffer or AdaGrad's sums)."""
        return self.name == "adagrad" or self.momentum != 0

    def step_rows_(self, x: Tensor, g: Tensor, state: Tensor | None, lr: float | Tensor,
                   w: float | np.ndarray | None = None, out: Tensor | None = None) -> None:
        """Step the rows ``x`` (several nodes' weights, or one node's as a 1-D row) on their
        combined gradients ``g``, in place or into ``out``; ``state``: the nodes' state rows
        (zeros before their first step; None without state), updated in place. Each row gets
        exactly :meth:`step`'s arithmetic; weight decay acts on ``x / w``."""
        if self.name == "adagrad":
            assert state is not None
            adagrad_update_rows_(x, g, state, lr, self.weight_decay, w, out=out)
        else:
            sgd_update_rows_(x, g, state, lr, self.momentum, self.nesterov, self.weight_decay, w, out)
