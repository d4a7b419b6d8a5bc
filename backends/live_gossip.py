"""Decentralized protocols run for real over ``torch.distributed``: allreduce, sgp, dpsgd.

Every rank is a node with its own (x, w). The ops each node records use the simulator's
encoding (``simulator/gossip.py``), so the replay backend reproduces the live weights:

* ``allreduce``: iteration k: every node's grad on its own state (i, k) with the
  ``global_slice`` minibatch; the gradients are summed with ``all_reduce`` and every node
  takes the same optimizer step; the trace holds that as one apply on node 0 (all N
  gradients, weight 1/N) and a copy mix (src 0, coef 1, self 0) on every other node.
* ``sgp`` (synchronous, overlap 0): grad at x/w, apply, keep one share
  (self_coef 1/(d+1)), send the post-apply state to this iteration's out-peers
  (``isend``, non-blocking), receive the in-peers' (blocking ``irecv`` + wait), mix each
  (coef 1/(d+1)). A message carries x and a float64 header [sender version, w].
* ``dpsgd``, the simulator's two schedules: ``overlap`` 0 (default, blocking): compute the
  gradient, step, send the stepped state to this iteration's neighbours of the symmetric
  graph (``isend``), receive theirs, mix with the Metropolis weights (the first mix also
  scales the own state by ``W[i, i]``); ``overlap`` 1: send the current state while
  computing the gradient at it, mix, then apply: ``x ← Σ_j W_ij x_j − α·g(x_i)``.

Each node logs its ops with ``time.monotonic()`` (one clock per machine) and node 0
merges the logs by time into one trace after the run.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from ..simulator import trace as trace_io
from ..simulator.compute import learner_clocks, stragglers
from ..simulator.dataorder import SampleStream, global_slice_start, shard_start
from ..simulator.mixing import share, symmetric_weights
from ..simulator.protocols import (GLOBAL_SLICE, SHARD, GossipRecorder, clean_point, header_for, iterations,
                                   live_refusal)
from ..simulator.topology import in_peers, out_peers, period, symmetric_topology
from .base import BackendError
from .optim import Optimizer
from .flatmodel import FlatModel
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

    def gradient(self, start: int) -> tuple[torch.Tensor, float, float]:
        """(gradient at x/w, t_start, t_end) for the minibatch at stream position ``start``;
        ``live.fail_learner`` = this node fails after ``live.fail_after`` gradients
        (:func:`.live_faults.fail_if_due`); each finished gradient beats the heartbeat."""
        fail_if_due(self.point["live"], self.i, self.computed)
        self.computed += 1
        t0 = time.monotonic()
        if self.emulated:
            end = self.clock.finish(t0, self.clock.draws.next())
            g = torch.zeros_like(self.x)
        else:
            idx = torch.from_numpy(self.stream.indices(start, self.mu) % len(self.data.train_y))
            z = self.x if self.w == 1.0 else self.x / self.w
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
    else:
        _sgp(me, K)
    _gather_and_write(me, K, epoch0, out)


def _allreduce(me: Node, K: int) -> None:
    n, mu = me.n, me.mu
    for k in range(K):
        start = global_slice_start(k, me.i, n, mu)
        g, t0, t1 = me.gradient(start)
        me.log.append((t1, "grad", me.i, me.version, start, k, t0))
        total = g.clone()
        dist.all_reduce(total)
        samples = (k + 1) * n * mu
        _, lr = me.opt.apply_rate(samples / me.spe, [1.0 / n] * n, [0] * n)  # the trace's apply
        me.x = me.opt.step(0, me.x, total / n, lr)
        me.version += 1
        me.log.append((time.monotonic(), "round", k))


def _sgp(me: Node, K: int) -> None:
    proto = me.point["protocol"]
    topo, peers = proto["topology"], proto["peers"]
    n, mu, i = me.n, me.mu, me.i
    for k in range(K):
        start = shard_start(k, i, n, mu, me.spe)
        g, t0, t1 = me.gradient(start)
        me.log.append((t1, "grad", i, me.version, start, k, t0))
        # the learning rate follows this node's own progress; the trace records that epoch
        epoch = (k + 1) * n * mu / me.spe
        me.x = me.opt.step(i, me.x, g, me.opt.apply_rate(epoch, [1.0], [0])[1], me.w)
        me.log.append((time.monotonic(), "apply", me.version, epoch))
        me.version += 1
        outs, ins = out_peers(topo, i, k, n, peers), in_peers(topo, i, k, n, peers)
        c = share(len(outs))
        sent_version, sent_x, sent_w = me.version, me.x, me.w
        reqs = []
        header = torch.tensor([sent_version, sent_w], dtype=torch.float64)
        for j in outs:
            reqs.append(dist.isend(header, j, tag=2 * k))
            reqs.append(dist.isend(sent_x, j, tag=2 * k + 1))
        me.x, me.w = me.x * c, me.w * c
        me.log.append((time.monotonic(), "mix", i, me.version, i, sent_version, 0.0, c))
        me.version += 1
        for j in ins:
            h, xs = torch.zeros(2, dtype=torch.float64), torch.zeros_like(me.x)
            dist.irecv(h, j, tag=2 * k).wait()
            dist.irecv(xs, j, tag=2 * k + 1).wait()
            src_version, ws = int(h[0]), float(h[1])
            cj = share(len(out_peers(topo, j, k, n, peers)))
            me.x = torch.add(me.x, xs, alpha=cj)
            me.w = me.w + cj * ws
            me.log.append((time.monotonic(), "mix", i, me.version, j, src_version, cj, 1.0))
            me.version += 1
        for r in reqs:
            r.wait()


def _dpsgd(me: Node, K: int) -> None:
    """D-PSGD with the simulator's two schedules (``protocol.overlap``): 0, step then exchange
    the stepped states (blocking); 1, exchange the current states while computing, mix, step."""
    proto = me.point["protocol"]
    topo, peers = proto["topology"], proto["peers"]
    n, mu, i = me.n, me.mu, me.i
    blocking = proto["overlap"] == 0
    phases = period(symmetric_topology(topo), n, peers)

    def step(g: torch.Tensor, k: int) -> None:
        epoch = (k + 1) * n * mu / me.spe
        me.x = me.opt.step(i, me.x, g, me.opt.apply_rate(epoch, [1.0], [0])[1], me.w)
        me.log.append((time.monotonic(), "apply", me.version, epoch))
        me.version += 1

    for k in range(K):
        self_w, pairs = symmetric_weights(topo, i, k % phases, n, peers)
        start = shard_start(k, i, n, mu, me.spe)
        if blocking:
            v = me.version
            g, t0, t1 = me.gradient(start)
            me.log.append((t1, "grad", i, v, start, k, t0))
            step(g, k)
        v, sent_x = me.version, me.x  # me.x is replaced below, never written in place
        header = torch.tensor([v, me.w], dtype=torch.float64)
        order = sorted((j for j, _ in pairs), key=lambda j: (j - i) % n)  # the simulator's send order
        reqs = []
        for j in order:
            reqs.append(dist.isend(header, j, tag=2 * k))
            reqs.append(dist.isend(sent_x, j, tag=2 * k + 1))
        # receives posted before computing: gloo moves the states while the gradient runs
        inbox = [(torch.zeros(2, dtype=torch.float64), torch.zeros_like(me.x)) for _ in pairs]
        recvs = [(dist.irecv(h, j, tag=2 * k), dist.irecv(xs, j, tag=2 * k + 1))
                 for (j, _), (h, xs) in zip(pairs, inbox)]
        if not blocking:
            g, t0, t1 = me.gradient(start)
            me.log.append((t1, "grad", i, v, start, k, t0))
        for m, ((j, wij), (h, xs), (rh, rx)) in enumerate(zip(pairs, inbox, recvs)):
            rh.wait()
            rx.wait()
            sc = self_w if m == 0 else 1.0
            me.x = torch.add(me.x if sc == 1.0 else me.x * sc, xs, alpha=wij)  # = the replay's mix
            me.w = sc * me.w + wij * float(h[1])
            me.log.append((time.monotonic(), "mix", i, me.version, j, int(h[0]), wij, sc))
            me.version += 1
        if not blocking:
            step(g, k)
        for r in reqs:
            r.wait()


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
            rec.allreduce_round(k, [g[6] - epoch0 for g in grads], [g[0] - epoch0 for g in grads], t)
    else:
        events = sorted(((e[0], i, s, e) for i, log in enumerate(logs) for s, e in enumerate(log)))
        last_grad: dict[int, int] = {}
        for t_abs, i, _, e in events:
            t = t_abs - epoch0
            if e[1] == "grad":
                _, _, _, v, _, k, t0 = e
                last_grad[i] = rec.grad(i, k, v, t0 - epoch0, t)
            elif e[1] == "apply":
                rec.apply(i, last_grad.pop(i), 0, t, epoch=e[3])
            else:
                _, _, _, _, src, src_v, coef, self_coef = e
                rec.mix(i, src, src_v, coef, self_coef, t, t)
    rec.finish(max(e[0] for log in logs for e in log) - epoch0)
    return rec
