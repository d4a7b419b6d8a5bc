"""``ddlsim validate``: run every sweep point live and simulated, and compare.

For each point: a live run (``backends/live.py``), then a simulation of the same point
whose network and server costs come from a calibrated profile (``--profile``, written by
``ddlsim calibrate``) when one is given. Compared: time per epoch (relative error
(simulated − measured) / measured), throughput, staleness mean and the total-variation
distance between the staleness histograms. Writes ``validation.csv`` and
``validation.png``/``.svg`` into the output directory and prints the table with the
median |relative error|.
"""

from __future__ import annotations

import copy
import csv
import io
import math
import statistics
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from ..simulator.run import simulate
from ..analysis.figures import figure_bytes
from ..simulator.files import FileRefused, atomic_write, read_bounded
from .load import Scenario
from .schema import ScenarioError

COLUMNS = ["run_id", "protocol", "learners", "stragglers", "epochs", "measured_time_per_epoch_s",
           "simulated_time_per_epoch_s", "time_rel_error", "measured_gradients_per_s", "simulated_gradients_per_s",
           "measured_staleness_mean", "simulated_staleness_mean", "staleness_tv_distance"]


def tv_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Total-variation distance between the histograms of two non-negative integer samples."""
    if len(a) == 0 or len(b) == 0:
        return math.nan
    top = int(max(a.max(), b.max())) + 1
    return float(0.5 * np.abs(np.bincount(a, minlength=top) / len(a) - np.bincount(b, minlength=top) / len(b)).sum())


def apply_profile(point: dict[str, Any], profile: str | None) -> dict[str, Any]:
    """The point with its network and server costs taken from a calibrated profile."""
    p = copy.deepcopy(point)
    if not profile:
        return p
    try:
        data = tomllib.loads(read_bounded(profile, 1 << 20, "calibrated profile").decode("utf-8-sig"))
    except FileRefused as e:
        raise ScenarioError(f"--profile {e}") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(f"--profile {profile}: cannot read the calibrated profile ({e})") from None
    if not isinstance(data.get("network", {}), dict) or not isinstance(data.get("server", {}), dict):
        raise ScenarioError(f"--profile {profile}: [network] and [server] must be tables")
    for key, value in data.get("network", {}).items():
        if key in ("latency_s", "bandwidth_Bps") and isinstance(value, (int, float)) and math.isfinite(value):
            p["cluster"]["network"][key] = float(value)
    if isinstance(data.get("server", {}).get("apply_s"), (int, float)):
        p["cluster"]["server"]["apply_s"] = float(data["server"]["apply_s"])
    if p["live"]["compute"] == "real" and "seconds" in data:
        p["cluster"]["compute"]["profile"] = str(Path(profile).resolve())
    return p


def validate_point(point: dict[str, Any], profile: str | None, device: str = "cpu") -> dict[str, Any]:
    """Live and simulated runs of one point; the comparison row."""
    from ..backends.base import RunOptions
    from ..backends.live import LiveBackend

    first = simulate(point)
    live = LiveBackend().run(first.trace, point, RunOptions(device=device))
    sim = simulate(apply_profile(point, profile))
    epochs = point["workload"]["epochs"]
    m_t, s_t = live.summary["measured_time_s"], sim.summary["sim_time_s"]
    return {
        "run_id": point["_id"], "protocol": point["protocol"]["name"], "learners": point["cluster"]["learners"],
        "stragglers": point["cluster"]["stragglers"]["fraction"], "epochs": epochs,
        "measured_time_per_epoch_s": m_t / epochs, "simulated_time_per_epoch_s": s_t / epochs,
        "time_rel_error": (s_t - m_t) / m_t if m_t > 0 else math.nan,
        "measured_gradients_per_s": live.summary["measured_gradients_per_s"],
        "simulated_gradients_per_s": sim.summary["gradients_per_s"],
        "measured_staleness_mean": live.summary["measured_staleness_mean"],
        "simulated_staleness_mean": sim.summary["staleness_mean"],
        "staleness_tv_distance": tv_distance(live.trace.inputs["staleness"], sim.trace.inputs["staleness"]),
    }


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    buf = io.StringIO()
    w = csv.DictWriter(buf, COLUMNS, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    atomic_write(path, buf.getvalue().encode())


def figure(rows: list[dict[str, Any]]) -> Any:
    """Simulated against measured time per epoch, y = x, each point's relative error."""
    from ..analysis.plots import simulated_vs_measured
    from ..analysis.table import Table

    table = Table([{"run_id": r["run_id"], "protocol": r["protocol"], "learners": r["learners"],
                    "cluster.stragglers.fraction": r["stragglers"], "epochs": r["epochs"],
                    "sim_time_s": r["simulated_time_per_epoch_s"] * r["epochs"],
                    "measured_sim_time_s": r["measured_time_per_epoch_s"] * r["epochs"]} for r in rows])
    return simulated_vs_measured(table)


def validate(scenario: Scenario, out: Path, profile: str | None = None, progress: bool = True,
             resume: bool = False, device: str = "cpu") -> list[dict]:
    """Validate every point of ``scenario``; write the table and the figure into ``out``. Live
    runs go one at a time (parallel runs would disturb each other's timings); ``resume`` keeps
    the rows of points already in ``out/validation.csv``."""
    from tqdm import tqdm

    points = scenario.points()
    if profile:
        apply_profile(points[0], profile)  # a bad profile fails before the first live run
    out.mkdir(parents=True, exist_ok=True)
    kept = _stored_rows(out / "validation.csv") if resume else {}
    rows: list[dict[str, Any]] = []
    for point in tqdm(points, desc="validate", unit="run", disable=not progress):
        rows.append(kept.get(point["_id"]) or validate_point(point, profile, device))
        write_csv(rows, out / "validation.csv")
    fig = figure(rows)
    for ext in ("png", "svg"):
        atomic_write(out / f"validation.{ext}", figure_bytes(fig, ext))
    return rows


def _stored_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of an earlier validation.csv, by run id, numbers as numbers."""
    try:
        text = read_bounded(path, 16 << 20, "validation table").decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return {}
    out = {}
    for r in csv.DictReader(io.StringIO(text)):
        try:
            row = {k: (r[k] if k in ("run_id", "protocol") else float(r[k])) for k in COLUMNS}
        except (KeyError, TypeError, ValueError):
            continue
        row["learners"] = int(row["learners"])
        out[row["run_id"]] = row
    return out


def median_abs_error(rows: list[dict[str, Any]]) -> float:
    """Median |relative error| of time per epoch."""
    errs = [abs(r["time_rel_error"]) for r in rows if math.isfinite(r["time_rel_error"])]
    return statistics.median(errs) if errs else math.nan
