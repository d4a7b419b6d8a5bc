"""Replicates: every configuration run with seeds seed, seed + 1, …; configurations.csv's mean
and 95 % Student-t interval; the robust final error; findings printed only when they hold in
every seed, with their range; figures that draw the mean with its spread. Truths: hand
computation, scipy's t quantiles, the runs' own summary rows and curves."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest

from ddlsim.analysis import plots
from ddlsim.analysis.findings import (eta_squared, findings, minibatch_finding, policy_finding, span,
                                      staleness_finding)
from ddlsim.analysis.metrics import T975, configurations, spread, t975, within_intervals
from ddlsim.analysis.table import Table, labels
from ddlsim.backends.replay import final_error, summarize
from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import ScenarioError, configuration_id, load_text

TINY = """
name = "tiny"
seed = 3
replicates = 2
[workload]
dataset = "digits"
model = "mlp"
epochs = 2
evals_per_epoch = 2
target_error = 0.5
[optimizer]
lr = 0.1
[cluster]
learners = 2
minibatch = 32
[protocol]
name = "async"
[sweep]
"optimizer.lr_policy" = ["constant", "per_gradient"]
"""


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("replicates")
    (root / "tiny.toml").write_text(TINY, encoding="utf-8")
    out = root / "out"
    assert main(["run", str(root / "tiny.toml"), "--out", str(out), "--quiet", "--no-report", "--device", "cpu",
                 "--traces"]) == 0
    return out


# -- the t quantiles and the interval ------------------------------------------------------------------
def test_t_table_is_scipys_quantile():
    from scipy.stats import t

    assert len(T975) == 99
    for df in range(1, 100):
        assert T975[df - 1] == pytest.approx(float(t.ppf(0.975, df)), rel=1e-14, abs=0)
    for df in (100, 150, 1000):  # beyond the table: the expansion, within 1e-5
        assert abs(t975(df) - float(t.ppf(0.975, df))) < 1e-5


def test_spread_by_hand():
    # 2 %, 3 %, 4 %: mean 3 %, s = 1 %, half-width t(0.975, 2) · 1 % / √3 = 4.3027 · 0.57735 % = 2.4841 %
    st = spread([0.02, 0.03, 0.04, None, float("nan")])
    assert st["n"] == 3 and st["mean"] == pytest.approx(0.03) and (st["min"], st["max"]) == (0.02, 0.04)
    half = 4.302652729749462 * 0.01 / math.sqrt(3)
    assert (st["ci_low"], st["ci_high"]) == pytest.approx((0.03 - half, 0.03 + half))
    one = spread([0.5])
    assert one["mean"] == 0.5 and one["ci_low"] is None and spread([])["mean"] is None


def test_configurations_by_hand():
    runs = [{"run_id": f"r{s}", "protocol": "async", "learners": 4, "minibatch": 8, "softsync_n": None, "seed": s,
             "final_test_error": e, "best_test_error": e - 0.01, "time_to_target_s": t, "sim_time_s": 2.0 + s,
             "diverged": False, "did_not_learn": False, "staleness_mean": 3.0}
            for s, e, t in ((0, 0.10, 1.0), (1, 0.20, None), (2, 0.30, 2.0))]
    (c,) = configurations(runs)
    assert c["replicates"] == 3 and c["seeds"] == "0,1,2" and c["failed"] == 0
    assert c["final_test_error_mean"] == pytest.approx(0.2)
    assert (c["final_test_error_min"], c["final_test_error_max"]) == (0.1, 0.3)
    # s = 0.1, half = 4.3027 · 0.1 / √3 = 0.2484: the interval [−0.048, 0.448] is clipped at an error of 0
    assert c["final_test_error_ci_low"] == 0.0
    assert c["final_test_error_ci_high"] == pytest.approx(0.2 + 4.302652729749462 * 0.1 / math.sqrt(3))
    # two of three reached the target: their mean 1.5 s, interval 1.5 ± 12.706 · 0.7071 / √2 (clipped at 0)
    assert c["time_to_target_reached"] == 2 and c["time_to_target_s_mean"] == pytest.approx(1.5)
    assert c["time_to_target_s_ci_high"] == pytest.approx(1.5 + 12.706204736174694 * 0.5)
    assert c["sim_time_s_mean"] == pytest.approx(3.0) and c["did_not_learn"] == 0
    other = dict(c, final_test_error_mean=0.25)  # its mean within c's interval and c's within its own
    assert within_intervals(c, other) and not within_intervals(c, dict(other, final_test_error_mean=0.5))


# -- the robust final error ----------------------------------------------------------------------------
def test_final_error_is_the_mean_of_the_last_evaluations():
    rows = [{"epoch": e, "updates": u, "test_error": x, "sim_time_s": float(e)}
            for e, u, x in ((0, 0, 0.9), (1, 10, 0.5), (2, 20, 0.3), (3, 30, 0.2), (4, 40, 0.1))]
    assert final_error(rows, 3) == pytest.approx((0.3 + 0.2 + 0.1) / 3)
    assert final_error(rows, 1) == 0.1
    assert final_error(rows, 10) == pytest.approx((0.5 + 0.3 + 0.2 + 0.1) / 4)  # never the untrained model
    assert final_error(rows[:1], 3) == 0.9 and math.isnan(final_error([], 3))
    s = summarize(rows, 0.25, False, None, 0.9, 360, final_evals=3)
    assert s["final_test_error"] == pytest.approx(0.2) and s["best_test_error"] == 0.1
    assert s["time_to_target_s"] == 3.0 and s["did_not_learn"] is False


def test_replayed_final_error_is_the_mean_of_its_last_three_evaluations(tiny: Path):
    curves: dict[str, list[dict[str, str]]] = {}
    for r in read_csv(tiny / "curves.csv"):
        curves.setdefault(r["run_id"], []).append(r)
    for row in read_csv(tiny / "summary.csv"):
        errs = [float(c["test_error"]) for c in curves[row["run_id"]]]
        assert len(errs) == 5  # t = 0 and two per epoch
        assert float(row["final_test_error"]) == pytest.approx(sum(errs[-3:]) / 3, abs=1e-15)
        assert float(row["best_test_error"]) == min(errs)


# -- points: seeds, identities -------------------------------------------------------------------------
def test_replicates_expand_to_adjacent_seeds_with_their_own_identity():
    points = load_text(TINY, "tiny.toml").points()
    assert [(p["optimizer"]["lr_policy"], p["seed"]) for p in points] == [
        ("constant", 3), ("constant", 4), ("per_gradient", 3), ("per_gradient", 4)]
    assert len({p["_id"] for p in points}) == 4 and all(p["replicates"] == 2 for p in points)
    assert configuration_id(points[0]) == configuration_id(points[1]) != configuration_id(points[2])
    # replicate 0 is the run a single-replicate sweep makes: raising replicates keeps it for --resume
    single = load_text(TINY.replace("replicates = 2", "replicates = 1"), "tiny.toml").points()
    assert [p["_id"] for p in single] == [points[0]["_id"], points[2]["_id"]]


def test_seeds_change_compute_data_order_and_initial_weights(tiny: Path):
    import torch

    from ddlsim.backends.workloads import build_model
    from ddlsim.simulator import trace as tracemod

    rows = {(r["optimizer.lr_policy"], int(r["seed"])): r for r in read_csv(tiny / "summary.csv")}
    assert set(rows) == {(p, s) for p in ("constant", "per_gradient") for s in (3, 4)}
    a, b = rows[("constant", 3)], rows[("constant", 4)]
    assert a["sim_time_s"] != b["sim_time_s"]  # lognormal compute draws from the seed
    for (_pol, seed), r in rows.items():
        header = tracemod.read(tiny / "runs" / r["run_id"] / "trace.ddlt").header
        assert header["seed"] == seed and header["data_seed"] == seed  # the data order's seed
    point = load_text(TINY, "t.toml").points()[0]
    w = [torch.cat([p.detach().flatten() for p in build_model(dict(point, seed=s)).parameters()]) for s in (3, 4, 3)]
    assert not torch.equal(w[0], w[1]) and torch.equal(w[0], w[2])


def test_summary_has_a_seed_column_and_configurations_csv_the_spread(tiny: Path):
    summary = read_csv(tiny / "summary.csv")
    assert list(summary[0])[:6] == ["run_id", "protocol", "learners", "minibatch", "softsync_n", "seed"]
    configs = read_csv(tiny / "configurations.csv")
    assert len(configs) == 2
    for c in configs:
        runs = [r for r in summary if r["config_id"] == c["config_id"]]
        finals = [float(r["final_test_error"]) for r in runs]
        assert len(runs) == 2 and c["replicates"] == "2" and c["seeds"] == "3,4"
        m = sum(finals) / 2
        half = 12.706204736174694 * abs(finals[0] - finals[1]) / math.sqrt(2) / math.sqrt(2)
        assert float(c["final_test_error_mean"]) == pytest.approx(m)
        assert float(c["final_test_error_min"]) == min(finals) and float(c["final_test_error_max"]) == max(finals)
        assert float(c["final_test_error_ci_high"]) == pytest.approx(min(1.0, m + half))
        assert float(c["final_test_error_ci_low"]) == pytest.approx(max(0.0, m - half))
        reached = [r for r in runs if r["time_to_target_s"]]
        assert int(c["time_to_target_reached"]) == len(reached)
    manifest = json.loads((tiny / ".ddlsim" / "manifest.json").read_text())
    assert "configurations.csv" in json.dumps(manifest)  # one of ddlsim's own files of the folder


def test_the_terminal_shows_one_line_per_configuration(tmp_path: Path, capsys: pytest.CaptureFixture):
    (tmp_path / "t.toml").write_text(TINY, encoding="utf-8")
    assert main(["simulate", str(tmp_path / "t.toml"), "--out", str(tmp_path / "o"), "--quiet"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(i for i, line in enumerate(out) if line.startswith("configuration"))
    assert "seeds" in out[head] and [line.split()[5] for line in out[head + 1:head + 3]] == ["3,4", "3,4"]
    assert "configurations.csv (mean and 95 % interval over the seeds)" in out[head + 3]


# -- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting, words", [
    ("replicates=0", ["key 'replicates' = 0", "≥ 1, ≤ 100"]),
    ("replicates=101", ["key 'replicates' = 101", "≥ 1, ≤ 100"]),
    ("replicates=[1,2]", ["key 'replicates' = [1, 2]", "cannot be swept"]),
    ("workload.final_evals=0", ["key 'workload.final_evals' = 0", "≥ 1"]),
    ("seed=9223372036854775807", ["key 'replicates' = 2", "beyond the largest seed"]),
    ("seed=[0,1]", ["key 'replicates' = 2 with seed swept over [0, 1]", "seed 1 would run twice"]),
])
def test_bad_replicates_are_one_line_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     setting: str, words: list[str]):
    (tmp_path / "t.toml").write_text(TINY, encoding="utf-8")
    out = tmp_path / "o"
    assert main(["run", str(tmp_path / "t.toml"), "--out", str(out), "--quiet", "--set", setting]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddlsim: error: ") and "Traceback" not in err
    assert all(w in err for w in words), err
    assert not out.exists()


def test_seeds_spaced_apart_may_be_swept_with_replicates():
    points = load_text(TINY + '"seed" = [0, 10]\n', "t.toml").points()
    assert sorted({p["seed"] for p in points}) == [0, 1, 10, 11]
    with pytest.raises(ScenarioError, match="seed 1 would run twice"):
        load_text(TINY + '"seed" = [0, 1]\n', "t.toml")


# -- resume across the change, and results of earlier runs ---------------------------------------------
def test_resume_keeps_seed_zero_when_replicates_grow(tmp_path: Path, capsys: pytest.CaptureFixture):
    f = tmp_path / "t.toml"
    f.write_text(TINY.replace("replicates = 2", "replicates = 1"), encoding="utf-8")
    out = tmp_path / "o"
    assert main(["simulate", str(f), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["simulate", str(f), "--out", str(out), "--resume", "--set", "replicates=2"]) == 0
    assert "resume: kept 2, running 2" in capsys.readouterr().err


def test_resume_recomputes_results_of_another_final_error_rule(tmp_path: Path, capsys: pytest.CaptureFixture):
    # results made where final_test_error was the last evaluation (final_evals = 1) are not this
    # point's: --resume refuses to delete them unless --force, and then recomputes every run
    f = tmp_path / "t.toml"
    f.write_text(TINY.replace("replicates = 2", "replicates = 1").replace('name = "async"', 'name = "hardsync"')
                 .replace('["constant", "per_gradient"]', '["constant"]'), encoding="utf-8")
    out = tmp_path / "o"
    assert main(["run", str(f), "--out", str(out), "--quiet", "--no-report", "--set", "workload.final_evals=1"]) == 0
    (before,) = read_csv(out / "summary.csv")
    capsys.readouterr()
    assert main(["run", str(f), "--out", str(out), "--quiet", "--no-report", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "delete 1 runs this sweep does not have" in err
    assert "(1 of them under the names of this sweep's configurations but another hash" in err  # it is the same one
    assert read_csv(out / "summary.csv") == [before]  # nothing lost
    assert main(["run", str(f), "--out", str(out), "--quiet", "--no-report", "--resume", "--force"]) == 0
    (after,) = read_csv(out / "summary.csv")
    errs = [float(r["test_error"]) for r in read_csv(out / "curves.csv")]
    assert float(before["final_test_error"]) == errs[-1]
    assert float(after["final_test_error"]) == pytest.approx(sum(errs[-3:]) / 3)


def test_a_summary_without_seed_still_plots_and_reports(tmp_path: Path, capsys: pytest.CaptureFixture):
    rows = [{"run_id": f"async-l{lam}-{pol}", "protocol": "async", "learners": lam, "minibatch": 8,
             "optimizer.lr_policy": pol, "sim_time_s": 10.0 / lam, "staleness_mean": lam - 1.0,
             "final_test_error": 0.9 if (lam > 1 and pol == "constant") else 0.05, "time_to_target_s": None,
             "diverged": False, "did_not_learn": lam > 1 and pol == "constant"}
            for lam in (1, 4) for pol in ("constant", "per_gradient")]
    Table(rows).write_csv(tmp_path / "summary.csv")
    Table([{"run_id": r["run_id"], "epoch": e, "sim_time_s": e * r["sim_time_s"], "test_error": 0.9 - 0.1 * e}
           for r in rows for e in (0, 1, 2)]).write_csv(tmp_path / "curves.csv")
    assert main(["plot", str(tmp_path)]) == 0 and main(["report", str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert (tmp_path / "figures" / "pareto.png").is_file() and (tmp_path / "figures" / "error_vs_time.png").is_file()
    assert "does not learn at λ = 4, μ = 8" in (tmp_path / "report.html").read_text(encoding="utf-8")


# -- findings across seeds -----------------------------------------------------------------------------
def run(proto: str, lam: int, mu: int, pol: str, seed: int, err: float, **kw) -> dict:
    return {"run_id": f"{proto}-{lam}-{mu}-{pol}-{seed}", "protocol": proto, "learners": lam, "minibatch": mu,
            "softsync_n": 1 if proto == "softsync" else None, "seed": seed, "optimizer.lr_policy": pol,
            "final_test_error": err, "sim_time_s": 1.0, "staleness_mean": 0.0 if proto == "hardsync" else lam - 1.0,
            "diverged": False, "did_not_learn": err > 0.8, "updates": 100, **kw}


def stale_sweep(fix: dict[tuple[int, int], list[float]]) -> list[dict]:
    """async λ = 30, μ ∈ {8, 32}: a constant rate at chance in every seed, per_gradient's errors
    ``fix[(μ, seed)]``; hardsync at 2.2–3.1 %."""
    rows = []
    for mu in (8, 32):
        for s in range(3):
            rows.append(run("async", 30, mu, "constant", s, 0.89 + 0.01 * s))
            rows.append(run("async", 30, mu, "per_gradient", s, fix[mu][s]))
            rows.append(run("hardsync", 30, mu, "constant", s, (0.022, 0.031, 0.025)[s]))
    return rows


def test_a_finding_that_holds_in_every_seed_gives_its_range_and_every_mu():
    text = staleness_finding(stale_sweep({8: [0.03, 0.04, 0.05], 32: [0.3, 0.5, 0.4]}), test_size=360)
    assert text.startswith("async with a constant learning rate does not learn at λ = 30, μ = 8 and 32 in any of "
                           "3 seeds (89.0–91.0 % test error, ⟨σ⟩ = 29)")
    assert "brings it to 3.0–5.0 % (hardsync: 2.2–3.1 %) at μ = 8 and 30.0–50.0 % (hardsync: 2.2–3.1 %) at μ = 32" \
        in text


def test_a_fix_that_fails_in_one_seed_is_not_claimed():
    # per_gradient learns at μ = 8 in seeds 0 and 1 only (seed 2 at chance): no λ = 30 finding
    assert staleness_finding(stale_sweep({8: [0.022, 0.031, 0.89], 32: [0.89, 0.9, 0.88]})) is None
    # seed 0 alone would have said it
    one = [r for r in stale_sweep({8: [0.022, 0.031, 0.89], 32: [0.89, 0.9, 0.88]}) if r["seed"] == 0]
    assert staleness_finding(one).startswith("async with a constant learning rate does not learn at λ = 30, μ = 8")


def test_a_staleness_aware_rate_that_learns_in_no_seed_at_a_mu_is_said_not_to_help_there():
    # per_gradient learns at μ = 8 in every seed, at μ = 32 in none: "brings it to … at μ = 8;
    # it does not help at μ = 32", not a range of chance-level errors presented as the fix's
    text = staleness_finding(stale_sweep({8: [0.03, 0.04, 0.05], 32: [0.89, 0.9, 0.88]}), test_size=360)
    assert "brings it to 3.0–5.0 % (hardsync: 2.2–3.1 %) at μ = 8; it does not help at μ = 32 (88.0–90.0 %, no seed " \
           "learns)." in text


def test_a_difference_of_two_test_samples_is_called_noise():
    # per_gradient 2.5 % against hardsync 2.6 % on average: 0.4 samples of 360 apart
    rows = stale_sweep({8: [0.022, 0.031, 0.022], 32: [0.3, 0.5, 0.4]})
    text = staleness_finding(rows, test_size=360)
    assert "2.2–3.1 % (hardsync: 2.2–3.1 %, 2 test samples or fewer apart: noise) at μ = 8" in text


def test_speed_is_time_to_the_same_error_seed_by_seed():
    # neither reaches the 1 % target; the higher mean final error is per_gradient's 3.0 % (hardsync
    # 2.5 %): per seed, per_gradient first reaches 3.0 % at 0.4, 0.6, 0.5 s, hardsync at 0.5, 0.5,
    # 0.6 s: per_gradient is faster in seeds 0 and 2, hardsync in seed 1, neither in every seed
    rows = [r for r in stale_sweep({8: [0.03, 0.03, 0.03], 32: [0.3, 0.5, 0.4]}) if r["minibatch"] == 8]
    for r in rows:
        r["time_to_target_s"] = None
        if r["protocol"] == "hardsync":
            r["final_test_error"] = 0.025
    curves = []
    hit = {("per_gradient", 0): 0.4, ("per_gradient", 1): 0.6, ("per_gradient", 2): 0.5,
           ("hardsync", 0): 0.5, ("hardsync", 1): 0.5, ("hardsync", 2): 0.6}
    for r in rows:
        key = (r["optimizer.lr_policy"] if r["protocol"] == "async" else "hardsync", r["seed"])
        if key in hit:  # 50 % until the hit, then the final error; run length 1 s (equal: never compared)
            curves += [{"run_id": r["run_id"], "sim_time_s": t, "test_error": e}
                       for t, e in ((0.0, 0.9), (hit[key] - 0.05, 0.5), (hit[key], r["final_test_error"]),
                                    (1.0, r["final_test_error"]))]
    text = staleness_finding(rows, curves, 360, target=0.01)
    assert ("to 3.0 % (the higher of their mean final errors), per_gradient takes 0.4–0.6 s and hardsync "
            "0.5–0.6 s: neither is faster in every seed (per_gradient in 2, hardsync in 1 of 3)") in text


def test_policy_effects_that_change_sign_between_seeds_are_said_to():
    rows = []
    for s, (c, a) in enumerate(((0.156, 0.089), (0.12, 0.14), (0.10, 0.09))):
        rows += [run("softsync", 30, 8, "constant", s, c), run("softsync", 30, 8, "per_gradient", s, a)]
    text = policy_finding(rows, 360)
    assert "has no effect that survives the seed in 1" in text and "−6.7 to +2.0 points" in text
    assert "lowers" not in text


def test_eta_squared_by_hand():
    # groups {1, 3} and {5, 7}: grand mean 4, total SS 9+1+1+9 = 20, between 2·(2−4)² + 2·(6−4)² = 16
    assert eta_squared([[1, 3], [5, 7]]) == pytest.approx(0.8)
    assert math.isnan(eta_squared([[2, 2], [2]]))


def soft(err) -> list[dict]:
    """1-softsync λ ∈ {1, 4, 16} × μ ∈ {8, 32, 128} in 3 seeds, final error err(μλ, seed)."""
    return [run("softsync", lam, mu, "constant", s, err(lam * mu, s)) for lam in (1, 4, 16) for mu in (8, 32, 128)
            for s in range(3)]


def test_mulambda_finding_needs_every_seed_and_no_u():
    text = minibatch_finding(soft(lambda t, s: 0.02 + t / 10_000 + 0.001 * s), 360)
    assert text.startswith("Error tracks the total minibatch μλ") and "1-softsync" in text
    assert "η² = 1.00 over 3 seeds, 7 configurations on 3 μλ diagonals, chance ≈ 0.33" in text
    # a U in every seed (lowest at μλ = 128, both ends higher by far more than two samples, the
    # largest μλ highest): not said
    u = soft(lambda t, s: 0.02 + ((7 - math.log2(t)) / 50 if t < 128 else (math.log2(t) - 7) / 25))
    assert minibatch_finding(u, 360) is None
    # μλ explains the error in seeds 0 and 1, λ alone in seed 2: not said
    bad = soft(lambda t, s: 0.02 + t / 10_000)
    for r in bad:
        if r["seed"] == 2:
            r["final_test_error"] = 0.02 * r["learners"]
    assert minibatch_finding(bad, 360) is None
    # hardsync's rows never make it
    assert minibatch_finding([dict(r, protocol="hardsync") for r in soft(lambda t, s: t / 10_000)], 360) is None
    # a U in one seed of three is enough not to say it: the finding must hold in every replicate
    one_u = soft(lambda t, s: 0.02 + (((7 - math.log2(t)) / 50 if t < 128 else (math.log2(t) - 7) / 25) if s == 0
                                      else t / 10_000))
    assert minibatch_finding(one_u, 360) is None
    # what μλ does not explain is said: λ = 16, μ = 32 one point above λ = 4, μ = 128 (both μλ = 512) in seed 1
    apart = soft(lambda t, s: 0.02 + t / 10_000)
    for r in apart:
        if (r["learners"], r["minibatch"], r["seed"]) == (16, 32, 1):
            r["final_test_error"] += 0.01
    assert "within a diagonal up to 1.0 points apart, μλ = 512 in seed 1" in minibatch_finding(apart, 360)


def test_not_learned_counts_configurations_in_all_and_some_seeds():
    rows = [run("async", 4, 8, "constant", s, 0.9) for s in range(3)]
    rows += [run("async", 16, 8, "constant", s, e) for s, e in enumerate((0.9, 0.1, 0.1))]
    rows += [run("async", 1, 8, "constant", s, 0.05) for s in range(3)]
    (text,) = [f for f in findings(rows) if "did not learn" in f]
    assert text.startswith("1 of 3 configurations did not learn in any of their 3 seeds, 1 more in some of them "
                           "(4 of 9 runs")


def test_span_and_labels_of_replicates():
    assert span([0.022, 0.031]) == "2.2–3.1 %" and span([0.0221, 0.0222]) == "2.2 %"
    rows = [run("async", 4, 8, "constant", s, 0.1) for s in range(2)] + [run("async", 4, 8, "per_gradient", 0, 0.1)]
    names = labels(rows)
    assert names["async-4-8-constant-1"] == "async λ=4 μ=8 constant seed=1"
    assert names["async-4-8-per_gradient-0"] == "async λ=4 μ=8 per_gradient"


# -- figures: the mean and its spread ------------------------------------------------------------------
def test_figures_draw_the_mean_with_its_spread():
    from matplotlib.collections import PolyCollection

    rows = [run("async", lam, 8, "per_gradient", s, e, sim_time_s=t)
            for lam, t in ((1, 4.0), (4, 1.0)) for s, e in enumerate((0.02, 0.05, 0.03))]
    curves = Table([{"run_id": r["run_id"], "epoch": ep, "sim_time_s": ep * r["sim_time_s"] / 2,
                     "test_error": r["final_test_error"] + (0.5 if ep == 1 else 0.0) * (1 + r["seed"])}
                    for r in rows for ep in (1, 2)])
    fig = plots.error_vs_time(curves, Table(rows))
    ax = fig.axes[0]
    assert len(ax.get_lines()) == 2  # one mean line per configuration, not six runs
    line = next(ln for ln in ax.get_lines() if "λ=1" in ln.get_label())
    assert list(line.get_ydata()) == pytest.approx([0.5 * 2 + 0.1 / 3, 0.1 / 3])  # means at epochs 1, 2
    band = [c for c in ax.collections if isinstance(c, PolyCollection)]
    assert len(band) == 2
    ys = band[0].get_paths()[0].vertices[:, 1]
    assert min(ys) == pytest.approx(0.02) and max(ys) == pytest.approx(0.03 + 1.5)
    pareto = plots.pareto(Table(rows))
    texts = [t.get_text() for t in pareto.axes[0].get_legend().get_texts()]
    assert "(bars: 95 % interval of the mean over 3 seeds)" in texts
    heat = plots.heatmap(Table(rows))
    cells = [t.get_text() for t in heat.axes[0].texts]
    assert "3.3%\n2.0–5.0%" in cells  # the mean, and the seeds' range (wider than a point)


def test_pareto_names_frontier_neighbours_the_seeds_do_not_tell_apart():
    # truth: Student t with 2 degrees of freedom (4.303): λ = 4's errors 4, 5, 6 % give 5 % ± 2.5, λ = 1's
    # 4.5, 4, 3.5 % give 4 % ± 1.2: each mean inside the other's interval; 20–22 % is far from both
    def sweep(errs_slow: tuple[float, ...]) -> Table:
        return Table([run("hardsync", 4, 8, "constant", s, e, sim_time_s=1.0) for s, e in enumerate((0.04, 0.05, 0.06))]
                     + [run("hardsync", 1, 8, "constant", s, e, sim_time_s=2.0) for s, e in enumerate(errs_slow)])

    def legend(t: Table) -> list[str]:
        return [x.get_text() for x in plots.pareto(t).axes[0].get_legend().get_texts()]

    near = [x for x in legend(sweep((0.045, 0.04, 0.035))) if x.startswith("(not told apart by the seeds: ")]
    assert len(near) == 1 and "~" in near[0]
    assert not any(x.startswith("(not told apart") for x in legend(sweep((0.01, 0.011, 0.012))))


def test_seeds_of_a_configuration_replay_together_with_the_numbers_each_gets_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # truth: each seed's point run alone (run_task, the replay backend's run); the sweep runs
    # a configuration's seeds in one worker unit whose replays share gradient calls
    from ddlsim.backends import replay_multi
    from ddlsim.scenarios import runner

    scenario = load_text(TINY.replace("replicates = 2", "replicates = 3"))
    points = scenario.points()
    units = runner.work_units([([i], runner.Task([p], str(tmp_path / "u"), "replay", {})) for i, p in
                               enumerate(points)], "replay")
    assert [len(u) for u in units] == [3, 3]  # two configurations, three seeds each
    shared: list[int] = []
    real = replay_multi.replay_many
    monkeypatch.setattr(replay_multi, "replay_many", lambda reps: (shared.append(len(reps)), real(reps))[1])
    import ddlsim.backends.replay as replay_mod
    monkeypatch.setattr(replay_mod, "replay_many", replay_multi.replay_many)
    together = runner.run_points(scenario, points, tmp_path / "together", backend="replay", jobs=1, progress=False,
                                 options={"device": "cpu"})
    assert shared == [6]  # the two lr policies share each seed's simulation: one unit of 3 tasks, 6 replays
    for p, record in zip(points, together):
        alone = runner.run_task(runner.Task([p], str(tmp_path / "alone"), "replay", {"device": "cpu"}))[0]
        assert record["row"]["run_id"] == p["_id"]
        assert record["row"]["final_test_error"] == alone["row"]["final_test_error"]
        assert [c["test_error"] for c in record["curves"]] == [c["test_error"] for c in alone["curves"]]
        assert [c["train_loss"] for c in record["curves"]] == [c["train_loss"] for c in alone["curves"]]
    assert len({r["row"]["final_test_error"] for r in together}) > 1  # the seeds differ


def test_a_work_unit_holds_at_most_unit_tasks_simulations(tmp_path: Path) -> None:
    # rule: the seeds of one configuration share a unit, at most UNIT_TASKS of them (each unit
    # holds its traces at once); other backends run each task alone
    from ddlsim.scenarios import runner

    scenario = load_text(TINY.replace("replicates = 2", "replicates = 20").replace(
        '"optimizer.lr_policy" = ["constant", "per_gradient"]', '"optimizer.lr" = [0.1, 0.2]'))
    points = scenario.points()
    tasks = [([i], runner.Task([p], str(tmp_path), "replay", {})) for i, p in enumerate(points)]
    units = runner.work_units(tasks, "replay")
    assert [len(u) for u in units] == [8, 8, 4, 8, 8, 4]
    for unit in units:
        assert len({configuration_id(t.points[0]) for _, t in unit}) == 1
    assert sorted(i for u in units for ids, _ in u for i in ids) == list(range(40))
    assert [len(u) for u in runner.work_units(tasks, None)] == [1] * 40


def test_the_console_gives_a_time_to_target_only_when_every_seed_reached_it():
    # truth by hand: seeds reaching the target at 1.0 and 3.0 s: mean 2.0; one of two never
    # reaching it: no mean (the reached column says 1/2); the range is in the mean's units
    from ddlsim.scenarios.cli.sweep import _configuration_records

    def rec(proto, seed, ttt, err):
        return {"row": {"run_id": f"{proto}-{seed}", "protocol": proto, "learners": 2, "minibatch": 8, "seed": seed,
                        "error": None, "sim_time_s": 4.0, "final_test_error": err, "best_test_error": err,
                        "time_to_target_s": ttt}}
    rows = {r["row"]["protocol"]: r["row"] for r in _configuration_records(
        [rec("async", 0, 1.0, 0.02), rec("async", 1, 3.0, 0.04), rec("hardsync", 0, 2.0, 0.02),
         rec("hardsync", 1, None, 0.3)])}
    assert rows["async"]["time_to_target_s"] == pytest.approx(2.0) and rows["async"]["reached"] == "2/2"
    assert rows["hardsync"]["time_to_target_s"] is None and rows["hardsync"]["reached"] == "1/2"
    assert rows["async"]["final_range"] == "0.02–0.04"


def test_the_console_gives_the_time_and_rate_with_their_range_over_the_seeds():
    # truth by hand: seeds of 2.0 and 4.0 s, 100 and 50 grad/s: mean 3 s and 75 grad/s, ranges
    # "2–4 s" and "50–100"; a live run's measured time is the mean of the seeds', not the first's
    from ddlsim.scenarios.cli.sweep import _configuration_columns, _configuration_records
    from ddlsim.scenarios.cli.table import RUN_TABLE

    def rec(seed, t, rate, measured):
        return {"row": {"run_id": f"a-{seed}", "protocol": "async", "learners": 2, "minibatch": 8, "seed": seed,
                        "error": None, "sim_time_s": t, "gradients_per_s": rate, "measured_time_s": measured,
                        "final_test_error": 0.1, "best_test_error": 0.1}}
    row = _configuration_records([rec(0, 2.0, 100.0, 1.0), rec(1, 4.0, 50.0, 3.0)])[0]["row"]
    assert row["sim_time_s"] == pytest.approx(3.0) and row["sim_time_s_range"] == "2–4 s"
    assert row["gradients_per_s"] == pytest.approx(75.0) and row["rate_range"] == "50–100"
    assert row["measured_time_s"] == pytest.approx(2.0) and row["measured_time_s_range"] == "1–3 s"
    heads = dict(_configuration_columns(RUN_TABLE, []))
    assert heads["sim_time_s"] == "time (mean)" and heads["sim_time_s_range"] == "range"
    assert heads["gradients_per_s"] == "grad/s (mean)" and heads["rate_range"] == "range"
    one = _configuration_records([rec(0, 2.0, 100.0, 1.0)])[0]["row"]
    assert one["sim_time_s_range"] is None  # one seed: no range
