"""Decentralized protocols run for real over ``torch.distributed``: allreduce, sgp, dpsgd, adpsgd.

Every rank is a node with its own (x, w). A node is a loop of sends and receives around the
simulator's rules (:mod:`ddlsim.simulator.protocols.gossip_rules`: who sends to whom at
iteration k, with which weights, when a node may go on), and the ops it records use the
simulator's encoding (:class:`~ddlsim.simulator.protocols.GossipRecorder`), so the replay
backend reproduces the live weights and the trace's structure is the simulator's:

* ``allreduce``: iteration k: every node's grad on its own state (i, k) with the
  ``global_slice`` minibatch; the gradients are summed with ``all_reduce`` and every node
  takes the same optimizer step with the rules' weights (``allreduce_weights``: 1/N each);
  the trace holds that as one apply on node 0 (all N gradients at those weights) and a copy
  mix (src 0, coef 1, self 0) on every other node.
* ``sgp`` with overlap τ (``protocol.overlap``): grad at x/w, apply, send the post-apply state
  and the node's share to the rules' out-peers (``isend``, waited only at the end), keep one
  share (a mix of coef 0, self_coef = the share); every expected message has its own ``irecv``
  (:class:`SGPInbox`); at the boundary of iteration k the held messages of iterations ≤ k are
  mixed (coef = the share the message carries, self_coef 1), and the node starts k + 1 when
  every message of iterations ≤ k − τ is in, mixing on arrival while it waits: the rules'
  ``sgp_mix_at_boundary``, ``sgp_advance``, ``sgp_may_advance`` and ``sgp_mix_on_arrival``,
  as the SimPy engine calls them. A message carries x and a float64 header [sender version,
  w, share].
* ``dpsgd``, the simulator's two schedules: ``overlap`` 0 (default, blocking): compute the
  gradient, step, send the stepped state to this iteration's neighbours in the rules' send
  order (``isend``), receive theirs, mix in the rules' order with their coefficients (the
  first mix also scales the own state by ``W[i, i]``); ``overlap`` 1: send the current state
  while computing the gradient at it, mix, then apply: ``x ← Σ_j W_ij x_j − α·g(x_i)``.
* ``adpsgd``: :mod:`.live_adpsgd` (active nodes average with the passive partner the seeded
  picks name; a passive node answers from a server thread while it computes).

Each node logs its ops with ``time.monotonic()`` (one clock per machine) and node 0
merges the logs by time into one trace after the run.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from ..simulator import trace as trace_io
from ..simulator.compute import learner_clocks, stragglers
from ..simulator.dataorder import SampleStream, global_slice_start, shard_start
from ..simulator.protocols import (GLOBAL_SLICE, SHARD, GossipRecorder, clean_point, header_for, iterations,
                                   live_refusal)
from ..simulator.protocols.gossip_rules import (KEPT_COEF, RECEIVED_SELF_COEF, DPSGDRules, SGPRules,
                                                allreduce_weights, sgp_advance, sgp_may_advance,
                                                sgp_mix_at_boundary, sgp_mix_on_arrival)
from .base import BackendError
from .optim import Optimizer
from .flatmodel import FlatModel
from .live_adpsgd import adpsgd
from .live_faults import Heartbeat, fail_if_due
from .workloads import build_model, load_data

class Node:
    """One node's model, data, compute clock and op log."""

    def __init__(self, point: dict[str, Any], rank: int) -> None:
        self.point, self.i = point, rank
        self.n, self.mu = point["cluster"]["learners"], point["cluster"]["minibatch"]
        self.spe = point["workload"]["samples_per_epoch"]
        self.emulated = point["live"]["compute"] == "emulated"
        self.clock = learner_clocks(point, self.n)[rank]
        self.slowdown = point["cluster"]["stragglers"]["slowdown"] if rank in stragglers(point, self.n) else 1.0
        if self.emulated:
            self.x = torch.zeros(point["workload"]["param_count"])
        else:
            model = build_model(point)
            self.x = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
            self.flat = FlatModel(model)
            self.data = load_data(point, point.get("_data_dir"))
            self.stream = SampleStream(point["seed"], self.spe)
        self.w = 1.0
        self.computed = 0
        self.version = 0
        self.opt = Optimizer(point["optimizer"], 0.0)
        self.log: list[tuple] = []  # (time, kind, fields...)
        self.heartbeat: Heartbeat | None = None

    def gradient(self, start: int, state: tuple[torch.Tensor, float] | None = None
                 ) -> tuple[torch.Tensor, float, float]:
        """(gradient at x/w, t_start, t_end) for the minibatch at stream position ``start``, at
        ``state`` = (x, w) when given (a state read earlier), else at the node's own;
        ``live.fail_learner`` = this node fails after ``live.fail_after`` gradients
        (:func:`.live_faults.fail_if_due`); each finished gradient beats the heartbeat."""
        x, w = state if state is not None else (self.x, self.w)
        fail_if_due(self.point["live"], self.i, self.computed)
        self.computed += 1
        t0 = time.monotonic()
        if self.emulated:
            end = self.clock.finish(t0, self.clock.draws.next())
            g = torch.zeros_like(x)
        else:
            idx = torch.from_numpy(self.stream.indices(start, self.mu) % len(self.data.train_y))
            z = x if w == 1.0 else x / w
            g, _ = self.flat.grad(z.clone(), self.data.train_x[idx], self.data.train_y[idx])
            end = self.clock.finish(t0, (time.monotonic() - t0) * self.slowdown)
        delay = end - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        if self.heartbeat is not None:
            self.heartbeat.beat(self.computed)
        return g, t0, time.monotonic()


def node(point: dict[str, Any], rank: int, out: str) -> None:
    """Run node ``rank`` to the end; node 0 writes ``trace.ddlt`` and ``weights.pt``."""
    refusal = live_refusal(point)
    if refusal:
        raise BackendError(refusal)
    me = Node(point, rank)
    me.heartbeat = Heartbeat(out, rank)
    dist.barrier()
    epoch0 = time.monotonic()
    K = iterations(point)
    proto = point["protocol"]["name"]
    if proto == "allreduce":
        _allreduce(me, K)
    elif proto == "dpsgd":
        _dpsgd(me, K)
    elif proto == "adpsgd":
        adpsgd(me, K)
    else:
        _sgp(me, K)
    _gather_and_write(me, K, epoch0, out)


def _wait(work: dist.Work | None) -> None:
    """Wait for a point-to-point request (``isend``/``irecv`` in the default group return one)."""
    assert work is not None
    work.wait()


def _allreduce(me: Node, K: int) -> None:
    n, mu = me.n, me.mu
    weights = allreduce_weights(n)
    for k in range(K):
        start = global_slice_start(k, me.i, n, mu)
        g, t0, t1 = me.gradient(start)
        me.log.append((t1, "grad", me.i, me.version, start, k, t0))
        total = g.clone()
        dist.all_reduce(total)
        samples = (k + 1) * n * mu
        _, lr = me.opt.apply_rate(samples / me.spe, weights, [0] * n)  # the trace's apply
        me.x = me.opt.step(0, me.x, total / n, lr)  # the sum at equal weights 1/n
        me.version += 1
        me.log.append((time.monotonic(), "round", k, weights))


class Message(NamedTuple):
    """A received SGP message: the sender's iteration ``k``, rank ``src``, its state ``x`` of
    ``version`` with weight ``w``, and the ``share`` (the mix's coef) its rules gave it."""

    k: int
    src: int
    version: int
    w: float
    share: float
    x: torch.Tensor


class SGPInbox:
    """Node ``i``'s SGP messages, each received by its own ``irecv`` pair (header, state).

    :meth:`post_through` posts the receives of the messages of iterations ≤ k (in iteration
    order); gloo's requests cannot be tested without blocking, so one waiter thread per
    sender waits for that sender's posted receives in order and hands each message over
    when it is in: :meth:`arrived` (what is in now, without blocking) and :meth:`next` (the
    next message, blocking). A failed receive (a timeout, a peer gone) ends its sender's
    waiter; :meth:`next` raises when no other sender's posted receive is still pending, the
    last failure first (this node's own timeout rather than a peer's earlier exit).
    """

    def __init__(self, rules: SGPRules, i: int, K: int, like: torch.Tensor) -> None:
        self.expected = [(k, j) for k in range(K) for j in rules.senders(i, k)]
        self.posted = 0
        self.remaining = len(self.expected)
        self.like = like
        self.inbox: queue.SimpleQueue[Message | tuple[int, BaseException]] = queue.SimpleQueue()
        self.to_wait: dict[int, queue.SimpleQueue[Any]] = {}
        self.pending: dict[int, int] = {}  # per sender: receives posted, not yet handed over
        self.failed: dict[int, BaseException] = {}

    def post_through(self, k_last: int) -> None:
        """Post the receives of every expected message of iterations ≤ ``k_last``."""
        while self.posted < len(self.expected) and self.expected[self.posted][0] <= k_last:
            k, j = self.expected[self.posted]
            self.posted += 1
            h, xs = torch.zeros(3, dtype=torch.float64), torch.zeros_like(self.like)
            if j not in self.to_wait:
                self.to_wait[j] = queue.SimpleQueue()
                self.pending[j] = 0
                threading.Thread(target=self._wait_for, args=(j, self.to_wait[j]), daemon=True,
                                 name=f"sgp-recv-{j}").start()
            self.pending[j] += 1
            self.to_wait[j].put((k, h, xs, dist.irecv(h, j, tag=2 * k), dist.irecv(xs, j, tag=2 * k + 1)))

    def _wait_for(self, j: int, posted: queue.SimpleQueue[Any]) -> None:
        while True:
            item = posted.get()
            if item is None:
                return
            k, h, xs, rh, rx = item
            try:
                _wait(rh)
                _wait(rx)
            except BaseException as e:  # handed to the node's loop
                self.inbox.put((j, e))
                return
            self.inbox.put(Message(k, j, int(h[0]), float(h[1]), float(h[2]), xs))

    def _take(self, got: Message | tuple[int, BaseException]) -> Message | None:
        if isinstance(got, Message):
            self.remaining -= 1
            self.pending[got.src] -= 1
            return got
        self.failed[got[0]] = got[1]
        return None

    def arrived(self) -> list[Message]:
        """The messages in now, in arrival order (no waiting)."""
        out: list[Message] = []
        while True:
            try:
                got = self._take(self.inbox.get_nowait())
            except queue.Empty:
                return out
            if got is not None:
                out.append(got)

    def next(self) -> Message:
        """The next message to arrive (waits for it)."""
        while True:
            if self.failed and not any(n for j, n in self.pending.items() if j not in self.failed):
                raise list(self.failed.values())[-1]
            if not any(self.pending.values()):  # nothing posted is still to come: waiting would hang
                raise RuntimeError("SGP node waited for a message no peer sends (the receive plan and the "
                                   "advance rule disagree)")
            got = self._take(self.inbox.get())
            if got is not None:
                return got

    def close(self) -> None:
        """Stop the waiter threads (every message is in)."""
        for posted in self.to_wait.values():
            posted.put(None)


def _sgp(me: Node, K: int) -> None:
    """SGP with overlap τ around the rules: iteration k: grad at x/w, apply, send the stepped
    state and the share to the out-peers (``isend``, never waited before the end), keep one
    share; at the boundary mix the held messages of iterations ≤ k (``sgp_mix_at_boundary``);
    start k + 1 when every message of iterations ≤ k − τ is in (``sgp_advance``,
    ``sgp_may_advance``), mixing while waiting what arrives of iterations ≤ k
    (``sgp_mix_on_arrival``); after the last iteration mix everything as it arrives."""
    rules = SGPRules.of_point(me.point)
    n, mu, i, tau = me.n, me.mu, me.i, rules.tau
    inbox = SGPInbox(rules, i, K, me.x)
    arrived = [0] * (n * K)  # sgp_advance's ring, K slots per node (never wrapped); row i is ours
    indeg = [d for row in rules.indeg for d in row]
    complete = -1  # every message of iterations ≤ complete is in
    held: list[Message] = []
    sends: list[dist.Work | None] = []

    def count(msg: Message) -> int:
        arrived[i * K + msg.k] += 1
        return sgp_advance(arrived, K, complete, K, indeg, rules.phases, n, i)

    def mix(msg: Message) -> None:
        sc = RECEIVED_SELF_COEF
        me.x = torch.add(me.x if sc == 1.0 else me.x * sc, msg.x, alpha=msg.share)  # = the replay's mix
        me.w = sc * me.w + msg.share * msg.w
        me.log.append((time.monotonic(), "mix", i, me.version, msg.src, msg.version, msg.share, sc))
        me.version += 1

    for k in range(K):
        inbox.post_through(min(K - 1, k + tau + 1))  # those a peer ahead of us may send meanwhile
        start = shard_start(k, i, n, mu, me.spe)
        g, t0, t1 = me.gradient(start)
        me.log.append((t1, "grad", i, me.version, start, k, t0))
        # the learning rate follows this node's own progress; the trace records that epoch
        epoch = (k + 1) * n * mu / me.spe
        me.x = me.opt.step(i, me.x, g, me.opt.apply_rate(epoch, [1.0], [0])[1], me.w)
        me.log.append((time.monotonic(), "apply", me.version, epoch, 0))
        me.version += 1
        c = rules.share(i, k)
        sent_version, sent_x, sent_w = me.version, me.x, me.w  # me.x is replaced below, never written in place
        header = torch.tensor([sent_version, sent_w, c], dtype=torch.float64)
        for j in rules.sends(i, k):
            sends.append(dist.isend(header, j, tag=2 * k))
            sends.append(dist.isend(sent_x, j, tag=2 * k + 1))
        # keep one share: x ← KEPT_COEF·x_i(sent) + c·x (= c·x)
        me.x, me.w = me.x * c, me.w * c
        me.log.append((time.monotonic(), "mix", i, me.version, i, sent_version, KEPT_COEF, c))
        me.version += 1
        # the boundary of iteration k: what came in while computing is held, then mixed if its
        # iteration is ≤ k
        for msg in inbox.arrived():
            complete = count(msg)
            held.append(msg)
        keep = []
        for msg in held:
            if sgp_mix_at_boundary(msg.k, k):
                mix(msg)
            else:
                keep.append(msg)
        held = keep
        # as the engine at a boundary: iterations in which this node receives nothing count as in
        complete = sgp_advance(arrived, K, complete, K, indeg, rules.phases, n, i)
        while not sgp_may_advance(complete, k, tau):
            msg = inbox.next()
            complete = count(msg)
            if sgp_mix_on_arrival(msg.k, k):
                mix(msg)
            else:
                held.append(msg)
    inbox.post_through(K - 1)
    for msg in held:  # none: the last boundary mixed every held message
        mix(msg)
    while inbox.remaining:  # finished: every message is mixed on arrival
        mix(inbox.next())
    inbox.close()
    for r in sends:
        _wait(r)


def _dpsgd(me: Node, K: int) -> None:
    """D-PSGD with the simulator's two schedules (``protocol.overlap``): 0, step then exchange
    the stepped states (blocking); 1, exchange the current states while computing, mix, step."""
    rules = DPSGDRules.of_point(me.point)
    n, mu, i = me.n, me.mu, me.i

    def step(g: torch.Tensor, k: int) -> None:
        epoch = (k + 1) * n * mu / me.spe
        me.x = me.opt.step(i, me.x, g, me.opt.apply_rate(epoch, [1.0], [0])[1], me.w)
        me.log.append((time.monotonic(), "apply", me.version, epoch, 0))
        me.version += 1

    for k in range(K):
        plan = rules.mixes(i, k)
        start = shard_start(k, i, n, mu, me.spe)
        if rules.blocking:
            v = me.version
            g, t0, t1 = me.gradient(start)
            me.log.append((t1, "grad", i, v, start, k, t0))
            step(g, k)
        v, sent_x = me.version, me.x  # me.x is replaced below, never written in place
        header = torch.tensor([v, me.w], dtype=torch.float64)
        reqs = []
        for j in rules.sends(i, k):
            reqs.append(dist.isend(header, j, tag=2 * k))
            reqs.append(dist.isend(sent_x, j, tag=2 * k + 1))
        # receives posted before computing: gloo moves the states while the gradient runs
        inbox = [(torch.zeros(2, dtype=torch.float64), torch.zeros_like(me.x)) for _ in plan]
        recvs = [(dist.irecv(h, j, tag=2 * k), dist.irecv(xs, j, tag=2 * k + 1))
                 for (j, _, _), (h, xs) in zip(plan, inbox)]
        if not rules.blocking:
            g, t0, t1 = me.gradient(start)
            me.log.append((t1, "grad", i, v, start, k, t0))
        for (j, wij, sc), (h, xs), (rh, rx) in zip(plan, inbox, recvs):
            _wait(rh)
            _wait(rx)
            me.x = torch.add(me.x if sc == 1.0 else me.x * sc, xs, alpha=wij)  # = the replay's mix
            me.w = sc * me.w + wij * float(h[1])
            me.log.append((time.monotonic(), "mix", i, me.version, j, int(h[0]), wij, sc))
            me.version += 1
        if not rules.blocking:
            step(g, k)
        for r in reqs:
            _wait(r)


def _gather_and_write(me: Node, K: int, epoch0: float, out: str) -> None:
    logs: list[Any] = [None] * me.n
    dist.all_gather_object(logs, me.log)
    finals: list[Any] = [None] * me.n
    dist.all_gather_object(finals, (me.x, me.w))
    if me.i != 0:
        return
    point = me.point
    rec = _merge(point, logs, epoch0)
    header = header_for(point, me.n, GLOBAL_SLICE if point["protocol"]["name"] == "allreduce" else SHARD)
    header.update({"measured": True, "iterations": K, "mean_staleness": 0.0, "replay_point": clean_point(point),
                   "wall_s": max(e[0] for log in logs for e in log) - epoch0})
    trace_io.write(rec.tb.build(header), os.path.join(out, "trace.ddlt"))
    torch.save(torch.stack([x / w for x, w in finals]), os.path.join(out, "weights.pt"))


def _merge(point: dict[str, Any], logs: list[list[tuple]], epoch0: float) -> GossipRecorder:
    """One trace from the nodes' logs, in time order, written through the simulator's
    encoding (:class:`~ddlsim.simulator.protocols.GossipRecorder`; allreduce round by round).
    An apply records the epoch the node's learning rate followed (its own progress)."""
    rec = GossipRecorder(point)
    rec.begin()
    if point["protocol"]["name"] == "allreduce":
        n = rec.n
        for k in range(rec.K):
            grads = [logs[i][2 * k] for i in range(n)]
            t = max(logs[i][2 * k + 1][0] for i in range(n)) - epoch0
            rec.allreduce_round(k, [g[6] - epoch0 for g in grads], [g[0] - epoch0 for g in grads], t,
                                logs[0][2 * k + 1][3])
    else:
        events = sorted(((e[0], i, s, e) for i, log in enumerate(logs) for s, e in enumerate(log)))
        last_grad: dict[int, int] = {}
        for t_abs, i, _, e in events:
            t = t_abs - epoch0
            if e[1] == "grad":
                _, _, _, v, _, k, t0 = e
                last_grad[i] = rec.grad(i, k, v, t0 - epoch0, t)
            elif e[1] == "apply":
                rec.apply(i, last_grad.pop(i), e[4], t, epoch=e[3])
            else:
                _, _, _, _, src, src_v, coef, self_coef = e
                rec.mix(i, src, src_v, coef, self_coef, t, t)
    rec.finish(max(e[0] for log in logs for e in log) - epoch0)
    return rec
