"""``ddlsim advise``: search a scenario's sweep by simulation and successive halving, and
recommend one configuration with the reason in plain words (docs/advise.md); ``ddlsim run
--prune``: the same rungs for a whole sweep.

The search, for a time budget ``T`` (simulated seconds) or a target test error ``E``:

1. **Simulate every point** (cheap: no gradients) into ``DIR``. Each trace gives the
   evaluation schedule: at which simulated times the test error will be measured, and at
   which epoch. Points that differ only in their seed are replicates of one configuration.
2. **Merge equivalent configurations**: a staleness-aware learning-rate policy whose factors
   are all 1 on these traces (``per_gradient`` when σ ≤ 1, ``mean_staleness`` when ⟨σ⟩ < 1)
   is the constant policy; such configurations replay exactly like their twin, once.
3. **Prune by simulated time alone** (exact, never replayed): with a budget, a configuration
   none of whose replicates evaluates a trained model by ``T``; with a target, after each
   rung, one whose replicates cannot reach ``E`` (on average) before a time to target already
   measured.
4. **Successive halving** in simulated epochs (the rungs of ASHA, Li et al. 2020, and of
   Optuna's ``SuccessiveHalvingPruner``): each point's *horizon* is its last evaluation at or
   before ``T`` (budget) or its whole run (target, ``run --prune``); rung ``k`` replays it to
   the fraction ``min(1, f·η^k)`` of its horizon's epochs (``f`` = ``--min-fraction``, η =
   ``--reduction-factor``), a real shorter replay: its trace cut at that evaluation, which
   measures exactly what the whole replay measures up to there
   (:mod:`ddlsim.backends.replay_prefix`). Every configuration that survives the prune is
   replayed to the first rung; of those not yet replayed to their horizon, the best
   ``⌈n/η⌉`` (at least two) by mean error over their replicates (budget) — or, with a target,
   those that reached it first, then the rest by mean error — continue to the next rung,
   and so on to the horizon; the worse replicate breaks a tie of means, and configurations
   still tied with the last one kept continue too.
5. **Recommend** the configuration replayed to its horizon with the lowest mean test error at
   the last evaluation at or before ``T`` (budget), or the shortest mean time to ``E``
   (target); the runner-up is the next one. The explanation compares the two: pace (seconds
   per epoch, and why) and learning per epoch (staleness, larger updates).
"""

from __future__ import annotations

import copy
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...analysis.table import labels
from ...backends.replay_prefix import UNTIL_EPOCH, cut_index
from ...simulator.results_folder import ResultsFolder, write_file
from .explain import pct, secs
from .model import EPS, Advice, Candidate, Replicate, err, is_number
from .render import advice_csv, render
from ..load import Scenario, point_hash
from ..runner import load_result, prepare_folder, run_points, write_tables
from ..schema import ScenarioError

MIN_FRACTION = 0.25      # the first rung: this fraction of each point's horizon (in epochs)
REDUCTION_FACTOR = 3.0   # η: the best 1/η of a rung continue to the next
MAX_RUNGS = 64           # rungs f, f·η, f·η², … below 1, and the horizon


def rung_fractions(min_fraction: float = MIN_FRACTION, reduction_factor: float = REDUCTION_FACTOR) -> list[float]:
    """The rungs as fractions of each point's horizon: ``f, f·η, f·η², …`` while below 1, then 1
    (``f`` = ``min_fraction``, η = ``reduction_factor``); refused (:class:`ScenarioError`)
    beyond :data:`MAX_RUNGS`."""
    check_halving(min_fraction, reduction_factor)
    out: list[float] = []
    f = min_fraction
    while f < 1 - 1e-12:
        out.append(f)
        if len(out) >= MAX_RUNGS:
            raise ScenarioError(f"--min-fraction = {min_fraction:g} with --reduction-factor = {reduction_factor:g}: "
                                f"more than {MAX_RUNGS} rungs; raise either")
        f *= reduction_factor
    return out + [1.0]


def check_halving(min_fraction: float, reduction_factor: float) -> None:
    """Refuse a rung schedule that means nothing, in one line (:class:`ScenarioError`)."""
    if not (math.isfinite(min_fraction) and 0 < min_fraction <= 1):
        raise ScenarioError(f"--min-fraction = {min_fraction:g}: must be a fraction of the epochs in (0, 1] "
                            "(the first rung; 1 replays every point whole), e.g. 0.25")
    if not (math.isfinite(reduction_factor) and reduction_factor > 1):
        raise ScenarioError(f"--reduction-factor = {reduction_factor:g}: must be a finite number > 1 (the best "
                            "1/η of each rung continue), e.g. 3")


def check_goal(budget_s: float | None, target_error: float | None, replay: int | None = None,
               jobs: int | None = None, min_fraction: float = MIN_FRACTION,
               reduction_factor: float = REDUCTION_FACTOR) -> None:
    """Refuse a bad goal or search with one line (:class:`ScenarioError`, exit 2 in the CLI)."""
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
    if replay is not None and replay < 1:
        raise ScenarioError(f"--replay = {replay}: must be ≥ 1")
    if jobs is not None and jobs < 1:
        raise ScenarioError(f"--jobs = {jobs}: must be ≥ 1")
    rung_fractions(min_fraction, reduction_factor)


# -- configurations from a sweep's simulation --------------------------------------------------
def configurations(records: list[dict[str, Any]], points: dict[str, dict[str, Any]]) -> list[Candidate]:
    """The sweep's configurations in sweep order, each with its replicates (points that differ
    only in ``seed``); a configuration with a failed simulation is ``failed``."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        p = points[rec["row"]["run_id"]]
        groups.setdefault(point_hash({k: v for k, v in p.items() if k != "seed"}), []).append(rec)
    firsts = [g[0]["row"] for g in groups.values()]
    names = labels(firsts)
    cands = []
    for i, group in enumerate(groups.values()):
        reps = []
        for rec in group:
            row = rec["row"]
            evals = [] if row.get("error") else sorted((float(t), float(e)) for t, e in rec.get("evals", []))
            reps.append(Replicate(points[row["run_id"]], row, evals))
        head = reps[0]
        c = Candidate(i, head.point, head.row, names[str(head.row["run_id"])], evals=head.evals, reps=reps)
        bad = next((r.row["error"] for r in reps if r.row.get("error")), None)
        if bad or not all(r.evals for r in reps):
            c.status, c.note = "failed", f"simulation failed: {bad or 'no evaluation'}"
        cands.append(c)
    return cands


def merge_equivalent(cands: list[Candidate]) -> None:
    """Mark a configuration whose replicates replay exactly like another's (a staleness-aware
    rate with factors all 1 on each trace is the constant rate) ``equivalent`` to it."""
    seen: dict[tuple[str, ...], Candidate] = {}
    for c in cands:
        if c.status == "failed":
            continue
        keys = []
        for r in c.reps:
            p = copy.deepcopy({k: v for k, v in r.point.items() if not k.startswith("_")})
            p["optimizer"]["lr_policy"] = _effective(r)
            keys.append(point_hash(p))
        key = tuple(keys)
        if key in seen:
            c.status, c.twin = "equivalent", seen[key]
            c.note = (f"replays exactly like {seen[key].label}: its {c.policy} learning rate has factor 1 "
                      f"on every gradient (σ ≤ {int(c.staleness_max)})")
        else:
            seen[key] = c


def _effective(r: Replicate) -> str:
    policy = str(r.point["optimizer"]["lr_policy"])
    smax, mean = r.row.get("staleness_max"), r.row.get("staleness_mean")
    smax = float(smax) if is_number(smax) else 0.0
    mean = float(mean) if is_number(mean) else 0.0
    if (policy == "per_gradient" and smax <= 1) or (policy == "mean_staleness" and mean < 1):
        return "constant"
    return policy


# -- successive halving ------------------------------------------------------------------------
@dataclass
class Rungs:
    """Where and how the rungs are replayed: whole traces into ``full_dir``, cut ones into
    ``cut_dir`` (caches of runs); what they cost (``replays``, ``epochs``)."""

    scenario: Scenario
    full_dir: Path
    cut_dir: Path
    options: dict[str, Any] | None = None
    jobs: int | None = None
    resume: bool = False
    progress: bool = False
    engine: str = "auto"
    executor: str = "local"
    scheduler: str | None = None
    replays: int = 0
    epochs: float = 0.0
    sizes: list[int] = field(default_factory=list)
    _kept: dict[Path, dict[str, dict[str, Any]]] = field(default_factory=dict)

    def run(self, reqs: list[tuple[Replicate, int]]) -> dict[int, str]:
        """Replay each (replicate, evaluation index) to that evaluation; fill the replicates'
        curves and cut. Returns the failures: ``id(replicate)`` → error."""
        failed: dict[int, str] = {}
        todo: dict[Path, list[tuple[Replicate, int, dict[str, Any]]]] = {}
        for rep, i in reqs:
            self.replays += 1
            self.epochs += rep.evals[i][1]
            rp = run_point(rep, i)
            where = self.full_dir if UNTIL_EPOCH not in rp else self.cut_dir
            stored = self._stored(where, rp, rep) if self.resume else None
            if stored is not None:
                _fill(rep, i, stored, rp)
            else:
                todo.setdefault(where, []).append((rep, i, rp))
        for where, items in todo.items():
            kept = self._kept.setdefault(where, {})
            # a result left by an earlier call is recomputed, as `ddlsim run` does (overwritten in
            # the results folder's way: ddlsim's own files only, never through a link)
            fresh = set() if self.resume else {rp["_id"] for _, _, rp in items}
            for rep, _, rp in items:
                kept[rep.point["_id"]] = rp  # the tables list each replicate's longest replay
            records = run_points(self.scenario, copy.deepcopy(list(kept.values())), where, backend="replay",
                                 options=self.options, jobs=self.jobs, resume=True, progress=self.progress,
                                 keep_others=True, engine=self.engine, executor=self.executor,
                                 scheduler=self.scheduler, recompute=fresh)
            by_id = {r["row"]["run_id"]: r for r in records}
            for rep, i, rp in items:
                rec = by_id.get(rp["_id"])
                if rec is None or rec["row"].get("error"):
                    failed[id(rep)] = str(rec["row"]["error"]) if rec else "no result"
                else:
                    _fill(rep, i, rec, rp)
        return failed

    def _stored(self, where: Path, rp: dict[str, Any], rep: Replicate) -> dict[str, Any] | None:
        """A verified stored replay of this cut, or of the whole trace (its prefix is this cut's)."""
        rec, _ = load_result(where, rp)
        src = rp
        if rec is None and UNTIL_EPOCH in rp:
            rec, _ = load_result(self.full_dir, rep.point)
            src, where = rep.point, self.full_dir
        if rec is not None:
            self._kept.setdefault(where, {})[rep.point["_id"]] = src
        return rec


def run_point(rep: Replicate, i: int) -> dict[str, Any]:
    """The point whose replay ends at ``rep``'s evaluation ``i``: the point itself at its last
    evaluation, else a copy cut at that evaluation's epoch, run id ``<run id>-cut<i>``."""
    if i >= len(rep.evals) - 1:
        return rep.point
    p = dict(rep.point)
    p[UNTIL_EPOCH] = rep.evals[i][1]
    p["_id"] = f"{rep.point['_id']}-cut{i}"
    return p


def _fill(rep: Replicate, i: int, rec: dict[str, Any], rp: dict[str, Any]) -> None:
    """``rep`` replayed to evaluation ``i`` by ``rec`` (a replay to ``i`` or beyond: its prefix)."""
    t, e = rep.evals[i]
    curves = sorted(rec["curves"], key=lambda r: (r["sim_time_s"], r["epoch"]))
    rep.curves = [r for r in curves if r["sim_time_s"] <= t + EPS and r["epoch"] <= e + EPS]
    rep.diverged = bool(rec["row"].get("diverged")) and len(rep.curves) < i + 1
    rep.cut, rep.source, rep.record = i, rp, rec


def cut_for(rep: Replicate, fraction: float) -> int:
    """The evaluation a rung at ``fraction`` of ``rep``'s horizon replays it to (never beyond
    the horizon): :func:`~ddlsim.backends.replay_prefix.cut_index`, the replay's own rule."""
    h = rep.horizon if rep.horizon is not None else len(rep.evals) - 1
    if fraction >= 1:
        return h
    epochs = [e for _, e in rep.evals[:h + 1]]
    return min(h, cut_index(epochs, fraction * epochs[-1]))


def score(c: Candidate, target: float | None) -> tuple[float, ...]:
    """A configuration's place at a rung, lower first: with a target, those whose replicates all
    reached it by their mean (then worst) time to it, then the others; without, or for those
    others, the mean (then worst) test error over its replicates at the rung's evaluation."""
    if target is not None:
        hits = [r.hit(target) for r in c.reps]
        if all(hits):
            ts = [h["sim_time_s"] for h in hits if h is not None]
            return (0.0, math.fsum(ts) / len(ts), max(ts))
    es = [r.error_at(r.cut) for r in c.reps]
    return (1.0 if target is not None else 0.0, math.fsum(es) / len(es), max(es))


def lower_bound_s(c: Candidate, target: float) -> float:
    """The earliest mean time to ``target`` a configuration can still have: each replicate's
    time to it if it reached it, else its next evaluation after the cut (∞ after the last)."""
    ts = []
    for r in c.reps:
        h = r.hit(target)
        nxt = r.cut + 1 if r.cut is not None else 0
        ts.append(h["sim_time_s"] if h else (r.evals[nxt][0] if nxt < len(r.evals) else math.inf))
    return math.fsum(ts) / len(ts)


def finish(c: Candidate, budget_s: float | None, target: float | None) -> None:
    """What the goal measures of a configuration replayed to its horizon (means over its
    replicates): the error at the last evaluation by ``T`` and its time and epoch (budget); the
    best error and, if every replicate reached the target, the time and epoch of reaching it."""
    c.status = "replayed"
    c.diverged = any(r.diverged for r in c.reps)
    c.curves = c.reps[0].curves
    n = len(c.reps)
    if target is None:
        c.error = math.fsum(r.error_at(r.horizon) for r in c.reps) / n
        c.at_s = math.fsum(r.eval_at(r.horizon)[0] for r in c.reps) / n
        c.at_epoch = math.fsum(r.eval_at(r.horizon)[1] for r in c.reps) / n
        return
    c.error = math.fsum(min((err(x["test_error"]) for x in r.curves), default=1.0) for r in c.reps) / n
    hits = [r.hit(target) for r in c.reps]
    if all(hits):
        c.at_s = math.fsum(h["sim_time_s"] for h in hits if h is not None) / n
        c.at_epoch = math.fsum(h["epoch"] for h in hits if h is not None) / n
    else:
        c.at_s = None
        best = [min(r.curves, key=lambda x: err(x["test_error"]))["epoch"] if r.curves else 0.0 for r in c.reps]
        c.at_epoch = math.fsum(best) / n


def done(r: Replicate, target: float | None) -> bool:
    """A replicate needs no longer replay: replayed to its horizon (or diverged), or, with a
    target, it reached the target (its time to it is known)."""
    return r.complete or (target is not None and r.cut is not None and r.hit(target) is not None)


def halve(pool: list[Candidate], rungs: Rungs, fractions: list[float], reduction_factor: float, *,
          budget_s: float | None = None, target: float | None = None, cap: int | None = None) -> None:
    """Successive halving of ``pool`` (configurations whose replicates have their ``horizon``
    set) over the rungs ``fractions`` (module doc, step 4); sets each one's status: ``replayed``
    (to its horizon, or to the target), ``stopped`` (at a rung), ``pruned`` (a target it cannot
    reach first) or ``failed``. ``cap``: at most this many continue past any rung."""
    last = len(fractions) - 1
    finished: list[Candidate] = []
    for k, f in enumerate(fractions):
        if rungs.progress:
            print(f"successive halving: rung {k + 1} of {len(fractions)}, {len(pool)} configuration"
                  f"{'s' * (len(pool) != 1)} to {100 * f:.3g} % of their horizon", file=sys.stderr, flush=True)
        reqs = [(r, cut_for(r, f)) for c in pool for r in c.reps if not done(r, target)]
        failed = rungs.run([(r, i) for r, i in reqs if r.cut is None or i > r.cut])
        rungs.sizes.append(len(pool))
        for c in pool:
            bad = next((failed[id(r)] for r in c.reps if id(r) in failed), None)
            if bad is not None:
                c.status, c.replay_error, c.note = "failed", bad, f"replay failed: {bad}"
                continue
            c.rung = k
            c.rung_scores.append(math.fsum(r.error_at(r.cut) for r in c.reps) / len(c.reps))
            if all(done(r, target) for r in c.reps):
                finish(c, budget_s, target)
                finished.append(c)
        pool = [c for c in pool if c.status == "candidate"]
        best = min((c.at_s for c in finished if c.at_s is not None), default=None) if target is not None else None
        if best is not None and target is not None:
            for c in pool:
                lb = lower_bound_s(c, target)
                if lb >= best - EPS:
                    c.status = "pruned"
                    n = len(c.reps)
                    mean = f" its mean over {n} seeds" if n > 1 else " it"
                    c.note = (f"replayed to epoch {_cut_epoch(c):.3g},{mean} cannot reach the target before "
                              f"{secs(lb)}, no earlier than the {'mean ' if n > 1 else ''}{secs(best)} already "
                              "measured" + (" (a seed of it may still be first)" if n > 1 else ""))
            pool = [c for c in pool if c.status == "candidate"]
        if k == last or not pool:
            break
        ranked = sorted(pool, key=lambda c: (score(c, target), c.index))
        keep = max(math.ceil(len(ranked) / reduction_factor), min(len(ranked), 2))
        if cap is not None:
            keep = min(keep, cap)
        while cap is None and keep < len(ranked) and score(ranked[keep], target) == score(ranked[keep - 1], target):
            keep += 1  # a tie with the last one kept is no evidence against it
        for r, c in enumerate(ranked, 1):
            c.rank = r
            if r > keep:
                c.status = "stopped"
                c.note = (f"stopped at rung {k + 1} of {len(fractions)}: {pct(c.rung_scores[-1])} at epoch "
                          f"{_cut_epoch(c):.3g}" + (", not at the target yet" if target is not None else "")
                          + f"; ranked {r} of {len(ranked)}, the best {keep} continued")
        pool = ranked[:keep]


def _cut_epoch(c: Candidate) -> float:
    return math.fsum(r.eval_at(r.cut)[1] for r in c.reps) / len(c.reps)


# -- advise ------------------------------------------------------------------------------------
def advise(scenario: Scenario, out_dir: str | Path, *, budget_s: float | None = None,
           target_error: float | None = None, replay: int | None = None, jobs: int | None = None,
           resume: bool = False, progress: bool = False, options: dict[str, Any] | None = None,
           min_fraction: float = MIN_FRACTION, reduction_factor: float = REDUCTION_FACTOR) -> Advice:
    """Search ``scenario``'s sweep for the best configuration under a budget or a target.

    Simulates every point into ``out_dir``, replays the rungs into ``out_dir/replay``
    (``options`` are the backend's :class:`RunOptions` fields; ``replay``: at most this many
    configurations continue past any rung) and returns the :class:`Advice`; writes
    ``advice.txt`` and ``advice.csv`` into ``out_dir``.
    """
    check_goal(budget_s, target_error, replay, jobs, min_fraction, reduction_factor)
    fractions = rung_fractions(min_fraction, reduction_factor)
    out = Path(out_dir)
    pts = scenario.points()
    records = run_points(scenario, pts, out, jobs=jobs, resume=resume, progress=progress)
    cands = configurations(records, {p["_id"]: p for p in pts})
    merge_equivalent(cands)
    live = [c for c in cands if c.status == "candidate"]
    for c in live:
        for r in c.reps:
            got = [i for i, (t, _) in enumerate(r.evals) if budget_s is None or t <= budget_s + EPS]
            r.horizon = got[-1] if got else 0
    exhaustive = math.fsum(r.eval_at(r.horizon)[1] for c in live for r in c.reps)
    if budget_s is not None:
        for c in live:
            if all(r.first_eval_s() > budget_s + EPS for r in c.reps):
                c.status = "pruned"
                first = c.first_eval_s()
                c.note = (f"its first evaluation comes at {secs(first)}, after the {secs(budget_s)} budget"
                          if math.isfinite(first) else "it never evaluates a trained model")
        live = [c for c in live if c.status == "candidate"]

    replay_dir = out / "replay"
    rungs = Rungs(scenario, replay_dir, replay_dir, options, jobs, resume, progress)
    halve(live, rungs, fractions, reduction_factor, budget_s=budget_s, target=target_error, cap=replay)
    for c in cands:
        if c.status == "equivalent" and c.twin is not None and c.twin.status == "replayed":
            c.curves, c.diverged = c.twin.curves, c.twin.diverged
            c.error, c.at_s, c.at_epoch = c.twin.error, c.twin.at_s, c.twin.at_epoch

    ok = [c for c in cands if c.status == "replayed"]
    if budget_s is not None:
        ranking = sorted(ok, key=lambda c: (c.error, c.at_s, c.index))
        winners = ranking
    else:
        ranking = sorted(ok, key=lambda c: (c.at_s is None, c.at_s if c.at_s is not None else c.error,
                                            c.error, c.index))
        winners = [c for c in ranking if c.at_s is not None]
    rec = winners[0] if winners else None
    runner = next((c for c in ranking if c is not rec), None) if rec else None
    advice = Advice(str(scenario.base["name"]), budget_s, target_error, replay, out, cands, ranking, rec, runner,
                    fractions=fractions, reduction_factor=reduction_factor, rung_sizes=rungs.sizes,
                    replays=rungs.replays, epochs_replayed=rungs.epochs, epochs_exhaustive=exhaustive)
    write_file(out / "advice.txt", render(advice) + "\n")
    write_file(out / "advice.csv", advice_csv(advice))
    return advice


# -- run --prune ------------------------------------------------------------------------------
PRUNED_COLUMNS = ("pruned_at_epoch", "pruned_test_error")  # summary.csv's record of a point stopped at a rung
MEASURED = ("final_test_error", "best_test_error", "time_to_target_s", "diverged", "diverged_at_update",
            "did_not_learn")  # what only a whole replay measures


def prune_sweep(scenario: Scenario, out_dir: str | Path, *, min_fraction: float = MIN_FRACTION,
                reduction_factor: float = REDUCTION_FACTOR, options: dict[str, Any] | None = None,
                jobs: int | None = None, resume: bool = False, progress: bool = False, engine: str = "auto",
                executor: str = "local", scheduler: str | None = None) -> list[dict[str, Any]]:
    """``ddlsim run --prune``: the sweep replayed by successive halving of its configurations,
    each point's horizon its whole run; the result records of every point in sweep order.

    The configurations that reach the last rung are replayed whole into ``out_dir`` (their runs
    are those of ``ddlsim run``); the rungs' cut replays go to ``out_dir/rungs`` (a cache of
    runs, with the simulations). A point stopped at a rung keeps its row in ``summary.csv``
    with what it measured there (:data:`PRUNED_COLUMNS`, empty :data:`MEASURED`: it is not a
    failure) and its curve to that rung in ``curves.csv``.
    """
    fractions = rung_fractions(min_fraction, reduction_factor)
    out = Path(out_dir)
    pts = scenario.points()
    with ResultsFolder.open(out) as folder:  # refused like `ddlsim run`: another sweep's runs, a user's files
        prepare_folder(folder, str(scenario.base["name"]), {p["_id"]: point_hash(p) for p in pts}, set(),
                       "replay", False)
    rung_dir = out / "rungs"
    sims = run_points(scenario, pts, rung_dir, jobs=jobs, resume=resume, progress=progress, engine=engine,
                      executor=executor, scheduler=scheduler, keep_others=True)
    cands = configurations(sims, {p["_id"]: p for p in pts})
    for c in cands:
        for r in c.reps:
            r.horizon = len(r.evals) - 1
    rungs = Rungs(scenario, out, rung_dir, options, jobs, resume, progress, engine=engine, executor=executor,
                  scheduler=scheduler)
    halve([c for c in cands if c.status == "candidate"], rungs, fractions, reduction_factor)
    sim_of = {r["row"]["run_id"]: r for r in sims}
    reps = {r.point["_id"]: r for c in cands for r in c.reps}
    records = [_sweep_record(reps[p["_id"]], sim_of[p["_id"]]) for p in pts]
    write_tables(out, records)
    return records


def pruned_words(records: list[dict[str, Any]]) -> str:
    """One line: how many points were stopped at a rung, and at which epochs."""
    at = sorted({float(r["row"]["pruned_at_epoch"]) for r in records if r["row"].get("pruned_at_epoch") is not None})
    n = sum(r["row"].get("pruned_at_epoch") is not None for r in records)
    if not n:
        return "successive halving: every point replayed whole"
    return (f"successive halving: {n} of {len(records)} points stopped at a rung (at epoch "
            f"{', '.join(f'{e:.3g}' for e in at)}; summary.csv: pruned_at_epoch, pruned_test_error), "
            f"{len(records) - n} replayed whole")


def _sweep_record(rep: Replicate, sim: dict[str, Any]) -> dict[str, Any]:
    """A point's record in the sweep's tables: its whole replay's; for one stopped at a rung, its
    simulation's row with what the rung measured and its curve to there; a failure's own."""
    rid = rep.point["_id"]
    if rep.record is None:
        return sim
    row = {**rep.record["row"], "run_id": rid}
    curves = [{**c, "run_id": rid} for c in rep.curves]
    if not rep.complete:
        row.update({k: None for k in MEASURED})
        row.update(pruned_at_epoch=rep.eval_at(rep.cut)[1], pruned_test_error=rep.error_at(rep.cut))
    return {**rep.record, "row": row, "curves": curves if not rep.complete else
            [{**c, "run_id": rid} for c in rep.record["curves"]]}


__all__ = ["advise", "check_goal", "check_halving", "rung_fractions", "halve", "prune_sweep", "Advice",
           "Candidate", "MIN_FRACTION", "REDUCTION_FACTOR", "PRUNED_COLUMNS"]
