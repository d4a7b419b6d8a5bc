"""``ddlsim calibrate``: measure what the simulator needs to predict this machine.

* compute: seconds per minibatch (forward + backward, the replay's own gradient path) for
  each minibatch size, median of repeats after a warm-up;
* network: a gloo ping-pong between two processes on ``host``: latency = half the
  round trip of an 8-byte message, bandwidth from the one-way time of a large message;
* server: seconds to apply one gradient to the model (the live server's update path);
* all-reduce sweep (``calibrate --network``, :func:`time_allreduce`): torch.distributed
  all-reduces of 8 B … 16 MiB among 2+ local processes (gloo on CPU, nccl on GPUs), which
  backends/calibrate_network.py fits to α and β (simulator/network_profile.py);
* cycle (default; ``--no-cycle`` skips it): a short live ASGD run (2 learners, emulated
  compute, the model's size of messages) whose measured push → next compute gap is the
  round trip a learner really pays; the profile's ``latency_s`` is then the latency that
  makes the simulator charge exactly that (``2·latency + 2·M/bandwidth + apply_s``),
  which also covers the Python work of the live loops that a raw ping-pong misses
  (docs/validation.md). The ping-pong latency is kept as ``pingpong_latency_s``.

The profile is a TOML file that ``cluster.compute.profile`` reads (``minibatch``,
``seconds``); its ``[network]`` and ``[server]`` tables are for ``validate`` and for the
user to copy into scenarios.
"""

from __future__ import annotations

import math
import statistics
import time
from datetime import timedelta
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch

from ..simulator.catalog import SIMULATION_ONLY_MODELS, TRAINABLE_MODELS, dataset_info, param_count
from ..simulator.compute import PROFILE_HEAD
from ..simulator.files import atomic_write
from .base import BackendError
from .device import torch_threads
from .optim import Optimizer
from .flatmodel import FlatModel
from .workloads import make_model

PING_BYTES = 8
BULK_FLOATS = 1 << 22  # 16 MiB
CYCLE_PUSHES = 240       # gradients of the calibration run (≈ 3 s at 2 learners)
CYCLE_COMPUTE_S = 0.02   # emulated seconds per minibatch in it

CYCLE_POINT = """
name = "calibrate-cycle"
seed = 0
[workload]
dataset = "{dataset}"
model = "{model}"
epochs = 1
samples_per_epoch = {samples}
[cluster]
learners = 2
minibatch = 8
[cluster.compute]
distribution = "deterministic"
base_s = {compute}
per_sample_s = 0.0
[cluster.network]
bandwidth_Bps = {bandwidth}
[cluster.server]
apply_s = {apply}
[protocol]
name = "async"
[live]
compute = "emulated"
host = "{host}"
timeout_s = 60
"""


def time_compute(model: str, dataset: str, minibatches: list[int], device: str, repeats: int = 20) -> list[float]:
    """Median seconds of one minibatch gradient for each size."""
    info = dataset_info(dataset)
    torch.manual_seed(0)
    flat = FlatModel(make_model(model, info).to(device))
    z = flat.work.detach().clone()
    out = []
    for mu in minibatches:
        xb = torch.randn(mu, *info.shape, device=device)
        yb = torch.randint(0, info.classes, (mu,), device=device)
        samples = []
        for r in range(repeats + 3):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            flat.grad(z, xb, yb)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if r >= 3:
                samples.append(time.perf_counter() - t)
        out.append(statistics.median(samples))
    return out


def time_apply(param_count: int, repeats: int = 50) -> float:
    """Median seconds of one momentum-SGD apply on ``param_count`` parameters."""
    opt = Optimizer({"name": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0, "lr_policy": "constant",
                     "milestones": [], "warmup_epochs": 0.0})
    x, g = torch.zeros(param_count), torch.ones(param_count)
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        x = opt.step(0, x, g * 1.0, 0.01)
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _pingpong(rank: int, init: str, result: Any, rounds: int) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    small, bulk = torch.zeros(PING_BYTES // 4), torch.zeros(BULK_FLOATS)
    other = 1 - rank
    for size_tensor, key in ((small, "rtt_small"), (bulk, "rtt_bulk")):
        n = rounds if key == "rtt_small" else max(3, rounds // 20)
        dist.barrier()
        t = time.perf_counter()
        for _ in range(n):
            if rank == 0:
                dist.send(size_tensor, other)
                dist.recv(size_tensor, other)
            else:
                dist.recv(size_tensor, other)
                dist.send(size_tensor, other)
        if rank == 0:
            result[key] = (time.perf_counter() - t) / n
    dist.destroy_process_group()


def time_network(host: str = "127.0.0.1", rounds: int = 400) -> tuple[float, float]:
    """(latency_s, bandwidth_Bps) of gloo messages between two local processes."""
    import torch.multiprocessing as mp

    from .live import free_port

    with mp.get_context("spawn").Manager() as manager:
        result = manager.dict()
        mp.start_processes(_pingpong, args=(f"tcp://{host}:{free_port(host)}", result, rounds), nprocs=2,
                           start_method="spawn")
        small, bulk = result["rtt_small"], result["rtt_bulk"]
    latency = small / 2
    one_way = max(bulk / 2 - latency, 1e-9)
    return latency, BULK_FLOATS * 4 / one_way


SWEEP_MIN_BYTES = 8
SWEEP_MAX_BYTES = 16 << 20
SWEEP_FACTOR = 4


def sweep_sizes(max_bytes: int = SWEEP_MAX_BYTES) -> list[int]:
    """Message sizes of the all-reduce sweep: 8 B, ×4 each, up to ``max_bytes`` (multiples of 4 B)."""
    sizes, s = [], SWEEP_MIN_BYTES
    while s <= max_bytes:
        sizes.append(s)
        s *= SWEEP_FACTOR
    return sizes


def _allreduce_sweep(rank: int, world: int, init: str, backend: str, sizes: list[int]) -> dict[int, list[float]]:
    """One rank of the sweep: per size, a warm-up, then three trials of ``reps`` all-reduces;
    each trial's mean seconds per all-reduce, per size."""
    import torch.distributed as dist

    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # the communicator's and the barrier's device is this rank's own GPU
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    trials: dict[int, list[float]] = {}
    try:
        for nbytes in sizes:
            x = torch.zeros(nbytes // 4, device=device)
            reps = 20 if nbytes <= 1 << 16 else 5
            for _ in range(2):
                dist.all_reduce(x)
            runs = []
            for _ in range(3):
                dist.barrier()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t = time.perf_counter()
                for _ in range(reps):
                    dist.all_reduce(x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                runs.append((time.perf_counter() - t) / reps)
            trials[nbytes] = runs
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return trials


def _sweep_child(rank: int, world: int, init: str, backend: str, sizes: list[int]) -> None:
    torch.set_num_threads(1)
    _allreduce_sweep(rank, world, init, backend, sizes)


def time_allreduce(sizes: list[int], world: int = 2, backend: str = "gloo",
                   host: str = "127.0.0.1") -> dict[int, list[float]]:
    """Seconds of one all-reduce of each size in ``sizes`` (bytes of float32) among ``world``
    local processes over ``backend`` (gloo on CPU, nccl one GPU per process): three trial
    means per size. Rank 0 is this process (one process fewer to start), the others spawned."""
    import torch.multiprocessing as mp

    from .live import free_port

    if backend == "nccl" and torch.cuda.device_count() < world:
        raise BackendError(f"--ranks {world}: nccl needs one GPU per process; this machine has "
                           f"{torch.cuda.device_count()}")
    init = f"tcp://{host}:{free_port(host)}"
    ctx = mp.get_context("spawn")
    children = [ctx.Process(target=_sweep_child, args=(r, world, init, backend, sizes), daemon=True)
                for r in range(1, world)]
    for c in children:
        c.start()
    try:
        with torch_threads(1):
            trials = _allreduce_sweep(0, world, init, backend, sizes)
    finally:
        for c in children:
            c.join(timeout=30)
            if c.is_alive():
                c.terminate()
                c.join()
    failed = [c.exitcode for c in children if c.exitcode != 0]
    if failed:
        raise BackendError(f"a process of the all-reduce sweep ended with status {failed[0]}")
    return trials


def cycle_scenario(model: str, dataset: str, apply_s: float, bandwidth_Bps: float, host: str = "127.0.0.1") -> str:
    """The scenario (TOML) of the calibration cycle: a short live ASGD run, 2 learners,
    emulated compute, the model's size of messages, the measured apply and bandwidth."""
    bandwidth = f"{bandwidth_Bps:.6g}" if math.isfinite(bandwidth_Bps) else "inf"
    return CYCLE_POINT.format(dataset=dataset, model=model, samples=CYCLE_PUSHES * 8, compute=CYCLE_COMPUTE_S,
                              bandwidth=bandwidth, apply=f"{apply_s:.6g}", host=host)


def time_cycle(point: dict[str, Any]) -> tuple[float, float]:
    """(latency_s, round_trip_s) from a live run of the cycle ``point`` (:func:`cycle_scenario`,
    validated): ``round_trip_s`` is the mean measured gap between a learner's push and its next
    compute start; ``latency_s`` the per-message latency that makes the simulator's cycle equal
    it (never negative)."""
    from .live import calibrated_latency, round_trip_s, run_measured

    trace, _ = run_measured(point, 1.0)
    return calibrated_latency(trace, point), round_trip_s(trace)


def calibrate(model: str, dataset: str, device: str, minibatches: list[int], out: Path,
              network: bool = True, cycle: Callable[[float, float], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Measure and write the profile; return what was measured. ``cycle(apply_s, bandwidth)``
    gives the validated point of the calibration cycle (None: no cycle; the caller builds it
    from :func:`cycle_scenario`, the scenario loader being the command line's)."""
    if model in SIMULATION_ONLY_MODELS:
        raise BackendError(f"--model {model}: simulation-only model; calibrate {', '.join(TRAINABLE_MODELS)}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BackendError(f"--device {device}: CUDA is not available on this machine")
    with torch_threads(1):
        seconds = time_compute(model, dataset, minibatches, device)
        count = param_count(model, dataset_info(dataset))
        apply_s = time_apply(count)
    lat, bw = time_network() if network else (float("nan"), float("nan"))
    pingpong = lat
    round_trip = float("nan")
    if network and cycle is not None:
        lat, round_trip = time_cycle(cycle(apply_s, bw))
    lines = [
        f"{PROFILE_HEAD}: {model} on {dataset}, device {device}, measured {time.strftime('%Y-%m-%d')}",
        f'model = "{model}"', f'dataset = "{dataset}"', f'device = "{device}"',
        f"minibatch = {minibatches}",
        "seconds = [" + ", ".join(f"{s:.6g}" for s in seconds) + "]",
        "", "[server]", f"apply_s = {apply_s:.6g}",
    ]
    if network:
        lines += ["", "[network]", f"latency_s = {lat:.6g}", f"bandwidth_Bps = {bw:.6g}",
                  f"pingpong_latency_s = {pingpong:.6g}"]
        if cycle is not None:
            lines += [f"cycle_round_trip_s = {round_trip:.6g}"]
    atomic_write(out, ("\n".join(lines) + "\n").encode())
    return {"minibatch": minibatches, "seconds": seconds, "apply_s": apply_s, "latency_s": lat, "bandwidth_Bps": bw,
            "pingpong_latency_s": pingpong, "cycle_round_trip_s": round_trip}
