"""A model whose parameters are views into one flat vector: how a backend computes gradients.

Rules kept: ``grad`` is the mean cross-entropy gradient of one minibatch at given flat
weights (plain autograd, or with ``row_kernel`` for a plain Linear/ReLU stack the
hand-written kernels of :mod:`.mlp_batched` on one row, reading the weights where they lie);
``grad_batch`` computes several at once over stacked weights (``functional_call`` + ``vmap``,
or the hand-written kernels), each row equal to ``grad``'s up to float rounding;
``grad_weighted`` is the gradient of a weighted sum of per-sample losses at one weights
vector (one apply's gradients on one version, fused); a scale multiplies the finished
gradient (so the plain-autograd replay is bit-identical to a live server's ``gradient × scale``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call, vmap

from .autograd_engine import backward, gradients
from .mlp_batched import grad_batch as mlp_grad_batch
from .mlp_batched import mlp_layers

EVAL_CHUNK = 2048  # test samples per forward pass of an evaluation


class FlatModel:
    """A model whose parameters are views into one flat vector ``work``.

    ``grad`` computes one minibatch gradient with plain autograd; ``grad_batch`` computes
    several at once with ``functional_call`` + ``vmap`` over stacked flat weights.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model.train()
        named = list(model.named_parameters())
        self.names = [k for k, _ in named]
        self.params = [p for _, p in named]
        self.shapes = [p.shape for p in self.params]
        self.sizes = [p.numel() for p in self.params]
        self.size = sum(self.sizes)
        self.work = torch.cat([p.detach().reshape(-1) for p in self.params]).clone()
        self.grad_buf = torch.zeros_like(self.work)
        o = 0
        for p, k in zip(self.params, self.sizes):
            p.data = self.work[o:o + k].view_as(p)
            p.grad = self.grad_buf[o:o + k].view_as(p)  # backward() accumulates here, in place
            o += k
        # frozen parameters (requires_grad False): no gradient, as plain autograd leaves them
        offsets = [sum(self.sizes[:n]) for n in range(len(self.sizes))]
        self._frozen = [(o, k) for o, k, q in zip(offsets, self.sizes, self.params) if not q.requires_grad]
        self.batchable = not any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())
        self._vforward = vmap(lambda ps, xb: functional_call(self.model, ps, (xb,)))
        self._mlp = mlp_layers(model)  # (starts with Flatten, layers) or None: the vmap path
        self._loaded: Tensor | None = None
        self._seed = torch.ones((), device=self.work.device)
        self.row_kernel = False  # grad() of a Linear/ReLU stack by the hand-written kernels

    @property
    def kernel(self) -> str:
        """How batched gradients are computed: "mlp" (the hand-written kernels) or "vmap"."""
        return "mlp" if self._mlp is not None else "vmap"

    def load(self, z: Tensor) -> None:
        """Make the model's parameters equal ``z``."""
        if z is not self._loaded:
            self.work.copy_(z)  # work is no autograd leaf: the parameters are views of it
            self._loaded = z

    def grad(self, z: Tensor, xb: Tensor, yb: Tensor, scale: float = 1.0,
             in_place: bool = False) -> tuple[Tensor, Tensor]:
        """``scale`` × the flat gradient of the mean cross-entropy of (xb, yb) at ``z``, and
        that loss. The gradient is a new tensor, or with ``in_place`` the model's gradient
        buffer itself (valid until the next call). The scale multiplies the finished
        gradient (not the backward seed), so the result is bit-identical to a live server's
        ``gradient × scale``."""
        if self.row_kernel and self._mlp is not None and self.takes_rows(xb.dim() + 1):
            out = self.grad_buf.view(1, -1) if in_place else torch.empty_like(self.grad_buf).view(1, -1)
            with torch.no_grad():
                losses = mlp_grad_batch(self._mlp[1], z.reshape(1, -1), xb.unsqueeze(0), yb.unsqueeze(0), None, out)
            g = self._unfrozen(out).view(-1)
            return (g if scale == 1.0 else g.mul_(scale)), losses[0]
        self.load(z)
        buf = self.grad_buf
        buf.zero_()
        loss = F.cross_entropy(self.model(xb), yb)
        backward(loss, self._seed)
        if in_place:
            return (buf if scale == 1.0 else buf.mul_(scale)), loss
        return (buf.clone() if scale == 1.0 else buf * scale), loss

    def grad_weighted(self, z: Tensor, xb: Tensor, yb: Tensor, weights: Tensor,
                      in_place: bool = False) -> tuple[Tensor, Tensor]:
        """The flat gradient of ``Σ_s weights[s] · ℓ_s`` at ``z`` (ℓ_s the cross-entropy of
        sample s of (xb, yb)), by one forward and backward over all the samples (the
        hand-written kernels on one row for a Linear/ReLU stack, :meth:`grad_weighted_batch`;
        else plain autograd), and the per-sample losses (N,). The gradient is a new tensor, or
        with ``in_place`` the model's gradient buffer (valid until the next call)."""
        if self.takes_rows(xb.dim() + 1):
            out = self.grad_buf.view(1, -1) if in_place else torch.empty_like(self.grad_buf).view(1, -1)
            g, losses = self.grad_weighted_batch(z.reshape(1, -1), xb.unsqueeze(0), yb.unsqueeze(0),
                                                 weights.unsqueeze(0), out)
            return g.view(-1), losses[0]
        self.load(z)
        buf = self.grad_buf
        buf.zero_()
        losses = F.cross_entropy(self.model(xb), yb, reduction="none")
        backward(losses @ weights, self._seed)
        return (buf if in_place else buf.clone()), losses.detach()

    def grad_batch(self, zs: list[Tensor] | Tensor, xb: Tensor, yb: Tensor,
                   scale: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Gradients (B, P), row b scaled by ``scale[b]`` (default 1), and losses (B,) of
        minibatch b at ``zs[b]`` (one vmap call). ``zs`` of length 1: all read the same weights;
        a (B, P) tensor: the weights already stacked (it is used as is, not copied).
        """
        b = xb.shape[0]
        if self._mlp is not None and self.takes_rows(xb.dim()):
            if isinstance(zs, Tensor):
                stacked = zs
            else:
                stacked = zs[0].expand(b, self.size) if len(zs) == 1 else torch.stack(zs)
            out = torch.empty(b, self.size, dtype=stacked.dtype, device=stacked.device)
            with torch.no_grad():
                losses = mlp_grad_batch(self._mlp[1], stacked, xb, yb, scale, out)
            return self._unfrozen(out), losses
        if isinstance(zs, Tensor):
            stacked = zs.detach().requires_grad_()
        elif len(zs) == 1:
            stacked = zs[0].detach().requires_grad_().expand(b, self.size)
        else:
            stacked = torch.stack(zs).requires_grad_()
        views, o = {}, 0
        for name, shape, k in zip(self.names, self.shapes, self.sizes):
            views[name] = stacked[:, o:o + k].view(b, *shape)
            o += k
        logits = self._vforward(views, xb)
        losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1),
                                 reduction="none").view(b, -1).mean(1)
        total = losses.sum() if scale is None else losses @ scale
        inputs = tuple(views.values())
        gs = gradients(total, inputs, self._seed)
        out = torch.empty(b, self.size, dtype=stacked.dtype, device=stacked.device)
        o = 0
        for g, k in zip(gs, self.sizes):  # one strided copy each (no contiguous() + cat)
            if g is None:  # a parameter the loss does not reach
                out[:, o:o + k].zero_()
            else:
                out[:, o:o + k].view(g.shape).copy_(g)
            o += k
        return self._unfrozen(out), losses.detach()

    def takes_rows(self, dims: int) -> bool:
        """Whether batched inputs of ``dims`` dimensions (B, μ, …) go through the hand-written
        kernels (a Linear/ReLU stack: a leading Flatten, or samples of one dimension)."""
        return self._mlp is not None and (self._mlp[0] or dims == 3)

    def grad_weighted_batch(self, stacked: Tensor, xb: Tensor, yb: Tensor, weights: Tensor,
                            out: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Row b: the gradient of ``Σ_s weights[b, s] · ℓ_bs`` at ``stacked[b]`` over the samples
        (xb[b], yb[b]), written into ``out`` (default a new (B, P) tensor), and the per-sample
        losses (B, N). Hand-written kernels only (:meth:`takes_rows`); a row does not depend on
        the other rows of the call."""
        assert self._mlp is not None
        if out is None:
            out = torch.empty(stacked.shape[0], self.size, dtype=stacked.dtype, device=stacked.device)
        with torch.no_grad():
            losses = mlp_grad_batch(self._mlp[1], stacked, xb, yb, None, out, weights)
        return self._unfrozen(out), losses

    def _unfrozen(self, out: Tensor) -> Tensor:
        """``out`` with the frozen parameters' columns zero."""
        for o, k in self._frozen:
            out[:, o:o + k].zero_()
        return out

    @torch.no_grad()
    def test_error(self, z: Tensor, x: Tensor, y: Tensor) -> float:
        """Fraction of (x, y) misclassified at weights ``z`` (model in eval mode)."""
        self.load(z)
        self.model.eval()
        try:
            wrong = sum(int((self.model(x[i:i + EVAL_CHUNK]).argmax(1) != y[i:i + EVAL_CHUNK]).sum())
                        for i in range(0, len(y), EVAL_CHUNK))
        finally:
            self.model.train()
        return wrong / max(1, len(y))
