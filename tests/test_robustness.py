"""Faults, corrupt files and hostile input: resume that verifies, one line for every bad
input (no traceback), files checked before they are read or written, live runs that leave
nothing behind."""

from __future__ import annotations

import csv
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddlsim.scenarios import runner
from ddlsim.scenarios.load import load_text

SWEEP = """
name = "robust"
seed = 1
[workload]
epochs = 1
[cluster]
learners = 4
minibatch = 8
[protocol]
name = "async"
[sweep]
"cluster.learners" = [2, 3, 4]
"protocol.name" = ["hardsync", "async"]
"""


def cli(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddlsim", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def one_line(proc: subprocess.CompletedProcess, needle: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-800:])
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddlsim: error: ") and needle in err[0], proc.stderr
    assert "Traceback" not in proc.stderr


def summary_without_wall(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]


# -- resume that verifies ------------------------------------------------------------------------
def test_a_disk_full_run_then_resume_equals_an_uninterrupted_run(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import ddlsim.simulator.run as simrun

    scenario = load_text(SWEEP)
    runner.run_sweep(scenario, tmp_path / "clean", jobs=1, progress=False, traces=True)
    real = simrun.simulate

    def full(point, engine="auto", keep_trace=True):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(simrun, "simulate", full)
    failed = runner.run_sweep(scenario, tmp_path / "full", jobs=1, progress=False, traces=True)
    assert all("No space left" in r["row"]["error"] for r in failed)
    monkeypatch.setattr(simrun, "simulate", real)
    runner.run_sweep(scenario, tmp_path / "full", jobs=1, progress=False, resume=True, traces=True)
    assert summary_without_wall(tmp_path / "full" / "summary.csv") == \
        summary_without_wall(tmp_path / "clean" / "summary.csv")


@pytest.mark.parametrize("damage", ["garbage", "list", "hash only", "empty row", "deep", "edited number",
                                    "no staleness", "garbage trace", "no trace", "directory result"])
def test_resume_recomputes_exactly_the_damaged_point(tmp_path: Path, damage: str,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = load_text(SWEEP)
    records = runner.run_sweep(scenario, tmp_path, jobs=1, progress=False, traces=True)
    victim = records[3]["row"]["run_id"]
    run_dir = tmp_path / "runs" / victim
    result = run_dir / "result.json"
    stored = json.loads(result.read_text())
    if damage == "garbage":
        result.write_bytes(b"\x00\xffnot json")
    elif damage == "list":
        result.write_text("[1, 2, 3]")
    elif damage == "hash only":
        result.write_text(json.dumps({"hash": stored["hash"]}))
    elif damage == "empty row":
        result.write_text(json.dumps({"hash": stored["hash"], "row": {}, "curves": []}))
    elif damage == "deep":
        result.write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "edited number":
        stored["row"]["sim_time_s"] *= 2
        result.write_text(json.dumps(stored))
    elif damage == "no staleness":
        (run_dir / "staleness.csv").unlink()
    elif damage == "garbage trace":
        (run_dir / "trace.ddlt").write_bytes(b"DDLTRACE garbage")
    elif damage == "no trace":
        (run_dir / "trace.ddlt").unlink()
    elif damage == "directory result":
        result.unlink()
        result.mkdir()
    (tmp_path / ".summary.csv.ddlsim-x1y2z3w4.tmp").write_text("left by a killed write")  # as atomic_write names it
    ran: list[str] = []
    real = runner.run_tasks
    monkeypatch.setattr(runner, "run_tasks",
                        lambda tasks: (ran.extend(p["_id"] for t in tasks for p in t.points), real(tasks))[1])
    if damage == "directory result":
        import shutil

        shutil.rmtree(result)
    again = runner.run_sweep(scenario, tmp_path, jobs=1, progress=False, resume=True, traces=True)
    assert ran == [victim]
    assert [r["row"]["run_id"] for r in again] == [r["row"]["run_id"] for r in records]
    assert not list(tmp_path.glob(".*.tmp"))
    from ddlsim.simulator import trace as T

    T.read(run_dir / "trace.ddlt")  # regenerated and valid


# -- bad input: one line, exit 2 -----------------------------------------------------------------
def test_bom_scenario_is_accepted(tmp_path: Path) -> None:
    f = tmp_path / "bom.toml"
    f.write_bytes(b"\xef\xbb\xbf" + b'name = "bom"\n[workload]\nepochs = 0.2\n')
    assert cli("simulate", str(f), "--out", str(tmp_path / "o"), "--quiet").returncode == 0


def test_control_characters_in_names_are_escaped(tmp_path: Path) -> None:
    proc = cli("simulate", str(tmp_path / "no\nsuch\x1b[31m.toml"))
    one_line(proc, "no\\nsuch\\x1b[31m.toml")


@pytest.mark.parametrize("text, needle", [
    ('"cluster.learners" = 8\n[cluster]\nlearners = 4\n', "key 'cluster.learners' is set twice"),
    ("[optimizer]\nlr = 3.5e38\n", "key 'optimizer.lr' = 3.5e+38"),
    ("[live]\nfail_learner = 9\n", "key 'live.fail_learner' = 9"),
])
def test_invalid_values_are_one_line(tmp_path: Path, text: str, needle: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text(text)
    one_line(cli("simulate", str(f), "--out", str(tmp_path / "o")), needle)


def test_scheduler_without_dask_is_refused() -> None:
    one_line(cli("simulate", "demo", "--scheduler", "tcp://127.0.0.1:1"), "only with --executor dask")


def test_a_sweep_above_the_size_limit_needs_force(tmp_path: Path) -> None:
    out = tmp_path / "o"
    one_line(cli("simulate", "demo", "--out", str(out), "--set", "workload.epochs=1e6"), "--force")
    assert not out.exists()  # refused before any work
    one_line(cli("simulate", "demo", "--out", str(out), "--set", "cluster.stragglers.stall_rate_per_s=1e6",
                 "--set", "cluster.stragglers.stall_mean_s=1e6"), "stalled")


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_a_profile_that_is_not_a_regular_file_is_one_line(tmp_path: Path, special: str) -> None:
    if special == "fifo":
        special = str(tmp_path / "fifo")
        os.mkfifo(special)
    f = tmp_path / "s.toml"
    f.write_text(f'[cluster.compute]\nprofile = "{special}"\n')
    one_line(cli("simulate", str(f), "--out", str(tmp_path / "o"), timeout=30), "not a regular file")


def test_outputs_refuse_symlinks_and_devices(tmp_path: Path, simulated_results: Path) -> None:
    target = tmp_path / "precious.html"
    target.write_text("keep me")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    one_line(cli("report", str(tmp_path / "r"), "--out", str(link)), "symbolic link")
    assert target.read_text() == "keep me" and link.is_symlink()
    os.mkfifo(tmp_path / "pipe.html")  # a report-named target that is not a regular file
    one_line(cli("report", str(tmp_path / "r"), "--out", str(tmp_path / "pipe.html")), "not a regular file")
    one_line(cli("report", str(tmp_path / "r"), "--out", "/dev/null"), "a report is one HTML file")


def test_tables_with_a_bom_or_a_huge_field_are_handled(tmp_path: Path, simulated_results: Path) -> None:
    out = simulated_results
    summary = out / "summary.csv"
    summary.write_bytes(b"\xef\xbb\xbf" + summary.read_bytes())
    assert cli("report", str(out), "--out", str(tmp_path / "a.html")).returncode == 0
    text = summary.read_text(encoding="utf-8-sig").splitlines()
    text[1] = text[1] + ',"' + "x" * 200_000 + '"'
    summary.write_text("\n".join(text) + "\n")
    proc = cli("report", str(out), "--out", str(tmp_path / "b.html"))
    assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr


def test_spreadsheet_formulas_are_neutralised_in_summary_csv(tmp_path: Path) -> None:
    out = tmp_path / "r"
    proc = cli("simulate", "demo", "--out", str(out), "--quiet", "--set", "workload.epochs=0.2",
               "--set", 'name="=HYPERLINK(1)"', "--set", 'cluster.compute.profile=["@SUM(A1)"]')
    assert proc.returncode == 2  # (that profile does not exist: refused)
    f = tmp_path / "s.toml"
    f.write_text(SWEEP.replace('"protocol.name" = ["hardsync", "async"]', '"description" = ["=HYPERLINK(x)", "ok"]'))
    assert cli("simulate", str(f), "--out", str(out), "--quiet").returncode == 0
    cells = {r["description"] for r in csv.DictReader(open(out / "summary.csv", newline=""))}
    assert cells == {"'=HYPERLINK(x)", "ok"}


# -- live runs that leave nothing behind ----------------------------------------------------------
@pytest.mark.live
@pytest.mark.parametrize("after", [1.0, 3.0, 6.0])
def test_sigkill_of_the_parent_leaves_no_live_process_and_no_scratch_folder(tmp_path: Path, after: float) -> None:
    import tempfile

    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("ddlsim-live-*"))
    proc = subprocess.Popen([sys.executable, "-m", "ddlsim", "run", "validate-grid", "--backend", "live",
                             "--set", "cluster.learners=3", "--set", 'protocol.name="async"', "--set",
                             "cluster.stragglers.fraction=0.0", "--set", "workload.epochs=40", "--out",
                             str(tmp_path / "o"), "--quiet", "--jobs", "1"], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(after)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    time.sleep(5)
    alive = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert alive == []
    assert set(scratch.glob("ddlsim-live-*")) - before == set()
