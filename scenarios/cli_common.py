"""What the ``ddlsim`` commands share: scenario arguments, output folders, the result table.

Every command module (:mod:`.cli`, :mod:`.commands`, :mod:`.advise_cli`) imports from here;
nothing here imports a command module, so the command line has no import cycle.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path
from typing import Any

from .schema import ScenarioError

CATALOGUE = Path(__file__).resolve().parent / "catalogue"  # the bundled scenarios


class UsageError(Exception):
    """A command-line mistake that is not about the scenario file."""


def resolve_scenario(name: str) -> Path:
    """A scenario argument is a file path or the name of a bundled scenario (a bundled name
    wins over a folder of the same name in the working directory, e.g. results of ``demo``)."""
    p = Path(name)
    bundled = CATALOGUE / f"{name}.toml"
    if p.is_dir() and "/" not in name and bundled.exists():
        return bundled
    if p.exists() or p.suffix == ".toml" or "/" in name:
        return p
    if bundled.exists():
        return bundled
    names = ", ".join(sorted(f.stem for f in CATALOGUE.glob("*.toml")))
    raise ScenarioError(f"{name}: no such scenario file or bundled scenario (bundled: {names})")


def load_scenario(args: argparse.Namespace) -> Any:
    """The scenario named by ``args.scenario`` with the ``--set`` overrides, validated."""
    from .load import load

    return load(resolve_scenario(args.scenario), args.set)


def escape(text: str) -> str:
    """``text`` with control characters (newlines, terminal escapes) written as escapes."""
    return "".join(c if c.isprintable() or c == " " else repr(c)[1:-1] for c in text)


# the most a point may simulate before --force is needed (≈ 200 B of trace per gradient)
MAX_POINT_GRADIENTS = 100_000_000
MAX_STALL_LOAD = 100.0  # stall rate × mean length: learners stalled nearly always beyond this


def estimate(point: dict[str, Any]) -> int:
    """Gradients a point's simulation computes (all learners or nodes)."""
    from ..simulator.protocols import is_ps, iterations, total_gradients

    return total_gradients(point) if is_ps(point) else iterations(point) * point["cluster"]["learners"]


def check_cost(scenario: Any, force: bool) -> None:
    """Refuse, before any work, a sweep point too large to simulate in memory and time (with
    the estimate and the way out), unless ``force``."""
    if force:
        return
    for p in scenario.points():
        n = estimate(p)
        if n > MAX_POINT_GRADIENTS:
            raise UsageError(f"point {p['_id']} would simulate {n:.3g} gradients (about {n * 200 / 1e9:.3g} GB of "
                             f"trace, {n / 5e5 / 60:.3g} min or more); the limit is {MAX_POINT_GRADIENTS:.0e}: "
                             "fewer epochs or samples, or --force")
        strag = p["cluster"]["stragglers"]
        load = strag["stall_rate_per_s"] * strag["stall_mean_s"]
        if load > MAX_STALL_LOAD:
            raise UsageError(f"point {p['_id']}: stall_rate_per_s × stall_mean_s = {load:.3g}: learners would be "
                             f"stalled {load:.3g}× longer than they compute (limit {MAX_STALL_LOAD:g}); or --force")


def safe_name(name: str) -> str:
    """A scenario name usable as one directory name (no separators, no control characters)."""
    clean = re.sub(r"[^\w.+-]", "_", name).strip(".") or "scenario"
    return clean[:100]


def out_dir(args: argparse.Namespace, scenario: Any) -> Path:
    """``--out``, or results/<scenario name>; refuse a file, or another scenario's results."""
    out = Path(args.out) if args.out else Path("results") / safe_name(scenario.base["name"])
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    other = results_of(out)
    if other is not None and other != scenario.base["name"] and not getattr(args, "force", False):
        raise UsageError(f"--out {out}: holds the results of scenario {other!r}; choose another --out "
                         "or pass --force to replace its tables")
    return out


def results_of(out: Path) -> str | None:
    """Name of the scenario whose results ``out`` holds, if any."""
    import json

    from ..simulator.files import read_bounded

    try:
        return json.loads(read_bounded(out / "scenario.json", 16 << 20, "scenario.json")).get("name")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


def _fmt(v: Any, width: int = 10) -> str:
    if v is None or v == "":
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v != 0 and (abs(v) >= 1e5 or abs(v) < 1e-3):
            return f"{v:.3g}"
        return f"{v:.4g}"
    return str(v)


def duration(seconds: float) -> str:
    """Seconds in the unit a reader wants: s, min or h."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool) or math.isnan(seconds):
        return _fmt(seconds)
    if seconds >= 3600:
        return f"{seconds / 3600:.3g} h"
    if seconds >= 60:
        return f"{seconds / 60:.3g} min"
    return f"{seconds:.4g} s"


LEAD_KEYS = ("run_id", "protocol", "learners", "minibatch")


def print_table(records: list[dict[str, Any]], columns: list[tuple[str, str]], file: Any = None,
                lead: int = 4) -> None:
    """Print result rows as an aligned text table (``columns`` = (key, heading)); the first
    ``lead`` columns identify the run; a failed run shows FAILED in the first result column."""
    file = file or sys.stdout

    def cell(r: dict[str, Any], i: int, k: str) -> str:
        if r["row"].get("error") is not None and i >= lead:
            return "FAILED" if i == lead else ""
        v = r["row"].get(k)
        return duration(v) if k in TIME_KEYS and v is not None else _fmt(v)

    rows = [[cell(r, i, k) for i, (k, _) in enumerate(columns)] for r in records]
    heads = [h for _, h in columns]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths)), file=file)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)), file=file)
    for r in records:
        if r["row"].get("error"):
            print(f"run {r['row']['run_id']} failed: {r['row']['error']}", file=file)


TIME_KEYS = ("sim_time_s", "measured_time_s", "time_to_target_s")
SIM_TABLE = [("run_id", "run"), ("protocol", "protocol"), ("learners", "λ"), ("minibatch", "μ"),
             ("sim_time_s", "time"), ("gradients_per_s", "grad/s"), ("staleness_mean", "σ mean"),
             ("staleness_max", "σ max"), ("server_utilization", "server util"),
             ("link_in_utilization", "NIC in util"), ("link_out_utilization", "NIC out util")]
# (the busiest of the server's apply queue and NICs, or of the nodes' NICs, bounds the run: a
# server idle at 0.003 beside a NIC in at 1.0 is network-bound)
RUN_TABLE = SIM_TABLE[:6] + [("staleness_mean", "σ mean"), ("final_test_error", "final err"),
                             ("best_test_error", "best err"), ("time_to_target_s", "to target"),
                             ("diverged", "diverged"), ("did_not_learn", "did not learn")]


def check_data_sets(scenario: Any, backend: str, data_dir: str | None, download: bool) -> None:
    """Refuse, before any work, a point whose data set ``backend`` (replay or live; others
    are not checked) could not read; live points with emulated compute read none. Each data
    set that needs files is really read (and, with ``download``, fetched) once, here: an
    empty ``--data-dir`` or an unreachable download fails now, not after the simulations.
    Files that are not the official ones are a warning line; the training samples found
    become the scenario's ``data_sizes`` (the default epoch; a larger
    ``workload.samples_per_epoch`` is refused)."""
    if backend not in ("replay", "live"):
        return
    from ..backends.workloads import check_data, data_files

    seen: set[str] = set()
    said: list[str] = []
    for point in scenario.points():
        if backend == "replay" or point["live"]["compute"] == "real":
            check_data(point, data_dir, download)
            name = point["workload"]["dataset"]
            if name not in seen and name not in ("digits", "teacher"):
                seen.add(name)
                files = data_files(name, data_dir, download)
                said += [f"ddlsim: warning: {line}" for line in files.warnings]
                said += [f"ddlsim: {line}" for line in files.notes]
                scenario.data_sizes[name] = len(files.train_y)
    if seen:
        scenario.points()  # samples_per_epoch follows the files found; more than there are is refused now
    for line in said:
        print(escape(line), file=sys.stderr)


def add_scenario_options(p: argparse.ArgumentParser, out_default: str = "results/<scenario name>",
                         executors: bool = True) -> None:
    """The scenario argument and the sweep options (``--set``, ``--out``, ``--jobs``, …);
    ``executors``: also ``--executor``, ``--scheduler`` and ``--force``."""
    p.add_argument("scenario", help="scenario file, or the name of a bundled scenario")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key (a list value sweeps it); repeatable")
    p.add_argument("--out", help=f"results directory (default {out_default})")
    p.add_argument("--jobs", type=int, default=None,
                   help="parallel worker processes (default: none, in-process, for up to 8 distinct simulations; "
                        "else one per core)")
    p.add_argument("--resume", action="store_true",
                   help="keep the points already completed in --out whose results verify; rerun the rest")
    p.add_argument("--keep-failed", action="store_true", help="with --resume: do not retry points that failed")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--engine", choices=("auto", "simpy", "fast"), default="auto",
                   help="simulator engine: fast (byte-identical compiled engines, every protocol; needs numba), "
                        "simpy (the reference) or auto (fast where it applies; default)")
    p.add_argument("--traces", action="store_true",
                   help="also write each run's trace.ddlt (runs sharing a simulation share the file)")
    p.add_argument("--force", action="store_true",
                   help="run a sweep above the size limits, or write into a results directory that holds "
                        "another scenario's results")
    if executors:
        p.add_argument("--executor", choices=("local", "dask"), default="local",
                       help="where points run: local worker processes, or a Dask cluster (default local)")
        p.add_argument("--scheduler", help="Dask scheduler address (with --executor dask; without it a "
                                           "LocalCluster of --jobs workers is started)")


def add_data_options(p: argparse.ArgumentParser) -> None:
    """Where a backend runs and reads its data: ``--device``, ``--data-dir``, ``--download``."""
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--data-dir", help="directory with CIFAR10/MNIST/FashionMNIST files")
    p.add_argument("--download", action="store_true",
                   help="download torchvision data sets into --data-dir (default ~/.cache/ddlsim/data); checked "
                        "before any simulation")


