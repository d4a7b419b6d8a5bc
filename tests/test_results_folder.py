"""No file lost or replaced without a word: what ddlsim deletes and overwrites in a results
folder, through the CLI as a user runs it. The truth each test holds to is the user's own
files, byte for byte, before and after."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from ddlsim.scenarios.cli import main
from ddlsim.scenarios.runner import write_tables
from ddlsim.simulator.results_folder import MANIFEST, ResultsFolder

SCENARIO = """
name = "folder"
[workload]
epochs = 0.3
[cluster]
learners = 2
minibatch = 8
[protocol]
name = "async"
"""
SWEEP = SCENARIO + '[sweep]\n"cluster.minibatch" = [8, 16]\n'


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """Exit status and stderr of one ``ddlsim`` command run in-process."""
    rc = main(list(args) + ["--quiet"] if args[0] in ("simulate", "run") else list(args))
    return rc, capsys.readouterr().err


def refused(rc: int, err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert rc == 2 and len(lines) == 1 and lines[0].startswith("ddlsim: error: "), err
    assert all(n in lines[0] for n in needles), err


def snapshot(root: Path) -> dict[str, bytes]:
    """Every regular file under ``root`` (links not followed) and its bytes."""
    out = {}
    for d, _, names in os.walk(root):
        for n in names:
            p = Path(d) / n
            if not p.is_symlink():
                out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    (tmp_path / "s.toml").write_text(SWEEP)
    return tmp_path / "s.toml"


def test_a_copied_scenario_writes_into_a_folder_named_after_its_file(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", "demo", "--quiet", "--set", "workload.epochs=0.1", "--set", "cluster.learners=2",
                 "--set", "cluster.minibatch=8"]) == 0
    demo = snapshot(tmp_path / "results" / "demo")
    text = (Path(__file__).parents[1] / "scenarios" / "catalogue" / "demo.toml").read_text()
    (tmp_path / "my.toml").write_text(text)  # `ddlsim scenarios --show demo > my.toml`: still name = "demo"
    assert main(["simulate", "my.toml", "--quiet", "--set", "workload.epochs=0.1", "--set", "cluster.learners=4",
                 "--set", "cluster.minibatch=8"]) == 0
    assert snapshot(tmp_path / "results" / "demo") == demo
    assert len(list((tmp_path / "results" / "my" / "runs").iterdir())) == 6 * 3  # the demo's 3 seeds each


def test_a_summary_csv_of_the_users_is_never_replaced(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "mine"
    out.mkdir()
    (out / "summary.csv").write_text("x,y\n1,2\n")
    before = snapshot(out)
    for cmd in (["simulate"], ["run", "--resume", "--no-report"]):
        refused(*run(capsys, *cmd, str(scenario), "--out", str(out)), "summary.csv", "did not write", "--force")
        assert snapshot(out) == before
    assert run(capsys, "simulate", str(scenario), "--out", str(out), "--force")[0] == 0
    assert "run_id" in (out / "summary.csv").read_text()


def test_the_users_files_in_out_survive_every_run(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "o"
    (out / "runs" / "exp1").mkdir(parents=True)
    (out / "runs" / "exp1" / "model.pt").write_bytes(b"weights")
    (out / "runs" / "exp1" / "result.json").write_text("{}")  # looks like a run folder; is the user's
    (out / "notes").mkdir()
    (out / "notes" / ".draft.tmp").write_text("draft")
    (out / ".summary.csv.x.tmp").write_text("not ddlsim's either")
    mine = snapshot(out)
    assert run(capsys, "simulate", str(scenario), "--out", str(out))[0] == 0
    assert run(capsys, "simulate", str(scenario), "--out", str(out), "--set", "cluster.minibatch=8", "--force")[0] == 0
    after = snapshot(out)
    assert {k: after.get(k) for k in mine} == mine
    assert len([r for r in csv.DictReader(open(out / "summary.csv"))]) == 1


def test_a_killed_writes_temporaries_go_and_the_users_stay(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "o"
    assert run(capsys, "simulate", str(scenario), "--out", str(out))[0] == 0
    fd, name = tempfile.mkstemp(dir=out, prefix=".summary.csv.ddlsim-", suffix=".tmp")  # as atomic_write names it
    os.write(fd, b"half")  # and leaves it when killed mid-write
    os.close(fd)
    left = Path(name)
    theirs = out / ".notes.tmp"
    theirs.write_text("mine")
    backup = out / ".summary.csv.20241201.tmp"  # the user's backup, named much like a temporary
    backup.write_text("mine too")
    assert run(capsys, "simulate", str(scenario), "--out", str(out), "--resume")[0] == 0
    assert not left.exists() and theirs.read_text() == "mine" and backup.read_text() == "mine too"


def test_nothing_is_written_or_deleted_through_a_symbolic_link(tmp_path: Path, scenario: Path, capsys) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "thesis.tex").write_text("chapter 1")
    out = tmp_path / "o"
    out.mkdir()
    (out / "runs").symlink_to(outside)
    refused(*run(capsys, "simulate", str(scenario), "--out", str(out)), "symbolic link")
    assert snapshot(outside) == {"thesis.tex": b"chapter 1"} and sorted(os.listdir(out)) == ["runs"]
    # a run folder that is a link, met by --resume
    out2 = tmp_path / "o2"
    assert run(capsys, "simulate", str(scenario), "--out", str(out2))[0] == 0
    run_dir = next((out2 / "runs").iterdir())
    (tmp_path / "moved").mkdir()
    for f in run_dir.iterdir():
        f.rename(tmp_path / "moved" / f.name)
    run_dir.rmdir()
    run_dir.symlink_to(tmp_path / "moved")
    (tmp_path / "moved" / "result.json").unlink()  # so the point is recomputed, through the link
    moved = snapshot(tmp_path / "moved")
    refused(*run(capsys, "simulate", str(scenario), "--out", str(out2), "--resume"), "symbolic link")
    assert snapshot(tmp_path / "moved") == moved


def test_calibrate_refuses_a_dangling_link_and_keeps_it(tmp_path: Path, capsys) -> None:
    link = tmp_path / "profile.toml"
    link.symlink_to(tmp_path / "elsewhere" / "p.toml")
    refused(*run(capsys, "calibrate", "--out", str(link), "--no-network"), "symbolic link")
    assert link.is_symlink() and not (tmp_path / "elsewhere").exists()
    notes = tmp_path / "notes.toml"
    notes.write_text("my notes\n")
    refused(*run(capsys, "calibrate", "--out", str(notes), "--no-network"), "not a profile ddlsim wrote")
    assert notes.read_text() == "my notes\n"


def test_a_simulation_does_not_drop_a_replays_accuracy(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "o"
    assert run(capsys, "run", str(tmp_path / "s.toml"), "--out", str(out), "--no-report", "--device", "cpu")[0] == 0
    curves = (out / "curves.csv").read_bytes()
    assert curves.count(b"\n") > 2
    refused(*run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(out)), "replay results", "--force")
    assert (out / "curves.csv").read_bytes() == curves
    # a simulation that keeps the stored result (--resume) drops nothing, and is allowed
    assert run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(out), "--resume")[0] == 0
    assert (out / "curves.csv").read_bytes() == curves


def test_changed_points_of_the_same_name_are_not_replaced_silently(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "o"
    assert run(capsys, "simulate", str(scenario), "--out", str(out))[0] == 0
    before = snapshot(out)
    refused(*run(capsys, "simulate", str(scenario), "--out", str(out), "--set", "seed=7"), "would delete 2 runs")
    assert snapshot(out) == before
    # the same sweep again recomputes the same numbers: allowed, and the tables are the same
    assert run(capsys, "simulate", str(scenario), "--out", str(out))[0] == 0
    assert (out / "summary.csv").read_text().count("\n") == before["summary.csv"].decode().count("\n")


def test_stale_figures_go_with_the_runs_they_describe(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "o"
    assert run(capsys, "simulate", str(scenario), "--out", str(out), "--report")[0] == 0
    drawn = sorted(p.name for p in (out / "figures").iterdir())
    assert drawn and (out / "report.html").is_file()
    (out / "figures" / "my-own.png").write_bytes(b"user's")
    assert run(capsys, "simulate", str(scenario), "--out", str(out), "--set", "cluster.minibatch=8", "--force")[0] == 0
    assert sorted(p.name for p in (out / "figures").iterdir()) == ["my-own.png"]
    assert not (out / "report.html").exists()
    rc = main(["plot", str(out)])
    assert rc == 0 and "my-own.png" in os.listdir(out / "figures")


def test_one_writer_per_folder(tmp_path: Path, scenario: Path) -> None:
    out = tmp_path / "o"
    with ResultsFolder.open(out):  # another ddlsim, writing
        proc = subprocess.run([sys.executable, "-m", "ddlsim", "simulate", str(scenario), "--out", str(out),
                               "--quiet"], capture_output=True, text=True, timeout=300)
    refused(proc.returncode, proc.stderr, "another ddlsim command is writing into this folder")
    assert not (out / "summary.csv").exists()


def test_resume_with_traces_does_not_keep_another_points_trace(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO + '[sweep]\n"cluster.learners" = [2, 3]\n')
    out = tmp_path / "o"
    assert run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(out), "--traces")[0] == 0
    a, b = sorted((out / "runs").iterdir())
    ta, tb = (a / "trace.ddlt").read_bytes(), (b / "trace.ddlt").read_bytes()
    assert ta != tb
    (a / "trace.ddlt").write_bytes(tb)  # a's folder now holds b's (valid) trace
    rc = main(["simulate", str(tmp_path / "s.toml"), "--out", str(out), "--traces", "--resume"])
    err = capsys.readouterr().err
    assert rc == 0 and "1 another simulation's trace" in err
    assert (a / "trace.ddlt").read_bytes() == ta


def test_a_crafted_column_name_reaches_summary_csv_as_text(tmp_path: Path) -> None:
    with ResultsFolder.open(tmp_path):
        write_tables(tmp_path, [{"row": {"run_id": "r", '=HYPERLINK("x")': 1}, "curves": []}])
    header = next(csv.reader(open(tmp_path / "summary.csv")))
    assert "'=HYPERLINK(\"x\")" in header and not any(h.startswith("=") for h in header)


def test_the_manifest_lists_only_what_ddlsim_wrote(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "o"
    assert run(capsys, "simulate", str(scenario), "--out", str(out), "--report")[0] == 0
    files = set(json.loads((out / MANIFEST).read_text())["files"])
    on_disk = {f for f in snapshot(out) if f != MANIFEST}
    assert on_disk <= files
    assert {"summary.csv", "curves.csv", "scenario.json", "report.html"} <= files


def test_python_dash_m_ddlsim_is_the_command() -> None:
    proc = subprocess.run([sys.executable, "-m", "ddlsim", "--version"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.startswith("ddlsim ")


def test_a_warning_is_one_line_without_a_source_location(simulated_results: Path, capsys) -> None:
    rows = list(csv.reader(open(simulated_results / "summary.csv", newline="")))
    rows[1][rows[0].index("sim_time_s")] = "1" + "0" * 400  # too large for a float: read as missing
    with open(simulated_results / "summary.csv", "w", newline="") as f:
        csv.writer(f).writerows(rows)
    proc = subprocess.run([sys.executable, "-m", "ddlsim", "plot", str(simulated_results)], capture_output=True,
                          text=True, timeout=300)  # (pytest would record the warning, not print it)
    assert proc.returncode == 0, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert err and all(e.startswith("ddlsim: warning: ") and ".py:" not in e for e in err), err


def test_advise_deletes_nothing_through_a_link(tmp_path: Path, capsys) -> None:
    victim = tmp_path / "victim"
    victim.mkdir()
    args = ["advise", "demo", "--quiet", "--budget-s", "1", "--replay", "1", "--device", "cpu", "--set",
            "workload.epochs=0.1", "--set", "cluster.learners=2", "--set", "cluster.minibatch=8",
            "--set", "replicates=1"]
    assert main(args + ["--out", str(tmp_path / "a1")]) in (0, 1)
    for rid in os.listdir(tmp_path / "a1" / "replay" / "runs"):
        (victim / rid).mkdir()
        (victim / rid / "result.json").write_text("precious")
    before = snapshot(victim)
    capsys.readouterr()
    for link in ("replay/runs", "replay"):  # a link at either level below --out
        out = tmp_path / f"a-{link.replace('/', '-')}"
        (out / link).parent.mkdir(parents=True, exist_ok=True)
        (out / link).symlink_to(victim)
        refused(main(args + ["--out", str(out)]), capsys.readouterr().err, "symbolic link")
        assert snapshot(victim) == before


def test_a_replay_of_another_trace_does_not_replace_the_first(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO + '[sweep]\n"seed" = [0, 1]\n')
    assert run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / "sim"), "--traces")[0] == 0
    a, b = sorted((tmp_path / "sim" / "runs").glob("*/trace.ddlt"))
    out = tmp_path / "r"
    common = ["--scenario", str(tmp_path / "s.toml"), "--out", str(out), "--device", "cpu", "--no-report"]
    assert main(["replay", str(a)] + common) == 0
    before = snapshot(out)
    capsys.readouterr()
    refused(main(["replay", str(b)] + common), capsys.readouterr().err, "replace 1 runs")
    assert snapshot(out) == before


def test_run_resume_after_simulate_replays(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    out = tmp_path / "o"
    assert run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(out))[0] == 0
    assert run(capsys, "run", str(tmp_path / "s.toml"), "--out", str(out), "--resume", "--no-report",
               "--device", "cpu")[0] == 0
    (row,) = csv.DictReader(open(out / "summary.csv", newline=""))
    assert row["final_test_error"] not in ("", None)


def test_figures_are_not_written_through_a_linked_figures_folder(simulated_results: Path, tmp_path: Path,
                                                                  capsys) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    figs = simulated_results / "figures"
    if figs.exists():
        import shutil

        shutil.rmtree(figs)
    figs.symlink_to(elsewhere)
    refused(main(["plot", str(simulated_results)]), capsys.readouterr().err, "symbolic link")
    assert list(elsewhere.iterdir()) == []


def test_an_interrupted_first_sweep_does_not_block_the_next(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "o"
    with ResultsFolder.open(out) as folder:  # what a first sweep records before its runs complete
        folder.runs["never-ran"] = {"hash": "x", "backend": None}
        folder.claim(["runs/never-ran/staleness.csv"])
    assert run(capsys, "simulate", str(scenario), "--out", str(out))[0] == 0
    assert "never-ran" not in json.loads((out / MANIFEST).read_text())["runs"]


def test_the_manifest_is_not_a_report_target(simulated_results: Path, capsys) -> None:
    for force in ([], ["--force"]):
        refused(main(["report", str(simulated_results), "--out", str(simulated_results / MANIFEST)] + force),
                capsys.readouterr().err, "a report is one HTML file")
    # and below the command, the folder refuses any writer its record (a report named like one included)
    from ddlsim.simulator.results_folder import ResultsFolder
    with ResultsFolder.open(simulated_results, force=True) as folder, pytest.raises(OSError, match="record of this"):
        folder.claim([".ddlsim/manifest.html"])
    assert json.loads((simulated_results / MANIFEST).read_text())["files"]


def test_a_figure_of_yours_is_refused_before_the_sweep_runs(tmp_path: Path, scenario: Path, capsys) -> None:
    out = tmp_path / "o"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "pareto.png").write_bytes(b"mine")
    refused(*run(capsys, "simulate", str(scenario), "--out", str(out), "--report"), "figures/pareto.png")
    assert not (out / "summary.csv").exists() and (out / "figures" / "pareto.png").read_bytes() == b"mine"


def test_replay_refuses_a_scenario_point_the_trace_did_not_run(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)  # async, 2 learners
    assert run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / "sim"), "--traces")[0] == 0
    (trace,) = (tmp_path / "sim" / "runs").glob("*/trace.ddlt")
    common = ["--out", str(tmp_path / "r"), "--device", "cpu", "--no-report"]
    refused(main(["replay", str(trace), "--scenario", str(tmp_path / "s.toml"), "--set", "cluster.learners=4"]
                 + common), capsys.readouterr().err, "the trace ran async with 2", "is async with 4")
    assert not (tmp_path / "r" / "summary.csv").exists()
    assert main(["replay", str(trace), "--scenario", str(tmp_path / "s.toml")] + common) == 0


def test_replay_of_a_trace_of_the_same_name_with_other_content_is_refused(tmp_path: Path, capsys,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from ddlsim.simulator import trace as trace_io

    (tmp_path / "s.toml").write_text(SCENARIO)
    assert run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / "sim"), "--traces")[0] == 0
    (a,) = (tmp_path / "sim" / "runs").glob("*/trace.ddlt")
    t = trace_io.read(a)  # the same run id and run folder name, every time doubled: another trace
    t.ops = {k: (v * 2 if k in ("t_start", "t_end") else v).copy() for k, v in t.ops.items()}
    b = tmp_path / "other" / a.parent.name / "trace.ddlt"
    b.parent.mkdir(parents=True)
    trace_io.write(t, b)
    monkeypatch.chdir(tmp_path)
    common = ["--scenario", str(tmp_path / "s.toml"), "--device", "cpu", "--no-report"]
    assert main(["replay", str(a)] + common) == 0
    out = tmp_path / "results" / f"replay-{a.parent.name}"  # the default folder --help names
    before = snapshot(out)
    capsys.readouterr()
    refused(main(["replay", str(b)] + common), capsys.readouterr().err, "replace 1 runs")
    assert snapshot(out) == before
    assert main(["replay", str(a)] + common) == 0  # the same trace again replaces its own results


def test_a_report_of_yours_is_refused_before_a_replay_runs(tmp_path: Path, capsys) -> None:
    (tmp_path / "s.toml").write_text(SCENARIO)
    assert run(capsys, "simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / "sim"), "--traces")[0] == 0
    (trace,) = (tmp_path / "sim" / "runs").glob("*/trace.ddlt")
    out = tmp_path / "r"
    out.mkdir()
    (out / "report.html").write_text("mine")
    refused(main(["replay", str(trace), "--scenario", str(tmp_path / "s.toml"), "--out", str(out), "--device", "cpu"]),
            capsys.readouterr().err, "report.html")
    assert sorted(p.name for p in out.iterdir()) == ["report.html"] and (out / "report.html").read_text() == "mine"
