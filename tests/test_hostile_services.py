"""Services and processes under hostile input: a Dask scheduler address that is not one, a
listener that never answers or claims a 4 EiB frame, a killed parent of the worker pool, a
live run of far too many processes, an empty device name, a profile with NaN or negative
costs. Each is one ``ddlsim: error:`` line, exit status 2, and nothing written or started.

Servers here listen on 127.0.0.1 only, accept a bounded number of connections and stop with
the test; a test's deadline is a liveness bound (generous), never a timing measurement.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddlsim.scenarios import executors
from ddlsim.scenarios.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TINY = """
name = "hostile-tiny"
seed = 1
[workload]
epochs = 1
samples_per_epoch = 64
[cluster]
learners = 2
minibatch = 8
[protocol]
name = "async"
[sweep]
"protocol.name" = ["async", "hardsync"]
"""

LIVE = """
name = "hostile-live"
seed = 1
backend = "live"
[workload]
epochs = 1
samples_per_epoch = 64
[cluster]
learners = 2
minibatch = 8
[cluster.compute]
distribution = "deterministic"
base_s = 0.002
per_sample_s = 0.0
[protocol]
name = "async"
[live]
compute = "emulated"
timeout_s = 30
"""


def scenario(tmp_path: Path, text: str = TINY) -> str:
    f = tmp_path / "s.toml"
    f.write_text(text)
    return str(f)


def one_error_line(capsys: pytest.CaptureFixture, rc: int, *needles: str) -> str:
    """The single ``ddlsim: error:`` line the command printed (exit status 2, no traceback)."""
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, err[-800:]
    assert len(lines) == 1 and lines[0].startswith("ddlsim: error: "), err[-800:]
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


@contextmanager
def listener(greeting: bytes | str | None) -> Iterator[str]:
    """A TCP listener on 127.0.0.1 that accepts up to 8 connections and sends ``greeting``
    on each (None: says nothing, holds the connection open; "close": hangs up at once);
    closed when the block ends."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    srv.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def serve() -> None:
        while not stop.is_set() and len(held) < 8:
            try:
                conn, _ = srv.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)
            if greeting == "close":
                conn.close()
            elif greeting is not None:
                try:
                    conn.sendall(greeting)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"tcp://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        for c in held:
            c.close()
        srv.close()


# --- Dask scheduler addresses -------------------------------------------------------------

@pytest.mark.parametrize("address,needle", [
    ("", "not an address"),
    ("   ", "not an address"),
    ("foo://127.0.0.1:8786", "unknown address scheme 'foo'"),
    ("tcp://127.0.0.1", "missing port"),
    ("tcp://127.0.0.1:0", "port between 1 and 65535"),
    ("tcp://127.0.0.1:70000", "port between 1 and 65535"),
    ("inproc://x", "inside this process"),
])
def test_a_scheduler_address_that_is_not_one_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture, address: str, needle: str) -> None:
    out = tmp_path / "out"
    rc = main(["simulate", scenario(tmp_path), "--out", str(out), "--quiet", "--executor", "dask",
               "--scheduler", address])
    one_error_line(capsys, rc, "--scheduler", needle)
    assert not out.exists()  # refused before anything was written (an empty one used to run locally)


def test_an_empty_scheduler_without_dask_is_refused_too(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rc = main(["simulate", scenario(tmp_path), "--out", str(tmp_path / "out"), "--scheduler", ""])
    one_error_line(capsys, rc, "--scheduler ''", "only with --executor dask")


@pytest.mark.parametrize("greeting,needle", [
    (None, "no Dask scheduler answered at {address} within 1 s"),      # accepts, never answers
    (struct.pack("<Q", 1 << 62), "larger than this machine's memory"),  # claims a 4 EiB frame
    (b"HTTP/1.1 200 OK\r\n\r\n", "larger than this machine's memory"),  # another service: 8 bytes read as a length
    (b"\x05", "no Dask scheduler answered at {address} within 1 s"),  # one byte of a header, then silence
    ("close", "cannot connect to the Dask scheduler"),                   # accepts and hangs up at once
])
def test_a_listener_that_is_not_a_dask_scheduler_is_one_line_within_the_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
        greeting: bytes | str | None, needle: str) -> None:
    # truth: the server's behaviour, chosen here; the bound is distributed's connect timeout
    # plus ours around the handshake, which distributed leaves unbounded: 1 s where the server
    # stays silent, 30 s where it answers at once (so that no load can turn its answer into a
    # timeout; the answer ends the wait long before)
    monkeypatch.setattr(executors, "CONNECT_TIMEOUT_S", 1.0 if "within 1 s" in needle else 30.0)
    out = tmp_path / "out"
    with listener(greeting) as address:
        box: dict[str, int] = {}
        worker = threading.Thread(target=lambda: box.setdefault("rc", main(
            ["simulate", scenario(tmp_path), "--out", str(out), "--quiet", "--executor", "dask",
             "--scheduler", address])), daemon=True)
        worker.start()
        worker.join(60)  # liveness: before, a silent listener hung ddlsim until it was killed
        assert not worker.is_alive(), "ddlsim waited on a listener that never answers"
        one_error_line(capsys, box["rc"], f"--scheduler {address}", needle.format(address=address))
    assert not out.exists()


def test_connecting_to_a_silent_listener_from_the_library_is_bounded_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # the executor itself (run_points with executor="dask"), not only the command line
    monkeypatch.setattr(executors, "CONNECT_TIMEOUT_S", 1.0)
    with listener(None) as address:
        with pytest.raises(executors.ScenarioError, match="no Dask scheduler answered"):
            executors.make_executor("dask", 2, address)


def test_a_real_scheduler_address_runs_the_sweep(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # truth: the same sweep run in-process (the rows but for wall times)
    import csv

    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp://", host="127.0.0.1",
                      scheduler_port=0, dashboard_address=None) as cluster:
        rc = main(["simulate", scenario(tmp_path), "--out", str(tmp_path / "dask"), "--quiet", "--executor", "dask",
                   "--scheduler", cluster.scheduler_address])
    assert rc == 0, capsys.readouterr().err[-800:]
    assert main(["simulate", scenario(tmp_path), "--out", str(tmp_path / "local"), "--quiet", "--jobs", "1"]) == 0

    def rows(d: Path) -> list[dict]:
        with open(d / "summary.csv", newline="") as f:
            return [{k: v for k, v in r.items() if k != "wall_s"} for r in csv.DictReader(f)]

    assert rows(tmp_path / "dask") == rows(tmp_path / "local")


# --- the worker pool dies with its parent -------------------------------------------------

def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat", "rb") as f:
                    if int(f.read().rsplit(b")", 1)[1].split()[1]) == pid:
                        kids.append(int(d))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def _alive(pid: int) -> bool:
    """Process ``pid`` exists and is not a zombie (a zombie has exited; its new parent may be
    slow to reap it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux /proc")
def test_the_worker_pool_dies_with_a_killed_parent(tmp_path: Path) -> None:
    # truth: the kernel's process table. A sweep of two long simulations (minutes each) on 2
    # workers; SIGKILL of ddlsim; every process it had started (the 2 workers and
    # multiprocessing's resource tracker) must be gone. Before, they ran on for 20 minutes.
    long = TINY.replace("epochs = 1", "epochs = 200000").replace("samples_per_epoch = 64", "samples_per_epoch = 512")
    proc = subprocess.Popen([sys.executable, "-m", "ddlsim", "simulate", scenario(tmp_path, long),
                             "--out", str(tmp_path / "out"), "--jobs", "2", "--force", "--quiet"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 120  # liveness: interpreter and pool start-up on a loaded machine
        while time.monotonic() < deadline and proc.poll() is None:
            started = _children(proc.pid)
            if sum(b"spawn_main" in _cmdline(k) for k in started) >= 2:
                break
            time.sleep(0.1)
        workers = [k for k in started if b"spawn_main" in _cmdline(k)]
        assert proc.poll() is None and len(workers) >= 2, "the sweep did not start its 2 workers"
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 30  # liveness bound, generous: the watchdog polls every 0.5 s
        while time.monotonic() < deadline and any(_alive(k) for k in started):
            time.sleep(0.1)
        assert not [k for k in started if _alive(k)], [(k, _cmdline(k)[:80]) for k in started if _alive(k)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in started:  # only the processes this test's ddlsim started
            if _alive(k):
                os.kill(k, signal.SIGKILL)


def test_a_worker_whose_parent_is_already_gone_exits_at_once() -> None:
    # truth: the rule's first step, by hand: a pool initializer given a parent pid that is not
    # this process's parent ends the process (here a child Python, so the test survives)
    code = ("import os; from ddlsim.scenarios.executors import die_with_parent; "
            "die_with_parent(os.getppid() + 1_000_000); print('still here')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "still here" not in done.stdout


# --- live runs: size, device --------------------------------------------------------------

def test_the_live_process_limit_is_a_multiple_of_the_cores_with_a_floor() -> None:
    from ddlsim.backends.live import LIVE_PROCESSES_AT_LEAST, LIVE_PROCESSES_PER_CPU, process_limit

    assert (LIVE_PROCESSES_PER_CPU, LIVE_PROCESSES_AT_LEAST) == (8, 32)
    assert process_limit(1) == 32 and process_limit(2) == 32 and process_limit(4) == 32
    assert process_limit(5) == 40 and process_limit(64) == 512


@pytest.mark.parametrize("command", ["run", "validate"])
def test_a_live_run_of_100000_learners_is_refused_before_anything_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    from ddlsim.backends import live

    def started(*a, **k):  # nothing may start
        raise AssertionError("a live run started")

    monkeypatch.setattr(live, "launch", started)
    out = tmp_path / "out"
    args = [command, scenario(tmp_path, LIVE), "--out", str(out), "--quiet", "--set", "cluster.learners=100000"]
    rc = main(args + (["--backend", "live"] if command == "run" else []))
    limit = live.process_limit()
    one_error_line(capsys, rc, "cluster.learners = 100000", "starts 100001 processes", f"the limit here is {limit}",
                   "--force")
    assert not out.exists()


def test_force_lifts_the_live_process_limit() -> None:
    from ddlsim.backends.base import BackendError
    from ddlsim.backends.live import check_live_size
    from tests.conftest import make_point

    big = make_point(LIVE, cluster__learners=100000)
    with pytest.raises(BackendError, match="starts 100001 processes"):
        check_live_size([big])
    check_live_size([big], force=True)  # lifted: no refusal
    check_live_size([make_point(LIVE)])  # 3 processes: under any limit


@pytest.mark.parametrize("argv", [
    ["run", "{scenario}", "--device", "", "--out", "{out}"],
    ["run", "{scenario}", "--device", " ", "--out", "{out}"],
    ["validate", "{live}", "--device", "", "--out", "{out}"],
    ["calibrate", "--device", "", "--out", "{out}/p.toml"],
])
def test_an_empty_device_name_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture, argv: list[str]) -> None:
    out = tmp_path / "out"
    args = [a.format(scenario=scenario(tmp_path), live=scenario(tmp_path, LIVE), out=out) for a in argv]
    one_error_line(capsys, main(args), "an empty device name")
    assert not out.exists()


def test_resolve_device_keeps_none_as_the_default_and_refuses_empty() -> None:
    from ddlsim.backends.base import BackendError
    from ddlsim.backends.device import resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device(None).type in ("cpu", "cuda")
    with pytest.raises(BackendError, match="empty device name"):
        resolve_device("")


# --- validate: the profile before any live run, never "nan" -------------------------------

@pytest.mark.parametrize("profile,needle", [
    ("[server]\napply_s = nan\n", "[server] apply_s = nan: NaN is not allowed"),
    ("[network]\nlatency_s = -1e-4\n", "[network] latency_s = -0.0001: must be ≥ 0"),
    ("[network]\nlatency_s = inf\n", "[network] latency_s = inf: must be finite"),
    ("[network]\nbandwidth_Bps = 0\n", "[network] bandwidth_Bps = 0: must be"),
    ("[network]\nbandwidth_Bps = \"fast\"\n", "expected a number, got string"),
    ("[server]\napply_s = -1\n", "[server] apply_s = -1: must be ≥ 0"),
])
def test_validate_refuses_a_bad_profile_before_any_live_run(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch, profile: str,
                                                            needle: str) -> None:
    from ddlsim.backends import live

    def started(*a, **k):
        raise AssertionError("a live run started")

    monkeypatch.setattr(live.LiveBackend, "run", started)
    prof = tmp_path / "p.toml"
    prof.write_text(profile)
    out = tmp_path / "out"
    rc = main(["validate", scenario(tmp_path, LIVE), "--profile", str(prof), "--out", str(out), "--quiet"])
    one_error_line(capsys, rc, f"--profile {prof}", needle)
    assert not out.exists()


def test_the_median_over_no_finite_error_is_said_in_words_never_nan() -> None:
    from ddlsim.scenarios.validate import COLUMNS, median_abs_error, median_line, table_lines

    def row(run: str, err: float) -> dict:
        r = {k: 1.0 for k in COLUMNS}
        r.update(run_id=run, protocol="async", learners=2, time_rel_error=err)
        return r

    # by hand: |0.1|, |−0.3| → median 0.2 over 2 of the 3 points; the NaN row is "n/a"
    rows = [row("a", 0.1), row("b", -0.3), row("c", math.nan)]
    assert median_abs_error(rows) == pytest.approx(0.2)
    assert median_line(rows) == "median |relative error| of time per epoch: 20.0% (over 2 of 3 points)"
    none = [row("c", math.nan), row("d", math.inf)]
    assert math.isnan(median_abs_error(none))
    assert "not measured" in median_line(none) and "nan" not in median_line(none).lower()
    lines = table_lines(rows + none, Path("out"))
    text = "\n".join(lines)
    assert "nan" not in text.lower() and "inf" not in text.lower()
    assert [ln.split()[3] for ln in lines[1:6]] == ["+10.0%", "-30.0%", "n/a", "n/a", "n/a"]
    assert lines[-1] == "table: out/validation.csv  figure: out/validation.png"


# --- torchrun: rank 0 says where the trace is and what comes next -------------------------

@pytest.mark.live
def test_torchrun_rank_0_points_to_trace_and_replay(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # truth: the file rank 0 wrote; the printed commands are run as printed
    import shlex

    scen = scenario(tmp_path, LIVE.replace("learners = 2", "learners = 1"))
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "ddlsim.scenarios.live_worker", scen, "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = out / "trace.ddlt"
    assert f"measured trace: {trace}" in proc.stdout
    commands = [ln.split(":", 1)[1].strip() for ln in proc.stdout.splitlines()
                if ln.strip().startswith(("check it:", "accuracy curves:"))]
    assert commands == [f"ddlsim trace {shlex.quote(str(trace))}", f"ddlsim replay {shlex.quote(str(trace))}"]
    assert main(shlex.split(commands[0])[1:]) == 0
    assert str(trace) in capsys.readouterr().out
