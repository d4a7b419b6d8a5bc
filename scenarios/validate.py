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
import sys
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

from ..simulator.network_profile import NETWORK_KEYS
from ..simulator.run import simulate
from ..analysis.figures import figure_bytes
from ..simulator.files import FileRefused, atomic_write, read_bounded
from .load import Scenario
from .schema import ScenarioError

COLUMNS = ["run_id", "protocol", "learners", "stragglers", "epochs", "measured_time_per_epoch_s",
           "simulated_time_per_epoch_s", "time_rel_error", "measured_gradients_per_s", "simulated_gradients_per_s",
           "measured_staleness_mean", "simulated_staleness_mean", "staleness_tv_distance"]
# the columns no validation writes a negative number in (a relative error may be negative)
NON_NEGATIVE = tuple(c for c in COLUMNS if c not in ("run_id", "protocol", "learners", "time_rel_error"))


def tv_distance(a: np.ndarray, b: np.ndarray) -> float:
    """Total-variation distance between the histograms of two non-negative integer samples."""
    if len(a) == 0 or len(b) == 0:
        return math.nan
    top = int(max(a.max(), b.max())) + 1
    return float(0.5 * np.abs(np.bincount(a, minlength=top) / len(a) - np.bincount(b, minlength=top) / len(b)).sum())


# (table, key, the scenario key it sets): a calibrated profile's [network] and [server] figures, and
# every cluster.network key a network profile (`ddlsim calibrate --nccl-tests` / `--network`) may hold
PROFILE_KEYS = tuple(("network", key, f"cluster.network.{key}") for key in NETWORK_KEYS) \
    + (("server", "apply_s", "cluster.server.apply_s"),)


def read_profile(profile: str) -> dict[str, Any]:
    """The calibrated profile's TOML, its ``[network]`` and ``[server]`` figures checked as the
    scenario keys they set are (a number, not NaN, in the key's range: a latency or an apply
    time ≥ 0, a bandwidth ≥ 1 B/s or inf); anything else is one ScenarioError line naming the
    file, the key and the value."""
    from ..simulator.compute import ProfileError, load_profile
    from .load import fmt_value
    from .schema import FIELD_BY_KEY, check_value

    try:
        data = tomllib.loads(read_bounded(profile, 1 << 20, "calibrated profile").decode("utf-8-sig"))
    except FileRefused as e:
        raise ScenarioError(f"--profile {e}") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ScenarioError(f"--profile {profile}: cannot read the calibrated profile ({e})") from None
    except ValueError:  # tomllib's only other ValueError: an integer longer than Python converts
        raise ScenarioError(f"--profile {profile}: an integer of more than {sys.get_int_max_str_digits():,} "
                            "digits") from None
    if not isinstance(data.get("network", {}), dict) or not isinstance(data.get("server", {}), dict):
        raise ScenarioError(f"--profile {profile}: [network] and [server] must be tables")
    for table, key, target in PROFILE_KEYS:
        if key in data.get(table, {}):
            value, problem = check_value(FIELD_BY_KEY[target], data[table][key])
            if problem:
                raise ScenarioError(f"--profile {profile}: [{table}] {key} = {fmt_value(data[table][key])}: {problem}")
            data[table][key] = value
    if "minibatch" in data or "seconds" in data:  # the compute table the simulation will read, checked now
        try:
            load_profile(profile)
        except ProfileError as e:
            raise ScenarioError(f"--profile {e}") from None
    if not any(key in data.get(table, {}) for table, key, _ in PROFILE_KEYS) and "seconds" not in data:
        raise ScenarioError(f"--profile {profile}: holds no figure a validation uses ([network] "
                            f"{', '.join(NETWORK_KEYS)}, [server] apply_s, or a compute table); is it a profile "
                            "ddlsim calibrate wrote?")
    return data


def apply_profile(point: dict[str, Any], profile: str | None) -> dict[str, Any]:
    """The point with its network and server costs taken from a calibrated profile
    (:func:`read_profile`: a bad figure is refused, never simulated)."""
    p = copy.deepcopy(point)
    if not profile:
        return p
    data = read_profile(profile)
    for table, key, target in PROFILE_KEYS:
        if key in data.get(table, {}):
            section, name = target.rsplit(".", 2)[-2:]
            p["cluster"][section][name] = float(data[table][key])
    if p["live"]["compute"] == "real" and "seconds" in data:
        p["cluster"]["compute"]["profile"] = str(Path(profile).resolve())
    return p


def validate_point(point: dict[str, Any], profile: str | None, device: str = "cpu") -> dict[str, Any]:
    """Live and simulated runs of one point; the comparison row."""
    from ..backends.base import RunOptions
    from ..backends.live import LiveBackend

    first = simulate(point)
    assert first.trace is not None  # simulate keeps the trace unless told not to
    live = LiveBackend().run(first.trace, point, RunOptions(device=device))
    sim = simulate(apply_profile(point, profile))
    assert live.trace is not None and sim.trace is not None  # the live backend returns its measured trace
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
                    "cluster.stragglers": r["stragglers"], "epochs": r["epochs"],
                    "sim_time_s": r["simulated_time_per_epoch_s"] * r["epochs"],
                    "measured_sim_time_s": r["measured_time_per_epoch_s"] * r["epochs"]} for r in rows])
    return simulated_vs_measured(table)


def check_points(points: list[dict[str, Any]], profile: str | None, force: bool = False) -> None:
    """Everything that would stop a validation, checked before its first live run: the
    profile's figures, each point with the profile applied (:func:`apply_profile`), the live
    backend's refusals (a protocol or setting it has no live version of) and its size limit
    (``force`` lifts that one)."""
    for point in points:
        apply_profile(point, profile)
    from ..backends.base import BackendError
    from ..backends.live import check_live_size  # imports torch: after the profile's quick checks
    from ..simulator.protocols import live_refusal

    for point in points:
        refusal = live_refusal(point)
        if refusal:
            raise BackendError(f"point {point['_id']}: {refusal}")
    check_live_size(points, force)


def validate(scenario: Scenario, out: Path, profile: str | None = None, progress: bool = True,
             resume: bool = False, device: str = "cpu", force: bool = False) -> list[dict]:
    """Validate every point of ``scenario``; write the table and the figure into ``out``. Live
    runs go one at a time (parallel runs would disturb each other's timings); ``resume`` keeps
    the rows of points already in ``out/validation.csv``. Nothing runs or is written until
    every point passes :func:`check_points`."""
    from tqdm import tqdm

    points = scenario.points()
    check_points(points, profile, force)
    out.mkdir(parents=True, exist_ok=True)
    kept = _earlier_rows(out / "validation.csv", {p["_id"] for p in points}, resume, force)
    rows: list[dict[str, Any]] = []
    bar = progress and sys.stderr.isatty()  # a log or a pipe gets no carriage-return bar
    for point in tqdm(points, desc="validate", unit="run", disable=not bar):
        rows.append(kept.get(point["_id"]) or validate_point(point, profile, device))
        write_csv(rows, out / "validation.csv")
    fig = figure(rows)
    for ext in ("png", "svg"):
        atomic_write(out / f"validation.{ext}", figure_bytes(fig, ext))
    return rows


def _earlier_rows(path: Path, ids: set[str], resume: bool, force: bool) -> dict[str, dict[str, Any]]:
    """The earlier validation.csv's rows this run keeps (``resume``: those of its points), after
    refusing, unless ``force``, to drop or replace a measured point: without ``resume`` any row,
    with it a row of a point this sweep does not have (or an unreadable table)."""
    if not path.exists():
        return {}
    try:
        stored = _stored_rows(path)
    except ScenarioError:
        if force:
            return {}
        raise
    lost = [r for r in stored if not resume or r not in ids]
    if lost and not force:
        what = (f"drop {len(lost)} measured points this sweep does not have" if resume else
                f"replace its {len(lost)} measured points (--resume keeps those of this sweep)")
        raise FileRefused(f"--out {path.parent}: validation.csv holds {len(stored)} measured points; this command "
                          f"would {what}: choose another --out, or --force to replace them")
    return {r: row for r, row in stored.items() if r in ids} if resume else {}


def _stored_rows(path: Path) -> dict[str, dict[str, Any]]:
    """The rows of an earlier validation.csv, by run id, numbers as numbers. A row whose values
    are not a validation's (a learner count that is not a positive whole number, a negative
    time or rate) is left out, so its point is measured again; a table that cannot be read is
    one :class:`ScenarioError`."""
    try:
        text = read_bounded(path, 16 << 20, "validation table").decode("utf-8-sig")
        records = list(csv.DictReader(io.StringIO(text)))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        raise ScenarioError(f"{path}: not a readable validation table ({e}); move it away, or --force to "
                            "replace it") from None
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        try:
            row: dict[str, Any] = {k: (r[k] if k in ("run_id", "protocol") else float(r[k])) for k in COLUMNS}
        except (KeyError, TypeError, ValueError):
            continue
        learners = row["learners"]
        if not (math.isfinite(learners) and learners >= 1 and learners == int(learners)) or any(
                row[k] < 0 for k in NON_NEGATIVE):  # nan is kept: "n/a"
            continue
        row["learners"] = int(learners)
        out[row["run_id"]] = row
    return out


def median_abs_error(rows: list[dict[str, Any]]) -> float:
    """Median |relative error| of time per epoch over the rows where it is finite; NaN when
    no row has one (:func:`median_line` says so in words)."""
    errs = [abs(r["time_rel_error"]) for r in rows if _finite(r["time_rel_error"])]
    return statistics.median(errs) if errs else math.nan


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _cell(v: Any, spec: str, width: int) -> str:
    """``v`` formatted by ``spec``, or "n/a" (right-aligned to ``width``) when not a finite number."""
    return format(v, spec) if _finite(v) else "n/a".rjust(width)


def median_line(rows: list[dict[str, Any]]) -> str:
    """The summary line: the median |relative error| over the points that have a finite one
    (how many, when some have none), or, when none has, why in words; never "nan"."""
    finite = sum(_finite(r["time_rel_error"]) for r in rows)
    if not finite:
        return (f"median |relative error| of time per epoch: not measured (none of the {len(rows)} points has a "
                "finite relative error: a live run measured no time)")
    some = f" (over {finite} of {len(rows)} points)" if finite < len(rows) else ""
    return f"median |relative error| of time per epoch: {median_abs_error(rows):.1%}{some}"


def table_lines(rows: list[dict[str, Any]], out: Path) -> list[str]:
    """The console's table of ``rows``, the median line and where the files are; a figure that
    is not a finite number shows as "n/a"."""
    lines = [f"{'run':30s} {'measured s/epoch':>16s} {'simulated':>10s} {'rel err':>8s} {'σ live':>7s} "
             f"{'σ sim':>7s} {'σ TV':>6s}"]
    for r in rows:
        lines.append(f"{r['run_id']:30s} {_cell(r['measured_time_per_epoch_s'], '16.4f', 16)} "
                     f"{_cell(r['simulated_time_per_epoch_s'], '10.4f', 10)} "
                     f"{_cell(r['time_rel_error'], '+8.1%', 8)} "
                     f"{_cell(r['measured_staleness_mean'], '7.2f', 7)} "
                     f"{_cell(r['simulated_staleness_mean'], '7.2f', 7)} "
                     f"{_cell(r['staleness_tv_distance'], '6.3f', 6)}")
    lines.append(median_line(rows))
    lines.append(f"table: {out / 'validation.csv'}  figure: {out / 'validation.png'}")
    return lines
