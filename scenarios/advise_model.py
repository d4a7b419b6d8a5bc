"""The facts ``ddlsim advise`` reasons with: one sweep point as a candidate, and the advice.

Pure data and what follows from a point's simulation and replay (no search, no words).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RISK_SIGMA = 2.0   # constant lr with ⟨σ⟩ above this is "at risk" (Rudra: 1-softsync σ ≤ 2 is fine)
SAME = 1.10        # ratios within 10 % read as "about the same"
EPS = 1e-9         # slack on "at or before T" (float sums of simulated time)


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
        return float(v) if is_number(v) else 0.0

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
        smax = float(smax) if is_number(smax) else 0.0
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

    @property
    def step_weight(self) -> float:
        """What one update is worth against a fresh full-rate one: 1/⟨σ⟩ under a staleness-aware
        rate that really scales (each step divided by its staleness), else 1."""
        return 1.0 / max(1.0, self.sigma) if self.effective_policy() != "constant" else 1.0

    def steps_by(self, t: float) -> float:
        """The prediction for a budget: full-rate updates made by the last evaluation at or before
        ``t``. Updates, not epochs: at a fixed number of samples the error grows with the total
        minibatch μλ (Rudra's rule), i.e. with fewer updates."""
        return self.epochs_by(t) * self.updates_per_epoch * self.step_weight

    @property
    def sec_per_step(self) -> float:
        """The prediction for a target: simulated seconds per full-rate update."""
        per = self.updates_per_epoch * self.step_weight
        return self.sec_per_epoch / per if per > 0 else math.inf


def is_number(v: Any) -> bool:
    """A finite int or float (not a bool) that a float can hold."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond a float's range
        return False


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
