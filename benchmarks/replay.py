"""Replay throughput against PyTorch references measured in the same run (gradients per second).

Workload: digits MLP, λ = 30 learners, μ = 4, an async trace in which every gradient reads a
different recent weights version (staleness λ − 1, one apply per gradient, SGD with momentum
0.9, constant learning rate). Five ways to do (about) that work, timed in interleaved rounds
(the order rotates each round) and reported as paired ratios, median and spread (min–max):

* ``sgd loop``: the idiomatic PyTorch loop, ``zero_grad``, forward, cross-entropy,
  ``backward``, ``torch.optim.SGD(momentum=0.9).step()`` per minibatch (no staleness: it
  always reads the latest weights);
* ``bare loop``: the same without the optimizer step (gradients only);
* ``hand-batched``: what a hand-written batched async replay costs: per window of λ gradients,
  the λ weights versions they read gathered from a ring buffer, forward and backward written
  out with ``baddbmm``/``bmm``, then the λ momentum-SGD updates applied in order (it must reach
  the batched replay's final weights: the printed max |Δw| is that check);
* ``replay 1-at-a-time`` and ``replay batched``: ddlsim's replay of the trace.

Targets: batched ≥ 0.75× hand-batched and ≥ 4× the bare loop; one-at-a-time
≥ 1.0× the torch.optim loop.

Gossip case (``--gossip``): simulated 8-node SGP traces (1 peer, μ = 16, 20 epochs of
digits, SGD momentum 0.9), with and without stragglers and overlap, replayed by the generic
interpreter (batched) and by the stacked replay; gradients per second, vmap calls, and what
the default ("auto") mode picks.

    python benchmarks/replay.py [--rounds 7]
    python benchmarks/replay.py --device cuda --grads 6000
    python benchmarks/replay.py --gossip [--nodes 8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

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
lr_policy = "constant"
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


def plain_loop(point: dict, data, batches: list[Tensor], device: torch.device, direct: bool = False) -> float:
    """Seconds for forward + backward of every grad op's minibatch, one by one (no step).

    ``direct``: call the autograd engine as the replay does (skipping ``Tensor.backward``'s
    argument checks), to show what part of the replay's margin comes from that."""
    model = build_model(point).to(device)
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


def batches_of(trace: Trace, device: torch.device) -> list[Tensor]:
    """Each grad op's sample indices, in trace order."""
    g = np.flatnonzero(trace.ops["kind"] == GRAD)
    stream = SampleStream(trace.header["data_seed"], trace.header["samples_per_epoch"])
    return [torch.from_numpy(stream.indices(int(s), int(b))).to(device)
            for s, b in zip(trace.ops["sample_start"][g], trace.ops["batch_size"][g])]


def sgd_loop(point: dict, data, batches: list[Tensor], device: torch.device) -> float:
    """Seconds for the idiomatic loop: forward, backward and a torch.optim.SGD step per minibatch."""
    model = build_model(point).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=point["optimizer"]["lr"],
                          momentum=point["optimizer"]["momentum"])
    x, y = data.train_x, data.train_y
    _sync(device)
    t = time.perf_counter()
    for idx in batches:
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    _sync(device)
    return time.perf_counter() - t


def hand_batched(point: dict, data, batches: list[Tensor], learners: int, device: torch.device) -> tuple[float, Tensor]:
    """Seconds for the async trace replayed by a hand-written batched kernel, and its final
    flat weights. Gradient k reads version max(0, k − λ + 1) (the round-robin trace of
    :func:`async_trace`); a window of λ gradients reads versions that all exist before it."""
    model = build_model(point).to(device)
    lin1, lin2 = model[1], model[3]
    h, d = lin1.weight.shape
    c = lin2.weight.shape[0]
    sizes = (h * d, h, c * h, c)
    size = sum(sizes)
    x0 = torch.cat([p.detach().reshape(-1) for p in (lin1.weight, lin1.bias, lin2.weight, lin2.bias)])
    lr, mom = point["optimizer"]["lr"], point["optimizer"]["momentum"]
    xs = data.train_x.reshape(len(data.train_x), -1)
    idx = torch.stack(batches)
    mu = idx.shape[1]
    _sync(device)
    t = time.perf_counter()
    ring = x0.repeat(learners, 1)  # version v lives in row v % λ
    x, buf = x0.clone(), torch.zeros(size, dtype=x0.dtype, device=device)
    onehot = F.one_hot(data.train_y, c).to(x0.dtype)
    grads = torch.empty(learners, size, dtype=x0.dtype, device=device)
    o1, o2, o3 = sizes[0], sizes[0] + sizes[1], sizes[0] + sizes[1] + sizes[2]
    for k0 in range(0, len(batches), learners):
        b = min(learners, len(batches) - k0)
        versions = torch.arange(k0, k0 + b).sub_(learners - 1).clamp_(min=0) % learners
        w = ring.index_select(0, versions.to(device))
        w1, b1 = w[:, :o1].view(b, h, d), w[:, o1:o2].view(b, 1, h)
        w2, b2 = w[:, o2:o3].view(b, c, h), w[:, o3:].view(b, 1, c)
        sel = idx[k0:k0 + b]
        xb = xs[sel]                                              # (b, μ, d)
        pre = torch.baddbmm(b1, xb, w1.transpose(1, 2))           # (b, μ, h)
        act = pre.clamp(min=0)
        logits = torch.baddbmm(b2, act, w2.transpose(1, 2))       # (b, μ, c)
        dlog = (logits.softmax(-1) - onehot[sel]).div_(mu)
        g = grads[:b]
        torch.bmm(dlog.transpose(1, 2), act, out=g[:, o2:o3].view(b, c, h))
        g[:, o3:] = dlog.sum(1)
        dpre = torch.bmm(dlog, w2).mul_(pre > 0)
        torch.bmm(dpre.transpose(1, 2), xb, out=g[:, :o1].view(b, h, d))
        g[:, o1:o2] = dpre.sum(1)
        for i in range(b):
            buf.mul_(mom).add_(g[i])
            x.sub_(buf, alpha=lr)
            ring[(k0 + i + 1) % learners] = x
    _sync(device)
    return time.perf_counter() - t, x


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
          f"μ=16, 20 epochs, {a.repeats} interleaved rounds (medians; ratio: paired, median (min–max))")
    print(f"{'trace':34s} {'generic':>14s} {'stacked':>14s} {'stacked/generic':>22s}  {'vmap calls g/s':>14s}  "
          f"auto picks")
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
        times: dict[str, list[float]] = {"generic": [], "stacked": []}
        reps: dict[type, Replayer] = {}
        for r in range(a.repeats):  # interleaved, the order alternating
            for cls in ((Replayer, StackedReplayer) if r % 2 == 0 else (StackedReplayer, Replayer)):
                dt, reps[cls] = once(cls)
                times["generic" if cls is Replayer else "stacked"].append(dt)
        auto = make_replayer(trace, build_model(point).to(device), data, Optimizer(point["optimizer"], 0.0))
        g, s = n / np.median(times["generic"]), n / np.median(times["stacked"])
        calls = f"{reps[Replayer].plan.calls}/{reps[StackedReplayer].grad_calls}"
        name = f"stragglers {fraction:.2f}, overlap τ={overlap}"
        print(f"{name:34s} {g:8.0f} grad/s {s:8.0f} grad/s {paired(times, 'stacked', 'generic')}  {calls:>14s}  "
              f"{'stacked' if isinstance(auto, StackedReplayer) else 'generic'}")


def paired(times: dict[str, list[float]], num: str, den: str) -> str:
    """Median (min–max) over rounds of the rate ratio num/den, both timed in the same round."""
    r = sorted(b / a for a, b in zip(times[num], times[den]))
    return f"{np.median(r):5.2f}× ({r[0]:.2f}–{r[-1]:.2f})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    ap.add_argument("--learners", type=int, default=30)
    ap.add_argument("--minibatch", type=int, default=4)
    ap.add_argument("--grads", type=int, default=3000, help="gradients in the trace")
    ap.add_argument("--rounds", "--repeats", type=int, default=7, help="interleaved timing rounds")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--gossip", action="store_true", help="the 8-node SGP case: generic against stacked replay")
    ap.add_argument("--nodes", type=int, default=8, help="gossip case: nodes")
    a = ap.parse_args(argv)
    a.repeats = a.rounds
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
    batches = batches_of(trace, device)
    n = len(batches)
    runs = {
        "sgd loop": lambda: sgd_loop(point, data, batches, device),
        "bare loop": lambda: plain_loop(point, data, batches, device),
        "hand-batched": lambda: hand_batched(point, data, batches, a.learners, device)[0],
        "replay 1-at-a-time": lambda: replay_once(point, data, trace, False, device)[0],
        "replay batched": lambda: replay_once(point, data, trace, True, device)[0],
    }
    if FAST:
        runs["bare loop, direct engine"] = lambda: plain_loop(point, data, batches, device, direct=True)
    for f in runs.values():  # warm-up (lazy imports, vmap tracing, allocator)
        f()
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for r in range(a.rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(runs[k]())
    _, rep = replay_once(point, data, trace, True, device)
    _, hand_x = hand_batched(point, data, batches, a.learners, device)
    diff = float((rep.final_states()[0][0] - hand_x).abs().max())
    print(f"device {device}, threads {torch.get_num_threads()}, digits MLP, λ={a.learners}, μ={a.minibatch}, "
          f"{n} gradients in {rep.plan.calls} batched calls (mean {n / rep.plan.calls:.1f}); "
          f"{a.rounds} interleaved rounds; hand-batched ≡ replay: max |Δw| = {diff:.1e}")
    print(f"{'':26s} {'gradients/s':>12s}  (median; this machine's)")
    for k in names:
        print(f"{k:26s} {n / np.median(times[k]):12.0f}")
    print("paired ratios, median (min–max):")
    print(f"  replay batched / hand-batched       {paired(times, 'replay batched', 'hand-batched')}  (target ≥ 0.75×)")
    print(f"  replay batched / bare loop          {paired(times, 'replay batched', 'bare loop')}  (target ≥ 4×)")
    print(f"  replay 1-at-a-time / sgd loop       {paired(times, 'replay 1-at-a-time', 'sgd loop')}  (target ≥ 1.0×)")
    print(f"  replay 1-at-a-time / bare loop      {paired(times, 'replay 1-at-a-time', 'bare loop')}")
    print(f"  sgd loop / bare loop                {paired(times, 'sgd loop', 'bare loop')}")
    if FAST:
        ratio = paired(times, 'replay 1-at-a-time', 'bare loop, direct engine')
        print(f"  replay 1-at-a-time / bare, direct   {ratio}")


if __name__ == "__main__":
    main()
