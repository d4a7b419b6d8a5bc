"""Progress a user can see: plain lines in a log (never a carriage return), each point's own
progress (replay epochs, live gradients), and the one-time note that the kernels compile."""

from __future__ import annotations

import csv
import math
import os
import re
import sys
from pathlib import Path

import pytest

from ddlsim.backends import base
from ddlsim.backends.base import LINES, PointProgress, read_channel
from ddlsim.backends.live import live_progress
from ddlsim.backends.live_faults import BEAT
from ddlsim.scenarios import runner
from ddlsim.scenarios.cli import main
from ddlsim.simulator import run as simrun
from tests.conftest import make_point

TINY = """
name = "tiny-progress"
[workload]
epochs = 2
[cluster]
learners = 2
minibatch = 16
[protocol]
name = "async"
[sweep]
"cluster.learners" = [2, 4]
"""


def sweep(tmp_path: Path, capsys: pytest.CaptureFixture, command: str = "run", *extra: str) -> tuple[int, str, Path]:
    (tmp_path / "s.toml").write_text(TINY)
    out = tmp_path / f"out{len(list(tmp_path.glob('out*')))}"
    rc = main([command, str(tmp_path / "s.toml"), "--out", str(out), "--jobs", "1", *extra]
              + (["--no-report", "--device", "cpu"] if command == "run" else []))
    return rc, capsys.readouterr().err, out


def test_a_log_gets_plain_lines_never_a_carriage_return(tmp_path, capsys):
    # rule: stderr not a terminal (here captured): no tqdm bar, a line as the count of done runs
    # passes each 5 % of them (a sweep of 2: every run), and one at the start
    rc, err, _ = sweep(tmp_path, capsys)
    assert rc == 0, err
    assert "\r" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("sweep:")]
    assert lines[0] == "sweep: 2 runs, 0 done"
    assert re.fullmatch(r"sweep: 1/2 runs done \(50 %\), running 1, failed 0, \d+ s", lines[1]), lines
    assert re.fullmatch(r"sweep: 2/2 runs done \(100 %\), running 0, failed 0, \d+ s", lines[2]), lines
    assert len(lines) == 3


def test_a_long_sweep_prints_a_line_every_5_percent(capsys):
    # truth: 100 runs, one line per 5 done (step ⌈100 / 20⌉ = 5) → 20 lines, and the start line
    bar = runner._Lines(100, 0)
    for _ in range(100):
        bar.set_postfix_str("running 2, failed 0")
        bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 21 and lines[1].startswith("sweep: 5/100 runs done (5 %)") and "\r" not in "".join(lines)


def test_each_point_reports_its_replay_epochs_as_lines(tmp_path, capsys, monkeypatch):
    # truth: the epochs of the evaluations in curves.csv, one line each (the interval set to 0
    # so that every report is printed; by default a point prints at most every LINE_EVERY_S)
    monkeypatch.setattr(base, "LINE_EVERY_S", 0.0)
    rc, err, out = sweep(tmp_path, capsys)
    assert rc == 0, err
    assert "\r" not in err
    with open(out / "curves.csv", newline="") as f:
        curves = list(csv.DictReader(f))
    for run_id in {c["run_id"] for c in curves}:
        want = [f"  {run_id}: replay {round(float(c['epoch']), 2):g}/2 epochs" for c in curves if c["run_id"] == run_id]
        assert [ln for ln in err.splitlines() if ln.startswith(f"  {run_id}:")] == want


def test_quiet_prints_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(base, "LINE_EVERY_S", 0.0)
    rc, err, _ = sweep(tmp_path, capsys, "run", "--quiet")
    assert rc == 0 and err == ""


def test_on_a_terminal_points_report_through_the_channel_to_the_bar(tmp_path, capsys, monkeypatch):
    # rule: with a terminal the points write the sweep's channel folder (not stderr) and the
    # bar's postfix shows what each running point last wrote; the folder goes with the bar
    monkeypatch.setattr(runner, "_is_terminal", lambda stream: True)
    seen: list[tuple[str, str]] = []
    original = PointProgress.__call__

    def spy(self, stage, done, total, unit):
        original(self, stage, done, total, unit)
        seen.append((self.mode, read_channel(self.mode)[self.run_id]))

    monkeypatch.setattr(PointProgress, "__call__", spy)
    rc, err, out = sweep(tmp_path, capsys)
    assert rc == 0, err
    channels = {mode for mode, _ in seen}
    assert len(channels) == 1 and all(text.startswith("replay ") for _, text in seen)
    assert not os.path.exists(channels.pop())  # removed when the sweep ended
    assert "\r" in err  # a terminal's bar


def test_the_bar_shows_what_running_points_report(tmp_path, capsys):
    channel = tmp_path / "channel"
    channel.mkdir()
    bar = runner._Bar(3, 0, str(channel), "running 2, failed 0")
    try:
        a = PointProgress(str(channel), "async-l4-m8-0123abcd")
        b = PointProgress(str(channel), "hardsync-l2-m8-89abcdef")
        a("replay", 3, 20, "epochs")
        b("live", 120, 400, "gradients")
        assert bar.compose() == ("running 2, failed 0 · async-l4-m8: replay 3/20 epochs · "
                                 "hardsync-l2-m8: live 120/400 gradients")
        a.close()
        assert bar.compose() == "running 2, failed 0 · hardsync-l2-m8: live 120/400 gradients"
    finally:
        bar.close()
    assert not channel.exists()


def test_a_channel_that_is_not_there_is_not_written(tmp_path):
    # a Dask worker on another machine: its points' progress is not shown, and nothing fails
    p = PointProgress(str(tmp_path / "absent"), "run")
    p("replay", 1, 2, "epochs")
    p.close()
    assert not (tmp_path / "absent").exists()


def test_point_lines_are_bounded_in_rate(capsys, monkeypatch):
    # rule: in a log a point prints at most one line per LINE_EVERY_S (time stands still here)
    clock = [1000.0]
    monkeypatch.setattr(base.time, "monotonic", lambda: clock[0])
    p = PointProgress(LINES, "r")
    for k in range(10):
        p("replay", k, 10, "epochs")
    assert capsys.readouterr().err == ""
    clock[0] += base.LINE_EVERY_S
    p("replay", 10, 10, "epochs")
    assert capsys.readouterr().err == "  r: replay 10/10 epochs\n"


def test_live_progress_counts_the_server_beat_or_the_nodes_beats(tmp_path):
    # truth: async λ = 2, μ = 16 on digits' 1,437 samples, 1 epoch: ⌈1437 / 16⌉ = 90 gradients;
    # allreduce on 2 nodes: ⌈1437 / (2 · 16)⌉ = 45 iterations × 2 nodes = 90
    ps = make_point(cluster__learners=2, cluster__minibatch=16, workload__epochs=1, protocol__name="async")
    assert live_progress(ps, str(tmp_path)) == (0, 90)  # before the server has started
    (tmp_path / "progress.0").write_bytes(BEAT.pack(37, 0.0))
    assert live_progress(ps, str(tmp_path)) == (37, 90)
    ar = make_point(cluster__learners=2, cluster__minibatch=16, workload__epochs=1, protocol__name="allreduce")
    (tmp_path / "progress.1").write_bytes(BEAT.pack(5, 0.0))
    assert live_progress(ar, str(tmp_path)) == (42, math.ceil(1437 / 32) * 2)


def test_compile_note_only_when_numba_has_no_cached_kernels(tmp_path, capsys, monkeypatch):
    # rule: one line before the first simulation when a kernel the sweep uses is not cached;
    # none when all are, none with the SimPy engine
    monkeypatch.setattr(simrun, "_cached", lambda module, here=None: False)
    note = "ddlsim: compiling the simulator's kernels (first run only; numba caches them)"
    rc, err, _ = sweep(tmp_path, capsys, "simulate")
    assert rc == 0 and err.splitlines()[0] == note and err.count(note) == 1
    rc, err, _ = sweep(tmp_path, capsys, "simulate", "--engine", "simpy")
    assert rc == 0 and note not in err
    monkeypatch.setattr(simrun, "_cached", lambda module, here=None: True)
    rc, err, _ = sweep(tmp_path, capsys, "simulate")
    assert rc == 0 and note not in err


def test_numba_cache_is_cold_without_an_index_newer_than_the_source(tmp_path, monkeypatch):
    # truth: numba's index MODULE.FUNC-LINE.pyXY.nbi in __pycache__, written after the source
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    src = tmp_path / "fast_x.py"
    src.write_text("")
    os.utime(src, (1000, 1000))
    assert not simrun._cached("fast_x", tmp_path)
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    index = cache / f"fast_x._kernel-12.py{sys.version_info.major}{sys.version_info.minor}.nbi"
    index.write_bytes(b"")
    os.utime(index, (2000, 2000))
    assert simrun._cached("fast_x", tmp_path)
    os.utime(src, (3000, 3000))  # the source changed after: numba compiles again
    assert not simrun._cached("fast_x", tmp_path)
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "elsewhere"))  # numba looks only there then
    os.utime(index, (4000, 4000))
    assert not simrun._cached("fast_x", tmp_path)
