"""The sweep runner: every point of a scenario, simulated (and executed by a backend).

Rules kept here:

* one point = one directory ``runs/<run_id>/`` holding ``trace.ddlt``, ``staleness.csv``
  (written by the worker) and, written last and atomically by the coordinator,
  ``result.json`` (the summary row and the curves);
  a point whose ``result.json`` exists with the same point hash is complete, so a sweep
  killed at any moment resumes (``resume=True``) without losing or duplicating a run;
* ``summary.csv`` (one row per run: a configuration and a seed), ``configurations.csv`` (one
  row per configuration: the mean and spread over its replicates) and ``curves.csv`` are
  rewritten atomically from the results after every completed point, in sweep order;
* a point that fails is recorded (``error`` column) and the others go on;
* points run on a ``concurrent.futures`` executor (local processes, one torch thread
  each) or in-process when there is one job.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import sys
import time
import traceback
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Callable, Iterable
from typing import Any

from ..analysis.metrics import configurations
from ..analysis.table import csv_safe
from ..backends.device import numerics
from ..simulator.files import TEMP_MARK, FileRefused, atomic_write, read_bounded
from ..simulator.results_folder import ResultsFolder
from ..simulator.protocols import spec_of
from .executors import make_executor, stop_executor
from .load import Scenario, configuration_id, point_hash, simulation_key

RESULT = "result.json"
RESULT_MAX_BYTES = 256 << 20
LEAD_COLUMNS = ["run_id", "protocol", "learners", "minibatch", "softsync_n", "seed"]
SIM_COLUMNS = ["gradients", "updates", "sim_time_s", "gradients_per_s", "staleness_mean", "staleness_p50",
               "staleness_p99", "staleness_max", "server_utilization", "server_wait_mean_s"]
BACKEND_COLUMNS = ["final_test_error", "best_test_error", "time_to_target_s", "diverged", "did_not_learn"]
COVERED = ["protocol.name", "cluster.learners", "cluster.minibatch", "protocol.n", "seed"]
TAIL = ["error", "wall_s"]
BACKEND_MARKS = {"final_test_error", "measured_time_s"}  # a row a backend ran (replay, live)
TABLE_EVERY_S = 1.0
TABLE_EVERY_POINT_UP_TO = 200
CURVE_COLUMNS = ["run_id", "epoch", "updates", "sim_time_s", "test_error", "train_loss"]


@dataclass
class Task:
    """What a worker needs to run some points that share one simulation (same simulated keys)."""

    points: list[dict[str, Any]]
    out_dir: str
    backend: str | None
    options: dict[str, Any]
    engine: str = "auto"
    traces: bool = False


def lead_values(point: dict[str, Any]) -> dict[str, Any]:
    """The identifying columns of a point's summary row: its run, its configuration (the
    point without its seed: ``config_id``, shared by its replicates) and its seed."""
    proto = point["protocol"]["name"]
    lam = point["cluster"]["learners"]
    row = {"run_id": point["_id"], "protocol": proto, "learners": lam,
           "minibatch": point["cluster"]["minibatch"],
           "softsync_n": spec_of(point).softsync_of(lam, point["protocol"]["n"]), "seed": point["seed"]}
    for k, v in point.get("_swept", {}).items():
        row.setdefault(k, v)
    row["config_id"] = configuration_id(point)
    return row


def staleness_csv(hist: list[tuple[int, int]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["staleness", "count"])
    w.writerows(hist)
    return buf.getvalue().encode()


def run_task(task: Task) -> list[dict[str, Any]]:
    """Simulate once for ``task.points`` (they differ only in keys the simulator ignores), run
    the backend once per distinct replay, write each point's run directory; their results.

    A trace file is written only with ``task.traces`` (once, hard-linked into the other points'
    folders); every point gets its ``staleness.csv`` and, in its result, the evaluation
    schedule ``evals`` (simulated time, epoch) of the trace.
    """
    return run_tasks([task])[0]


def run_tasks(tasks: list[Task]) -> list[list[dict[str, Any]]]:
    """:func:`run_task` for each of ``tasks``, in one worker: with the replay backend, the
    replays of all the tasks (the seeds of one configuration) run together
    (:meth:`~ddlsim.backends.replay.ReplayBackend.run_many`), which gives each the numbers it
    gets alone; a failure there is retried task by task, so that it is charged to its own."""
    runs = [_simulated(t) for t in tasks]
    live = [r for r in runs if r.trace is not None and r.task.backend]
    if len(live) > 1 and all(r.task.backend == "replay" for r in live):
        try:
            _run_backend_many(live)
        except Exception:  # charged below to the task whose replay fails alone
            for r in live:
                r.reset()
            for r in live:
                _backend_or_error(r)
    else:
        for r in live:
            _backend_or_error(r)
    return [r.records() for r in runs]


@dataclass
class _Run:
    """One task's simulation and the rows, curves and wall times its points get."""

    task: Task
    rows: list[dict[str, Any]]
    curves: list[list[dict[str, Any]]]
    evals: list[list[float]]
    walls: list[float]
    trace: Any = None
    sim_rows: list[dict[str, Any]] | None = None
    sim_wall: float = 0.0

    def reset(self) -> None:
        """Back to the state after the simulation (before any backend ran)."""
        assert self.sim_rows is not None
        self.rows = [dict(r) for r in self.sim_rows]
        self.curves = [[] for _ in self.task.points]
        self.walls = [self.sim_wall] * len(self.task.points)

    def fail(self, e: BaseException, wall: float) -> None:
        """Every point of the task records ``e`` (a point's failure never stops a sweep)."""
        for row in self.rows:
            row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
            row["_traceback"] = traceback.format_exc()
        self.walls = [wall] * len(self.task.points)
        self.trace = None

    def records(self) -> list[dict[str, Any]]:
        for row, w in zip(self.rows, self.walls):
            row.setdefault("error", None)
            row["wall_s"] = w
        machine = {"numerics": numerics(self.task.options.get("device"))} if self.task.backend else {}
        return [{"hash": point_hash(p), "row": row, "curves": c, "evals": self.evals, **machine}
                for p, row, c in zip(self.task.points, self.rows, self.curves)]


def _simulated(task: Task) -> _Run:
    """``task``'s simulation, its run directories' staleness (and trace) files written."""
    from ..simulator.run import simulate

    out = Path(task.out_dir)
    run = _Run(task, [lead_values(p) for p in task.points], [[] for _ in task.points], [], [0.0] * len(task.points))
    t0 = time.perf_counter()
    try:
        sim = simulate(task.points[0], task.engine, keep_trace=bool(task.traces or task.backend))
        run.evals = [[float(t), float(e)] for t, e in sim.evals]
        stale = staleness_csv(sim.histogram)
        first_trace: Path | None = None
        for p, row in zip(task.points, run.rows):
            run_dir = out / "runs" / p["_id"]
            row.update(sim.summary)
            row["sim_id"] = sim.sim_id
            atomic_write(run_dir / "staleness.csv", stale)
            if task.traces:
                first_trace = _write_or_link(sim.trace, run_dir / "trace.ddlt", first_trace)
        run.sim_wall = time.perf_counter() - t0
        run.walls = [run.sim_wall] * len(task.points)
        run.sim_rows = [dict(r) for r in run.rows]
        run.trace = sim.trace
    except Exception as e:  # recorded, never raised: one bad point must not stop a sweep
        run.fail(e, time.perf_counter() - t0)
    return run


def _backend_or_error(run: _Run) -> None:
    """The backend of ``run``'s points, or the error it raised recorded on each of them."""
    t0 = time.perf_counter()
    try:
        _run_backend(run.task, run.trace, run.rows, run.curves, run.walls)
    except Exception as e:
        run.fail(e, run.sim_wall + time.perf_counter() - t0)


def _write_or_link(trace: Any, path: Path, first: Path | None) -> Path:
    """Write ``trace`` to ``path``, or hard-link the copy already written at ``first``."""
    from ..simulator import trace as tracemod

    if first is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{TEMP_MARK}link.tmp")
        tmp.unlink(missing_ok=True)
        try:
            os.link(first, tmp)
            os.replace(tmp, path)
            return first
        except OSError:
            tmp.unlink(missing_ok=True)
    tracemod.write(trace, path)
    return path


def replay_key(point: dict[str, Any], staleness: Any) -> str:
    """Two points with the same key replay identically: the same simulation and the same
    optimizer once a staleness-aware learning-rate policy whose factors are all 1 on this
    trace is read as ``constant`` (per_gradient when σ ≤ 1, mean_staleness when ⟨σ⟩ < 1)."""
    opt = dict(point["optimizer"])
    smax = int(staleness.max()) if len(staleness) else 0
    mean = float(staleness.mean()) if len(staleness) else 0.0
    if (opt["lr_policy"] == "per_gradient" and smax <= 1) or (opt["lr_policy"] == "mean_staleness" and mean < 1):
        opt["lr_policy"] = "constant"
    rest = {k: v for k, v in point.items() if not k.startswith("_") and k != "optimizer"}
    cut = point.get("_until_epoch")  # a replay cut at an epoch (a rung of successive halving) is another replay
    return json.dumps({"opt": opt, "rest": rest, "cut": cut}, sort_keys=True, default=str)


def _replays(task: Task, trace: Any) -> dict[str, list[int]]:
    """The distinct backend runs of ``task``'s points: a key and the points it serves (the
    replay backend runs once per :func:`replay_key`, another backend once per point)."""
    groups: dict[str, list[int]] = {}
    for idx, p in enumerate(task.points):
        key = replay_key(p, trace.inputs["staleness"]) if task.backend == "replay" else str(idx)
        groups.setdefault(key, []).append(idx)
    return groups


def _options(task: Task, run_id: str) -> tuple[Any, Any]:
    """The backend's options for one run of ``task`` and the progress sink they report to."""
    from dataclasses import replace

    from ..backends.base import PointProgress, RunOptions

    opts = dict(task.options)
    mode = opts.pop("progress", None)  # set by _progress: where the point's own progress goes
    sink = PointProgress(mode, run_id) if mode else None
    return replace(RunOptions(**opts), progress=sink), sink


def _settle(task: Task, result: Any, served: list[int], wall: float, rows: list[dict[str, Any]],
            curves: list[list[dict[str, Any]]], walls: list[float]) -> None:
    """One backend ``result`` into the rows and curves of the points it ``served``."""
    from ..simulator import trace as tracemod

    first = task.points[served[0]]
    if result.trace is not None:
        tracemod.write(result.trace, Path(task.out_dir) / "runs" / first["_id"] / "measured.ddlt")
    for idx in served:
        rows[idx].update(result.summary)
        curves[idx] = [{"run_id": task.points[idx]["_id"], **c} for c in result.curves]
        walls[idx] += wall


def _run_backend(task: Task, trace: Any, rows: list[dict[str, Any]], curves: list[list[dict[str, Any]]],
                 walls: list[float]) -> None:
    """The backend for each point, once per distinct replay (rows and curves shared)."""
    from ..backends.registry import get_backend

    assert task.backend is not None  # a task without a backend only simulates
    backend = get_backend(task.backend)
    for served in _replays(task, trace).values():
        t0 = time.perf_counter()
        options, sink = _options(task, task.points[served[0]]["_id"])
        try:
            result = backend.run(trace, task.points[served[0]], options)
        finally:
            if sink is not None:
                sink.close()
        _settle(task, result, served, time.perf_counter() - t0, rows, curves, walls)


def _run_backend_many(runs: list[_Run]) -> None:
    """The replays of every run of ``runs`` in one :meth:`run_many` call; each point's wall
    time gets an equal share of the call's."""
    from ..backends.registry import get_backend
    from ..backends.replay import ReplayBackend

    backend = get_backend("replay")
    assert isinstance(backend, ReplayBackend)  # the built-in, which runs many replays in one call
    jobs, served, sinks = [], [], []
    for r in runs:
        for ids in _replays(r.task, r.trace).values():
            options, sink = _options(r.task, r.task.points[ids[0]]["_id"])
            jobs.append((r.trace, r.task.points[ids[0]], options))
            served.append((r, ids))
            sinks.append(sink)
    t0 = time.perf_counter()
    try:
        results = backend.run_many(jobs)
    finally:
        for sink in sinks:
            if sink is not None:
                sink.close()
    share = (time.perf_counter() - t0) / len(jobs)
    for (r, ids), result in zip(served, results):
        _settle(r.task, result, ids, share, r.rows, r.curves, r.walls)


def _checksum(record: dict[str, Any]) -> str:
    """SHA-256 of a record's numbers (row, curves, evaluation schedule) and, when it has one, of
    what they were computed with (``numerics``), as canonical JSON."""
    payload = {k: record.get(k) for k in ("hash", "row", "curves", "evals")}
    if "numerics" in record:  # (records of an earlier ddlsim have none: their checksums stay valid)
        payload["numerics"] = record["numerics"]
    blob = json.dumps(payload, sort_keys=True, default=_json_default, allow_nan=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def store_result(out_dir: Path, record: dict[str, Any]) -> None:
    """Mark a point complete: its ``result.json`` (with a checksum of its numbers), written
    atomically and last."""
    path = out_dir / "runs" / record["row"]["run_id"] / RESULT
    record = {**json.loads(json.dumps(record, default=_json_default)), "checksum": ""}
    record["checksum"] = _checksum(record)
    atomic_write(path, json.dumps(record).encode())


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(type(o).__name__)


def load_result(out_dir: Path, point: dict[str, Any], traces: bool = False,
                keep_failed: bool = False, backend: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """``(record, "")`` when ``point``'s stored result can be kept, else ``(None, why)``.

    Kept only if ``result.json`` is a regular file of bounded size that parses, has the
    expected shape and types, is of this point (its hash) and its numbers are the ones
    written (their checksum), the point did not fail (unless ``keep_failed``), it holds a
    backend's results when ``backend`` is given (not a simulation's only), its
    ``staleness.csv`` is there, and, with ``traces``, its trace file reads and verifies.
    """
    from ..simulator import trace as tracemod

    run_dir = out_dir / "runs" / point["_id"]
    try:
        record = json.loads(read_bounded(run_dir / RESULT, RESULT_MAX_BYTES, "result.json"))
    except FileNotFoundError:
        return None, "not run yet"
    except (OSError, ValueError, RecursionError):
        return None, "unreadable result"
    if not (isinstance(record, dict) and isinstance(record.get("hash"), str)
            and isinstance(record.get("row"), dict) and isinstance(record.get("curves"), list)
            and all(isinstance(c, dict) for c in record["curves"]) and isinstance(record.get("evals", []), list)
            and record["row"].get("run_id") == point["_id"] and isinstance(record.get("checksum"), str)
            and isinstance(record.get("numerics", ""), str)):
        return None, "malformed result"
    if record["hash"] != point_hash(point):
        return None, "another point's result"
    if record["checksum"] != _checksum(record):
        return None, "edited or corrupt result"
    if record["row"].get("error") is not None and not keep_failed:
        return None, "failed before"
    if backend is not None and record["row"].get("error") is None and not BACKEND_MARKS & record["row"].keys():
        return None, "simulated only"  # `run --resume` after `simulate`: the backend still has to run
    if record["row"].get("error") is None:
        if not (run_dir / "staleness.csv").is_file():
            return None, "missing staleness.csv"
        if traces:
            try:
                header = tracemod.read(run_dir / "trace.ddlt").header
            except tracemod.TraceError:
                return None, "missing or corrupt trace"
            if header.get("run_id") != record["row"].get("sim_id"):
                return None, "another simulation's trace"
    return record, ""


def _fmt_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return csv_safe(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def write_tables(out_dir: Path, records: list[dict[str, Any]]) -> None:
    """Write summary.csv, configurations.csv and curves.csv atomically from result records (in
    order); configurations.csv has one row per configuration (:func:`.analysis.metrics.configurations`:
    its replicates' mean, min, max and 95 % interval), its columns those of :data:`CONFIG_TABLE`
    that some row has."""
    rows = [r["row"] for r in records]
    seen: list[str] = []
    for r in rows:
        seen += [k for k in r if k not in seen and not k.startswith("_")]
    swept = [k for k in seen if "." in k and k not in COVERED]
    fixed = LEAD_COLUMNS + swept + [k for k in SIM_COLUMNS + BACKEND_COLUMNS if k in seen]
    ordered = fixed + [k for k in seen if k not in fixed and k not in COVERED + TAIL] + TAIL
    atomic_write(out_dir / "summary.csv", _csv(ordered, rows))
    configs = configurations(rows)
    present = {k for c in configs for k, v in c.items() if v is not None}
    cols = ["config_id", *LEAD_COLUMNS[1:5], *swept, *(k for k in CONFIG_TABLE if k in present or k == "replicates")]
    atomic_write(out_dir / "configurations.csv", _csv(cols, configs))
    curves = [c for r in records for c in r["curves"]]
    ccols = list(CURVE_COLUMNS) + sorted({k for c in curves for k in c} - set(CURVE_COLUMNS))
    atomic_write(out_dir / "curves.csv", _csv(ccols, curves))


CONFIG_TABLE = ["replicates", "seeds", "failed",
                *(f"{c}_{p}" for c in ("final_test_error", "best_test_error") for p in ("mean", "min", "max",
                                                                                    "ci_low", "ci_high")),
                "time_to_target_reached",
                *(f"{c}_{p}" for c in ("time_to_target_s", "sim_time_s") for p in ("mean", "min", "max", "ci_low",
                                                                                 "ci_high")),
                "staleness_mean", "diverged", "did_not_learn"]


def _csv(cols: list[str], rows: Iterable[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([csv_safe(c) for c in cols])
    for r in rows:
        w.writerow([_fmt_cell(r.get(c)) for c in cols])
    return buf.getvalue().encode()


SMALL_SWEEP = 8  # simulations: in-process below this (a worker that imports torch costs seconds)


UNIT_TASKS = 8  # simulations one worker unit replays together (their traces are held at once)


def work_units(tasks: list[tuple[list[int], Task]], backend: str | None) -> list[list[tuple[list[int], Task]]]:
    """The tasks one worker runs together, in sweep order: with the replay backend, the
    seeds of one configuration (their replays share gradient calls, :func:`run_tasks`); else
    each task alone."""
    if backend != "replay":
        return [[t] for t in tasks]
    units: dict[str, list[tuple[list[int], Task]]] = {}
    for ids, task in tasks:
        units.setdefault(configuration_id(task.points[0]), []).append((ids, task))
    # at most UNIT_TASKS simulations a unit: a worker holds each one's trace until its replays end
    return [u[i:i + UNIT_TASKS] for u in units.values() for i in range(0, len(u), UNIT_TASKS)]


def default_jobs(tasks: int) -> int:
    """Worker processes: none (in-process) for a small sweep of at most ``SMALL_SWEEP``
    simulations, else one per core, at most one per simulation. On this project's 2-core
    machine a 6-point sweep of the demo (3 simulations, 5 replays) took 1.3–1.6× longer with 2 worker processes
    than in-process: each worker imports torch again."""
    if tasks <= SMALL_SWEEP:
        return 1
    return max(1, min(tasks, os.cpu_count() or 1))


def run_sweep(scenario: Scenario, out_dir: str | Path, **kw: Any) -> list[dict[str, Any]]:
    """Run every point of ``scenario``; return the result records in sweep order (see
    :func:`run_points` for the options)."""
    return run_points(scenario, scenario.points(), out_dir, **kw)


_SAID_NUMERICS: set[tuple[str, str, int]] = set()  # (folder, numerics, runs) a resume has named in this process


def folder_numerics(records: list[dict[str, Any]]) -> str | None:
    """What the backend results among ``records`` were computed with (each record's
    ``numerics``, written where it ran): the one string when they agree, else each with its
    count of runs ("unrecorded" for results of an earlier ddlsim); None without a backend result."""
    counts: dict[str, int] = {}
    for r in records:
        if r["row"].get("error") is None and BACKEND_MARKS & r["row"].keys():
            value = r.get("numerics")
            key = value if isinstance(value, str) else "unrecorded"
            counts[key] = counts.get(key, 0) + 1
    if len(counts) == 1 and "unrecorded" not in counts:
        return next(iter(counts))
    return "; ".join(f"{k} ({n} run{'s' if n != 1 else ''})" for k, n in counts.items()) or None


def run_points(scenario: Scenario, points: list[dict[str, Any]], out_dir: str | Path, *,
               backend: str | None = None, options: dict[str, Any] | None = None, jobs: int | None = None,
               resume: bool = False, executor: str = "local", scheduler: str | None = None,
               progress: bool = True, engine: str = "auto", traces: bool = False, keep_failed: bool = False,
               on_record: Callable[[dict[str, Any]], None] | None = None,
               force: bool = False, keep_others: bool = False, recompute: Iterable[str] = ()) -> list[dict[str, Any]]:
    """Run ``points`` (some or all of ``scenario``'s) into ``out_dir``; return the result
    records in their order. Without ``resume`` an existing result of a point is recomputed;
    with it, kept if it verifies (:func:`load_result`; failed points are retried unless
    ``keep_failed``). Points that differ only in keys the simulator ignores share one simulation
    (one task); ``keep_others``: runs of other points in ``out_dir`` stay (a cache of runs);
    ``recompute``: run ids recomputed even with ``resume``;
    ``traces``: also write each point's ``trace.ddlt``; ``engine``: the
    simulator's (:func:`ddlsim.simulator.run.simulate`). ``out_dir`` is a
    :class:`~ddlsim.simulator.results_folder.ResultsFolder`: :func:`prepare_folder` refuses,
    before anything is written, a sweep that would delete or replace results it does not
    recompute the same way (unless ``force``).
    """
    with ResultsFolder.open(out_dir, force) as folder:
        return _run_points_in(folder, scenario, points, backend=backend, options=options, jobs=jobs,
                              resume=resume, executor=executor, scheduler=scheduler, progress=progress,
                              engine=engine, traces=traces, keep_failed=keep_failed, on_record=on_record,
                              keep_others=keep_others, recompute=set(recompute))


def _run_points_in(folder: ResultsFolder, scenario: Scenario, points: list[dict[str, Any]], *,
                   backend: str | None, options: dict[str, Any] | None, jobs: int | None, resume: bool,
                   executor: str, scheduler: str | None, progress: bool, engine: str, traces: bool,
                   keep_failed: bool, on_record: Callable[[dict[str, Any]], None] | None,
                   keep_others: bool, recompute: set[str]) -> list[dict[str, Any]]:
    out = folder.root  # absolute: workers (local or Dask) write here, whatever their cwd
    records: list[dict[str, Any] | None] = [None] * len(points)
    todo = []
    why: dict[str, int] = {}
    for idx, p in enumerate(points):
        stored, reason = (load_result(out, p, traces, keep_failed, backend) if resume and p["_id"] not in recompute
                          else (None, ""))
        if stored is not None:
            records[idx] = stored
        else:
            todo.append(idx)
            if reason and reason != "not run yet":
                why[reason] = why.get(reason, 0) + 1
    prepare_folder(folder, str(scenario.base["name"]), {p["_id"]: point_hash(p) for p in points},
                   {points[i]["_id"] for i in todo}, backend, traces, keep_others)
    info = {"path": scenario.path, "name": scenario.base["name"], "axes": scenario.axes,
            "target_error": scenario.base["workload"]["target_error"], "base": scenario.base,
            "points": [p["_id"] for p in points]}
    folder.write("scenario.json", json.dumps(info, indent=1).encode())
    kept = [r for r in records if r is not None]
    if kept and backend and executor == "local":  # (Dask's workers are other machines: their own record)
        here = numerics((options or {}).get("device"))
        other: dict[str, int] = {}
        for r in kept:
            if isinstance(r.get("numerics"), str) and r["numerics"] != here:
                other[r["numerics"]] = other.get(r["numerics"], 0) + 1
        for there, n in other.items():  # a kept run's rounding is another machine's (said once a process)
            if (str(out), there, n) in _SAID_NUMERICS:
                continue
            _SAID_NUMERICS.add((str(out), there, n))
            print(f"resume: {n} of the kept runs were replayed with {there}; this machine's: {here} (their numbers "
                  "may differ by a few test samples; run without --resume to rerun them here)", file=sys.stderr)
    if resume and progress and (len(todo) < len(points) or why):
        detail = "; ".join(f"{n} {r}" for r, n in sorted(why.items()))
        print(f"resume: kept {len(points) - len(todo)}, running {len(todo)}" + (f" (recomputed: {detail})"
              if detail else ""), file=sys.stderr)
    groups: dict[str, list[int]] = {}
    for idx in todo:
        groups.setdefault(simulation_key(points[idx]), []).append(idx)
    tasks = [(ids, Task([points[i] for i in ids], str(out), backend, dict(options or {}), engine, traces))
             for ids in groups.values()]
    units = work_units(tasks, backend)
    jobs = jobs or default_jobs(len(units))
    bar = _progress(len(points), len(points) - len(todo), progress, [t for _, t in tasks])
    failed = 0

    last_write = 0.0

    def finish_unit(unit: list[tuple[list[int], Task]], results: list[list[dict[str, Any]]]) -> None:
        for (ids, _), records_of in zip(unit, results):
            for idx, record in zip(ids, records_of):
                finish(idx, record)

    def finish(idx: int, record: dict[str, Any]) -> None:
        nonlocal failed, last_write
        store_result(out, record)
        records[idx] = record
        failed += record["row"].get("error") is not None
        # small sweeps rewrite the tables after every point; large ones at most once a second
        if len(points) <= TABLE_EVERY_POINT_UP_TO or time.monotonic() - last_write >= TABLE_EVERY_S:
            write_tables(out, [r for r in records if r is not None])
            last_write = time.monotonic()
        if on_record:
            on_record(record)
        left = sum(r is None for r in records)
        bar.set_postfix_str(f"running {min(jobs, left)}, failed {failed}", refresh=False)
        bar.update(1)

    if units and (jobs == 1 or len(units) == 1) and executor == "local":
        try:
            for unit in units:
                finish_unit(unit, run_tasks([t for _, t in unit]))
        except BaseException:
            write_tables(out, [r for r in records if r is not None])
            raise
    elif units:
        ex = make_executor(executor, jobs, scheduler)
        try:
            futures: dict[Future, list[tuple[list[int], Task]]] = {
                ex.submit(run_tasks, [t for _, t in unit]): unit for unit in units}
            for fut in as_completed(futures):
                finish_unit(futures[fut], fut.result())
        except BaseException:  # Ctrl-C, SIGTERM: keep what is stored, stop the workers now
            write_tables(out, [r for r in records if r is not None])
            stop_executor(ex)
            raise
        ex.shutdown(wait=True)
    bar.close()
    done = [r for r in records if r is not None]
    write_tables(out, done)
    if (machines := folder_numerics(done)) is not None:  # what the replays' rounding depended on
        folder.write("scenario.json", json.dumps({**info, "numerics": machines}, indent=1).encode())
    return done


def run_files(point_id: str, backend: str | None, traces: bool) -> list[str]:
    """The files a point's run writes, relative to the results folder."""
    base = f"runs/{point_id}/"
    files = [base + "staleness.csv", base + RESULT]
    if traces:
        files.append(base + "trace.ddlt")
    if backend not in (None, "replay"):
        files.append(base + "measured.ddlt")
    return files


TABLES = ["scenario.json", "summary.csv", "configurations.csv", "curves.csv"]
DERIVED = ("figures/", "report.html")  # drawn from the tables: stale once the runs change


def prepare_folder(folder: ResultsFolder, name: str, hashes: dict[str, str], redo: set[str],
                   backend: str | None, traces: bool, keep_others: bool = False) -> None:
    """Make ``folder`` ready for a sweep of scenario ``name`` whose points are ``hashes`` (run
    id → point hash) and that (re)computes the runs ``redo``, or refuse in one line with
    nothing written.

    Refused unless ``folder.force``: a run of another sweep that this one would delete, a run
    it would recompute from another point (another hash), a run with a backend's results
    (accuracy) that it would replace by another backend's or by none, and any file it would
    write that ddlsim did not (the user's own summary.csv). Then the dropped runs' files and
    the figures and report drawn from the old tables go (ddlsim's files only), temporaries
    of interrupted writes go, and the planned files and runs are recorded. ``keep_others``:
    the folder is a cache of runs (advise's replays), and runs of other points stay.
    """
    others = [] if keep_others else [r for r in folder.runs if r not in hashes]
    # a run recorded but never completed (a first sweep interrupted) holds no results to lose
    dropped = [r for r in others if os.path.lexists(folder.root / "runs" / r / RESULT)]
    changed = [r for r in redo if r in folder.runs and folder.runs[r].get("hash") != hashes[r]]
    lost = [r for r in redo if r in folder.runs and folder.runs[r].get("backend") not in (None, backend)]
    if (dropped or changed or lost) and not folder.force:
        held = folder.info.get("scenario")
        what = []
        if dropped:
            names = {r.rsplit("-", 1)[0] for r in hashes}  # a run id: the configuration's name, then its hash
            renamed = sum(r.rsplit("-", 1)[0] in names for r in dropped)
            what.append(f"delete {len(dropped)} runs this sweep does not have" + (
                f" ({renamed} of them under the names of this sweep's configurations but another hash: an "
                "earlier ddlsim's ids, or other values of keys the names leave out)" if renamed else ""))
        if changed:
            what.append(f"replace {len(changed)} runs by other points of the same name")
        if lost:
            kinds = sorted({str(folder.runs[r]["backend"]) for r in lost})
            what.append(f"drop the {'/'.join(kinds)} results of {len(lost)} runs"
                        + (" (a simulation keeps no accuracy)" if backend is None else f" for {backend}'s"))
        raise FileRefused(f"--out {folder.root}: holds {len(folder.runs)} runs of "
                          + (f"scenario {held!r}" if held else "another sweep") + "; this command would "
                          + " and ".join(what) + ": choose another --out, or --force to replace them")
    planned = list(TABLES)
    for r in hashes:  # and the kept runs' files (verified by load_result) that are there
        planned += [f for f in run_files(r, backend, traces) if r in redo or os.path.lexists(folder.root / f)]
    folder.claim(planned)
    gone = set(others)  # the dropped runs, and the recorded ones that never completed
    stale = [f for f in folder.files if f.startswith("runs/") and f.split("/", 2)[1] in gone]
    if redo or dropped:
        stale += [f for d in DERIVED for f in folder.under(d)]
    folder.remove(stale)
    folder.remove_temporaries()
    for r in gone:
        del folder.runs[r]
    for r, h in hashes.items():
        if r in redo or r not in folder.runs:
            folder.runs[r] = {"hash": h, "backend": backend}
    folder.info.update({"scenario": name, "points": len(hashes)})
    folder.save()


POLL_S = 0.5  # the terminal bar re-reads what the running points reported this often


def _progress(total: int, initial: int, enabled: bool, tasks: Iterable[Task] = ()) -> Any:
    """The sweep's progress on stderr (``update``, ``set_postfix_str``, ``close``), and where
    each task's points report their own (``task.options["progress"]``, read by
    :func:`_run_backend`). A terminal gets a bar whose postfix also shows what each running
    point last reported (``replay 3/20 epochs``, ``live 120/400 gradients``: through a channel
    folder, re-read every ``POLL_S``); anything else (a log, a pipe) gets plain lines, never a
    carriage return: one each time another 5 % of the points is done (every point of a sweep
    of at most 20) and a running point's own line at most every ``LINE_EVERY_S``. When numba
    will compile the simulator's kernels first, one line says so before anything runs."""
    from ..backends.base import LINES

    tasks = list(tasks)
    if not enabled:
        return _Quiet()
    from ..simulator.run import kernels_to_compile

    compiling = kernels_to_compile([p for t in tasks for p in t.points], tasks[0].engine) if tasks else []
    if compiling:
        print("ddlsim: compiling the simulator's kernels (first run only; numba caches them)", file=sys.stderr,
              flush=True)
    if not _is_terminal(sys.stderr):
        for t in tasks:
            t.options["progress"] = LINES
        return _Lines(total, initial)
    import tempfile

    channel = tempfile.mkdtemp(prefix="ddlsim-progress-")
    for t in tasks:
        t.options["progress"] = channel
    return _Bar(total, initial, channel, "compiling kernels (first run only)" if compiling else "")


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


class _Quiet:
    """No progress shown (``--quiet``)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass


class _Lines(_Quiet):
    """Plain progress lines for a log: ``sweep: 3/72 runs done (4 %), running 2, failed 0, 12 s``
    each time the count passes another 5 % of the runs, and at the last."""

    def __init__(self, total: int, initial: int) -> None:
        self.total, self.done, self.postfix = total, initial, ""
        self.step = max(1, math.ceil(total / 20))
        self.t0 = time.monotonic()
        if total > initial:
            print(f"sweep: {total} runs, {initial} done", file=sys.stderr, flush=True)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def update(self, n: int = 1) -> None:
        before, self.done = self.done, self.done + n
        if self.done // self.step > before // self.step or self.done == self.total:
            pct = 100 * self.done // max(1, self.total)
            rest = f", {self.postfix}" if self.postfix else ""
            print(f"sweep: {self.done}/{self.total} runs done ({pct} %){rest}, {time.monotonic() - self.t0:.0f} s",
                  file=sys.stderr, flush=True)


class _Bar(_Quiet):
    """A terminal's tqdm bar; its postfix is the sweep's (running, failed) then what each
    running point last wrote into ``channel``, re-read every ``POLL_S`` by a thread (which
    also keeps the elapsed time moving while a long point runs)."""

    def __init__(self, total: int, initial: int, channel: str, postfix: str) -> None:
        import shutil
        import threading
        import weakref

        from tqdm import tqdm

        self.channel, self.postfix = channel, postfix
        self.bar = tqdm(total=total, initial=initial, unit="run", desc="sweep", file=sys.stderr,
                        dynamic_ncols=True, leave=True)
        self._stop = threading.Event()
        self._removal = weakref.finalize(self, shutil.rmtree, channel, True)  # also at exit, e.g. Ctrl-C
        self._thread = threading.Thread(target=self._poll, name="ddlsim-progress", daemon=True)
        self._thread.start()
        self.bar.set_postfix_str(self.compose(), refresh=True)

    def compose(self) -> str:
        """The postfix: the sweep's own, then ``RUN: what it reported`` per running point."""
        from ..backends.base import read_channel

        inner = [f"{run_id.rsplit('-', 1)[0]}: {text}" for run_id, text in read_channel(self.channel).items()]
        return " · ".join([self.postfix] * bool(self.postfix) + inner)

    def _poll(self) -> None:
        while not self._stop.wait(POLL_S):
            self.bar.set_postfix_str(self.compose(), refresh=True)

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s
        self.bar.set_postfix_str(self.compose(), refresh=refresh)

    def update(self, n: int = 1) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.bar.close()
        self._removal()


__all__ = ["Task", "run_sweep", "run_points", "run_task", "run_tasks", "write_tables", "load_result"]
