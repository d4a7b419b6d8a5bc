"""The ``ddlsim`` command line.

Every user error (a bad scenario, a missing file, an unknown backend, a corrupt trace)
ends with one line ``ddlsim: error: …`` on stderr and exit status 2; results already
written stay on disk.
"""

from __future__ import annotations

import argparse
import math
import re
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

from .schema import ScenarioError

CATALOGUE = Path(__file__).resolve().parent / "catalogue"


class UsageError(Exception):
    """A command-line mistake that is not about the scenario file."""


def resolve_scenario(name: str) -> Path:
    """A scenario argument is a file path or the name of a bundled scenario."""
    p = Path(name)
    if p.exists() or p.suffix == ".toml" or "/" in name:
        return p
    bundled = CATALOGUE / f"{name}.toml"
    if bundled.exists():
        return bundled
    names = ", ".join(sorted(f.stem for f in CATALOGUE.glob("*.toml")))
    raise ScenarioError(f"{name}: no such scenario file or bundled scenario (bundled: {names})")


def _load(args: argparse.Namespace) -> Any:
    from .load import load

    return load(resolve_scenario(args.scenario), args.set)


def safe_name(name: str) -> str:
    """A scenario name usable as one directory name (no separators, no control characters)."""
    clean = re.sub(r"[^\w.+-]", "_", name).strip(".") or "scenario"
    return clean[:100]


def _out_dir(args: argparse.Namespace, scenario: Any) -> Path:
    """``--out``, or results/<scenario name>; refuse a file, or another scenario's results."""
    out = Path(args.out) if args.out else Path("results") / safe_name(scenario.base["name"])
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out}: exists and is not a directory")
    other = _results_of(out)
    if other is not None and other != scenario.base["name"] and not getattr(args, "force", False):
        raise UsageError(f"--out {out}: holds the results of scenario {other!r}; choose another --out "
                         "or pass --force to replace its tables")
    return out


def _results_of(out: Path) -> str | None:
    """Name of the scenario whose results ``out`` holds, if any."""
    import json

    try:
        return json.loads((out / "scenario.json").read_text()).get("name")
    except (OSError, ValueError, AttributeError):
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


def print_table(records: list[dict[str, Any]], columns: list[tuple[str, str]], file: Any = None) -> None:
    """Print result rows as an aligned text table (``columns`` = (key, heading))."""
    file = file or sys.stdout
    rows = [[_fmt(r["row"].get(k)) if r["row"].get("error") is None or k in ("run_id", "protocol")
             else ("FAILED" if i == 2 else "") for i, (k, _) in enumerate(columns)] for r in records]
    heads = [h for _, h in columns]
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(heads)]
    print("  ".join(h.ljust(w) for h, w in zip(heads, widths)), file=file)
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)), file=file)
    for r in records:
        if r["row"].get("error"):
            print(f"run {r['row']['run_id']} failed: {r['row']['error']}", file=file)


SIM_TABLE = [("run_id", "run"), ("protocol", "protocol"), ("learners", "λ"), ("minibatch", "μ"),
             ("sim_time_s", "time_s"), ("gradients_per_s", "grad/s"), ("staleness_mean", "σ mean"),
             ("staleness_max", "σ max"), ("server_utilization", "server util")]
RUN_TABLE = SIM_TABLE[:6] + [("staleness_mean", "σ mean"), ("final_test_error", "final err"),
                             ("best_test_error", "best err"), ("time_to_target_s", "to target s"),
                             ("diverged", "diverged")]


def cmd_simulate(args: argparse.Namespace, backend: str | None = None) -> int:
    from .runner import run_sweep

    scenario = _load(args)
    out = _out_dir(args, scenario)
    options = {}
    if backend:
        options = {"device": args.device, "data_dir": args.data_dir, "download": args.download,
                   "batched": not args.no_batch, "stacked": args.stacked}
    records = run_sweep(scenario, out, backend=backend, options=options, jobs=args.jobs,
                        resume=args.resume, progress=not args.quiet,
                        executor=getattr(args, "executor", "local"), scheduler=getattr(args, "scheduler", None))
    table = RUN_TABLE if backend else SIM_TABLE
    swept = [(k, k.split(".")[-1]) for k, _ in scenario.axes
             if k not in ("protocol.name", "cluster.learners", "cluster.minibatch")]
    print_table(records, table[:4] + swept + table[4:])
    print(f"results: {out / 'summary.csv'}")
    if getattr(args, "report", False) and records:
        from ..analysis.report import write_report

        print(f"report: {write_report(out)}")
    failed = sum(r["row"].get("error") is not None for r in records)
    return 1 if failed else 0


def cmd_run(args: argparse.Namespace) -> int:
    from ..backends.registry import get_backend

    scenario = _load(args)
    name = args.backend or scenario.base["backend"]
    get_backend(name)  # unknown names fail before any work
    if args.device:
        from ..backends.replay import resolve_device

        resolve_device(args.device)  # an unknown or unavailable device, too
    check_data_sets(scenario, name, args.data_dir, args.download)  # and unreadable data, too
    return cmd_simulate(args, backend=name)


def check_data_sets(scenario: Any, backend: str, data_dir: str | None, download: bool) -> None:
    """Refuse, before any work, a point whose data set ``backend`` (replay or live; others
    are not checked) could not read; live points with emulated compute read none."""
    if backend not in ("replay", "live"):
        return
    from ..backends.workloads import check_data

    for point in scenario.points():
        if backend == "replay" or point["live"]["compute"] == "real":
            check_data(point, data_dir, download)


def cmd_scenarios(args: argparse.Namespace) -> int:
    import tomllib

    for f in sorted(CATALOGUE.glob("*.toml")):
        data = tomllib.loads(f.read_text())
        print(f"{f.stem:28s} {data.get('description', '')}")
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from ..simulator import trace as tracemod

    t = tracemod.read(args.path)
    kinds = {name: int((t.ops["kind"] == k).sum()) for k, name in enumerate(tracemod.KIND_NAMES)}
    print(f"{args.path}: schema {t.header['schema_version']}, protocol {t.header.get('protocol')}, "
          f"nodes {t.header.get('nodes')}, ops {t.n_ops} " + " ".join(f"{k}={v}" for k, v in kinds.items()))
    return 0


def add_scenario_options(p: argparse.ArgumentParser, out_default: str = "results/<scenario name>",
                         executors: bool = True) -> None:
    """The scenario argument and the sweep options (``--set``, ``--out``, ``--jobs``, …);
    ``executors``: also ``--executor``, ``--scheduler`` and ``--force``."""
    p.add_argument("scenario", help="scenario file, or the name of a bundled scenario")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key (a list value sweeps it); repeatable")
    p.add_argument("--out", help=f"results directory (default {out_default})")
    p.add_argument("--jobs", type=int, default=None, help="parallel worker processes")
    p.add_argument("--resume", action="store_true", help="keep points already completed in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    if executors:
        p.add_argument("--executor", choices=("local", "dask"), default="local")
        p.add_argument("--scheduler", help="Dask scheduler address (with --executor dask)")
        p.add_argument("--force", action="store_true",
                       help="write into a results directory that holds another scenario's results")


def add_data_options(p: argparse.ArgumentParser) -> None:
    """Where a backend runs and reads its data: ``--device``, ``--data-dir``, ``--download``."""
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--data-dir", help="directory with CIFAR10/MNIST/FashionMNIST files")
    p.add_argument("--download", action="store_true", help="download torchvision data sets into --data-dir")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ddlsim", description="Predict the accuracy/runtime tradeoff of "
                                 "distributed deep-learning training.")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("simulate", help="predict runtime and staleness for every sweep point")
    add_scenario_options(p)
    p.add_argument("--report", action="store_true", help="write figures and the HTML report at the end")
    p.set_defaults(func=cmd_simulate)
    p = sub.add_parser("run", help="simulate and execute every sweep point with a backend")
    add_scenario_options(p)
    p.add_argument("--backend", help="backend name (default: the scenario's, else replay)")
    add_data_options(p)
    p.add_argument("--no-batch", action="store_true", help="compute gradients one at a time")
    p.add_argument("--stacked", choices=("auto", "on", "off"),
                   help="replay multi-node traces with the stacked path: auto (default), on, off")
    p.add_argument("--no-report", dest="report", action="store_false",
                   help="skip the figures and the HTML report written at the end")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("scenarios", help="list the bundled scenarios")
    p.set_defaults(func=cmd_scenarios)
    p = sub.add_parser("trace", help="validate a trace file and print its op counts")
    p.add_argument("path")
    p.set_defaults(func=cmd_trace)
    _extend(sub)
    return ap


def _extend(sub: Any) -> None:
    """Commands contributed by other modules (plots, report, advise, live) register here."""
    from . import commands

    commands.register(sub)


def main(argv: Sequence[str] | None = None) -> int:
    from ..backends.base import BackendError
    from ..simulator.compute import ProfileError
    from ..simulator.trace import TraceError

    args = build_parser().parse_args(argv)
    jobs = getattr(args, "jobs", None)
    if jobs is not None and not 1 <= jobs <= 4096:
        print(f"ddlsim: error: --jobs = {jobs}: must be between 1 and 4096", file=sys.stderr)
        return 2
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        return int(args.func(args) or 0)
    except (ScenarioError, TraceError, BackendError, ProfileError, UsageError) as e:
        print(f"ddlsim: error: {e}", file=sys.stderr)
        return 2
    except UnicodeDecodeError as e:
        print(f"ddlsim: error: a file is not UTF-8 text ({e.reason} at byte {e.start})", file=sys.stderr)
        return 2
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"ddlsim: error: {where}{e.strerror or e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nddlsim: interrupted; completed runs are kept (rerun with --resume)", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM ends a command like Ctrl-C: completed runs kept, workers stopped."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
