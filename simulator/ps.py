"""The parameter-server family on SimPy: the time of hardsync, n-softsync, async and SSP runs.

The protocol's rules (what is applied, who pulls next, the trace) are the core's
(:class:`.protocols.ps.PSCore`); this engine supplies time.

Cost model. A message of B bytes occupies a link for B / bandwidth, FIFO, and arrives
``latency_s`` after it leaves the link. Each shard has its own NIC in, NIC out and apply
queue and holds 1/S of the parameters; a push is processed when every shard has applied
its part. The server answers a processed push with the weights (the learner's pull is
folded into the acknowledgement). With ``group_size`` g > 1 (Rudra-adv), learners send to
their group's aggregator (its own NIC in), which forwards one summed message per round
of its group; the server then spends one apply per aggregated message.

Engine. Links and queues are :class:`~.resources.FifoServer` reservations; the event
loop carries two events per gradient (the push leaving the learner, the server finishing
it) and creates no process or Resource per message. Each event carries its own time,
computed as SimPy computes it (``now + delay``), so a callback knows "now" without asking
the environment.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
import simpy
from simpy.core import NORMAL

from . import seeds
from .compute import DrawStream, learner_clocks, sampler
from .events import Wake, at
from .protocols.ps import PSCore
from .resources import FifoServer
from .trace import TraceBuilder


class PSRun:
    """One simulated parameter-server run; ``run()`` returns the trace builder."""

    def __init__(self, point: dict[str, Any]) -> None:
        self.point = point
        self.core = core = PSCore(point)
        self.tb = core.tb
        cl, wl = point["cluster"], point["workload"]
        self.lam = lam = core.lam
        self.mu = core.mu
        net, srv = cl["network"], cl["server"]
        self.S = srv["shards"]
        self.lat = net["latency_s"]
        shard_bytes = wl["param_count"] * net["bytes_per_param"] / self.S
        bw = net["bandwidth_Bps"]
        self.tx = 0.0 if math.isinf(bw) else shard_bytes / bw
        self.link_in = [FifoServer(f"server{s}.in") for s in range(self.S)]
        self.link_out = [FifoServer(f"server{s}.out") for s in range(self.S)]
        self.queue = [FifoServer(f"server{s}.apply") for s in range(self.S)]
        rng = np.random.default_rng(np.random.SeedSequence([int(point["seed"]), seeds.SERVER_APPLY]))
        self.apply_draw = DrawStream(sampler(srv["apply_distribution"], srv["apply_s"], 0.0, rng))
        self.group = srv["group_size"]
        self.agg_links = [FifoServer(f"aggregator{a}.in") for a in range(math.ceil(lam / self.group))]
        self.agg_pending: list[list[tuple[int, int, int, int]]] = [[] for _ in self.agg_links]
        self.agg_inflight = [0] * len(self.agg_links)
        self.agg_arrive = [0.0] * len(self.agg_links)
        self.clocks = learner_clocks(point, lam)
        self.env = simpy.Environment()
        self._schedule = self.env.schedule
        self.compute_s = 0.0
        self.end_time = 0.0

    # -- learner side ---------------------------------------------------------------------
    def _pull(self, i: int, now: float) -> None:
        """Learner ``i`` receives the current weights (sent ``now``) and starts computing."""
        tx, lat = self.tx, self.lat
        if self.S == 1:
            arrive = self.link_out[0].reserve(now, tx) + lat
        else:
            arrive = max(link.reserve(now, tx) for link in self.link_out) + lat
        self._start(i, arrive, self.core.version, now)

    def _start(self, i: int, t: float, j: int, now: float) -> None:
        k = self.core.assign(i)
        if k < 0:
            if self.group > 1:
                self._maybe_forward(i // self.group, now)
            return
        if self.group > 1:
            self.agg_inflight[i // self.group] += 1
        clock = self.clocks[i]
        work = clock.draws.next()
        self.compute_s += work
        delay = clock.finish(t, work) - now
        if delay < 0:
            delay = 0.0
        self._schedule(Wake(self._send, (i, j, k, t, now + delay)), NORMAL, delay)

    def _send(self, ev: Wake) -> None:
        i, j, k, t0, now = ev.payload
        item = (i, self.core.gradient(i, j, k, t0, now), j, self.mu)
        if self.group == 1:
            self._push(now, item, self._processed_one)
            return
        a = i // self.group
        arrive = self.agg_links[a].reserve(now, self.tx * self.S) + self.lat
        self.agg_inflight[a] -= 1
        self.agg_pending[a].append(item)
        if arrive > self.agg_arrive[a]:
            self.agg_arrive[a] = arrive
        self._maybe_forward(a, now)

    def _maybe_forward(self, a: int, now: float) -> None:
        """Aggregator ``a`` forwards once every member that can still send has sent."""
        pend = self.agg_pending[a]
        members = min(self.group, self.lam - a * self.group)
        all_issued = self.core.issued >= self.core.total
        if pend and (len(pend) == members or (all_issued and self.agg_inflight[a] == 0)):
            self.agg_pending[a] = []
            at(self.env, max(self.agg_arrive[a], now), self._forward, pend)

    def _forward(self, ev: Wake) -> None:
        self._push(self.env.now, ev.payload, self._processed_many)

    def _push(self, now: float, item: Any, processed: Callable[[Wake], None]) -> None:
        """Send a push (one gradient or one aggregated message) to every shard ``now``;
        ``processed(wake)`` runs when the server has processed it (payload: item, time)."""
        tx, lat, draw = self.tx, self.lat, self.apply_draw
        if self.S == 1:
            done = self.queue[0].reserve(self.link_in[0].reserve(now, tx) + lat, draw.next())
        else:
            done = max(q.reserve(link.reserve(now, tx) + lat, draw.next())
                       for q, link in zip(self.queue, self.link_in))
        delay = done - now
        if delay < 0:
            delay = 0.0
        self._schedule(Wake(processed, (item, now + delay)), NORMAL, delay)

    # -- server side ------------------------------------------------------------------------
    def _processed_one(self, ev: Wake) -> None:
        (i, gop, j, size), now = ev.payload
        self.end_time = now
        for r in self.core.push_one(i, gop, j, size, now):
            self._pull(r, now)

    def _processed_many(self, ev: Wake) -> None:
        items, now = ev.payload
        self.end_time = now
        for i in self.core.push(items, now):
            self._pull(i, now)

    def run(self) -> TraceBuilder:
        """Simulate to the end; the trace ends with an eval of the final weights."""
        self.core.begin()
        for i in range(self.lam):
            self._pull(i, 0.0)
        self.env.run()
        self.core.finish(self.end_time)
        return self.tb

    def stats(self) -> dict[str, Any]:
        """Runtime figures of the finished run (staleness comes from the trace)."""
        T = self.end_time
        processed = self.core.processed
        return {
            "gradients": processed,
            "updates": self.core.version,
            "sim_time_s": T,
            "gradients_per_s": processed / T if T > 0 else math.inf,
            "server_utilization": float(np.mean([q.utilization(T) for q in self.queue])),
            "server_wait_mean_s": float(np.mean([q.mean_wait() for q in self.queue])),
            "link_in_utilization": float(np.mean([q.utilization(T) for q in self.link_in])),
            "link_out_utilization": float(np.mean([q.utilization(T) for q in self.link_out])),
            "compute_utilization": self.compute_s / (self.lam * T) if T > 0 else 0.0,
        }
