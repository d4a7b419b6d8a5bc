"""Replay speed against a plain PyTorch loop on the same samples, for three models.

Models: the digits MLP (9,610 parameters, the embedded digits set), a 0.5M-parameter MLP
(the ``mlp`` model on the synthetic ``teacher`` set with 3,900 features: 500,618 parameters)
and Rudra's CIFAR-10 CNN (``rudra_cifar``, 89,578 parameters, synthetic inputs of CIFAR-10's
shape: speed does not depend on the pixels). For each model three traces, SGD with momentum 0.9:

* **hardsync** λ = 30, μ = 4: every round's 30 gradients read the same weights and one apply
  averages them, so the run *is* SGD with minibatch λμ = 120. Reference: the plain loop with
  minibatch λμ over the same samples (``zero_grad``, forward, cross-entropy, ``backward``,
  ``torch.optim.SGD.step``). Goal: the replay ≥ 0.8× that loop.
* **async** λ = 30, μ = 4: round-robin ASGD, each gradient read from the version its learner
  last pulled (σ = 29), one apply per gradient. Reference: the same loop with minibatch μ
  (always the latest weights). Goal: ≥ 0.9×.
* **allreduce** λ = 30 nodes, μ = 4: AllReduce-SGD as the simulator writes it
  (:meth:`ddlsim.simulator.protocols.gossip.GossipRecorder.allreduce_round`): each node's
  gradient on its own copy of the weights, one apply on node 0 at weight 1/λ, then every other
  node copies node 0's new version (a mix of self_coef 0, coef 1). The run is SGD with
  minibatch λμ, so the reference is hardsync's loop. Goal: ≥ 0.8×, as hardsync.

SGD's rate is 0.001, low enough that no replay diverges on the synthetic data (a diverged
replay stops early, and the benchmark refuses to time it).

The traces hold no evaluations (the loop has none): what is timed is planning plus gradients
and steps. Each trace is replayed by ddlsim's default (``Replayer(batched=True)``: fused
batches where an apply's gradients share their weights, row batches where
:func:`ddlsim.backends.replay_plan.batch_rows` says they pay) and by the two per-gradient
paths forced (``batching="always", fuse=False``: row batches of stacked versions;
``batched=False``: one at a time by plain autograd), so the default's choice is seen against
both. **Multi-replay** (``--replicates K``, default 3): K replays
of the same model (K seeds: other initial weights and data order) run at once by
:func:`ddlsim.backends.replay_multi.replay_many`, against the K replays one at a time in the
same round.

Timing: R interleaved rounds (default 5; the order rotates each round), one thread, this
process's CPU time on a CPU (``time.process_time``: the other jobs of a shared machine do not
count; wall time on cuda); every figure is a **paired ratio** (the two times of one round),
median and min–max over the rounds.

    python benchmarks/replay_models.py [--rounds 5] [--models digits,mlp500k,cnn] [--replicates 3]
        [--cases hardsync,async,allreduce]
    python benchmarks/replay_models.py --device cuda
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ddlsim.backends.base import BackendError
from ddlsim.backends.device import resolve_device
from ddlsim.backends.optim import Optimizer, mean_staleness
from ddlsim.backends.replay import make_replayer
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.workloads import Data, build_model, load_data
from ddlsim.scenarios.load import load_text
from ddlsim.simulator.catalog import dataset_info
from ddlsim.simulator.dataorder import SampleStream, global_slice_start, shard_start
from ddlsim.simulator.trace import APPLY, GRAD, Trace, TraceBuilder

from ddlsim.backends.replay_multi import replay_many, shares_calls

SCENARIO = """
seed = {seed}
[workload]
dataset = "{dataset}"
model = "{model}"
teacher_features = {features}
teacher_samples = 1024
[optimizer]
name = "sgd"
lr = 0.001
momentum = 0.9
[cluster]
learners = 30
minibatch = 4
[protocol]
name = "async"
"""

SYNTHETIC_TRAIN = 1024  # synthetic CIFAR-shaped inputs for the CNN (an epoch of 12 MiB, as the teacher set's)
SYNTHETIC_TEST = 256
clock = time.process_time  # this process's CPU time: the other jobs of a shared machine do not count (cuda: wall)


@dataclass
class Model:
    """A benchmark model: its scenario keys and how many gradients its traces hold."""

    name: str
    dataset: str
    model: str
    features: int
    hardsync_rounds: int
    async_grads: int


MODELS = {
    "digits": Model("digits MLP (9.6k)", "digits", "mlp", 32, 150, 3000),
    "mlp500k": Model("MLP 0.5M", "teacher", "mlp", 3900, 60, 900),
    "cnn": Model("rudra_cifar CNN (90k)", "cifar10", "rudra_cifar", 32, 25, 450),
    # not in the default list (the CUDA check uses them): MNIST-1D's ConvBase and its MLP
    "mnist1d_cnn": Model("MNIST-1D CNN (5k)", "mnist1d", "mnist1d_cnn", 32, 60, 1500),
    "mnist1d_mlp": Model("MNIST-1D MLP (15k)", "mnist1d", "mnist1d_mlp", 32, 60, 1500),
}
DEFAULT_MODELS = "digits,mlp500k,cnn"


def point_of(m: Model, seed: int = 0) -> dict:
    """The scenario point of model ``m`` (initial weights from ``seed``)."""
    return load_text(SCENARIO.format(seed=seed, dataset=m.dataset, model=m.model, features=m.features)).points()[0]


def data_of(m: Model, point: dict, device: torch.device) -> Data:
    """The model's data set: embedded or generated, or synthetic inputs of CIFAR-10's shape."""
    if m.dataset != "cifar10":
        return load_data(point, device=device)
    g = torch.Generator().manual_seed(0)
    info = dataset_info("cifar10")
    x = torch.randn(SYNTHETIC_TRAIN + SYNTHETIC_TEST, *info.shape, generator=g)
    y = torch.randint(0, 10, (SYNTHETIC_TRAIN + SYNTHETIC_TEST,), generator=g)
    return Data(x[:SYNTHETIC_TRAIN], y[:SYNTHETIC_TRAIN], x[SYNTHETIC_TRAIN:], y[SYNTHETIC_TRAIN:],
                info).to(device)


def hardsync_trace(lam: int, mu: int, rounds: int, n: int, seed: int) -> Trace:
    """λ gradients per round on the current version (global slices), one apply of weight 1/λ."""
    tb = TraceBuilder()
    for k in range(rounds):
        gops = [tb.grad(i, 0, k, global_slice_start(k, i, lam, mu), mu, k, k, k + 0.5, k * lam * mu / n)
                for i in range(lam)]
        tb.apply(0, k, gops, [1.0 / lam] * lam, [0] * lam, k + 1.0, (k + 1) * lam * mu / n)
    return tb.build({"nodes": 1, "data_seed": seed, "samples_per_epoch": n})


def allreduce_trace(lam: int, mu: int, rounds: int, n: int, seed: int) -> Trace:
    """AllReduce-SGD's encoding (docs/decentralized.md): round k, node i's gradient on its own
    version k (global slice i of batch k); one apply on node 0 of all λ at weight 1/λ; every
    other node copies node 0's version k+1 (self_coef 0, coef 1)."""
    tb = TraceBuilder()
    for k in range(rounds):
        gops = [tb.grad(i, i, k, global_slice_start(k, i, lam, mu), mu, k, k, k + 0.5, k * lam * mu / n)
                for i in range(lam)]
        epoch = (k + 1) * lam * mu / n
        tb.apply(0, k, gops, [1.0 / lam] * lam, [0] * lam, k + 1.0, epoch)
        for i in range(1, lam):
            tb.mix(i, k, 0, k + 1, 1.0, 0.0, k + 1.0, k + 1.0, epoch)
    return tb.build({"nodes": lam, "data_seed": seed, "samples_per_epoch": n})


def async_trace(lam: int, mu: int, grads: int, n: int, seed: int) -> Trace:
    """Round-robin ASGD: learner ``l`` pushes a gradient on the version it last pulled, the
    server applies it at once and ``l`` pulls the new version (σ = λ − 1)."""
    tb = TraceBuilder()
    read, k, v = [0] * lam, [0] * lam, 0
    for step in range(grads):
        i = step % lam
        g = tb.grad(i, 0, read[i], shard_start(k[i], i, lam, mu, n), mu, k[i], step, step + 1.0, v * mu / n)
        k[i] += 1
        tb.apply(0, v, [g], [1.0], [v - read[i]], step + 1.0, (v + 1) * mu / n)
        v += 1
        read[i] = v
    return tb.build({"nodes": 1, "data_seed": seed, "samples_per_epoch": n})


def loop_batches(trace: Trace, device: torch.device) -> list[Tensor]:
    """The plain loop's minibatches: per apply, the union of its gradients' samples (hardsync:
    the λμ of a round; async: the μ of its one gradient), in trace order."""
    ops, inp = trace.ops, trace.inputs
    stream = SampleStream(trace.header["data_seed"], trace.header["samples_per_epoch"])
    out = []
    for i in np.flatnonzero(ops["kind"] == APPLY):
        s, c = int(ops["in_start"][i]), int(ops["in_count"][i])
        gops = inp["grad_op"][s:s + c]
        idx = np.concatenate([stream.indices(int(ops["sample_start"][g]), int(ops["batch_size"][g])) for g in gops])
        out.append(torch.from_numpy(idx).to(device))
    return out


def plain_loop(point: dict, data: Data, batches: list[Tensor], device: torch.device) -> float:
    """Seconds for the idiomatic loop over ``batches``: forward, backward, torch.optim.SGD step."""
    model = build_model(point).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=point["optimizer"]["lr"], momentum=point["optimizer"]["momentum"])
    x, y = data.train_x, data.train_y
    n = len(y)
    batches = [b % n for b in batches]
    _sync(device)
    t = clock()
    for idx in batches:
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    _sync(device)
    return clock() - t


def replay(point: dict, data: Data, trace: Trace, device: torch.device, **kw) -> tuple[float, Replayer]:
    """Seconds for planning and executing ``trace`` (model and data already built); a
    multi-node trace through :func:`ddlsim.backends.replay.make_replayer` (the backend's pick)."""
    model = build_model(point).to(device)
    _sync(device)
    t = clock()
    opt = Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"]))
    rep = make(trace, model, data, opt, **kw)
    rep.run()
    _sync(device)
    dt = clock() - t
    if rep.diverged:  # it stopped early: its time would not be the trace's
        raise SystemExit(f"the replay diverged at update {rep.diverged_at_update}: lower the benchmark's rate")
    return dt, rep


def make(trace: Trace, model: torch.nn.Module, data: Data, opt: Optimizer, **kw) -> Replayer:
    """The replayer the backend would use: the generic one, or make_replayer's pick for
    several nodes (``batched=False`` forces the generic interpreter there too)."""
    if int(trace.header["nodes"]) == 1:
        return Replayer(trace, model, data, opt, **kw)
    rep = make_replayer(trace, model, data, opt, **({"stacked": "off"} if kw else {}), **kw)
    assert isinstance(rep, Replayer)  # AllReduce's trace: never the stacked nor the local replay
    return rep


def multi(points: list[dict], data: Data, traces: list[Trace], device: torch.device) -> float:
    """Seconds for planning and executing the K replays at once (:func:`replay_many`)."""
    models = [build_model(p).to(device) for p in points]
    _sync(device)
    t = clock()
    reps = [make(tr, m, data, Optimizer(p["optimizer"], mean_staleness(tr.inputs["staleness"])))
            for p, tr, m in zip(points, traces, models)]
    replay_many(reps)
    _sync(device)
    dt = clock() - t
    if any(r.diverged for r in reps):
        raise SystemExit("a replay diverged: lower the benchmark's rate")
    return dt


def singles(points: list[dict], data: Data, traces: list[Trace], device: torch.device) -> float:
    """Seconds for the K replays one after the other (the default path each)."""
    return sum(replay(p, data, tr, device)[0] for p, tr in zip(points, traces))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def paired(times: dict[str, list[float]], num: str, den: str) -> str:
    """Median (min–max) over rounds of the rate ratio num/den (same work), both timed in one round."""
    r = sorted(b / a for a, b in zip(times[num], times[den]))
    return f"{np.median(r):5.2f}× ({r[0]:.2f}–{r[-1]:.2f})"


def timed(runs: dict[str, Callable[[], float]], rounds: int) -> dict[str, list[float]]:
    """Each run once as warm-up, then ``rounds`` interleaved rounds (the order rotating)."""
    for f in runs.values():
        f()
    times: dict[str, list[float]] = {k: [] for k in runs}
    names = list(runs)
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            times[k].append(runs[k]())
    return times


def bench_model(key: str, a: argparse.Namespace, device: torch.device) -> None:
    m = MODELS[key]
    point = point_of(m)
    data = data_of(m, point, device)
    n = len(data.train_y)
    lam, mu = 30, 4
    makers = {"hardsync": lambda s: hardsync_trace(lam, mu, m.hardsync_rounds, n, s),
              "async": lambda s: async_trace(lam, mu, m.async_grads, n, s),
              "allreduce": lambda s: allreduce_trace(lam, mu, m.hardsync_rounds, n, s)}
    loops = {"hardsync": (f"loop μ={lam * mu}", 0.8), "async": (f"loop μ={mu}", 0.9),
             "allreduce": (f"loop μ={lam * mu}", 0.8)}
    cases = {c: (makers[c](0), *loops[c]) for c in a.cases.split(",")}
    print(f"\n{m.name}: {sum(p.numel() for p in build_model(point).parameters()):,} parameters, λ={lam}, μ={mu}")
    for case, (trace, loop_name, goal) in cases.items():
        batches = loop_batches(trace, device)
        runs: dict[str, Callable[[], float]] = {
            "loop": lambda: plain_loop(point, data, batches, device),
            "replay": lambda: replay(point, data, trace, device)[0],
            "rows, not fused": lambda: replay(point, data, trace, device, batching="always", fuse=False)[0],
            "one at a time": lambda: replay(point, data, trace, device, batched=False)[0],
        }
        try:
            replay(point, data, trace, device, batching="always", fuse=False)
        except TypeError:  # a tree without the batching rule: the default is the row batch
            del runs["rows, not fused"]
        times = timed(runs, a.rounds)
        _, rep = replay(point, data, trace, device)
        g = int((trace.ops["kind"] == GRAD).sum())
        print(f"  {case:8s} {g} gradients, {rep.plan.calls} calls by default; "
              f"{loop_name}: {g * mu / np.median(times['loop']):,.0f} samples/s")
        for k in runs:
            if k != "loop":
                print(f"    {k + ' / ' + loop_name:34s} {paired(times, k, 'loop')}"
                      + (f"  (goal ≥ {goal}×)" if k == "replay" else ""))
    if a.replicates < 2:
        return
    points = [point_of(m, seed) for seed in range(a.replicates)]
    print(f"  multi-replay: {a.replicates} seeds (initial weights, data order), replay_many / one by one:")
    for case in cases:
        traces = [makers[case](s) for s in range(a.replicates)]
        probe = make(traces[0], build_model(point).to(device), data, Optimizer(point["optimizer"], 0.0))
        times = timed({"multi": lambda: multi(points, data, traces, device),
                       "singles": lambda: singles(points, data, traces, device)}, a.rounds)
        print(f"    {case:8s} {paired(times, 'multi', 'singles')}  "
              + ("(calls shared)" if shares_calls(probe) else "(no calls shared: the replays run one by one)"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu | cuda (default cpu)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default=DEFAULT_MODELS, help=f"comma-separated, of {', '.join(MODELS)} "
                    f"(default {DEFAULT_MODELS})")
    ap.add_argument("--replicates", type=int, default=3, help="replays in the multi-replay batch (0: skip it)")
    ap.add_argument("--cases", default="hardsync,async,allreduce", help="comma-separated trace kinds")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    try:
        device = resolve_device(a.device)
    except BackendError as e:
        raise SystemExit(str(e)) from None
    global clock
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    print(f"device {device}, threads {torch.get_num_threads()}, {a.rounds} interleaved rounds, "
          f"{'CPU' if device.type == 'cpu' else 'wall'} time; paired ratios of rates, median (min–max)")
    for case in a.cases.split(","):
        if case not in ("hardsync", "async", "allreduce"):
            raise SystemExit(f"unknown case {case!r}: expected hardsync, async or allreduce")
    for key in a.models.split(","):
        if key not in MODELS:
            raise SystemExit(f"unknown model {key!r}: expected one of {', '.join(MODELS)}")
        bench_model(key, a, device)


if __name__ == "__main__":
    main()
