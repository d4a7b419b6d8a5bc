"""Local SGD, DiLoCo and compressed AllReduce-SGD run for real over ``torch.distributed`` (gloo).

Every rank is a node with its own weights; the steps follow the simulator's schedule
(:func:`schedule`: all-reduce steps first — every step of ``allreduce``, local SGD's
``warmup_steps`` — then local steps with an averaging after every ``H/F`` of them and after
the last), and node 0 merges the nodes' logs through the simulator's encoding
(:class:`~ddlsim.simulator.protocols.local.LocalRecorder`), so the measured trace has the
simulated trace's structure and its replay (:mod:`.replay_local`) reproduces the live weights:

* an **all-reduce step**: every node's gradient on its state; without compression the sum by
  ``all_reduce``, divided by N; with compression the compressed all-reduce of
  :mod:`.compression` on this node's gradient with ``all_reduce`` as its sum (fp16 / bf16:
  the half casts divided by N summed in the half type, DDP's ``fp16_compress_hook``;
  PowerSGD: the uncompressed tensors, all P, all Q, as ``powerSGD_hook``, with this node's
  error memory and warm-start Q); then every node steps its own optimizer on that mean
  (``PostLocalSGDOptimizer``: the nodes' states stay equal, so local steps after a warm-up
  start from the same optimizer state on every node, as the replay's);
* a **local step**: the node's own gradient and its own optimizer step (state key = rank);
* an **averaging** of the whole model (or, DiLoCo with F fragments, of one fragment's
  tensors): plain local SGD averages the weights with torch's ``average_parameters`` (divide
  by N, all-reduce: ``PeriodicModelAverager``'s arithmetic); DiLoCo (and any compressed
  averaging) all-reduces the pseudo-gradients ``Δ_i = anchor − x_i`` (compressed as above,
  one PowerSGD state per fragment) and every node takes the outer step
  (:class:`.optim.OuterOptimizer`, one momentum buffer per fragment) from the anchor, the
  weights all nodes held after the fragment's previous averaging;
* DiLoCo with overlap τ = ``protocol.overlap`` > 0: at a fragment's turn the node starts the
  all-reduce of its pseudo-gradient (uncompressed: ``all_reduce(async_op=True)``; compressed:
  its all-reduces at once, the result kept), takes τ more local steps, then waits for it and
  puts the outer step's result in place of the fragment (the replay's rule).

Compute, stragglers, heartbeats and emulated compute are the gossip nodes' (:class:`.live_gossip.Node`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from ..simulator import trace as trace_io
from ..simulator.catalog import dataset_info, param_shapes
from ..simulator.dataorder import global_slice_start
from ..simulator.protocols import GLOBAL_SLICE, clean_point, iterations, live_refusal
from ..simulator.protocols.gossip import trace_header
from ..simulator.protocols.local import LocalRecorder, averaging_header, fragment_tensors
from .base import BackendError
from .compression import PowerSGDState, average
from .live_faults import Heartbeat
from .live_gossip import Node
from .optim import OuterOptimizer

LOCAL_PROTOCOLS = ("local_sgd", "diloco")


def covers(point: dict[str, Any]) -> bool:
    """Whether this module runs ``point``: local SGD, DiLoCo, or AllReduce-SGD with compression."""
    proto = point["protocol"]
    return proto["name"] in LOCAL_PROTOCOLS or (proto["name"] == "allreduce"
                                                and proto.get("compression", "none") != "none")


Action = tuple[str, int]  # ("avg" | "prep" | "sync", fragment): −1 the whole model


def schedule(point: dict[str, Any]) -> Iterator[tuple[int, bool, list[Action]]]:
    """The run's steps in order, as the simulator takes them: ``(k, all-reduce step?, what
    follows it)``: ``("avg", f)`` a blocking averaging of fragment f (−1 the whole model),
    ``("prep", f)`` the start of an overlapped one (DiLoCo's ``protocol.overlap`` τ > 0), and
    ``("sync", f)`` its landing τ steps later (:mod:`..simulator.local_sgd`'s rule)."""
    proto = point["protocol"]
    K = iterations(point)
    name = proto["name"]
    warmup = K if name == "allreduce" else (int(proto.get("warmup_steps", 0)) if name == "local_sgd" else 0)
    H, F = int(proto.get("local_steps", 1)), int(proto.get("fragments", 1))
    tau = int(proto.get("overlap", 0)) if name == "diloco" else 0
    every = max(1, H // F)
    local = turn = 0
    pending: tuple[int, int] | None = None  # (fragment, the step count after which it lands)
    for k in range(K):
        if k < warmup:
            yield k, True, []
            continue
        local += 1
        done = k + 1
        last = done == K
        acts: list[Action] = []
        if pending is not None and done == pending[1]:
            acts.append(("sync", pending[0]))
            pending = None
        if local % every == 0 or last:
            if F == 1:
                frags = [-1]
            elif last:
                frags = list(range(F))
            else:
                frags = [turn]
                turn = (turn + 1) % F
            if tau and not last and done + tau < K:
                acts.append(("prep", frags[0]))
                pending = (frags[0], done + tau)
            else:
                acts += [("avg", f) for f in frags]
        yield k, False, acts


def known_shapes(point: dict[str, Any]) -> list[tuple[int, ...]] | None:
    """The parameter shapes the simulator knows for the point's model (None: unknown)."""
    wl = point["workload"]
    shapes = param_shapes(wl["model"], dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"]))
    return None if shapes is None else [tuple(int(d) for d in s) for s in shapes]


def _allreduce_sum(stack: Tensor) -> Tensor:
    """The sum over every node of this node's one tensor ``stack[0]`` (gloo ``all_reduce``)."""
    t = stack[0].clone()
    dist.all_reduce(t)
    return t


class LocalNode:
    """One node's run of the schedule (module doc) and its op log."""

    def __init__(self, me: Node) -> None:
        self.me = me
        point = me.point
        proto = point["protocol"]
        self.n, self.mu, self.spe = me.n, me.mu, me.spe
        self.name = proto["name"]
        self.compression = str(proto.get("compression", "none"))
        self.rank = int(proto.get("powersgd_rank", 1))
        self.ps_warmup = int(proto.get("powersgd_warmup", 0))
        self.seed = int(point["seed"])
        self.outer_ops = self.name == "diloco" or self.compression != "none"
        lr = float(proto.get("outer_lr", 1.0)) if self.name == "diloco" else 1.0
        momentum = float(proto.get("outer_momentum", 0.0)) if self.name == "diloco" else 0.0
        fragments = int(proto.get("fragments", 1))
        if me.emulated:
            known = known_shapes(point)
            shapes = known if known is not None else [(int(me.x.numel()),)]
        else:
            shapes = [tuple(s) for s in me.flat.shapes]
        self.shapes = shapes
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        self.tensors = fragment_tensors(sizes, fragments) if known_shapes(point) is not None else None
        frag_of = self.tensors if self.tensors is not None else [0] * len(sizes)
        bounds = [0]
        for s in sizes:
            bounds.append(bounds[-1] + s)
        self.bounds = bounds
        self.slices: dict[int, tuple[int, int, list[int]]] = {}
        for f in sorted(set(frag_of)):
            ks = [k for k, t in enumerate(frag_of) if t == f]
            self.slices[f] = (bounds[ks[0]], bounds[ks[-1] + 1], ks)
        self.slices[-1] = (0, bounds[-1], list(range(len(sizes))))
        self.anchor = {f: me.x[lo:hi].clone() for f, (lo, hi, _) in self.slices.items() if f >= 0}
        self.outer = {f: OuterOptimizer(lr, momentum) for f in self.slices if f >= 0}
        self.powersgd: dict[tuple[str, int], PowerSGDState] = {}
        self.rounds: dict[tuple[str, int], int] = {}
        self.in_flight: tuple[int, Tensor, Any] | None = None  # overlapped: (fragment, sum or mean, work)

    # -- arithmetic --------------------------------------------------------------------------
    def _average(self, flat: Tensor, tensors: list[int], what: str, fragment: int) -> Tensor:
        """The nodes' mean of ``flat`` (this node's vector over ``tensors``' elements) as the
        compressed all-reduce delivers it (the replay's rule, one state per (what, fragment))."""
        key = (what, fragment)
        step = self.rounds.get(key, 0)
        self.rounds[key] = step + 1
        if self.compression == "none":
            total = flat.clone()
            dist.all_reduce(total)
            return total / self.n
        state = None
        if self.compression == "powersgd":
            state = self.powersgd.get(key)
            if state is None:
                state = self.powersgd[key] = PowerSGDState(self.rank, self.ps_warmup, self.seed)
        lo = self.bounds[tensors[0]]
        parts = [flat[self.bounds[k] - lo:self.bounds[k + 1] - lo].view(self.shapes[k]) for k in tensors]
        out = average([parts], self.compression, state, step, _allreduce_sum, self.n)
        return torch.cat([t.reshape(-1) for t in out])

    def _sync_anchors(self) -> None:
        for f, (lo, hi, _) in self.slices.items():
            if f >= 0:
                self.anchor[f] = self.me.x[lo:hi].clone()

    # -- steps -------------------------------------------------------------------------------
    def allreduce_step(self, k: int) -> None:
        me, n = self.me, self.n
        start = global_slice_start(k, me.i, n, self.mu)
        g, t0, t1 = me.gradient(start)
        if self.compression == "none":
            total = g.clone()
            dist.all_reduce(total)
            mean = total / n
        else:
            mean = self._average(g, self.slices[-1][2], "apply", -1)
        _, lr = me.opt.apply_rate((k + 1) * n * self.mu / self.spe, [1.0 / n] * n, [0] * n)
        me.x = me.opt.step(me.i, me.x, mean, lr)  # every rank its own optimizer on the mean
        me.version += 1
        self._sync_anchors()
        me.log.append(("ar", k, t0, t1, time.monotonic()))

    def local_step(self, k: int) -> None:
        me, n = self.me, self.n
        start = global_slice_start(k, me.i, n, self.mu)
        g, t0, t1 = me.gradient(start)
        lr = me.opt.apply_rate((k + 1) * n * self.mu / self.spe, [1.0], [0])[1]
        me.x = me.opt.step(me.i, me.x, g, lr)
        me.version += 1
        me.log.append(("local", k, t0, t1, time.monotonic()))

    def averaging(self, fragment: int) -> None:
        me = self.me
        t0 = time.monotonic()
        if not self.outer_ops:
            from torch.distributed.algorithms.model_averaging.utils import average_parameters

            param = torch.nn.Parameter(me.x.clone(), requires_grad=False)
            world = dist.group.WORLD
            assert world is not None  # inside the run's process group
            average_parameters(iter([param]), world)
            me.x = param.data.detach()
            self._sync_anchors()
        else:
            f = max(fragment, 0)
            lo, hi, tensors = self.slices[fragment]
            delta = self.anchor[f] - me.x[lo:hi]
            mean = self._average(delta, tensors, "outer", fragment)
            self._land(f, lo, hi, mean)
        me.version += 1
        me.log.append(("avg", fragment, t0, time.monotonic()))

    def _land(self, f: int, lo: int, hi: int, mean: torch.Tensor) -> None:
        """The outer step of fragment ``f`` (elements ``lo:hi``) on the mean pseudo-gradient
        ``mean``: its result replaces the fragment in the node's state and becomes its anchor."""
        new = self.outer[f].step_delta(self.anchor[f], mean)
        x = self.me.x.clone()
        x[lo:hi] = new
        self.me.x = x
        self.anchor[f] = new.clone()

    def prepare(self, fragment: int) -> None:
        """Start the overlapped averaging of ``fragment``'s pseudo-gradient (uncompressed: an
        asynchronous ``all_reduce``; compressed: its all-reduces now, the result kept) and go on."""
        me = self.me
        t0 = time.monotonic()
        f = max(fragment, 0)
        lo, hi, tensors = self.slices[fragment]
        delta = self.anchor[f] - me.x[lo:hi]
        if self.compression == "none":
            total = delta.clone()
            work = dist.all_reduce(total, async_op=True)
            self.in_flight = (fragment, total, work)
        else:
            self.in_flight = (fragment, self._average(delta, tensors, "outer", fragment), None)
        me.log.append(("prep", fragment, t0, time.monotonic()))

    def sync(self, fragment: int) -> None:
        """Wait for the overlapped averaging of ``fragment`` and take the outer step's result in
        place of the fragment (the node's own progress on it since is dropped: α = 0)."""
        me = self.me
        t0 = time.monotonic()
        assert self.in_flight is not None and self.in_flight[0] == fragment
        _, total, work = self.in_flight
        self.in_flight = None
        if work is not None:  # the sum of an uncompressed all-reduce; a compressed one kept its mean
            work.wait()
            total = total / self.n
        lo, hi, _ = self.slices[fragment]
        self._land(max(fragment, 0), lo, hi, total)
        me.version += 1
        me.log.append(("sync", fragment, t0, time.monotonic()))

    def run(self) -> None:
        for k, is_ar, acts in schedule(self.me.point):
            if is_ar:
                self.allreduce_step(k)
            else:
                self.local_step(k)
            for what, f in acts:
                if what == "avg":
                    self.averaging(f)
                elif what == "prep":
                    self.prepare(f)
                else:
                    self.sync(f)


def local_node(point: dict[str, Any], rank: int, out: str) -> None:
    """Run node ``rank`` of a local-SGD / DiLoCo / compressed all-reduce point to the end;
    node 0 writes ``trace.ddlt`` and ``weights.pt``."""
    refusal = live_refusal(point)
    if refusal:
        raise BackendError(refusal)
    me = Node(point, rank)
    me.heartbeat = Heartbeat(out, rank)
    run = LocalNode(me)
    dist.barrier()
    epoch0 = time.monotonic()
    run.run()
    logs: list[Any] = [None] * me.n
    dist.all_gather_object(logs, me.log)
    finals: list[Any] = [None] * me.n
    dist.all_gather_object(finals, me.x)
    if rank != 0:
        return
    rec = merge(point, logs, epoch0)
    header = trace_header(point, GLOBAL_SLICE)
    header["averaging"] = averaging_header(point, run.tensors)
    header.update({"measured": True, "mean_staleness": 0.0, "replay_point": clean_point(point),
                   "wall_s": max(e[-1] for log in logs for e in log) - epoch0})
    trace_io.write(rec.tb.build(header), os.path.join(out, "trace.ddlt"))
    torch.save(torch.stack(finals), os.path.join(out, "weights.pt"))


def merge(point: dict[str, Any], logs: list[list[tuple]], epoch0: float) -> LocalRecorder:
    """One trace from the nodes' logs (each in :func:`schedule`'s order), written through the
    simulator's encoding: a step's times are each node's, an averaging runs from the last
    node's start to the last node's end."""
    rec = LocalRecorder(point)
    rec.begin()
    n = len(logs)
    at = [0] * n
    end = 0.0

    def take() -> list[tuple]:
        row = [logs[i][at[i]] for i in range(n)]
        for i in range(n):
            at[i] += 1
        return row

    holder = 0
    for k, is_ar, acts in schedule(point):
        row = take()
        starts = [e[2] - epoch0 for e in row]
        ends = [e[3] - epoch0 for e in row]
        done = [e[4] - epoch0 for e in row]
        if is_ar:
            rec.allreduce_step(k, starts, ends, max(done))
        else:
            rec.local_step(k, starts, ends, done)
        end = max([end] + done)
        for what, f in acts:
            row = take()
            t0, t1 = max(e[2] for e in row) - epoch0, max(e[3] for e in row) - epoch0
            if what == "avg":
                rec.average(t0, t1, f)
            elif what == "prep":
                holder = rec.prepare(t0, t1, f)
            else:
                rec.sync(f, holder, [e[3] - epoch0 for e in row])
            end = max(end, t1)
    rec.finish(end)
    return rec
