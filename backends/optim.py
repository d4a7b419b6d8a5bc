"""Update rules for the trace backends (docs/design.md, "Learning-rate policies").

Everything here works on *flat* parameter vectors. Each update rule has two forms side by
side, as ``torch.optim`` keeps ``_single_tensor_*`` and ``_multi_tensor_*``:

* the per-tensor form (:func:`sgd_update`, :func:`adagrad_update`, :func:`adam_update`) is
  pure: it returns new tensors and never modifies its arguments (unless ``own_state=True``
  lets it update the caller's optimizer state in place, as :class:`Optimizer` does with its
  own), so a backend may keep an old weights version alive for stale readers;
* the row-batched form (:func:`sgd_update_rows_`, :func:`adagrad_update_rows_`,
  :func:`adam_update_rows_`) steps ``A`` nodes' rows at once, in place (the stacked replay's
  pool of weights rows), with one learning rate or one per row; each row gets the per-tensor
  form's arithmetic (bit for bit with one shared rate and, for Adam, one shared step count;
  to float rounding with per-row rates).

:class:`Optimizer` dispatches to both (:meth:`Optimizer.step`, :meth:`Optimizer.step_rows_`);
no other module spells an update rule. Rules kept:

* :func:`sgd_update` is ``torch.optim.SGD`` with dampening 0: ``d = g + wd·x``;
  ``buf ← d + m·buf`` (``buf`` starts at 0, which equals torch's ``buf = d`` on the first
  step); the step is ``d + m·buf`` (Nesterov) or ``buf``; ``x ← x − lr·step``.
* :func:`adagrad_update` is ``torch.optim.Adagrad`` with ``lr_decay = 0``, initial
  accumulator 0, ``eps`` (default 1e-10): ``d = g + wd·x``; ``acc ← acc + d²``;
  ``x ← x − lr·d / (√acc + eps)``.
* :func:`adam_update` is ``torch.optim.Adam`` (``decoupled=False``: ``d = g + wd·x``) or
  ``torch.optim.AdamW`` (``decoupled=True``: ``x ← x·(1 − lr·wd)``, ``d = g``), amsgrad off,
  ``eps`` (default 1e-8): ``t ← t + 1``; ``m ← m + (1 − β1)(d − m)``;
  ``v ← β2·v + (1 − β2)·d²``; ``x ← x − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + eps)``.
* :func:`lr_at`: ``base · min(1, epoch / warmup_epochs) · Π factor`` over the milestones
  with ``epoch ≥ milestone`` (cumulative); ``base`` is α0, or a step's staleness-aware rate.
* The staleness policy scales the **learning rate of the step**, Rudra's
  ``α = α0/⟨σ⟩`` (``mean_staleness``) and ``α_i = α0/σ_i`` (``per_gradient``, α0 when
  σ_i = 0); ``constant`` is α0 (:func:`step_rates`). An apply combining gradients ``g_i``
  with weights ``w_i`` (the trace's coefficients) and per-gradient factors ``s_i = 1/d_i``
  (:func:`staleness_divisor`) steps with rate ``α0 · s̄``, ``s̄ = Σ w_i s_i / Σ w_i``, on the
  gradient ``g = Σ w_i (s_i / s̄) g_i``. When every ``d_i`` of the apply is the same ``d``
  (always for ``constant`` and ``mean_staleness``; ``per_gradient`` with one gradient) the
  gradient is ``Σ w_i g_i`` exactly and the rate ``α0 / d`` exactly, so ``mean_staleness``
  at α0 *is* ``constant`` at α0/⟨σ⟩ for every optimizer, bit for bit; with mixed ``d_i``
  plain SGD moves by exactly ``Σ w_i α_i g_i`` (each gradient at its own rate) and an
  adaptive optimizer's step is scaled by the mean rate (docs/replay.md, docs/design-notes.md).
"""

from __future__ import annotations

import math
from typing import Any
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

ADAGRAD_EPS = 1e-10
ADAM_EPS = 1e-8
ADAM_BETAS = (0.9, 0.999)
POLICIES = ("constant", "mean_staleness", "per_gradient")
OPTIMIZERS = ("sgd", "nesterov", "adagrad", "adam", "adamw")

AdamState = tuple[Tensor, Tensor, int]  # (first moment m, second moment v, steps taken t)


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


def adam_update(x: Tensor, g: Tensor, state: AdamState | None, lr: float,
                betas: tuple[float, float] = ADAM_BETAS, eps: float = ADAM_EPS, weight_decay: float = 0.0,
                decoupled: bool = False, *, own_state: bool = False) -> tuple[Tensor, AdamState]:
    """One Adam step (``decoupled=False``, torch.optim.Adam semantics) or AdamW step
    (``decoupled=True``, torch.optim.AdamW), amsgrad off, in the same operations as torch's
    single-tensor loop; return ``(new x, (m, v, t))``.

    ``state`` None means zero moments and no step taken; ``own_state``: ``m`` and ``v`` are
    updated in place.
    """
    b1, b2 = betas
    if state is None:
        m, v, t = torch.zeros_like(x), torch.zeros_like(x), 0
        own_state = True  # fresh tensors: nobody else holds them
    else:
        m, v, t = state
    t += 1
    if weight_decay != 0 and decoupled:
        base = torch.mul(x, 1 - lr * weight_decay)
        d = g
    else:
        base = None
        d = weight_decayed(g, x, weight_decay)
    if own_state:
        m.lerp_(d, 1 - b1)
        v.mul_(b2).addcmul_(d, d, value=1 - b2)
    else:
        m = torch.lerp(m, d, 1 - b1)
        v = torch.mul(v, b2).addcmul_(d, d, value=1 - b2)
    step_size = lr / (1 - b1 ** t)
    denom = (v.sqrt() / (1 - b2 ** t) ** 0.5).add_(eps)
    if base is None:
        return torch.addcdiv(x, m, denom, value=-step_size), (m, v, t)
    return base.addcdiv_(m, denom, value=-step_size), (m, v, t)


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


def adam_state_width(size: int) -> int:
    """Columns of one node's Adam state row: ``m`` (``size``), ``v`` (``size``), then ``t``."""
    return 2 * size + 1


def adam_update_rows_(x: Tensor, g: Tensor, state: Tensor, lr: float | Tensor,
                      betas: tuple[float, float] = ADAM_BETAS, eps: float = ADAM_EPS, weight_decay: float = 0.0,
                      decoupled: bool = False, w: float | np.ndarray | None = None,
                      out: Tensor | None = None) -> None:
    """:func:`adam_update` on rows (``x`` of shape (A, P), or one row (P,)), in place: ``x``
    (or ``out``) and the state rows are updated. A state row is ``[m (P), v (P), t]``
    (:func:`adam_state_width`; zeros before a row's first step: ``t`` counts a row's steps, in
    the state's dtype as torch keeps its own ``step``). ``lr`` and ``w`` as in
    :func:`sgd_update_rows_`; AdamW's decay ``x·(1 − lr·wd)`` acts on the PushSum numerator,
    which decays the de-biased weights ``x / w`` by the same factor."""
    b1, b2 = betas
    P = x.shape[-1]
    m, v, t_col = state[..., :P], state[..., P:2 * P], state[..., 2 * P]
    t_col.add_(1)
    d = g if decoupled else weight_decayed(g, x, weight_decay, w)
    y = x if out is None else out.copy_(x)
    if weight_decay != 0 and decoupled:
        if isinstance(lr, Tensor):
            y.mul_((1 - lr * weight_decay).unsqueeze(-1))
        else:
            y.mul_(1 - lr * weight_decay)
    m.lerp_(d, 1 - b1)
    v.mul_(b2).addcmul_(d, d, value=1 - b2)
    ts = t_col.tolist()
    if not isinstance(ts, list):
        ts = [ts]
    if not isinstance(lr, Tensor) and min(ts) == max(ts):  # one step count: the per-tensor arithmetic
        t = ts[0]
        denom = (v.sqrt() / (1 - b2 ** t) ** 0.5).add_(eps)
        y.addcdiv_(m, denom, value=-(lr / (1 - b1 ** t)))
        return
    tt = np.asarray(ts, dtype=np.float64)
    bc2_sqrt = torch.from_numpy((1 - b2 ** tt) ** 0.5).to(v)
    bc1 = torch.from_numpy(1 - b1 ** tt).to(v)
    rates = (lr.to(v) if isinstance(lr, Tensor) else torch.full_like(bc1, lr)) / bc1
    if x.dim() == 1:
        bc2_sqrt, rates = bc2_sqrt.reshape(()), rates.reshape(())
    denom = (v.sqrt() / bc2_sqrt.unsqueeze(-1)).add_(eps)
    y.addcmul_(rates.unsqueeze(-1), m / denom, value=-1.0)


def lr_at(epoch: float | np.ndarray, opt_cfg: dict[str, Any],
          base: float | np.ndarray | None = None) -> float | np.ndarray:
    """Learning rate at ``epoch`` (scalar or array): ``base`` (default α0, ``opt_cfg["lr"]``;
    a scalar or one rate per epoch), linear warm-up, cumulative milestones."""
    e = np.asarray(epoch, dtype=np.float64)
    if base is None:
        lr = np.full(e.shape, float(opt_cfg["lr"]))
    else:
        lr = np.array(np.broadcast_to(np.asarray(base, dtype=np.float64), e.shape))
    warm = float(opt_cfg.get("warmup_epochs", 0.0) or 0.0)
    if warm > 0:
        lr = lr * np.clip(e / warm, 0.0, 1.0)
    for milestone, factor in opt_cfg.get("milestones", []) or []:
        lr = np.where(e >= milestone, lr * factor, lr)
    return float(lr) if lr.ndim == 0 else lr


def mean_staleness(staleness: np.ndarray) -> float:
    """⟨σ⟩ over all apply inputs of a trace (0 when there are none)."""
    return float(np.mean(staleness)) if len(staleness) else 0.0


def staleness_divisor(policy: str, staleness: np.ndarray, mean_sigma: float) -> np.ndarray:
    """What ``policy`` divides α0 by for gradients of staleness ``staleness``: ``constant`` 1;
    ``mean_staleness`` ⟨σ⟩ (1 when ⟨σ⟩ < 1); ``per_gradient`` σ_i (1 when σ_i = 0)."""
    s = np.asarray(staleness, dtype=np.float64)
    if policy == "constant":
        return np.ones_like(s)
    if policy == "mean_staleness":
        return np.full_like(s, 1.0 if mean_sigma < 1 else float(mean_sigma))
    if policy == "per_gradient":
        return np.maximum(s, 1.0)
    raise ValueError(f"unknown lr_policy {policy!r} (expected one of {', '.join(POLICIES)})")


def staleness_scale(policy: str, staleness: np.ndarray, mean_sigma: float) -> np.ndarray:
    """Per-gradient learning-rate factor ``s_i = 1/d_i`` of ``policy`` (:func:`staleness_divisor`)."""
    return 1.0 / staleness_divisor(policy, staleness, mean_sigma)


def step_rates(policy: str, alpha0: float, weight: np.ndarray, staleness: np.ndarray,
               counts: np.ndarray | Sequence[int], mean_sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """``(coefs, base)``: the coefficient of every apply input and the staleness-aware base
    rate of every apply (the module doc's rule), for applies of ``counts`` inputs each, their
    inputs consecutive in ``weight`` / ``staleness``.

    An apply whose divisors are all ``d`` (or that has no inputs: ``d`` = the policy's
    divisor for every gradient, ⟨σ⟩ or 1) gets ``coefs = w`` and ``base = α0 / d``; one with
    mixed divisors ``base = α0·s̄`` and ``coefs = w_i·s_i/s̄`` (``s̄`` the ``w``-weighted mean of
    ``s_i = 1/d_i``; the plain mean when every weight is 0)."""
    counts = np.asarray(counts, dtype=np.int64)
    coefs = np.array(weight, dtype=np.float64)
    n_apply = len(counts)
    alpha0 = float(alpha0)
    if policy == "constant":
        return coefs, np.full(n_apply, alpha0)
    if policy == "mean_staleness":
        return coefs, np.full(n_apply, alpha0 / (1.0 if mean_sigma < 1 else float(mean_sigma)))
    d = staleness_divisor(policy, staleness, mean_sigma)
    owner = np.repeat(np.arange(n_apply), counts)
    starts = np.cumsum(counts) - counts
    has = counts > 0
    first = np.ones(n_apply)
    first[has] = d[starts[has]]
    mixed = np.bincount(owner, weights=(d != first[owner]).astype(np.float64), minlength=n_apply) > 0
    base = alpha0 / first
    if mixed.any():
        s = 1.0 / d
        sw = np.bincount(owner, weights=coefs, minlength=n_apply)
        sws = np.bincount(owner, weights=coefs * s, minlength=n_apply)
        plain = np.bincount(owner, weights=s, minlength=n_apply) / np.maximum(counts, 1)
        sbar = np.where(sw > 0, sws / np.where(sw > 0, sw, 1.0), plain)
        base[mixed] = alpha0 * sbar[mixed]
        rows = mixed[owner]
        coefs[rows] = coefs[rows] * (s[rows] / sbar[owner[rows]])
    return coefs, base


def _unit_interval_pair(value: Any) -> tuple[float, float] | None:
    """``value`` as two finite floats each in [0, 1), else None."""
    if not isinstance(value, (list, tuple)) or len(value) != 2:
        return None
    out = []
    for b in value:
        if isinstance(b, bool) or not isinstance(b, (int, float)) or not (0.0 <= float(b) < 1.0):
            return None
        out.append(float(b))
    return out[0], out[1]


class Optimizer:
    """Per-node optimizer state (momentum buffer, AdaGrad sum, Adam moments) and the
    scenario's rule.

    ``opt_cfg`` is the scenario's ``optimizer`` table; ``mean_sigma`` the trace's ⟨σ⟩.
    State of node ``n`` lives in ``self.state[n]`` (absent until its first step). A bad
    name, ``betas`` or ``eps`` raises ValueError naming the key and value.
    """

    def __init__(self, opt_cfg: dict[str, Any], mean_sigma: float = 0.0) -> None:
        self.cfg = dict(opt_cfg)
        self.name: str = opt_cfg["name"]
        if self.name not in OPTIMIZERS:
            raise ValueError(f"optimizer.name = {self.name!r}: expected one of {', '.join(OPTIMIZERS)}")
        self.policy: str = opt_cfg.get("lr_policy", "constant")
        if self.policy not in POLICIES:
            raise ValueError(f"optimizer.lr_policy = {self.policy!r}: expected one of {', '.join(POLICIES)}")
        self.adam = self.name in ("adam", "adamw")
        self.decoupled = self.name == "adamw"
        self.momentum = float(opt_cfg.get("momentum", 0.0)) if self.name in ("sgd", "nesterov") else 0.0
        self.weight_decay = float(opt_cfg.get("weight_decay", 0.0))
        self.nesterov = self.name == "nesterov"
        raw_betas = opt_cfg.get("betas", ADAM_BETAS)
        betas = _unit_interval_pair(ADAM_BETAS if raw_betas is None else raw_betas)
        if betas is None:
            raise ValueError(f"optimizer.betas = {raw_betas!r}: expected two numbers, each ≥ 0 and < 1")
        self.betas: tuple[float, float] = betas
        eps = opt_cfg.get("eps")
        if eps is None:
            eps = ADAM_EPS if self.adam else ADAGRAD_EPS
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"optimizer.eps = {eps!r}: expected a finite number > 0")
        self.eps = float(eps)
        self.mean_sigma = float(mean_sigma)
        self.state: dict[int, Any] = {}

    def lr(self, epoch: float | np.ndarray, base: float | np.ndarray | None = None) -> float | np.ndarray:
        """The scheduled learning rate at ``epoch`` from ``base`` (default α0; :func:`lr_at`)."""
        return lr_at(epoch, self.cfg, base)

    def rates(self, weight: np.ndarray, staleness: np.ndarray,
              counts: np.ndarray | Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """:func:`step_rates` under this optimizer's policy, α0 and ⟨σ⟩: ``(coefs, base)``."""
        return step_rates(self.policy, float(self.cfg["lr"]), weight, staleness, counts, self.mean_sigma)

    def apply_rate(self, epoch: float, weight: Sequence[float],
                   staleness: Sequence[int]) -> tuple[np.ndarray, float]:
        """One apply's input coefficients and learning rate (what a live server steps with;
        the same arithmetic as a replay's plan of the whole trace)."""
        coefs, base = self.rates(np.asarray(weight, dtype=np.float64), np.asarray(staleness),
                                 [len(weight)])
        return coefs, float(self.lr(epoch, base[0]))

    def step(self, node: int, x: Tensor, g: Tensor, lr: float, w: float = 1.0) -> Tensor:
        """Return node ``node``'s new ``x`` after a step on the combined gradient ``g``.

        Weight decay acts on the de-biased weights ``x / w`` (``x`` when ``w == 1``).
        """
        wd = self.weight_decay
        if wd and w != 1.0 and not self.decoupled:
            g = weight_decayed(g, x, wd, w)
            wd = 0.0
        if self.adam:
            new_x, self.state[node] = adam_update(x, g, self.state.get(node), lr, self.betas, self.eps, wd,
                                                  self.decoupled, own_state=True)
        elif self.name == "adagrad":
            new_x, self.state[node] = adagrad_update(x, g, self.state.get(node), lr, wd, self.eps,
                                                     own_state=True)
        else:
            new_x, self.state[node] = sgd_update(x, g, self.state.get(node), lr, self.momentum,
                                                 self.nesterov, wd, own_state=True)
        return new_x

    def copy_state(self, src: int, dst: int) -> None:
        """Node ``dst`` carries a copy of node ``src``'s state (none when ``src`` has none): the
        ranks of an all-reduce each step their own optimizer on the same mean gradient from the
        same weights, so their states are equal (``PostLocalSGDOptimizer``)."""
        st = self.state.get(src)
        if st is None:
            self.state.pop(dst, None)
        elif isinstance(st, tuple):
            self.state[dst] = tuple(s.clone() if isinstance(s, Tensor) else s for s in st)
        else:
            self.state[dst] = st.clone()

    @property
    def has_state(self) -> bool:
        """Whether a step keeps per-node state (a momentum buffer, AdaGrad's sums, Adam's moments)."""
        return self.adam or self.name == "adagrad" or self.momentum != 0

    def state_rows(self, nodes: int, like: Tensor) -> Tensor | None:
        """Zero state rows for :meth:`step_rows_`, one per node (``like``: a (·, P) tensor whose
        dtype and device they take); None when a step keeps no state."""
        if not self.has_state:
            return None
        size = like.shape[-1]
        width = adam_state_width(size) if self.adam else size
        return like.new_zeros((nodes, width))

    def step_rows_(self, x: Tensor, g: Tensor, state: Tensor | None, lr: float | Tensor,
                   w: float | np.ndarray | None = None, out: Tensor | None = None) -> None:
        """Step the rows ``x`` (several nodes' weights, or one node's as a 1-D row) on their
        combined gradients ``g``, in place or into ``out``; ``state``: the nodes' state rows
        (:meth:`state_rows`: zeros before their first step; None without state), updated in
        place. Each row gets :meth:`step`'s arithmetic; weight decay acts on ``x / w``."""
        if self.adam:
            assert state is not None
            adam_update_rows_(x, g, state, lr, self.betas, self.eps, self.weight_decay, self.decoupled, w, out)
        elif self.name == "adagrad":
            assert state is not None
            adagrad_update_rows_(x, g, state, lr, self.weight_decay, w, self.eps, out=out)
        else:
            sgd_update_rows_(x, g, state, lr, self.momentum, self.nesterov, self.weight_decay, w, out)


def pseudo_gradient(global_x: Tensor, local_xs: Sequence[Tensor]) -> Tensor:
    """DiLoCo's outer gradient ``Δ = θ_global − Σ_i (θ_i / n)`` (the nodes' mean divided first,
    then summed in node order, as torch's ``average_parameters``); ``local_xs`` may also be
    one (n, P) tensor of rows."""
    n = len(local_xs)
    mean = torch.div(local_xs[0], n)
    for x in local_xs[1:]:
        mean.add_(x / n)
    return torch.sub(global_x, mean)


class OuterOptimizer:
    """DiLoCo's outer step (Douillard et al. 2023): ``torch.optim.SGD(lr=outer_lr,
    momentum=outer_momentum, nesterov=outer_momentum > 0)`` on the pseudo-gradient
    (:func:`pseudo_gradient`), by :func:`sgd_update` (``buf ← Δ + μ·buf``;
    ``θ ← θ − lr·(Δ + μ·buf)``). With lr 1 and momentum 0 the new global weights are the
    nodes' mean (to one rounding: ``θ − (θ − mean)``). A bad rate or momentum raises
    ValueError naming ``protocol.outer_lr`` / ``protocol.outer_momentum``."""

    def __init__(self, outer_lr: float, outer_momentum: float = 0.0) -> None:
        if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)) \
                or not (math.isfinite(outer_lr) and outer_lr > 0):
            raise ValueError(f"protocol.outer_lr = {outer_lr!r}: expected a finite number > 0")
        if isinstance(outer_momentum, bool) or not isinstance(outer_momentum, (int, float)) \
                or not (0.0 <= float(outer_momentum) < 1.0):
            raise ValueError(f"protocol.outer_momentum = {outer_momentum!r}: expected a number ≥ 0 and < 1")
        self.lr = float(outer_lr)
        self.momentum = float(outer_momentum)
        self.buf: Tensor | None = None

    def step(self, global_x: Tensor, local_xs: Sequence[Tensor]) -> Tensor:
        """The new global weights after one outer step from ``global_x`` towards the nodes'
        weights ``local_xs`` (a new tensor; the momentum buffer is kept)."""
        return self.step_delta(global_x, pseudo_gradient(global_x, local_xs))

    def step_delta(self, global_x: Tensor, delta: Tensor) -> Tensor:
        """The new global weights after one outer step on the pseudo-gradient ``delta``."""
        new_x, self.buf = sgd_update(global_x, delta, self.buf, self.lr, self.momentum,
                                     self.momentum > 0, own_state=self.buf is not None)
        return new_x

    def step_rows_(self, global_x: Tensor, delta: Tensor, buf: Tensor | None) -> None:
        """:meth:`step_delta` on rows (several replays' global weights (R, P) with their
        pseudo-gradients and momentum rows ``buf``, zeros before the first step; None
        without momentum), in place, by :func:`sgd_update_rows_`."""
        sgd_update_rows_(global_x, delta, buf if self.momentum > 0 else None, self.lr, self.momentum,
                         self.momentum > 0)
