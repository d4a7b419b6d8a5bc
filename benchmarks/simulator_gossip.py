"""Decentralized simulator throughput, and the 32-node table of docs/decentralized.md.

Default: SGP (1-peer NPDDE, synchronous), D-PSGD (blocking) and AR-SGD with 32 nodes on the bundled
``sgp-resnet50-10gbe`` scenario (ResNet-50/ImageNet, μ = 256), 9 epochs: the SimPy engine and
the fast engine as paired, interleaved runs (the speed ratio per pair, median and range), then
the wall time of the full 90-epoch SGP run (14,076 iterations per node, about 1.8M trace ops)
with the trace built, on each engine.

``--table``: simulate the 32-node points of ``sgp-resnet50-10gbe`` and
``sgp-resnet50-infiniband`` for 90 epochs (AR-SGD, D-PSGD blocking and overlapped, SGP,
and SGP with overlap τ = 1) and print the Markdown tables of docs/decentralized.md.

``--big``: the memory check of summary-only runs: SGP and D-PSGD on 32 nodes for 900 epochs
(about 18M trace ops), each in a child process with and without the trace kept, their wall
time and peak resident memory (``resource.getrusage``).

``--against ROOT``: a refactor's speed check. ``ROOT`` holds another copy of the package (a
folder ``ROOT/ddlsim``, e.g. ``git archive`` of the previous commit); each protocol (SGP, D-PSGD,
AD-PSGD, AR-SGD; 32 nodes) on each engine runs in child processes alternately from ``ROOT`` and
from the package this interpreter imports (``ROOT`` put first on ``PYTHONPATH``; both locations
are printed first; the order alternating per pair, each child timing one ``simulate`` after a
warm-up run): this checkout's speed relative to ``ROOT``'s per pair, median and range.

Run: ``python benchmarks/simulator_gossip.py [--quick] [--repeats R] [--table] [--big] [--against ROOT]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from ddlsim.scenarios.load import load
from ddlsim.simulator.run import simulate

CATALOGUE = Path(__file__).resolve().parent.parent / "scenarios" / "catalogue"


def scenario_point(name: str, *sets: str) -> dict:
    return load(CATALOGUE / f"{name}.toml", list(sets)).points()[0]


def bench(protocol: str, epochs: float, engine: str, nodes: int = 32) -> tuple[float, dict, int]:
    point = scenario_point("sgp-resnet50-10gbe", f"protocol.name=\"{protocol}\"", f"cluster.learners={nodes}",
                           f"workload.epochs={epochs}")
    t0 = time.perf_counter()
    result = simulate(point, engine)
    return time.perf_counter() - t0, result.summary, result.trace.n_ops


def paired(protocol: str, epochs: float, repeats: int) -> None:
    """The SimPy and the fast engine on the same point, interleaved (the order alternates):
    the speed ratio per pair, median and range."""
    bench(protocol, 0.05, "fast")  # the fast engine's start-up (numba cache load) apart
    walls: dict[str, list[float]] = {"simpy": [], "fast": []}
    for r in range(repeats):
        for engine in ("simpy", "fast") if r % 2 == 0 else ("fast", "simpy"):
            wall, s, ops = bench(protocol, epochs, engine)
            walls[engine].append(wall)
    ratio = sorted(a / b for a, b in zip(walls["simpy"], walls["fast"]))
    med = statistics.median
    print(f"{protocol} N=32 (ResNet-50/ImageNet, 10 GbE), {s['iterations']:,} iterations × 32 nodes, {ops:,} trace "
          f"ops; {repeats} interleaved pairs: simpy {med(walls['simpy']):.2f} s, fast {med(walls['fast']):.3f} s "
          f"wall (this machine); fast / simpy speed {med(ratio):.1f}× (range {ratio[0]:.1f}–{ratio[-1]:.1f})")


ROWS = [("allreduce", "AR-SGD", []), ("dpsgd", "D-PSGD (blocking)", []),
        ("dpsgd", "D-PSGD overlapped", ["protocol.overlap=1"]), ("sgp", "SGP", []),
        ("sgp", "SGP τ=1", ["protocol.overlap=1"])]
NETWORKS = (("sgp-resnet50-10gbe", "10 GbE"), ("sgp-resnet50-infiniband", "InfiniBand"))


def table() -> None:
    print("| network | protocol | predicted 90 epochs (h) | s / iteration | blocked s / iter "
          "| MB sent / node / iter | wall s |")
    print("|---|---|---|---|---|---|---|")
    for scen, label in NETWORKS:
        for proto, name, extra in ROWS:
            point = scenario_point(scen, f"protocol.name=\"{proto}\"", "cluster.learners=32", *extra)
            t0 = time.perf_counter()
            s = simulate(point).summary
            wall = time.perf_counter() - t0
            print(f"| {label} | {name} | {s['sim_time_s'] / 3600:.2f} | {s['iteration_time_s']:.3f} "
                  f"| {s['blocked_mean_s']:.3f} | {s['bytes_sent_per_node_per_iter'] / 1e6:.0f} | {wall:.1f} |",
                  flush=True)
    print()
    print("Seconds per iteration by node count (1 epoch; the iteration time is stationary)")
    print("| network | protocol | N = 4 | N = 8 | N = 16 | N = 32 |")
    print("|---|---|---|---|---|---|")
    for scen, label in NETWORKS:
        for proto, name, extra in ROWS:
            its = []
            for n in (4, 8, 16, 32):
                point = scenario_point(scen, f"protocol.name=\"{proto}\"", f"cluster.learners={n}",
                                       "workload.epochs=1", *extra)
                its.append(simulate(point).summary["iteration_time_s"])
            print(f"| {label} | {name} | " + " | ".join(f"{x:.3f}" for x in its) + " |", flush=True)


def peak(protocol: str, epochs: float, keep: bool) -> str:
    """One fast run in a child process: its wall time and peak resident memory (this machine)."""
    import resource
    import subprocess
    import sys

    code = (f"from {Path(__file__).stem} import scenario_point; from ddlsim.simulator.run import simulate; "
            f"p = scenario_point('sgp-resnet50-10gbe', 'protocol.name=\"{protocol}\"', 'workload.epochs={epochs}'); "
            f"r = simulate(p, 'fast', keep_trace={keep}); print(r.summary['gradients'])")
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parent, capture_output=True, text=True,
                         check=True).stdout
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # the largest child so far (GiB)
    return f"{int(out):,} node-iterations, {wall:.1f} s wall, peak RSS of the children so far {rss:.2f} GiB"


def big() -> None:
    """Summary-only runs first (their peak RSS is then theirs alone), then with the trace."""
    for keep in (False, True):
        for protocol in ("sgp", "dpsgd"):
            print(f"{protocol} N=32, 900 epochs, fast engine, trace {'kept' if keep else 'not kept'}: "
                  f"{peak(protocol, 900.0, keep)}")


CHILD = """
import sys, time
sys.path.insert(0, {bench!r})
from simulator_gossip import scenario_point
from ddlsim.simulator.run import simulate
def point(epochs):
    return scenario_point('sgp-resnet50-10gbe', 'protocol.name="{protocol}"', 'cluster.learners=32',
                          'workload.epochs=' + str(epochs))
simulate(point(0.05), {engine!r})  # warm-up: imports, numba's cache
p = point({epochs})
t0 = time.perf_counter()
simulate(p, {engine!r})
print(time.perf_counter() - t0)
"""


def against(root: str, epochs: float, repeats: int) -> None:
    """Paired, interleaved child runs from ``root`` (old) and this checkout (new): new/old speed."""
    import os
    import subprocess
    import sys

    envs = {"old": {**os.environ, "PYTHONPATH": os.pathsep.join(
        [os.path.abspath(root)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))},
        "new": dict(os.environ)}
    for which, env in envs.items():
        where = subprocess.run([sys.executable, "-c", "import ddlsim; print(ddlsim.__file__)"], env=env, cwd="/",
                               capture_output=True, text=True, check=True).stdout.strip()
        print(f"{which}: {where}")
    for protocol in ("sgp", "dpsgd", "adpsgd", "allreduce"):
        for engine in ("simpy", "fast"):
            code = CHILD.format(bench=str(Path(__file__).resolve().parent), protocol=protocol, engine=engine,
                                epochs=epochs)
            walls: dict[str, list[float]] = {"old": [], "new": []}
            for r in range(repeats):
                for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                    out = subprocess.run([sys.executable, "-c", code], env=envs[which], cwd="/", capture_output=True,
                                         text=True, check=True).stdout
                    walls[which].append(float(out.split()[-1]))
            speed = sorted(o / n for o, n in zip(walls["old"], walls["new"]))
            print(f"{protocol} {engine} N=32, {epochs} epochs, {repeats} interleaved pairs: new / old speed "
                  f"{statistics.median(speed):.3f} (range {speed[0]:.3f}–{speed[-1]:.3f})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a tenth of the work, no 90-epoch run")
    ap.add_argument("--table", action="store_true", help="print the 32-node table of docs/decentralized.md")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--big", action="store_true", help="only the 900-epoch memory check (≈ 1 min)")
    ap.add_argument("--against", metavar="ROOT", help="paired speed of this checkout against the package in ROOT")
    ap.add_argument("--epochs", type=float, help="--against: epochs per run (default 9, --quick 1)")
    args = ap.parse_args()
    if args.against:
        against(args.against, args.epochs or (1.0 if args.quick else 9.0), args.repeats)
        return
    if args.table:
        table()
        return
    if args.big:
        big()
        return
    for protocol in ("sgp", "dpsgd", "allreduce"):
        paired(protocol, 1.0 if args.quick else 9.0, args.repeats)
    if not args.quick:
        for engine in ("fast", "simpy"):
            wall, s, ops = bench("sgp", 90.0, engine)
            print(f"SGP N=32, 90 epochs, {engine} engine: {s['iterations']:,} iterations per node, {ops:,} trace ops: "
                  f"{wall:.1f} s wall ({s['gradients'] / wall:,.0f} node-iterations/s)")

if __name__ == "__main__":
    main()
