"""Simulator and replay throughput of local SGD, DiLoCo and compressed all-reduce against AllReduce-SGD.

    python benchmarks/low_communication.py [--repeats 7] [--learners 8] [--epochs 2] [--sim-epochs 20]

Each repeat times AllReduce-SGD and every other configuration back to back, in an order that
alternates between repeats (interleaved: the machine's drift hits both sides of a ratio alike),
and reports per configuration the median and the range of the paired ratios
``time(config) / time(allreduce)``, for the simulation (``simulate``, SimPy/loop engines, no
torch) and for the replay of its trace (digits MLP, CPU, one thread). AllReduce-SGD's own engine is its
closed form (fast_allreduce); the row "allreduce (SimPy engine)" is its SimPy engine against
that, the reference for a per-step Python loop. A ratio below 1 is faster
than AllReduce-SGD. Replays of a configuration do different arithmetic (H local steps per node
instead of one fused step of every node; the outer step; PowerSGD's products), so their ratio
is the cost of that arithmetic, not of the interpreter alone.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

CONFIGS: list[tuple[str, dict[str, Any]]] = [
    ("allreduce (SimPy engine)", {"protocol.name": "allreduce", "engine": "simpy"}),
    ("local_sgd H=4", {"protocol.name": "local_sgd", "protocol.local_steps": 4}),
    ("diloco H=4", {"protocol.name": "diloco", "protocol.local_steps": 4}),
    ("diloco H=4 F=2", {"protocol.name": "diloco", "protocol.local_steps": 4, "protocol.fragments": 2}),
    ("allreduce fp16", {"protocol.name": "allreduce", "protocol.compression": "fp16"}),
    ("allreduce powersgd r=2", {"protocol.name": "allreduce", "protocol.compression": "powersgd",
                                "protocol.powersgd_rank": 2}),
]


def _point(sets: dict[str, Any], learners: int, epochs: float) -> dict[str, Any]:
    from ddlsim.scenarios.load import load_text

    base = {"protocol.name": "allreduce", "cluster.learners": learners, "cluster.minibatch": 16,
            "workload.epochs": epochs, "optimizer.name": "sgd", "optimizer.lr": 0.1}
    base.update({k: v for k, v in sets.items() if k != "engine"})
    overrides = [f"{k}={v!r}".replace("'", '"') for k, v in base.items()]
    point = load_text("", "<bench>", overrides).points()[0]
    point["_engine"] = sets.get("engine", "auto")
    return point


def _time_sim(point: dict[str, Any]) -> tuple[float, Any]:
    from ddlsim.simulator.run import simulate

    t = time.perf_counter()
    sim = simulate(point, point["_engine"])
    return time.perf_counter() - t, sim.trace


def _time_replay(point: dict[str, Any], trace: Any) -> float:
    from ddlsim.backends.optim import Optimizer, mean_staleness
    from ddlsim.backends.replay import make_replayer
    from ddlsim.backends.workloads import build_model, load_data

    data = load_data(point)
    opt = Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"]))
    rep = make_replayer(trace, build_model(point), data, opt)
    t = time.perf_counter()
    rep.run()
    return time.perf_counter() - t


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--learners", type=int, default=8)
    ap.add_argument("--epochs", type=float, default=2.0, help="epochs of a replayed run")
    ap.add_argument("--sim-epochs", type=float, default=20.0, help="epochs of a timed simulation")
    args = ap.parse_args()
    torch.set_num_threads(1)
    ar = _point({}, args.learners, args.epochs)
    points = [(name, _point(sets, args.learners, args.epochs)) for name, sets in CONFIGS]
    ar_sim = _point({}, args.learners, args.sim_epochs)
    sims = {name: _point(sets, args.learners, args.sim_epochs) for name, sets in CONFIGS}
    sim_ratio: dict[str, list[float]] = {name: [] for name, _ in points}
    rep_ratio: dict[str, list[float]] = {name: [] for name, _ in points}
    _time_sim(ar)  # warm-up: imports, data
    for r in range(args.repeats):
        for name, p in points:
            order = [ar_sim, sims[name]] if r % 2 == 0 else [sims[name], ar_sim]
            st = {id(q): _time_sim(q)[0] for q in order}
            sim_ratio[name].append(st[id(sims[name])] / st[id(ar_sim)])
            order = [ar, p] if r % 2 == 0 else [p, ar]
            traces = {id(q): _time_sim(q)[1] for q in order}
            rt = {id(q): _time_replay(q, traces[id(q)]) for q in order}
            rep_ratio[name].append(rt[id(p)] / rt[id(ar)])
    print(f"paired ratios time(config)/time(allreduce, auto engine), {args.repeats} interleaved repeats, "
          f"λ = {args.learners}, μ = 16, digits: simulate {args.sim_epochs:g} epochs, replay {args.epochs:g}")
    print(f"{'configuration':26s} {'simulate: median (range)':28s} {'replay: median (range)':28s}")
    for name, _ in points:
        s, q = sim_ratio[name], rep_ratio[name]
        print(f"{name:26s} {statistics.median(s):6.2f} ({min(s):.2f}–{max(s):.2f}){'':12s} "
              f"{statistics.median(q):6.2f} ({min(q):.2f}–{max(q):.2f})")


if __name__ == "__main__":
    main()
