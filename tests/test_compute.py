"""Compute-time model: distributions, profiles, stalls."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddlsim.simulator.compute import DrawStream, LearnerClock, profile_mean, sampler


@pytest.mark.parametrize("dist,cv", [("exponential", 1.0), ("lognormal", 0.3), ("deterministic", 0.0)])
def test_draws_have_the_requested_mean_and_cv(dist: str, cv: float) -> None:
    # Truth: the definitions — exponential has cv 1; lognormal(μ_log, σ) with σ² = ln(1+cv²)
    # and μ_log = ln m − σ²/2 has mean m and coefficient of variation cv.
    x = sampler(dist, 0.02, cv, np.random.default_rng(0))(200_000)
    assert x.mean() == pytest.approx(0.02, rel=0.01)
    assert x.std() / x.mean() == pytest.approx(cv, abs=0.01)


def test_profile_interpolates_linearly_and_extrapolates() -> None:
    mb, sec = [4, 16, 64], [0.010, 0.020, 0.080]
    assert profile_mean(mb, sec, 16) == pytest.approx(0.020)
    assert profile_mean(mb, sec, 10) == pytest.approx(0.015)      # between 4 and 16
    assert profile_mean(mb, sec, 128) == pytest.approx(0.160)     # beyond 64, slope of 16..64
    assert profile_mean([8], [0.04], 16) == pytest.approx(0.08)   # one point: proportional


class ScriptedStalls(LearnerClock):
    """A clock whose stall intervals are given by hand instead of drawn."""

    def __init__(self, intervals: list[tuple[float, float]]) -> None:
        super().__init__(DrawStream(lambda n: np.ones(n)), 0.0, 0.0, np.random.default_rng(0))
        self.script = iter(intervals + [(math.inf, math.inf)])
        self._advance()

    def _advance(self) -> None:
        self._s, self._e = next(self.script)


def test_stalls_pause_work_by_hand() -> None:
    # Hand case: stalls [2, 3) and [3.5, 5); 4 s of work from t=0 → runs 0–2, 3–3.5, 5–6.5.
    assert ScriptedStalls([(2.0, 3.0), (3.5, 5.0)]).finish(0.0, 4.0) == pytest.approx(6.5)
    # a compute that starts inside a stall waits for its end: 1 s from t=2.5 → 3–4
    assert ScriptedStalls([(2.0, 3.0)]).finish(2.5, 1.0) == pytest.approx(4.0)
    # no stall in the way
    assert ScriptedStalls([(10.0, 11.0)]).finish(0.0, 4.0) == pytest.approx(4.0)
