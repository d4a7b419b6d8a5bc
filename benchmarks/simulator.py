"""Simulator throughput as paired, interleaved ratios (this machine is shared and noisy).

One run measures, in the same process and interleaved (the order rotates every repeat):

* a **SimPy skeleton** of the same model, written here in idiomatic SimPy (a process per
  learner, ``env.timeout`` per phase, FIFO links and server as reservations, recording the
  same trace fields): the reference every ratio is against;
* ddlsim's **SimPy engine** (``engine="simpy"``, the reference model);
* ddlsim's **fast engine** (``engine="fast"``, byte-identical traces), and the same with
  ``keep_trace=False`` (**fast (summary)**: the summary, histogram and eval schedule only, the
  trace's rows folded away as they are made);
* a **minimal numba kernel** of the same model (:func:`minimal`: compute → the server's shared
  link in → its apply queue → the weights back over its link out, one heap of (time, counter)
  events, the draws made up front, no trace, no stalls, no buckets, every index unsigned
  (``fast_core.ix``, as the engine's: numba then skips a signed index's wrap-around), compiled with
  the engine's error model): what a compiled
  event loop of this model costs at least. The fast engine's goal is ≥ 0.8× its rate;
* the same kernel **writing the trace** the fast engine writes (:func:`minimal_traced`: the
  grad, apply, input and eval rows into columns allocated with their defaults): the second
  reference, which says how much of the gap is the trace, work the first reference skips.
  The like-for-like ratios: fast / minimal+trace (both write the trace) and fast (summary) /
  minimal (neither keeps one).

Workload: async, λ = 32, μ = 4, network (50 µs, 1.25 GB/s) and server (exponential apply,
50 µs) modelled. Printed: gradients per second of each (median of the repeats) and the
ratios engine / skeleton per repeat (median and range). Then wall times of single runs: the
Rudra-CIFAR10-scale run (λ = 30, μ = 4, 1.75M gradients) with the fast engine, and a ResNet-50
epoch on 32 nodes × 8 V100 with 25 MB DDP buckets, the SimPy and the fast AllReduce engine
paired (interleaved repeats, the speed ratio), and 90 such epochs with the fast engine; the
same pairing on half an epoch of Rudra-ImageNet async (a parameter server receiving 12 gradient
buckets per push) and its 35 epochs with the fast engine. The PS
fast engine's compile time (numba, cached on disk after the first run) is reported apart.

``--big`` adds the memory check: a 100M-gradient async run (λ = 32, μ = 4, 8,000 CIFAR10
epochs) through ``ddlsim simulate --force`` (no trace kept), its wall time and the peak
resident memory of that process (``resource.getrusage``, goal ≤ 8 GB).

Run: ``python benchmarks/simulator.py [--quick] [--repeats R] [--big] [--ratios-only]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import simpy

from ddlsim.scenarios.load import load, load_text
from ddlsim.simulator.fast_core import block_columns, ix
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import EVAL, INPUT_COLUMNS, OP_COLUMNS

CATALOGUE = Path(__file__).resolve().parent.parent / "scenarios" / "catalogue"
ASYNC = """
[workload]
dataset = "cifar10"
model = "rudra_cifar"
epochs = {epochs}
[cluster]
learners = {learners}
minibatch = 4
[cluster.compute]
distribution = "lognormal"
base_s = 0.002
per_sample_s = 0.0005
cv = 0.2
[cluster.network]
latency_s = 5e-5
bandwidth_Bps = 1.25e9
[cluster.server]
apply_s = 5e-5
apply_distribution = "exponential"
[protocol]
name = "{protocol}"
n = {n}
"""

DDP = """
[workload]
dataset = "imagenet"
model = "resnet50"
epochs = 1
[cluster]
learners = 256
gpus_per_node = 8
minibatch = 32
gpu = "v100"
[cluster.network]
preset = "ib-edr-x4"
[protocol]
name = "allreduce"
"""


def point(protocol: str, learners: int, epochs: float, n: int = 1) -> dict:
    return load_text(ASYNC.format(protocol=protocol, learners=learners, epochs=epochs, n=n)).points()[0]


def skeleton(p: dict) -> int:
    """The same async model in idiomatic SimPy: a process per learner, ``env.timeout`` per
    phase, FIFO links and server as reservations (free-at times), the trace fields recorded
    in lists. Gradients simulated."""
    lam, mu = p["cluster"]["learners"], p["cluster"]["minibatch"]
    total = int(np.ceil(p["workload"]["epochs"] * p["workload"]["samples_per_epoch"] / mu))
    comp, net, srv = p["cluster"]["compute"], p["cluster"]["network"], p["cluster"]["server"]
    mean = comp["base_s"] + comp["per_sample_s"] * mu
    s2 = np.log1p(comp["cv"] ** 2)
    rng = np.random.default_rng(0)
    draws = rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), total + lam).tolist()
    applies = rng.exponential(srv["apply_s"], total + lam).tolist()
    tx = p["workload"]["param_count"] * net["bytes_per_param"] / net["bandwidth_Bps"]
    lat = net["latency_s"]
    env = simpy.Environment()
    free = {"in": 0.0, "out": 0.0, "server": 0.0}
    state = {"version": 0, "issued": 0, "samples": 0}
    trace: list[tuple] = []

    def reserve(link: str, at: float, service: float) -> float:
        start = max(at, free[link])
        free[link] = start + service
        return free[link]

    def learner(i: int):
        k = 0
        while state["issued"] < total:
            arrive = reserve("out", env.now, tx) + lat          # pull the weights
            j = state["version"]
            n = state["issued"]
            state["issued"] += 1
            yield env.timeout(arrive - env.now + draws[n])     # compute
            t_end = env.now
            trace.append(("grad", i, j, k, arrive, t_end, state["samples"] / 50_000))
            done = reserve("server", reserve("in", env.now, tx) + lat, applies[n])
            yield env.timeout(done - env.now)                   # push, wait until applied
            v = state["version"]
            state["version"] = v + 1
            state["samples"] += mu
            trace.append(("apply", 0, v, v - j, env.now, env.now, state["samples"] / 50_000))
            k += 1

    for i in range(lam):
        env.process(learner(i))
    env.run()
    return state["version"]


def _minimal_kernel(lam: int, total: int, draws: np.ndarray, applies: np.ndarray, tx: float, lat: float) -> int:
    """Async PS: every learner pulls at t = 0 (the link out, FIFO), computes, pushes (the link
    in, then the apply queue, FIFO), and pulls again once the server applied it; until
    ``total`` gradients. Events in a binary heap on (time, counter). Returns the updates."""
    ht = np.zeros(lam)
    hk = np.zeros(lam, np.int64)
    hs = np.zeros(lam, np.int64)
    phase = np.zeros(lam, np.int64)  # 0: computing, 1: being applied
    out_free = in_free = srv_free = 0.0
    n = 0
    counter = 0
    issued = 0
    version = 0
    napp = 0
    for i in range(lam):  # pulls at t = 0
        start = out_free if out_free > 0.0 else 0.0
        out_free = start + tx
        t = out_free + lat + draws[ix(issued)]
        issued += 1
        pos = n
        n += 1
        while pos > 0:
            par = (pos - 1) >> 1
            if ht[ix(par)] < t or (ht[ix(par)] == t and hk[ix(par)] < counter):
                break
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = ht[ix(par)], hk[ix(par)], hs[ix(par)]
            pos = par
        ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = t, counter, i
        counter += 1
    while n > 0:
        now, i = ht[0], hs[0]
        n -= 1  # pop
        t, key, slot = ht[ix(n)], hk[ix(n)], hs[ix(n)]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= n:
                break
            right = child + 1
            if right < n:
                tr, tc = ht[ix(right)], ht[ix(child)]
                if tr < tc or (tr == tc and hk[ix(right)] < hk[ix(child)]):
                    child = right
            if t < ht[ix(child)] or (t == ht[ix(child)] and key < hk[ix(child)]):
                break
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = ht[ix(child)], hk[ix(child)], hs[ix(child)]
            pos = child
        if n > 0:
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = t, key, slot
        if phase[ix(i)] == 0:  # computed: push through the link in to the apply queue
            start = in_free if in_free > now else now
            in_free = start + tx
            arrive = in_free + lat
            start = srv_free if srv_free > arrive else arrive
            srv_free = start + applies[ix(napp)]
            napp += 1
            t = srv_free
            phase[ix(i)] = 1
        else:  # applied: a new version; pull again while gradients are left
            version += 1
            if issued >= total:
                continue
            start = out_free if out_free > now else now
            out_free = start + tx
            t = out_free + lat + draws[ix(issued)]
            issued += 1
            phase[ix(i)] = 0
        pos = n
        n += 1
        while pos > 0:
            par = (pos - 1) >> 1
            if ht[ix(par)] < t or (ht[ix(par)] == t and hk[ix(par)] < counter):
                break
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = ht[ix(par)], hk[ix(par)], hs[ix(par)]
            pos = par
        ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = t, counter, i
        counter += 1
    return version


def _minimal_traced_kernel(lam: int, total: int, draws: np.ndarray, applies: np.ndarray, tx: float, lat: float,
                           mu: int, n: int, every: float, kind: np.ndarray, node: np.ndarray, version: np.ndarray,
                           src_node: np.ndarray, src_version: np.ndarray, sample_start: np.ndarray,
                           batch_size: np.ndarray, batch_index: np.ndarray, t_start: np.ndarray, t_end: np.ndarray,
                           epoch: np.ndarray, in_start: np.ndarray, in_count: np.ndarray, grad_op: np.ndarray,
                           weight: np.ndarray, staleness: np.ndarray) -> int:
    """:func:`_minimal_kernel`, also writing the trace rows the fast engine writes for it: a
    grad row per gradient (ten columns), an apply row (eight) and its input (three), an eval
    row every ``every`` samples applied (six), into the columns given (their defaults
    pre-filled). What the trace alone costs a compiled event loop. Returns the ops written."""
    ht = np.zeros(lam)
    hk = np.zeros(lam, np.int64)
    hs = np.zeros(lam, np.int64)
    phase = np.zeros(lam, np.int64)  # 0: computing, 1: being applied
    read = np.zeros(lam, np.int64)    # the version each learner computes on
    began = np.zeros(lam)             # when its compute began
    grad = np.zeros(lam, np.int64)    # its grad op
    batches = np.zeros(lam, np.int64)
    out_free = in_free = srv_free = 0.0
    h = counter = issued = version_now = napp = samples = 0
    ops = 1  # row 0: the eval of version 0 (pre-filled by the caller)
    mark = every
    for i in range(lam):  # pulls at t = 0
        start = out_free if out_free > 0.0 else 0.0
        out_free = start + tx
        began[ix(i)] = out_free + lat
        t = began[ix(i)] + draws[ix(issued)]
        issued += 1
        pos = h
        h += 1
        while pos > 0:
            par = (pos - 1) >> 1
            if ht[ix(par)] < t or (ht[ix(par)] == t and hk[ix(par)] < counter):
                break
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = ht[ix(par)], hk[ix(par)], hs[ix(par)]
            pos = par
        ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = t, counter, i
        counter += 1
    while h > 0:
        now, i = ht[0], hs[0]
        h -= 1  # pop
        t, key, slot = ht[ix(h)], hk[ix(h)], hs[ix(h)]
        pos = 0
        while True:
            child = 2 * pos + 1
            if child >= h:
                break
            right = child + 1
            if right < h:
                tr, tc = ht[ix(right)], ht[ix(child)]
                if tr < tc or (tr == tc and hk[ix(right)] < hk[ix(child)]):
                    child = right
            if t < ht[ix(child)] or (t == ht[ix(child)] and key < hk[ix(child)]):
                break
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = ht[ix(child)], hk[ix(child)], hs[ix(child)]
            pos = child
        if h > 0:
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = t, key, slot
        if phase[ix(i)] == 0:  # computed: its grad row; push through the link in to the apply queue
            k = batches[ix(i)]
            batches[ix(i)] = k + 1
            kind[ix(ops)], node[ix(ops)], src_node[ix(ops)], src_version[ix(ops)] = 0, i, 0, read[ix(i)]
            sample_start[ix(ops)], batch_size[ix(ops)], batch_index[ix(ops)] = (k * lam + i) * mu, mu, k
            t_start[ix(ops)], t_end[ix(ops)], epoch[ix(ops)] = began[ix(i)], now, samples / n
            grad[ix(i)] = ops
            ops += 1
            start = in_free if in_free > now else now
            in_free = start + tx
            arrive = in_free + lat
            start = srv_free if srv_free > arrive else arrive
            srv_free = start + applies[ix(napp)]
            t = srv_free
            phase[ix(i)] = 1
        else:  # applied: its apply row and input, maybe an eval; pull again while gradients are left
            samples += mu
            o, a = ix(ops), ix(napp)
            kind[o], node[o], version[o], in_start[o], in_count[o] = 1, 0, version_now, napp, 1
            t_start[o], t_end[o], epoch[o] = now, now, samples / n
            grad_op[a], weight[a], staleness[a] = grad[ix(i)], 1.0, version_now - read[ix(i)]
            ops += 1
            napp += 1
            version_now += 1
            if samples >= mark - 1e-9:
                while mark <= samples + 1e-9:
                    mark += every
                kind[ix(ops)], node[ix(ops)], version[ix(ops)] = 3, 0, version_now
                t_start[ix(ops)], t_end[ix(ops)], epoch[ix(ops)] = now, now, samples / n
                ops += 1
            if issued >= total:
                continue
            start = out_free if out_free > now else now
            out_free = start + tx
            began[ix(i)] = out_free + lat
            read[ix(i)] = version_now
            t = began[ix(i)] + draws[ix(issued)]
            issued += 1
            phase[ix(i)] = 0
        pos = h
        h += 1
        while pos > 0:
            par = (pos - 1) >> 1
            if ht[ix(par)] < t or (ht[ix(par)] == t and hk[ix(par)] < counter):
                break
            ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = ht[ix(par)], hk[ix(par)], hs[ix(par)]
            pos = par
        ht[ix(pos)], hk[ix(pos)], hs[ix(pos)] = t, counter, i
        counter += 1
    return ops


try:
    import numba
    # compiled as the engine's kernels are (fast_core.kernel: NumPy's error model, no zero-division checks)
    _minimal_kernel = numba.njit(cache=True, nogil=True, error_model="numpy")(_minimal_kernel)
    _minimal_traced_kernel = numba.njit(cache=True, nogil=True, error_model="numpy")(_minimal_traced_kernel)
except ImportError:  # pragma: no cover
    numba = None


def minimal(p: dict) -> int:
    """:func:`_minimal_kernel` on ``p``'s async model, its draws made here (as the skeleton's):
    the updates simulated."""
    lam, mu = p["cluster"]["learners"], p["cluster"]["minibatch"]
    total = int(np.ceil(p["workload"]["epochs"] * p["workload"]["samples_per_epoch"] / mu))
    comp, net, srv = p["cluster"]["compute"], p["cluster"]["network"], p["cluster"]["server"]
    mean = comp["base_s"] + comp["per_sample_s"] * mu
    s2 = np.log1p(comp["cv"] ** 2)
    rng = np.random.default_rng(0)
    draws = rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), total + lam)
    applies = rng.exponential(srv["apply_s"], total + lam)
    tx = p["workload"]["param_count"] * net["bytes_per_param"] / net["bandwidth_Bps"]
    return int(_minimal_kernel(lam, total, draws, applies, tx, net["latency_s"] + net["overhead_s"]))


def minimal_traced(p: dict) -> int:
    """:func:`_minimal_traced_kernel` on ``p``'s async model: :func:`minimal`'s draws, and the
    trace columns allocated with their defaults as the fast engine allocates them. The updates."""
    lam, mu = p["cluster"]["learners"], p["cluster"]["minibatch"]
    wl = p["workload"]
    total = int(np.ceil(wl["epochs"] * wl["samples_per_epoch"] / mu))
    comp, net, srv = p["cluster"]["compute"], p["cluster"]["network"], p["cluster"]["server"]
    mean = comp["base_s"] + comp["per_sample_s"] * mu
    s2 = np.log1p(comp["cv"] ** 2)
    rng = np.random.default_rng(0)
    draws = rng.lognormal(np.log(mean) - s2 / 2, np.sqrt(s2), total + lam)
    applies = rng.exponential(srv["apply_s"], total + lam)
    tx = wl["param_count"] * net["bytes_per_param"] / net["bandwidth_Bps"]
    n = wl["samples_per_epoch"]
    every = n / wl["evals_per_epoch"]
    ops, inputs = block_columns(2 * total + int(total * mu / every) + 8, total + 2)
    kind = ops["kind"]
    kind[0], ops["node"][0], ops["version"][0] = EVAL, 0, 0
    _minimal_traced_kernel(lam, total, draws, applies, tx, net["latency_s"] + net["overhead_s"], mu, n, every,
                           *(ops[c] for c in OP_COLUMNS if c not in ("coef", "self_coef")),
                           *(inputs[c] for c in INPUT_COLUMNS))
    return total


def rate(fn, p: dict) -> float:
    t0 = time.perf_counter()
    grads = fn(p)
    return grads / (time.perf_counter() - t0)


def rudra_imagenet_async(*sets: str) -> dict:
    return next(p for p in load(CATALOGUE / "rudra-imagenet.toml", list(sets)).points()
                if p["protocol"]["name"] == "async")


def paired_walls(p: dict, repeats: int) -> str:
    """The SimPy and the fast engine on ``p``, interleaved (the order alternates): the speed
    ratio per pair, median and range, with the median wall times (this machine)."""
    walls: dict[str, list[float]] = {"simpy": [], "fast": []}
    for r in range(repeats):
        for name in ("simpy", "fast") if r % 2 == 0 else ("fast", "simpy"):
            t0 = time.perf_counter()
            simulate(p, name)
            walls[name].append(time.perf_counter() - t0)
    speed = [s / f for s, f in zip(walls["simpy"], walls["fast"])]
    return (f"{statistics.median(speed):.1f}× (range {min(speed):.1f}–{max(speed):.1f}; simpy "
            f"{statistics.median(walls['simpy']):.2f} s, fast {statistics.median(walls['fast']):.3f} s wall)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the work")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big", action="store_true", help="also the 100M-gradient memory check (≈ 2 min)")
    ap.add_argument("--ratios-only", action="store_true", help="only the interleaved rates and ratios")
    args = ap.parse_args()
    if args.big:
        big()
    scale = 0.1 if args.quick else 1.0
    p = point("async", 32, 20 * scale)
    t0 = time.perf_counter()
    simulate(point("async", 4, 0.01), "fast")  # compile (or load the cached compilation)
    simulate(point("async", 4, 0.01), "fast", keep_trace=False)  # (the summary-only kernel)
    simulate(point("hardsync", 4, 0.01), "fast")  # (the general kernel: a barrier)
    minimal(point("async", 4, 0.01))
    minimal_traced(point("async", 4, 0.01))
    print(f"fast engine start-up (numba compile or cache load): {time.perf_counter() - t0:.2f} s")
    runners = {
        "skeleton": skeleton,
        "simpy": lambda q: int(simulate(q, "simpy").summary["gradients"]),
        "fast": lambda q: int(simulate(q, "fast").summary["gradients"]),
        "fast (summary)": lambda q: int(simulate(q, "fast", keep_trace=False).summary["gradients"]),
        "minimal": minimal,
        "minimal+trace": minimal_traced,
    }
    rates: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for r in range(args.repeats):
        for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order: no engine always first
            rates[name].append(rate(runners[name], p))
    grads = int(simulate(p, "fast").summary["gradients"])
    print(f"async λ=32, μ=4, network + server, {grads:,} gradients; {args.repeats} interleaved repeats "
          "(gradients per wall-clock second, this machine):")
    for name in names:
        print(f"  {name:14s} median {statistics.median(rates[name]):>12,.0f}/s")
    for name in ("simpy", "fast"):
        ratio = [a / b for a, b in zip(rates[name], rates["skeleton"])]
        goal = "≥ 1.0×" if name == "simpy" else "≥ 10×"
        print(f"  {name} / skeleton: median {statistics.median(ratio):.2f}× (range {min(ratio):.2f}–{max(ratio):.2f}; "
              f"goal {goal})")
    for name, ref, what in (("fast", "minimal", "; goal ≥ 0.8×"), ("fast", "minimal+trace", ": both write the trace"),
                            ("fast (summary)", "minimal", ": neither keeps a trace"),
                            ("minimal+trace", "minimal", ": what writing the trace costs")):
        ratio = [a / b for a, b in zip(rates[name], rates[ref])]
        print(f"  {name} / {ref}: median {statistics.median(ratio):.2f}× (range {min(ratio):.2f}–"
              f"{max(ratio):.2f}{what})")
    if args.ratios_only:
        return
    for proto in ("softsync", "hardsync", "async"):
        q = point(proto, 30, 140 * scale)
        t0 = time.perf_counter()
        n = simulate(q, "fast").summary["gradients"]
        print(f"Rudra CIFAR10 scale {proto:8s} λ=30 μ=4, fast engine: {n:,} gradients in "
              f"{time.perf_counter() - t0:.2f} s wall (goal < 2 s for 1.75M)")
    imagenet = rudra_imagenet_async()
    one = rudra_imagenet_async(f"workload.epochs={0.1 if args.quick else 0.5}")
    pair = paired_walls(one, args.repeats)
    t0 = time.perf_counter()
    n = simulate(imagenet, "fast", keep_trace=False).summary["gradients"]
    print(f"Rudra-ImageNet async (λ = 18, μ = 16, 72M parameters pushed as 12 buckets of 25 MB): "
          f"{one['workload']['epochs']} epoch paired, fast / simpy speed {pair}; the 35 epochs "
          f"({n:,} gradients), fast engine, no trace: {time.perf_counter() - t0:.1f} s wall")
    ddp = load_text(DDP).points()[0]
    iters = simulate(ddp, "fast").summary["iterations"]
    print(f"ResNet-50 epoch, 32 nodes × 8 V100, DDP 25 MB buckets over 4×EDR ({iters} iterations, 40k grads): "
          f"fast / simpy speed {paired_walls(ddp, args.repeats)}")
    long = load_text(DDP.replace("epochs = 1", f"epochs = {max(1, round(90 * scale))}")).points()[0]
    t0 = time.perf_counter()
    s = simulate(long, "fast", keep_trace=False).summary
    print(f"  the same, {long['workload']['epochs']} epochs ({s['gradients']:,} gradients), fast engine, no trace: "
          f"{time.perf_counter() - t0:.2f} s wall")


def big() -> None:
    """100M gradients through the CLI in a child process: wall time and its peak RSS."""
    import resource
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        scen = Path(tmp) / "big.toml"
        scen.write_text('name = "big"\n' + ASYNC.format(protocol="async", learners=32, epochs=8000, n=1))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "ddlsim", "simulate", str(scen), "--force",
                               "--quiet", "--out", str(Path(tmp) / "out")], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if proc.returncode != 0:
            print(proc.stderr[-2000:])
        rows = (Path(tmp) / "out" / "summary.csv").read_text().splitlines()
        grads = int(rows[1].split(",")[rows[0].split(",").index("gradients")])
        print(f"100M-gradient async run (ddlsim simulate, no trace): {grads:,} gradients in {wall:.0f} s wall, "
              f"peak RSS {peak_kib / 2**20:.2f} GiB (goal ≤ 8 GB); results folder "
              f"{sum(f.stat().st_size for f in (Path(tmp) / 'out').rglob('*') if f.is_file()) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
