"""Replay throughput against a plain PyTorch loop (gradients per second, same device).

Workload: digits MLP, λ = 30 learners, μ = 4, an async-like trace in which every gradient
reads a different recent weights version (staleness λ − 1, one apply per gradient,
SGD with momentum). The plain loop computes the same minibatch gradients one by one
(``model(x)``, cross-entropy, ``backward``) on one set of weights, without applying them.

Targets: one-at-a-time replay ≥ 0.9× the plain loop, batched replay ≥ 3×.

Gossip case (``--gossip``): simulated 8-node SGP traces (1 peer, μ = 16, 20 epochs of
digits, SGD momentum 0.9), with and without stragglers and overlap, replayed by the generic
interpreter (batched) and by the stacked replay; gradients per second, vmap calls, and what
the default ("auto") mode picks.

    python benchmarks/replay.py
    python benchmarks/replay.py --device cuda --grads 6000
    python benchmarks/replay.py --gossip [--nodes 8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F

from ddlsim.backends.base import BackendError
from ddlsim.backends.optim import Optimizer, mean_staleness
from ddlsim.backends.autograd_engine import FAST, backward
from ddlsim.backends.device import resolve_device
from ddlsim.backends.replay import make_replayer
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.replay_stacked import StackedReplayer
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.scenarios.load import load_text
from ddlsim.simulator.dataorder import SampleStream, shard_start
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import GRAD, Trace, TraceBuilder

SCENARIO = """
seed = 0
[workload]
dataset = "digits"
model = "mlp"
[optimizer]
name = "sgd"
lr = 0.01
momentum = 0.9
lr_policy = "per_gradient"
[cluster]
learners = {learners}
minibatch = {minibatch}
[protocol]
name = "async"
"""


def async_trace(learners: int, minibatch: int, grads: int, n: int, seed: int) -> Trace:
    """Round-robin ASGD: learner ``l`` pushes a gradient on the version it last pulled,
    the server applies it at once and ``l`` pulls the new version."""
    tb = TraceBuilder()
    tb.eval(0, 0, 0.0, 0.0)
    read = [0] * learners
    k = [0] * learners
    v = 0
    for step in range(grads):
        lrn = step % learners
        t = float(step + 1)
        g = tb.grad(lrn, 0, read[lrn], shard_start(k[lrn], lrn, learners, minibatch, n), minibatch,
                    k[lrn], t - 1.0, t, v * minibatch / n)
        k[lrn] += 1
        tb.apply(0, v, [g], [1.0], [v - read[lrn]], t, (v + 1) * minibatch / n)
        v += 1
        read[lrn] = v
    tb.eval(0, v, float(grads), v * minibatch / n)
    return tb.build({"nodes": 1, "data_seed": seed, "samples_per_epoch": n})


def plain_loop(point: dict, data, trace: Trace, device: torch.device, direct: bool = False) -> float:
    """Seconds for forward + backward of every grad op's minibatch, one by one.

    ``direct``: call the autograd engine as the replay does (skipping ``Tensor.backward``'s
    argument checks), to show what part of the replay's margin comes from that."""
    model = build_model(point).to(device)
    ops = trace.ops
    g = np.flatnonzero(ops["kind"] == GRAD)
    stream = SampleStream(trace.header["data_seed"], trace.header["samples_per_epoch"])
    batches = [torch.from_numpy(stream.indices(int(s), int(b))).to(device)
               for s, b in zip(ops["sample_start"][g], ops["batch_size"][g])]
    x, y = data.train_x, data.train_y
    seed = torch.ones((), device=device)
    _sync(device)
    t = time.perf_counter()
    if direct:
        for idx in batches:
            model.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            backward(loss, seed)
    else:
        for idx in batches:
            model.zero_grad()
            F.cross_entropy(model(x[idx]), y[idx]).backward()
    _sync(device)
    return time.perf_counter() - t


def replay_once(point: dict, data, trace: Trace, batched: bool, device: torch.device) -> tuple[float, Replayer]:
    """Seconds for planning and executing ``trace`` (model and data already built)."""
    model = build_model(point).to(device)
    _sync(device)
    t = time.perf_counter()
    opt = Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"]))
    rep = Replayer(trace, model, data, opt, batched=batched)
    rep.run()
    _sync(device)
    return time.perf_counter() - t, rep


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


GOSSIP = """
seed = 0
[workload]
dataset = "digits"
model = "mlp"
epochs = 20
evals_per_epoch = 1
[optimizer]
name = "sgd"
lr = 0.1
momentum = 0.9
[cluster]
learners = {nodes}
minibatch = 16
[cluster.stragglers]
fraction = {fraction}
slowdown = 2.0
[protocol]
name = "sgp"
peers = 1
overlap = {overlap}
"""


def gossip(a: argparse.Namespace, device: torch.device) -> None:
    """Generic (batched) against stacked replay of 8-node SGP traces."""
    print(f"device {device}, threads {torch.get_num_threads()}, digits MLP, SGP {a.nodes} nodes, 1 peer, "
          f"μ=16, 20 epochs, best of {a.repeats}")
    print(f"{'trace':34s} {'generic':>14s} {'stacked':>14s} {'ratio':>6s}  {'vmap calls g/s':>14s}  auto picks")
    for fraction, overlap in ((0.0, 0), (0.0, 1), (0.25, 0), (0.25, 1)):
        point = load_text(GOSSIP.format(nodes=a.nodes, fraction=fraction, overlap=overlap)).points()[0]
        data = load_data(point, device=device)
        trace = simulate(point).trace
        n = int((trace.ops["kind"] == GRAD).sum())

        def once(cls: type) -> tuple[float, Replayer]:
            model = build_model(point).to(device)
            _sync(device)
            t = time.perf_counter()
            rep = cls(trace, model, data, Optimizer(point["optimizer"], 0.0))
            rep.run()
            _sync(device)
            return time.perf_counter() - t, rep

        once(Replayer), once(StackedReplayer)  # warm-up
        best = {Replayer: np.inf, StackedReplayer: np.inf}
        reps: dict[type, Replayer] = {}
        for _ in range(a.repeats):
            for cls in best:
                dt, reps[cls] = once(cls)
                best[cls] = min(best[cls], dt)
        auto = make_replayer(trace, build_model(point).to(device), data, Optimizer(point["optimizer"], 0.0))
        g, s = n / best[Replayer], n / best[StackedReplayer]
        calls = f"{reps[Replayer].plan.calls}/{reps[StackedReplayer].grad_calls}"
        name = f"stragglers {fraction:.2f}, overlap τ={overlap}"
        print(f"{name:34s} {g:8.0f} grad/s {s:8.0f} grad/s {s / g:5.2f}×  {calls:>14s}  "
              f"{'stacked' if isinstance(auto, StackedReplayer) else 'generic'}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    ap.add_argument("--learners", type=int, default=30)
    ap.add_argument("--minibatch", type=int, default=4)
    ap.add_argument("--grads", type=int, default=3000, help="gradients in the trace")
    ap.add_argument("--repeats", type=int, default=5, help="best of this many timings")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gossip", action="store_true", help="the 8-node SGP case: generic against stacked replay")
    ap.add_argument("--nodes", type=int, default=8, help="gossip case: nodes")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    try:
        device = resolve_device(a.device)
    except BackendError as e:
        raise SystemExit(str(e)) from None
    if a.gossip:
        gossip(a, device)
        return
    point = load_text(SCENARIO.format(learners=a.learners, minibatch=a.minibatch)).points()[0]
    data = load_data(point, device=device)
    trace = async_trace(a.learners, a.minibatch, a.grads, point["workload"]["samples_per_epoch"], point["seed"])
    n = int((trace.ops["kind"] == GRAD).sum())
    for batched in (False, True):  # warm-up (lazy imports, vmap tracing, allocator)
        replay_once(point, data, async_trace(a.learners, a.minibatch, 200, len(data.train_y), 0),
                    batched, device)
    plain_loop(point, data, trace, device)
    best = {"plain": np.inf, "direct": np.inf, "single": np.inf, "batched": np.inf}
    for _ in range(a.repeats):
        best["plain"] = min(best["plain"], plain_loop(point, data, trace, device))
        if FAST:
            best["direct"] = min(best["direct"], plain_loop(point, data, trace, device, direct=True))
        best["single"] = min(best["single"], replay_once(point, data, trace, False, device)[0])
        best["batched"] = min(best["batched"], replay_once(point, data, trace, True, device)[0])
    rate = {k: n / v for k, v in best.items()}
    _, rep = replay_once(point, data, trace, True, device)
    print(f"device {device}, threads {torch.get_num_threads()}, digits MLP, λ={a.learners}, "
          f"μ={a.minibatch}, {n} gradients in {rep.plan.calls} batched calls "
          f"(mean {n / rep.plan.calls:.1f}), peak live versions {rep.peak_live_states}")
    print(f"plain PyTorch loop      {rate['plain']:9.0f} gradients/s")
    print(f"replay one-at-a-time    {rate['single']:9.0f} gradients/s   "
          f"ratio {rate['single'] / rate['plain']:.2f}× (target ≥ 0.9×)")
    print(f"replay batched (vmap)   {rate['batched']:9.0f} gradients/s   "
          f"ratio {rate['batched'] / rate['plain']:.2f}× (target ≥ 3×)")
    if np.isfinite(best["direct"]):
        print(f"for reference: the plain loop calling the autograd engine directly as the replay does "
              f"{rate['direct']:.0f} gradients/s; one-at-a-time replay {rate['single'] / rate['direct']:.2f}× of it")


if __name__ == "__main__":
    main()
