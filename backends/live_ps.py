"""The parameter-server protocols run for real over ``torch.distributed`` (gloo).

Rank 0 is the server, ranks 1..λ the learners. The server is a receive loop around the
simulator's protocol core (:class:`~ddlsim.simulator.protocols.ps.PSCore`): the core
assigns every minibatch (so the data order is docs/design.md's), decides when the average of
``c`` processed gradients is applied (hardsync's barrier, softsync's c = ⌊λ/n⌋, async's
c = 1, SSP's clock bound, and any variant of the catalogue) and which learners pull next;
the server answers them with the current weights. The core records what happened as a
trace with measured wall-clock times (seconds since the run started).

Messages: server → learner a float64 header ``[stop, version, k, sample_start, size, t0]``
then the float32 weights; learner → server ``[learner, version, k, sample_start, t_start,
t_end]`` then the float32 gradient. The server receives from any source (gloo's
any-source ``recv``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from ..simulator import trace as trace_io
from ..simulator.compute import learner_clocks, stragglers
from ..simulator.dataorder import SampleStream
from ..simulator.protocols import PSCore, clean_point, header_for
from .optim import Optimizer
from .flatmodel import FlatModel
from .live_faults import Heartbeat, fail_if_due
from .workloads import build_model, load_data

HEADER = 6


def initial_weights(point: dict[str, Any], emulated: bool) -> torch.Tensor:
    """The flat initial model (zeros of ``param_count`` under emulated compute)."""
    if emulated:
        return torch.zeros(point["workload"]["param_count"])
    model = build_model(point)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def server(point: dict[str, Any], mean_sigma: float, out_dir: str) -> None:
    """Run the server loop to the end; write ``trace.ddlt`` and ``weights.pt`` into ``out_dir``.

    The protocol is :class:`~ddlsim.simulator.protocols.ps.PSCore`'s (the simulator's own
    rules); this loop receives the pushes, steps the optimizer when the core applies, and
    sends work to the learners the core releases.
    """
    core = PSCore(point)
    lam, mu = core.lam, core.mu
    x = initial_weights(point, point["live"]["compute"] == "emulated")
    opt = Optimizer(point["optimizer"], mean_sigma)
    hdr_in = torch.zeros(HEADER, dtype=torch.float64)
    grad = torch.zeros_like(x)
    pending: dict[int, torch.Tensor] = {}  # grad op → its gradient, until applied
    stopped = [False] * lam
    beat = Heartbeat(out_dir, 0)  # gradients processed: the launcher's progress (live.live_progress)
    dist.barrier()
    t0 = time.time()

    def send_work(i: int) -> None:
        k = core.assign(i)
        if k < 0:
            dist.send(torch.tensor([1, core.version, 0, 0, 0, t0], dtype=torch.float64), dst=i + 1)
            stopped[i] = True
            return
        dist.send(torch.tensor([0, core.version, k, core.sample_start(i, k), mu, t0], dtype=torch.float64),
                  dst=i + 1)
        dist.send(x, dst=i + 1)

    core.begin()
    last_heard = [time.time()] * lam  # when each learner last pushed (or was first sent work)
    for i in range(lam):
        send_work(i)
    while core.processed < core.total:
        try:
            src = dist.recv(hdr_in)
        except RuntimeError as e:
            if "Timed out" not in str(e):
                raise
            raise RuntimeError(silent_learner(point, last_heard, stopped, time.time())) from None
        dist.recv(grad, src=src)
        i = src - 1
        last_heard[i] = time.time()
        _, j, k, _, t_start, t_end = hdr_in.tolist()
        gop = core.gradient(i, int(j), int(k), t_start, t_end)
        pending[gop] = grad.clone()
        v = core.version
        released = core.push(((i, gop, int(j), mu),), time.time() - t0)
        beat.beat(core.processed)
        if core.version != v:  # the core applied: step with the weights and scales of its apply
            gops, weights, stale, epoch = core.tb.last_apply()
            coefs, lr = opt.apply_rate(epoch, weights, stale)  # the staleness policy scales the rate
            gs = [pending.pop(g) for g in gops]
            g = gs[0] * float(coefs[0]) if len(gs) == 1 else torch.stack(gs).T.matmul(
                torch.tensor(coefs, dtype=x.dtype))
            x = opt.step(0, x, g, lr)
        for w in released:
            send_work(w)
    end = time.time() - t0
    for i in range(lam):
        if not stopped[i]:
            send_work(i)
    core.finish(end)
    header = header_for(point, 1, core.layout)
    header.update({"measured": True, "mean_staleness": mean_sigma, "wall_s": end, "replay_point": clean_point(point)})
    trace_io.write(core.tb.build(header), os.path.join(out_dir, "trace.ddlt"))
    torch.save(x, os.path.join(out_dir, "weights.pt"))


def silent_learner(point: dict[str, Any], last_heard: list[float], stopped: list[bool], now: float) -> str:
    """Who the server waited for when its receive timed out: the working learner it has heard
    from least recently (words the parent looks for: ``live.SILENT``)."""
    i = min((j for j in range(len(last_heard)) if not stopped[j]), key=lambda j: last_heard[j], default=0)
    return (f"learner {i} sent nothing for {now - last_heard[i]:.1f} s (live.timeout_s = "
            f"{point['live']['timeout_s']:g}): it hung, was stopped or is too slow")


def learner(point: dict[str, Any], rank: int) -> None:
    """Pull, compute (or sleep for the compute model's time), push, until told to stop."""
    i = rank - 1
    live = point["live"]
    emulated = live["compute"] == "emulated"
    lam = point["cluster"]["learners"]
    clock = learner_clocks(point, lam)[i]
    slowdown = point["cluster"]["stragglers"]["slowdown"] if i in stragglers(point, lam) else 1.0
    x = initial_weights(point, emulated)
    grad = torch.zeros_like(x)
    flat = data = None
    if not emulated:
        data = load_data(point, point.get("_data_dir"))
        flat = FlatModel(build_model(point))
        n_train = len(data.train_y)
        stream = SampleStream(point["seed"], point["workload"]["samples_per_epoch"])
    hdr = torch.zeros(HEADER, dtype=torch.float64)
    dist.barrier()
    sent = 0
    while True:
        dist.recv(hdr, src=0)
        stop, version, k, start, size, t0 = hdr.tolist()
        if stop:
            return
        x = torch.empty_like(x)  # a new tensor: FlatModel caches the last one it loaded by identity
        dist.recv(x, src=0)
        t_start = time.time() - t0
        if emulated:
            end = clock.finish(t_start, clock.draws.next())
        else:
            assert flat is not None and data is not None  # loaded above when not emulated
            idx = torch.from_numpy(stream.indices(int(start), int(size)) % n_train)
            g, _ = flat.grad(x, data.train_x[idx], data.train_y[idx])
            grad = g
            measured = time.time() - t0 - t_start
            # a persistent straggler's slowdown and the stalls stretch the real computation
            end = clock.finish(t_start, measured * slowdown)
        delay = end - (time.time() - t0)
        if delay > 0:
            time.sleep(delay)
        t_end = time.time() - t0
        fail_if_due(live, i, sent)
        dist.send(torch.tensor([rank, version, k, start, t_start, t_end], dtype=torch.float64), dst=0)
        dist.send(grad, dst=0)
        sent += 1
