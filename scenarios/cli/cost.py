"""What one sweep point will cost to simulate, estimated from the scenario's numbers before any
work, and the limits above which a command asks for ``--force``."""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from typing import Any

from ...simulator import topology
from ...simulator.compute import mean_compute_s
from ...simulator.protocols import gradients_per_update, is_ps, iterations, total_gradients
from ...simulator.protocols.catalog import LOCAL_PROTOCOLS
from ...simulator.protocols.local import messages as local_messages
from ..runner import CURVE_COLUMNS, RESULT_MAX_BYTES
from .common import UsageError

# What one point may cost before --force is needed (estimate(): counts from the scenario's
# numbers; the stall count and the simulated time are lower bounds):
MAX_POINT_GRADIENTS = 100_000_000  # gradients (≈ 200 B of trace each)
MAX_POINT_MESSAGES = 100_000_000   # messages simulated: gossip mixes, gradient buckets (a trace row each)
MAX_GRAPH_ENTRIES = 10_000_000     # gossip peer-table entries built before the run, every phase of the graph
MAX_POINT_STALLS = 100_000_000     # transient stalls the learners' clocks step through


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
    active, passive = n // 2, (n + 1) // 2
    if topology_name == "complete":
        return active * passive
    return active * (2 if topology_name == "ring" else 2 * topology.digits(max(n - 1, 0), 2))


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
    if name in LOCAL_PROTOCOLS or proto["compression"] != "none":
        messages = local_messages(point, buckets)  # local steps send nothing; averagings one each
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
    for p in scenario.points():
        c = estimate(p)
        where = f"point {p['_id']}"
        if c.gradients > MAX_POINT_GRADIENTS:
            raise UsageError(f"{where} would simulate {c.gradients:.3g} gradients (about {c.gradients * 200 / 1e9:.3g} "
                             f"GB of trace, {c.gradients / 5e5 / 60:.3g} min or more); the limit is "
                             f"{MAX_POINT_GRADIENTS:.0e}: fewer epochs or samples, or --force")
        proto = p["protocol"]
        if c.graph > MAX_GRAPH_ENTRIES:
            graph = proto["topology"] if proto["name"] != "dpsgd" else topology.symmetric_topology(proto["topology"])
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
