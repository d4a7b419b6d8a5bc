"""A prepared check of the replay on CUDA: run it where a GPU is at hand (CI never needs one).

Three parts, each printing its figures (exit status 0 when every check holds, 1 when one
does not, 0 with a message when CUDA is not available):

1. **MNIST-1D on cuda against the CPU.** Simulated hardsync and async traces (λ = 4, μ = 25,
   half an epoch of MNIST-1D; the mnist1d_cnn and mnist1d_mlp models, SGD with momentum)
   replayed by :class:`ddlsim.backends.replay.ReplayBackend` on ``cuda`` and on ``cpu``. A
   replay is chaotic over long runs, so the check is short: every evaluation's test error
   within 3 test samples (of 1,000) and the train loss within 1e-3 of the CPU's.
2. **Speed on cuda** (wall time, synchronised): ``benchmarks/replay_models.py``'s cases for
   MNIST-1D's CNN and Rudra's CIFAR-10 CNN (synthetic inputs of CIFAR-10's shape) — hardsync
   λ = 30, μ = 4 against the plain loop of minibatch λμ, async against the loop of minibatch μ
   — and the multi-replay batch (3 seeds at once against one by one).
3. **The multi-replay batch on cuda**: three seeds of the digits MLP (hardsync and async),
   :func:`ddlsim.backends.replay_multi.replay_many` against each replay alone; on the CPU
   they agree bit for bit, here the largest weight difference is printed (a GPU's batched
   products may round differently with the batch size) and must stay below 1e-4.

    python benchmarks/cuda_check.py [--rounds 3] [--device cuda:0]
    python benchmarks/cuda_check.py --device cpu     # a dry run of the script's code on the CPU
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="a CUDA device (default cuda; cpu: a dry run of the code)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds of part 2")
    a = ap.parse_args(argv)
    device = torch.device(a.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("cuda_check: CUDA is not available here; nothing to check (run it on a machine with a GPU)")
        return 0
    torch.set_num_threads(1)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (a dry run: no GPU checked)"
    print(f"device {name}, torch {torch.__version__}")
    ok = part_cpu_agreement(device)
    part_speed(device, a.rounds)
    ok = part_multi(device) and ok
    print("cuda_check: all checks hold" if ok else "cuda_check: a check FAILED (see above)")
    return 0 if ok else 1


def part_cpu_agreement(device: torch.device) -> bool:
    """Part 1: MNIST-1D replays on cuda against the same replays on the CPU."""
    from ddlsim.backends.base import RunOptions
    from ddlsim.backends.replay import ReplayBackend
    from ddlsim.scenarios.load import load_text
    from ddlsim.simulator.run import simulate

    print("\n1. MNIST-1D, cuda against cpu (test error within 3 samples, train loss within 1e-3)")
    ok = True
    for model in ("mnist1d_cnn", "mnist1d_mlp"):
        for protocol in ("hardsync", "async"):
            point = load_text(f"""
seed = 0
[workload]
dataset = "mnist1d"
model = "{model}"
epochs = 0.5
evals_per_epoch = 4
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
[cluster]
learners = 4
minibatch = 25
[protocol]
name = "{protocol}"
""").points()[0]
            trace = simulate(point).trace
            t0 = time.perf_counter()
            gpu = ReplayBackend().run(trace, point, RunOptions(device=str(device)))
            t_gpu = time.perf_counter() - t0
            t0 = time.perf_counter()
            cpu = ReplayBackend().run(trace, point, RunOptions(device="cpu"))
            t_cpu = time.perf_counter() - t0
            d_err = max(abs(g["test_error"] - c["test_error"]) for g, c in zip(gpu.curves, cpu.curves))
            d_loss = max((abs(g["train_loss"] - c["train_loss"]) for g, c in zip(gpu.curves, cpu.curves)
                          if g["train_loss"] == g["train_loss"]), default=0.0)
            good = len(gpu.curves) == len(cpu.curves) and d_err <= 3 / 1000 + 1e-9 and d_loss <= 1e-3
            ok = ok and good
            dev = device.type
            print(f"   {model:12s} {protocol:8s} final error {dev} {gpu.summary['final_test_error']:.3f} "
                  f"cpu {cpu.summary['final_test_error']:.3f}; max Δ test error {d_err:.4f}, Δ train loss "
                  f"{d_loss:.1e}; wall {dev} {t_gpu:.2f} s, cpu {t_cpu:.2f} s  {'ok' if good else 'FAILED'}")
    return ok


def part_speed(device: torch.device, rounds: int) -> None:
    """Part 2: replay_models.py's cases on cuda (wall time)."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import replay_models

    print("\n2. Speed on cuda (benchmarks/replay_models.py, wall time)")
    replay_models.main(["--device", str(device), "--rounds", str(rounds), "--models", "mnist1d_cnn,cnn,digits"])


def part_multi(device: torch.device) -> bool:
    """Part 3: replay_many on cuda against each replay alone."""
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import replay_models as rm
    from ddlsim.backends.optim import Optimizer, mean_staleness
    from ddlsim.backends.replay_generic import Replayer
    from ddlsim.backends.replay_multi import replay_many, shares_calls
    from ddlsim.backends.workloads import build_model

    print("\n3. Multi-replay batch on cuda: 3 seeds of the digits MLP, at once against alone (max |Δw| < 1e-4)")
    m = rm.MODELS["digits"]
    points = [rm.point_of(m, s) for s in range(3)]
    data = rm.data_of(m, points[0], device)
    n = len(data.train_y)
    ok = True
    for case, make in (("hardsync", lambda s: rm.hardsync_trace(30, 4, 100, n, s)),
                       ("async", lambda s: rm.async_trace(30, 4, 3000, n, s))):
        traces = [make(s) for s in range(3)]

        def reps() -> list[Replayer]:
            return [Replayer(t, build_model(p).to(device), data,
                             Optimizer(p["optimizer"], mean_staleness(t.inputs["staleness"])))
                    for p, t in zip(points, traces)]

        alone = reps()
        _sync(device)
        t0 = time.perf_counter()
        for r in alone:
            r.run()
        _sync(device)
        t_alone = time.perf_counter() - t0
        together = reps()
        t0 = time.perf_counter()
        replay_many(together)
        _sync(device)
        t_many = time.perf_counter() - t0
        diff = max(float((a.final_states()[0][0] - b.final_states()[0][0]).abs().max())
                   for a, b in zip(alone, together))
        good = diff < 1e-4 and not any(r.diverged for r in alone + together)
        ok = ok and good
        print(f"   {case:8s} calls shared: {shares_calls(together[0])}; at once {t_many:.2f} s, alone {t_alone:.2f} s "
              f"({t_alone / t_many:.2f}×); max |Δw| {diff:.1e}  {'ok' if good else 'FAILED'}")
    return ok


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


if __name__ == "__main__":
    sys.exit(main())
