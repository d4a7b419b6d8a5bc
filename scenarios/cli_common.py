"""What the ``ddlsim`` commands share: scenario arguments, output folders, the result table.

Every command module (:mod:`.cli`, :mod:`.commands`, :mod:`.advise_cli`) imports from here;
nothing here imports a command module, so the command line has no import cycle.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
from dataclasses import dataclass
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


# What one point may cost before --force is needed (estimate(): counts from the scenario's
# numbers; the stall count and the simulated time are lower bounds):
MAX_POINT_GRADIENTS = 100_000_000  # gradients (≈ 200 B of trace each)
MAX_POINT_MESSAGES = 100_000_000   # messages simulated: gossip mixes, gradient buckets (a trace row each)
MAX_GRAPH_ENTRIES = 10_000_000     # gossip peer-table entries built before the run, every phase of the graph
MAX_POINT_STALLS = 100_000_000     # transient stalls the learners' clocks step through
NAME_MAX_BYTES = 200  # a folder named after a scenario, so that a suffix ("-advise") keeps it ≤ 255 bytes


@dataclass(frozen=True)
class Cost:
    """What simulating one point takes (:func:`estimate`); ``per_iteration``, ``iterations``,
    ``phases`` and ``buckets`` say where ``messages`` and ``graph`` come from."""

    gradients: int
    messages: int
    graph: int
    stalls: float
    sim_time_s: float       # a lower bound of the simulated time (compute stretched by stalls)
    evaluations: int
    result_bytes: int       # result.json with the curve and the evaluation schedule
    per_iteration: int      # messages of one iteration (gossip), or per gradient (buckets)
    iterations: int
    phases: int
    buckets: int


def _degree(protocol: str, topology_name: str, n: int, peers: int) -> int:
    """Mixes a node makes per iteration (at most): D-PSGD one per symmetric neighbour, SGP one
    per out-peer and one of its own share; on ``complete`` every other node is a neighbour."""
    own = 1 if protocol == "sgp" else 0
    if n == 1:
        return own
    if topology_name == "complete":
        return n - 1 + own
    if protocol == "dpsgd" and topology_name == "ring":
        return min(2 * peers, n - 1)
    return min(peers, n - 1) + own


def _adpsgd_candidates(topology_name: str, n: int) -> int:
    """Σ over active nodes of their passive candidates (:func:`.topology.adpsgd_candidates`), at most."""
    from ..simulator.topology import digits

    active, passive = n // 2, (n + 1) // 2
    if topology_name == "complete":
        return active * passive
    return active * (2 if topology_name == "ring" else 2 * digits(max(n - 1, 0), 2))


def _stall_time(work_s: float, other_s: float, steps: int, rho: float) -> float:
    """Simulated time of ``steps`` steps of ``work_s`` computing and ``other_s`` waiting each, under
    stalls of load ρ = rate × mean: stalls pause computing and overlap (their union is an M/M/∞
    busy period), so a learner is free e^-ρ of the time and ``work_s`` takes ``work_s`` · e^ρ."""
    stretch = math.exp(rho) if rho < 700 else math.inf
    per_step = (work_s * stretch if work_s > 0 else 0.0) + other_s
    return steps * per_step


@functools.cache
def _eval_bytes() -> int:
    """Bytes one evaluation adds to result.json, but for its run id and update count: its curve
    row (:data:`.runner.CURVE_COLUMNS`, numbers written with 17 significant digits) and its
    schedule entry."""
    import json

    from .runner import CURVE_COLUMNS

    x = 1234.5678901234567
    row = {c: x for c in CURVE_COLUMNS} | {"run_id": "", "updates": 0}
    return len(json.dumps(row)) - 1 + len(json.dumps([x, x])) + 4  # (", " between rows and entries)


def estimate(point: dict[str, Any]) -> Cost:
    """What a point's simulation takes, from the scenario's numbers alone (nothing is built):
    gradients (all learners or nodes); messages (gradients × buckets of ``protocol.bucket_bytes``
    for the parameter server and AllReduce; messages per iteration × iterations for SGP, D-PSGD
    and AD-PSGD); peer-table entries (messages per iteration × the graph's phases, or AD-PSGD's
    candidates); stall events (rate × each learner's simulated time, compute stretched e^ρ);
    evaluations (⌈epochs × evals_per_epoch⌉ but at most one per update, and one at t = 0) and
    the bytes of result.json they make."""
    from ..simulator import topology
    from ..simulator.compute import mean_compute_s
    from ..simulator.protocols import gradients_per_update, is_ps, iterations, total_gradients

    cl, proto, wl = point["cluster"], point["protocol"], point["workload"]
    n, name = cl["learners"], proto["name"]
    ps = is_ps(point)
    gradients = total_gradients(point) if ps else iterations(point) * n
    steps = math.ceil(gradients / n)
    nbytes = wl["param_count"] * cl["network"]["bytes_per_param"]
    bucket = proto["bucket_bytes"]
    grouped = ps and cl["server"]["group_size"] > 1
    buckets = 1 if grouped or bucket <= 0 or bucket >= nbytes else math.ceil(nbytes / bucket)
    per_iteration, phases, graph = buckets, 0, 0
    messages = gradients * buckets
    if name in ("sgp", "dpsgd"):
        topo = proto["topology"] if name == "sgp" else topology.symmetric_topology(proto["topology"])
        per_iteration = n * _degree(name, proto["topology"], n, proto["peers"])
        phases = topology.period(topo, n, proto["peers"])
        messages, graph = per_iteration * steps, per_iteration * phases
    elif name == "adpsgd":
        per_iteration = 2 * (n // 2)  # each active node's request and its partner's answer
        messages, graph = per_iteration * steps, _adpsgd_candidates(proto["topology"], n)
    strag, net = cl["stragglers"], cl["network"]
    rate, rho = strag["stall_rate_per_s"], strag["stall_rate_per_s"] * strag["stall_mean_s"]
    work = mean_compute_s(cl["compute"], cl["minibatch"])
    other = 2 * (net["latency_s"] + net["overhead_s"]) + cl["server"]["apply_s"] if ps else 0.0
    slow = round(strag["fraction"] * n)
    fast_t = _stall_time(work, other, steps, rho if rate > 0 else 0.0)
    slow_t = _stall_time(work * strag["slowdown"], other, steps, rho if rate > 0 else 0.0)
    learner_time = sum(count * t for count, t in ((n - slow, fast_t), (slow, slow_t)) if count)  # (never 0 × inf)
    stalls = 0.0 if rate == 0 or strag["stall_mean_s"] == 0 or learner_time == 0 else rate * learner_time
    updates = math.ceil(gradients / gradients_per_update(point)) if ps else steps if name == "allreduce" else gradients
    evaluations = min(math.ceil(wl["epochs"] * wl["evals_per_epoch"]), updates) + 1  # at most one per update, and t = 0
    per_eval = _eval_bytes() + len(point.get("_id", "")) + len(str(gradients))
    return Cost(gradients, messages, graph, stalls, max(fast_t, slow_t if slow else 0.0), evaluations,
                evaluations * per_eval, per_iteration, steps, phases, buckets)


def _at_least(x: float) -> str:
    """A lower bound as a message says it (one beyond floats as such)."""
    return f"≥ {x:.3g}" if math.isfinite(x) else "beyond 1e308"


def check_cost(scenario: Any, force: bool) -> None:
    """Refuse, before any work, a sweep point too large to simulate in memory and time, or whose
    result.json would be larger than --resume reads back (one line: the estimate, the limit and
    the way out), unless ``force``."""
    if force:
        return
    from ..simulator.topology import symmetric_topology
    from .runner import RESULT_MAX_BYTES

    for p in scenario.points():
        c = estimate(p)
        where = f"point {p['_id']}"
        if c.gradients > MAX_POINT_GRADIENTS:
            raise UsageError(f"{where} would simulate {c.gradients:.3g} gradients (about {c.gradients * 200 / 1e9:.3g} "
                             f"GB of trace, {c.gradients / 5e5 / 60:.3g} min or more); the limit is "
                             f"{MAX_POINT_GRADIENTS:.0e}: fewer epochs or samples, or --force")
        proto = p["protocol"]
        if c.graph > MAX_GRAPH_ENTRIES:
            graph = proto["topology"] if proto["name"] != "dpsgd" else symmetric_topology(proto["topology"])
            what = (f"AD-PSGD's passive candidates on {graph!r} over {p['cluster']['learners']:,} nodes"
                    if proto["name"] == "adpsgd" else
                    f"{c.per_iteration:,} links per iteration of the {graph!r} graph × its {c.phases:,} "
                    f"phase{'s' if c.phases != 1 else ''}")
            raise UsageError(f"{where}: its gossip graph needs {c.graph:.3g} table entries ({what}) before the run "
                             f"starts; the limit is {MAX_GRAPH_ENTRIES:.0e}: a sparser protocol.topology, fewer "
                             "nodes, or --force")
        if c.messages > MAX_POINT_MESSAGES:
            what = (f"{c.gradients:,} gradients × {c.buckets:,} buckets of protocol.bucket_bytes"
                    if proto["name"] not in ("sgp", "dpsgd", "adpsgd") else
                    f"{c.per_iteration:,} per iteration × {c.iterations:,} iterations")
            raise UsageError(f"{where} would simulate {c.messages:.3g} messages ({what}); the limit is "
                             f"{MAX_POINT_MESSAGES:.0e}: fewer nodes, peers or iterations, larger buckets, or --force")
        if c.stalls > MAX_POINT_STALLS:
            strag = p["cluster"]["stragglers"]
            rho = strag["stall_rate_per_s"] * strag["stall_mean_s"]
            free = f"e^-{rho:.3g}" if rho >= 10 else f"{math.exp(-rho):.3g}"
            raise UsageError(f"{where}: stall_rate_per_s × stall_mean_s = {rho:.3g}: learners would be stalled all "
                             f"but {free} of the time (simulated time {_at_least(c.sim_time_s)} s), "
                             f"{_at_least(c.stalls)} stall events to simulate; the limit is {MAX_POINT_STALLS:.0e}: "
                             "fewer or shorter stalls, or --force")
        if c.result_bytes > RESULT_MAX_BYTES:
            raise UsageError(f"{where}: {c.evaluations:,} evaluations (workload.epochs × workload.evals_per_epoch) "
                             f"make a result.json of about {c.result_bytes / 2**20:,.0f} MiB, more than the "
                             f"{RESULT_MAX_BYTES >> 20} MiB --resume reads back: fewer evaluations per epoch, or "
                             "--force (the point is then recomputed on every --resume)")


def safe_name(name: str) -> str:
    """A scenario name usable as one directory name: no separators, no control characters, only
    characters the file system's encoding can write, at most 100 characters and
    :data:`NAME_MAX_BYTES` bytes in that encoding (a folder name may have 255; the rest is room
    for a suffix such as "-advise"), cut at a character, so a long CJK name stays readable."""
    encoding = sys.getfilesystemencoding()

    def writable(c: str) -> str:
        try:
            c.encode(encoding)
        except UnicodeEncodeError:
            return "_"
        return c

    clean = "".join(writable(c) for c in re.sub(r"[^\w.+-]", "_", name)).strip(".") or "scenario"
    out, size = [], 0
    for c in clean[:100]:
        size += len(c.encode(encoding))
        if size > NAME_MAX_BYTES:
            break
        out.append(c)
    return "".join(out).rstrip(".") or "scenario"


def out_dir(args: argparse.Namespace, scenario: Any, suffix: str = "") -> Path:
    """``--out``, or ``results/<name><suffix>``: the scenario file's name for a file (an edited
    copy of ``demo`` named ``my.toml`` writes into results/my, not into the demo's results),
    the bundled name for a bundled scenario. What may be written there is the results
    folder's rule (:mod:`ddlsim.simulator.results_folder`)."""
    if args.out:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out}: exists and is not a directory")
        return out
    source = resolve_scenario(args.scenario)
    name = source.stem if source.parent != CATALOGUE else str(scenario.base["name"])
    return Path("results") / (safe_name(name) + suffix)


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
    from ..backends.data_files import check_data, data_files
    from ..simulator.catalog import EMBEDDED_DATASETS

    seen: set[str] = set()
    said: list[str] = []
    for point in scenario.points():
        if backend == "replay" or point["live"]["compute"] == "real":
            check_data(point, data_dir, download)
            name = point["workload"]["dataset"]
            if name not in seen and name not in EMBEDDED_DATASETS:
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


