"""The parameter-server rules, without time: who computes what, what is applied, who goes next.

DESIGN.md's semantics: a learner pulls the weights (version ``j``), computes a gradient on
its next minibatch, pushes it and blocks until the server has *processed* it (applied it, or
added it to the pending accumulation); then it pulls again. The server applies the average
of every ``c`` processed gradients (:meth:`.catalog.ProtocolSpec.gradients_per_update`),
the last partial group at the end; σ = v − j. Who may pull next:

* with a barrier (hardsync) every learner of the round, in index order, once the round is
  applied;
* with SSP's bound ``s`` every waiting learner whose processed gradients exceed the slowest
  learner's by at most ``s`` (in index order);
* otherwise the learner whose gradient was processed.

:class:`PSCore` keeps these rules and writes the trace; the SimPy engine
(:mod:`ddlsim.simulator.ps`) supplies time and the live server (:mod:`ddlsim.backends.live_ps`)
is a receive loop around the same object. Both call, per gradient: :meth:`PSCore.assign`
when a learner may start, :meth:`PSCore.gradient` when it has computed, :meth:`PSCore.push`
when the server has processed it; and :meth:`PSCore.finish` at the end.
"""

from __future__ import annotations

import heapq
import math
from typing import Any, Iterable

from ..dataorder import global_slice_start, shard_start
from ..trace import EVAL, TraceBuilder
from .cadence import EvalCadence
from .catalog import spec_of
from .header import GLOBAL_SLICE, SHARD


def gradients_per_update(point: dict[str, Any]) -> int:
    """c: the gradients one update averages (hardsync λ, softsync max(1, ⌊λ/n⌋), async 1)."""
    return spec_of(point).gradients_per_update(point["cluster"]["learners"], point["protocol"]["n"])


def total_gradients(point: dict[str, Any]) -> int:
    """Gradients of a run: enough for the epochs (with a barrier: whole rounds of λ)."""
    lam, mu = point["cluster"]["learners"], point["cluster"]["minibatch"]
    samples = point["workload"]["epochs"] * point["workload"]["samples_per_epoch"]
    if spec_of(point).barrier:
        return math.ceil(samples / (lam * mu)) * lam
    return max(1, math.ceil(samples / mu))


class PSCore:
    """One parameter-server run's protocol state (module doc); writes the trace into ``tb``.

    Push items are ``(learner, grad op, version read, batch size)`` tuples: one per gradient,
    or several when an aggregator forwards its group's gradients as one message.
    """

    def __init__(self, point: dict[str, Any], tb: TraceBuilder | None = None) -> None:
        spec = spec_of(point)
        cl, wl = point["cluster"], point["workload"]
        self.lam = lam = cl["learners"]
        self.mu = mu = cl["minibatch"]
        self.N = wl["samples_per_epoch"]
        self.barrier = spec.barrier
        self.bound = point["protocol"]["staleness_bound"] if spec.bounded else -1
        self.c = gradients_per_update(point)
        self.total = total_gradients(point)
        self.layout = GLOBAL_SLICE if self.barrier else SHARD
        self.tb = tb if tb is not None else TraceBuilder()
        self.cadence = EvalCadence(self.N, wl["evals_per_epoch"])
        self.version = 0
        self.issued = 0
        self.processed = 0
        self.samples_applied = 0
        self.acc: list[tuple[int, int, int]] = []  # (grad op, version read, batch size)
        self.batches = [0] * lam
        self.waiting: list[int] = []               # barrier: learners done with this round
        # SSP: gradients processed per learner, how many learners have each count, the slowest
        # count, and the waiting learners bucketed by their count (a heap of the counts)
        self.done_clock = [0] * lam
        self._at_clock: dict[int, int] = {0: lam}
        self.slowest = 0
        self._blocked: dict[int, list[int]] = {}
        self._blocked_keys: list[int] = []

    # -- the data order ---------------------------------------------------------------------
    def sample_start(self, i: int, k: int) -> int:
        """Stream position of learner ``i``'s ``k``-th minibatch (global slices with a barrier)."""
        if self.barrier:
            return global_slice_start(k, i, self.lam, self.mu)
        return shard_start(k, i, self.lam, self.mu, self.N)

    # -- the run ----------------------------------------------------------------------------
    def begin(self) -> None:
        """The run starts with an eval of the initial weights."""
        self.tb.eval(0, 0, 0.0, 0.0)

    def assign(self, i: int) -> int:
        """Learner ``i`` may start: the index ``k`` of its next minibatch, or −1 when every
        gradient of the run has been issued (the learner stops)."""
        if self.issued >= self.total:
            return -1
        self.issued += 1
        k = self.batches[i]
        self.batches[i] = k + 1
        return k

    def gradient(self, i: int, j: int, k: int, t_start: float, t_end: float) -> int:
        """Record learner ``i``'s gradient of minibatch ``k`` on version ``j``; its grad op."""
        return self.tb.grad(i, 0, j, self.sample_start(i, k), self.mu, k, t_start, t_end,
                            self.samples_applied / self.N)

    def push(self, items: Iterable[tuple[int, int, int, int]], t: float) -> list[int]:
        """The server has processed ``items`` at ``t``: apply when ``c`` gradients (or the run's
        last) are in; return the learners that may pull now, in the order they pull."""
        acc = self.acc
        mine = []
        for i, gop, j, size in items:
            acc.append((gop, j, size))
            mine.append(i)
            self.processed += 1
            if self.bound >= 0:
                self._tick(i)
        if len(acc) >= self.c or self.processed == self.total:
            self._apply(t)
        if self.barrier:
            self.waiting.extend(mine)
            if self.acc:
                return []
            ready, self.waiting = sorted(self.waiting), []
            return ready
        if self.bound >= 0:
            return self._release(mine)
        return mine

    def finish(self, t: float) -> None:
        """The run ends at ``t``: apply a last partial group; end with an eval of the final weights."""
        if self.acc:
            self._apply(t)
        if self.tb.kinds[-1] != EVAL:
            self.tb.eval(0, self.version, t, self.samples_applied / self.N)

    # -- rules ------------------------------------------------------------------------------
    def _apply(self, t: float) -> None:
        acc, v = self.acc, self.version
        n = len(acc)
        if n == 1:
            gop, j, size = acc[0]
            self.samples_applied += size
            epoch = self.samples_applied / self.N
            self.tb.apply(0, v, (gop,), (1.0,), (v - j,), t, epoch)
        else:
            self.samples_applied += sum(a[2] for a in acc)
            epoch = self.samples_applied / self.N
            self.tb.apply(0, v, [a[0] for a in acc], [1.0 / n] * n, [v - a[1] for a in acc], t, epoch)
        self.version = v + 1
        self.acc = []
        if self.cadence.due(self.samples_applied):
            self.tb.eval(0, v + 1, t, epoch)

    def _tick(self, i: int) -> None:
        """Learner ``i`` has one more gradient processed; keep the slowest count (O(1))."""
        c = self.done_clock[i]
        self.done_clock[i] = c + 1
        at = self._at_clock
        at[c] -= 1
        at[c + 1] = at.get(c + 1, 0) + 1
        if c == self.slowest and at[c] == 0:
            del at[c]
            self.slowest = c + 1

    def _release(self, pushed: list[int]) -> list[int]:
        """SSP: the pushed learners wait; every waiting learner whose count exceeds the slowest
        by at most the bound pulls now, in index order (O(log λ) per waiting learner)."""
        blocked, keys = self._blocked, self._blocked_keys
        for i in pushed:
            c = self.done_clock[i]
            bucket = blocked.get(c)
            if bucket is None:
                blocked[c] = [i]
                heapq.heappush(keys, c)
            else:
                bucket.append(i)
        limit = self.slowest + self.bound
        ready: list[int] = []
        while keys and keys[0] <= limit:
            ready += blocked.pop(heapq.heappop(keys))
        if len(ready) > 1:
            ready.sort()
        return ready
