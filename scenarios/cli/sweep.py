"""``ddlsim simulate`` and ``ddlsim run``: a sweep simulated, or simulated and executed by a
backend, with its table, findings, figures and report."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ...analysis.findings import findings, span
from ...analysis.metrics import configuration_row, replicate_groups, seeds_text
from ...analysis.table import is_number
from ...backends.device import resolve_device
from ...backends.registry import available_backends, get_backend
from ...simulator.catalog import dataset_info
from ...simulator.results_folder import ResultsFolder
from ..advise.search import prune_sweep, pruned_words
from ..load import check_engine
from ..runner import run_sweep
from .advise import add_halving_options, check_prune
from .common import (UsageError, add_data_options, add_scenario_options, check_data_sets, claim_report, load_scenario,
                     out_dir)
from .cost import check_cost
from .table import RUN_TABLE, SIM_TABLE, duration, print_table


def cmd_simulate(args: argparse.Namespace, backend: str | None = None, scenario: Any = None) -> int:
    scenario = scenario or load_scenario(args)  # cmd_run's: its data sets' sizes are known
    check_engine(scenario.points(), args.engine)
    check_cost(scenario, args.force)
    out = out_dir(args, scenario)
    options = {}
    if backend:
        options = {"device": args.device, "data_dir": args.data_dir, "download": args.download,
                   "batched": not args.no_batch, "stacked": args.stacked}
    with ResultsFolder.open(out, force=args.force) as folder:
        if getattr(args, "report", False):
            claim_report(folder)
        if getattr(args, "prune", False):  # successive halving of the sweep's replays (docs/advise.md)
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
        ok = [r for r in records if r["row"].get("error") is None and r["row"].get("pruned_at_epoch") is None]
        swept_target = any(k == "workload.target_error" for k, _ in scenario.axes)
        for line in findings((r["row"] for r in ok), (c for r in ok for c in r["curves"]), _test_size(scenario),
                             None if swept_target else scenario.base["workload"]["target_error"]):
            print(f"* {line}")
    if getattr(args, "report", False) and records:
        from ...analysis.report import write_figures_and_report

        figures, report = write_figures_and_report(out)
        if figures:
            print(f"figures: {len(figures)} files in {figures[0].parent}")
        print(f"report: {report}")


def _configuration_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per configuration for :func:`print_table`: the mean over its seeds (failed
    runs left out; a configuration whose every run failed shows FAILED), the range over its seeds
    of the time, the gradient rate and the final error, how many seeds reached the target and how
    many did not learn."""
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
               "final_range": span(finals, lambda v: f"{v:.4g}") if finals else None,  # as the mean: a fraction
               "sim_time_s_range": _range_of(done, "sim_time_s", duration),
               "measured_time_s_range": _range_of(done, "measured_time_s", duration),
               "rate_range": _range_of(done, "gradients_per_s", lambda v: f"{v:.4g}"),
               # a mean only over every seed (as the report's): a seed that never reached it has no time to add
               "time_to_target_s": c["time_to_target_s_mean"] if c["time_to_target_reached"] == len(done) else None,
               "reached": f"{c['time_to_target_reached']}/{len(done)}" if c["time_to_target_reached"] is not None
               else None,
               "did_not_learn": f"{c['did_not_learn']}/{len(done)}" if c["did_not_learn"] is not None else None,
               "diverged": f"{c['diverged']}/{len(done)}" if c["diverged"] is not None else None}
        for k in ("measured_time_s", "gradients_per_s", "staleness_mean", "staleness_max", "server_utilization",
                  "link_in_utilization", "link_out_utilization"):
            values = [r[k] for r in done if is_number(r.get(k))]
            row[k] = sum(values) / len(values) if values else None
        if len(done) < len(runs):
            row["seeds"] += f" ({len(runs) - len(done)} failed)"
        out.append({"row": row})
    return out


def _range_of(runs: list[dict[str, Any]], key: str, fmt: Any) -> str | None:
    """The lowest and highest seed's ``key`` (``"0.37–0.38 s"``); None without two numbers."""
    values = [r[key] for r in runs if is_number(r.get(key))]
    return span(values, fmt) if len(values) > 1 else None


def _configuration_columns(table: list[tuple[str, str]], swept: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The run table's columns for configurations: the config id, its seeds, means."""
    columns = [("run_id", "configuration")] + table[1:4] + swept + [("seeds", "seeds")]
    for key, head in table[4:]:
        if key == "final_test_error":
            columns += [(key, "final err (mean)"), ("final_range", "range")]
        elif key == "time_to_target_s":
            columns += [(key, "to target (mean)"), ("reached", "reached")]
        elif key in ("sim_time_s", "measured_time_s"):
            columns += [(key, f"{head} (mean)"), (f"{key}_range", "range")]
        elif key == "gradients_per_s":
            columns += [(key, f"{head} (mean)"), ("rate_range", "range")]
        else:
            columns.append((key, head))
    return columns


def _test_size(scenario: Any) -> int | None:
    """The test samples behind each error of the sweep (one data set), when known: a difference of
    a sample or two is noise."""
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
        from ...backends.live import check_live_size

        check_live_size(scenario.points(), args.force)  # more processes than this machine should start, too
    if args.device is not None:
        resolve_device(args.device)  # an empty, unknown or unavailable device, too
    return cmd_simulate(args, backend=name, scenario=scenario)


def register(sub: Any) -> None:
    """Add ``simulate`` and ``run`` to the ``ddlsim`` parser."""
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
