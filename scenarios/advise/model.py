"""The facts ``ddlsim advise`` reasons with: one configuration (its replicates) as a candidate,
what successive halving measured of it, and the advice.

Pure data and what follows from a configuration's simulations and replays (no search, no words).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

SAME = 1.10        # ratios within 10 % read as "about the same"
EPS = 1e-9         # slack on "at or before T" (float sums of simulated time)


@dataclass
class Replicate:
    """One run of a configuration (one sweep point, one seed): its simulation's evaluation
    schedule, and the curves of its longest replay so far (to evaluation ``cut``)."""

    point: dict[str, Any]
    row: dict[str, Any]
    evals: list[tuple[float, float]] = field(default_factory=list)  # (sim_time_s, epoch)
    curves: list[dict[str, Any]] = field(default_factory=list)
    diverged: bool = False
    cut: int | None = None       # index in ``evals`` of the last evaluation replayed
    horizon: int | None = None   # index in ``evals`` of the last evaluation the goal looks at
    source: dict[str, Any] | None = None  # the replayed point whose result gave ``curves``
    record: dict[str, Any] | None = None  # that result (its row, its curves)

    @property
    def complete(self) -> bool:
        """Replayed as far as the goal looks (or diverged: a longer replay diverges alike)."""
        return self.cut is not None and (self.diverged or self.cut >= (self.horizon or 0))

    def eval_at(self, i: int | None) -> tuple[float, float]:
        """(sim_time_s, epoch) of evaluation ``i``: a cut or a horizon, which must be set by now."""
        if i is None:
            raise ValueError("no evaluation index: the replicate was not replayed or bounded yet")
        return self.evals[i]

    def error_at(self, i: int | None) -> float:
        """Test error at evaluation ``i`` (replayed): 1 where the replay diverged before it."""
        t, e = self.eval_at(i)
        assert i is not None
        got = [r for r in self.curves if r["sim_time_s"] <= t + EPS and r["epoch"] <= e + EPS]
        if not got or (self.diverged and len(got) < i + 1):
            return 1.0
        return err(got[-1]["test_error"])

    def hit(self, target: float) -> dict[str, Any] | None:
        """The first replayed evaluation at or below ``target``."""
        return next((r for r in self.curves if is_number(r["test_error"]) and r["test_error"] <= target), None)

    def first_eval_s(self) -> float:
        """Simulated time of the first evaluation after training starts."""
        return next((t for t, e in self.evals if e > 0), math.inf)


@dataclass
class Candidate:
    """One configuration: its simulation, what successive halving measured of it, and (once
    replayed to its horizon) the goal's measurement. ``point``, ``row`` and ``evals`` are its
    first replicate's; ``reps`` all of them (one sweep point each, differing only in the seed)."""

    index: int
    point: dict[str, Any]
    row: dict[str, Any]
    label: str = ""
    evals: list[tuple[float, float]] = field(default_factory=list)  # (sim_time_s, epoch)
    status: str = "candidate"   # failed | equivalent | pruned | stopped | replayed
    note: str = ""
    twin: Candidate | None = None           # the equivalent configuration replayed in its place
    rank: int | None = None                 # its place in the last rung it was ranked at (1 = best)
    curves: list[dict[str, Any]] = field(default_factory=list)
    replay_error: str | None = None
    diverged: bool = False
    reps: list[Replicate] = field(default_factory=list)
    rung: int | None = None                 # the last rung it was replayed to (0 = the first)
    rung_scores: list[float] = field(default_factory=list)  # its mean error at each rung it reached
    # what the goal measures (filled once replayed to its horizon)
    error: float | None = None      # budget: error at T; target: best error
    at_s: float | None = None       # budget: time of that evaluation; target: time to target
    at_epoch: float | None = None

    def __post_init__(self) -> None:
        if not self.reps:
            self.reps = [Replicate(self.point, self.row, self.evals)]

    # -- facts from the simulation (means over the replicates) --
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

    def _mean(self, key: str, default: float = 0.0) -> float:
        vals = [float(r.row[key]) for r in self.reps if is_number(r.row.get(key))]
        return math.fsum(vals) / len(vals) if vals else default

    @property
    def sigma(self) -> float:
        return self._mean("staleness_mean")

    @property
    def staleness_max(self) -> float:
        vals = [float(r.row["staleness_max"]) for r in self.reps if is_number(r.row.get("staleness_max"))]
        return max(vals, default=0.0)

    @property
    def sim_time(self) -> float:
        return self._mean("sim_time_s", math.nan)

    @property
    def epochs(self) -> float:
        """Epochs of the whole run (its last evaluation)."""
        return self.evals[-1][1] if self.evals else float(self.point["workload"]["epochs"])

    @property
    def sec_per_epoch(self) -> float:
        return self.sim_time / self.epochs if self.epochs > 0 else math.inf

    @property
    def updates_per_epoch(self) -> float:
        return self._mean("updates") / self.epochs if self.epochs > 0 else 0.0

    @property
    def samples_per_update(self) -> float:
        upd = self._mean("updates")
        return self.epochs * self.point["workload"]["samples_per_epoch"] / upd if upd else math.inf

    def effective_policy(self) -> str:
        """The lr policy its traces really get: one whose factors are all 1 is ``constant``."""
        if self.policy == "per_gradient" and self.staleness_max <= 1:
            return "constant"
        if self.policy == "mean_staleness" and all(_sigma(r) < 1 for r in self.reps):
            return "constant"
        return self.policy

    def first_eval_s(self) -> float:
        """Simulated time of the first evaluation after training starts (its earliest replicate's)."""
        return min(r.first_eval_s() for r in self.reps)

    def eval_by(self, t: float) -> tuple[float, float] | None:
        """The last scheduled evaluation at or before ``t`` as (time, epoch) of its first replicate."""
        got = [ev for ev in self.evals if ev[0] <= t + EPS]
        return got[-1] if got else None

    def epochs_by(self, t: float) -> float:
        """Epochs reached by the last evaluation at or before ``t``, the mean over its replicates."""
        got = []
        for r in self.reps:
            ev = [e for s, e in r.evals if s <= t + EPS]
            got.append(ev[-1] if ev else 0.0)
        return math.fsum(got) / len(got)

    @property
    def complete(self) -> bool:
        return all(r.complete for r in self.reps)


def _sigma(r: Replicate) -> float:
    v = r.row.get("staleness_mean")
    return float(v) if is_number(v) else 0.0


def is_number(v: Any) -> TypeGuard[float]:
    """A finite int or float (not a bool) that a float can hold."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond a float's range
        return False


def err(v: Any) -> float:
    """A measured test error; 1 (every sample wrong) for one that is not a number."""
    return float(v) if is_number(v) else 1.0


@dataclass
class Advice:
    """The outcome of :func:`advise`; :meth:`text` is what the CLI prints."""

    name: str
    budget_s: float | None
    target_error: float | None
    replay: int | None
    out_dir: Path
    candidates: list[Candidate]
    ranking: list[Candidate]              # configurations replayed to their horizon, best first
    recommendation: Candidate | None
    runner_up: Candidate | None
    fractions: list[float] = field(default_factory=list)  # the rungs, fractions of each horizon
    reduction_factor: float = 3.0
    rung_sizes: list[int] = field(default_factory=list)   # configurations replayed at each rung
    replays: int = 0                # replays of a point to a rung (a cut or a whole trace)
    epochs_replayed: float = 0.0    # their epochs, summed
    epochs_exhaustive: float = 0.0  # replaying every distinct point to its horizon instead

    @property
    def mode(self) -> str:
        return "budget" if self.budget_s is not None else "target"

    def count(self, status: str) -> int:
        return sum(c.status == status for c in self.candidates)

    def pruned(self) -> list[Candidate]:
        return [c for c in self.candidates if c.status == "pruned"]
