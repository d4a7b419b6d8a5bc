"""Local SGD, DiLoCo and compressed all-reduce: their trace encoding and shared rules, without time.

``N`` nodes run ``K`` iterations (:func:`.gossip.iterations`) on the ``global_slice`` data
layout (node ``i``'s ``k``-th minibatch is slice ``i`` of global batch ``k``, as AllReduce-SGD).
What a run writes (docs/trace.md, schema 2):

* an **all-reduce step** (local SGD's ``warmup_steps``, every step of a compressed
  ``allreduce``): AllReduce-SGD's round (the ``N`` grads, one apply on node 0 of all of them
  at weight ``1/N``, a copy mix on every other node); under compression the apply's inputs
  are combined by the compressed all-reduce (the header's ``averaging``);
* a **local step**: the ``N`` grads, each node's own state, then one apply per node of its
  own gradient (σ = 0); every apply of step ``k`` carries the progress after the whole step
  (``(k+1)·N·μ`` samples), as AllReduce-SGD's apply does;
* an **averaging** after every ``H`` local steps (and after the last step): for local SGD
  without compression, ``N − 1`` mixes into node 0 keeping a running mean
  (``x_0 ← j/(j+1)·x_0 + 1/(j+1)·x_j``, j = 1 … N−1), then a copy mix on every other node;
  otherwise (DiLoCo, or compression) one **outer op** on node 0 (the outer step on the mean
  of the nodes' pseudo-gradients against the anchor, ``coef`` = outer lr, ``self_coef`` =
  outer momentum; local SGD is outer SGD with lr 1 and momentum 0), then the copies. With
  ``F > 1`` fragments (streaming DiLoCo) one fragment is averaged every ``H/F`` steps, in
  turn; its outer op and copies (fragment mixes) touch only that fragment's tensors. With
  overlap τ > 0 (:meth:`LocalRecorder.prepare` / :meth:`LocalRecorder.sync`) the outer op is
  written when the averaging starts (it reads every node's state then) into a version of node 0
  that only holds the result, a fragment mix restores node 0's own fragment from the version
  before, and τ steps later a fragment mix on every node (node 0 too) copies the result in;
* evals of the nodes' average only right after an averaging (or an all-reduce step) at which
  the cadence says one is due, so that every eval measures a model the nodes agree on; and
  at the start and the end.

:func:`fragment_tensors` is the one definition of which tensor belongs to which fragment
(the replay reads it from the header's ``averaging.tensors``).
"""

from __future__ import annotations

from typing import Any
from collections.abc import Sequence

from typing import NamedTuple

from ..dataorder import global_slice_start
from ..trace import EVAL, TraceBuilder
from .gossip import AVERAGE, GossipRecorder, iterations


def fragment_tensors(sizes: Sequence[int], fragments: int) -> list[int]:
    """The fragment of each tensor (in parameter order) when ``fragments`` F contiguous fragments
    share the elements: tensor k goes to ``⌊F · (elements before k + half of k) / total⌋``,
    clipped so that every fragment holds at least one tensor (F ≤ the tensors)."""
    n = len(sizes)
    if not 1 <= fragments <= n:
        raise ValueError(f"protocol.fragments = {fragments}: expected 1 .. {n} (the model's tensors)")
    total = float(sum(sizes)) or 1.0
    out: list[int] = []
    before = 0.0
    for k, s in enumerate(sizes):
        f = min(fragments - 1, int(fragments * (before + s / 2) / total))
        low = out[-1] if out else 0                       # contiguous, ascending
        f = max(f, low, fragments - (n - k))               # room for the fragments still to come
        f = min(f, low + 1 if out else 0)                  # no fragment skipped
        out.append(f)
        before += s
    return out


class Rounds(NamedTuple):
    """What synchronises a run (:func:`rounds`)."""

    allreduce_steps: int  # steps whose gradients are all-reduced (in buckets)
    averagings: int       # averagings of the model or of one fragment (one collective each)


def max_overlap(local_steps: int, fragments: int) -> int:
    """The largest streaming-DiLoCo τ: a fragment's averaging ends before the next fragment's
    starts, so it overlaps at most H/F − 1 inner steps (H/F at least 1)."""
    return max(1, local_steps // fragments) - 1


def rounds(point: dict[str, Any]) -> Rounds:
    """The all-reduce steps and averagings a local-SGD, DiLoCo or compressed-all-reduce run of
    ``point`` makes, from its numbers alone: of its K iterations (:func:`.gossip.iterations`),
    the all-reduce steps (every step of ``allreduce``; local SGD's ``warmup_steps``, at most K),
    then L local steps with an averaging of one fragment (the whole model when F = 1) after every
    ⌊H/F⌋ of them but the last, and of all F fragments after the last: ⌊(L − 1)/⌊H/F⌋⌋ + F when
    L > 0 (F = 1: ⌈L/H⌉). Overlap (τ) moves averagings in time, not their count."""
    proto = point["protocol"]
    K = iterations(point)
    name = proto["name"]
    warmup = K if name == "allreduce" else (min(int(proto["warmup_steps"]), K) if name == "local_sgd" else 0)
    local = K - warmup
    if local <= 0:
        return Rounds(warmup, 0)
    F = int(proto["fragments"])
    every = max(1, int(proto["local_steps"]) // F)
    return Rounds(warmup, (local - 1) // every + F)


def messages(point: dict[str, Any], buckets: int) -> int:
    """Messages a run of ``point`` simulates, as a pre-run size estimate counts them: every node
    sends each of ``buckets`` buckets per all-reduce step and one message per averaging
    (:func:`rounds`; AllReduce-SGD's count is every step's buckets, which over-counts local steps)."""
    r = rounds(point)
    return int(point["cluster"]["learners"]) * (r.allreduce_steps * buckets + r.averagings)


def averaging_header(point: dict[str, Any], tensors: list[int] | None) -> dict[str, Any]:
    """The trace header's ``averaging`` field: compression, its parameters, H, F and the fragment
    of each tensor (None: not needed, no fragments and no PowerSGD)."""
    proto = point["protocol"]
    out: dict[str, Any] = {"compression": proto["compression"], "local_steps": proto["local_steps"],
                           "fragments": proto["fragments"]}
    if proto["compression"] == "powersgd":
        out["powersgd_rank"] = proto["powersgd_rank"]
        out["powersgd_warmup"] = proto["powersgd_warmup"]
    if tensors is not None:
        out["tensors"] = tensors
    return out


class LocalRecorder(GossipRecorder):
    """Writes a local-SGD / DiLoCo / compressed-all-reduce run's ops (module doc) into ``tb``."""

    def __init__(self, point: dict[str, Any], tb: TraceBuilder | None = None) -> None:
        super().__init__(point, tb)
        proto = point["protocol"]
        self.outer_ops = proto["name"] == "diloco" or proto["compression"] != "none"
        self.lr = 1.0 if proto["name"] != "diloco" else float(proto["outer_lr"])
        self.momentum = 0.0 if proto["name"] != "diloco" else float(proto["outer_momentum"])
        self.fragments = proto["fragments"]
        self.anchor = [0] * self.fragments  # node 0's version right after each fragment's last outer op
        self.pending = False                # an eval is due at the next averaging

    def allreduce_step(self, k: int, starts: Sequence[float], ends: Sequence[float], t: float) -> None:
        """An all-reduce step ``k`` (AllReduce-SGD's round; its eval cadence as there)."""
        self.allreduce_round(k, starts, ends, t)
        for f in range(self.fragments):
            self.anchor[f] = self.version[0]

    def local_step(self, k: int, starts: Sequence[float], ends: Sequence[float], applied: Sequence[float]) -> None:
        """Local step ``k``: node ``i`` computed from ``starts[i]`` to ``ends[i]`` on its latest
        state and applied its gradient at ``applied[i]``."""
        n, mu, tb = self.n, self.mu, self.tb
        epoch = self.samples / self.spe
        gops = [tb.grad(i, i, self.version[i], global_slice_start(k, i, n, mu), mu, k, starts[i], ends[i], epoch)
                for i in range(n)]
        self.grads += n
        self.samples += n * mu
        self.applies += n
        epoch = self.samples / self.spe
        for i in range(n):
            tb.apply(i, self.version[i], [gops[i]], [1.0], [0], applied[i], epoch)
            self.version[i] += 1
        if self.cadence.due(self.samples):
            self.pending = True

    def prepare(self, t_start: float, t_end: float, fragment: int) -> int:
        """An overlapped averaging of ``fragment`` (streaming DiLoCo's τ > 0) starts at ``t_start``
        from every node's latest state and delivers at ``t_end``: the outer op on node 0 computes
        the new fragment into a version of node 0 (returned: it holds the result), then a fragment
        mix restores node 0's own fragment from the version before, and node 0 computes on."""
        tb, v = self.tb, self.version
        epoch = self.samples / self.spe
        f = max(fragment, 0)
        tb.outer(0, v[0], self.anchor[f], self.lr, self.momentum, fragment, t_start, t_end, epoch)
        v[0] += 1
        holder = v[0]
        self.anchor[f] = holder
        tb.fragment_mix(0, v[0], 0, holder - 1, fragment, t_start, t_start, epoch)
        v[0] += 1
        return holder

    def sync(self, fragment: int, holder: int, applied: Sequence[float]) -> None:
        """The overlapped averaging of ``fragment`` lands: node ``i`` takes the fragment from node
        0's version ``holder`` at ``applied[i]`` (its local progress on it is dropped: the
        mixing factor α = 0 of torchft's streaming DiLoCo); an eval follows when one is due."""
        tb, v = self.tb, self.version
        epoch = self.samples / self.spe
        for i in range(self.n):
            tb.fragment_mix(i, v[i], 0, holder, fragment, applied[i], applied[i], epoch)
            v[i] += 1
        if self.pending:
            self.pending = False
            if tb.last_kind != EVAL:
                tb.eval(AVERAGE, AVERAGE, max(applied), epoch)

    def average(self, t_start: float, t_end: float, fragment: int = -1) -> None:
        """The nodes average (all of the model, or ``fragment``) from ``t_start`` to ``t_end``."""
        n, tb, v = self.n, self.tb, self.version
        epoch = self.samples / self.spe
        if not self.outer_ops:
            for j in range(1, n):
                tb.mix(0, v[0], j, v[j], 1.0 / (j + 1), j / (j + 1), t_start, t_end, epoch)
                v[0] += 1
        else:
            f = max(fragment, 0)
            tb.outer(0, v[0], self.anchor[f], self.lr, self.momentum, fragment, t_start, t_end, epoch)
            v[0] += 1
            self.anchor[f] = v[0]
        for i in range(1, n):
            if fragment < 0:
                tb.mix(i, v[i], 0, v[0], 1.0, 0.0, t_end, t_end, epoch)
            else:
                tb.fragment_mix(i, v[i], 0, v[0], fragment, t_end, t_end, epoch)
            v[i] += 1
        if self.pending:
            self.pending = False
            if tb.last_kind != EVAL:
                tb.eval(AVERAGE, AVERAGE, t_end, epoch)
