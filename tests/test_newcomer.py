"""What a new user meets on the command line, through the CLI as they run it: the
exit status and the one line, the files and the rows, and no dead ends."""

from __future__ import annotations

import csv
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path


from ddlsim.scenarios.bundled import CATALOGUE
from ddlsim.scenarios.cli.table import duration

CLI = [sys.executable, "-m", "ddlsim"]
SMALL = """
name = "newcomer"
[workload]
epochs = 1
[cluster]
learners = 4
minibatch = 16
[protocol]
name = "async"
"""


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=600, cwd=cwd)


def one_line_error(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddlsim: error: ") and needle in err[0], proc.stderr
    assert "Traceback" not in proc.stderr


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_version_is_the_installed_package_version():
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"ddlsim {version('ddlsim')}"


def test_show_prints_a_bundled_scenario_to_start_from(tmp_path: Path):
    proc = cli("scenarios", "--show", "demo")
    assert proc.returncode == 0
    assert tomllib.loads(proc.stdout) == tomllib.loads((CATALOGUE / "demo.toml").read_text())
    (tmp_path / "my.toml").write_text(proc.stdout.replace('name = "demo"', 'name = "mine"'))
    out = tmp_path / "o"
    assert cli("simulate", str(tmp_path / "my.toml"), "--out", str(out), "--quiet",
               "--set", "workload.epochs=0.2").returncode == 0
    assert len(rows(out / "summary.csv")) == 72 * 3  # 72 configurations, 3 replicates (seeds) each
    one_line_error(cli("scenarios", "--show", "nope"), "--show nope: no bundled scenario of that name")
    assert "scenarios --show demo > my.toml" in cli("scenarios").stdout


def test_help_says_what_every_argument_is():
    for args, needles in ((["run", "--help"], ["--jobs", "default: none, in-process", "--download"]),
                          (["trace", "--help"], ["a trace.ddlt"]),
                          (["replay", "--help"], ["--scenario", "--point"]),
                          (["validate", "--help"], ["--resume", "--force", "--device", "there is no --jobs"]),
                          (["calibrate", "--help"], ["--model", "--dataset", "--device"])):
        text = cli(*args).stdout
        for n in needles:
            assert n in text, (args, n)


def test_empty_scenario_file_is_refused_with_a_way_forward(tmp_path: Path):
    (tmp_path / "my.toml").write_text("")
    one_line_error(cli("simulate", str(tmp_path / "my.toml"), "--out", str(tmp_path / "o")),
                   "the scenario file is empty")
    assert not (tmp_path / "o").exists()


def test_bundled_name_wins_over_a_results_folder_of_that_name(tmp_path: Path):
    (tmp_path / "demo").mkdir()
    proc = cli("simulate", "demo", "--out", str(tmp_path / "o"), "--quiet", "--set", "workload.epochs=0.1",
               "--set", "cluster.learners=4", "--set", "cluster.minibatch=8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert len(rows(tmp_path / "o" / "summary.csv")) == 6 * 3  # the demo runs 3 seeds of each configuration


def test_a_second_sweep_into_a_folder_is_refused_then_with_force_leaves_only_its_own_run_folders(tmp_path: Path):
    (tmp_path / "s.toml").write_text(SMALL + '[sweep]\n"cluster.learners" = [2, 4, 8]\n')
    out = tmp_path / "o"
    assert cli("simulate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet",
               "--set", "cluster.minibatch=[8,16]").returncode == 0
    assert len(list((out / "runs").iterdir())) == 6
    before = (out / "summary.csv").read_bytes()
    proc = cli("simulate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet")
    assert proc.returncode == 2 and "would delete 3 runs" in proc.stderr and "--force" in proc.stderr
    assert (out / "summary.csv").read_bytes() == before and len(list((out / "runs").iterdir())) == 6
    assert cli("simulate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet", "--force").returncode == 0
    listed = {r["run_id"] for r in rows(out / "summary.csv")}
    assert len(listed) == 3 and {p.name for p in (out / "runs").iterdir()} == listed


def test_durations_in_the_unit_a_reader_wants():
    assert [duration(v) for v in (0.5, 59.0, 90.0, 3600.0, 1.73e5)] == ["0.5 s", "59 s", "1.5 min", "1 h", "48.1 h"]


def test_failed_point_says_failed_in_the_first_result_column(tmp_path: Path, capsys):
    from ddlsim.scenarios.cli.table import SIM_TABLE, print_table

    recs = [{"row": {"run_id": "a", "protocol": "async", "learners": 4, "minibatch": 8, "error": "boom"}},
            {"row": {"run_id": "b", "protocol": "async", "learners": 8, "minibatch": 8, "error": None,
                     "sim_time_s": 7200.0}}]
    print_table(recs, SIM_TABLE)
    lines = capsys.readouterr().out.splitlines()
    head, failed, ok = lines[0], lines[1], lines[2]
    col = head.index("time")
    assert failed[col:].startswith("FAILED") and failed.split()[2:4] == ["4", "8"]
    assert ok[col:].startswith("2 h") and "run a failed: boom" in lines[-1]


def test_empty_data_dir_fails_before_any_simulation(tmp_path: Path):
    (tmp_path / "s.toml").write_text(SMALL.replace("epochs = 1", 'epochs = 1\ndataset = "mnist"')
                                     + '[sweep]\n"cluster.learners" = [2, 4]\n')
    (tmp_path / "data").mkdir()
    out = tmp_path / "o"
    proc = cli("run", str(tmp_path / "s.toml"), "--out", str(out), "--data-dir", str(tmp_path / "data"))
    one_line_error(proc, "mnist")
    assert not list(out.glob("runs/*/result.json"))  # nothing simulated


def test_replay_command_turns_any_trace_into_a_results_folder(tmp_path: Path):
    # truth: `ddlsim run` of the same point (its curves are the replay of the same trace)
    (tmp_path / "s.toml").write_text(SMALL)
    ran = tmp_path / "ran"
    assert cli("run", str(tmp_path / "s.toml"), "--out", str(ran), "--quiet", "--traces", "--no-report",
               "--device", "cpu").returncode == 0
    trace = next(ran.glob("runs/*/trace.ddlt"))
    out = tmp_path / "rep"
    proc = cli("replay", str(trace), "--scenario", str(tmp_path / "s.toml"), "--out", str(out), "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert f"report: {out / 'report.html'}" in proc.stdout and "figures:" in proc.stdout
    a, b = rows(ran / "curves.csv"), rows(out / "curves.csv")
    strip = lambda rs: [(r["epoch"], r["updates"], r["sim_time_s"], r["test_error"], r["train_loss"]) for r in rs]  # noqa: E731
    assert strip(a) == strip(b)
    summary = rows(out / "summary.csv")
    assert len(summary) == 1 and summary[0]["final_test_error"] == rows(ran / "summary.csv")[0]["final_test_error"]
    assert cli("plot", str(out)).returncode == 0 and cli("report", str(out)).returncode == 0
    one_line_error(cli("replay", str(trace), "--out", str(tmp_path / "x")), "pass --scenario FILE")
    one_line_error(cli("replay", str(trace), "--scenario", str(tmp_path / "s.toml"), "--point", "3",
                       "--out", str(tmp_path / "x")), "--point 3: the sweep has 1 points")


def test_plot_and_report_name_a_summary_that_is_not_a_regular_file(tmp_path: Path):
    (tmp_path / "summary.csv").mkdir()  # a folder where the summary should be
    for command in ("plot", "report"):
        one_line_error(cli(command, str(tmp_path)), "summary.csv: not a regular file")
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "figures").exists()
