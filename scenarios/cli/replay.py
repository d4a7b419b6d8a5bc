"""``ddlsim replay``: one trace (a live run's, a torchrun run's or a simulated one) replayed into
a results folder."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from ...backends.base import RunOptions
from ...backends.device import numerics, resolve_device
from ...simulator import trace as trace_io
from ...simulator.protocols.catalog import PS, SPECS
from ...simulator.results_folder import ResultsFolder
from ...simulator.stats import staleness_histogram, staleness_stats
from ..bundled import resolve_scenario
from ..load import load, point_hash, recorded_point
from ..runner import folder_numerics, lead_values, prepare_folder, staleness_csv, store_result, write_tables
from ..schema import ScenarioError
from .common import claim_report, read_replayable_trace, safe_name


def _check_trace_of(trace: Any, point: dict[str, Any], args: argparse.Namespace) -> None:
    """Refuse (unless ``--force``) a ``--scenario`` point that is not the one the trace ran:
    another protocol, or another number of learners or nodes (a PS trace's learners are the
    ones its gradients name)."""
    proto = trace.header.get("protocol")
    spec = SPECS[proto]
    if args.force:
        return
    grads = trace.ops["node"][trace.ops["kind"] == trace_io.GRAD]
    members = int(grads.max()) + 1 if spec.family == PS and len(grads) else int(trace.header.get("nodes", 0))
    want = (point["protocol"]["name"], point["cluster"]["learners"])
    if (proto, members) != want and not (spec.family == PS and not len(grads) and proto == want[0]):
        raise ScenarioError(f"{args.trace}: the trace ran {proto} with {members} learners or nodes, but --scenario "
                            f"{args.scenario} point {args.point} is {want[0]} with {want[1]}: choose that point "
                            "(--point N, --set), or --force")


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay one trace (a live run's, a torchrun run's or a simulated one) into a results
    folder: summary.csv, curves.csv, the figures and the report."""
    trace = read_replayable_trace(args.trace)  # before any scenario, data or model is loaded
    if args.scenario:
        points = load(resolve_scenario(args.scenario), args.set).points()
        if not 0 <= args.point < len(points):
            raise ScenarioError(f"--point {args.point}: the sweep has {len(points)} points")
        point = points[args.point]
        _check_trace_of(trace, point, args)
    elif "replay_point" in trace.header:
        point = {**recorded_point(f"{args.trace}: header 'replay_point'", trace.header["replay_point"]),
                 "_id": f"replay-{Path(args.trace).parent.name or 'trace'}"}
    else:
        raise ScenarioError(f"{args.trace}: the trace does not record its optimizer settings (a simulated trace "
                            "shared by several points); pass --scenario FILE [--point N]")
    default = f"replay-{Path(args.trace).parent.name or 'trace'}"
    point.setdefault("_id", default)
    out = Path(args.out) if args.out else Path("results") / safe_name(default)
    resolve_device(args.device)
    with ResultsFolder.open(out, force=args.force) as folder:
        if not args.no_report:
            claim_report(folder)
        # the point and the trace it replays, by content: another trace's results are not replaced unasked
        replayed = f"{point_hash(point)}:{trace_io.file_digest(args.trace)}"
        prepare_folder(folder, str(point.get("name", "replay")), {point["_id"]: replayed}, {point["_id"]},
                       "replay", traces=False)
        from ...backends.replay import ReplayBackend

        t0 = time.perf_counter()
        result = ReplayBackend().run(trace, point, RunOptions(device=args.device, data_dir=args.data_dir))
        row = {**lead_values(point), **staleness_stats(trace.inputs["staleness"]), **result.summary}
        if trace.header.get("measured"):
            from ...backends.live import measured_summary

            row.update(measured_summary(trace))
            row["sim_time_s"] = row["measured_time_s"]
        row.update({"error": None, "wall_s": time.perf_counter() - t0})
        record = {"hash": trace.header.get("run_id", ""), "row": row,
                  "curves": [{"run_id": point["_id"], **c} for c in result.curves],
                  "evals": [list(te) for te in trace_io.eval_schedule(trace.ops)], "numerics": numerics(args.device)}
        folder.write("scenario.json", json.dumps({"name": point.get("name", "replay"), "points": [point["_id"]],
                                                  "target_error": point["workload"]["target_error"],
                                                  "numerics": folder_numerics([record])}))
        folder.write(f"runs/{point['_id']}/staleness.csv", staleness_csv(staleness_histogram(trace)))
        store_result(out, record)
        write_tables(out, [record])
        _replay_report(args, row, out)
    return 0


def _replay_report(args: argparse.Namespace, row: dict[str, Any], out: Path) -> None:
    """What ``ddlsim replay`` prints, and its figures and report."""
    print(f"final test error {row['final_test_error']:.4g}, best {row['best_test_error']:.4g}")
    print(f"results: {out / 'summary.csv'}")
    if not args.no_report:
        from ...analysis.report import write_figures_and_report

        figures, report = write_figures_and_report(out)
        if figures:
            print(f"figures: {len(figures)} files in {figures[0].parent}")
        print(f"report: {report}")


def register(sub: Any) -> None:
    """Add ``replay`` to the ``ddlsim`` parser."""
    p = sub.add_parser("replay", help="replay one trace (a live or torchrun run's, or --traces') into accuracy curves")
    p.add_argument("trace", help="a trace.ddlt")
    p.add_argument("--scenario", help="the scenario the trace ran (default: the settings a live trace records)")
    p.add_argument("--point", type=int, default=0, help="with --scenario: the sweep point (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="with --scenario: override a key")
    p.add_argument("--out", help="results folder (default results/replay-<folder of the trace>)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--data-dir", help="directory with CIFAR10/MNIST/FashionMNIST files")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument("--force", action="store_true",
                   help="write into a folder that holds other results or files ddlsim did not write, "
                        "or replay a trace with a --scenario point it did not run")
    p.set_defaults(func=cmd_replay)
