"""The ``ddlsim`` command line.

Every user error (a bad scenario, a missing file, an unknown backend, a corrupt trace)
ends with one line ``ddlsim: error: …`` on stderr and exit status 2; results already
written stay on disk.
"""

from __future__ import annotations

import argparse
import signal
import sys
import warnings
from pathlib import Path
from typing import Any
from collections.abc import Sequence

from ..backends.device import resolve_device
from . import commands
from .advise_cli import add_halving_options, check_prune, register as register_advise
from .cli_common import (CATALOGUE, RUN_TABLE, SIM_TABLE, UsageError, add_data_options, add_scenario_options,
                         check_cost, check_data_sets, escape, load_scenario, out_dir, print_table)
from .schema import ScenarioError
from ..simulator.results_folder import ResultsFolder

def cmd_simulate(args: argparse.Namespace, backend: str | None = None, scenario: Any = None) -> int:
    from .runner import run_sweep

    scenario = scenario or load_scenario(args)  # cmd_run's: its data sets' sizes are known
    check_cost(scenario, args.force)
    out = out_dir(args, scenario)
    options = {}
    if backend:
        options = {"device": args.device, "data_dir": args.data_dir, "download": args.download,
                   "batched": not args.no_batch, "stacked": args.stacked}
    with ResultsFolder.open(out, force=args.force) as folder:
        if getattr(args, "report", False):  # the figures and report come last: refuse a file of yours now
            from ..analysis.figures import FIGURES, FORMATS

            folder.claim([f"figures/{f.name}.{fmt}" for f in FIGURES for fmt in FORMATS] + ["report.html"])
        if getattr(args, "prune", False):  # successive halving of the sweep's replays (docs/advise.md)
            from .advise import prune_sweep, pruned_words

            records = prune_sweep(scenario, out, min_fraction=args.min_fraction, reduction_factor=args.reduction_factor,
                                  options=options, jobs=args.jobs, resume=args.resume, progress=not args.quiet,
                                  engine=args.engine, executor=args.executor, scheduler=args.scheduler)
            print(pruned_words(records))
        else:
            records = run_sweep(scenario, out, backend=backend, options=options, jobs=args.jobs,
                                resume=args.resume, progress=not args.quiet, engine=args.engine, traces=args.traces,
                                keep_failed=args.keep_failed, executor=getattr(args, "executor", "local"),
                                scheduler=getattr(args, "scheduler", None))
        _print_results(args, scenario, records, backend, out)
    failed = sum(r["row"].get("error") is not None for r in records)
    return 1 if failed else 0


def _print_results(args: argparse.Namespace, scenario: Any, records: list[dict[str, Any]], backend: str | None,
                   out: Path) -> None:
    """The table, the findings, and with ``--report`` the figures and the report."""
    table = RUN_TABLE if backend else SIM_TABLE
    if backend == "live":  # the time the live run took, not the simulation's prediction
        table = [("measured_time_s", "measured") if k == "sim_time_s" else (k, h) for k, h in table]
    swept = [(k, k.split(".")[-1]) for k, _ in scenario.axes
             if k not in ("protocol.name", "cluster.learners", "cluster.minibatch", "seed")]
    replicated = scenario.base["replicates"] > 1 or any(k == "seed" for k, _ in scenario.axes)
    if replicated:  # one line per configuration: the mean over its seeds and their range
        print_table(_configuration_records(records), _configuration_columns(table, swept), lead=4 + len(swept))
    else:
        print_table(records, table[:4] + swept + table[4:], lead=4 + len(swept))
    if backend == "live" and any(p["live"]["compute"] == "emulated" for p in scenario.points()):
        print("final err: not measured where live.compute = \"emulated\" (learners sleep; no gradients)")
    print(f"results: {out / 'summary.csv'}" + (f" (runs), {out / 'configurations.csv'} (mean and 95 % interval "
                                              "over the seeds)" if replicated else ""))
    if backend and records:
        from ..analysis.findings import findings

        ok = [r for r in records if r["row"].get("error") is None and r["row"].get("pruned_at_epoch") is None]
        swept_target = any(k == "workload.target_error" for k, _ in scenario.axes)
        for line in findings((r["row"] for r in ok), (c for r in ok for c in r["curves"]), _test_size(scenario),
                             None if swept_target else scenario.base["workload"]["target_error"]):
            print(f"* {line}")
    if getattr(args, "report", False) and records:
        from ..analysis.report import write_figures_and_report

        figures, report = write_figures_and_report(out)
        if figures:
            print(f"figures: {len(figures)} files in {figures[0].parent}")
        print(f"report: {report}")


def _configuration_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per configuration for :func:`print_table`: the mean over its seeds (failed
    runs left out; a configuration whose every run failed shows FAILED), the final error's
    range, how many seeds reached the target and how many did not learn."""
    from ..analysis.findings import span
    from ..analysis.metrics import configuration_row, replicate_groups, seeds_text
    from ..analysis.table import is_number

    out = []
    for runs in replicate_groups(r["row"] for r in records).values():
        done = [r for r in runs if r.get("error") is None]
        head = dict(runs[0])
        if not done:
            out.append({"row": {**head, "run_id": head.get("config_id", head["run_id"])}})
            continue
        c = configuration_row(done)
        finals = [r["final_test_error"] for r in done if is_number(r.get("final_test_error"))]
        row = {**head, "run_id": head.get("config_id", head["run_id"]), "error": None,
               "seeds": seeds_text(done, compact=True) or str(len(done)), "sim_time_s": c["sim_time_s_mean"],
               "final_test_error": c["final_test_error_mean"], "best_test_error": c["best_test_error_mean"],
               "final_range": span(finals, lambda v: f"{100 * v:.1f} %") if finals else None,
               "time_to_target_s": c["time_to_target_s_mean"],
               "reached": f"{c['time_to_target_reached']}/{len(done)}" if c["time_to_target_reached"] is not None
               else None,
               "did_not_learn": f"{c['did_not_learn']}/{len(done)}" if c["did_not_learn"] is not None else None,
               "diverged": f"{c['diverged']}/{len(done)}" if c["diverged"] is not None else None}
        for k in ("gradients_per_s", "staleness_mean", "staleness_max", "server_utilization", "link_in_utilization",
                  "link_out_utilization"):
            values = [r[k] for r in done if is_number(r.get(k))]
            row[k] = sum(values) / len(values) if values else None
        if len(done) < len(runs):
            row["seeds"] += f" ({len(runs) - len(done)} failed)"
        out.append({"row": row})
    return out


def _configuration_columns(table: list[tuple[str, str]], swept: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The run table's columns for configurations: the config id, its seeds, means."""
    columns = [("run_id", "configuration")] + table[1:4] + swept + [("seeds", "seeds")]
    for key, head in table[4:]:
        if key == "final_test_error":
            columns += [(key, "final err (mean)"), ("final_range", "range")]
        elif key == "time_to_target_s":
            columns += [(key, "to target (mean)"), ("reached", "reached")]
        else:
            columns.append((key, head))
    return columns


def _test_size(scenario: Any) -> int | None:
    """The test samples behind each error of the sweep (one data set), when known: a difference of
    a sample or two is noise."""
    from ..simulator.catalog import dataset_info

    sets = {(p["workload"]["dataset"], p["workload"]["teacher_samples"], p["workload"]["teacher_features"])
            for p in scenario.points()}
    if len(sets) != 1:
        return None
    name, samples, features = sets.pop()
    try:
        size = dataset_info(name, samples, features).test_size
    except (KeyError, ValueError):
        return None
    return int(size) if size and size >= 1 else None


def cmd_run(args: argparse.Namespace) -> int:
    from ..backends.registry import available_backends, get_backend

    check_prune(args)  # bad rungs, before any work
    scenario = load_scenario(args)
    name = args.backend or scenario.base["backend"]
    if args.prune and name != "replay":
        raise UsageError(f"--prune cuts replays at the rungs of successive halving: it needs the replay backend, "
                         f"not {name!r}")
    if name not in available_backends():  # unknown names fail before any work (without importing one)
        get_backend(name)
    check_data_sets(scenario, name, args.data_dir, args.download)  # and unreadable data (torch-free), too
    get_backend(name)  # a backend that fails to load, too
    if name == "live":
        from ..backends.live import check_live_size

        check_live_size(scenario.points(), args.force)  # more processes than this machine should start, too
    if args.device is not None:
        resolve_device(args.device)  # an empty, unknown or unavailable device, too
    return cmd_simulate(args, backend=name, scenario=scenario)


def cmd_scenarios(args: argparse.Namespace) -> int:
    import tomllib

    if args.show:
        f = CATALOGUE / f"{args.show}.toml"
        if not f.is_file():
            names = ", ".join(sorted(g.stem for g in CATALOGUE.glob("*.toml")))
            raise UsageError(f"--show {args.show}: no bundled scenario of that name (bundled: {names})")
        print(f.read_text(encoding="utf-8"), end="")
        return 0
    for f in sorted(CATALOGUE.glob("*.toml")):
        data = tomllib.loads(f.read_text())
        print(f"{f.stem:28s} {data.get('description', '')}")
    print("\nStart your own from one: ddlsim scenarios --show demo > my.toml")
    return 0


def cmd_hardware(args: argparse.Namespace) -> int:
    from .hardware import listing

    print(listing())
    return 0


def cmd_trace(args: argparse.Namespace) -> int:
    from ..simulator import trace as tracemod

    t = tracemod.read(args.path)
    tracemod.check_replayable(t, args.path)  # what `ddlsim trace` accepts, `ddlsim replay` can execute
    kinds = {name: int((t.ops["kind"] == k).sum()) for k, name in enumerate(tracemod.KIND_NAMES)}
    print(f"{escape(args.path)}: schema {t.header['schema_version']}, "
          f"protocol {escape(str(t.header.get('protocol')))}, "
          f"{_trace_members(t)}, ops {t.n_ops} " + " ".join(f"{k}={v}" for k, v in kinds.items()))
    return 0


def _trace_members(t: Any) -> str:
    """Who ran a trace: a parameter-server trace's learners (those its grad ops name; its one
    state is the server's), else its nodes."""
    import numpy as np

    from ..simulator import trace as tracemod
    from ..simulator.protocols.catalog import PS, SPECS

    spec = SPECS.get(t.header.get("protocol", ""))
    if spec is None or spec.family != PS:
        return f"nodes {t.header['nodes']}"
    learners = np.count_nonzero(np.bincount(t.ops["node"][t.ops["kind"] == tracemod.GRAD], minlength=1))
    return f"learners {learners}"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ddlsim", description="Predict the accuracy/runtime tradeoff of "
                                 "distributed deep-learning training.")
    ap.add_argument("--version", action="version", version=f"ddlsim {_version()}")
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
    p.add_argument("--stacked", choices=("auto", "on", "off"), default="auto",
                   help="replay multi-node traces with the stacked path: auto (default), on, off")
    p.add_argument("--no-report", dest="report", action="store_false",
                   help="skip the figures and the HTML report written at the end")
    p.add_argument("--prune", action="store_true", help="replay by successive halving: every configuration to a "
                   "first rung, the best 1/ETA of each rung on to the next, the last whole (docs/advise.md)")
    add_halving_options(p, None, None)
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("scenarios", help="list the bundled scenarios, or print one to start from")
    p.add_argument("--show", metavar="NAME", help="print bundled scenario NAME (e.g. > my.toml to edit a copy)")
    p.set_defaults(func=cmd_scenarios)
    p = sub.add_parser("hardware", help="list the hardware catalogue (cluster.gpu, cluster.network.preset)")
    p.set_defaults(func=cmd_hardware)
    p = sub.add_parser("trace", help="validate a trace file and print its op counts")
    p.add_argument("path", help="a trace.ddlt (ddlsim simulate/run --traces, or a live run's)")
    p.set_defaults(func=cmd_trace)
    _extend(sub)
    return ap


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ddlsim")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        return "unknown"


def _extend(sub: Any) -> None:
    """Commands contributed by other modules (plots, report, calibrate, validate, advise)."""
    commands.register(sub)
    register_advise(sub)


def main(argv: Sequence[str] | None = None) -> int:
    from ..backends.base import BackendError
    from ..simulator.compute import ProfileError
    from ..simulator.trace import TraceError

    args = build_parser().parse_args(argv)
    warnings.formatwarning = _warning_line
    jobs = getattr(args, "jobs", None)
    if jobs is not None and not 1 <= jobs <= 4096:
        print(f"ddlsim: error: --jobs = {jobs}: must be between 1 and 4096", file=sys.stderr)
        return 2
    try:
        previous = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread: leave signals alone
        previous = None
    try:
        check_arguments(args)
        return int(args.func(args) or 0)
    except (ScenarioError, TraceError, BackendError, ProfileError, UsageError, ValueError) as e:
        _error(str(e))
        return 2
    except UnicodeDecodeError as e:
        _error(f"a file is not UTF-8 text ({e.reason} at byte {e.start})")
        return 2
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        _error(f"{where}{e.strerror or e}")
        return 2
    except RecursionError:
        _error("an input is nested too deeply")
        return 2
    except KeyboardInterrupt:
        print("\nddlsim: interrupted; completed runs are kept (rerun with --resume)", file=sys.stderr)
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  line: str | None = None) -> str:
    """A warning as the command line shows it: one line, no source location."""
    return f"ddlsim: warning: {escape(str(message))}\n"


def _error(message: str) -> None:
    """One line on stderr; control characters of names and keys in it are shown escaped
    (a newline or a terminal escape in a file name must not break or colour the line)."""
    print(f"ddlsim: error: {escape(message)}", file=sys.stderr)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse option combinations that would be silently ignored."""
    if getattr(args, "scheduler", None) is not None:
        from .executors import check_executor

        check_executor(getattr(args, "executor", "local"), args.scheduler)  # and a scheduler answers there


def _terminate(signum: int, frame: Any) -> None:
    """SIGTERM ends a command like Ctrl-C: completed runs kept, workers stopped."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
