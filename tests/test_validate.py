"""`ddlsim validate`: live runs against simulations of the same points with a profile's costs."""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

import pytest

from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import load
from ddlsim.simulator.run import simulate

pytestmark = [pytest.mark.live, pytest.mark.filterwarnings("ignore::UserWarning")]

SCENARIO = """
name = "validate-test"
seed = 2
backend = "live"
[workload]
epochs = 1
samples_per_epoch = 128
[cluster]
learners = 2
minibatch = 8
[cluster.compute]
distribution = "deterministic"
base_s = 0.02
per_sample_s = 0.0
[live]
compute = "emulated"
timeout_s = 30
[sweep]
"protocol.name" = ["hardsync", "async"]
"""
PROFILE = """
[network]
latency_s = 2e-4
bandwidth_Bps = 1e9
[server]
apply_s = 1e-4
"""


def test_validate_compares_live_runs_with_the_profiled_simulation(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture) -> None:
    # Truths: the simulator run on the same points with the profile's three costs set as
    # ordinary scenario keys (not through validate's own profile reader); the relative error
    # recomputed from the two reported times; and a bound no load can break: the live run's
    # learners sleep for their emulated compute (16 minibatches of 0.02 s shared by 2 learners),
    # so an epoch takes at least 0.16 s. (How close live lands to the simulation is a
    # measurement on a quiet machine, docs/validation.md, not a test: this shared 2-core
    # machine under load has put it 30–40 % away.)
    (tmp_path / "s.toml").write_text(SCENARIO)
    (tmp_path / "p.toml").write_text(PROFILE)
    out = tmp_path / "v"
    assert main(["validate", str(tmp_path / "s.toml"), "--profile", str(tmp_path / "p.toml"), "--out", str(out),
                 "--quiet"]) == 0
    printed = capsys.readouterr().out
    with open(out / "validation.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["protocol"] for r in rows] == ["hardsync", "async"]
    sets = ["cluster.network.latency_s=2e-4", "cluster.network.bandwidth_Bps=1e9", "cluster.server.apply_s=1e-4"]
    for row, point in zip(rows, load(tmp_path / "s.toml", sets).points()):
        sim = simulate(point)
        assert float(row["simulated_time_per_epoch_s"]) == pytest.approx(sim.summary["sim_time_s"], rel=1e-12)
        assert float(row["simulated_staleness_mean"]) == pytest.approx(sim.summary["staleness_mean"])
        measured, simulated = float(row["measured_time_per_epoch_s"]), float(row["simulated_time_per_epoch_s"])
        assert measured >= 16 * 0.02 / 2 * 0.999
        assert float(row["time_rel_error"]) == pytest.approx((simulated - measured) / measured, rel=1e-9)
    median = statistics.median(abs(float(r["time_rel_error"])) for r in rows)
    assert f"median |relative error| of time per epoch: {median:.1%}" in printed
    assert (out / "validation.png").stat().st_size > 0 and (out / "validation.svg").stat().st_size > 0
    # an earlier table is neither replaced nor cut down without --force: one line, exit 2, file unchanged
    before = (out / "validation.csv").read_bytes()
    args = ["validate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would replace its 2 measured points (--resume keeps" in err
    assert main(args + ["--resume", "--set", 'protocol.name="hardsync"']) == 2
    assert "would drop 1 measured points this sweep does not have" in capsys.readouterr().err
    assert (out / "validation.csv").read_bytes() == before
    # --resume with the same sweep keeps both rows as they were (nothing is measured again)
    assert main(args + ["--resume", "--profile", str(tmp_path / "p.toml")]) == 0
    with open(out / "validation.csv", newline="") as f:
        assert list(csv.DictReader(f)) == rows


def test_an_earlier_validation_table_is_read_with_care(tmp_path: Path) -> None:
    # truth: the rows written by hand; a row a validation cannot have written is measured again,
    # a table the csv module cannot read is one ScenarioError naming the file
    from ddlsim.scenarios.schema import ScenarioError
    from ddlsim.scenarios.validate import COLUMNS, _stored_rows

    def table(*rows: dict) -> Path:
        path = tmp_path / "validation.csv"
        with open(path, "w", newline="") as f:
            w = csv.DictWriter(f, COLUMNS)
            w.writeheader()
            w.writerows(rows)
        return path

    good = {c: 1.0 for c in COLUMNS} | {"run_id": "a", "protocol": "async", "learners": 2, "time_rel_error": -0.5,
                                        "measured_staleness_mean": "nan"}
    kept = _stored_rows(table(good, good | {"run_id": "inf", "learners": "1e400"},
                              good | {"run_id": "nan", "learners": "nan"}, good | {"run_id": "half", "learners": 1.5},
                              good | {"run_id": "neg", "measured_time_per_epoch_s": -5}))
    assert list(kept) == ["a"] and kept["a"]["learners"] == 2 and kept["a"]["time_rel_error"] == -0.5
    (tmp_path / "validation.csv").write_text("run_id," + "x" * (2 << 20) + "\n")
    with pytest.raises(ScenarioError, match="validation.csv: not a readable validation table"):
        _stored_rows(tmp_path / "validation.csv")
