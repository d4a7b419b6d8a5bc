"""Derived numbers the figures and the report show: Pareto fronts, speed-ups, the
simulated-vs-measured comparison. Pure functions of table rows (no matplotlib)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .table import (Row, config_key, is_number, label, labels, mean, sort_key, swept_keys,
                    varying_keys)

CONFIG_ORDER = ("protocol", "softsync_n", "learners", "minibatch")
EPOCH_COLUMNS = ("workload.epochs", "epochs")


def config_sorted(rows: Iterable[Row]) -> list[Row]:
    """Rows ordered by protocol, n, λ, μ, then the swept keys (numbers numerically,
    ``None`` last)."""
    return sorted(rows, key=lambda r: tuple(sort_key(r.get(k)) for k in CONFIG_ORDER)
                  + tuple(sort_key(r.get(k)) for k in sorted(swept_keys(r))))


def pareto_front(rows: Iterable[Mapping[str, Any]], x: str = "sim_time_s",
                 y: str = "final_test_error") -> list[Mapping[str, Any]]:
    """Rows no other row dominates when minimising both ``x`` and ``y``, sorted by x.

    ``q`` dominates ``p`` when ``q[x] ≤ p[x]`` and ``q[y] ≤ p[y]`` with one strict;
    identical points dominate neither other (both kept). Rows lacking a finite ``x``
    or ``y`` take no part.
    """
    pts = sorted((r for r in rows if is_number(r.get(x)) and is_number(r.get(y))),
                 key=lambda r: (r[x], r[y]))
    front: list[Mapping[str, Any]] = []
    for r in pts:
        if not front or r[y] < front[-1][y] or (r[x] == front[-1][x] and r[y] == front[-1][y]):
            front.append(r)
    return front


def speedups(summary: Iterable[Row], metric: str = "sim_time_s") -> list[dict[str, Any]]:
    """Speed-up ``T(λ=1) / T(λ)`` of ``metric`` for every configuration with a baseline.

    A series is a configuration without ``learners`` (protocol, n, μ, swept keys); its
    baseline is its own λ = 1 run, else the λ = 1 runs with the same μ and swept keys
    under any protocol (one learner runs alike under all of them). Repeated runs are
    averaged; runs without a positive ``metric`` or a positive λ are skipped. Returns rows
    ``series, protocol, learners, time, baseline, speedup`` sorted by series then λ.
    """
    rows = [r for r in summary if is_number(r.get("learners")) and r["learners"] > 0
            and is_number(r.get(metric)) and r[metric] > 0]
    keys = varying_keys(rows)
    anyproto = ("learners", "protocol", "softsync_n")
    series: dict[tuple, list[Row]] = {}
    for r in config_sorted(rows):
        series.setdefault(config_key(r, omit=("learners",)), []).append(r)
    singles: dict[tuple, list[float]] = {}
    for r in rows:
        if r["learners"] == 1:
            singles.setdefault(config_key(r, omit=anyproto), []).append(r[metric])
    out: list[dict[str, Any]] = []
    for rs in series.values():
        base = [r[metric] for r in rs if r["learners"] == 1] or singles.get(
            config_key(rs[0], omit=anyproto), [])
        if not base:
            continue
        t1 = mean(base)
        by_lam: dict[float, list[float]] = {}
        for r in rs:
            by_lam.setdefault(r["learners"], []).append(r[metric])
        name = label(rs[0], keys, omit=("learners",))
        for lam in sorted(by_lam):
            t = mean(by_lam[lam])
            out.append({"series": name, "protocol": rs[0].get("protocol"), "learners": lam,
                        "time": t, "baseline": t1, "speedup": t1 / t})
    return out


def sim_measured_pairs(table: Iterable[Row]) -> list[dict[str, Any]]:
    """Pairs of simulated and measured time, per epoch when an epochs column exists.

    A row with both ``sim_time_s`` and ``measured_sim_time_s`` (and ``source`` not
    "measured") is a pair by itself; a row with ``source == "measured"`` pairs its
    ``measured_sim_time_s`` (else its ``sim_time_s``) with the mean ``sim_time_s`` of
    the simulated rows (``source`` "simulated" or empty) of the same configuration.
    Returns ``run_id, label, simulated, measured, rel_error, per_epoch`` with
    ``rel_error = (simulated − measured) / measured``.
    """
    rows = list(table)
    names = labels(rows)
    simulated: dict[tuple, list[float]] = {}
    for r in rows:
        if r.get("source") in (None, "simulated") and is_number(r.get("sim_time_s")):
            simulated.setdefault(config_key(r), []).append(r["sim_time_s"])
    out = []
    for r in rows:
        meas = r.get("measured_sim_time_s")
        if r.get("source") == "measured":
            meas = meas if is_number(meas) else r.get("sim_time_s")
            sim = mean(simulated[config_key(r)]) if config_key(r) in simulated else None
        else:
            sim = r.get("sim_time_s")
        if not (is_number(sim) and is_number(meas) and meas > 0):
            continue
        epochs = next((r[c] for c in EPOCH_COLUMNS if is_number(r.get(c)) and r[c] > 0), None)
        div = epochs or 1
        out.append({"run_id": r.get("run_id"), "label": names[str(r.get("run_id"))],
                    "simulated": sim / div, "measured": meas / div,
                    "rel_error": (sim - meas) / meas, "per_epoch": epochs is not None})
    return out


__all__ = ["pareto_front", "speedups", "sim_measured_pairs", "config_sorted"]
