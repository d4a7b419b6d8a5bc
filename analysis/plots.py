"""Figures of a results directory's tables; each function returns a matplotlib Figure.

Rules every function keeps: it never writes a file; it accepts any :class:`Table`
(1 run or many, extra columns, empty cells); when the columns it needs are missing or
hold no values it returns a "no data" figure (see :func:`is_no_data`) instead of
raising. Runs whose configuration repeats (e.g. several seeds) are averaged where a
figure shows one value per configuration.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from ._figure import (ERROR_COLUMNS, describe, fmt_value, is_no_data, mean, new_figure,
                      no_data, panel_grid, panel_size, percent_axis, plain_log2_axis,
                      text_color, use_log)
from .table import (Row, Table, config_key, is_number, label, labels, protocol_name,
                    sort_key, varying_keys)

CONFIG_ORDER = ("protocol", "softsync_n", "learners", "minibatch")


def _colors(n: int) -> list[Any]:
    cmap = colormaps["tab10" if n <= 10 else "tab20"]
    return [cmap(i % cmap.N) for i in range(n)]


def _config_sorted(rows: Iterable[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: tuple(sort_key(r.get(k)) for k in CONFIG_ORDER))


def _missing(table: Table | None, *columns: str) -> list[str]:
    if table is None:
        return list(columns)
    return [c for c in columns if not table.has(c)]


# -- error against time --------------------------------------------------------------
def error_vs_time(curves: Table, summary: Table | None = None, *, target: float | None = None,
                  logx: bool | None = None) -> Figure:
    """Test error against simulated wall-clock time, one line per run.

    Lines are labelled from ``summary`` (swept keys that differ) or by ``run_id``;
    diverged runs are dashed; ``target`` draws the target error; ``logx=None`` uses a
    log time axis when the runs' times span more than 30×.
    """
    title = "Test error vs simulated time"
    miss = _missing(curves, "run_id", "sim_time_s", "test_error")
    if miss:
        return no_data(title, f"curves lack {', '.join(miss)}")
    srows = {str(r.get("run_id")): r for r in (summary or Table())}
    names = labels(srows.values()) if srows else {}
    runs = curves.group_by("run_id")

    def order_key(k: tuple[Any, ...]) -> tuple[Any, ...]:
        r = srows.get(str(k[0]))
        return (0, tuple(sort_key(r.get(c)) for c in CONFIG_ORDER)) if r else (1, str(k[0]))

    order = sorted(runs, key=order_key)
    fig = new_figure(9.0 if len(runs) > 6 else 7.0, 4.8)
    ax = fig.add_subplot()
    ends = []
    for (rid,), color in zip(order, _colors(len(order))):
        pts = sorted((r["sim_time_s"], r["test_error"]) for r in runs[(rid,)]
                     if is_number(r.get("sim_time_s")) and is_number(r.get("test_error")))
        if not pts:
            continue
        xs, ys = zip(*pts)
        ends.append(xs[-1])
        div = srows.get(str(rid), {}).get("diverged") is True
        ax.plot(xs, ys, marker="." if len(xs) < 40 else None, color=color,
                linestyle="--" if div else "-",
                label=names.get(str(rid), str(rid)) + (" (diverged)" if div else ""))
    if not ends:
        return no_data(title, "no run has both sim_time_s and test_error")
    if target is not None:
        ax.axhline(target, color="0.3", linestyle=":", linewidth=1, label=f"target {100 * target:g}%")
    all_x = [x for x in curves.column("sim_time_s") if is_number(x)]
    if (use_log(all_x) if logx is None else logx) and all(x > 0 for x in all_x):
        ax.set_xscale("log")
    ax.set_xlabel("simulated wall-clock time (s)")
    ax.set_ylabel("test error")
    percent_axis(ax)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7 if len(ends) > 8 else 8, loc="center left", bbox_to_anchor=(1.01, 0.5),
              ncols=2 if len(ends) > 16 else 1, frameon=False)
    return fig


# -- μ × λ heatmap ------------------------------------------------------------------------
def heatmap(summary: Table, value: str = "final_test_error", *, cmap: str = "RdYlGn_r") -> Figure:
    """μ × λ grid of ``value`` (learners across, minibatch up), one panel per protocol
    configuration; cells are annotated, absent runs blank, runs without a value "—".

    Lower is better for every column this is used with, so the colour map runs green
    (low) to red (high); one colour scale is shared by all panels (log for times that
    span more than 30×).
    """
    title = f"{describe(value)} by learners λ and minibatch μ"
    miss = _missing(summary, "learners", "minibatch", value)
    if miss:
        return no_data(title, f"summary lacks {', '.join(miss)}")
    rows = [r for r in summary if is_number(r.get("learners")) and is_number(r.get("minibatch"))]
    panels: dict[tuple, list[Row]] = {}
    for r in _config_sorted(rows):
        panels.setdefault(config_key(r, omit=("learners", "minibatch")), []).append(r)
    keys = varying_keys(rows)
    vals = [r[value] for r in rows if is_number(r.get(value))]
    if not vals:
        return no_data(title, f"no run has a numeric {value} with learners and minibatch")
    log = value.endswith("_s") and use_log(vals) and min(vals) > 0
    norm = (LogNorm if log else Normalize)(vmin=min(vals), vmax=max(vals) if max(vals) > min(vals)
                                           else min(vals) + (1e-9 if log else 1.0))
    fig = new_figure(*panel_size(len(panels), w=4.4, h=3.6))
    axes = panel_grid(fig, len(panels))
    colors = colormaps[cmap]
    image = None
    for ax, prow in zip(axes, panels.values()):
        lams = sorted({r["learners"] for r in prow})
        mus = sorted({r["minibatch"] for r in prow})
        grid = np.full((len(mus), len(lams)), np.nan)
        text: dict[tuple[int, int], str] = {}
        cells: dict[tuple[int, int], list[Row]] = {}
        for r in prow:
            cells.setdefault((mus.index(r["minibatch"]), lams.index(r["learners"])), []).append(r)
        for (i, j), rs in cells.items():
            got = [r[value] for r in rs if is_number(r.get(value))]
            grid[i, j] = mean(got) if got else np.nan
            text[i, j] = fmt_value(value, grid[i, j]) + ("\ndiverged" if any(r.get("diverged") is True
                                                                          for r in rs) else "")
        image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap=colors, norm=norm,
                          aspect="auto")
        for (i, j), t in text.items():
            c = text_color(colors(norm(grid[i, j]))) if math.isfinite(grid[i, j]) else "0.35"
            ax.text(j, i, t, ha="center", va="center", fontsize=8, color=c)
        ax.set_xticks(range(len(lams)), [f"{v:g}" for v in lams])
        ax.set_yticks(range(len(mus)), [f"{v:g}" for v in mus])
        ax.set_xlabel("learners λ")
        ax.set_ylabel("minibatch μ per learner")
        ax.set_title(label(prow[0], keys, omit=("learners", "minibatch")), fontsize=10)
    bar = fig.colorbar(image, ax=axes, shrink=0.9, label=describe(value))
    if value in ERROR_COLUMNS:
        percent_axis(bar.ax)
    fig.suptitle(title)
    return fig


# -- staleness ----------------------------------------------------------------------
def staleness_histograms(stale: Table, *, max_panels: int = 12) -> Figure:
    """One panel per run: frequency of each staleness σ, the mean ⟨σ⟩ as a red line
    and, for n-softsync, n as a dashed line (Rudra: ⟨σ⟩ ≈ n, σ rarely above 2n).

    ``stale`` has rows ``run_id, staleness, count`` (plus ``protocol``, ``learners``,
    ``softsync_n`` and other configuration columns for titles); at most ``max_panels``
    runs are drawn, in configuration order.
    """
    title = "Staleness distribution per run"
    miss = _missing(stale, "run_id", "staleness", "count")
    if miss:
        return no_data(title, f"staleness table lacks {', '.join(miss)}")
    runs: dict[str, list[Row]] = {}
    for r in stale:
        if is_number(r.get("staleness")) and is_number(r.get("count")) and r["count"] > 0:
            runs.setdefault(str(r.get("run_id")), []).append(r)
    if not runs:
        return no_data(title, "no positive staleness counts")
    heads = _config_sorted(rs[0] for rs in runs.values())
    names = labels(heads)
    shown = heads[:max_panels]
    fig = new_figure(*panel_size(len(shown), w=4.0, h=3.0))
    for ax, head in zip(panel_grid(fig, len(shown)), shown):
        rid = str(head.get("run_id"))
        counts: dict[float, float] = {}
        for r in runs[rid]:
            counts[r["staleness"]] = counts.get(r["staleness"], 0) + r["count"]
        sigma = np.array(sorted(counts))
        freq = np.array([counts[s] for s in sigma], dtype=float)
        freq /= freq.sum()
        avg = float((sigma * freq).sum())
        ax.bar(sigma, freq, width=0.85 if len(sigma) < 2 else 0.85 * float(np.min(np.diff(sigma))),
               color="tab:blue", alpha=0.8)
        ax.axvline(avg, color="tab:red", linewidth=1.5, label=f"mean ⟨σ⟩ = {avg:.3g}")
        n = head.get("softsync_n")
        if head.get("protocol") == "softsync" and is_number(n):
            ax.axvline(n, color="0.2", linestyle="--", linewidth=1, label=f"n = {n:g}")
        ax.set_title(names[rid], fontsize=9)
        ax.set_xlabel("staleness σ (updates)")
        ax.set_ylabel("frequency")
        ax.legend(fontsize=7, frameon=False)
        ax.grid(axis="y", alpha=0.3)
    more = f" (first {len(shown)} of {len(heads)} runs)" if len(heads) > len(shown) else ""
    fig.suptitle(title + more)
    return fig


# -- speed-up -------------------------------------------------------------------------
def speedups(summary: Table, metric: str = "sim_time_s") -> list[dict[str, Any]]:
    """Speed-up ``T(λ=1) / T(λ)`` of ``metric`` for every configuration with a baseline.

    A series is a configuration without ``learners`` (protocol, n, μ, swept keys); its
    baseline is its own λ = 1 run, else the λ = 1 runs with the same μ and swept keys
    under any protocol (one learner runs alike under all of them). Repeated runs are
    averaged; runs without a positive ``metric`` are skipped. Returns rows
    ``series, protocol, learners, time, baseline, speedup`` sorted by series then λ.
    """
    rows = [r for r in (summary or Table()) if is_number(r.get("learners"))
            and is_number(r.get(metric)) and r[metric] > 0]
    keys = varying_keys(rows)
    series: dict[tuple, list[Row]] = {}
    for r in _config_sorted(rows):
        series.setdefault(config_key(r, omit=("learners",)), []).append(r)
    singles: dict[tuple, list[float]] = {}
    for r in rows:
        if r["learners"] == 1:
            singles.setdefault(config_key(r, omit=("learners", "protocol", "softsync_n")),
                               []).append(r[metric])
    out: list[dict[str, Any]] = []
    for rs in series.values():
        own = [r[metric] for r in rs if r["learners"] == 1]
        base = own or singles.get(config_key(rs[0], omit=("learners", "protocol", "softsync_n")), [])
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


def speedup(summary: Table, metric: str = "sim_time_s") -> Figure:
    """Speed-up against learners on log2 axes, one line per configuration, with the
    ideal (linear) line; see :func:`speedups` for the rule."""
    what = "run time" if metric == "sim_time_s" else describe(metric)
    title = f"Speed-up of {what} over one learner"
    data = speedups(summary, metric)
    if not data:
        return no_data(title, f"no λ = 1 baseline with {metric}")
    fig = new_figure(7.5, 4.8)
    ax = fig.add_subplot()
    names = list(dict.fromkeys(d["series"] for d in data))
    for name, color in zip(names, _colors(len(names))):
        pts = [d for d in data if d["series"] == name]
        ax.plot([d["learners"] for d in pts], [d["speedup"] for d in pts], marker="o",
                color=color, label=name)
    lams = sorted({d["learners"] for d in data})
    lo, hi = min(lams), max(lams)
    ax.plot([lo, hi], [lo, hi], color="0.2", linestyle="--", linewidth=1, label="ideal (linear)")
    plain_log2_axis(ax, "x", lams)
    top = max(hi, max(d["speedup"] for d in data))
    bottom = min(1.0, min(d["speedup"] for d in data))
    plain_log2_axis(ax, "y", [2.0 ** k for k in range(math.floor(math.log2(bottom)),
                                                     math.ceil(math.log2(top)) + 1)])
    ax.set_xlabel("learners λ")
    ax.set_ylabel(f"speed-up  T(λ=1) / T(λ)  [{metric}]")
    ax.set_title(title)
    ax.grid(alpha=0.3, which="major")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    return fig


# -- Pareto -------------------------------------------------------------------------
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


def pareto(summary: Table, x: str = "sim_time_s", y: str = "final_test_error") -> Figure:
    """All runs as points (colour = protocol, × = diverged) and the Pareto frontier
    (minimise both) as a step line, its configurations named."""
    title = f"Pareto frontier: {describe(y)} vs {describe(x)}"
    miss = _missing(summary, x, y)
    if miss:
        return no_data(title, f"summary lacks {', '.join(miss)}")
    rows = [r for r in summary if is_number(r.get(x)) and is_number(r.get(y))]
    if not rows:
        return no_data(title, f"no run has both {x} and {y}")
    names = labels(rows)
    fig = new_figure(8.0, 5.0)
    ax = fig.add_subplot()
    protos = list(dict.fromkeys(str(r.get("protocol")) for r in _config_sorted(rows)))
    for proto, color in zip(protos, _colors(len(protos))):
        for div, marker in ((False, "o"), (True, "x")):
            pts = [r for r in rows if str(r.get("protocol")) == proto and (r.get("diverged") is True) == div]
            if pts:
                ax.scatter([r[x] for r in pts], [r[y] for r in pts], color=color, marker=marker,
                           alpha=0.75, s=28, label=proto + (" (diverged)" if div else ""))
    front = pareto_front(rows, x, y)
    ax.step([r[x] for r in front], [r[y] for r in front], where="post", color="black",
            linewidth=1.2, label="Pareto frontier", zorder=3)
    for i, r in enumerate(front):
        ax.annotate(names[str(r.get("run_id"))], (r[x], r[y]), xytext=(6, 6 + 9 * (i % 2)),
                    textcoords="offset points", fontsize=7)
    if use_log([r[x] for r in rows]):
        ax.set_xscale("log")
    ax.set_xlabel(describe(x))
    ax.set_ylabel(describe(y))
    if y in ERROR_COLUMNS:
        percent_axis(ax)
    if x in ERROR_COLUMNS:
        percent_axis(ax, "x")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return fig


# -- simulated vs measured ------------------------------------------------------------
EPOCH_COLUMNS = ("workload.epochs", "epochs")


def sim_measured_pairs(table: Table) -> list[dict[str, Any]]:
    """Pairs of simulated and measured time, per epoch when an epochs column exists.

    A row with both ``sim_time_s`` and ``measured_sim_time_s`` is a pair by itself;
    otherwise a row with ``source == "measured"`` pairs with the simulated rows
    (``source`` "simulated" or empty) of the same configuration (averaged). Returns
    ``label, simulated, measured, rel_error, per_epoch`` with
    ``rel_error = (simulated − measured) / measured``.
    """
    rows = list(table or Table())
    names = labels(rows)
    sim_by_cfg: dict[tuple, list[Row]] = {}
    for r in rows:
        if r.get("source") in (None, "simulated") and is_number(r.get("sim_time_s")):
            sim_by_cfg.setdefault(config_key(r), []).append(r)

    def per_epoch(r: Mapping[str, Any], t: float) -> tuple[float, bool]:
        e = next((r[c] for c in EPOCH_COLUMNS if is_number(r.get(c)) and r[c] > 0), None)
        return (t / e, True) if e else (t, False)

    out = []
    for r in rows:
        if is_number(r.get("measured_sim_time_s")) and is_number(r.get("sim_time_s")) \
                and r.get("source") != "measured":
            sim, meas = r["sim_time_s"], r["measured_sim_time_s"]
        elif r.get("source") == "measured" and config_key(r) in sim_by_cfg:
            meas = r.get("measured_sim_time_s") if is_number(r.get("measured_sim_time_s")) \
                else r.get("sim_time_s")
            if not is_number(meas):
                continue
            sim = mean([s["sim_time_s"] for s in sim_by_cfg[config_key(r)]])
        else:
            continue
        sim_e, pe = per_epoch(r, sim)
        meas_e, _ = per_epoch(r, meas)
        if meas_e > 0:
            out.append({"label": names[str(r.get("run_id"))], "simulated": sim_e, "measured": meas_e,
                        "rel_error": (sim_e - meas_e) / meas_e, "per_epoch": pe})
    return out


def simulated_vs_measured(table: Table) -> Figure:
    """Simulated against measured time (per epoch when known) with the y = x line;
    each point is annotated with its relative error, the mean |error| in the title."""
    title = "Simulated vs measured time"
    pairs = sim_measured_pairs(table)
    if not pairs:
        return no_data(title, "no measured (live) run to compare with a simulation")
    unit = "per epoch (s)" if all(p["per_epoch"] for p in pairs) else "per run (s)"
    fig = new_figure(6.5, 5.5)
    ax = fig.add_subplot()
    xs = [p["measured"] for p in pairs]
    ys = [p["simulated"] for p in pairs]
    ax.scatter(xs, ys, color="tab:blue", zorder=3)
    lo, hi = min(xs + ys), max(xs + ys)
    pad = (hi - lo) * 0.08 or hi * 0.1 or 1.0
    ends = [max(lo - pad, lo / 2 if lo > 0 else lo - pad), hi + pad]
    ax.plot(ends, ends, color="0.3", linestyle="--", linewidth=1, label="y = x (perfect prediction)")
    for p in pairs:
        ax.annotate(f"{p['label']}  {100 * p['rel_error']:+.1f}%", (p["measured"], p["simulated"]),
                    xytext=(5, 5), textcoords="offset points", fontsize=7)
    mare = mean([abs(p["rel_error"]) for p in pairs])
    if use_log(xs + ys):
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(f"measured time {unit}")
    ax.set_ylabel(f"simulated time {unit}")
    ax.set_title(f"{title}: mean |relative error| {100 * mare:.1f}% over {len(pairs)} runs",
                 fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    return fig


__all__ = ["error_vs_time", "heatmap", "staleness_histograms", "speedup", "speedups", "pareto",
           "pareto_front", "simulated_vs_measured", "sim_measured_pairs", "is_no_data",
           "protocol_name"]
