"""The parameter-server family on SimPy: hardsync, n-softsync, async and SSP.

Semantics (DESIGN.md): a learner pulls weights (version ``j``), computes a gradient,
pushes it and blocks until the server has *processed* it (applied it, or added it to
the pending accumulation); then it pulls again. The server applies the average of every
``c`` processed gradients (hardsync: one from every learner, c = λ; softsync: c =
max(1, ⌊λ/n⌋) from any learners; async: c = 1; ssp: c = 1 and a learner may not start
clock ``k`` while the slowest learner is below ``k − s``). Staleness σ = v − j.

Cost model. A message of B bytes occupies a link for B / bandwidth, FIFO, and arrives
``latency_s`` after it leaves the link. Each shard has its own NIC in, NIC out and apply
queue and holds 1/S of the parameters; a push is processed when every shard has applied
its part. The server answers a processed push with the weights (the learner's pull is
folded into the acknowledgement). With ``group_size`` g > 1 (Rudra-adv), learners send to
their group's aggregator (its own NIC in), which forwards one summed message per round
of its group; the server then spends one apply per aggregated message.

Engine. Links and queues are :class:`~.resources.FifoServer` reservations; the event
loop carries two SimPy events per gradient (the push leaving the learner, the server
finishing it) and creates no process or Resource per message.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import simpy

from .compute import DrawStream, learner_clocks, sampler
from simpy.core import NORMAL

from .events import Wake, at
from .dataorder import global_slice_start
from .resources import FifoServer
from .trace import EVAL, TraceBuilder


def gradients_per_update(point: dict[str, Any]) -> int:
    """c: hardsync λ, softsync max(1, ⌊λ/n⌋), async and ssp 1."""
    lam, proto = point["cluster"]["learners"], point["protocol"]
    return {"hardsync": lam, "softsync": max(1, lam // proto["n"])}.get(proto["name"], 1)


def total_gradients(point: dict[str, Any]) -> int:
    """Gradients of a run: enough for the epochs (hardsync: whole rounds of λ)."""
    lam, mu = point["cluster"]["learners"], point["cluster"]["minibatch"]
    samples = point["workload"]["epochs"] * point["workload"]["samples_per_epoch"]
    if point["protocol"]["name"] == "hardsync":
        return math.ceil(samples / (lam * mu)) * lam
    return max(1, math.ceil(samples / mu))


class PSRun:
    """One simulated parameter-server run; ``run()`` returns the trace builder."""

    def __init__(self, point: dict[str, Any]) -> None:
        self.point = point
        cl, proto, wl = point["cluster"], point["protocol"], point["workload"]
        self.lam = lam = cl["learners"]
        self.mu = mu = cl["minibatch"]
        self.N = wl["samples_per_epoch"]
        name = proto["name"]
        self.hardsync = name == "hardsync"
        self.ssp_bound = proto["staleness_bound"] if name == "ssp" else -1
        self.c = gradients_per_update(point)
        self.total = total_gradients(point)
        net, srv = cl["network"], cl["server"]
        self.S = srv["shards"]
        self.lat = net["latency_s"]
        shard_bytes = wl["param_count"] * net["bytes_per_param"] / self.S
        bw = net["bandwidth_Bps"]
        self.tx = 0.0 if math.isinf(bw) else shard_bytes / bw
        self.link_in = [FifoServer(f"server{s}.in") for s in range(self.S)]
        self.link_out = [FifoServer(f"server{s}.out") for s in range(self.S)]
        self.queue = [FifoServer(f"server{s}.apply") for s in range(self.S)]
        rng = np.random.default_rng(np.random.SeedSequence([int(point["seed"]), 7]))
        self.apply_draw = DrawStream(sampler(srv["apply_distribution"], srv["apply_s"], 0.0, rng))
        self.group = srv["group_size"]
        self.agg_links = [FifoServer(f"aggregator{a}.in") for a in range(math.ceil(lam / self.group))]
        self.agg_pending: list[list[tuple[int, int, int, int]]] = [[] for _ in self.agg_links]
        self.agg_inflight = [0] * len(self.agg_links)
        self.agg_arrive = [0.0] * len(self.agg_links)
        self.clocks = learner_clocks(point, lam, 1)
        self.shard_len = max(1, self.N // lam)
        self.shard_batches = max(1, self.shard_len // mu)
        self.env = simpy.Environment()
        self._schedule = self.env.schedule
        if self.c == 1 and self.S == 1 and self.group == 1 and self.ssp_bound < 0:
            self._processed = self._processed_async  # type: ignore[method-assign]
        self.tb = TraceBuilder()
        # state
        self.version = 0
        self.issued = 0
        self.processed = 0
        self.samples_applied = 0
        self.acc: list[tuple[int, int, int]] = []  # (grad_op, version read, batch size)
        self.batches = [0] * lam
        self.done_clock = [0] * lam  # gradients of each learner processed
        self.waiting: list[int] = []
        self.eval_every = self.N / wl["evals_per_epoch"]
        self.next_eval = self.eval_every
        self.compute_s = 0.0
        self.end_time = 0.0

    # -- event plumbing ---------------------------------------------------------------
    def _at(self, t: float, cb: Callable[[Wake], None], value: Any) -> None:
        at(self.env, t, cb, value)

    # -- learner side ---------------------------------------------------------------------
    def _pull(self, i: int, t: float) -> None:
        """Learner ``i`` receives the current weights (sent at ``t``) and starts computing."""
        tx, lat = self.tx, self.lat
        if self.S == 1:
            arrive = self.link_out[0].reserve(t, tx) + lat
        else:
            arrive = max(link.reserve(t, tx) for link in self.link_out) + lat
        self._start(i, arrive, self.version)

    def _start(self, i: int, t: float, j: int) -> None:
        if self.issued >= self.total:
            if self.group > 1:
                self._maybe_forward(i // self.group)
            return
        self.issued += 1
        if self.group > 1:
            self.agg_inflight[i // self.group] += 1
        k = self.batches[i]
        self.batches[i] = k + 1
        clock = self.clocks[i]
        work = clock.draws.next()
        self.compute_s += work
        delay = clock.finish(t, work) - self.env._now
        self._schedule(Wake(self._send, (i, j, k, t)), NORMAL, delay if delay > 0 else 0.0)

    def _send(self, ev: Wake) -> None:
        i, j, k, t0 = ev._value
        now = self.env._now
        lam, mu = self.lam, self.mu
        if self.hardsync:
            start = global_slice_start(k, i, lam, mu)
        else:  # dataorder.shard_start, inlined
            e, b = divmod(k, self.shard_batches)
            start = e * self.N + i * self.shard_len + b * mu
        gop = self.tb.grad(i, 0, j, start, mu, k, t0, now, self.samples_applied / self.N)
        item = (i, gop, j, mu)
        if self.group == 1:
            self._push(now, (item,))
            return
        a = i // self.group
        arrive = self.agg_links[a].reserve(now, self.tx * self.S) + self.lat
        self.agg_inflight[a] -= 1
        self.agg_pending[a].append(item)
        if arrive > self.agg_arrive[a]:
            self.agg_arrive[a] = arrive
        self._maybe_forward(a)

    def _maybe_forward(self, a: int) -> None:
        """Aggregator ``a`` forwards once every member that can still send has sent."""
        pend = self.agg_pending[a]
        members = min(self.group, self.lam - a * self.group)
        if pend and (len(pend) == members or (self.issued >= self.total and self.agg_inflight[a] == 0)):
            self.agg_pending[a] = []
            self._at(max(self.agg_arrive[a], self.env.now), self._forward, pend)

    def _forward(self, ev: Wake) -> None:
        self._push(self.env.now, ev._value)

    def _push(self, t: float, items: tuple | list) -> None:
        """Send a push (one gradient or one aggregated message) to every shard at ``t``."""
        tx, lat, draw = self.tx, self.lat, self.apply_draw
        if self.S == 1:
            done = self.queue[0].reserve(self.link_in[0].reserve(t, tx) + lat, draw.next())
        else:
            done = max(q.reserve(link.reserve(t, tx) + lat, draw.next())
                       for q, link in zip(self.queue, self.link_in))
        delay = done - self.env._now
        self._schedule(Wake(self._processed, items), NORMAL, delay if delay > 0 else 0.0)

    # -- server side ------------------------------------------------------------------------
    def _processed(self, ev: Wake) -> None:
        now = self.env._now
        items = ev._value
        acc = self.acc
        for i, gop, j, size in items:
            acc.append((gop, j, size))
            self.done_clock[i] += 1
        self.processed += len(items)
        self.end_time = now
        if len(acc) >= self.c or self.processed == self.total:
            self._apply(now)
        if self.hardsync:
            self.waiting.extend(it[0] for it in items)
            if not self.acc:  # the round was applied: everyone waiting pulls the new version
                ready, self.waiting = sorted(self.waiting), []
                for i in ready:
                    self._pull(i, now)
        elif self.ssp_bound >= 0:
            self.waiting.extend(it[0] for it in items)
            self._release_ssp(now)
        else:
            for it in items:
                self._pull(it[0], now)

    def _processed_async(self, ev: Wake) -> None:
        """``_processed`` for async with one shard and no aggregation (same semantics, fewer calls)."""
        now = self.env._now
        i, gop, j, size = ev._value[0]
        self.done_clock[i] += 1
        self.processed += 1
        self.end_time = now
        v = self.version
        self.samples_applied += size
        epoch = self.samples_applied / self.N
        self.tb.apply1(0, v, gop, v - j, now, epoch)
        self.version = v + 1
        if self.samples_applied >= self.next_eval - 1e-9:
            self.tb.eval(0, v + 1, now, epoch)
            while self.next_eval <= self.samples_applied + 1e-9:
                self.next_eval += self.eval_every
        self._start(i, self.link_out[0].reserve(now, self.tx) + self.lat, v + 1)

    def _release_ssp(self, now: float) -> None:
        slowest = min(self.done_clock)
        bound = self.ssp_bound
        still = []
        for i in sorted(self.waiting):
            if self.done_clock[i] - bound <= slowest:
                self._pull(i, now)
            else:
                still.append(i)
        self.waiting = still

    def _apply(self, now: float) -> None:
        acc, v = self.acc, self.version
        n = len(acc)
        if n == 1:
            gop, j, size = acc[0]
            self.samples_applied += size
            epoch = self.samples_applied / self.N
            self.tb.apply(0, v, (gop,), (1.0,), (v - j,), now, epoch)
        else:
            self.samples_applied += sum(a[2] for a in acc)
            epoch = self.samples_applied / self.N
            self.tb.apply(0, v, [a[0] for a in acc], [1.0 / n] * n, [v - a[1] for a in acc], now, epoch)
        self.version = v + 1
        self.acc = []
        if self.samples_applied >= self.next_eval - 1e-9:
            self.tb.eval(0, v + 1, now, epoch)
            while self.next_eval <= self.samples_applied + 1e-9:
                self.next_eval += self.eval_every

    def run(self) -> TraceBuilder:
        """Simulate to the end; the trace ends with an eval of the final weights."""
        self.tb.eval(0, 0, 0.0, 0.0)
        for i in range(self.lam):
            self._pull(i, 0.0)
        self.env.run()
        if self.acc:
            self._apply(self.end_time)
        if self.tb.kinds[-1] != EVAL:
            self.tb.eval(0, self.version, self.end_time, self.samples_applied / self.N)
        return self.tb

    def stats(self) -> dict[str, Any]:
        """Runtime figures of the finished run (staleness comes from the trace)."""
        T = self.end_time
        return {
            "gradients": self.processed,
            "updates": self.version,
            "sim_time_s": T,
            "gradients_per_s": self.processed / T if T > 0 else math.inf,
            "server_utilization": float(np.mean([q.utilization(T) for q in self.queue])),
            "server_wait_mean_s": float(np.mean([q.mean_wait() for q in self.queue])),
            "link_in_utilization": float(np.mean([q.utilization(T) for q in self.link_in])),
            "link_out_utilization": float(np.mean([q.utilization(T) for q in self.link_out])),
            "compute_utilization": self.compute_s / (self.lam * T) if T > 0 else 0.0,
        }
