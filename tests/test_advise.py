"""`ddlsim advise`: the goal checks, answers known by construction, timing pruning and
successive halving that never drop the true best on this grid (checked against a full replay
of every point), and the printed advice."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlsim.scenarios.advise import search as A
from ddlsim.scenarios.advise.explain import stale_constant
from ddlsim.scenarios.advise.render import render
from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import load_text
from ddlsim.scenarios.runner import run_sweep

# Digits, 3 epochs, μ = 16; λ ∈ {1, 4, 16} × hardsync/async × constant/per_gradient.
# Async with a constant α0 = 0.1 does not converge once ⟨σ⟩ ≈ λ − 1 is large (the
# badly-tuned configuration); hardsync's barrier makes it the slower protocol (cv 0.5).
SWEEP = """
name = "advise-test"
seed = 0
[workload]
dataset = "digits"
model = "mlp"
epochs = 3
target_error = 0.2
[optimizer]
lr = 0.1
momentum = 0.9
lr_policy = "constant"
[cluster]
learners = 4
minibatch = 16
[cluster.compute]
distribution = "lognormal"
base_s = 0.002
per_sample_s = 0.0005
cv = 0.5
[protocol]
name = "async"
[sweep]
"cluster.learners" = [1, 4, 16]
"protocol.name" = ["hardsync", "async"]
"optimizer.lr_policy" = ["constant", "per_gradient"]
"""
CPU = {"device": "cpu"}
BUDGETS = [0.1, 0.3, 0.7, 1.2, 3.0]
TARGETS = [0.3, 0.1, 0.05, 0.01]


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict]]:
    """Every point replayed (the hand-checked truth), stored where advise looks for replays."""
    import torch

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("advise")
    records = run_sweep(load_text(SWEEP), out / "replay", backend="replay", options=CPU, jobs=1,
                        progress=False)
    assert all(r["row"]["error"] is None for r in records)
    return out, {r["row"]["run_id"]: r for r in records}


def error_at(record: dict, t: float) -> float:
    curves = sorted(record["curves"], key=lambda c: c["sim_time_s"])
    return [c for c in curves if c["sim_time_s"] <= t + 1e-9][-1]["test_error"]


def time_to(record: dict, e: float) -> float | None:
    curves = sorted(record["curves"], key=lambda c: c["sim_time_s"])
    return next((c["sim_time_s"] for c in curves if c["test_error"] <= e), None)


def run_advise(out: Path, min_fraction: float = A.MIN_FRACTION, **goal: float) -> A.Advice:
    # resume: the full replay already holds every point, and a rung's replay is its prefix
    # (tests/test_advise_halving.py), so nothing is recomputed
    return A.advise(load_text(SWEEP), out, jobs=1, resume=True, options=CPU, min_fraction=min_fraction, **goal)


@pytest.mark.parametrize("min_fraction", [A.MIN_FRACTION, 1.0])  # halving, and every point replayed whole
@pytest.mark.parametrize("budget", BUDGETS)
def test_budget_pruning_never_drops_the_true_best(full, budget: float, min_fraction: float) -> None:
    out, truth = full
    adv = run_advise(out, min_fraction, budget_s=budget)
    best = min(error_at(r, budget) for r in truth.values())
    assert adv.recommendation is not None
    assert adv.recommendation.error == pytest.approx(best)
    assert adv.recommendation.error == pytest.approx(error_at(truth[adv.recommendation.run_id], budget))
    for c in adv.pruned():
        assert error_at(truth[c.run_id], budget) >= best
        assert truth[c.run_id]["curves"][0]["sim_time_s"] == 0.0  # pruned = only the untrained eval fits


@pytest.mark.parametrize("min_fraction", [A.MIN_FRACTION, 1.0])
@pytest.mark.parametrize("target", TARGETS)
def test_target_pruning_never_drops_the_true_best(full, target: float, min_fraction: float) -> None:
    out, truth = full
    adv = run_advise(out, min_fraction, target_error=target)
    times = [t for r in truth.values() if (t := time_to(r, target)) is not None]
    if not times:
        assert adv.recommendation is None
        assert "No recommendation" in render(adv)
        return
    best = min(times)
    assert adv.recommendation is not None and adv.recommendation.at_s == pytest.approx(best)
    for c in adv.pruned():
        t = time_to(truth[c.run_id], target)
        assert t is None or t >= best


def test_target_pruning_happens_and_is_reported(full) -> None:
    out, _ = full
    adv = run_advise(out, target_error=0.3)
    assert adv.pruned(), "the λ = 1 points evaluate long after async λ = 16 reaches 30 %"
    assert f"pruned {len(adv.pruned())} by simulated time alone" in render(adv)


def test_equivalent_points_replay_identically(full) -> None:
    out, truth = full
    adv = run_advise(out, budget_s=3.0)
    twins = [c for c in adv.candidates if c.status == "equivalent"]
    # hardsync (σ = 0) at λ ∈ {1, 4, 16} and async at λ = 1: per_gradient is the constant policy
    assert len(twins) == 4
    for c in twins:
        mine = [x["test_error"] for x in truth[c.run_id]["curves"]]
        theirs = [x["test_error"] for x in truth[c.twin.run_id]["curves"]]
        assert mine == theirs


def test_tiny_budget_recommends_the_truly_best_of_the_few_that_fit(full) -> None:
    # truth: the full replay — the lowest and second-lowest test error at T among the points
    # that evaluate a trained model by T (the others are pruned and never replayed)
    out, truth = full
    T = 0.1
    adv = run_advise(out, budget_s=T)
    rec, ru = adv.recommendation, adv.runner_up
    fits = {k: error_at(r, T) for k, r in truth.items()
            if any(0 < c["sim_time_s"] <= T + 1e-9 for c in r["curves"])}
    twins = {c.run_id for c in adv.candidates if c.status == "equivalent"}
    assert {c.run_id for c in adv.pruned()} == set(truth) - set(fits) - twins
    ranked = sorted(fits.values())
    assert rec.error == pytest.approx(ranked[0]) and fits[rec.run_id] == pytest.approx(ranked[0])
    rest = sorted(v for k, v in fits.items() if k != rec.run_id and k not in twins)
    assert ru.error == pytest.approx(rest[0])
    text = render(adv)
    assert f"Recommended: {rec.label}" in text and f"Runner-up:   {ru.label}" in text
    if stale_constant(ru, rec):  # the explanation names the cause the simulation shows
        assert "stale" in text and "learning rate is constant" in text


def test_target_recommends_what_reaches_it_first(full, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # truth: the full replay's times to 20 % of the two λ = 16 constant-lr points
    _, truth = full
    (tmp_path / "s.toml").write_text(SWEEP)
    out = tmp_path / "adv"
    code = main(["advise", str(tmp_path / "s.toml"), "--target-error", "0.2", "--replay", "2",
                 "--set", "cluster.learners=16", "--set", 'optimizer.lr_policy="constant"',
                 "--out", str(out), "--quiet", "--jobs", "1", "--device", "cpu"])
    text = capsys.readouterr().out
    assert code == 0, text
    mine = {k: time_to(r, 0.2) for k, r in truth.items()
            if r["row"]["learners"] == 16 and "constant" in str(r["row"].get("optimizer.lr_policy"))}
    assert len(mine) == 2
    reached = {k: t for k, t in mine.items() if t is not None}
    best = min(reached, key=reached.get)
    proto = truth[best]["row"]["protocol"]
    assert f"Recommended: {proto} λ=16 μ=16" in text
    other = next(k for k in mine if k != best)
    if mine[other] is None:
        assert f"Runner-up:   {truth[other]['row']['protocol']} λ=16 μ=16: never reaches it" in text
        assert "no other replayed configuration reaches 20.0 %" in text
    assert (out / "advice.txt").read_text().strip() == text.strip()
    assert (out / "replay" / "summary.csv").is_file() and (out / "summary.csv").is_file()


@pytest.mark.parametrize("args, needle", [
    ([], "needs a goal"),
    (["--budget-s", "1", "--target-error", "0.1"], "not both"),
    (["--budget-s", "-1"], "--budget-s = -1"),
    (["--budget-s", "0"], "--budget-s = 0"),
    (["--budget-s", "nan"], "--budget-s = nan"),
    (["--target-error", "0"], "--target-error = 0"),
    (["--target-error", "1.5"], "--target-error = 1.5"),
    (["--target-error", "0.1", "--replay", "0"], "--replay = 0"),
])
def test_bad_goal_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                         args: list[str], needle: str) -> None:
    out = tmp_path / "never"
    assert main(["advise", "demo", "--out", str(out), "--quiet"] + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddlsim: error: ") and needle in err
    assert not out.exists()  # refused before any work
