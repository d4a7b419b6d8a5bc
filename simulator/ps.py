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
the environment. Those two events are the learner's own :class:`~.events.Wake`, re-armed
and pushed straight onto SimPy's heap (:func:`~.events.event_queue`); buckets, shared
NICs and aggregators add events of their own.

Layer-wise pull (``cluster.server.pull = "layerwise"``; TensorFlow reads each variable from its
parameter server as the forward pass needs it). The weights travel as pieces in forward order, each
piece a message of its own on every link it crosses: for a model whose layers the catalogue knows
(:data:`.catalog.LAYERED_MODELS`) a piece per convolution or linear layer, its weight with its bias
and batch-norm vectors, else ``bucket_bytes`` chunks. Learners released at the same time have their
pieces sent in turn (piece 1 to each of them, then piece 2, …), as TCP shares a NIC among concurrent
transfers, at a piece's granularity. The forward share ``F = (1 − backward_fraction) · work`` of the
compute is spread over the pieces in proportion to their layers' forward multiply-adds (to their bytes
for chunks), and piece b's part may start once piece b has arrived: the compute starts at
``max_b (arrival_b − F · C_{b−1})`` (``C_{b−1}`` the forward share of the pieces before b) and runs
without a gap; with one piece it starts when the whole model has arrived. With
``pull = "layerwise-random"`` each pull sends a learner's pieces in a random order of its own (a fresh
permutation per pull, from the seeded stream ``[seed, SERVER_APPLY, PULL_ORDER]``): TensorFlow 1.x
leaves its transfers unordered (TicTac), so the forward may wait for a late first layer; the start
rule is the same, ``arrival_b`` indexed by forward position. With ``pull = "layerwise-shared"`` every
piece's transfer starts at once and the pieces in flight share each link equally (processor sharing:
TensorFlow issues every variable's receive at the step's start and gRPC interleaves concurrent calls
frame by frame, docs/hardware.md): a batch of pieces of ``d_1 ≤ … ≤ d_m`` seconds starting at
``t0`` (the link free) ends piece j at ``t0 + d_1 + … + d_{j−1} + (m − j + 1) · d_j``
(:func:`processor_sharing_ends`), and the link is busy for their sum, FIFO behind earlier traffic.
The batch is every piece of the learners released together, on each link it crosses (the servers'
NICs out, a shared node's NIC in); a piece arrives when its last link has carried it, plus the latency.

Replicated pull (``pull = "replicated"``, hardsync only: tf_cnn_benchmarks' ``distributed_replicated``,
where every GPU keeps a copy of every variable and the step pushes, applies, waits at a barrier and
reads back each variable as soon as its gradient exists). The pieces are the layer-wise pull's; the
gradient is pushed piece by piece in backward order, piece b (forward order) ready when backward has
done the layers from the last down to b: at ``F + B · (1 − C_{b−1})`` of the work (``B`` the
backward share, ``C_{b−1}`` as above: the forward multiply-adds of the pieces before b, bytes for
chunks). Piece b's pull leaves when every learner's push of it has been applied on every shard (the
barrier per variable), to every learner at once, the transfers of one piece sharing each link equally
as the shared pull's do (the workers' RecvTensor calls of one variable, each on its own connection,
share the server's NIC: tf-grpc-concurrent), pieces after one another in the order of their barriers,
FIFO behind earlier traffic. The next forward reads the local copies, so it starts when the learner's
last piece has arrived (no overlap with the forward); the first pull, at time 0, sends every piece.
"""

from __future__ import annotations

import math
from heapq import heappush
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy
from simpy.core import NORMAL

from . import seeds
from .catalog import dataset_info, model_layers
from .collectives import bucket_sizes, produced_shares, transfer_time
from .compute import DrawStream, learner_clocks, sampler
from .events import Wake, at, event_queue
from .protocols.ps import PSCore
from .resources import FifoServer
from .trace import TraceBuilder

PULL_ORDER = 1  # the pull-order stream's third entry: SeedSequence([seed, SERVER_APPLY, PULL_ORDER])


def processor_sharing_ends(start: float, durations: list[float]) -> list[float]:
    """When each of ``durations`` (seconds alone on the link), all starting at ``start``, ends when the
    transfers in flight share the link equally: with k left each advances at 1/k, so they end in
    order of length, the j-th shortest at ``start + Σ_{i<j} d_(i) + (m − j) · d_(j)`` (0-based j)."""
    order = sorted(range(len(durations)), key=lambda i: durations[i])
    ends = [0.0] * len(durations)
    m, done = len(durations), 0.0
    for j, i in enumerate(order):
        ends[i] = start + done + (m - j) * durations[i]
        done += durations[i]
    return ends


def pull_pieces(point: dict[str, Any], nbytes: float) -> list[tuple[float, float]]:
    """A layer-wise pull's pieces in forward order, each as (its share of the bytes, the forward share
    of the pieces before it): the model's layers where the catalogue knows them (a piece per layer,
    its forward share its share of the multiply-adds), else ``bucket_bytes`` chunks of the reversed
    backward order with the forward spread over the bytes; [] when that is one piece (module doc)."""
    wl = point["workload"]
    layers = model_layers(wl["model"], dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"]))
    out: list[tuple[float, float]] = []
    if layers is not None:
        params = sum(layer.params for layer in layers)
        macs = sum(layer.macs for layer in layers)
        done = 0
        for layer in layers:
            out.append((layer.params / params, done / macs))
            done += layer.macs
        return out
    pieces = bucket_sizes(nbytes, point["protocol"]["bucket_bytes"])
    if len(pieces) > 1:
        before = 0.0
        for b in reversed(pieces):
            out.append((b / nbytes, before / nbytes))
            before += b
    return out


class PSRun:
    """One simulated parameter-server run; ``run()`` returns the trace builder."""

    def __init__(self, point: dict[str, Any]) -> None:
        self.point = point
        self.core = core = PSCore(point)
        self.tb = core.tb
        self._assign, self._gradient, self._push_one = core.assign, core.gradient, core.push_one  # (bound once)
        cl, wl = point["cluster"], point["workload"]
        self.lam = lam = core.lam
        self.mu = core.mu
        net, srv = cl["network"], cl["server"]
        self.S = srv["shards"]
        self.lat = net["latency_s"] + net["overhead_s"]
        nbytes = wl["param_count"] * net["bytes_per_param"]
        shard_bytes = nbytes / self.S
        bw = net["bandwidth_Bps"]
        self.tx = transfer_time(shard_bytes, bw)
        # learners sharing a node share its NIC (a message crosses it and the server's NIC)
        self.g = cl["gpus_per_node"]
        self.node_tx = transfer_time(nbytes, bw)
        self.node_out = [FifoServer(f"node{n}.out") for n in range(lam // self.g)]
        self.node_in = [FifoServer(f"node{n}.in") for n in range(lam // self.g)]
        # gradient buckets pushed as backward produces them (not through aggregators)
        sizes = bucket_sizes(nbytes, point["protocol"]["bucket_bytes"]) if srv["group_size"] == 1 else [nbytes]
        # share of a minibatch's work done when bucket b is ready
        self.produced = produced_shares(sizes, cl["compute"]["backward_fraction"], nbytes)
        self.bucket_share = [b / nbytes for b in sizes]
        # layer-wise pull: per piece in forward order (the reverse of backward's), the share of the
        # bytes still to come when it has arrived and the forward share of the pieces before it
        pull = srv.get("pull", "whole")
        # layerwise-random: each pull sends its pieces in a fresh random order (module doc)
        self.pull_rng = np.random.default_rng(np.random.SeedSequence([int(point["seed"]), seeds.SERVER_APPLY,
                                                                       PULL_ORDER])) \
            if pull == "layerwise-random" else None
        self.shared_pull = pull == "layerwise-shared"
        self.forward_fraction = 1.0 - cl["compute"]["backward_fraction"]
        # (share of the bytes, forward share of the pieces before it), forward order; [] for one piece
        self.pull_pieces = pull_pieces(point, nbytes) if pull != "whole" else []
        # replicated: the pushes are the pull's pieces in backward order (module doc); with one piece
        # the mode is the whole pull
        self.replicated = pull == "replicated" and len(self.pull_pieces) > 1
        if self.replicated:
            backward = self.pull_pieces[::-1]
            bf = cl["compute"]["backward_fraction"]
            self.produced = [(1.0 - bf) + bf * (1.0 - before) for _, before in backward[:-1]]
            self.bucket_share = [share for share, _ in backward]
        # replicated: when every learner's push of each piece (forward order) has been applied, this round
        self.piece_barrier = [0.0] * len(self.pull_pieces)
        self.bucket_done = [0.0] * lam   # latest processing end of a learner's buckets so far
        self.bucket_apply: list[list[float]] = [[] for _ in range(lam)]  # its apply draws, per shard
        self.link_in = [FifoServer(f"server{s}.in") for s in range(self.S)]
        self.link_out = [FifoServer(f"server{s}.out") for s in range(self.S)]
        self.queue = [FifoServer(f"server{s}.apply") for s in range(self.S)]
        rng = np.random.default_rng(np.random.SeedSequence([int(point["seed"]), seeds.SERVER_APPLY]))
        self.apply_draw = DrawStream(sampler(srv["apply_distribution"], srv["apply_s"], 0.0, rng))
        self.group = srv["group_size"]
        # a learner's gradient goes straight to the server (not in buckets, nor through a shared
        # NIC or an aggregator)
        self.plain = not (self.produced or self.g > 1 or self.group > 1)
        self.one_link = self.S == 1 and self.g == 1  # the weights cross one link: the server's NIC out
        self.agg_links = [FifoServer(f"aggregator{a}.in") for a in range(math.ceil(lam / self.group))]
        self.agg_pending: list[list[tuple[int, int, int, int]]] = [[] for _ in self.agg_links]
        self.agg_inflight = [0] * len(self.agg_links)
        self.agg_arrive = [0.0] * len(self.agg_links)
        self.clocks = learner_clocks(point, lam)
        self.env = simpy.Environment()
        self._schedule: Callable[[Wake, int, float], None] = self.env.schedule  # type: ignore[assignment]
        self._queue, self._ids = event_queue(self.env)
        self.wakes = [Wake(self._send, None) for _ in range(lam)]  # each learner's, re-armed (_pull)
        self._on_send: list[Callable[[Wake], None]] = [self._send]
        self._on_processed: list[Callable[[Wake], None]] = [self._processed_one]
        self.compute_s = 0.0
        self.end_time = 0.0

    # -- learner side ---------------------------------------------------------------------
    def _pull_all(self, learners: list[int], now: float) -> None:
        """Learners ``learners``, released together, receive the weights sent ``now``."""
        if self.pull_pieces and len(learners) > 1:
            arrivals = self._reserve_pieces(learners, now)
            for r in learners:
                self._pull(r, now, arrivals[r])
        else:
            for r in learners:
                self._pull(r, now)

    def _reserve_pieces(self, learners: list[int], now: float) -> dict[int, list[float]]:
        """Layer-wise pull: each learner's k-th piece (forward order, or its own random order) to each
        of ``learners`` in turn, over the server's NICs out (and the node's NIC in); when each piece,
        indexed in forward order, reaches each learner."""
        if self.replicated:
            return self._replicated_pieces(learners)
        if self.shared_pull:
            return self._share_pieces(learners, now)
        n = len(self.pull_pieces)
        if self.pull_rng is None:
            order = {i: range(n) for i in learners}
        else:
            order = {i: self.pull_rng.permutation(n).tolist() for i in learners}
        out: dict[int, list[float]] = {i: [0.0] * n for i in learners}
        for k in range(n):
            for i in learners:
                b = order[i][k]
                share = self.pull_pieces[b][0]
                end = max(link.reserve(now, self.tx * share) for link in self.link_out)
                if self.g > 1:
                    end = max(end, self.node_in[i // self.g].reserve(now, self.node_tx * share))
                out[i][b] = end + self.lat
        return out

    def _pull_links(self, learners: list[int]) -> list[tuple[FifoServer, float, list[int]]]:
        """The links a pull to ``learners`` crosses, each with its transfer time of the whole model
        and the learners it carries: every server NIC out (all of them), and with shared nodes
        (``group_size`` > 1) each node's NIC in (its members)."""
        batches = [(link, self.tx, learners) for link in self.link_out]
        if self.g > 1:
            nodes: dict[int, list[int]] = {}
            for i in learners:
                nodes.setdefault(i // self.g, []).append(i)
            batches += [(self.node_in[node], self.node_tx, members) for node, members in nodes.items()]
        return batches

    def _share_pieces(self, learners: list[int], now: float) -> dict[int, list[float]]:
        """Layer-wise shared pull: every piece to every one of ``learners`` starts ``now``; each link
        shares the pieces it carries equally (module doc); when each piece, indexed in forward order,
        reaches each learner."""
        n = len(self.pull_pieces)
        shares = [self.pull_pieces[b][0] for b in range(n)]
        out: dict[int, list[float]] = {i: [0.0] * n for i in learners}
        batches = self._pull_links(learners)
        for link, tx, members in batches:
            durations = [tx * share for _ in members for share in shares]
            start = max(now, link.free_at)
            link.reserve(now, sum(durations))
            ends = processor_sharing_ends(start, durations)
            for k, i in enumerate(members):
                arrive = out[i]
                for b in range(n):
                    e = ends[k * n + b] + self.lat
                    if e > arrive[b]:
                        arrive[b] = e
        return out

    def _replicated_pieces(self, learners: list[int]) -> dict[int, list[float]]:
        """Replicated pull: each piece to every one of ``learners`` from its barrier on (when every
        learner's push of it has been applied), the pieces in the order of their barriers; on each link
        a piece's m equal transfers share it, so all end together m transfer times after the link is
        free, as the shared pull's processor sharing ends equal transfers (module doc); when each piece,
        indexed in forward order, reaches each learner. Starts the next round's barriers."""
        n = len(self.pull_pieces)
        out: dict[int, list[float]] = {i: [0.0] * n for i in learners}
        batches = self._pull_links(learners)
        barrier = self.piece_barrier
        for b in sorted(range(n), key=lambda b: (barrier[b], b)):
            share = self.pull_pieces[b][0]
            for link, tx, members in batches:
                e = link.reserve(barrier[b], len(members) * tx * share) + self.lat
                for i in members:
                    if e > out[i][b]:
                        out[i][b] = e
        self.piece_barrier = [0.0] * n
        return out

    def _pull(self, i: int, now: float, arrivals: list[float] | None = None) -> None:
        """Learner ``i`` receives the current weights (sent ``now``) and starts computing.

        A message crossing two links (the server's NIC, then the node's NIC shared by
        ``gpus_per_node`` learners) is modelled cut-through: both are reserved when it is
        sent, and it arrives when the later one is done, plus the latency.

        The learner's compute-done event (and, on the plain path, its processed event) is
        its own :class:`Wake`, re-armed each time: a learner has at most one of them pending.
        With a layer-wise pull the pieces arrive at ``arrivals`` (reserved by :meth:`_pull_all`
        for learners released together, else here) and the compute starts as the module doc says."""
        if self.pull_pieces:
            if arrivals is None:
                arrivals = self._reserve_pieces([i], now)[i]
            t = max(arrivals) if self.replicated else arrivals[-1]
        elif self.one_link:
            t = self.link_out[0].reserve(now, self.tx) + self.lat
        else:
            tx = self.tx
            done = max(link.reserve(now, tx) for link in self.link_out)
            if self.g > 1:
                done = max(done, self.node_in[i // self.g].reserve(now, self.node_tx))
            t = done + self.lat
        j = self.core.version
        k = self._assign(i)
        if k < 0:
            if self.group > 1:
                self._maybe_forward(i // self.group, now)
            return
        if self.group > 1:
            self.agg_inflight[i // self.group] += 1
        clock = self.clocks[i]
        work = clock.draws.next()
        self.compute_s += work
        if arrivals is not None and not self.replicated:
            t = self._forward_start(arrivals, work)
        if self.produced:  # backward produces the buckets one by one: each is pushed when ready
            marks = clock.finish_many(t, [work * f for f in self.produced] + [work])
            self.bucket_done[i] = 0.0
            self.bucket_apply[i] = [self.apply_draw.next() for _ in range(self.S)]
            for b, m in enumerate(marks[:-1]):
                delay = m - now if m > now else 0.0
                self._schedule(Wake(self._bucket, (i, b, now + delay)), NORMAL, delay)
            end = marks[-1]
        elif clock.stall_free:
            end = t + work
        else:
            end = clock.finish(t, work)
        delay = end - now
        if delay < 0:
            delay = 0.0
        wake = self.wakes[i]
        wake.callbacks = self._on_send
        wake.payload = (i, j, k, t, now + delay)
        heappush(self._queue, (now + delay, NORMAL, next(self._ids), wake))

    def _forward_start(self, arrivals: list[float], work: float) -> float:
        """When a learner whose pieces arrive at ``arrivals`` starts ``work`` seconds of compute
        under a layer-wise pull: the latest ``arrival_b − F · C_{b−1}`` (module doc)."""
        forward = self.forward_fraction * work
        start = -math.inf
        for arrive, (_, before) in zip(arrivals, self.pull_pieces):
            s = arrive - forward * before
            if s > start:
                start = s
        return start

    def _bucket(self, ev: Wake) -> None:
        i, b, now = ev.payload
        share = self.bucket_share[b]
        self._deliver(now, i, b, share, [a * share for a in self.bucket_apply[i]], None)

    def _bucket_done(self, i: int, done: float) -> None:
        if done > self.bucket_done[i]:
            self.bucket_done[i] = done

    def _send(self, ev: Wake) -> None:
        i, j, k, t0, now = ev.payload
        gop = self._gradient(i, j, k, t0, now)
        if self.plain:  # straight to the server; processed: the learner's wake again
            if self.S == 1:  # (_at_shards of one shard, inlined: the hot path)
                done = self.queue[0].reserve(self.link_in[0].reserve(now, self.tx) + self.lat, self.apply_draw.next())
            else:
                done = self._at_shards(now)
            delay = done - now
            if delay < 0:
                delay = 0.0
            ev.callbacks = self._on_processed
            ev.payload = (i, gop, j, self.mu, now + delay)
            heappush(self._queue, (now + delay, NORMAL, next(self._ids), ev))
            return
        item = (i, gop, j, self.mu)
        if self.group == 1:
            self._push_shared(now, item)
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
        if self.core.forward_due(a, len(pend), self.agg_inflight[a]):
            self.agg_pending[a] = []
            at(self.env, max(self.agg_arrive[a], now), self._forward, pend)

    def _forward(self, ev: Wake) -> None:
        now = self.env.now
        delay = self._at_shards(now) - now
        if delay < 0:
            delay = 0.0
        self._schedule(Wake(self._processed_many, (ev.payload, now + delay)), NORMAL, delay)

    def _push_shared(self, now: float, item: Any) -> None:
        """A learner's gradient leaves ``now`` through its node's NIC, or as its last bucket."""
        if self.produced:  # the last bucket; the push is processed when every bucket is
            share = self.bucket_share[-1]
            self._deliver(now, item[0], len(self.bucket_share) - 1, share,
                          [a * share for a in self.bucket_apply[item[0]]], item)
        else:
            self._deliver(now, item[0], 0, 1.0, [self.apply_draw.next() for _ in range(self.S)], item)

    def _at_shards(self, now: float) -> float:
        """A whole push (one gradient or one aggregated message) leaves for every shard ``now``:
        when the last shard has processed it (each shard's NIC in, latency, then its apply)."""
        tx, lat, draw = self.tx, self.lat, self.apply_draw
        if self.S == 1:
            return self.queue[0].reserve(self.link_in[0].reserve(now, tx) + lat, draw.next())
        return max(q.reserve(link.reserve(now, tx) + lat, draw.next())
                   for q, link in zip(self.queue, self.link_in))

    def _deliver(self, now: float, i: int, b: int, share: float, apply_s: list[float], item: Any) -> None:
        """Learner ``i`` sends bucket ``b``, ``share`` of its gradient, to every shard ``now``
        (``apply_s[s]`` seconds of apply each): through its node's NIC first when it shares one (the
        server's NICs are reserved when it starts leaving the node, an event). ``item``: the push it
        completes (the last bucket), or None (an earlier bucket)."""
        if self.g == 1:
            self._at_server(now, i, b, share, apply_s, item)
            return
        tx = self.node_tx * share
        leave = self.node_out[i // self.g].reserve(now, tx) - tx
        delay = leave - now if leave > now else 0.0
        self._schedule(Wake(self._leave_node, (i, b, share, apply_s, item, now + delay)), NORMAL, delay)

    def _leave_node(self, ev: Wake) -> None:
        i, b, share, apply_s, item, now = ev.payload
        self._at_server(now, i, b, share, apply_s, item)

    def _at_server(self, now: float, i: int, b: int, share: float, apply_s: list[float], item: Any) -> None:
        tx, lat = self.tx * share, self.lat
        done = 0.0
        for q, link, a in zip(self.queue, self.link_in, apply_s):
            e = q.reserve(link.reserve(now, tx) + lat, a)
            if e > done:
                done = e
        if self.replicated:  # bucket b is piece n − 1 − b of the forward order
            p = len(self.piece_barrier) - 1 - b
            if done > self.piece_barrier[p]:
                self.piece_barrier[p] = done
        if item is None:
            self._bucket_done(i, done)
            return
        if done < self.bucket_done[i]:  # processed when every bucket is
            done = self.bucket_done[i]
        delay = done - now
        if delay < 0:
            delay = 0.0
        self._schedule(Wake(self._processed_one, (*item, now + delay)), NORMAL, delay)

    # -- server side ------------------------------------------------------------------------
    def _processed_one(self, ev: Wake) -> None:
        i, gop, j, size, now = ev.payload
        self.end_time = now
        released = self._push_one(i, gop, j, size, now)
        if self.pull_pieces:
            self._pull_all(released, now)
            return
        for r in released:
            self._pull(r, now)

    def _processed_many(self, ev: Wake) -> None:
        items, now = ev.payload
        self.end_time = now
        released = self.core.push(items, now)
        if self.pull_pieces:
            self._pull_all(released, now)
            return
        for i in released:
            self._pull(i, now)

    def run(self) -> TraceBuilder:
        """Simulate to the end; the trace ends with an eval of the final weights."""
        self.core.begin()
        if self.pull_pieces:
            self._pull_all(list(range(self.lam)), 0.0)
        else:
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
