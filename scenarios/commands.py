"""Sub-commands beyond simulate/run: figures and the report (more are added here)."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

from ..backends.device import resolve_device
from ..simulator.catalog import EMBEDDED_DATASETS, FILE_DATASETS, TRAINABLE_MODELS
from .cli_common import out_dir, resolve_scenario, safe_name
from ..simulator.compute import PROFILE_HEAD
from ..simulator.files import check_target, read_bounded
from ..simulator.results_folder import ResultsFolder
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
    except csv.Error as e:  # e.g. a header field beyond the csv module's field limit
        raise ScenarioError(f"{p / 'summary.csv'}: not a readable CSV table ({e})") from None
    if "run_id" not in header:
        shown = ", ".join(header[:6]) + (", …" if len(header) > 6 else "") or "none"
        raise ScenarioError(f"{p / 'summary.csv'}: not a ddlsim summary (no run_id column; columns: {shown})")
    return p


def cmd_plot(args: argparse.Namespace) -> int:
    from ..analysis.figures import write_figures

    results = _results_dir(args.results)
    with ResultsFolder.open(results, force=args.force):
        files = write_figures(results, args.out, force=args.force)
    if not files:
        raise ScenarioError(f"{results}: no figure applies (its tables have no runs with times, "
                            "errors or staleness to draw)")
    for f in files:
        print(f)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..analysis.report import write_report

    results = _results_dir(args.results)
    with ResultsFolder.open(results, force=args.force):
        print(f"report: {write_report(results, args.out, force=args.force)}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.nccl_tests is not None or args.network:
        return cmd_calibrate_network(args)
    for option, value in (("--ranks", args.ranks), ("--collective", args.collective), ("--scope", args.scope),
                          ("--min-bytes", args.min_bytes), ("--max-bytes", args.max_bytes)):
        if value is not None:
            raise ScenarioError(f"{option}: only with --nccl-tests LOG or --network (a network profile)")
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
    check_target(out)  # a link (dangling or not), a directory, a device: refused before anything
    existed = out.exists()
    if existed and not args.force and not read_bounded(out, 1 << 20, "profile").startswith(PROFILE_HEAD.encode()):
        raise ScenarioError(f"--out {out}: exists and is not a profile ddlsim wrote; name another file, or --force")
    out.parent.mkdir(parents=True, exist_ok=True)
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


def cmd_calibrate_network(args: argparse.Namespace) -> int:
    """``calibrate --nccl-tests LOG`` or ``calibrate --network``: a network profile."""
    from ..backends import calibrate_network as cn

    if args.nccl_tests is not None and args.network:
        raise ScenarioError("--nccl-tests and --network: give one (a log to fit, or a measurement here)")
    if args.nccl_tests is not None:
        _, cal = cn.from_nccl_tests(args.nccl_tests, Path(args.out) if args.out else None, args.force, args.ranks,
                                    args.collective, args.scope, args.min_bytes, args.max_bytes)
    else:
        if args.collective not in (None, "all_reduce"):
            raise ScenarioError(f"--collective {args.collective}: --network measures all_reduce")
        if args.min_bytes is not None:
            raise ScenarioError("--min-bytes: only with --nccl-tests (the sweep starts at 8 B)")
        cal = cn.measured(Path(args.out) if args.out else None, args.force, args.ranks, args.device, args.max_bytes,
                          args.scope)
    for line in cn.report_lines(cal):
        print(line)
    return 0


VALIDATE_FILES = ["validation.csv", "validation.png", "validation.svg"]


def cmd_validate(args: argparse.Namespace) -> int:
    from .load import load
    from .validate import check_points, table_lines, validate

    scenario = load(resolve_scenario(args.scenario), args.set)
    out = out_dir(args, scenario, "-validate")
    resolve_device(args.device)
    check_points(scenario.points(), args.profile, args.force)  # profile, live refusals, size: before any write
    with ResultsFolder.open(out, force=args.force) as folder:
        if folder.info.get("scenario") not in (None, scenario.base["name"]) and not args.force:
            raise ScenarioError(f"--out {out}: holds the results of scenario {folder.info['scenario']!r}; choose "
                                "another --out or --force")
        folder.info["scenario"] = scenario.base["name"]
        folder.claim(VALIDATE_FILES)
        rows = validate(scenario, out, args.profile, progress=not args.quiet, resume=args.resume,
                        device=args.device, force=args.force)
    for line in table_lines(rows, out):  # a figure that is not a number is "n/a", never "nan%"
        print(line)
    return 0


def _check_trace_of(trace: Any, point: dict[str, Any], args: argparse.Namespace) -> None:
    """Refuse (unless ``--force``) a ``--scenario`` point that is not the one the trace ran:
    another protocol, or another number of learners or nodes (a PS trace's learners are the
    ones its gradients name)."""
    from ..simulator import trace as tracemod
    from ..simulator.protocols.catalog import PS, SPECS

    proto = trace.header.get("protocol")
    spec = SPECS.get(proto or "")
    if spec is None or args.force:
        return
    grads = trace.ops["node"][trace.ops["kind"] == tracemod.GRAD]
    members = int(grads.max()) + 1 if spec.family == PS and len(grads) else int(trace.header.get("nodes", 0))
    want = (point["protocol"]["name"], point["cluster"]["learners"])
    if (proto, members) != want and not (spec.family == PS and not len(grads) and proto == want[0]):
        raise ScenarioError(f"{args.trace}: the trace ran {proto} with {members} learners or nodes, but --scenario "
                            f"{args.scenario} point {args.point} is {want[0]} with {want[1]}: choose that point "
                            "(--point N, --set), or --force")


def cmd_replay(args: argparse.Namespace) -> int:
    """Replay one trace (a live run's, a torchrun run's or a simulated one) into a results
    folder: summary.csv, curves.csv, the figures and the report."""
    import json
    import time

    from ..simulator import trace as trace_io
    from ..simulator.stats import staleness_histogram, staleness_stats
    from .load import load, point_hash, recorded_point
    from .runner import staleness_csv, lead_values, prepare_folder, store_result, write_tables

    trace = trace_io.read(args.trace)
    trace_io.check_replayable(trace, args.trace)  # before any scenario, data or model is loaded
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
    point.setdefault("_id", f"replay-{Path(args.trace).parent.name or 'trace'}")
    out = Path(args.out) if args.out else Path("results") / safe_name(point["_id"])
    resolve_device(args.device)
    with ResultsFolder.open(out, force=args.force) as folder:
        replayed = f"{point_hash(point)}:{trace.header.get('run_id', '')}"  # the point and the trace it replays
        prepare_folder(folder, str(point.get("name", "replay")), {point["_id"]: replayed}, {point["_id"]},
                       "replay", traces=False)
        from ..backends.base import RunOptions
        from ..backends.replay import ReplayBackend

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
        folder.write("scenario.json", json.dumps({"name": point.get("name", "replay"), "points": [point["_id"]],
                                                  "target_error": point["workload"]["target_error"]}))
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
        from ..analysis.report import write_figures_and_report

        figures, report = write_figures_and_report(out)
        if figures:
            print(f"figures: {len(figures)} files in {figures[0].parent}")
        print(f"report: {report}")


def register(sub: Any) -> None:
    """Add plot, report, calibrate and validate to the ``ddlsim`` parser."""
    p = sub.add_parser("plot", help="draw the tradeoff figures of a results directory (PNG and SVG)")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="figure directory (default RESULTS/figures)")
    p.add_argument("--force", action="store_true", help="overwrite figure files ddlsim did not write")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("report", help="write one self-contained HTML report of a results directory")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="HTML file (default RESULTS/report.html)")
    p.add_argument("--force", action="store_true", help="overwrite a report file ddlsim did not write")
    p.set_defaults(func=cmd_report)
    p = sub.add_parser("calibrate", help="measure compute, server and loopback network costs; write a profile")
    p.add_argument("--model", default="mlp", choices=TRAINABLE_MODELS, help="model to time (default mlp)")
    p.add_argument("--dataset", default="digits", choices=EMBEDDED_DATASETS + FILE_DATASETS,
                   help="data set whose input shape the model takes (default digits)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--minibatches", default="1,2,4,8,16,32,64,128", help="comma-separated minibatch sizes")
    p.add_argument("--no-network", action="store_true", help="skip the loopback network measurements")
    p.add_argument("--no-cycle", action="store_true",
                   help="latency from the raw ping-pong instead of a short live push-pull run")
    p.add_argument("--out", help="profile file (default profiles/MODEL-DATASET-DEVICE.toml; network profiles: "
                                 "profiles/network-….toml)")
    p.add_argument("--force", action="store_true", help="overwrite an existing file that is not a ddlsim profile")
    p.add_argument("--nccl-tests", metavar="LOG", help="fit α and β to an all_reduce_perf / all_gather_perf log; "
                                                       "write a network profile (cluster.network.profile)")
    p.add_argument("--network", action="store_true",
                   help="measure α and β with torch.distributed all-reduces here; write a network profile")
    p.add_argument("--ranks", type=int, help="--nccl-tests: ranks of a log without '#  Rank' lines; "
                                             "--network: processes (default 2)")
    p.add_argument("--collective", choices=("all_reduce", "all_gather"),
                   help="--nccl-tests: the log's collective (default: from its busbw/algbw)")
    p.add_argument("--scope", choices=("inter", "intra"),
                   help="link the profile sets: between nodes or inside one (default: inter for several hosts "
                        "or gloo, intra for one host's GPUs)")
    p.add_argument("--min-bytes", type=int, help="--nccl-tests: fit only the rows of at least this many bytes "
                                                 "(e.g. the gradient bucket's size)")
    p.add_argument("--max-bytes", type=int, help="--nccl-tests: fit only the rows of at most this many bytes; "
                                                 "--network: the largest all-reduce (default 16 MiB)")
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
    p.add_argument("--force", action="store_true",
                   help="write into a folder that holds other results or files ddlsim did not write, "
                        "or replay a trace with a --scenario point it did not run")
    p.set_defaults(func=cmd_replay)
