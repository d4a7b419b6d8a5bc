"""Sub-commands beyond simulate/run: figures and the report (more are added here)."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

from ..backends.device import resolve_device
from ..simulator.catalog import FILE_DATASETS, TRAINABLE_MODELS
from .cli_common import resolve_scenario, results_of, safe_name
from .schema import ScenarioError


def _results_dir(path: str) -> Path:
    """``path`` if it holds a ddlsim summary.csv (a header with ``run_id``), else one clear error."""
    p = Path(path)
    if not (p / "summary.csv").is_file():
        raise ScenarioError(f"{p}: not a results directory (no summary.csv); run `ddlsim simulate` or "
                            "`ddlsim run` with --out first")
    try:
        with open(p / "summary.csv", newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), [])
    except UnicodeDecodeError:
        raise ScenarioError(f"{p / 'summary.csv'}: not UTF-8 text (not a ddlsim summary)") from None
    if "run_id" not in header:
        shown = ", ".join(header[:6]) + (", …" if len(header) > 6 else "") or "none"
        raise ScenarioError(f"{p / 'summary.csv'}: not a ddlsim summary (no run_id column; columns: {shown})")
    return p


def cmd_plot(args: argparse.Namespace) -> int:
    from ..analysis.figures import write_figures

    results = _results_dir(args.results)
    files = write_figures(results, args.out)
    if not files:
        raise ScenarioError(f"{results}: no figure applies (its tables have no runs with times, "
                            "errors or staleness to draw)")
    for f in files:
        print(f)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..analysis.report import write_report

    print(f"report: {write_report(_results_dir(args.results), args.out)}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from ..backends.calibrate import calibrate, cycle_scenario

    try:
        sizes = [int(v) for v in args.minibatches.split(",")]
    except ValueError:
        raise ScenarioError(f"--minibatches {args.minibatches!r}: expected comma-separated integers") from None
    if not sizes or min(sizes) < 1:
        raise ScenarioError(f"--minibatches {args.minibatches!r}: sizes must be ≥ 1")
    if max(sizes) > 1_000_000:
        raise ScenarioError(f"--minibatches {args.minibatches!r}: sizes must be ≤ 1000000")
    resolve_device(args.device)
    out = Path(args.out or f"profiles/{args.model}-{args.dataset}-{args.device}.toml")
    if out.is_dir():
        raise ScenarioError(f"--out {out}: is a directory; name the profile file")
    out.parent.mkdir(parents=True, exist_ok=True)
    existed = out.exists()
    with open(out, "a"):  # writable? (fails now, not after the measurements)
        pass
    def cycle_point(apply_s: float, bandwidth_Bps: float) -> dict:
        from .load import load_text

        return load_text(cycle_scenario(args.model, args.dataset, apply_s, bandwidth_Bps)).points()[0]

    try:
        m = calibrate(args.model, args.dataset, args.device, sizes, out, network=not args.no_network,
                      cycle=None if args.no_cycle else cycle_point)
    except BaseException:
        if not existed:  # no empty profile left behind for validate to read as "no calibration"
            out.unlink(missing_ok=True)
        raise
    for mu, s in zip(m["minibatch"], m["seconds"]):
        print(f"μ = {mu:5d}: {s * 1e3:9.3f} ms per minibatch")
    print(f"server apply: {m['apply_s'] * 1e6:.1f} µs per gradient")
    if not args.no_network:
        print(f"loopback ping-pong: latency {m['pingpong_latency_s'] * 1e6:.1f} µs, "
              f"bandwidth {m['bandwidth_Bps'] / 1e9:.2f} GB/s")
        if not args.no_cycle:
            print(f"live push-pull cycle: round trip {m['cycle_round_trip_s'] * 1e6:.1f} µs → "
                  f"latency_s {m['latency_s'] * 1e6:.1f} µs per message (written to the profile)")
    print(f"profile: {out}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .load import load
    from .validate import median_abs_error, validate

    scenario = load(resolve_scenario(args.scenario), args.set)
    out = Path(args.out) if args.out else Path("results") / f"{safe_name(scenario.base['name'])}-validate"
    other = results_of(out)
    if other is not None and other != scenario.base["name"] and not args.force:
        raise ScenarioError(f"--out {out}: holds the results of scenario {other!r}; choose another --out or --force")
    resolve_device(args.device)
    rows = validate(scenario, out, args.profile, progress=not args.quiet, resume=args.resume, device=args.device)
    print(f"{'run':30s} {'measured s/epoch':>16s} {'simulated':>10s} {'rel err':>8s} {'σ live':>7s} "
          f"{'σ sim':>7s} {'σ TV':>6s}")
    for r in rows:
        print(f"{r['run_id']:30s} {r['measured_time_per_epoch_s']:16.4f} {r['simulated_time_per_epoch_s']:10.4f} "
              f"{r['time_rel_error']:+8.1%} {r['measured_staleness_mean']:7.2f} {r['simulated_staleness_mean']:7.2f} "
              f"{r['staleness_tv_distance']:6.3f}")
    print(f"median |relative error| of time per epoch: {median_abs_error(rows):.1%}")
    print(f"table: {out / 'validation.csv'}  figure: {out / 'validation.png'}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay one trace (a live run's, a torchrun run's or a simulated one) into a results
    folder: summary.csv, curves.csv, the figures and the report."""
    import json
    import time

    from ..backends.base import RunOptions
    from ..backends.replay import ReplayBackend
    from ..simulator import trace as trace_io
    from ..simulator.files import atomic_write
    from ..simulator.stats import staleness_histogram, staleness_stats
    from .load import load
    from .runner import _staleness_csv, lead_values, store_result, write_tables

    trace = trace_io.read(args.trace)
    if args.scenario:
        points = load(resolve_scenario(args.scenario), args.set).points()
        if not 0 <= args.point < len(points):
            raise ScenarioError(f"--point {args.point}: the sweep has {len(points)} points")
        point = points[args.point]
    elif isinstance(trace.header.get("replay_point"), dict):
        point = {**trace.header["replay_point"], "_id": f"replay-{Path(args.trace).parent.name or 'trace'}"}
    else:
        raise ScenarioError(f"{args.trace}: the trace does not record its optimizer settings (a simulated trace "
                            "shared by several points); pass --scenario FILE [--point N]")
    point.setdefault("_id", f"replay-{Path(args.trace).parent.name or 'trace'}")
    resolve_device(args.device)
    out = Path(args.out) if args.out else Path("results") / safe_name(point["_id"])
    t0 = time.perf_counter()
    result = ReplayBackend().run(trace, point, RunOptions(device=args.device, data_dir=args.data_dir))
    row = {**lead_values(point), **staleness_stats(trace.inputs["staleness"]), **result.summary}
    if trace.header.get("measured"):
        from ..backends.live import measured_summary

        row.update(measured_summary(trace))
        row["sim_time_s"] = row["measured_time_s"]
    row.update({"error": None, "wall_s": time.perf_counter() - t0})
    record = {"hash": trace.header.get("run_id", ""), "row": row,
              "curves": [{"run_id": point["_id"], **c} for c in result.curves],
              "evals": [list(te) for te in trace_io.eval_schedule(trace.ops)]}
    atomic_write(out / "scenario.json", json.dumps({"name": point.get("name", "replay"), "points": [point["_id"]],
                                                    "target_error": point["workload"]["target_error"]}))
    atomic_write(out / "runs" / point["_id"] / "staleness.csv", _staleness_csv(staleness_histogram(trace)))
    store_result(out, record)
    write_tables(out, [record])
    print(f"final test error {row['final_test_error']:.4g}, best {row['best_test_error']:.4g}")
    print(f"results: {out / 'summary.csv'}")
    if not args.no_report:
        from ..analysis.report import write_figures_and_report

        figures, report = write_figures_and_report(out)
        if figures:
            print(f"figures: {len(figures)} files in {figures[0].parent}")
        print(f"report: {report}")
    return 0


def register(sub: Any) -> None:
    """Add plot, report, calibrate and validate to the ``ddlsim`` parser."""
    p = sub.add_parser("plot", help="draw the tradeoff figures of a results directory (PNG and SVG)")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="figure directory (default RESULTS/figures)")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("report", help="write one self-contained HTML report of a results directory")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="HTML file (default RESULTS/report.html)")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("calibrate", help="measure compute, server and loopback network costs; write a profile")
    p.add_argument("--model", default="mlp", choices=TRAINABLE_MODELS, help="model to time (default mlp)")
    p.add_argument("--dataset", default="digits", choices=("digits",) + FILE_DATASETS,
                   help="data set whose input shape the model takes (default digits)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--minibatches", default="1,2,4,8,16,32,64,128", help="comma-separated minibatch sizes")
    p.add_argument("--no-network", action="store_true", help="skip the loopback network measurements")
    p.add_argument("--no-cycle", action="store_true",
                   help="latency from the raw ping-pong instead of a short live push-pull run")
    p.add_argument("--out", help="profile file (default profiles/MODEL-DATASET-DEVICE.toml)")
    p.set_defaults(func=cmd_calibrate)
    p = sub.add_parser("validate", help="run the sweep live and simulated; compare time, throughput, staleness",
                       description="Run every point live and simulated and compare them. Live runs go one at a "
                                   "time, so there is no --jobs: parallel runs would disturb the timings they "
                                   "measure.")
    p.add_argument("scenario", help="scenario file, or the name of a bundled scenario (e.g. validate-grid)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key (a list value sweeps it); repeatable")
    p.add_argument("--profile", help="calibrated profile whose network/server costs the simulation uses")
    p.add_argument("--out", help="output directory (default results/<name>-validate)")
    p.add_argument("--resume", action="store_true", help="keep the points already in OUT/validation.csv")
    p.add_argument("--force", action="store_true", help="write into a folder that holds another scenario's results")
    p.add_argument("--device", default="cpu", help="device of the live runs' real compute (cpu or cuda)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_validate)
    p = sub.add_parser("replay", help="replay one trace (a live or torchrun run's, or --traces') into accuracy curves")
    p.add_argument("trace", help="a trace.ddlt")
    p.add_argument("--scenario", help="the scenario the trace ran (default: the settings a live trace records)")
    p.add_argument("--point", type=int, default=0, help="with --scenario: the sweep point (default 0)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="with --scenario: override a key")
    p.add_argument("--out", help="results folder (default results/replay-<folder of the trace>)")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--data-dir", help="directory with CIFAR10/MNIST/FashionMNIST files")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.set_defaults(func=cmd_replay)
