"""The parameter-server protocols run for real over ``torch.distributed`` (gloo).

Rank 0 is the server, ranks 1..λ the learners. The server keeps the protocol's rules
exactly as the simulator does (``simulator/ps.py``): it assigns every minibatch (so the
data order is DESIGN.md's), applies the average of every ``c`` processed gradients
(hardsync: a barrier; softsync: c = ⌊λ/n⌋; async: c = 1; ssp: the clock bound), and
answers a processed push with the current weights. It records what happened as a trace
with measured wall-clock times (seconds since the run started).

Messages: server → learner a float64 header ``[stop, version, k, sample_start, size, t0]``
then the float32 weights; learner → server ``[learner, version, k, sample_start, t_start,
t_end]`` then the float32 gradient. The server receives from any source (gloo's
any-source ``recv``).
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..simulator.compute import learner_clocks, stragglers
from ..simulator.dataorder import SampleStream, global_slice_start, shard_start
from ..simulator.ps import gradients_per_update, total_gradients
from ..simulator.run import header_for
from ..simulator.trace import EVAL, TraceBuilder
from .optim import Optimizer
from .replay import FlatModel
from .workloads import build_model, load_data

HEADER = 6


def initial_weights(point: dict[str, Any], emulated: bool) -> torch.Tensor:
    """The flat initial model (zeros of ``param_count`` under emulated compute)."""
    if emulated:
        return torch.zeros(point["workload"]["param_count"])
    model = build_model(point)
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def server(point: dict[str, Any], mean_sigma: float, out_dir: str) -> None:
    """Run the server loop to the end; write ``trace.ddlt`` and ``weights.pt`` into ``out_dir``."""
    from ..simulator import trace as tracemod

    lam, mu = point["cluster"]["learners"], point["cluster"]["minibatch"]
    n_samples = point["workload"]["samples_per_epoch"]
    name = point["protocol"]["name"]
    hardsync, bound = name == "hardsync", (point["protocol"]["staleness_bound"] if name == "ssp" else -1)
    emulated = point["live"]["compute"] == "emulated"
    c, total = gradients_per_update(point), total_gradients(point)
    x = initial_weights(point, emulated)
    opt = Optimizer(point["optimizer"], mean_sigma)
    tb = TraceBuilder()
    hdr_in = torch.zeros(HEADER, dtype=torch.float64)
    grad = torch.zeros_like(x)
    state = {"version": 0, "issued": 0, "samples": 0}
    batches, done_clock, stopped = [0] * lam, [0] * lam, [False] * lam
    acc: list[tuple[int, int, int, torch.Tensor]] = []
    waiting: list[int] = []
    eval_every = n_samples / point["workload"]["evals_per_epoch"]
    next_eval = eval_every
    dist.barrier()
    t0 = time.time()

    def now() -> float:
        return time.time() - t0

    def send_work(i: int) -> None:
        if state["issued"] >= total:
            dist.send(torch.tensor([1, state["version"], 0, 0, 0, t0], dtype=torch.float64), dst=i + 1)
            stopped[i] = True
            return
        state["issued"] += 1
        k = batches[i]
        batches[i] = k + 1
        start = global_slice_start(k, i, lam, mu) if hardsync else shard_start(k, i, lam, mu, n_samples)
        dist.send(torch.tensor([0, state["version"], k, start, mu, t0], dtype=torch.float64), dst=i + 1)
        dist.send(x, dst=i + 1)

    tb.eval(0, 0, 0.0, 0.0)
    for i in range(lam):
        send_work(i)
    processed = 0
    while processed < total:
        src = dist.recv(hdr_in)
        dist.recv(grad, src=src)
        i = src - 1
        _, j, k, start, t_start, t_end = hdr_in.tolist()
        gop = tb.grad(i, 0, int(j), int(start), mu, int(k), t_start, t_end, state["samples"] / n_samples)
        acc.append((gop, int(j), mu, grad.clone()))
        processed += 1
        done_clock[i] += 1
        if len(acc) >= c or processed == total:
            v = state["version"]
            stale = np.array([v - a[1] for a in acc])
            coefs = opt.scales(stale) / len(acc)
            g = acc[0][3] * float(coefs[0]) if len(acc) == 1 else torch.stack([a[3] for a in acc]).T.matmul(
                torch.tensor(coefs, dtype=x.dtype))
            state["samples"] += sum(a[2] for a in acc)
            epoch = state["samples"] / n_samples
            x = opt.step(0, x, g, float(opt.lr(epoch)))
            t = now()
            tb.apply(0, v, [a[0] for a in acc], [1.0 / len(acc)] * len(acc), stale.tolist(), t, epoch)
            state["version"] = v + 1
            acc = []
            if state["samples"] >= next_eval - 1e-9:
                tb.eval(0, v + 1, t, epoch)
                while next_eval <= state["samples"] + 1e-9:
                    next_eval += eval_every
        if hardsync:
            waiting.append(i)
            if not acc:
                for w in sorted(waiting):
                    send_work(w)
                waiting = []
        elif bound >= 0:
            waiting.append(i)
            slowest = min(done_clock)
            still = []
            for w in sorted(waiting):
                (send_work(w) if done_clock[w] - bound <= slowest else still.append(w))
            waiting = still
        else:
            send_work(i)
    end = now()
    for i in range(lam):
        if not stopped[i]:
            send_work(i)
    if tb.kinds[-1] != EVAL:
        tb.eval(0, state["version"], end, state["samples"] / n_samples)
    header = header_for(point, 1, "global_slice" if hardsync else "shard")
    header.update({"measured": True, "mean_staleness": mean_sigma, "wall_s": end})
    tracemod.write(tb.build(header), os.path.join(out_dir, "trace.ddlt"))
    torch.save(x, os.path.join(out_dir, "weights.pt"))


def learner(point: dict[str, Any], rank: int) -> None:
    """Pull, compute (or sleep for the compute model's time), push, until told to stop."""
    i = rank - 1
    live = point["live"]
    emulated = live["compute"] == "emulated"
    lam = point["cluster"]["learners"]
    clock = learner_clocks(point, lam, 1)[i]
    slowdown = point["cluster"]["stragglers"]["slowdown"] if i in stragglers(point, lam, 1) else 1.0
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
        if live["fail_learner"] == i and sent >= live["fail_after"]:
            os.kill(os.getpid(), 9)
        dist.send(torch.tensor([rank, version, k, start, t_start, t_end], dtype=torch.float64), dst=0)
        dist.send(grad, dst=0)
        sent += 1
