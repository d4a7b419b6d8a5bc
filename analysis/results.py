"""Loading a results directory: summary, curves, per-run staleness, scenario name.

Layout read (every part optional, but at least one of the two CSVs must exist)::

    results_dir/summary.csv             one row per run
    results_dir/curves.csv              one row per run and evaluation
    results_dir/runs/<run_id>/staleness.csv   columns staleness,count
    results_dir/scenario.json               written by the sweep runner: ``name``, ``path``
    results_dir/scenario.toml (or *.toml)   a copy of the scenario, when there is no JSON
"""

from __future__ import annotations

import json
import os
import tomllib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..simulator.catalog import dataset_info
from ..simulator.files import read_bounded
from .table import CONFIG_COLUMNS, Table, is_number, swept_keys

TARGET_COLUMNS = ("workload.target_error", "target_error")
# Columns ddlsim writes as numbers: a cell there that is not one is read as missing (with a note)
NUMERIC_COLUMNS = (
    "learners", "minibatch", "softsync_n", "gradients", "updates", "iterations", "sim_time_s",
    "iteration_time_s", "gradients_per_s", "staleness_mean", "staleness_p50", "staleness_p99",
    "staleness_max", "server_utilization", "server_wait_mean_s", "link_in_utilization",
    "link_out_utilization", "compute_utilization", "final_test_error", "best_test_error",
    "time_to_target_s", "diverged_at_update", "wall_s", "measured_time_s", "measured_sim_time_s",
    "measured_gradients_per_s", "measured_staleness_mean", "epoch", "test_error", "train_loss",
    "staleness", "count", "workload.target_error", "target_error")


@dataclass
class Results:
    """The tables of one results directory."""

    root: Path
    summary: Table = field(default_factory=Table)
    curves: Table = field(default_factory=Table)
    staleness: Table = field(default_factory=Table)
    name: str = ""
    target_error: float | None = None
    test_size: int | None = None  # test samples behind each error (one data set), when known
    notes: list[str] = field(default_factory=list)  # cells read as missing, files skipped
    numerics: str | None = None  # what the replay's rounding depended on (backends.device.numerics), if recorded


def _read(path: Path) -> Table:
    return Table.read_csv(path, NUMERIC_COLUMNS) if path.is_file() else Table()


def load_results(results_dir: str | os.PathLike[str]) -> Results:
    """Read every table of ``results_dir``; raise ``FileNotFoundError`` when it holds
    neither ``summary.csv`` nor ``curves.csv``."""
    root = Path(results_dir)
    if not (root / "summary.csv").is_file() and not (root / "curves.csv").is_file():
        raise FileNotFoundError(f"{root}: no summary.csv or curves.csv (not a results directory?)")
    summary = _read(root / "summary.csv")
    curves = _read(root / "curves.csv")
    scenario = _scenario_file(root)
    notes = summary.notes + curves.notes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        staleness = load_staleness(root, summary)
    notes += [str(w.message) for w in caught]
    for line in notes:
        warnings.warn(line, stacklevel=2)
    return Results(root=root, summary=summary, curves=curves, staleness=staleness,
                   name=scenario_name(root, summary, scenario),
                   target_error=_target_error(summary, scenario),
                   test_size=_test_size(summary, scenario), notes=notes,
                   numerics=scenario["numerics"] if isinstance(scenario.get("numerics"), str) else None)


def load_staleness(results_dir: str | os.PathLike[str], summary: Table | None = None) -> Table:
    """Rows ``run_id, staleness, count`` from ``runs/*/staleness.csv`` (the folder name
    is the run id), joined with each run's configuration columns from ``summary``.
    Unreadable files are skipped with a warning."""
    runs = Path(results_dir) / "runs"
    config = {str(r.get("run_id")): r for r in (summary or Table())}
    rows: list[dict[str, Any]] = []
    for path in sorted(runs.glob("*/staleness.csv")) if runs.is_dir() else []:
        rid = path.parent.name
        try:
            table = Table.read_csv(path, ("staleness", "count"))
        except (OSError, UnicodeDecodeError, ValueError) as e:
            warnings.warn(f"{path}: skipped ({e})", stacklevel=2)
            continue
        for line in table.notes:
            warnings.warn(line, stacklevel=2)
        head = config.get(rid, {})
        extra = {c: head.get(c) for c in (*CONFIG_COLUMNS, *swept_keys(head))}
        for r in table:
            rows.append({"run_id": rid, **extra, "staleness": r.get("staleness"),
                         "count": r.get("count")})
    return Table(rows)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(read_bounded(path, 1 << 20, "scenario file").decode("utf-8-sig"))
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, RecursionError):
        return {}


def _scenario_file(root: Path) -> dict[str, Any]:
    """The scenario as far as the results directory records it: the runner's
    ``scenario.json`` (its ``name``, and the scenario file it names, if still readable),
    else a ``scenario.toml`` or other ``*.toml`` copy."""
    try:
        info = json.loads(read_bounded(root / "scenario.json", 16 << 20, "scenario.json"))
    except (OSError, ValueError, RecursionError):
        info = None
    if isinstance(info, dict):
        source = _read_toml(Path(info["path"])) if isinstance(info.get("path"), str) else {}
        return {**source, **{k: v for k, v in info.items() if k != "path"}}
    for p in [root / "scenario.toml"] + sorted(root.glob("*.toml")):
        if p.is_file() and (data := _read_toml(p)):
            return data
    return {}


def scenario_name(root: Path, summary: Table, scenario: dict[str, Any] | None = None) -> str:
    """The scenario's ``name``: from its TOML copy, else a single-valued ``scenario``
    column of the summary, else the directory's name."""
    if scenario and isinstance(scenario.get("name"), str):
        return scenario["name"]
    for col in ("scenario", "name"):
        values = {v for v in summary.column(col) if isinstance(v, str) and v}
        if len(values) == 1:
            return values.pop()
    return root.resolve().name


def _target_error(summary: Table, scenario: dict[str, Any]) -> float | None:
    """The target error when all runs share one: a summary column, else the scenario's."""
    for col in TARGET_COLUMNS:
        values = {v for v in summary.column(col) if is_number(v)}
        if len(values) == 1:
            return float(values.pop())
    workload = scenario.get("workload")
    value = workload.get("target_error") if isinstance(workload, dict) else scenario.get("target_error")
    return float(value) if is_number(value) else None


def _test_size(summary: Table, scenario: dict[str, Any]) -> int | None:
    """How many test samples each error of the runs counts (so a difference of one sample is
    ``1 / test_size``): the size of the test set of the runs' one data set, named by a
    ``workload.dataset`` column or the scenario; ``None`` when unknown or several."""
    given = scenario.get("base")
    base: dict[str, Any] = given if isinstance(given, dict) else scenario
    given = base.get("workload")
    workload: dict[str, Any] = given if isinstance(given, dict) else {}
    names = {v for v in summary.column("workload.dataset") if isinstance(v, str)}
    if not names and isinstance(workload.get("dataset"), str):
        names = {workload["dataset"]}
    if len(names) != 1:
        return None
    samples = workload.get("teacher_samples")
    features = workload.get("teacher_features")
    sizes: dict[str, Any] = {**({"teacher_samples": samples} if is_number(samples) else {}),
                             **({"teacher_features": features} if is_number(features) else {})}
    try:
        info = dataset_info(names.pop(), **sizes)
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return int(info.test_size) if info.test_size >= 1 else None


__all__ = ["Results", "load_results", "load_staleness", "scenario_name"]
