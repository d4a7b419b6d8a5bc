"""Batched gradients of a Linear/ReLU stack written out by hand (``baddbmm`` / ``bmm``).

The rule kept: for a model ``Sequential([Flatten,] Linear, ReLU, Linear, …, Linear)`` and
mean cross-entropy, :func:`grad_batch` returns the same per-row gradients and losses as
``vmap`` over ``functional_call`` (:meth:`.flatmodel.FlatModel.grad_batch`), up to float
rounding, with a handful of batched matrix products instead of vmap's traced graph. On the
digits MLP (λ = 30, μ = 4) that is the difference between 0.5× and ≈ 0.9× of a hand-written
batched replay (benchmarks/replay.py). Any other model returns None from :func:`mlp_layers`
and keeps the vmap path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass(frozen=True)
class Linear:
    """One ``nn.Linear`` in the flat vector: weight (out, in) at ``w``, bias at ``b`` (−1:
    none), and whether a ReLU follows it."""

    w: int
    b: int
    out: int
    inp: int
    relu: bool


def mlp_layers(model: nn.Module) -> tuple[bool, list[Linear]] | None:
    """(starts with Flatten, the layers) when ``model`` is a plain Linear/ReLU stack whose
    parameters are exactly its Linear layers', none shared (a tied weight's gradient is a sum
    the kernels do not form); else None."""
    if type(model) is not nn.Sequential:
        return None
    mods = list(model)
    first = mods[0] if mods else None
    flatten = type(first) is nn.Flatten
    if flatten and isinstance(first, nn.Flatten) and (first.start_dim, first.end_dim) != (1, -1):
        return None
    mods = mods[1:] if flatten else mods
    offsets, o = {}, 0
    for p in model.parameters():
        offsets[id(p)] = o
        o += p.numel()
    layers: list[Linear] = []
    for m in mods:
        if type(m) is nn.ReLU:
            if not layers or layers[-1].relu:
                return None
            layers[-1] = Linear(layers[-1].w, layers[-1].b, layers[-1].out, layers[-1].inp, True)
        elif type(m) is nn.Linear:
            b = offsets[id(m.bias)] if m.bias is not None else -1
            layers.append(Linear(offsets[id(m.weight)], b, m.out_features, m.in_features, False))
        else:
            return None
    if not layers or layers[-1].relu:
        return None
    owned = [id(p) for m in mods if type(m) is nn.Linear for p in m.parameters()]
    if len(owned) != len(set(owned)) or set(owned) != set(offsets):
        return None
    return flatten, layers


def grad_batch(layers: list[Linear], stacked: Tensor, xb: Tensor, yb: Tensor, scale: Tensor | None,
               out: Tensor, weights: Tensor | None = None) -> Tensor:
    """Write row b's gradient of ``scale[b]`` × the mean cross-entropy of (xb[b], yb[b]) at
    weights ``stacked[b]`` into ``out[b]``; return the (unscaled) losses (B,).

    ``xb``: (B, μ, …) inputs, flattened per sample; ``yb``: (B, μ) labels. With ``weights``
    (B, μ) (and no ``scale``), row b is instead the gradient of ``Σ_s weights[b, s] · ℓ_bs``
    and the per-sample losses ℓ (B, μ) are returned. Rows are computed independently: a row's
    result does not depend on the other rows of the call.
    """
    b, mu = yb.shape
    a = xb.reshape(b, mu, -1)
    acts, pres = [a], []
    for lay in layers:
        w = stacked[:, lay.w:lay.w + lay.out * lay.inp].view(b, lay.out, lay.inp)
        if lay.b >= 0:
            pre = torch.baddbmm(stacked[:, lay.b:lay.b + lay.out].unsqueeze(1), a, w.transpose(1, 2))
        else:
            pre = torch.bmm(a, w.transpose(1, 2))
        pres.append(pre)
        a = pre.clamp(min=0) if lay.relu else pre
        acts.append(a)
    logp = a.log_softmax(-1)
    target = yb.unsqueeze(-1)
    per_sample = logp.gather(-1, target).squeeze(-1).neg_()
    losses = per_sample if weights is not None else per_sample.mean(1)
    d = logp.exp_().scatter_add_(-1, target, torch.full_like(target, -1, dtype=logp.dtype))
    if weights is not None:
        d.mul_(weights.unsqueeze(-1))
    else:
        d.div_(mu)
        if scale is not None:
            d.mul_(scale.view(b, 1, 1))
    for i in range(len(layers) - 1, -1, -1):
        lay = layers[i]
        gw = out[:, lay.w:lay.w + lay.out * lay.inp].view(b, lay.out, lay.inp)
        torch.bmm(d.transpose(1, 2), acts[i], out=gw)
        if lay.b >= 0:
            torch.sum(d, 1, out=out[:, lay.b:lay.b + lay.out])
        if i:
            w = stacked[:, lay.w:lay.w + lay.out * lay.inp].view(b, lay.out, lay.inp)
            d = torch.bmm(d, w)
            if layers[i - 1].relu:
                d.mul_(pres[i - 1] > 0)
    return losses
