"""The sweep runner: atomic results, resume after SIGKILL, failures recorded, Dask = local."""

from __future__ import annotations

import csv
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
name = "resume-test"
[workload]
epochs = {epochs}
[cluster]
learners = 8
minibatch = 4
[protocol]
name = "async"
[sweep]
"cluster.learners" = [2, 4, 6, 8, 10, 12]
"protocol.name" = ["async", "hardsync"]
"""


def rows(path: Path) -> list[dict[str, str]]:
    with open(path / "summary.csv", newline="") as f:
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]


def test_sweep_killed_with_sigkill_resumes_to_the_same_rows(tmp_path: Path) -> None:
    # Truth: an uninterrupted sweep of the same scenario (runs are deterministic).
    scen = tmp_path / "s.toml"
    scen.write_text(SWEEP.format(epochs=40))
    full, cut = tmp_path / "full", tmp_path / "cut"
    cmd = [sys.executable, "-m", "ddlsim", "simulate", str(scen), "--quiet", "--jobs", "1"]
    subprocess.run(cmd + ["--out", str(full)], check=True, capture_output=True)
    proc = subprocess.Popen(cmd + ["--out", str(cut)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while len(list(cut.glob("runs/*/result.json"))) < 3 and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(list(cut.glob("runs/*/result.json")))
    assert 3 <= done < 12, "the kill must land mid-sweep"
    # summary.csv holds the completed points (a kill between a point's result.json and the
    # rewrite of summary.csv leaves that one point out until the resume)
    assert len(rows(cut)) in (done - 1, done)
    res = subprocess.run(cmd + ["--out", str(cut), "--resume"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert rows(cut) == rows(full)
    assert not list(cut.glob("runs/*/.*.tmp"))  # no half-written file left behind


def test_a_failing_point_is_recorded_and_the_others_complete(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import ddlsim.simulator.run as simrun

    real = simrun.simulate

    def flaky(point, engine="auto", keep_trace=True):
        if point["cluster"]["learners"] == 6:
            raise RuntimeError("injected failure\nsecond line")
        return real(point, engine, keep_trace)

    monkeypatch.setattr(simrun, "simulate", flaky)
    scenario = load_text(SWEEP.format(epochs=1))
    records = runner.run_sweep(scenario, tmp_path, jobs=1, progress=False)
    errors = {r["row"]["learners"]: r["row"]["error"] for r in records}
    assert errors[6] == "RuntimeError: injected failure"
    assert all(e is None for k, e in errors.items() if k != 6)
    table = rows(tmp_path)
    assert len(table) == 12 and sum(bool(r["error"]) for r in table) == 2
    # a resume keeps what succeeded; --keep-failed keeps the failures, a plain resume retries them
    monkeypatch.setattr(simrun, "simulate", real)
    kept = runner.run_sweep(scenario, tmp_path, jobs=1, progress=False, resume=True, keep_failed=True)
    assert sum(r["row"]["error"] is not None for r in kept) == 2
    again = runner.run_sweep(scenario, tmp_path, jobs=1, progress=False, resume=True)
    assert [r["row"]["run_id"] for r in again] == [r["row"]["run_id"] for r in records]
    assert all(r["row"]["error"] is None for r in again)


def test_dask_executor_gives_the_same_rows_as_local_processes(tmp_path: Path) -> None:
    pytest.importorskip("distributed")
    scenario = load_text(SWEEP.format(epochs=1).replace("[2, 4, 6, 8, 10, 12]", "[2, 4]"))
    runner.run_sweep(scenario, tmp_path / "local", jobs=2, progress=False, traces=True)
    runner.run_sweep(scenario, tmp_path / "dask", jobs=2, progress=False, executor="dask", traces=True)
    assert rows(tmp_path / "local") == rows(tmp_path / "dask")
    for r in rows(tmp_path / "local"):
        t = f"runs/{r['run_id']}/trace.ddlt"
        assert (tmp_path / "local" / t).read_bytes() == (tmp_path / "dask" / t).read_bytes()


def test_sigterm_stops_a_parallel_sweep_promptly_and_keeps_what_finished(tmp_path: Path) -> None:
    # Truth: the stored result.json files are the completed points; after SIGTERM the command
    # exits 130 within seconds, summary.csv lists exactly those points and no worker survives.
    scen = tmp_path / "s.toml"
    scen.write_text(SWEEP.format(epochs=60))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "ddlsim", "simulate", str(scen), "--quiet",
                             "--jobs", "2", "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while len(list(out.glob("runs/*/result.json"))) < 2 and time.time() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=60)  # a liveness bound, not a speed check
    assert proc.returncode == 130
    assert b"interrupted; completed runs are kept" in err
    done = {p.parent.name for p in out.glob("runs/*/result.json")}
    assert {r["run_id"] for r in rows(out)} == done and len(done) < 12


def test_each_distinct_simulation_and_replay_runs_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # truth: the demo's 6 points at λ = 30, μ = 8 are 3 simulations (the learning-rate policy is not simulated)
    # and 5 replays (hardsync has σ = 0: per_gradient is its constant policy); rows stay 6
    import ddlsim.simulator.run as simrun
    from ddlsim.backends.replay import ReplayBackend
    from ddlsim.scenarios.bundled import resolve_scenario
    from ddlsim.scenarios.load import load

    sims, replays = [], []
    real_sim, real_run = simrun.simulate, ReplayBackend.run
    monkeypatch.setattr(simrun, "simulate", lambda p, engine="auto", keep_trace=True: (sims.append(p["_id"]),
                                                                     real_sim(p, engine, keep_trace))[1])
    monkeypatch.setattr(ReplayBackend, "run", lambda self, t, p, o=None: (replays.append(p["_id"]),
                                                                           real_run(self, t, p, o))[1])
    scenario = load(resolve_scenario("demo"), ["workload.epochs=1", "cluster.learners=30", "cluster.minibatch=8",
                                               "replicates=1"])
    records = runner.run_sweep(scenario, tmp_path, backend="replay", options={"device": "cpu"}, jobs=1,
                               progress=False, traces=True)
    assert len(records) == 6 and len(sims) == 3 and len(replays) == 5
    by = {(r["row"]["protocol"], r["row"]["optimizer.lr_policy"]): r for r in records}
    assert by[("hardsync", "constant")]["curves"][-1]["test_error"] == \
        by[("hardsync", "per_gradient")]["curves"][-1]["test_error"]
    assert len({r["row"]["sim_id"] for r in records}) == 3
    # the two points of a simulation share one trace file (hard links), both readable
    a, b = (tmp_path / "runs" / by[("async", k)]["row"]["run_id"] / "trace.ddlt" for k in ("constant", "per_gradient"))
    assert a.stat().st_ino == b.stat().st_ino and a.read_bytes() == b.read_bytes()


def test_no_trace_files_unless_asked(tmp_path: Path) -> None:
    scenario = load_text(SWEEP.format(epochs=1).replace("[2, 4, 6, 8, 10, 12]", "[2, 4]"))
    records = runner.run_sweep(scenario, tmp_path, jobs=1, progress=False)
    assert records and not list(tmp_path.glob("runs/*/trace.ddlt"))
    assert all((tmp_path / "runs" / r["row"]["run_id"] / "staleness.csv").is_file() for r in records)
    assert all(r["evals"] and r["evals"][0] == [0.0, 0.0] for r in records)


def test_a_relative_out_reaches_workers_in_another_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # truth: a Dask worker runs in its own working directory; the task it gets must
    # name the client's folder, so every file lands there. The worker here runs the task after
    # moving to another directory, as a remote worker would be.
    import os

    real = runner.run_tasks

    def elsewhere(tasks):
        here = os.getcwd()
        os.chdir(tmp_path / "worker")
        try:
            return real(tasks)
        finally:
            os.chdir(here)

    (tmp_path / "worker").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(runner, "run_tasks", elsewhere)
    scenario = load_text(SWEEP.format(epochs=1).replace("[2, 4, 6, 8, 10, 12]", "[2, 4]"))
    records = runner.run_sweep(scenario, "rel", jobs=1, progress=False, traces=True)
    assert len(list((tmp_path / "rel").glob("runs/*/trace.ddlt"))) == len(records) > 0
    assert not list((tmp_path / "worker").rglob("*"))
