"""Successive halving (`ddlsim advise`, `ddlsim run --prune`): the rung schedule's closed form,
a replay cut at an epoch equal to the whole replay's prefix, the halving rule on hand-made
curves, `run --prune` against the whole sweep, and bad rungs refused in one line."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from ddlsim.backends.replay_prefix import UNTIL_EPOCH, cut_index, prefix
from ddlsim.scenarios.advise import search as A
from ddlsim.scenarios.advise.model import Candidate, Replicate
from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import load_text
from ddlsim.scenarios.schema import ScenarioError

TINY = """
name = "halving-test"
seed = 0
[workload]
dataset = "digits"
model = "mlp"
epochs = 2
evals_per_epoch = 3
[optimizer]
lr = 0.1
momentum = 0.9
lr_policy = "mean_staleness"
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
"""


# -- the rungs ---------------------------------------------------------------------------------
def test_rungs_are_f_times_eta_powers_below_one_then_the_horizon() -> None:
    assert A.rung_fractions(0.25, 3) == [0.25, 0.75, 1.0]
    assert A.rung_fractions(1.0, 3) == [1.0]                       # every point replayed whole
    assert A.rung_fractions(0.1, 2) == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0])
    assert A.rung_fractions(1 / 9, 3) == pytest.approx([1 / 9, 1 / 3, 1.0])
    with pytest.raises(ScenarioError, match="more than 64 rungs"):
        A.rung_fractions(1e-300, 1.0001)


def test_a_cut_ends_at_the_last_evaluation_by_its_epoch_and_after_training_starts() -> None:
    epochs = [0.0, 0.5, 1.0, 1.5, 2.0]
    assert cut_index(epochs, 1.2) == 2
    assert cut_index(epochs, 1.0) == 2          # at or before
    assert cut_index(epochs, 0.1) == 1          # never only the untrained model
    assert cut_index(epochs, 9.0) == 4
    assert cut_index([0.0], 0.5) == 0


# -- a rung is a real shorter replay: the whole replay's prefix ------------------------------------
@pytest.mark.parametrize("protocol, policy", [("hardsync", "constant"), ("async", "mean_staleness"),
                                              ("async", "per_gradient"), ("softsync", "mean_staleness"),
                                              ("sgp", "constant")])
def test_a_replay_cut_at_an_epoch_is_the_whole_replay_up_to_there(protocol: str, policy: str) -> None:
    # truth: the whole trace's replay; every cut must give its evaluations bit for bit (the last
    # one's train loss aside: it averages the minibatches computed by the cut)
    import torch

    from ddlsim.backends.base import RunOptions
    from ddlsim.backends.replay import ReplayBackend
    from ddlsim.simulator.run import simulate

    torch.set_num_threads(1)
    point = load_text(TINY, overrides=[f'protocol.name="{protocol}"', f'optimizer.lr_policy="{policy}"']).points()[0]
    trace = simulate(point).trace
    backend, opts = ReplayBackend(), RunOptions(device="cpu")
    whole = backend.run(trace, point, opts).curves
    assert len(whole) == 7
    for j in (1, 3, 5):
        cut = backend.run(trace, {**point, UNTIL_EPOCH: whole[j]["epoch"]}, opts).curves
        assert len(cut) == j + 1
        assert cut[:-1] == whole[:j]
        assert {k: v for k, v in cut[-1].items() if k != "train_loss"} == \
            {k: v for k, v in whole[j].items() if k != "train_loss"}
    if policy == "mean_staleness" and protocol == "async":
        # the control: the same ops without the whole trace's ⟨σ⟩ divide the rate by the prefix's
        naive = prefix(trace, whole[3]["epoch"])
        naive.header.pop("mean_staleness")
        other = backend.run(naive, point, opts).curves
        assert [r["test_error"] for r in other][1:] != [r["test_error"] for r in whole[1:4]]


# -- the halving rule, on hand-made curves -----------------------------------------------------
class Served(A.Rungs):
    """Rungs whose replays are served from hand-made curves (a replay to evaluation i is the
    curve's first i + 1 rows, as a real cut replay is: the test above)."""

    def __init__(self, curves: dict[str, list[float]]) -> None:
        super().__init__(None, Path("."), Path("."))
        self.curves = curves

    def run(self, reqs: list[tuple[Replicate, int]]) -> dict[int, str]:
        for rep, i in reqs:
            self.replays += 1
            self.epochs += rep.evals[i][1]
            rows = [{"epoch": e, "sim_time_s": t, "test_error": x, "updates": 0}
                    for (t, e), x in zip(rep.evals, self.curves[rep.point["_id"]])][:i + 1]
            rep.curves, rep.cut, rep.diverged = rows, i, False
            rep.record = {"row": dict(rep.row), "curves": rows}
        return {}


def configs(errors: dict[str, list[list[float]]], epochs: int = 9) -> tuple[list[Candidate], dict[str, list[float]]]:
    """Configurations with replicates; evaluations at epochs 0, 1, …, ``epochs``, 1 s each."""
    evals = [(float(e), float(e)) for e in range(epochs + 1)]
    cands, curves = [], {}
    for i, (name, reps) in enumerate(errors.items()):
        rs = []
        for k, errs in enumerate(reps):
            pid = f"{name}-{k}"
            curves[pid] = errs
            rs.append(Replicate({"_id": pid, "seed": k, "optimizer": {"lr_policy": "constant"}},
                                {"run_id": pid, "protocol": "async", "learners": 2, "minibatch": 8},
                                list(evals), horizon=epochs))
        cands.append(Candidate(i, rs[0].point, rs[0].row, name, evals=list(evals), reps=rs))
    return cands, curves


def flat(at1: float, at3: float, at9: float) -> list[float]:
    """An error curve over epochs 0..9 that is ``at1`` by epoch 1, ``at3`` by 3, ``at9`` at 9."""
    return [0.9, at1, at1, at3, at3, at3, at3, at3, at3, at9]


def test_halving_keeps_the_best_third_of_each_rung_and_ties_with_the_last_kept() -> None:
    # hand truth (η = 3, rungs at 1/9, 1/3, 1 of 9 epochs: epochs 1, 3, 9): rung 1 ranks c2 .30,
    # c7 .35, then c1 and c8 tied at .40 — ⌈9/3⌉ = 3 kept, and c8 with its tie; rung 2 keeps
    # ⌈4/3⌉ = 2 of those four (c7 .10, c2 .20); c2 ends at .05 and c7 at .08
    at1 = [0.5, 0.4, 0.3, 0.6, 0.7, 0.8, 0.9, 0.35, 0.4]
    at3 = {1: 0.25, 2: 0.2, 7: 0.1, 8: 0.3}
    at9 = {2: 0.05, 7: 0.08}
    cands, curves = configs({f"c{i}": [flat(e, at3.get(i, e), at9.get(i, e))] for i, e in enumerate(at1)})
    rungs = Served(curves)
    A.halve(list(cands), rungs, A.rung_fractions(1 / 9, 3), 3)
    status = {c.label: c.status for c in cands}
    assert {k for k, v in status.items() if v == "replayed"} == {"c2", "c7"}
    assert {k for k, v in status.items() if v == "stopped"} == {f"c{i}" for i in (0, 1, 3, 4, 5, 6, 8)}
    by = {c.label: c for c in cands}
    assert [by[k].rung for k in ("c0", "c1", "c8", "c2")] == [0, 1, 1, 2]
    assert by["c2"].error == pytest.approx(0.05) and by["c7"].error == pytest.approx(0.08)
    assert by["c1"].rung_scores == pytest.approx([0.4, 0.25])
    assert rungs.sizes == [9, 4, 2]
    assert rungs.replays == 9 + 4 + 2 and rungs.epochs == 9 * 1 + 4 * 3 + 2 * 9


def test_replicates_rank_by_their_mean_and_the_worse_replicate_breaks_a_tie() -> None:
    # hand truth: A and B both average .20 at epoch 1, B's worse seed .30 against A's .20; D .10
    # first; ⌈5/3⌉ = 2 continue: D and A
    cands, curves = configs({"A": [flat(0.2, 0.2, 0.2), flat(0.2, 0.2, 0.2)],
                             "B": [flat(0.1, 0.1, 0.1), flat(0.3, 0.3, 0.3)],
                             "C": [flat(0.5, 0.5, 0.5)] * 2, "D": [flat(0.1, 0.1, 0.1)] * 2,
                             "E": [flat(0.6, 0.6, 0.6)] * 2})
    A.halve(list(cands), Served(curves), A.rung_fractions(1 / 9, 3), 3)
    by = {c.label: c for c in cands}
    assert by["B"].status == "stopped" and by["B"].rank == 3 and by["B"].rung_scores == pytest.approx([0.2])
    assert by["A"].status == by["D"].status == "replayed"
    assert by["A"].error == pytest.approx(0.2) and by["D"].error == pytest.approx(0.1)


def test_a_target_prunes_what_cannot_reach_it_before_a_time_already_measured() -> None:
    # hand truth, target .15 (one evaluation a second): F reaches it at 1 s (epoch 1) on the first
    # rung; every other configuration's next evaluation comes at 2 s ≥ 1 s: pruned, never replayed
    # further, and F's time is exact
    cands, curves = configs({"F": [[0.9, 0.1] + [0.1] * 8], "G": [flat(0.3, 0.05, 0.01)],
                             "H": [flat(0.5, 0.4, 0.3)]})
    rungs = Served(curves)
    A.halve(list(cands), rungs, A.rung_fractions(1 / 9, 3), 3, target=0.15)
    by = {c.label: c for c in cands}
    assert by["F"].status == "replayed" and by["F"].at_s == 1.0 and by["F"].at_epoch == 1.0
    assert by["G"].status == by["H"].status == "pruned" and "2 s" in by["G"].note
    assert rungs.replays == 3 and rungs.sizes == [3]


def test_a_pruned_configuration_of_several_seeds_is_said_to_be_pruned_by_its_mean() -> None:
    # hand truth, target .15, one evaluation a second: F reaches it at 1 s and 3 s (mean 2 s, known
    # at rung 2, epoch 3); G's first seed is at .4 then (its next evaluation 4 s), its second reached
    # it at 2 s: G's mean cannot come before 3 s, so it is pruned, though in the second seed it is
    # first (2 s against F's 3 s); the note says the rule is about the mean
    cands, curves = configs({"F": [[0.9, 0.1] + [0.1] * 8, [0.9, 0.9, 0.9, 0.1] + [0.1] * 6],
                             "G": [flat(0.5, 0.4, 0.01), [0.9, 0.9, 0.1] + [0.1] * 7]})
    A.halve(list(cands), Served(curves), A.rung_fractions(1 / 9, 3), 3, target=0.15)
    by = {c.label: c for c in cands}
    assert by["F"].status == "replayed" and by["F"].at_s == pytest.approx(2.0)
    assert by["G"].status == "pruned"
    assert "its mean over 2 seeds cannot reach the target before 3 s" in by["G"].note
    assert "no earlier than the mean 2 s already measured (a seed of it may still be first)" in by["G"].note


# -- ddlsim run --prune against the whole sweep -------------------------------------------------
SWEEP = TINY + """
[sweep]
"cluster.learners" = [1, 4, 8]
"protocol.name" = ["hardsync", "async"]
"optimizer.lr_policy" = ["constant", "per_gradient"]
"""


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def sweeps(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The tiny sweep replayed whole (the truth) and with --prune."""
    import torch

    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("prune")
    (base / "s.toml").write_text(SWEEP)
    common = ["--quiet", "--jobs", "1", "--device", "cpu", "--no-report"]
    assert main(["run", str(base / "s.toml"), "--out", str(base / "whole")] + common) == 0
    assert main(["run", str(base / "s.toml"), "--out", str(base / "pruned"), "--prune"] + common) == 0
    return base, base / "whole", base / "pruned"


def test_run_prune_replays_the_survivors_whole_and_records_the_others_at_their_rung(sweeps) -> None:
    # truth: the whole sweep; a survivor's row is its row, a stopped point's rung error is the whole
    # replay's at that epoch, and its curve the whole curve up to there
    _, whole, pruned = sweeps
    truth = {r["run_id"]: r for r in read(whole / "summary.csv")}
    rows = read(pruned / "summary.csv")
    assert [r["run_id"] for r in rows] == list(truth)
    curves: dict[str, list[dict[str, str]]] = {}
    for r in read(whole / "curves.csv"):
        curves.setdefault(r["run_id"], []).append(r)
    mine: dict[str, list[dict[str, str]]] = {}
    for r in read(pruned / "curves.csv"):
        mine.setdefault(r["run_id"], []).append(r)
    stopped = [r for r in rows if r["pruned_at_epoch"]]
    assert 0 < len(stopped) < len(rows)
    for r in rows:
        assert r["error"] == ""  # a stopped point is not a failure
        if not r["pruned_at_epoch"]:
            assert r["final_test_error"] == truth[r["run_id"]]["final_test_error"]
            assert mine[r["run_id"]] == curves[r["run_id"]]
            assert (pruned / "runs" / r["run_id"] / "result.json").is_file()
            continue
        e = float(r["pruned_at_epoch"])
        upto = [c for c in curves[r["run_id"]] if float(c["epoch"]) <= e + 1e-9]
        assert float(r["pruned_test_error"]) == float(upto[-1]["test_error"])
        assert r["final_test_error"] == "" and r["best_test_error"] == ""
        assert [c["test_error"] for c in mine[r["run_id"]]] == [c["test_error"] for c in upto]
        assert not (pruned / "runs" / r["run_id"]).exists()


def test_run_prune_keeps_what_the_rule_keeps_on_the_whole_curves(sweeps) -> None:
    # an independent truth: the halving rule applied by hand to the whole sweep's curves (12
    # configurations, one seed each; rungs at 25 % and 75 % of 2 epochs, then whole; η = 3)
    _, whole, pruned = sweeps
    curves: dict[str, list[tuple[float, float]]] = {}
    for r in read(whole / "curves.csv"):
        curves.setdefault(r["run_id"], []).append((float(r["epoch"]), float(r["test_error"])))
    pool = list(curves)
    stopped_at: dict[str, float] = {}
    for f in (0.25, 0.75):
        def at(rid: str, f: float = f) -> tuple[float, float]:
            pts = curves[rid]
            i = cut_index([e for e, _ in pts], f * pts[-1][0])
            return pts[i][1], pts[i][0]
        ranked = sorted(pool, key=lambda rid: (at(rid)[0], list(curves).index(rid)))
        keep = max(math.ceil(len(ranked) / 3), min(len(ranked), 2))
        while keep < len(ranked) and at(ranked[keep])[0] == at(ranked[keep - 1])[0]:
            keep += 1
        for rid in ranked[keep:]:
            stopped_at[rid] = at(rid)[1]
        pool = ranked[:keep]
    rows = {r["run_id"]: r for r in read(pruned / "summary.csv")}
    assert {k for k, r in rows.items() if r["pruned_at_epoch"]} == set(stopped_at)
    for rid, e in stopped_at.items():
        assert float(rows[rid]["pruned_at_epoch"]) == e


def test_run_prune_resumes_from_its_runs(sweeps, capsys: pytest.CaptureFixture) -> None:
    # a second --prune --resume finds every rung's replay stored: the same tables
    base, _, pruned = sweeps
    before = (pruned / "summary.csv").read_text()
    stored = {p: p.stat().st_mtime_ns for p in pruned.rglob("result.json")}
    assert main(["run", str(base / "s.toml"), "--out", str(pruned), "--prune", "--resume", "--quiet", "--jobs", "1",
                 "--device", "cpu", "--no-report"]) == 0
    assert (pruned / "summary.csv").read_text() == before
    assert {p: p.stat().st_mtime_ns for p in pruned.rglob("result.json")} == stored  # nothing replayed again
    assert "points stopped at a rung" in capsys.readouterr().out


# -- bad rungs ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [["advise", "demo", "--budget-s", "1"], ["run", "demo", "--prune"]])
@pytest.mark.parametrize("args, needle", [
    (["--reduction-factor", "1"], "--reduction-factor = 1:"),
    (["--reduction-factor", "0.5"], "--reduction-factor = 0.5:"),
    (["--reduction-factor", "nan"], "--reduction-factor = nan:"),
    (["--reduction-factor", "inf"], "--reduction-factor = inf:"),
    (["--min-fraction", "0"], "--min-fraction = 0:"),
    (["--min-fraction", "-0.25"], "--min-fraction = -0.25:"),
    (["--min-fraction", "1.5"], "--min-fraction = 1.5:"),
    (["--min-fraction", "nan"], "--min-fraction = nan:"),
    (["--min-fraction", "1e-300", "--reduction-factor", "1.0001"], "more than 64 rungs"),
])
def test_bad_rungs_are_one_line_and_exit_2_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           command: list[str], args: list[str], needle: str) -> None:
    out = tmp_path / "never"
    assert main(command + ["--out", str(out), "--quiet"] + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddlsim: error: ") and needle in err
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [
    (["--min-fraction", "0.5"], "--min-fraction without --prune"),
    (["--reduction-factor", "2"], "--reduction-factor without --prune"),
    (["--prune", "--traces"], "--traces with --prune"),
    (["--prune", "--backend", "live"], "needs the replay backend"),
])
def test_halving_options_that_would_mean_nothing_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             args: list[str], needle: str) -> None:
    out = tmp_path / "never"
    assert main(["run", "demo", "--out", str(out), "--quiet"] + args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err
    assert not out.exists()
