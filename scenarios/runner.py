"""The sweep runner: every point of a scenario, simulated (and executed by a backend).

Rules kept here:

* one point = one directory ``runs/<run_id>/`` holding ``trace.ddlt``, ``staleness.csv``
  (written by the worker) and, written last and atomically by the coordinator,
  ``result.json`` (the summary row and the curves);
  a point whose ``result.json`` exists with the same point hash is complete, so a sweep
  killed at any moment resumes (``resume=True``) without losing or duplicating a run;
* ``summary.csv`` and ``curves.csv`` are rewritten atomically from the results after
  every completed point, in sweep order;
* a point that fails is recorded (``error`` column) and the others go on;
* points run on a ``concurrent.futures`` executor (local processes, one torch thread
  each) or in-process when there is one job.
"""

from __future__ import annotations

import csv
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
from typing import Any, Callable, Iterable

from ..simulator.files import atomic_write
from ..simulator.protocols import spec_of
from .executors import make_executor, stop_executor
from .load import Scenario, point_hash

RESULT = "result.json"
LEAD_COLUMNS = ["run_id", "protocol", "learners", "minibatch", "softsync_n"]
SIM_COLUMNS = ["gradients", "updates", "sim_time_s", "gradients_per_s", "staleness_mean", "staleness_p50",
               "staleness_p99", "staleness_max", "server_utilization", "server_wait_mean_s"]
BACKEND_COLUMNS = ["final_test_error", "best_test_error", "time_to_target_s", "diverged"]
COVERED = ["protocol.name", "cluster.learners", "cluster.minibatch", "protocol.n"]
TAIL = ["error", "wall_s"]
TABLE_EVERY_S = 1.0
TABLE_EVERY_POINT_UP_TO = 200
CURVE_COLUMNS = ["run_id", "epoch", "updates", "sim_time_s", "test_error", "train_loss"]


@dataclass
class Task:
    """What a worker needs to run one point."""

    point: dict[str, Any]
    out_dir: str
    backend: str | None
    options: dict[str, Any]


def lead_values(point: dict[str, Any]) -> dict[str, Any]:
    """The identifying columns of a point's summary row."""
    proto = point["protocol"]["name"]
    lam = point["cluster"]["learners"]
    row = {"run_id": point["_id"], "protocol": proto, "learners": lam,
           "minibatch": point["cluster"]["minibatch"],
           "softsync_n": spec_of(point).softsync_of(lam, point["protocol"]["n"])}
    for k, v in point.get("_swept", {}).items():
        row.setdefault(k, v)
    return row


def _staleness_csv(hist: list[tuple[int, int]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["staleness", "count"])
    w.writerows(hist)
    return buf.getvalue().encode()


def run_task(task: Task) -> dict[str, Any]:
    """Simulate one point (and run its backend); write its run directory; return the result."""
    from ..simulator import trace as tracemod
    from ..simulator.run import simulate
    from ..simulator.stats import staleness_histogram

    point = task.point
    run_dir = Path(task.out_dir) / "runs" / point["_id"]
    row = lead_values(point)
    curves: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        sim = simulate(point)
        row.update(sim.summary)
        tracemod.write(sim.trace, run_dir / "trace.ddlt")
        atomic_write(run_dir / "staleness.csv", _staleness_csv(staleness_histogram(sim.trace)))
        if task.backend:
            from ..backends.base import RunOptions
            from ..backends.registry import get_backend

            options = RunOptions(**task.options)
            result = get_backend(task.backend).run(sim.trace, point, options)
            row.update(result.summary)
            curves = [{"run_id": point["_id"], **c} for c in result.curves]
            if result.trace is not None:
                tracemod.write(result.trace, run_dir / "measured.ddlt")
        row["error"] = None
    except Exception as e:  # recorded, never raised: one bad point must not stop a sweep
        row["error"] = f"{type(e).__name__}: {e}".splitlines()[0]
        row["_traceback"] = traceback.format_exc()
    row["wall_s"] = time.perf_counter() - t0
    return {"hash": point_hash(point), "row": row, "curves": curves}


def store_result(out_dir: Path, record: dict[str, Any]) -> None:
    """Mark a point complete: its ``result.json``, written atomically and last."""
    path = out_dir / "runs" / record["row"]["run_id"] / RESULT
    atomic_write(path, json.dumps(record, default=_json_default).encode())


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(type(o).__name__)


def load_result(out_dir: Path, point: dict[str, Any]) -> dict[str, Any] | None:
    """The stored result of ``point`` if it is complete and of the same point hash."""
    path = out_dir / "runs" / point["_id"] / RESULT
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("hash") == point_hash(point) else None


def _fmt_cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return repr(v)
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    return str(v)


def write_tables(out_dir: Path, records: list[dict[str, Any]]) -> None:
    """Write summary.csv and curves.csv atomically from result records (in order)."""
    rows = [r["row"] for r in records]
    seen: list[str] = []
    for r in rows:
        seen += [k for k in r if k not in seen and not k.startswith("_")]
    swept = [k for k in seen if "." in k and k not in COVERED]
    fixed = LEAD_COLUMNS + swept + [k for k in SIM_COLUMNS + BACKEND_COLUMNS if k in seen]
    ordered = fixed + [k for k in seen if k not in fixed and k not in COVERED + TAIL] + TAIL
    atomic_write(out_dir / "summary.csv", _csv(ordered, rows))
    curves = [c for r in records for c in r["curves"]]
    ccols = list(CURVE_COLUMNS) + sorted({k for c in curves for k in c} - set(CURVE_COLUMNS))
    atomic_write(out_dir / "curves.csv", _csv(ccols, curves))


def _csv(cols: list[str], rows: Iterable[dict[str, Any]]) -> bytes:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in rows:
        w.writerow([_fmt_cell(r.get(c)) for c in cols])
    return buf.getvalue().encode()


def default_jobs(points: int) -> int:
    """Worker processes: one per core, at most one per point."""
    return max(1, min(points, os.cpu_count() or 1))


def run_sweep(scenario: Scenario, out_dir: str | Path, **kw: Any) -> list[dict[str, Any]]:
    """Run every point of ``scenario``; return the result records in sweep order (see
    :func:`run_points` for the options)."""
    return run_points(scenario, scenario.points(), out_dir, **kw)


def run_points(scenario: Scenario, points: list[dict[str, Any]], out_dir: str | Path, *,
               backend: str | None = None, options: dict[str, Any] | None = None, jobs: int | None = None,
               resume: bool = False, executor: str = "local", scheduler: str | None = None,
               progress: bool = True,
               on_record: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run ``points`` (some or all of ``scenario``'s) into ``out_dir``; return the result
    records in their order. Without ``resume`` an existing result of a point is recomputed;
    with it, kept.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "scenario.json", json.dumps(
        {"path": scenario.path, "name": scenario.base["name"], "axes": scenario.axes,
         "target_error": scenario.base["workload"]["target_error"], "base": scenario.base,
         "points": [p["_id"] for p in points]}, indent=1).encode())
    records: list[dict[str, Any] | None] = [None] * len(points)
    todo = []
    for idx, p in enumerate(points):
        stored = load_result(out, p) if resume else None
        if stored is not None:
            records[idx] = stored
        else:
            todo.append(idx)
    tasks = {idx: Task(points[idx], str(out), backend, dict(options or {})) for idx in todo}
    jobs = jobs or default_jobs(len(todo))
    bar = _progress(len(points), len(points) - len(todo), progress)
    failed = 0

    last_write = 0.0

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

    if todo and (jobs == 1 or len(todo) == 1) and executor == "local":
        try:
            for idx in todo:
                finish(idx, run_task(tasks[idx]))
        except BaseException:
            write_tables(out, [r for r in records if r is not None])
            raise
    elif todo:
        ex = make_executor(executor, jobs, scheduler)
        try:
            futures: dict[Future, int] = {ex.submit(run_task, tasks[idx]): idx for idx in todo}
            for fut in as_completed(futures):
                finish(futures[fut], fut.result())
        except BaseException:  # Ctrl-C, SIGTERM: keep what is stored, stop the workers now
            write_tables(out, [r for r in records if r is not None])
            stop_executor(ex)
            raise
        ex.shutdown(wait=True)
    bar.close()
    done = [r for r in records if r is not None]
    write_tables(out, done)
    return done


def _progress(total: int, initial: int, enabled: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, unit="run", desc="sweep", file=sys.stderr,
                disable=not enabled, dynamic_ncols=True, leave=True)


__all__ = ["Task", "run_sweep", "run_points", "run_task", "write_tables", "load_result"]
