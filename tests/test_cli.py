"""`ddlsim simulate` end to end: files, columns, the terminal table, parallel sweeps."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from ddlsim.scenarios.cli import main
from ddlsim.simulator import trace as T

SCENARIO = """
name = "cli-test"
[workload]
epochs = 2
[cluster]
learners = 4
minibatch = 8
[protocol]
name = "softsync"
[sweep]
"protocol.name" = ["hardsync", "async"]
"cluster.minibatch" = [4, 8]
"""

DESIGN_SUMMARY = ["run_id", "protocol", "learners", "minibatch", "softsync_n", "gradients", "updates",
                  "sim_time_s", "gradients_per_s", "staleness_mean", "staleness_p50", "staleness_p99",
                  "staleness_max", "server_utilization", "server_wait_mean_s"]


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_simulate_writes_summary_traces_and_table(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  jobs: str) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet", "--jobs", jobs, "--traces"]) == 0
    rows = read_csv(out / "summary.csv")
    assert len(rows) == 4
    assert list(rows[0])[:5] == DESIGN_SUMMARY[:5]
    assert set(DESIGN_SUMMARY) <= set(rows[0])
    assert [(r["protocol"], r["minibatch"]) for r in rows] == [
        ("hardsync", "4"), ("hardsync", "8"), ("async", "4"), ("async", "8")]
    for r in rows:
        tr = T.read(out / "runs" / r["run_id"] / "trace.ddlt")
        assert tr.header["run_id"] == r["sim_id"]
        assert int(r["gradients"]) == int((tr.ops["kind"] == T.GRAD).sum())
        assert (out / "runs" / r["run_id"] / "staleness.csv").exists()
    assert rows[0]["staleness_max"] == "0.0" and rows[2]["softsync_n"] == "4"
    text = capsys.readouterr().out
    assert "σ mean" in text and rows[3]["run_id"] in text and "summary.csv" in text


def test_same_scenario_same_summary_numbers(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    for d in ("a", "b"):
        assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / d), "--quiet", "--traces"]) == 0
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]  # noqa: E731
    assert strip(read_csv(tmp_path / "a/summary.csv")) == strip(read_csv(tmp_path / "b/summary.csv"))
    for r in read_csv(tmp_path / "a/summary.csv"):
        rel = Path("runs") / r["run_id"] / "trace.ddlt"
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_trace_command_reads_and_refuses(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    main(["simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / "o"), "--quiet", "--traces"])
    trace = next((tmp_path / "o" / "runs").glob("*/trace.ddlt"))
    assert main(["trace", str(trace)]) == 0
    assert "grad=" in capsys.readouterr().out
    trace.write_bytes(trace.read_bytes()[:100])
    assert main(["trace", str(trace)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "truncated" in err[0]


def test_bundled_scenarios_are_listed_and_valid(capsys: pytest.CaptureFixture) -> None:
    from ddlsim.scenarios.bundled import CATALOGUE
    from ddlsim.scenarios.load import load

    assert main(["scenarios"]) == 0
    listing = capsys.readouterr().out
    for f in CATALOGUE.glob("*.toml"):
        assert f.stem in listing
        assert load(f).points()


@pytest.mark.parametrize("command, extra", [
    (["run"], []), (["run"], ["--data-dir", "{tmp}/absent"]),
    (["advise"], ["--target-error", "0.1"]),
])
def test_unreadable_data_set_refused_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     command: list[str], extra: list[str]) -> None:
    # rule: a data set whose files are not given is one line and exit 2 before the sweep
    # starts (nothing simulated, no results directory), not a failure per point
    (tmp_path / "s.toml").write_text(SCENARIO.replace("[workload]", '[workload]\ndataset = "cifar10"\n'
                                                      'model = "rudra_cifar"'))
    out = tmp_path / "out"
    args = command + [str(tmp_path / "s.toml"), "--out", str(out), "--quiet"]
    assert main(args + [a.format(tmp=tmp_path) for a in extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cifar10" in err[0] and "--data-dir" in err[0]
    assert not out.exists()


def test_plot_and_report_draw_a_results_directory_and_refuse_other_tables(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # rule: figures come from a ddlsim results directory; a summary.csv that is not one
    # (no run_id column, not UTF-8) or has nothing to draw is one line naming it, exit 2
    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["plot", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert any(p.endswith("heatmap_sim_time.svg") for p in printed) and all(Path(p).is_file() for p in printed)
    assert main(["report", str(out)]) == 0 and (out / "report.html").is_file()

    bad = tmp_path / "bad"
    bad.mkdir()
    for content, says in ((b"foo,bar\n1,2\n", "no run_id column; columns: foo, bar"),
                          (b"\xff\xfe,x\n", "not UTF-8"),
                          (b"run_id,foo\na,1\n", "no figure applies"),
                          (b"\xef\xbb\xbfrun_id,foo\na,1\n", "no figure applies")):  # a BOM is fine
        (bad / "summary.csv").write_bytes(content)
        capsys.readouterr()
        assert main(["plot", str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and says in err[0] and str(bad) in err[0]
    (bad / "summary.csv").write_bytes(b"foo,bar\n1,2\n")
    assert main(["report", str(bad)]) == 2 and not (bad / "report.html").exists()


def test_emulated_live_run_needs_no_data_files(tmp_path: Path) -> None:
    # rule: the up-front data check skips live points with emulated compute (they read no
    # data): a cifar10 model runs live without --data-dir
    (tmp_path / "s.toml").write_text("""
name = "emulated-live"
backend = "live"
[workload]
dataset = "cifar10"
model = "rudra_cifar"
epochs = 1
samples_per_epoch = 32
[cluster]
learners = 2
minibatch = 8
[cluster.compute]
base_s = 0.001
per_sample_s = 0.0
[protocol]
name = "async"
[live]
compute = "emulated"
""")
    out = tmp_path / "out"
    assert main(["run", str(tmp_path / "s.toml"), "--out", str(out), "--quiet", "--no-report"]) == 0
    rows = read_csv(out / "summary.csv")
    assert len(rows) == 1 and float(rows[0]["measured_time_s"]) > 0


def test_failed_calibration_leaves_no_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture) -> None:
    # rule: a calibration that fails is one line, exit 2, and no (empty) profile file
    from ddlsim.backends import calibrate as cal
    from ddlsim.backends.base import BackendError

    def fail(*a, **k):
        raise BackendError("live run stopped: learner 1 died with signal SIGKILL")

    monkeypatch.setattr(cal, "calibrate", fail)
    out = tmp_path / "p.toml"
    assert main(["calibrate", "--minibatches", "4", "--out", str(out)]) == 2
    assert "SIGKILL" in capsys.readouterr().err and not out.exists()


def test_an_empty_out_is_refused_not_taken_for_the_default(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "s.toml", "--quiet", "--out", ""]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--out '': an empty path names no folder" in err
    assert not (tmp_path / "results").exists()


def test_keep_failed_without_resume_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    assert main(["simulate", str(tmp_path / "s.toml"), "--quiet", "--keep-failed", "--out", str(tmp_path / "o")]) == 2
    assert "--keep-failed without --resume" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_data_dir_no_point_reads_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # digits are embedded: a --data-dir would be silently ignored
    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "o"
    assert main(["run", str(tmp_path / "s.toml"), "--quiet", "--data-dir", str(tmp_path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no point of this sweep reads a data set from files (digits" in err
    assert not out.exists()
