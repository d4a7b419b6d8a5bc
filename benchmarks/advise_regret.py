"""``ddlsim advise`` on grids it was not designed on: its regret against the exhaustive best
and the replays it spent (the table of docs/advise.md).

Each grid is replayed whole first (every point, every seed: the truth), then ``advise`` runs on
it for three budgets and two targets with the default rungs (``--min-fraction 0.25``,
``--reduction-factor 3``). ``advise`` finds its rungs' replays in the whole replays (with
``--resume`` a rung is read as the prefix of a stored whole replay, which is exactly what a
cut replay measures: tests/test_advise_halving.py), so the grid is replayed once, and its cost
is counted as if every rung had been replayed on its own.

* **budget** ``T``: ¼, ½ and 1 × the median simulated run time of the grid's points; the
  error of a configuration is the mean over its seeds of the test error at its last evaluation
  at or before ``T``; regret = the error of advise's recommendation − the lowest of all
  configurations (points of test error);
* **target** ``E``: 1.25 × and 2 × the lowest mean best error of the grid; the time of a
  configuration is its mean time to ``E`` over its seeds (only if every seed reaches it);
  regret = advise's time / the shortest − 1;
* **cost**: the epochs advise replayed (each rung's replays summed, a rung replayed from the
  start) against replaying every distinct point to its horizon.

    python benchmarks/advise_regret.py [--grids teacher,logistic,adam,adagrad,mnist1d,demo] [--jobs 2]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ddlsim.scenarios.advise.search import advise
from ddlsim.scenarios.load import load_text, point_hash
from ddlsim.scenarios.runner import run_sweep
from ddlsim.scenarios.schema import FIELD_BY_KEY

SGD = 'name = "sgd"\nlr = 0.1\nmomentum = 0.9'
GRIDS = {  # name → (what differs from the demo, dataset, model, optimizer table, epochs)
    "teacher": ("another data set: the synthetic teacher (32 features, 4,096 samples)", "teacher", "mlp", SGD, 8),
    "logistic": ("another model: logistic regression on digits", "digits", "logistic", SGD, 10),
    "adam": ("another optimizer: Adam (lr 0.003) on digits", "digits", "mlp", 'name = "adam"\nlr = 0.003', 10),
    "adagrad": ("another optimizer: AdaGrad (lr 0.05) on digits", "digits", "mlp", 'name = "adagrad"\nlr = 0.05', 10),
    "mnist1d": ("MNIST-1D, the paper's MLP, Adam (lr 0.01)", "mnist1d", "mnist1d_mlp", 'name = "adam"\nlr = 0.01', 10),
    "demo": ("the bundled demo, the grid advise's former prior was tuned on (72 configurations × 3 seeds)",
             "", "", "", 0),
}
SEEDS = 2

GRID = """
name = "regret-{name}"
seed = 0
{replicates}
[workload]
dataset = "{dataset}"
model = "{model}"
epochs = {epochs}
evals_per_epoch = 2
target_error = 0.1
[optimizer]
{optimizer}
lr_policy = "constant"
[cluster]
learners = 4
minibatch = 16
[cluster.compute]
distribution = "lognormal"
base_s = 0.002
per_sample_s = 0.0005
cv = 0.3
[cluster.network]
latency_s = 5e-5
bandwidth_Bps = 1.25e9
[cluster.server]
apply_s = 5e-5
[protocol]
name = "async"
[sweep]
"protocol.name" = ["hardsync", "async"]
"cluster.learners" = [1, 4, 16]
"cluster.minibatch" = [16, 64]
"optimizer.lr_policy" = ["constant", "mean_staleness"]
{seed_axis}
"""


def grid_text(name: str) -> str:
    """The grid's scenario: λ × μ × protocol × lr policy, :data:`SEEDS` seeds each (the demo: the
    bundled scenario as it is)."""
    if name == "demo":
        from ddlsim.scenarios.bundled import CATALOGUE

        return (CATALOGUE / "demo.toml").read_text(encoding="utf-8")
    _, dataset, model, optimizer, epochs = GRIDS[name]
    has = "replicates" in FIELD_BY_KEY  # seeds as replicates where the scenario knows them
    return GRID.format(name=name, dataset=dataset, model=model, optimizer=optimizer, epochs=epochs,
                       replicates=f"replicates = {SEEDS}" if has else "",
                       seed_axis="" if has else f"seed = {list(range(SEEDS))}")


def config_of(point: dict[str, Any]) -> str:
    return point_hash({k: v for k, v in point.items() if k != "seed"})


def error_at(rec: dict[str, Any], T: float) -> float:
    """A run's test error at its last evaluation at or before ``T`` (1 if it diverged before)."""
    curves = sorted(rec["curves"], key=lambda r: r["sim_time_s"])
    sched = [t for t, _ in rec["evals"] if t <= T + 1e-9]
    got = [r for r in curves if r["sim_time_s"] <= T + 1e-9]
    if rec["row"].get("diverged") and len(got) < len(sched):
        return 1.0
    e = (got or curves[:1])[-1]["test_error"]
    return float(e) if isinstance(e, (int, float)) and math.isfinite(e) else 1.0


def time_to(rec: dict[str, Any], E: float) -> float | None:
    curves = sorted(rec["curves"], key=lambda r: r["sim_time_s"])
    return next((r["sim_time_s"] for r in curves if r["test_error"] <= E), None)


def run_grid(name: str, work: Path, jobs: int) -> list[dict[str, Any]]:
    """The truth and advise's answers on one grid: one row per goal."""
    scenario = load_text(grid_text(name))
    points = {p["_id"]: p for p in scenario.points()}
    t0 = time.perf_counter()
    records = run_sweep(scenario, work / "replay", backend="replay", options={"device": "cpu"}, jobs=jobs,
                        resume=True, progress=False)
    wall = time.perf_counter() - t0
    bad = [r["row"]["error"] for r in records if r["row"].get("error")]
    if bad:
        raise SystemExit(f"{name}: {len(bad)} replays failed: {bad[0]}")
    configs: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        configs.setdefault(config_of(points[r["row"]["run_id"]]), []).append(r)
    median_t = statistics.median(float(r["row"]["sim_time_s"]) for r in records)
    best_err = min(statistics.fmean(min(float(c["test_error"]) for c in r["curves"]) for r in runs)
                   for runs in configs.values())
    rows = []
    goals = [("budget", q * median_t) for q in (0.25, 0.5, 1.0)] + \
            [("target", m * best_err) for m in (1.25, 2.0) if m * best_err < 1]
    for kind, goal in goals:
        adv = advise(scenario, work, budget_s=goal if kind == "budget" else None,
                     target_error=goal if kind == "target" else None, resume=True, jobs=jobs,
                     options={"device": "cpu"})
        rec = adv.recommendation
        pick = config_of(rec.reps[0].point) if rec else None
        if kind == "budget":
            truth = {k: statistics.fmean(error_at(r, goal) for r in runs) for k, runs in configs.items()}
            best = min(truth.values())
            regret = None if pick is None else truth[pick] - best
            if rec is not None:  # advise's measurement is exact
                assert abs(rec.error - truth[pick]) < 1e-12, (name, goal, rec.error, truth[pick])
        else:
            truth = {}
            for k, runs in configs.items():
                ts = [time_to(r, goal) for r in runs]
                truth[k] = statistics.fmean(ts) if all(t is not None for t in ts) else None
            reached = [t for t in truth.values() if t is not None]
            best = min(reached) if reached else None
            regret = (None if pick is None or best is None or truth[pick] is None else truth[pick] / best - 1)
        rows.append({"grid": name, "kind": kind, "goal": goal, "best": best, "regret": regret,
                     "found": rec is not None, "configs": len(configs), "runs": len(records),
                     "replays": adv.replays, "epochs": adv.epochs_replayed, "exhaustive": adv.epochs_exhaustive,
                     "rungs": list(adv.rung_sizes), "label": rec.label if rec else "—", "wall": wall})
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    out = ["| grid | goal | exhaustive best | advise's regret | advise's pick | configurations at the rungs | "
           "replays (epochs) | of exhaustive |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kind"] == "budget":
            goal = f"budget {r['goal']:.3g} s"
            best = f"{100 * r['best']:.1f} %"
            regret = "none found" if not r["found"] else f"{100 * r['regret']:+.1f} points"
        else:
            goal = f"target {100 * r['goal']:.1f} %"
            best = "unreached" if r["best"] is None else f"{r['best']:.3g} s"
            regret = ("none found" + (" (one exists)" if r["best"] is not None else "") if not r["found"] else
                      "—" if r["regret"] is None else f"{100 * r['regret']:+.0f} % time")
        share = f"{100 * r['epochs'] / r['exhaustive']:.0f} %" if r["exhaustive"] else "—"
        out.append(f"| {r['grid']} | {goal} | {best} | {regret} | {r['label']} | "
                   f"{', '.join(map(str, r['rungs']))} | {r['replays']} ({r['epochs']:.0f}) | {share} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--grids", default=",".join(g for g in GRIDS if g != "demo"),
                    help=f"comma-separated, of {', '.join(GRIDS)} (default: all but demo)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--work", help="folder for the replays (default: a temporary one; reuse it to resume)")
    args = ap.parse_args(argv)
    names = [g for g in args.grids.split(",") if g]
    unknown = [g for g in names if g not in GRIDS]
    if unknown:
        ap.error(f"unknown grid {unknown[0]!r}")
    import torch

    torch.set_num_threads(1)
    base = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="ddlsim-regret-"))
    rows = []
    for g in names:
        print(f"{g}: {GRIDS[g][0]}", file=sys.stderr, flush=True)
        got = run_grid(g, base / g, args.jobs)
        print(f"  {got[0]['runs']} runs replayed whole in {got[0]['wall']:.0f} s", file=sys.stderr, flush=True)
        rows += got
    print(table(rows))
    budget = [r for r in rows if r["kind"] == "budget" and r["found"]]
    if budget:
        print(f"\nbudgets: regret ≤ {100 * max(r['regret'] for r in budget):.1f} points of test error "
              f"(median {100 * statistics.median(r['regret'] for r in budget):.1f}); replays "
              f"{100 * min(r['epochs'] / r['exhaustive'] for r in rows):.0f}–"
              f"{100 * max(r['epochs'] / r['exhaustive'] for r in rows):.0f} % of the exhaustive epochs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
