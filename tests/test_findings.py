"""The "did not learn" rule, the findings the report leads with, tie-breaks, and the figures
that keep configurations apart (hand-built rows; truths computed by hand or by scipy)."""

from __future__ import annotations

import math
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest
import torch
from scipy.stats import spearmanr

from ddlsim.analysis import plots
from ddlsim.analysis.findings import answers, findings, learned, minibatch_finding, spearman, staleness_finding
from ddlsim.analysis.table import Table
from ddlsim.backends.replay import chance_error, did_not_learn, summarize


# -- did not learn --------------------------------------------------------------------------
def test_chance_error_is_one_minus_the_majority_share():
    # 10 labels: six 3s, four 1s → the best constant guess ("3") errs on 4 of 10
    assert chance_error(torch.tensor([3, 3, 1, 3, 1, 3, 3, 1, 3, 1])) == pytest.approx(0.4)


@pytest.mark.parametrize("errors, expected", [
    ([0.886, 0.30, 0.05, 0.02], False),      # learned
    ([0.886, 0.90, 0.88, 0.869], True),      # stuck near chance (0.9 − 2·0.0158 = 0.868)
    ([0.886, 0.80, 0.85, 0.87], True),       # no better than chance within two standard errors
    ([0.886, 0.85, 0.86, 0.86], False),      # 0.86 < 0.868: better than chance, and than t = 0
    ([0.60, 0.40, 0.62], True),              # no better than the first evaluation (0.60 ≥ 0.45)
    ([0.30, 0.10, 0.31], False),             # first evaluation already below half of chance
    ([0.886, 0.2, math.nan], True),          # a non-finite error is not a model
    ([], False),
])
def test_did_not_learn_by_hand(errors, expected):
    # chance 0.9 on 360 test images: margin 2·sqrt(0.9·0.1/360) = 0.0316
    assert did_not_learn(errors, 0.9, 360) is expected


def test_summary_carries_the_flag_and_diverged_runs_did_not_learn():
    rows = [{"test_error": e, "sim_time_s": t} for e, t in ((0.886, 0.0), (0.2, 1.0), (0.05, 2.0))]
    assert summarize(rows, 0.1, False, None, 0.9, 360)["did_not_learn"] is False
    assert summarize(rows, 0.1, True, 7, 0.9, 360)["did_not_learn"] is True
    assert "did_not_learn" not in summarize(rows, 0.1, False, None)  # no data set facts: no claim


# -- findings ---------------------------------------------------------------------------------
def row(proto, lam, mu, pol, err, t, sigma, **kw):
    return {"run_id": f"{proto}-{lam}-{mu}-{pol}", "protocol": proto, "learners": lam, "minibatch": mu,
            "softsync_n": None, "optimizer.lr_policy": pol, "final_test_error": err, "sim_time_s": t,
            "staleness_mean": sigma, "diverged": False, "did_not_learn": err > 0.8, "updates": 100, **kw}


def sweep():
    rows = []
    for lam, mu, e in ((1, 8, 0.02), (4, 8, 0.02), (4, 32, 0.03), (16, 32, 0.05), (30, 32, 0.08), (30, 128, 0.40)):
        for pol in ("constant", "per_gradient"):
            rows.append(row("hardsync", lam, mu, pol, e, 10.0 / lam, 0.0))
    for lam in (4, 30):
        rows.append(row("async", lam, 8, "constant", 0.89, 6.0 / lam, lam - 1.0))
        rows.append(row("async", lam, 8, "per_gradient", 0.025, 6.0 / lam, lam - 1.0))
    rows += [row("hardsync", 30, 8, pol, 0.022, 10.0 / 30, 0.0) for pol in ("constant", "per_gradient")]
    return rows


def test_staleness_finding_names_the_largest_failing_case_and_compares_time_to_the_same_error():
    rows = sweep()
    for r in rows:  # times to the 10 % target: per_gradient's run is the shorter, hardsync reaches 10 % first
        if r["learners"] == 30 and r["minibatch"] == 8:
            r["time_to_target_s"] = {"async": 0.15, "hardsync": 0.12}[r["protocol"]] if learned(r) else None
    text = staleness_finding(rows, target=0.1)
    # async λ=30 μ=8: constant 89.0 %, per_gradient 2.5 %; hardsync there 2.2 %
    assert text.startswith("async with a constant learning rate does not learn at λ = 30, μ = 8 (89.0 % test error")
    assert "brings it to 2.5 % (hardsync: 2.2 %)" in text
    # time to the same error (the target), never run length (0.2 s against hardsync's 0.333 s)
    assert "to 10.0 % (the target), per_gradient takes 0.15 s and hardsync 0.12 s: hardsync is faster" in text
    assert "less time" not in text and "0.333" not in text


def test_staleness_finding_needs_both_policies_and_a_failure():
    rows = [r for r in sweep() if r["optimizer.lr_policy"] == "per_gradient"]
    assert staleness_finding(rows) is None
    healthy = [dict(r, final_test_error=0.03, did_not_learn=False) for r in sweep()]
    assert staleness_finding(healthy) is None


def test_minibatch_finding_only_where_it_means_something():
    # hardsync(λ, μ) is SGD with minibatch λμ: its error tracks μλ by construction, nothing to say
    assert minibatch_finding(sweep()) is None
    # the same numbers under 1-softsync: μλ = 32 (λ 1, 4 × μ 32, 8), 128 (λ 4, 16 × μ 32, 8) and 512
    # (λ 16 × μ 32, λ 4 × μ 128) diagonals, errors alike on each: stated, with η² per seed
    soft = [dict(r, protocol="softsync", softsync_n=1, run_id="s" + r["run_id"]) for r in grid(lambda t: t / 10_000)]
    text = minibatch_finding(soft)
    assert text.startswith("Error tracks the total minibatch μλ") and "η² = " in text
    flat = [dict(r, final_test_error=0.05 - r["learners"] * r["minibatch"] / 100_000) for r in soft]
    assert minibatch_finding(flat) is None  # error falls with μλ: nothing to say


def grid(err):
    """Hardsync rows λ ∈ {1, 4, 16} × μ ∈ {8, 32, 128} whose final error is ``err(μλ) + 2 %``."""
    return [row("hardsync", lam, mu, "constant", err(lam * mu) + 0.02, 1.0, 0.0)
            for lam in (1, 4, 16) for mu in (8, 32, 128)]


def test_spearman_against_the_textbook_formula():
    # truth: 1 − 6 Σd² / (n(n² − 1)) without ties (d = 1, 1: 1 − 12/60 = 0.8; n = 5: 1 − 12/120 = 0.9)
    assert spearman([1, 2, 3, 4, 5], [1, 3, 2, 4, 5]) == pytest.approx(0.9)
    assert spearman([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(0.8)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_spearman_matches_scipy_with_ties():
    x = [8, 32, 128, 512, 960, 240, 3840, 32, 8]
    y = [0.02, 0.02, 0.03, 0.05, 0.08, 0.022, 0.4, 0.02, 0.03]
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic, abs=1e-12)


def test_ties_go_to_the_shorter_run_and_stuck_runs_never_win():
    rows = [row("hardsync", 30, 8, "constant", 0.025, 1.6, 0.0),
            row("async", 30, 8, "per_gradient", 0.025, 1.02, 29.0),
            row("async", 30, 8, "constant", 0.9, 0.5, 29.0)]
    got = {q: r["run_id"] for q, r, _ in answers(rows)}
    assert got["Lowest final test error"] == "async-30-8-per_gradient"
    assert got["Shortest simulated run"] == "async-30-8-per_gradient"  # the 0.5 s run did not learn
    assert any("1 of 3 runs did not learn" in f for f in findings(rows))


# -- figures keep configurations apart ------------------------------------------------------
def test_pareto_gives_each_configuration_its_own_colour_and_marker():
    fig = plots.pareto(Table(sweep()))
    ax = fig.axes[0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    # hardsync's two policies coincide: one entry saying so; async's differ: two entries
    assert "hardsync constant ≡ hardsync per_gradient (identical)" in legend
    assert "async constant" in legend and "async per_gradient" in legend
    assert "Pareto frontier" in legend and "(hollow: did not learn)" in legend
    styles = {(tuple(c.get_edgecolor()[0]), c.get_paths()[0].vertices.shape)
              for c in ax.collections if c.get_offsets().size}
    assert len(styles) == 3  # async constant, async per_gradient, hardsync


def test_error_panels_merge_identical_configurations():
    rows = sweep()
    curves = Table([{"run_id": r["run_id"], "sim_time_s": t, "test_error": r["final_test_error"] + 0.1 / t}
                    for r in rows for t in (0.5, 1.0, 2.0)])
    fig = plots.error_vs_time(curves, Table(rows), max_lines=4)
    titles = [ax.get_title() for ax in fig.axes if ax.get_title()]
    assert titles == ["async constant", "async per_gradient", "hardsync constant ≡ hardsync per_gradient (identical)"]


def test_the_fastest_to_target_by_mean_says_when_another_is_first_in_some_seed():
    # hand truth: A reaches the target at 0.34, 0.28, 0.41 s (mean 0.343), B at 0.49, 0.41, 0.34 s
    # (mean 0.413): A is fastest by mean, and B is first in the third seed; C never beats A
    def runs(proto, times):
        return [row(proto, 30, 8, "constant", 0.02, 1.0, 0.0, seed=k, time_to_target_s=t, run_id=f"{proto}-{k}")
                for k, t in enumerate(times)]
    rows = runs("hardsync", [0.34, 0.28, 0.41]) + runs("async", [0.49, 0.41, 0.34]) + runs("ssp", [0.5, 0.5, 0.5])
    fastest = next(v for q, _, v in answers(rows) if q.startswith("Fastest"))
    assert fastest.endswith("; not first in every seed: async λ=30 μ=8 reaches it first in 1 of 3")
    alone = runs("hardsync", [0.34, 0.28, 0.41]) + runs("ssp", [0.5, 0.5, 0.5])
    assert "not first" not in next(v for q, _, v in answers(alone) if q.startswith("Fastest"))


def test_runs_that_did_not_learn_and_that_diverged_are_counted_apart():
    # hand truth: 3 runs at chance, 2 diverged (also at chance), 1 learned: "5 of 6: 3 and 2"
    rows = [row("async", lam, 8, "constant", 0.9, 1.0, 29.0) for lam in (4, 16, 30)]
    rows += [row("async", lam, 32, "constant", 0.9, 1.0, 29.0, diverged=True) for lam in (16, 30)]
    rows += [row("hardsync", 4, 8, "constant", 0.02, 1.0, 0.0)]
    (text,) = [f for f in findings(rows) if "did not learn" in f]
    assert text == ("5 of 6 runs did not learn: 3 ended no better than chance or than their first evaluation and "
                    "2 diverged; their times are not results.")


def test_runs_that_learned_and_then_lost_it_are_named_among_those_that_did_not_learn():
    # hand truth: final errors 0.9 at chance; bests 0.05 and 0.2 (each at most half of 0.9: learned
    # first, then lost it), 0.6 (never learned): "3 ended …, 2 of them after reaching 5.0–20.0 % error earlier"
    rows = [row("async", lam, 8, "constant", 0.9, 1.0, 29.0, best_test_error=b)
            for lam, b in ((4, 0.05), (16, 0.2), (30, 0.6))]
    rows += [row("hardsync", 4, 8, "constant", 0.02, 1.0, 0.0, best_test_error=0.02)]
    (text,) = [f for f in findings(rows) if "did not learn" in f]
    assert text == ("3 of 4 runs did not learn: 3 ended no better than chance or than their first evaluation, "
                    "2 of them after reaching 5.0–20.0 % error earlier; their times are not results.")
