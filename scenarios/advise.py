"""``ddlsim advise``: search a scenario's sweep by simulation, replay only the promising
points, and recommend one configuration with the reason in plain words (docs/advise.md).

The search, for a time budget ``T`` (simulated seconds) or a target test error ``E``:

1. **Simulate every point** (cheap: no gradients) into ``DIR``. Each trace gives the
   evaluation schedule: at which simulated times the test error will be measured, and
   at which epoch.
2. **Merge equivalent points**: a staleness-aware learning-rate policy whose factors are
   all 1 on this trace (``per_gradient`` when σ ≤ 1, ``mean_staleness`` when ⟨σ⟩ < 1)
   is the constant policy; such points replay exactly like their twin and are replayed
   once.
3. **Prune by simulated time alone** (never replayed):
   * budget: a point whose first evaluation after training starts comes after ``T``;
     its error at ``T`` is the untrained model's;
   * target: a point whose first evaluation after training starts comes no earlier than
     the best time to target already measured; it cannot reach the target sooner.
4. **Rank the rest by a cheap prediction**: first the points that are not at risk
   (constant learning rate with ⟨σ⟩ > 2 is at risk: Rudra's 15- and 30-softsync do not
   converge with α0), then, for a budget, most epochs completed by ``T``; for a target,
   fewest simulated seconds per epoch; ties by lower ⟨σ⟩, then more updates per epoch.
5. **Replay the top** ``replay`` points (a budget: all at once; a target: in rounds of
   ``jobs``, pruning again after each round) into ``DIR/replay``.
6. **Recommend** the replayed point with the lowest test error at the last evaluation at
   or before ``T`` (budget), or the shortest time to ``E`` (target); the runner-up is the
   next one. The explanation compares the two: pace (seconds per epoch, and why: the
   hardsync barrier, fewer learners, a busy server, smaller minibatches) and learning per
   epoch (staleness with a constant learning rate, larger updates).
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

from ..analysis.table import labels
from ..simulator.results_folder import write_file
from .advise_explain import secs
from .advise_model import EPS, Advice, Candidate, is_number
from .advise_render import advice_csv, render
from .load import Scenario, point_hash
from .runner import default_jobs, run_points
from .schema import ScenarioError


def check_goal(budget_s: float | None, target_error: float | None, replay: int = 4,
               jobs: int | None = None) -> None:
    """Refuse a bad goal with one line (:class:`ScenarioError`, exit 2 in the CLI)."""
    if budget_s is None and target_error is None:
        raise ScenarioError("advise needs a goal: --budget-s SECONDS (simulated time) "
                            "or --target-error FRACTION (e.g. 0.08)")
    if budget_s is not None and target_error is not None:
        raise ScenarioError(f"--budget-s = {budget_s:g} and --target-error = {target_error:g}: "
                            "give one goal, not both")
    if budget_s is not None and not (math.isfinite(budget_s) and budget_s > 0):
        raise ScenarioError(f"--budget-s = {budget_s:g}: must be a positive, finite number of "
                            "simulated seconds")
    if target_error is not None and not (math.isfinite(target_error) and 0 < target_error < 1):
        raise ScenarioError(f"--target-error = {target_error:g}: must be a fraction between 0 and 1 "
                            "(exclusive), e.g. 0.08 for 8 %")
    if replay < 1:
        raise ScenarioError(f"--replay = {replay}: must be ≥ 1")
    if jobs is not None and jobs < 1:
        raise ScenarioError(f"--jobs = {jobs}: must be ≥ 1")


def advise(scenario: Scenario, out_dir: str | Path, *, budget_s: float | None = None,
           target_error: float | None = None, replay: int = 4, jobs: int | None = None,
           resume: bool = False, progress: bool = False,
           options: dict[str, Any] | None = None) -> Advice:
    """Search ``scenario``'s sweep for the best configuration under a budget or a target.

    Simulates every point into ``out_dir``, replays at most ``replay`` of them into
    ``out_dir/replay`` (``options`` are the backend's :class:`RunOptions` fields) and
    returns the :class:`Advice`; writes ``advice.txt`` and ``advice.csv`` into ``out_dir``.
    """
    check_goal(budget_s, target_error, replay, jobs)
    out = Path(out_dir)
    records = run_points(scenario, scenario.points(), out, jobs=jobs, resume=resume, progress=progress)
    points = {p["_id"]: p for p in scenario.points()}
    names = labels([r["row"] for r in records])
    cands: list[Candidate] = []
    for i, rec in enumerate(records):
        row = rec["row"]
        c = Candidate(i, points[row["run_id"]], row, names[str(row["run_id"])])
        if row.get("error"):
            c.status, c.note = "failed", f"simulation failed: {row['error']}"
        else:
            c.evals = sorted((float(t), float(e)) for t, e in rec.get("evals", []))
        cands.append(c)

    # equivalent points: replayed once
    seen: dict[str, Candidate] = {}
    for c in cands:
        if c.status == "failed":
            continue
        p = copy.deepcopy({k: v for k, v in c.point.items() if not k.startswith("_")})
        p["optimizer"]["lr_policy"] = c.effective_policy()
        key = point_hash(p)
        if key in seen:
            c.status, c.twin = "equivalent", seen[key]
            c.note = (f"replays exactly like {seen[key].label}: its {c.policy} learning rate has factor 1 "
                      f"on every gradient (σ ≤ {int(float(c.row.get('staleness_max') or 0))})")
        else:
            seen[key] = c

    live = [c for c in cands if c.status == "candidate"]
    if budget_s is not None:
        for c in live:
            if c.first_eval_s() > budget_s + EPS:
                c.status = "pruned"
                first = c.first_eval_s()
                c.note = (f"its first evaluation comes at {secs(first)}, after the {secs(budget_s)} budget"
                          if math.isfinite(first) else "it never evaluates a trained model")
        live = [c for c in live if c.status == "candidate"]
        # steps compared to 1 %: evaluations of different protocols land a few samples apart
        live.sort(key=lambda c: (c.risky, -_sig(c.steps_by(budget_s)), c.sigma, c.index))
    else:
        live.sort(key=lambda c: (c.risky, _sig(c.sec_per_step), c.sigma, c.index))
    for r, c in enumerate(live, 1):
        c.rank = r

    replay_dir = out / "replay"
    done: list[Candidate] = []
    batch = replay if budget_s is not None else (jobs or default_jobs(replay))
    queue = list(live)
    while queue and len(done) < replay:
        if target_error is not None:
            best = _best_time(done)
            if best is not None:
                for c in queue:
                    if c.first_eval_s() >= best:
                        c.status = "pruned"
                        c.note = (f"its first evaluation comes at {secs(c.first_eval_s())}, no earlier than "
                                  f"the {secs(best)} at which a replayed point already reached the target")
                queue = [c for c in queue if c.status == "candidate"]
                if not queue:
                    break
        take, queue = queue[:min(batch, replay - len(done))], queue[min(batch, replay - len(done)):]
        _replay(scenario, replay_dir, done, take, jobs, resume, progress, options)
        done += take
        for c in take:
            _measure(c, budget_s, target_error)
    for c in queue:
        c.status = "not replayed"
        c.note = f"ranked {c.rank} by the prediction, below the top {replay} replayed"
    for c in cands:
        if c.status == "equivalent" and c.twin is not None and c.twin.status == "replayed":
            c.curves, c.diverged = c.twin.curves, c.twin.diverged
            c.error, c.at_s, c.at_epoch = c.twin.error, c.twin.at_s, c.twin.at_epoch

    ok = [c for c in done if c.status == "replayed"]
    if budget_s is not None:
        ranking = sorted(ok, key=lambda c: (c.error, c.at_s, c.rank))
        winners = ranking
    else:
        ranking = sorted(ok, key=lambda c: (c.at_s is None, c.at_s if c.at_s is not None else c.error,
                                            c.error, c.rank))
        winners = [c for c in ranking if c.at_s is not None]
    rec = winners[0] if winners else None
    runner = next((c for c in ranking if c is not rec), None) if rec else None
    advice = Advice(str(scenario.base["name"]), budget_s, target_error, replay, out, cands, ranking,
                    rec, runner)
    write_file(out / "advice.txt", render(advice) + "\n")
    write_file(out / "advice.csv", advice_csv(advice))
    return advice


def _sig(v: float) -> float:
    """``v`` to two significant digits (predictions closer than that are ties)."""
    return float(f"{v:.2g}") if math.isfinite(v) else v


def _best_time(done: list[Candidate]) -> float | None:
    times = [c.at_s for c in done if c.status == "replayed" and c.at_s is not None]
    return min(times) if times else None


def _replay(scenario: Scenario, replay_dir: Path, done: list[Candidate], take: list[Candidate],
            jobs: int | None, resume: bool, progress: bool, options: dict[str, Any] | None) -> None:
    """Replay ``take`` (after ``done``, kept) into ``replay_dir``; fill their curves."""
    if not resume:  # a result left by an earlier call is recomputed, as `ddlsim run` does
        for c in take:
            (replay_dir / "runs" / c.run_id / "result.json").unlink(missing_ok=True)
    points = copy.deepcopy([c.point for c in done + take])
    records = run_points(scenario, points, replay_dir, backend="replay", options=options, jobs=jobs,
                         resume=True, progress=progress, keep_others=True)
    by_id = {r["row"]["run_id"]: r for r in records}
    for c in take:
        rec = by_id.get(c.run_id)
        row = rec["row"] if rec else {"error": "no result"}
        if row.get("error"):
            c.status, c.replay_error = "failed", str(row["error"])
            c.note = f"replay failed: {row['error']}"
            continue
        c.status = "replayed"
        c.curves = sorted(rec["curves"], key=lambda r: r["sim_time_s"])
        c.diverged = bool(row.get("diverged"))


def _err(v: Any) -> float:
    return float(v) if is_number(v) else 1.0


def _measure(c: Candidate, budget_s: float | None, target_error: float | None) -> None:
    """What the goal measures of a replayed point (see the module rule)."""
    if c.status != "replayed":
        return
    if budget_s is not None:
        got = [r for r in c.curves if r["sim_time_s"] <= budget_s + EPS]
        last = got[-1] if got else c.curves[0]
        sched = c.eval_by(budget_s)
        if c.diverged and sched is not None and sched[0] > last["sim_time_s"] + EPS:
            c.error, c.at_s, c.at_epoch = 1.0, sched[0], sched[1]  # diverged before T
        else:
            c.error, c.at_s, c.at_epoch = _err(last["test_error"]), last["sim_time_s"], last["epoch"]
    else:
        hit = next((r for r in c.curves if is_number(r["test_error"]) and r["test_error"] <= target_error), None)
        best = min(c.curves, key=lambda r: _err(r["test_error"]))
        c.error = _err(best["test_error"])
        c.at_s = hit["sim_time_s"] if hit else None
        c.at_epoch = hit["epoch"] if hit else best["epoch"]




__all__ = ["advise", "check_goal", "Advice", "Candidate"]
