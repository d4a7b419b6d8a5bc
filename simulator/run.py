"""Simulate one scenario point: pick the protocol family's engine, build the trace and summary."""

from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from collections.abc import Callable

from . import fast_adpsgd, fast_allreduce, fast_dpsgd, fast_ps, fast_sgp
from .gossip import simulate_gossip
from .local_sgd import covers as local_covers, simulate_local
from .protocols import header_for, is_ps
from .ps import PSRun
from .stats import histogram, stats_from_histogram
from .trace import Trace, eval_schedule


@dataclass
class SimResult:
    """A simulated run: its ``trace`` (None when not kept), the ``summary`` figures (summary.csv
    columns), the staleness ``histogram`` ((σ, count), σ ascending), the evaluation schedule
    ``evals`` ((simulated time, epoch)) and ``sim_id`` (the trace header's run id)."""

    trace: Trace | None
    summary: dict[str, Any]
    histogram: list[tuple[int, int]] = field(default_factory=list)
    evals: list[tuple[float, float]] = field(default_factory=list)
    sim_id: str = ""


def simulate_ps(point: dict[str, Any]) -> tuple[Trace, dict[str, Any]]:
    """Run a parameter-server protocol for a validated scenario point: ``(trace, summary)``."""
    engine = PSRun(point)
    builder = engine.run()
    return builder.build(header_for(point, 1, engine.core.layout)), engine.stats()


ENGINES = ("auto", "simpy", "fast")

FastEngine = Callable[[dict[str, Any], bool], tuple[Any, ...]]


FAST = {  # protocol → (what the fast engine covers, the engine); the parameter-server family shares one
    "allreduce": (fast_allreduce.covers, fast_allreduce.simulate_allreduce_fast),
    "sgp": (fast_sgp.covers, fast_sgp.simulate_sgp_fast),
    "dpsgd": (fast_dpsgd.covers, fast_dpsgd.simulate_dpsgd_fast),
    "adpsgd": (fast_adpsgd.covers, fast_adpsgd.simulate_adpsgd_fast),
}


def fast_engine(point: dict[str, Any]) -> tuple[FastEngine | None, str | None]:
    """The fast engine that simulates ``point`` exactly, or None and why there is none."""
    if local_covers(point):
        return None, "local SGD, DiLoCo and compressed all-reduce have one engine (a loop, no event queue)"
    pull = point["cluster"]["server"].get("pull", "whole") if is_ps(point) else "whole"
    if pull != "whole":
        return None, f"key 'cluster.server.pull' = {pull!r}: the layer-wise pull has the SimPy engine only"
    covers, engine = (fast_ps.covers, fast_ps.simulate_ps_fast) if is_ps(point) else FAST[point["protocol"]["name"]]
    reason = covers(point)
    return (engine if reason is None else None), reason


KERNEL_MODULES = {"ps": ("fast_ps", "fast_core"), "sgp": ("fast_sgp", "fast_nodes", "fast_core"),
                  "dpsgd": ("fast_dpsgd", "fast_nodes", "fast_core"),
                  "adpsgd": ("fast_adpsgd", "fast_nodes", "fast_core")}
# (the numba-compiled modules; allreduce's engine is a closed form)


def kernels_to_compile(points: list[dict[str, Any]], engine: str = "auto") -> list[str]:
    """The fast-engine modules that simulating ``points`` would compile first: those without
    numba's cache of them (an index ``MODULE.*.pyXY.nbi`` under ``NUMBA_CACHE_DIR`` when it is
    set, else in ``__pycache__`` beside the module or, when the package folder is not writable,
    in the user-wide cache) written after the module's source. Cheap: stats files, imports no numba."""
    if engine == "simpy" or importlib.util.find_spec("numba") is None:
        return []
    wanted: set[str] = set()
    for p in points:
        wanted.update(KERNEL_MODULES.get("ps" if is_ps(p) else p["protocol"]["name"], ()))
    return sorted(m for m in wanted if not _cached(m))


def _cached(module: str, here: Path | None = None) -> bool:
    """Whether numba's cache holds code compiled from ``module`` (in folder ``here``, default
    this package) since its source last changed."""
    here = here or Path(__file__).resolve().parent
    try:
        source = (here / f"{module}.py").stat().st_mtime
    except OSError:
        return True  # no source (a frozen install): nothing numba would compile from it
    pattern = f"{module}.*.py{sys.version_info.major}{sys.version_info.minor}.nbi"
    places = [here / "__pycache__"]  # numba's order: NUMBA_CACHE_DIR alone, else in the tree, else user-wide
    if os.environ.get("NUMBA_CACHE_DIR"):
        places = [Path(os.environ["NUMBA_CACHE_DIR"])]
    elif not os.access(here, os.W_OK):
        places.append(Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "numba")
    for place in places:
        found = place.glob(pattern) if place.name == "__pycache__" else place.rglob(pattern)
        try:
            if any(f.stat().st_mtime >= source for f in found):
                return True
        except OSError:
            continue
    return False


def simulate(point: dict[str, Any], engine: str = "auto", keep_trace: bool = True) -> SimResult:
    """Run the simulator for a validated scenario point.

    ``engine``: "simpy" (the reference model), "fast" (:func:`fast_engine`: byte-identical, for
    the configurations they cover; an error otherwise) or "auto" (fast when one covers the
    point). ``keep_trace=False`` returns no trace; the fast engines then drop it as they go
    (memory independent of the run's length), the SimPy engines build it and let it go at the
    end. The summary, histogram and schedule are the same either way.
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
    fast, reason = fast_engine(point) if engine != "simpy" else (None, "simpy requested")
    if engine == "fast" and fast is None:
        raise ValueError(f"engine 'fast' does not cover this point: {reason} (use --engine auto or simpy)")
    if fast is not None:
        trace, summary, hist, evals, sim_id = fast(point, keep_trace)
    else:
        trace, summary = (simulate_ps(point) if is_ps(point) else simulate_local(point) if local_covers(point)
                          else simulate_gossip(point))
        hist = histogram(trace.inputs["staleness"])
        evals = eval_schedule(trace.ops)
        sim_id = trace.header["run_id"]
    summary.update(stats_from_histogram(hist))
    return SimResult(trace, summary, hist, evals, sim_id)
