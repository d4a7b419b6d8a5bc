"""Backend "live": run the protocol for real as processes over ``torch.distributed``.

ddlsim launches the processes itself (``torch.multiprocessing``, gloo, bound to
``live.host``, default 127.0.0.1) or ``torchrun`` launches them across machines
(``python -m ddlsim.scenarios.live_worker``). Every blocking call is limited by
``live.timeout_s``; a process that dies ends the run with one line naming it.

The run writes a *measured* trace (same format, wall-clock times). Accuracy comes from
replaying that trace (``replay`` reproduces the live weights: tests check it), so the
curves are the live run's; under ``live.compute = "emulated"`` learners sleep for the
compute model's time and only timing is measured.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import socket
import tempfile
import time
from datetime import timedelta
from typing import Any

import numpy as np
import torch

from ..simulator.catalog import SIMULATION_ONLY_MODELS
from ..simulator.protocols import is_ps, live_refusal
from ..simulator.stats import staleness_stats
from ..simulator.trace import APPLY, GRAD, Trace, TraceError
from ..simulator.trace import read as read_trace
from .base import BackendError, BackendResult, ProgressFn, RunOptions
from .live_faults import laggards, read_beats
from .live_gossip import node
from .live_local import covers as runs_local
from .live_local import local_node
from .live_ps import learner, server


def free_port(host: str) -> int:
    """A TCP port on ``host`` that nothing listens on now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def role(point: dict[str, Any], rank: int) -> str:
    """Human name of a rank: the server or learner i (node i for gossip protocols)."""
    if is_ps(point):
        return "server" if rank == 0 else f"learner {rank - 1}"
    return f"node {rank}"


def world_size(point: dict[str, Any]) -> int:
    """Processes of a run: server + λ learners, or N nodes."""
    lam = point["cluster"]["learners"]
    return lam + 1 if is_ps(point) else lam


LIVE_PROCESSES_PER_CPU = 8  # emulated learners mostly sleep; real ones share the cores
LIVE_PROCESSES_AT_LEAST = 32  # the limit on a machine of few cores (validate-grid's λ = 16 runs 17)


def process_limit(cpus: int | None = None) -> int:
    """The most processes one live run may start on this machine without ``--force``:
    :data:`LIVE_PROCESSES_PER_CPU` per CPU core, and at least :data:`LIVE_PROCESSES_AT_LEAST`."""
    return max(LIVE_PROCESSES_AT_LEAST, LIVE_PROCESSES_PER_CPU * (cpus or os.cpu_count() or 1))


def check_live_size(points: list[dict[str, Any]], force: bool = False) -> None:
    """Refuse, before any process starts, a point whose live run would start more processes
    than :func:`process_limit` (each is a Python process with torch loaded), unless ``force``."""
    if force:
        return
    limit = process_limit()
    for p in points:
        n = world_size(p)
        if n > limit:
            raise BackendError(f"point {p.get('_id', '?')}: a live run of cluster.learners = "
                               f"{p['cluster']['learners']} starts {n} processes; the limit here is {limit} "
                               f"({LIVE_PROCESSES_PER_CPU} per CPU core × {os.cpu_count() or 1}, at least "
                               f"{LIVE_PROCESSES_AT_LEAST}): fewer learners, or --force")


def play(point: dict[str, Any], rank: int, mean_sigma: float, out: str, init: str | None = None,
         world: int | None = None) -> None:
    """One live process: join the group (``init``/``world``, or torchrun's environment when
    None), play rank ``rank``'s role, leave. The server or node 0 writes into ``out``."""
    import torch.distributed as dist

    torch.set_num_threads(1)  # this process only computes one small model at a time
    timeout = timedelta(seconds=point["live"]["timeout_s"])
    if init is None:  # torchrun: its environment names the store
        dist.init_process_group("gloo", timeout=timeout)
    else:
        assert world is not None  # given with init
        store = rendezvous_store(init, rank, world, timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout,
                                pg_options=gloo_options(init))
    try:
        if is_ps(point):
            server(point, mean_sigma, out) if rank == 0 else learner(point, rank)
        elif runs_local(point):
            local_node(point, rank, out)
        else:
            node(point, rank, out)
    finally:
        dist.destroy_process_group()


_LISTENING: list[socket.socket] = []


def rendezvous_store(init: str, rank: int, world: int | None, timeout: timedelta) -> Any:
    """The run's key-value store, listening on ``live.host`` only (rank 0 binds the socket
    itself: torch's own store would listen on every interface)."""
    import torch.distributed as dist

    host, port = init.removeprefix("tcp://").rsplit(":", 1)
    if rank != 0:
        return dist.TCPStore(host, int(port), world, False, timeout)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, int(port)))
    sock.listen(max(128, (world or 1) * 2))
    _LISTENING.append(sock)  # the store serves this socket: it stays open while the process lives
    return dist.TCPStore(host, int(port), world, True, timeout, master_listen_fd=sock.fileno())


def gloo_options(init: str) -> Any:
    """Gloo's connections on ``live.host`` too (by default it binds to the address the
    machine's host name resolves to)."""
    from torch.distributed import ProcessGroupGloo

    host = init.removeprefix("tcp://").rsplit(":", 1)[0]
    opts = ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # torch's private gloo options (no public way)
    opts._devices = [ProcessGroupGloo.create_device(hostname=host)]
    return opts


def process_main(rank: int, point: dict[str, Any], world: int, init: str, mean_sigma: float, out: str,
                 parent: int) -> None:
    """One live process started by :func:`launch`: it dies with its parent (rank 0 removes the
    scratch folder first), and its stderr (Python and C++) goes to ``out/rankN.err``, so no
    traceback or C++ frame reaches the user; the parent reports one line."""
    err = os.open(os.path.join(out, f"rank{rank}.err"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(err, 2)
    _die_with_parent(parent, out if rank == 0 else None)
    play(point, rank, mean_sigma, out, init, world)


def _die_with_parent(parent: int, scratch: str | None) -> None:
    """A watchdog thread: when process ``parent`` (the launcher) is no longer this process's
    parent (it died, even by SIGKILL, possibly before this process got here), remove
    ``scratch`` (if given) and exit at once."""
    import threading
    import time

    def gone() -> bool:
        return os.getppid() != parent

    def leave() -> None:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        os._exit(1)

    if gone():
        leave()

    def watch() -> None:
        while True:
            time.sleep(0.2)
            if gone():
                leave()

    threading.Thread(target=watch, name="ddlsim-parent-watchdog", daemon=True).start()


def live_progress(point: dict[str, Any], out: str) -> tuple[int, int]:
    """(gradients finished, gradients the run computes) of the live run writing ``out``: the
    server's count of processed gradients (rank 0's beat), or the sum of the nodes' beats."""
    from ..simulator.protocols import iterations, total_gradients

    if is_ps(point):
        beat = read_beats(out, 1)[0]
        return (beat[0] if beat else 0), total_gradients(point)
    n = world_size(point)
    return sum(b[0] for b in read_beats(out, n) if b), iterations(point) * n


def launch(point: dict[str, Any], mean_sigma: float, out: str, progress: ProgressFn | None = None) -> None:
    """Start every process of the run locally and wait; a failure is one BackendError line."""
    import torch.multiprocessing as mp

    live = point["live"]
    host = live["host"]
    port = live["port"] or free_port(host)
    world = world_size(point)
    init = f"tcp://{host}:{port}"
    ctx = mp.start_processes(process_main, args=(point, world, init, mean_sigma, out, os.getpid()), nprocs=world,
                             join=False, start_method="spawn")
    with open(os.path.join(out, "pids"), "w") as f:  # for the reaper (_reaper)
        f.write(" ".join(str(pid) for pid in ctx.pids()))
    spawn_log = logging.getLogger("torch.multiprocessing.spawn")
    level = spawn_log.level
    spawn_log.setLevel(logging.ERROR)  # its "Terminating process …" warnings are not the user's business
    stopped: list[int] = []
    try:
        # grace 1 s: a stopped process ignores SIGTERM; torch's default would wait 30 s for it
        while not ctx.join(timeout=0.5, grace_period=1.0):
            stopped = [r for r, pid in enumerate(ctx.pids()) if process_state(pid) in ("T", "t")]
            if progress is not None:
                progress("live", *live_progress(point, out), "gradients")
    except mp.ProcessExitedException as e:
        how = f"signal {e.signal_name}" if e.signal_name else f"exit code {e.exit_code}"
        raise BackendError(_blame(point, out, stopped) or f"live run stopped: {role(point, e.error_index)} died "
                           f"with {how}; the other processes were terminated") from None
    except mp.ProcessRaisedException as e:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise BackendError(_blame(point, out, stopped, str(e))
                           or f"live run stopped: {role(point, e.error_index)} failed: {lines[-1].strip()}") from None
    finally:
        spawn_log.setLevel(level)
        for p in ctx.processes:
            if p.is_alive():
                p.kill()


SILENT = "sent nothing for"  # the server's words for a learner that stopped answering (live_ps)


TIMED_OUT = "Timed out"  # gloo's words when a collective or a receive waited live.timeout_s


def _blame(point: dict[str, Any], out: str, stopped: list[int], raised: str = "") -> str | None:
    """The cause of a failed run when it is not the process that failed first: a process the
    OS had stopped (SIGSTOP, a debugger), else a learner the server found silent (its words in
    ``raised``, the error a process raised, or in the server's stderr), else (a gossip run
    whose wait timed out) the nodes whose heartbeats fell behind the others'."""
    if stopped:
        names = ", ".join(role(point, r) for r in stopped)
        return (f"live run stopped: {names} stopped responding (process state: stopped, e.g. SIGSTOP or a "
                f"debugger) for live.timeout_s = {point['live']['timeout_s']:g} s; the other processes were terminated")
    try:
        with open(os.path.join(out, "rank0.err"), "rb") as f:
            text = raised + "\n" + f.read(1 << 20).decode("utf-8", "replace")
    except OSError:
        text = raised
    said = [ln.split(": ", 1)[-1] for ln in text.splitlines() if SILENT in ln]
    if said:
        return f"live run stopped: {said[-1].strip()}; the other processes were terminated"
    return _laggard(point, out) if TIMED_OUT in raised and not is_ps(point) else None


def _laggard(point: dict[str, Any], out: str) -> str | None:
    """Name the gossip nodes that stopped making progress (their heartbeats behind the others')."""
    behind, done, others, last = laggards(read_beats(out, world_size(point)))
    if not behind:
        return None
    names = ", ".join(role(point, r) for r in behind)
    return (f"live run stopped: {names} made no progress for {time.monotonic() - last:.1f} s (finished {done} "
            f"gradients, the others at least {others}; live.timeout_s = {point['live']['timeout_s']:g}): "
            f"it hung or is far too slow; the other processes were terminated")


def process_state(pid: int) -> str:
    """The OS's one-letter state of process ``pid`` (Linux /proc; "" where unknown)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read(512).rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def run_measured(point: dict[str, Any], mean_sigma: float,
                 progress: ProgressFn | None = None) -> tuple[Trace, torch.Tensor | None]:
    """Run ``point`` live in a scratch directory; return its measured trace and, where the
    run wrote them, the final weights (a missing or corrupt trace is one BackendError line)."""
    out = tempfile.mkdtemp(prefix="ddlsim-live-")
    reaper = _reaper(out)
    try:
        launch(point, mean_sigma, out, progress)
        try:
            measured = read_trace(os.path.join(out, "trace.ddlt"))
        except TraceError as e:
            raise BackendError(f"live run wrote no valid trace: {e}") from None
        weights = torch.load(os.path.join(out, "weights.pt"), weights_only=True) if os.path.exists(
            os.path.join(out, "weights.pt")) else None
    finally:
        shutil.rmtree(out, ignore_errors=True)
        reaper.kill()
        reaper.wait()
    return measured, weights


REAPER = """
import os, shutil, signal, sys, time
folder, parent = sys.argv[1], int(sys.argv[2])
while os.getppid() == parent:
    time.sleep(0.2)
try:
    pids = [int(p) for p in open(os.path.join(folder, "pids")).read().split()]
except (OSError, ValueError):
    pids = []
for pid in pids:
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
shutil.rmtree(folder, ignore_errors=True)
"""


def _reaper(folder: str) -> Any:
    """A small process that, when this process dies without cleaning up (SIGKILL), kills the
    live processes listed in ``folder/pids`` (they may still be importing torch, before their
    own watchdog runs) and removes ``folder``: nothing outlives a killed run."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c", REAPER, folder, str(os.getpid())], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measured_summary(trace: Trace) -> dict[str, Any]:
    """Measured runtime figures of a live trace, named ``measured_*``."""
    ops = trace.ops
    t = float(trace.header.get("wall_s", ops["t_end"].max() if len(ops["t_end"]) else 0.0))
    grads = int((ops["kind"] == GRAD).sum())
    out = {"measured_time_s": t, "measured_sim_time_s": t, "measured_gradients": grads,
           "measured_updates": int((ops["kind"] == APPLY).sum()),
           "measured_gradients_per_s": grads / t if t > 0 else math.nan}
    epochs = float(ops["epoch"].max()) if len(ops["epoch"]) else 0.0
    out["measured_time_per_epoch_s"] = t / epochs if epochs > 0 else math.nan
    out.update({f"measured_{k}": v for k, v in staleness_stats(trace.inputs["staleness"]).items()})
    return out


def round_trip_s(trace: Trace) -> float:
    """Mean measured gap between a learner's push and its next compute start (push, server, pull).

    Under ``hardsync`` the gap includes the barrier; use asynchronous runs to calibrate.
    """
    ops = trace.ops
    g = np.flatnonzero(ops["kind"] == GRAD)
    gaps = []
    for lrn in np.unique(ops["node"][g]):
        mine = g[ops["node"][g] == lrn]
        gaps.append(ops["t_start"][mine[1:]] - ops["t_end"][mine[:-1]])
    gaps_all = np.concatenate(gaps) if gaps else np.zeros(0)
    return float(gaps_all.mean()) if len(gaps_all) else 0.0


def calibrated_latency(trace: Trace, point: dict[str, Any]) -> float:
    """The ``latency_s`` that makes the simulator's push + reply cost the measured round trip.

    The simulator charges a cycle 2·latency + 2·M/bandwidth + apply_s (no contention).
    """
    net = point["cluster"]["network"]
    m = point["workload"]["param_count"] * net["bytes_per_param"]
    tx = 0.0 if math.isinf(net["bandwidth_Bps"]) else m / net["bandwidth_Bps"]
    return max(0.0, (round_trip_s(trace) - 2 * tx - point["cluster"]["server"]["apply_s"]) / 2)


class LiveBackend:
    """Backend "live": run the point for real; measured trace, timing, and replayed accuracy."""

    name = "live"

    def run(self, trace: Trace, point: dict[str, Any], options: RunOptions | None = None) -> BackendResult:
        """Run ``point`` live. ``trace`` (the simulated one) supplies ⟨σ⟩ for ``mean_staleness``."""
        options = options or RunOptions()
        if point["live"]["compute"] == "real" and point["workload"]["model"] in SIMULATION_ONLY_MODELS:
            raise BackendError(f"model {point['workload']['model']!r} is simulation-only: run it live with "
                               "live.compute = \"emulated\"")
        refusal = live_refusal(point)
        if refusal:
            raise BackendError(refusal)
        if point["live"]["compute"] == "real":
            from .workloads import load_data

            load_data(point, options.data_dir, options.download)  # fetched and readable, once, here
            point = {**point, "_data_dir": options.data_dir}  # where the processes read it
        sigma = trace.inputs["staleness"]
        measured, weights = run_measured(point, float(np.mean(sigma)) if len(sigma) else 0.0, options.progress)
        summary = measured_summary(measured)
        curves: list[dict[str, Any]] = []
        if point["live"]["compute"] == "real":
            from .replay import ReplayBackend

            replayed = ReplayBackend().run(measured, point, options)
            curves, summary = replayed.curves, {**replayed.summary, **summary}
        return BackendResult(curves=curves, summary=summary, trace=measured, final_weights=weights)
