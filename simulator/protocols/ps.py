"""The parameter-server rules, without time: who computes what, what is applied, who goes next.

docs/design.md's semantics: a learner pulls the weights (version ``j``), computes a gradient on
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

import math
from collections.abc import Iterable
from typing import Any

from ..dataorder import GlobalSliceLayout, ShardLayout
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


# -- the rules, as functions of plain numbers and arrays (the fast engine compiles these same
#    functions with numba: :mod:`..fast_ps`; PSCore calls them as they are)

def update_due(pending: int, c: int, processed: int, total: int) -> bool:
    """n-softsync's grouping: an update is applied once ``c`` gradients are pending, or when
    the run's last gradient is processed (a last partial group)."""
    return pending >= c or processed == total


def group_weight(n: int) -> float:
    """The weight of each of the ``n`` gradients one update averages: 1/n."""
    return 1.0 / n


def ssp_release(pushed: Any, m: int, limit: int, done_clock: Any, waiting: Any, n_waiting: int,
                ready: Any) -> tuple[int, int]:
    """SSP's release after the server processed the gradients of learners ``pushed[:m]``:
    every waiting learner (``waiting[:n_waiting]``) and pushed learner whose processed count
    (``done_clock``) is at most ``limit`` (the slowest count + the bound) goes, into
    ``ready`` (unsorted: they pull in index order); the others wait. Returns (released,
    waiting now).

    Waiting learners all have one count, ``limit + 1``: a learner pushes one gradient at a
    time, from a count within the limit of when it was released, so it waits only with the
    count one above the limit, and the limit moves only as the slowest count does, which
    releases every waiting learner at once. Checking the first is checking all of them
    (tests/test_ps_rules.py holds this rule to the definition on SSP runs)."""
    r = 0
    if n_waiting > 0 and done_clock[waiting[0]] <= limit:
        for w in range(n_waiting):
            ready[r] = waiting[w]
            r += 1
        n_waiting = 0
    for x in range(m):
        i = pushed[x]
        if done_clock[i] <= limit:
            ready[r] = i
            r += 1
        else:
            waiting[n_waiting] = i
            n_waiting += 1
    return r, n_waiting


def group_members(a: int, group: int, lam: int) -> int:
    """Learners of aggregator ``a`` (groups of ``group`` learners in index order; the last may be short)."""
    return min(group, lam - a * group)


def forward_due(pending: int, members: int, issued: int, total: int, inflight: int) -> bool:
    """Tree aggregation: an aggregator holding ``pending`` gradients forwards them as one
    message once every member that can still send has sent: all ``members`` are in, or every
    gradient of the run is issued and none of its members' is still being computed."""
    return pending > 0 and (pending == members or (issued >= total and inflight == 0))


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
        self.group = cl["server"]["group_size"]
        self.total = total_gradients(point)
        self.layout = GLOBAL_SLICE if self.barrier else SHARD
        self.sample_start_of = (GlobalSliceLayout(lam, mu) if self.barrier else ShardLayout(lam, mu, self.N)).start
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
        # count, and the waiting learners (ssp_release)
        self.done_clock = [0] * lam
        self._at_clock: dict[int, int] = {0: lam}
        self.slowest = 0
        self._ssp_waiting = [0] * lam
        self._n_waiting = 0
        self._ready = [0] * lam
        self._grad, self._apply1 = self.tb.grad, self.tb.apply1  # (bound once: a gradient's hot path)
        if self.c == 1 and not self.barrier and self.bound < 0:
            self.push_one = self._push_one_alone  # type: ignore[method-assign]

    # -- the data order ---------------------------------------------------------------------
    def sample_start(self, i: int, k: int) -> int:
        """Stream position of learner ``i``'s ``k``-th minibatch (global slices with a barrier)."""
        return self.sample_start_of(k, i)

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
        return self._grad(i, 0, j, self.sample_start_of(k, i), self.mu, k, t_start, t_end,
                          self.samples_applied / self.N)

    def push_one(self, i: int, gop: int, j: int, size: int, t: float) -> list[int]:
        """The server has processed one gradient (learner ``i``'s grad op ``gop`` on version
        ``j``) at ``t``: apply when ``c`` gradients (or the run's last) are in; return the
        learners that may pull now, in the order they pull."""
        self.acc.append((gop, j, size))
        self.processed += 1
        if self.bound >= 0:
            self._tick(i)
        if update_due(len(self.acc), self.c, self.processed, self.total):
            self._apply(t)
        return self._released([i])

    def _push_one_alone(self, i: int, gop: int, j: int, size: int, t: float) -> list[int]:
        """:meth:`push_one` when every gradient is an update and nobody waits (c = 1, no barrier,
        no bound: async): the same rule without the pending list (≈ 15 % of a simulated
        gradient, measured); tests/test_ps.py checks both give the same trace."""
        self.processed += 1
        v = self.version
        self.samples_applied += size
        epoch = self.samples_applied / self.N
        self._apply1(0, v, gop, v - j, t, epoch)
        self.version = v + 1
        if self.samples_applied >= self.cadence.next - 1e-9 and self.cadence.due(self.samples_applied):
            self.tb.eval(0, v + 1, t, epoch)
        return [i]

    def push(self, items: Iterable[tuple[int, int, int, int]], t: float) -> list[int]:
        """:meth:`push_one` for a message carrying several gradients (an aggregator's): they are
        processed together, then the update and release rules run once."""
        mine = []
        for i, gop, j, size in items:
            self.acc.append((gop, j, size))
            mine.append(i)
            self.processed += 1
            if self.bound >= 0:
                self._tick(i)
        if update_due(len(self.acc), self.c, self.processed, self.total):
            self._apply(t)
        return self._released(mine)

    def finish(self, t: float) -> None:
        """The run ends at ``t``: apply a last partial group; end with an eval of the final weights."""
        if self.acc:
            self._apply(t)
        if self.tb.last_kind != EVAL:
            self.tb.eval(0, self.version, t, self.samples_applied / self.N)

    # -- rules ------------------------------------------------------------------------------
    def _released(self, pushed: list[int]) -> list[int]:
        """Who pulls after the server processed the gradients of ``pushed``."""
        if self.barrier:
            self.waiting.extend(pushed)
            if self.acc:
                return []
            ready, self.waiting = sorted(self.waiting), []
            return ready
        if self.bound >= 0:
            return self._release(pushed)
        return pushed

    def _apply(self, t: float) -> None:
        acc, v = self.acc, self.version
        n = len(acc)
        if n == 1:
            gop, j, size = acc[0]
            self.samples_applied += size
            epoch = self.samples_applied / self.N
            self.tb.apply1(0, v, gop, v - j, t, epoch)
        else:
            self.samples_applied += sum(a[2] for a in acc)
            epoch = self.samples_applied / self.N
            self.tb.apply(0, v, [a[0] for a in acc], [group_weight(n)] * n, [v - a[1] for a in acc], t, epoch)
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
        """SSP: :func:`ssp_release` of the pushed learners; those released pull in index order."""
        r, self._n_waiting = ssp_release(pushed, len(pushed), self.slowest + self.bound, self.done_clock,
                                         self._ssp_waiting, self._n_waiting, self._ready)
        ready = self._ready[:r]
        if r > 1:
            ready.sort()
        return ready

    def forward_due(self, a: int, pending: int, inflight: int) -> bool:
        """Whether aggregator ``a``, holding ``pending`` gradients with ``inflight`` of its
        members' still being computed, forwards them now (:func:`forward_due`)."""
        return forward_due(pending, group_members(a, self.group, self.lam), self.issued, self.total, inflight)
