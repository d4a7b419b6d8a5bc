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

import argparse
import copy
import csv
import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .load import Scenario, point_hash
from .schema import ScenarioError

RISK_SIGMA = 2.0   # constant lr with ⟨σ⟩ above this is "at risk" (Rudra: 1-softsync σ ≤ 2 is fine)
SAME = 1.10        # ratios within 10 % read as "about the same"
EPS = 1e-9         # slack on "at or before T" (float sums of simulated time)


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


# -- one sweep point -----------------------------------------------------------------------
@dataclass
class Candidate:
    """One sweep point: its simulation, its prediction and (if replayed) its measurement."""

    index: int
    point: dict[str, Any]
    row: dict[str, Any]
    label: str = ""
    evals: list[tuple[float, float]] = field(default_factory=list)  # (sim_time_s, epoch)
    status: str = "candidate"   # failed | equivalent | pruned | not replayed | replayed
    note: str = ""
    twin: Candidate | None = None           # the equivalent point replayed in its place
    rank: int | None = None                 # predicted rank (1 = most promising)
    curves: list[dict[str, Any]] = field(default_factory=list)
    replay_error: str | None = None
    diverged: bool = False
    # what the goal measures (filled after the replay)
    error: float | None = None      # budget: error at T; target: best error
    at_s: float | None = None       # budget: time of that evaluation; target: time to target
    at_epoch: float | None = None

    # -- facts from the simulation --
    @property
    def run_id(self) -> str:
        return str(self.row["run_id"])

    @property
    def protocol(self) -> str:
        return str(self.row["protocol"])

    @property
    def learners(self) -> int:
        return int(self.row["learners"])

    @property
    def minibatch(self) -> int:
        return int(self.row["minibatch"])

    @property
    def policy(self) -> str:
        return str(self.point["optimizer"]["lr_policy"])

    @property
    def sigma(self) -> float:
        v = self.row.get("staleness_mean")
        return float(v) if _num(v) else 0.0

    @property
    def sim_time(self) -> float:
        return float(self.row["sim_time_s"])

    @property
    def epochs(self) -> float:
        """Epochs of the whole run (its last evaluation)."""
        return self.evals[-1][1] if self.evals else float(self.point["workload"]["epochs"])

    @property
    def sec_per_epoch(self) -> float:
        return self.sim_time / self.epochs if self.epochs > 0 else math.inf

    @property
    def updates_per_epoch(self) -> float:
        return float(self.row.get("updates") or 0) / self.epochs if self.epochs > 0 else 0.0

    @property
    def samples_per_update(self) -> float:
        upd = float(self.row.get("updates") or 0)
        return self.epochs * self.point["workload"]["samples_per_epoch"] / upd if upd else math.inf

    @property
    def risky(self) -> bool:
        """Constant learning rate with stale gradients: Rudra's non-converging case."""
        return self.policy == "constant" and self.sigma > RISK_SIGMA

    def effective_policy(self) -> str:
        """The lr policy this trace really gets: one whose factors are all 1 is ``constant``."""
        smax = self.row.get("staleness_max")
        smax = float(smax) if _num(smax) else 0.0
        if self.policy == "per_gradient" and smax <= 1:
            return "constant"
        if self.policy == "mean_staleness" and self.sigma < 1:
            return "constant"
        return self.policy

    def first_eval_s(self) -> float:
        """Simulated time of the first evaluation after training starts."""
        return next((t for t, e in self.evals if e > 0), math.inf)

    def eval_by(self, t: float) -> tuple[float, float] | None:
        """The last scheduled evaluation at or before ``t`` as (time, epoch)."""
        got = [ev for ev in self.evals if ev[0] <= t + EPS]
        return got[-1] if got else None

    def epochs_by(self, t: float) -> float:
        ev = self.eval_by(t)
        return ev[1] if ev else 0.0


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _eval_schedule(out: Path, run_id: str) -> list[tuple[float, float]]:
    from ..simulator import trace as tracemod

    tr = tracemod.read(out / "runs" / run_id / "trace.ddlt")
    ev = tr.ops["kind"] == tracemod.EVAL
    pairs = sorted(zip(tr.ops["t_end"][ev].tolist(), tr.ops["epoch"][ev].tolist()))
    return [(float(t), float(e)) for t, e in pairs]


class _Subset(Scenario):
    """A scenario whose points are a chosen subset of another's (for run_sweep)."""

    def __init__(self, parent: Scenario, points: list[dict[str, Any]]) -> None:
        super().__init__(parent.path, parent.base, parent.axes)
        self._chosen = points

    def points(self) -> list[dict[str, Any]]:
        return copy.deepcopy(self._chosen)


# -- the advice ------------------------------------------------------------------------------
@dataclass
class Advice:
    """The outcome of :func:`advise`; :meth:`text` is what the CLI prints."""

    name: str
    budget_s: float | None
    target_error: float | None
    replay: int
    out_dir: Path
    candidates: list[Candidate]
    ranking: list[Candidate]              # replayed points, best first
    recommendation: Candidate | None
    runner_up: Candidate | None

    @property
    def mode(self) -> str:
        return "budget" if self.budget_s is not None else "target"

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.candidates)

    def pruned(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "pruned"]

    def text(self) -> str:
        return _render(self)


def advise(scenario: Scenario, out_dir: str | Path, *, budget_s: float | None = None,
           target_error: float | None = None, replay: int = 4, jobs: int | None = None,
           resume: bool = False, progress: bool = False,
           options: dict[str, Any] | None = None) -> Advice:
    """Search ``scenario``'s sweep for the best configuration under a budget or a target.

    Simulates every point into ``out_dir``, replays at most ``replay`` of them into
    ``out_dir/replay`` (``options`` are the backend's :class:`RunOptions` fields) and
    returns the :class:`Advice`; writes ``advice.txt`` and ``advice.csv`` into ``out_dir``.
    """
    from .runner import default_jobs, run_sweep

    check_goal(budget_s, target_error, replay, jobs)
    out = Path(out_dir)
    records = run_sweep(scenario, out, jobs=jobs, resume=resume, progress=progress)
    points = {p["_id"]: p for p in scenario.points()}
    from ..analysis.table import labels

    names = labels([r["row"] for r in records])
    cands: list[Candidate] = []
    for i, rec in enumerate(records):
        row = rec["row"]
        c = Candidate(i, points[row["run_id"]], row, names[str(row["run_id"])])
        if row.get("error"):
            c.status, c.note = "failed", f"simulation failed: {row['error']}"
        else:
            c.evals = _eval_schedule(out, c.run_id)
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
                c.note = (f"its first evaluation comes at {_s(first)}, after the {_s(budget_s)} budget"
                          if math.isfinite(first) else "it never evaluates a trained model")
        live = [c for c in live if c.status == "candidate"]
        # epochs compared to 0.1: evaluations of different protocols land a few samples apart
        live.sort(key=lambda c: (c.risky, -round(c.epochs_by(budget_s), 1), c.sigma, -c.updates_per_epoch,
                                 c.index))
    else:
        live.sort(key=lambda c: (c.risky, c.sec_per_epoch, c.sigma, -c.updates_per_epoch, c.index))
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
                        c.note = (f"its first evaluation comes at {_s(c.first_eval_s())}, no earlier than "
                                  f"the {_s(best)} at which a replayed point already reached the target")
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
    from ..simulator.trace import atomic_write_bytes

    atomic_write_bytes(out / "advice.txt", (advice.text() + "\n").encode())
    atomic_write_bytes(out / "advice.csv", _advice_csv(advice))
    return advice


def _best_time(done: list[Candidate]) -> float | None:
    times = [c.at_s for c in done if c.status == "replayed" and c.at_s is not None]
    return min(times) if times else None


def _replay(scenario: Scenario, replay_dir: Path, done: list[Candidate], take: list[Candidate],
            jobs: int | None, resume: bool, progress: bool, options: dict[str, Any] | None) -> None:
    """Replay ``take`` (after ``done``, kept) into ``replay_dir``; fill their curves."""
    from .runner import run_sweep

    if not resume:  # a result left by an earlier call is recomputed, as `ddlsim run` does
        for c in take:
            (replay_dir / "runs" / c.run_id / "result.json").unlink(missing_ok=True)
    sub = _Subset(scenario, [c.point for c in done + take])
    records = run_sweep(sub, replay_dir, backend="replay", options=options, jobs=jobs, resume=True,
                        progress=progress)
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
    return float(v) if _num(v) else 1.0


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
        hit = next((r for r in c.curves if _num(r["test_error"]) and r["test_error"] <= target_error), None)
        best = min(c.curves, key=lambda r: _err(r["test_error"]))
        c.error = _err(best["test_error"])
        c.at_s = hit["sim_time_s"] if hit else None
        c.at_epoch = hit["epoch"] if hit else best["epoch"]


# -- words -------------------------------------------------------------------------------------
def _s(t: float) -> str:
    return f"{t:.3g} s"


def _pct(e: float | None) -> str:
    return "—" if e is None else f"{100 * e:.1f} %"


def _x(r: float) -> str:
    return f"{r:.2g}×" if r < 10 else f"{r:.0f}×"


def pace_cause(slow: Candidate, fast: Candidate) -> str:
    """Why ``slow`` needs more simulated time per epoch than ``fast``."""
    if slow.protocol == "hardsync" and fast.protocol != "hardsync":
        return f"its barrier makes every update wait for the slowest of its {slow.learners} learners"
    if slow.protocol == "ssp" and fast.protocol not in ("ssp", "hardsync"):
        return "its staleness bound makes fast learners wait for the slowest"
    if slow.learners < fast.learners:
        return f"it has {slow.learners} learners against {fast.learners}"
    util = slow.row.get("server_utilization")
    if _num(util) and util > 0.8 and util > (fast.row.get("server_utilization") or 0):
        return f"its parameter server is busy {100 * util:.0f} % of the time, so gradients queue"
    if slow.minibatch < fast.minibatch:
        return (f"with μ = {slow.minibatch} against {fast.minibatch} it pays the fixed cost of a minibatch "
                f"and of a gradient message {_x(fast.minibatch / slow.minibatch)} as often")
    gs, gf = slow.row.get("gradients_per_s"), fast.row.get("gradients_per_s")
    if _num(gs) and _num(gf):
        return f"it computes {gs:.3g} gradients per simulated second against {gf:.3g}"
    return "the simulation predicts it slower"


def learning_cause(worse: Candidate, better: Candidate) -> str:
    """Why ``worse`` learns less from the same data than ``better``."""
    if worse.diverged and not better.diverged:
        return "it diverged"
    if worse.risky and not better.risky:
        return (f"its gradients are on average ⟨σ⟩ = {worse.sigma:.3g} updates stale and its constant "
                "learning rate does not compensate (Rudra: with α0 such runs do not converge, with α0/σ they do)")
    if worse.samples_per_update > 1.5 * better.samples_per_update:
        return (f"each of its updates averages {worse.samples_per_update:.0f} samples against "
                f"{better.samples_per_update:.0f}, so it makes {worse.updates_per_epoch:.3g} updates per "
                f"epoch against {better.updates_per_epoch:.3g}")
    if worse.sigma > better.sigma + 0.5:
        return f"its gradients are staler (⟨σ⟩ = {worse.sigma:.3g} against {better.sigma:.3g})"
    if worse.effective_policy() != better.effective_policy():
        return (f"the replay measured that the {worse.policy} learning rate learns less here than "
                f"{better.policy}")
    return "the replay measured that it learns less from the same data"


def explain(a: Candidate, b: Candidate | None, budget_s: float | None,
            target_error: float | None) -> str:
    """One paragraph: why ``a`` (recommended) beats ``b`` (runner-up)."""
    if b is None:
        return "it is the only configuration replayed."
    r = b.sec_per_epoch / a.sec_per_epoch
    if budget_s is not None:
        ea, eb = a.epochs_by(budget_s), b.epochs_by(budget_s)
        if b.diverged and not a.diverged:
            return f"the runner-up diverged; {a.label} did not."
        if r >= SAME:
            text = (f"the runner-up is {_x(r)} slower per epoch ({_s(b.sec_per_epoch)} against "
                    f"{_s(a.sec_per_epoch)}): {pace_cause(b, a)}; by {_s(budget_s)} it has seen "
                    f"{eb:.3g} epochs against {ea:.3g}")
            if b.risky and not a.risky:
                text += f"; also, {learning_cause(b, a)}"
            return text + "."
        if r <= 1 / SAME:
            return (f"{a.label} is {_x(1 / r)} slower per epoch ({pace_cause(a, b)}) and sees "
                    f"{ea:.3g} epochs by the budget against {eb:.3g}, but it learns more from each: "
                    f"in the runner-up, {learning_cause(b, a)}.")
        return (f"both get through about the same data by {_s(budget_s)} ({ea:.3g} and {eb:.3g} "
                f"epochs); the runner-up learns less from it: {learning_cause(b, a)}.")
    # target
    if b.at_s is None:
        return (f"no other replayed configuration reaches {_pct(target_error)}: the runner-up's best is "
                f"{_pct(b.error)} ({learning_cause(b, a)}).")
    ea, eb = a.at_epoch or 0.0, b.at_epoch or 0.0
    q = eb / ea if ea > 0 else math.inf
    if r >= SAME and q < 1 / SAME:
        return (f"the runner-up needs fewer epochs ({eb:.3g} against {ea:.3g}) but each is {_x(r)} slower "
                f"({pace_cause(b, a)}): {eb:.3g} × {_s(b.sec_per_epoch)} ≈ {_s(b.at_s)} against "
                f"{ea:.3g} × {_s(a.sec_per_epoch)} ≈ {_s(a.at_s)}.")
    if r >= SAME:
        text = f"the runner-up is {_x(r)} slower per epoch: {pace_cause(b, a)}"
        if q >= SAME:
            text += f"; it also needs {eb:.3g} epochs against {ea:.3g}: {learning_cause(b, a)}"
        return text + "."
    if r <= 1 / SAME:
        return (f"{a.label} is {_x(1 / r)} slower per epoch ({pace_cause(a, b)}) but reaches the target "
                f"after {ea:.3g} epochs against {eb:.3g}: in the runner-up, {learning_cause(b, a)}.")
    return (f"both run at about the same pace ({_s(a.sec_per_epoch)} and {_s(b.sec_per_epoch)} per epoch); "
            f"the runner-up needs {eb:.3g} epochs against {ea:.3g}: {learning_cause(b, a)}.")


def _margin(a: Candidate, b: Candidate | None, adv: Advice) -> str:
    """A warning when the two errors differ by at most two test samples."""
    from ..simulator.catalog import dataset_info

    if b is None or a.error is None or b.error is None:
        return ""
    if adv.mode == "target" and b.at_s is not None:
        return ""
    wl = a.point["workload"]
    try:
        size = dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"]).test_size
    except KeyError:
        return ""
    k = round(abs(b.error - a.error) * size)
    if k > 2:
        return ""
    return (f" The margin is narrow: {k} test sample{'s' * (k != 1)} of {size}, so the two are about "
            "equally good; prefer either.")


def _goal_words(adv: Advice) -> str:
    if adv.budget_s is not None:
        return f"a budget of {_s(adv.budget_s)} of simulated time"
    return f"a target of {_pct(adv.target_error)} test error"


def _table(adv: Advice) -> list[str]:
    budget = adv.mode == "budget"
    T = adv.budget_s
    head = ["#", "configuration", f"epochs by {_s(T)}" if budget else "s/epoch", "σ mean",
            f"error at {_s(T)}" if budget else "time to target", "at epoch", "status"]
    order = sorted(adv.candidates, key=lambda c: (
        0 if c.status == "replayed" else 1 if c.status == "equivalent" else 2,
        adv.ranking.index(c) if c in adv.ranking else (c.rank or 10**9), c.index))
    rows = []
    for c in order:
        if c.status == "failed" and not c.evals:
            rows.append(["", c.label, "", "", "", "", "failed"])
            continue
        pred = f"{c.epochs_by(T):.3g}" if budget else f"{c.sec_per_epoch:.3g}"
        if c.status in ("replayed", "equivalent") and c.error is not None:
            got = _pct(c.error) if budget else (_s(c.at_s) if c.at_s is not None else
                                                f"never (best {_pct(c.error)})")
            ep = f"{c.at_epoch:.3g}" if c.at_epoch is not None else ""
        else:
            got, ep = "", ""
        place = str(adv.ranking.index(c) + 1) if c in adv.ranking else ""
        status = c.status if c.status != "equivalent" else f"= {c.twin.label if c.twin else '?'}"
        if c.risky and c.status != "equivalent":
            status += " (at risk: constant lr, ⟨σ⟩ > 2)"
        rows.append([place, c.label, pred, f"{c.sigma:.3g}", got, ep, status])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    out = ["  ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return out


def _render(adv: Advice) -> str:
    n = len(adv.candidates)
    lines = [f"ddlsim advise {adv.name}: {n} sweep point{'s' * (n != 1)}, {_goal_words(adv)}"]
    parts = [f"simulated all {n} into {adv.out_dir}"]
    if adv.count("failed"):
        parts.append(f"{adv.count('failed')} failed")
    if adv.count("equivalent"):
        parts.append(f"{adv.count('equivalent')} equivalent to another point (a staleness-aware "
                     "learning rate whose factors are all 1 on its trace) and not replayed twice")
    rule = ("no evaluation of a trained model within the budget" if adv.mode == "budget" else
            "first evaluation no earlier than a time to target already measured")
    parts.append(f"pruned {len(adv.pruned())} by simulated time alone ({rule})")
    replayed = len(adv.ranking) + sum(c.status == "failed" and c.replay_error is not None
                                      for c in adv.candidates)
    parts.append(f"replayed {replayed} (--replay {adv.replay}) into {adv.out_dir / 'replay'}")
    if adv.count("not replayed"):
        parts.append(f"{adv.count('not replayed')} not replayed (ranked below the top {adv.replay} by the "
                     "prediction)")
    lines.append("; ".join(parts) + ".")
    lines.append("")
    lines += _table(adv)
    lines.append("")
    a, b = adv.recommendation, adv.runner_up
    failures = [c for c in adv.candidates if c.replay_error]
    if failures:  # say why replays failed: a missing data set or device is the usual cause
        lines.append(f"{len(failures)} replay{'s' * (len(failures) != 1)} failed: {failures[0].label}: "
                     f"{failures[0].replay_error}")
    if a is None and failures and not adv.ranking:
        lines.append("No recommendation: every replay failed (above).")
        return "\n".join(lines)
    if a is None:
        if adv.mode == "budget":
            first = min((c.first_eval_s() for c in adv.candidates if c.evals), default=math.inf)
            lines.append(f"No recommendation: no configuration evaluates a trained model within "
                         f"{_s(adv.budget_s)}; the earliest first evaluation is at {_s(first)}.")
        else:
            best = min(adv.ranking, key=lambda c: c.error, default=None)
            lines.append(f"No recommendation: no replayed configuration reaches {_pct(adv.target_error)}"
                         + (f"; the closest is {best.label} with {_pct(best.error)}." if best else ".")
                         + " Try more epochs, a looser target or a larger --replay.")
        return "\n".join(lines)
    twins = [c.label for c in adv.candidates if c.status == "equivalent" and c.twin is a]
    also = f" (the same run as {', '.join(twins)})" if twins else ""
    if adv.mode == "budget":
        lines.append(f"Recommended: {a.label}{also}: {_pct(a.error)} test error by {_s(a.at_s)} of the "
                     f"{_s(adv.budget_s)} budget (epoch {a.at_epoch:.3g}).")
        if b is not None:
            lines.append(f"Runner-up:   {b.label}: {_pct(b.error)} by {_s(b.at_s)} (epoch {b.at_epoch:.3g}).")
    else:
        lines.append(f"Recommended: {a.label}{also}: reaches {_pct(adv.target_error)} test error at "
                     f"{_s(a.at_s)} of simulated time (epoch {a.at_epoch:.3g}; best {_pct(a.error)}).")
        if b is not None:
            reach = (f"reaches it at {_s(b.at_s)} (epoch {b.at_epoch:.3g})" if b.at_s is not None
                     else f"never reaches it (best {_pct(b.error)})")
            lines.append(f"Runner-up:   {b.label}: {reach}.")
    lines.append(f"Why: {explain(a, b, adv.budget_s, adv.target_error)}{_margin(a, b, adv)}")
    if adv.mode == "target":
        never = [c for c in adv.ranking if c.at_s is None and c is not b]
        if never:
            lines.append("Never reached the target: " + "; ".join(
                f"{c.label} (best {_pct(c.error)}{', diverged' if c.diverged else ''})" for c in never) + ".")
    pr = adv.pruned()
    if pr:
        lines.append("Pruned without replay: " + "; ".join(f"{c.label}: {c.note}" for c in pr[:4])
                     + (f"; and {len(pr) - 4} more" if len(pr) > 4 else "") + ".")
    lines.append(f"Curves and summary of the replayed runs: {adv.out_dir / 'replay'} "
                 f"(`ddlsim report {adv.out_dir / 'replay'}`).")
    return "\n".join(lines)


def _advice_csv(adv: Advice) -> bytes:
    cols = ["run_id", "label", "status", "predicted_rank", "measured_rank", "sim_time_s", "sec_per_epoch",
            "epochs_by_budget", "first_eval_s", "staleness_mean", "lr_policy", "at_risk",
            "error", "at_s", "at_epoch", "diverged", "note"]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for c in adv.candidates:
        ok = bool(c.evals)
        w.writerow([c.run_id, c.label, c.status, c.rank or "",
                    adv.ranking.index(c) + 1 if c in adv.ranking else "",
                    repr(c.sim_time) if ok else "", repr(c.sec_per_epoch) if ok else "",
                    repr(c.epochs_by(adv.budget_s)) if ok and adv.budget_s is not None else "",
                    repr(c.first_eval_s()) if ok else "", repr(c.sigma), c.policy, c.risky,
                    "" if c.error is None else repr(c.error), "" if c.at_s is None else repr(c.at_s),
                    "" if c.at_epoch is None else repr(c.at_epoch), c.diverged, c.note])
    return buf.getvalue().encode()


# -- command line ------------------------------------------------------------------------------
def cmd_advise(args: argparse.Namespace) -> int:
    from .cli import check_data_sets, resolve_scenario, safe_name
    from .load import load

    check_goal(args.budget_s, args.target_error, args.replay, args.jobs)
    scenario = load(resolve_scenario(args.scenario), args.set)
    if args.device:
        from ..backends.replay import resolve_device

        resolve_device(args.device)  # an unknown or unavailable device fails before any work
    if args.replay > 0:  # so does a data set that cannot be read
        check_data_sets(scenario, "replay", args.data_dir, args.download)
    out = Path(args.out) if args.out else Path("results") / f"{safe_name(scenario.base['name'])}-advise"
    options = {"device": args.device, "data_dir": args.data_dir, "download": args.download}
    adv = advise(scenario, out, budget_s=args.budget_s, target_error=args.target_error,
                 replay=args.replay, jobs=args.jobs, resume=args.resume, progress=not args.quiet,
                 options=options)
    print(adv.text())
    return 0 if adv.recommendation is not None else 1


def register(sub: Any) -> None:
    """Add ``ddlsim advise`` to the parser."""
    from .cli import add_data_options, add_scenario_options

    p = sub.add_parser("advise", help="search a sweep by simulation, replay the promising points, "
                       "recommend a configuration for a time budget or a target error")
    add_scenario_options(p, "results/<scenario name>-advise", executors=False)
    goal = p.add_argument_group("goal (exactly one)")
    goal.add_argument("--budget-s", type=float, metavar="T",
                      help="simulated seconds available: minimise the test error at T")
    goal.add_argument("--target-error", type=float, metavar="E",
                      help="test error to reach (fraction, e.g. 0.08): minimise the time to reach it")
    p.add_argument("--replay", type=int, default=4, metavar="K",
                   help="replay at most K points with real gradients (default 4)")
    add_data_options(p)
    p.set_defaults(func=cmd_advise)


__all__ = ["advise", "Advice", "Candidate", "check_goal", "explain", "register"]
