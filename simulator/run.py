"""Simulate one scenario point: pick the protocol family's engine, build the trace and summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import fast_ps
from .gossip import simulate_gossip
from .protocols import header_for, is_ps
from .ps import PSRun
from .stats import staleness_stats
from .trace import Trace


@dataclass
class SimResult:
    """A simulated run: its ``trace`` and the ``summary`` figures (summary.csv columns)."""

    trace: Trace
    summary: dict[str, Any]


def simulate_ps(point: dict[str, Any]) -> tuple[Trace, dict[str, Any]]:
    """Run a parameter-server protocol for a validated scenario point: ``(trace, summary)``."""
    engine = PSRun(point)
    builder = engine.run()
    return builder.build(header_for(point, 1, engine.core.layout)), engine.stats()


ENGINES = ("auto", "simpy", "fast")


def simulate(point: dict[str, Any], engine: str = "auto") -> SimResult:
    """Run the simulator for a validated scenario point.

    ``engine``: "simpy" (the reference model), "fast" (:mod:`.fast_ps`, byte-identical, for
    the configurations it covers; an error otherwise) or "auto" (fast when it covers the point).
    """
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
    reason = fast_ps.covers(point) if engine != "simpy" else "simpy requested"
    if engine == "fast" and reason is not None:
        raise ValueError(f"engine 'fast' does not cover this point: {reason} (use --engine auto or simpy)")
    if reason is None:
        trace, summary = fast_ps.simulate_ps_fast(point)
    else:
        trace, summary = simulate_ps(point) if is_ps(point) else simulate_gossip(point)
    summary.update(staleness_stats(trace.inputs["staleness"]))
    return SimResult(trace, summary)
