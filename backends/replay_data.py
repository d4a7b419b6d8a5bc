"""What both replay strategies read and record besides weights: minibatches and losses.

* :class:`Minibatches` — the samples of a grad op: ``SampleStream(data_seed,
  samples_per_epoch).indices(sample_start, batch_size)`` (positions past the data set's
  size wrap around), as one gather for many minibatches or, for one, a slice of the epoch's
  order kept on the device.
* :class:`LossLog` — each minibatch's loss counts towards the ``train_loss`` of the next
  eval; a non-finite loss means the run diverged (:class:`Diverged`). On an accelerator the
  losses stay on the device and are read in groups (no synchronisation per gradient).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from ..simulator.dataorder import permutation
from .workloads import Data

PENDING_LOSSES = 256             # losses kept on an accelerator before they are read
EPOCH_COPY_MAX_BYTES = 64 << 20  # smaller training sets are also kept in each epoch's order


class Diverged(Exception):
    """A non-finite loss or state: the replay stops (and reports where)."""


class Minibatches:
    """The training samples of grad ops, for a trace of data seed ``seed`` and ``spe``
    samples per epoch over ``data``."""

    def __init__(self, data: Data, seed: int, spe: int) -> None:
        self.data, self.seed, self.spe = data, seed, spe
        self.n_train = len(data.train_y)
        self.device = data.train_x.device
        self._perms: dict[int, np.ndarray] = {}
        self._epochs: dict[int, tuple[Tensor, Tensor]] = {}
        self._copy_epochs = data.train_x.element_size() * data.train_x.numel() <= EPOCH_COPY_MAX_BYTES

    def _perm(self, epoch: int) -> np.ndarray:
        p = self._perms.get(epoch)
        if p is None:
            if len(self._perms) >= 8:
                self._perms.pop(min(self._perms))
            p = self._perms[epoch] = permutation(self.seed, epoch, self.spe)
        return p

    def indices(self, starts: np.ndarray, size: int) -> np.ndarray:
        """Rows (len(starts), size) of the minibatches at stream positions ``starts``
        (= ``SampleStream.indices``; positions past the data set's size wrap around)."""
        pos = starts[:, None] + np.arange(size)
        ep, off = np.divmod(pos, self.spe)
        lo, hi = int(ep.min()), int(ep.max())
        if lo == hi:
            idx = self._perm(lo)[off]
        else:  # only the epochs the minibatches touch (they may lie far apart in the stream)
            idx = np.empty_like(pos)
            for e in np.unique(ep).tolist():
                m = ep == e
                idx[m] = self._perm(e)[off[m]]
        return idx % self.n_train if self.spe > self.n_train else idx

    def many(self, starts: np.ndarray, size: int) -> tuple[Tensor, Tensor]:
        """Inputs (B, size, …) and labels (B, size) of the minibatches at ``starts``: one
        gather. (Slicing the cached epoch order instead was measured: no gain on 8-node SGP,
        5 % slower on the ASGD benchmark.)"""
        idx = torch.from_numpy(self.indices(starts, size)).to(self.device)
        return self.data.train_x[idx], self.data.train_y[idx]

    def one(self, start: int, size: int) -> tuple[Tensor, Tensor]:
        """Inputs and labels of the minibatch at ``start``: a slice of the epoch's order when
        it lies in one epoch (and the data set is small), else a gather."""
        e, off = divmod(start, self.spe)
        if off + size <= self.spe and self._copy_epochs:
            xs, ys = self._epochs.get(e) or self._epoch(e)
            return xs[off:off + size], ys[off:off + size]
        idx = torch.from_numpy(self.indices(np.array([start]), size)[0]).to(self.device)
        return self.data.train_x.index_select(0, idx), self.data.train_y.index_select(0, idx)

    def _epoch(self, epoch: int) -> tuple[Tensor, Tensor]:
        """The training set in the order of ``epoch``'s permutation (a few epochs cached), so
        that a minibatch of consecutive stream positions is a slice, not a gather."""
        d = self._epochs.get(epoch)
        if d is None:
            if len(self._epochs) >= 3:
                self._epochs.pop(min(self._epochs))
            p = self._perm(epoch)
            idx = torch.from_numpy(p % self.n_train if self.spe > self.n_train else p).to(self.device)
            d = self._epochs[epoch] = (self.data.train_x.index_select(0, idx),
                                       self.data.train_y.index_select(0, idx))
        return d


class LossLog:
    """Sums of minibatch losses per eval interval (interval j: the losses before eval j).

    ``updates_at_divergence`` is set when a non-finite loss is found: the updates counted
    when that loss was computed, not when it was noticed.
    """

    def __init__(self, evals: int, device: torch.device) -> None:
        self.lazy = device.type != "cpu"
        self._pending: list[tuple[list[int], Tensor, int]] = []
        self.sum = [0.0] * (evals + 1)
        self.count = [0] * (evals + 1)
        self.updates_at_divergence: int | None = None

    def add_one(self, j: int, loss: Tensor, updates: int) -> None:
        """Record one minibatch's loss (a scalar tensor) for interval ``j``."""
        if self.lazy:
            self._keep([j], loss, updates)
            return
        v = loss.item()
        if not math.isfinite(v):
            self.updates_at_divergence = updates
            raise Diverged
        self.sum[j] += v
        self.count[j] += 1

    def add_many(self, intervals: list[int], losses: Tensor, updates: int) -> None:
        """Record the losses (B,) of one batched call, loss b for interval ``intervals[b]``."""
        if self.lazy:
            self._keep(intervals, losses, updates)
        else:
            self.add(intervals, losses.tolist(), updates)

    def _keep(self, intervals: list[int], losses: Tensor, updates: int) -> None:
        self._pending.append((intervals, losses.detach(), updates))
        if len(self._pending) >= PENDING_LOSSES:
            self.flush()

    def add(self, intervals: list[int], losses: list[float], updates: int) -> None:
        """Count losses towards their evals' train_loss; a non-finite one diverges."""
        if not all(math.isfinite(v) for v in losses):
            self.updates_at_divergence = updates
            raise Diverged
        for j, v in zip(intervals, losses):
            self.sum[j] += v
            self.count[j] += 1

    def flush(self) -> None:
        """Read the losses kept on the device (one synchronisation for many gradients)."""
        pending, self._pending = self._pending, []
        if pending:
            values = torch.cat([t.reshape(-1) for _, t, _ in pending]).tolist()
            at = 0
            for intervals, _, updates in pending:
                self.add(intervals, values[at:at + len(intervals)], updates)
                at += len(intervals)

    def mean(self, j: int) -> float:
        """Mean loss of interval ``j`` (NaN when it had none)."""
        n = self.count[j]
        return self.sum[j] / n if n else math.nan
