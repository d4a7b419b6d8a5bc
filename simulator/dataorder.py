"""The data order: which training samples each minibatch holds.

The sample *stream* is the concatenation of one seeded permutation of the training set
per epoch: position ``p`` is sample ``perm(epoch = p // N)[p % N]``. A grad op names its
minibatch by stream position and size, so a backend needs only this module to find the
samples, whatever protocol wrote the trace.

Positions come from one of two layouts:

* ``global_slice`` (hardsync, allreduce): learner ``i``'s ``k``-th minibatch is slice ``i``
  of global batch ``k``, so λ learners with μ reproduce one learner with λμ;
* ``shard`` (the others): each epoch's permutation is cut into λ equal shards and
  learner ``i`` walks its shard ``μ`` samples at a time.
"""

from __future__ import annotations

import numpy as np

from .seeds import DATA_ORDER


def permutation(seed: int, epoch: int, n: int) -> np.ndarray:
    """The seeded permutation of ``range(n)`` for ``epoch``."""
    return np.random.default_rng([int(seed), DATA_ORDER, int(epoch)]).permutation(n)


class GlobalSliceLayout:
    """``global_slice``: learner ``i``'s ``k``-th minibatch is slice ``i`` of global batch ``k``."""

    __slots__ = ("learners", "minibatch")

    def __init__(self, learners: int, minibatch: int) -> None:
        self.learners, self.minibatch = learners, minibatch

    def start(self, k: int, learner: int) -> int:
        """Stream position of learner ``learner``'s ``k``-th minibatch."""
        return slice_position(k, learner, self.learners, self.minibatch)


class ShardLayout:
    """``shard``: a shard has ``⌊n/λ⌋`` samples and holds ``max(1, ⌊shard/μ⌋)`` minibatches per
    epoch; after them the learner moves to its shard of the next epoch."""

    __slots__ = ("n", "minibatch", "shard", "per_epoch")

    def __init__(self, learners: int, minibatch: int, n: int) -> None:
        self.n, self.minibatch = n, minibatch
        self.shard = max(1, n // learners)
        self.per_epoch = max(1, self.shard // minibatch)

    def start(self, k: int, learner: int) -> int:
        """Stream position of learner ``learner``'s ``k``-th minibatch."""
        return shard_position(k, learner, self.minibatch, self.n, self.shard, self.per_epoch)


def slice_position(k: int, learner: int, learners: int, minibatch: int) -> int:
    """``global_slice``'s rule: the stream position of ``learner``'s ``k``-th minibatch (the
    fast engines compile this function: :func:`.fast_core.slice_start`)."""
    return (k * learners + learner) * minibatch


def shard_position(k: int, learner: int, minibatch: int, n: int, shard: int, per_epoch: int) -> int:
    """``shard``'s rule: the stream position of ``learner``'s ``k``-th minibatch, with shards of
    ``shard`` samples holding ``per_epoch`` minibatches each, epochs of ``n`` samples (the
    fast engines compile this function: :func:`.fast_core.shard_start`)."""
    epoch = k // per_epoch
    return epoch * n + learner * shard + (k - epoch * per_epoch) * minibatch


def global_slice_start(k: int, learner: int, learners: int, minibatch: int) -> int:
    """Stream position of learner ``learner``'s ``k``-th minibatch under ``global_slice``."""
    return GlobalSliceLayout(learners, minibatch).start(k, learner)


def shard_start(k: int, learner: int, learners: int, minibatch: int, n: int) -> int:
    """Stream position of learner ``learner``'s ``k``-th minibatch under ``shard``."""
    return ShardLayout(learners, minibatch, n).start(k, learner)


class SampleStream:
    """Maps stream positions to sample indices, caching the epochs' permutations."""

    def __init__(self, seed: int, n: int) -> None:
        self.seed, self.n = int(seed), int(n)
        self._cache: dict[int, np.ndarray] = {}

    def _perm(self, epoch: int) -> np.ndarray:
        perm = self._cache.get(epoch)
        if perm is None:
            if len(self._cache) > 4:
                self._cache.pop(min(self._cache))
            perm = self._cache[epoch] = permutation(self.seed, epoch, self.n)
        return perm

    def indices(self, start: int, size: int) -> np.ndarray:
        """Sample indices at stream positions ``start .. start + size - 1``."""
        out = np.empty(size, dtype=np.int64)
        pos, filled = int(start), 0
        while filled < size:
            epoch, off = divmod(pos, self.n)
            take = min(size - filled, self.n - off)
            out[filled:filled + take] = self._perm(epoch)[off:off + take]
            filled += take
            pos += take
        return out
