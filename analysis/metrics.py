"""Derived numbers the figures and the report show: replicates of a configuration and their
spread, Pareto fronts, speed-ups, the simulated-vs-measured comparison. Pure functions of
table rows (no matplotlib)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .table import (CONFIG_COLUMNS, Row, config_key, is_number, label, labels, mean, sort_key,
                    swept_keys, varying_keys)

R = TypeVar("R", bound=Mapping[str, Any])  # a run's row, as the caller holds it

# Student's t distribution's 97.5 % quantile t_{0.975, ν} for ν = 1 … 99 degrees of freedom: the
# two-sided 95 % critical values tabulated in the NIST/SEMATECH e-Handbook of Statistical Methods
# (§1.3.6.7.2, "Critical values of the Student's t distribution"), here to full double precision
# as scipy.stats.t.ppf(0.975, ν) gives them (tests/test_replicates.py holds the table to scipy).
T975 = (
    12.706204736174694, 4.302652729749462, 3.1824463052837078, 2.7764451051977934, 2.5705818356363146,
    2.4469118511449786, 2.364624251592784, 2.306004135204166, 2.262157162798205, 2.228138851986274,
    2.200985160091639, 2.1788128296672284, 2.1603686564627913, 2.144786687917804, 2.131449545559776,
    2.1199052992212546, 2.1098155778333156, 2.1009220402410382, 2.0930240544083087, 2.085963447265864,
    2.0796138447276795, 2.0738730679040254, 2.0686576104190486, 2.0638985616280245, 2.0595385527532972,
    2.0555294386428735, 2.0518305164802846, 2.0484071417952454, 2.045229642132703, 2.0422724563012378,
    2.039513446396408, 2.0369333434601016, 2.0345152974493383, 2.0322445093177186, 2.030107928250343,
    2.0280940009804502, 2.0261924630291093, 2.0243941639119694, 2.022690920036761, 2.021075390306273,
    2.019540970441376, 2.0180817028184443, 2.016692199227824, 2.0153675744437636, 2.014103388880846,
    2.012895598919429, 2.0117405137297655, 2.010634757624232, 2.0095752371292392, 2.008559112100761,
    2.007583770315836, 2.006646805061688, 2.0057459953178687, 2.0048792881880564, 2.0040447832891455,
    2.003240718847872, 2.002465459291007, 2.0017174841452356, 2.000995378088267, 2.0002978220142604,
    1.999623584994939, 1.9989715170333788, 1.998340542520741, 1.997729654317693, 1.9971379083920038,
    1.9965644189523117, 1.996008354025296, 1.9954689314298435, 1.9949454151072374, 1.994437111771186,
    1.9939433678456255, 1.9934635666618719, 1.992997125889855, 1.992543495180932, 1.9921021540022417,
    1.9916726096446642, 1.9912543953883846, 1.9908470688116906, 1.9904502102301285, 1.990063421254446,
    1.9896863234569029, 1.989318557136572, 1.9889597801751624, 1.9886096669757083, 1.9882679074772216,
    1.98793420623902, 1.9876082815890708, 1.9872898648311692, 1.986978699506281, 1.9866745407037683,
    1.9863771544186177, 1.98608631695113, 1.9858018143458227, 1.985523441866604, 1.9852510035054978,
    1.984984311522457, 1.9847231860139845, 1.9844674545084815, 1.9842169515864174,
)
Z975 = 1.959963984540054  # the standard normal's 97.5 % quantile, the limit of t_{0.975, ν}


def t975(df: int) -> float:
    """Student's t_{0.975, df}: :data:`T975` up to 99 degrees of freedom, beyond it the
    Cornish–Fisher expansion z + (z³ + z)/(4ν) + (5z⁵ + 16z³ + 3z)/(96ν²) (within 1e-5 there)."""
    if df < 1:
        raise ValueError(f"a t quantile needs at least one degree of freedom, not {df}")
    if df <= len(T975):
        return T975[df - 1]
    z = Z975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def spread(values: Iterable[Any]) -> dict[str, Any]:
    """``n, mean, min, max, ci_low, ci_high`` of the finite numbers among ``values``: the 95 %
    interval of the mean over replicates, mean ± t_{0.975, n−1} · s / √n (Student's t, s the
    sample standard deviation); ``None`` where there are too few numbers (no mean without one,
    no interval without two)."""
    xs = [float(v) for v in values if is_number(v)]
    n = len(xs)
    out: dict[str, Any] = {"n": n, "mean": None, "min": None, "max": None, "ci_low": None, "ci_high": None}
    if not n:
        return out
    m = math.fsum(xs) / n
    out.update(mean=m, min=min(xs), max=max(xs))
    if n >= 2:
        try:
            s = math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (n - 1))
        except OverflowError:  # values near the float limit (a hand-edited cell): no interval
            return out
        half = t975(n - 1) * s / math.sqrt(n)
        out.update(ci_low=m - half, ci_high=m + half)
    return out


STAT_COLUMNS = ("final_test_error", "best_test_error", "time_to_target_s", "sim_time_s")
STAT_PARTS = ("mean", "min", "max", "ci_low", "ci_high")
BOUNDS = {"final_test_error": (0.0, 1.0), "best_test_error": (0.0, 1.0)}


def replicate_groups(rows: Iterable[R]) -> dict[tuple, list[R]]:
    """Runs grouped by configuration (:func:`.table.config_key`: everything but the seed and the
    measurements), in order of first appearance; a summary without a ``seed`` column (an earlier
    ddlsim's) has one run per configuration unless it repeated one."""
    out: dict[tuple, list[R]] = {}
    for r in rows:
        out.setdefault(config_key(r), []).append(r)
    return out


def seeds_text(rows: Sequence[Mapping[str, Any]], compact: bool = False) -> str:
    """The seeds of ``rows`` listed, ``"0,1,2"`` (``compact``: ``"0–2"`` for consecutive
    integers); ``""`` when no row has one."""
    seeds = sorted({int(r["seed"]) for r in rows if is_number(r.get("seed")) and float(r["seed"]).is_integer()})
    if not seeds:
        return ""
    if compact and len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}–{seeds[-1]}"
    return ",".join(map(str, seeds))


def configuration_row(runs: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One configuration's row of ``configurations.csv`` from its runs (its replicates): its
    identity (``config_id``, protocol, λ, μ, n, the swept keys), ``replicates`` (runs that did not
    fail), ``seeds``, ``failed``; for each of :data:`STAT_COLUMNS` the mean, min, max and 95 %
    Student-t interval over the replicates (:func:`spread`; clipped to the values the quantity can
    take: errors in [0, 1], times ≥ 0), ``time_to_target_s`` over those that
    reached the target, counted in ``time_to_target_reached``; ``diverged`` and ``did_not_learn``
    count replicates; ``staleness_mean`` is the mean of theirs."""
    head = runs[0]
    done = [r for r in runs if not r.get("error")]
    ids = {r.get("config_id") for r in runs}
    row: dict[str, Any] = {"config_id": ids.pop() if len(ids) == 1 else None}
    for c in (*CONFIG_COLUMNS, *swept_keys(head)):
        row[c] = head.get(c)
    row.update(replicates=len(done), seeds=seeds_text(runs), failed=len(runs) - len(done))
    for col in STAT_COLUMNS:
        st = spread(r.get(col) for r in done)
        lo, hi = BOUNDS.get(col, (0.0, math.inf))  # an interval reaches no error below 0, no time below 0
        if st["ci_low"] is not None:
            st.update(ci_low=max(lo, st["ci_low"]), ci_high=min(hi, st["ci_high"]))
        if col == "time_to_target_s":
            row["time_to_target_reached"] = st["n"] if any(col in r for r in runs) else None
        for part in STAT_PARTS:
            row[f"{col}_{part}"] = st[part]
    for flag in ("diverged", "did_not_learn"):
        row[flag] = sum(r.get(flag) is True for r in done) if any(flag in r for r in runs) else None
    row["staleness_mean"] = spread(r.get("staleness_mean") for r in done)["mean"]
    return row


def configurations(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """One :func:`configuration_row` per configuration of ``rows``, in order of first appearance."""
    return [configuration_row(runs) for runs in replicate_groups(rows).values()]


def within_intervals(a: Mapping[str, Any], b: Mapping[str, Any], col: str = "final_test_error",
                     width: float = 0.0) -> bool:
    """Two configurations (:func:`configuration_row`) are not told apart by ``col``: each one's
    mean lies within the other's 95 % interval, or the means are at most ``width`` apart (the
    noise of the test set: two test samples); without intervals (single runs) only ``width``."""
    ma, mb = a.get(f"{col}_mean"), b.get(f"{col}_mean")
    if not (is_number(ma) and is_number(mb)):
        return False
    if abs(ma - mb) <= width + 1e-12:
        return True

    def inside(m: float, c: Mapping[str, Any]) -> bool:
        lo, hi = c.get(f"{col}_ci_low"), c.get(f"{col}_ci_high")
        return is_number(lo) and is_number(hi) and lo - 1e-12 <= m <= hi + 1e-12

    return inside(ma, b) and inside(mb, a)

CONFIG_ORDER = ("protocol", "softsync_n", "learners", "minibatch")
EPOCH_COLUMNS = ("workload.epochs", "epochs")


def config_sorted(rows: Iterable[Row]) -> list[Row]:
    """Rows ordered by protocol, n, λ, μ, then the swept keys (numbers numerically,
    ``None`` last)."""
    return sorted(rows, key=lambda r: tuple(sort_key(r.get(k)) for k in CONFIG_ORDER)
                  + tuple(sort_key(r.get(k)) for k in sorted(swept_keys(r))))


SAME_VALUE = 1e-9  # relative: pareto_front's tolerance for "equal"


def pareto_front(rows: Iterable[Mapping[str, Any]], x: str = "sim_time_s",
                 y: str = "final_test_error") -> list[Mapping[str, Any]]:
    """Rows no other row dominates when minimising both ``x`` and ``y``, sorted by x.

    ``q`` dominates ``p`` when ``q[x] ≤ p[x]`` and ``q[y] ≤ p[y]`` with one strict;
    identical points dominate neither other (both kept). Values within :data:`SAME_VALUE`
    (relative) of each other count as equal: means of the same errors summed in another
    order differ in the last bits, and a last-bit "improvement" is not one. Rows lacking a
    finite ``x`` or ``y`` take no part.
    """
    def same(a: float, b: float) -> bool:
        return abs(a - b) <= SAME_VALUE * max(1.0, abs(a), abs(b))

    pts = sorted((r for r in rows if is_number(r.get(x)) and is_number(r.get(y))),
                 key=lambda r: (r[x], r[y]))
    front: list[Mapping[str, Any]] = []
    for r in pts:
        while front and same(r[x], front[-1][x]) and r[y] < front[-1][y] and not same(r[y], front[-1][y]):
            front.pop()  # as fast (to the last bits) and more accurate: it dominates
        last = front[-1] if front else None
        better = last is None or (r[y] < last[y] and not same(r[y], last[y]))
        if better or (last is not None and same(r[x], last[x]) and same(r[y], last[y])):
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


__all__ = ["pareto_front", "speedups", "sim_measured_pairs", "config_sorted", "configurations", "configuration_row",
           "replicate_groups", "spread", "t975", "within_intervals", "seeds_text", "STAT_COLUMNS"]
