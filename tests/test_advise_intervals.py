"""advise says when its recommendation and the runner-up are within each other's 95 %
interval over their replicates (truth: Student's t by hand: t_{0.975, 2} = 4.303)."""

from __future__ import annotations

from pathlib import Path

from ddlsim.scenarios.advise.explain import margin
from ddlsim.scenarios.advise.model import Advice, Candidate, Replicate

POINT = {"workload": {"dataset": "teacher", "teacher_samples": 100_000, "teacher_features": 32}}


def candidate(index: int, errors: list[float]) -> Candidate:
    """A configuration whose replicates end at ``errors`` at its one evaluation (t = 1 s)."""
    reps = [Replicate(POINT, {}, evals=[(1.0, 1.0)], curves=[{"sim_time_s": 1.0, "epoch": 1.0, "test_error": e}],
                      cut=0, horizon=0) for e in errors]
    c = Candidate(index, POINT, {}, f"c{index}", evals=[(1.0, 1.0)], reps=reps, status="replayed")
    c.error, c.at_s, c.at_epoch = sum(errors) / len(errors), 1.0, 1.0
    return c


def advice(a: Candidate, b: Candidate) -> Advice:
    return Advice("t", 1.0, None, None, Path("."), [a, b], [a, b], a, b)


def test_overlapping_intervals_are_said() -> None:
    # a: mean 0.10, s = 0.02 → half-width 4.303·0.02/√3 = 0.0497; b: mean 0.12, s = 0.03 → 0.0745:
    # each mean within the other's interval (0.12 < 0.1497, 0.10 > 0.0455)
    a, b = candidate(0, [0.08, 0.10, 0.12]), candidate(1, [0.09, 0.12, 0.15])
    text = margin(a, b, advice(a, b))
    assert "within the other's 95 % interval" in text and "3 and 3 seeds" in text


def test_separated_intervals_are_not_said() -> None:
    # a: mean 0.10, half-width 4.303·0.001/√3 = 0.0025; b: mean 0.20: far outside
    a, b = candidate(0, [0.099, 0.100, 0.101]), candidate(1, [0.199, 0.200, 0.201])
    assert "interval" not in margin(a, b, advice(a, b))


def test_one_replicate_has_no_interval() -> None:
    a, b = candidate(0, [0.10]), candidate(1, [0.11])
    assert "interval" not in margin(a, b, advice(a, b))
