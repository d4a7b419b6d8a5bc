"""Figures of a results directory's tables; each function returns a matplotlib Figure.

Rules every function keeps: it never writes a file; it accepts any :class:`Table`
(1 run or many, extra columns, empty cells); when the columns it needs are missing or
hold no values it returns a "no data" figure (see :func:`is_no_data`) instead of
raising. The runs of one configuration (its replicates: several seeds) are drawn as their
mean with their spread: a band (the seeds' range) around the mean curve, the 95 % interval
of the mean on Pareto points, the seeds' range in a heatmap cell where it is wider than the
noise; staleness histograms pool them.
"""

from __future__ import annotations

import statistics

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from ._figure import (ERROR_COLUMNS, LINESTYLES, describe, fmt_value, is_no_data,
                      new_figure, no_data, panel_grid, panel_size, percent_axis,
                      plain_log2_axis, same_text, styles, text_color, use_log, wrap)
from .metrics import (CONFIG_ORDER, config_sorted, pareto_front, replicate_groups, sim_measured_pairs, speedups,
                      within_intervals)
from .findings import configuration_rows, learned
from .table import (Row, Table, config_key, is_number, is_value, label, labels, mean, protocol_name,
                    sort_key, varying_keys)

PANEL_KEY = ("learners", "minibatch")  # a panel shows one configuration across λ and μ


def _missing(table: Table | None, *columns: str) -> list[str]:
    return list(columns) if table is None else [c for c in columns if not table.has(c)]


def _panels(rows: list[Row]) -> dict[tuple, list[Row]]:
    """Rows grouped by configuration without λ and μ, in configuration order."""
    out: dict[tuple, list[Row]] = {}
    for r in config_sorted(rows):
        out.setdefault(config_key(r, omit=PANEL_KEY), []).append(r)
    return out


def _merge_identical(panels: dict[tuple, list[Row]], keys: list[str],
                     value: Callable[[Row], Any]) -> list[tuple[str, list[Row]]]:
    """(title, rows) per panel, configurations whose runs show identical ``value`` at every
    λ and μ sharing one panel titled "A ≡ B (identical)" (e.g. hardsync with any lr policy)."""
    merged: dict[tuple, list[Row]] = {}
    titles: dict[tuple, list[str]] = {}
    for rs in panels.values():
        sig = tuple(sorted((str(r.get("learners")), str(r.get("minibatch")), repr(value(r))) for r in rs))
        merged.setdefault(sig, rs)
        titles.setdefault(sig, []).append(_panel_title(rs[0], keys))
    return [(" ≡ ".join(titles[k]) + (" (identical)" if len(titles[k]) > 1 else ""), rs)
            for k, rs in merged.items()]


def _panel_title(row: Row, keys: list[str]) -> str:
    if row.get("protocol") is None:
        return "runs without a summary row"
    return label(row, keys, omit=PANEL_KEY)


# -- error against time ----------------------------------------------------------------
def error_vs_time(curves: Table, summary: Table | None = None, *, target: float | None = None,
                  logx: bool | None = None, max_lines: int = 10, max_panels: int = 12) -> Figure:
    """Test error against simulated wall-clock time, one line per configuration: the mean over
    its replicates (seeds) at each evaluation (mean time, mean error), with a band spanning the
    seeds' lowest to highest error there; a configuration of one run is that run's line.

    Up to ``max_lines`` configurations share one axes, each labelled by its configuration
    (swept keys that differ) or its ``run_id``. A larger sweep gets one panel per protocol
    configuration (at most ``max_panels``) with colour = learners λ and line style =
    minibatch μ. Diverged runs are faded; ``target`` draws the target error;
    ``logx=None`` uses a log time axis when positive times span more than 30× (points
    at t ≤ 0 are then left out).
    """
    title = "Test error vs simulated time"
    miss = _missing(curves, "run_id", "sim_time_s", "test_error")
    if miss:
        return no_data(title, f"curves lack {', '.join(miss)}")
    runs = {str(rid): sorted((r["sim_time_s"], r["test_error"], r.get("epoch")) for r in t
                             if is_number(r.get("sim_time_s")) and is_number(r.get("test_error")))
            for (rid,), t in curves.group_by("run_id").items()}
    srows = {str(r.get("run_id")): r for r in (summary or Table())}
    groups = _replicates([srows.get(rid, {"run_id": rid}) for rid in runs if runs[rid]])
    points = {str(rs[0]["run_id"]): _mean_curve([runs[str(r["run_id"])] for r in rs]) for rs in groups}
    positive = [x for pts in points.values() for x, _, _, _ in pts if x > 0]
    log = use_log(positive) if logx is None else bool(logx and positive)
    if log:  # a log axis cannot show t = 0 (the evaluation before training)
        points = {rid: [p for p in pts if p[0] > 0] for rid, pts in points.items()}
    lines = {rid: ([p[0] for p in pts], [p[1] for p in pts]) for rid, pts in points.items() if pts}
    bands = {rid: ([p[0] for p in pts], [p[2] for p in pts], [p[3] for p in pts]) for rid, pts in points.items()
             if pts and len(groups[_index(groups, rid)]) > 1}
    if not lines:
        return no_data(title, "no run has both sim_time_s and test_error")
    heads = config_sorted(rs[0] for rs in groups if str(rs[0]["run_id"]) in lines)
    diverged = {str(rs[0]["run_id"]): any(r.get("diverged") is True for r in rs) for rs in groups}
    panels = _panels(heads)
    if len(lines) > max_lines and len(panels) <= len(lines) / 2:
        fig = _error_panels(lines, panels, varying_keys(heads), max_panels, bands, diverged)
    else:
        fig = new_figure(9.5 if len(lines) > 6 else 7.5, 4.8)
        ax = fig.add_subplot()
        names = labels(heads)
        for head, (color, style) in zip(heads, styles(len(heads))):
            rid = str(head["run_id"])
            div = diverged[rid]
            ax.plot(*lines[rid], color=color, linestyle=style, alpha=0.45 if div else 1.0,
                    marker="." if len(lines[rid][0]) < 40 else None,
                    label=names[rid] + (" (diverged)" if div else ""))
            if rid in bands:
                ax.fill_between(*bands[rid], color=color, alpha=0.15, linewidth=0)
        fig.legend(loc="outside right center", fontsize=8, frameon=False)
    for ax in fig.axes:
        if target is not None:
            ax.axhline(target, color="0.3", linestyle=":", linewidth=1)
        if log:
            ax.set_xscale("log")
        ax.set_xlabel("simulated wall-clock time (s)")
        ax.set_ylabel("test error")
        percent_axis(ax)
        ax.grid(alpha=0.3)
    seeds = max(len(rs) for rs in groups)
    spread = f"\nmean of {seeds} seeds per configuration; band: their lowest to highest error" if bands else ""
    fig.suptitle(title + (f" (dotted: target {100 * target:g}%)" if target is not None else "") + spread)
    return fig


def _replicates(heads: list[Row]) -> list[list[Row]]:
    """Runs grouped by configuration (:func:`.metrics.replicate_groups`); a run without a summary
    row (no protocol) is its own group."""
    known = [h for h in heads if is_value(h.get("protocol"))]
    return list(replicate_groups(known).values()) + [[h] for h in heads if not is_value(h.get("protocol"))]


def _index(groups: list[list[Row]], rid: str) -> int:
    return next(i for i, rs in enumerate(groups) if str(rs[0]["run_id"]) == rid)


def _mean_curve(curves: list[list[tuple[float, float, Any]]]) -> list[tuple[float, float, float, float]]:
    """``(mean time, mean error, lowest error, highest error)`` at each evaluation that every one
    of ``curves`` has (matched by epoch, else by position; one curve: itself)."""
    if len(curves) == 1:
        return [(t, e, e, e) for t, e, _ in curves[0]]
    keyed = []
    for c in curves:
        epochs = [ep for _, _, ep in c]
        by_epoch = all(is_number(ep) for ep in epochs) and len(set(epochs)) == len(epochs)
        keyed.append({(ep if by_epoch else i): (t, e) for i, (t, e, ep) in enumerate(c)})
    common = sorted(set.intersection(*(set(k) for k in keyed)), key=sort_key)
    out = []
    for k in common:
        ts = [c[k][0] for c in keyed]
        es = [c[k][1] for c in keyed]
        out.append((mean(ts), mean(es), min(es), max(es)))
    return sorted(out)


def _error_panels(lines: dict[str, tuple[list[float], list[float]]], panels: dict[tuple, list[Row]],
                  keys: list[str], max_panels: int,
                  bands: dict[str, tuple[list[float], list[float], list[float]]] | None = None,
                  diverged: dict[str, bool] | None = None) -> Figure:
    merged = _merge_identical(panels, keys, lambda r: tuple(map(tuple, lines[str(r["run_id"])])))
    shown = [rs for _, rs in merged[:max_panels]]
    heads = [t for t, _ in merged[:max_panels]]
    lams = sorted({r["learners"] for rs in shown for r in rs if is_number(r.get("learners"))})
    mus = sorted({r["minibatch"] for rs in shown for r in rs if is_number(r.get("minibatch"))})
    shades = (colormaps["tab10"](np.arange(len(lams))) if len(lams) <= 10  # few λ: distinct hues
              else colormaps["viridis"](np.linspace(0.0, 0.9, len(lams))))
    color = {lam: shades[i] for i, lam in enumerate(lams)}
    style: dict[Any, Any] = {mu: LINESTYLES[i % len(LINESTYLES)] for i, mu in enumerate(mus)}
    fig = new_figure(*panel_size(len(shown), w=4.2, h=3.2))
    for ax, rs, head in zip(panel_grid(fig, len(shown), share=True), shown, heads):
        for r in rs:
            rid = str(r["run_id"])
            div = (diverged or {}).get(rid, r.get("diverged") is True)
            ax.plot(*lines[rid], color=color.get(r.get("learners"), "0.5"),
                    linestyle=style.get(r.get("minibatch"), "-"), alpha=0.4 if div else 1.0, linewidth=1.3)
            if bands and rid in bands:
                ax.fill_between(*bands[rid], color=color.get(r.get("learners"), "0.5"), alpha=0.12, linewidth=0)
        ax.set_title(head, fontsize=9)
    handles = [Line2D([], [], color=color[v], label=f"λ = {v:g}") for v in lams]
    handles += [Line2D([], [], color="0.3", linestyle=style[v], label=f"μ = {v:g}") for v in mus]
    if any((diverged or {}).get(str(r["run_id"]), r.get("diverged") is True) for rs in shown for r in rs):
        handles.append(Line2D([], [], color="0.3", alpha=0.4, label="diverged (faded)"))
    fig.legend(handles=handles, loc="outside right center", fontsize=8, frameon=False)
    if len(merged) > len(shown):
        fig.text(0.01, 0.005, f"first {len(shown)} of {len(merged)} configurations", fontsize=8)
    return fig


# -- μ × λ heatmap ---------------------------------------------------------------------
def heatmap(summary: Table, value: str = "final_test_error", *, cmap: str = "RdYlGn_r") -> Figure:
    """μ × λ grid of ``value`` (learners across, minibatch up), one panel per protocol
    configuration; cells are annotated, absent runs blank, runs without a value "—",
    replicates averaged (the mean colours the cell), their range shown beneath where it is
    wider than the noise (:func:`_seed_range`).

    Lower is better for the columns this is meant for, so colours run green (low) to
    red (high). One colour scale serves all panels; it spans the runs that did not
    diverge (diverged cells show the top colour and say "diverged"; a run that did not learn
    says "no learning"), and is
    logarithmic for times that span more than 30×.
    """
    title = f"{describe(value)} by learners λ and minibatch μ"
    miss = _missing(summary, "learners", "minibatch", value)
    if miss:
        return no_data(title, f"summary lacks {', '.join(miss)}")
    rows = [r for r in summary if is_number(r.get("learners")) and is_number(r.get("minibatch"))]
    vals = [r[value] for r in rows if is_number(r.get(value))]
    if not vals:
        return no_data(title, f"no run has a numeric {value} with learners and minibatch")
    norm = _heat_norm(value, vals, [r[value] for r in rows
                                    if is_number(r.get(value)) and r.get("diverged") is not True])
    panels = _merge_identical(_panels(rows), varying_keys(rows),
                              lambda r: (r.get(value), r.get("diverged"), r.get("did_not_learn"), r.get("error")))
    fig = new_figure(*panel_size(len(panels), w=4.4, h=3.6))
    axes = panel_grid(fig, len(panels))
    colors = colormaps[cmap]
    image = None
    for ax, (head, prow) in zip(axes, panels):
        image = _heat_panel(ax, prow, value, colors, norm)
        ax.set_title(head, fontsize=10 if len(head) < 40 else 8)
    assert image is not None  # at least one panel
    bar = fig.colorbar(image, ax=axes, shrink=0.9, label=describe(value),
                       extend="max" if max(vals) > norm.vmax else "neither")
    if value in ERROR_COLUMNS:
        percent_axis(bar.ax)
    fig.suptitle(title)
    return fig


def _heat_norm(value: str, vals: list[float], healthy: list[float]) -> Normalize:
    scale = healthy or vals
    lo, hi = min(scale), max(scale)
    if value.endswith("_s") and lo > 0 and use_log(scale):
        return LogNorm(vmin=lo, vmax=hi)
    return Normalize(vmin=lo, vmax=hi if hi > lo else lo + (abs(lo) * 0.1 or 1.0))


def _heat_panel(ax: Axes, rows: list[Row], value: str, colors: Any, norm: Normalize) -> Any:
    lams = sorted({r["learners"] for r in rows})
    mus = sorted({r["minibatch"] for r in rows})
    grid = np.full((len(mus), len(lams)), np.nan)
    cells: dict[tuple[int, int], list[Row]] = {}
    for r in rows:
        cells.setdefault((mus.index(r["minibatch"]), lams.index(r["learners"])), []).append(r)
    for (i, j), rs in cells.items():
        got = [r[value] for r in rs if is_number(r.get(value))]
        grid[i, j] = mean(got) if got else np.nan
    image = ax.imshow(np.ma.masked_invalid(grid), origin="lower", cmap=colors, norm=norm,
                      aspect="auto")
    many = any(len(rs) > 1 for rs in cells.values())
    for (i, j), rs in cells.items():
        v = grid[i, j]
        text = ("failed" if all(r.get("error") for r in rs) else fmt_value(value, v) + _seed_range(value, rs)
                + ("\ndiverged" if any(r.get("diverged") is True for r in rs)
                   else "\nno learning" if any(r.get("did_not_learn") is True for r in rs) else ""))
        ink = text_color(colors(norm(v))) if math.isfinite(v) else "0.35"
        ax.text(j, i, text, ha="center", va="center", fontsize=7 if many else 8, color=ink)
    ax.set_xticks(range(len(lams)), [f"{v:g}" for v in lams])
    ax.set_yticks(range(len(mus)), [f"{v:g}" for v in mus])
    ax.set_xlabel("learners λ")
    ax.set_ylabel("minibatch μ per learner")
    return image


ERROR_NOISE = 0.01  # a cell's seeds spread more than 1 point of error: their range is shown
TIME_NOISE = 0.10  # … more than 10 % of the mean time


def _seed_range(value: str, rs: list[Row]) -> str:
    """A heatmap cell's second line for its replicates: the seeds' range (``"2.2–3.1%"``) where it
    is wider than ``ERROR_NOISE`` (errors) or ``TIME_NOISE`` of the mean (times); for a time to
    target, how many seeds reached it when not all did."""
    if len(rs) < 2:
        return ""
    got = [r[value] for r in rs if is_number(r.get(value))]
    out = ""
    if len(got) > 1:
        lo, hi = min(got), max(got)
        wide = hi - lo > ERROR_NOISE if value in ERROR_COLUMNS else hi - lo > TIME_NOISE * abs(mean(got))
        if wide:
            a, b = fmt_value(value, lo), fmt_value(value, hi)
            out = f"\n{a.rstrip('%')}–{b}" if value in ERROR_COLUMNS else f"\n{a}–{b}"
    if value == "time_to_target_s" and 0 < len(got) < len(rs):
        out += f"\n{len(got)} of {len(rs)} seeds"
    return out


# -- staleness ---------------------------------------------------------------------------
def staleness_histograms(stale: Table, *, max_panels: int = 12) -> Figure:
    """One panel per run (per configuration: its replicates' histograms pooled, the title says
    how many): frequency of each staleness σ, the mean ⟨σ⟩ as a red line and, for n-softsync,
    n as a dashed line (Rudra: ⟨σ⟩ ≈ n, σ rarely above 2n).

    ``stale`` has rows ``run_id, staleness, count`` plus, for titles and choice,
    ``protocol``, ``learners``, ``softsync_n`` (and any other configuration column).
    With more runs than ``max_panels``, each protocol configuration contributes in
    turn its runs with the most learners first. Runs with the same protocol, λ, μ and
    histogram (one simulation replayed with different optimizers) are shown once. Runs
    whose every gradient has σ = 0 (hardsync) get no panel, a single bar says nothing: the
    title says how many and which were left out (all of them: a "no data" figure).
    """
    title = "Staleness distribution per run"
    miss = _missing(stale, "run_id", "staleness", "count")
    if miss:
        return no_data(title, f"staleness table lacks {', '.join(miss)}")
    runs: dict[str, dict[float, float]] = {}
    heads: dict[str, Row] = {}
    for r in stale:
        if is_number(r.get("staleness")) and is_number(r.get("count")) and r["count"] > 0:
            rid = str(r.get("run_id"))
            heads.setdefault(rid, r)
            hist = runs.setdefault(rid, {})
            hist[r["staleness"]] = hist.get(r["staleness"], 0) + r["count"]
    if not runs:
        return no_data(title, "no positive staleness counts")
    pooled = _pool_replicates(runs, heads)
    fresh = list({_simulation(heads[rid]): heads.pop(rid)  # one per simulation
                  for rid in list(heads) if set(runs[rid]) == {0}}.values())
    if not heads:
        return no_data(title, "every gradient of every run has staleness σ = 0 (e.g. hardsync)")
    keys = varying_keys(heads.values())
    first: dict[tuple, str] = {}  # runs that share a simulation (e.g. differ in lr policy only) once
    same: dict[str, list[Row]] = {}
    for rid in list(heads):
        sig = (*(str(heads[rid].get(c)) for c in ("protocol", "softsync_n", "learners", "minibatch")),
               tuple(sorted(runs[rid].items())))
        keep = first.setdefault(sig, rid)
        same.setdefault(keep, []).append(heads[rid])
        if keep != rid:
            del heads[rid]
    names = {rid: label(heads[rid], [k for k in keys if len({str(r.get(k)) for r in same[rid]}) == 1])
             for rid in heads}
    shown = config_sorted(_round_robin(list(heads.values()), max_panels))
    fig = new_figure(*panel_size(len(shown), w=4.0, h=3.0))
    for ax, head in zip(panel_grid(fig, len(shown)), shown):
        rid = str(head.get("run_id"))
        _staleness_panel(ax, runs[rid], head)
        ax.set_title(names[rid] + (f" ({pooled[rid]} seeds pooled)" if pooled.get(rid, 1) > 1 else ""), fontsize=9)
    unit = "configurations" if any(n > 1 for n in pooled.values()) else "runs"
    more = f" ({len(shown)} of {len(heads)} {unit} with stale gradients)" if len(heads) > len(shown) else ""
    fig.suptitle(title + more + _fresh_note(fresh, unit))
    return fig


def _pool_replicates(runs: dict[str, dict[float, float]], heads: dict[str, Row]) -> dict[str, int]:
    """Merge the histograms of one configuration's replicates into its first run's (in place):
    ``runs`` and ``heads`` keep one entry per configuration; returns run id → runs pooled."""
    groups: dict[tuple, list[str]] = {}
    for rid, head in heads.items():
        groups.setdefault(config_key(head) if is_value(head.get("protocol")) else (rid,), []).append(rid)
    out = {}
    for rids in groups.values():
        keep = rids[0]
        for rid in rids[1:]:
            for sigma, count in runs.pop(rid).items():
                runs[keep][sigma] = runs[keep].get(sigma, 0) + count
            del heads[rid]
        out[keep] = len(rids)
    return out


def _simulation(head: Row) -> tuple[str, ...]:
    """What makes a run's staleness: protocol, n, λ, μ (the run id for a run without them)."""
    if not is_value(head.get("protocol")):
        return (str(head.get("run_id")),)
    return tuple(str(head.get(c)) for c in CONFIG_ORDER)


def _fresh_note(fresh: list[Row], unit: str = "runs") -> str:
    """The title's second line naming the runs left out for σ ≡ 0, by protocol."""
    if not fresh:
        return ""
    lams: dict[str, set[float]] = {}
    for r in config_sorted(fresh):
        name = protocol_name(r) if is_value(r.get("protocol")) else str(r.get("run_id"))
        lams.setdefault(name, set()).update([r["learners"]] if is_number(r.get("learners")) else [])
    which = "; ".join(name + (f" λ = {min(v):g}" if len(v) == 1 else
                              f" λ ∈ {{{', '.join(f'{x:g}' for x in sorted(v))}}}" if v else "")
                      for name, v in lams.items())
    runs = f"{len(fresh)} {unit if len(fresh) != 1 else unit.rstrip('s')}"
    return "\n" + wrap(f"not shown: {runs} with σ = 0 for every gradient ({which})", 110)


def _round_robin(heads: list[Row], limit: int) -> list[Row]:
    groups = [sorted(rs, key=lambda r: -r["learners"] if is_number(r.get("learners")) else 0)
              for rs in _panels(heads).values()]
    picked: list[Row] = []
    while len(picked) < limit and any(groups):
        for g in groups:
            if g and len(picked) < limit:
                picked.append(g.pop(0))
    return picked


def _staleness_panel(ax: Axes, hist: dict[float, float], head: Row) -> None:
    sigma = np.array(sorted(hist), dtype=float)
    freq = np.array([hist[s] for s in sorted(hist)], dtype=float)
    freq /= freq.sum()
    avg = float((sigma * freq).sum())
    width = 0.85 * (float(np.min(np.diff(sigma))) if len(sigma) > 1 else 1.0)
    ax.bar(sigma, freq, width=width, color="tab:blue", alpha=0.8)
    ax.axvline(avg, color="tab:red", linewidth=1.5, label=f"mean ⟨σ⟩ = {avg:.3g}")
    n = head.get("softsync_n")
    marks = [float(sigma.min()), float(sigma.max())]
    if head.get("protocol") != "async" and is_number(n):
        ax.axvline(n, color="0.2", linestyle="--", linewidth=1, label=f"n = {n:g}")
        marks.append(n)
    pad = max(0.75, 0.04 * (max(marks) - min(marks)))  # the outer bars clear the frame
    ax.set_xlim(min(marks) - pad, max(marks) + pad)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    ax.set_xlabel("staleness σ (updates)")
    ax.set_ylabel("frequency")
    ax.legend(fontsize=7, framealpha=0.85)
    ax.grid(axis="y", alpha=0.3)


# -- speed-up -------------------------------------------------------------------------------
def speedup(summary: Table, metric: str = "sim_time_s") -> Figure:
    """Speed-up ``T(λ=1) / T(λ)`` of ``metric`` against learners on log2 axes, one line
    per configuration, with the ideal (linear) line; see :func:`speedups` for the rule.

    Configurations with identical speed-ups share one line whose legend entry names every
    one of them (:func:`same_text`). A configuration with no point beyond its λ = 1
    baseline (e.g. only one learner reached the target) has no speed-up to draw: it is left
    out, and a legend note names it."""
    what = "run time" if metric == "sim_time_s" else _unitless(describe(metric))
    title = f"Speed-up of {what} over one learner"
    data = [d for d in speedups(summary or Table(), metric) if math.isfinite(d["speedup"]) and d["speedup"] > 0]
    if not data:
        return no_data(title, f"no λ = 1 baseline with {describe(metric)}")
    series: dict[tuple, list[str]] = {}  # series with identical points drawn once
    for name in dict.fromkeys(d["series"] for d in data):
        sig = tuple((d["learners"], d["speedup"]) for d in data if d["series"] == name)
        series.setdefault(sig, []).append(name)
    alone = [n for sig, names in series.items() if all(lam == 1 for lam, _ in sig) for n in names]
    series = {sig: names for sig, names in series.items() if not all(lam == 1 for lam, _ in sig)}
    if not series:
        return no_data(title, f"no configuration has {describe(metric)} beyond one learner")
    fig = new_figure(8.5, 4.8)
    ax = fig.add_subplot()
    for (sig, same), (color, style) in zip(series.items(), styles(len(series))):
        ax.plot([lam for lam, _ in sig], [v for _, v in sig], marker="o",
                markersize=4, color=color, linestyle=style, label=same_text(same))
    lams = sorted({lam for sig in series for lam, _ in sig})
    ax.plot([min(lams), max(lams)], [min(lams), max(lams)], color="black", linestyle="--",
            linewidth=1, label="ideal (linear)")
    if alone:
        reached = "reached the target" if metric == "time_to_target_s" else f"has {what}"
        ax.plot([], [], linestyle="", label=wrap(f"not drawn ({len(alone)}: only λ\u00a0=\u00a01 {reached}): "
                                                 + same_text(alone, identical=False)))
    plain_log2_axis(ax, "x", lams)
    ys = [v for sig in series for _, v in sig] + [min(lams), max(lams)]
    plain_log2_axis(ax, "y", [2.0 ** k for k in range(math.floor(math.log2(min(ys))),
                                                     math.ceil(math.log2(max(ys))) + 1)])
    ax.set_xlabel("learners λ")
    ax.set_ylabel("speed-up T(λ = 1) / T(λ)  (×)")
    fig.suptitle(title)
    ax.grid(alpha=0.3)
    fig.legend(loc="outside right center", fontsize=8, frameon=False)
    return fig


def _unitless(text: str) -> str:
    """An axis text without its trailing unit, e.g. for a title."""
    return text.rsplit(" (", 1)[0] if text.endswith(")") else text


# -- Pareto ---------------------------------------------------------------------------------
def pareto(summary: Table, x: str = "sim_time_s", y: str = "final_test_error",
           *, max_names: int = 4) -> Figure:
    """Every configuration as a point (the mean over its replicates, with bars spanning the 95 %
    Student-t interval of each mean; a configuration of one run is that run's point) and the
    Pareto frontier of those that learned in every seed (minimise both means,
    :func:`pareto_front`) as a step line. Each configuration without λ and μ (protocol, n,
    swept keys such as the lr policy) has its own colour and marker; one that did not learn (in
    some seed) is drawn hollow, one that diverged as ×. Up to ``max_names`` frontier points are
    named beside their point; more are numbered and named in a legend. Neighbours on the
    frontier whose mean errors lie within each other's 95 % intervals are named in the legend
    as not told apart by the seeds (:func:`.metrics.within_intervals`)."""
    title = f"Pareto frontier: {describe(y)} vs {describe(x)}"
    miss = _missing(summary, x, y)
    if miss:
        return no_data(title, f"summary lacks {', '.join(miss)}")
    rows = [r for r in configuration_rows(summary) if is_number(r.get(x)) and is_number(r.get(y))]
    if not rows:
        return no_data(title, f"no run has both numeric {x} and {y}")
    names = config_labels_of(rows)
    fig = new_figure(8.5, 5.0)
    ax = fig.add_subplot()
    keys = varying_keys(rows)
    groups: dict[tuple, list[Row]] = {}  # configurations with identical points drawn once
    texts: dict[tuple, list[str]] = {}
    for rs in _panels(rows).values():
        sig = tuple(sorted((str(r.get("learners")), str(r.get("minibatch")), r[x], r[y]) for r in rs))
        groups.setdefault(sig, rs)
        texts.setdefault(sig, []).append(_panel_title(rs[0], keys))
    intervals = any(r.get("replicates", 1) > 1 for r in rows)
    for (sig, rs), (color, _), marker in zip(groups.items(), styles(len(groups)), _markers(len(groups))):
        text: str | None = " ≡ ".join(texts[sig]) + (" (identical)" if len(texts[sig]) > 1 else "") \
            if len(groups) > 1 or len(texts[sig]) > 1 else "runs"
        kinds = ((lambda r: not _stuck(r) and r.get("diverged") is not True, color),
                 (lambda r: _stuck(r) and r.get("diverged") is not True, "none"),
                 (lambda r: r.get("diverged") is True, color))
        if intervals:
            _interval_bars(ax, rs, x, y, color)
        for i, (pick, face) in enumerate(kinds):
            pts = [r for r in rs if pick(r)]
            if pts:
                paint = {"color": color} if i == 2 else {"facecolors": face, "edgecolors": color}
                ax.scatter([r[x] for r in pts], [r[y] for r in pts], marker="x" if i == 2 else marker,
                           alpha=0.8, s=34, linewidths=1.2, label=text, zorder=2, **paint)
                text = None  # one legend entry per configuration, whichever kind comes first
    if any(_stuck(r) and r.get("diverged") is not True for r in rows):
        ax.scatter([], [], facecolors="none", edgecolors="0.3", marker="o", label="(hollow: did not learn)")
    if any(r.get("diverged") is True for r in rows):
        ax.scatter([], [], color="0.3", marker="x", label="(×: diverged)")
    if intervals:
        seeds = max(r.get("replicates", 1) for r in rows)
        ax.errorbar([], [], xerr=[], yerr=[], color="0.3", linestyle="", linewidth=0.8,
                    label=f"(bars: 95 % interval of the mean over {seeds} seeds)")
    front = pareto_front([r for r in rows if learned(r)], x, y) if y in ERROR_COLUMNS else pareto_front(rows, x, y)
    if front:
        ax.step([r[x] for r in front], [r[y] for r in front], where="post", color="black",
                linewidth=1.2, label="Pareto frontier" + (" (of the means)" if intervals else ""), zorder=3)
    numbered = len(front) > max_names
    spots: dict[tuple[float, float], list[str]] = {}  # tied runs share one annotation
    for i, r in enumerate(front, 1):
        spots.setdefault((r[x], r[y]), []).append(str(i) if numbered else names[str(r.get("run_id"))])
    for xy, tags in spots.items():
        ax.annotate(("," if numbered else "\n").join(tags), xy, xytext=(4, 4), fontsize=7,
                    textcoords="offset points", fontweight="bold" if numbered else "normal")
    tags = [str(i) if numbered else names[str(r.get("run_id"))] for i, r in enumerate(front, 1)]
    alike = [f"{tags[i]} ~ {tags[i + 1]}" for i in range(len(front) - 1)
             if intervals and within_intervals(front[i], front[i + 1], y)]
    if alike:  # neighbours on the frontier whose error means lie in each other's 95 % intervals
        ax.plot([], [], linestyle="", label="(not told apart by the seeds: " + ", ".join(alike) + ")")
    if numbered:
        entries = [Line2D([], [], linestyle="", label=f"{i}: {names[str(r.get('run_id'))]}")
                   for i, r in enumerate(front, 1)]
        fig.legend(handles=entries, loc="outside right upper", fontsize=7, frameon=False,
                   title="frontier " + ("configurations" if intervals else "runs"), title_fontsize=8,
                   handlelength=0, handletextpad=0)
    if use_log([r[x] for r in rows]):
        ax.set_xscale("log")
    ax.set_xlabel(describe(x) + (" (mean)" if intervals else ""))
    ax.set_ylabel(describe(y) + (" (mean)" if intervals else ""))
    for col, axis in ((y, "y"), (x, "x")):
        if col in ERROR_COLUMNS:
            percent_axis(ax, axis)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def config_labels_of(rows: list[Row]) -> dict[str, str]:
    """Labels of configuration rows (:func:`.findings.configuration_rows`) by their first run's id."""
    return labels(rows)


def _interval_bars(ax: Axes, rows: list[Row], x: str, y: str, color: Any) -> None:
    """Bars spanning each configuration's 95 % interval of its mean ``x`` and ``y`` (none for a
    configuration of one run, or a column without its interval)."""
    for r in rows:
        xerr = _half(r, x)
        yerr = _half(r, y)
        if xerr is None and yerr is None:
            continue
        ax.errorbar([r[x]], [r[y]], xerr=xerr, yerr=yerr, color=color, alpha=0.45, linewidth=0.8,
                    linestyle="", capsize=0, zorder=1)


def _half(r: Row, col: str) -> list[list[float]] | None:
    """``[[below], [above]]`` of ``r[col]`` to its interval's ends (the mean's 95 % interval)."""
    lo, hi = r.get(f"{col}_ci_low"), r.get(f"{col}_ci_high")
    if not (is_number(lo) and is_number(hi) and r.get("replicates", 1) > 1):
        return None
    return [[max(0.0, r[col] - lo)], [max(0.0, hi - r[col])]]


MARKERS = ("o", "s", "^", "D", "v", "P", "<", "*", ">", "h")


def _stuck(r: Row) -> bool:
    return r.get("did_not_learn") is True


def _markers(n: int) -> list[str]:
    return [MARKERS[i % len(MARKERS)] for i in range(n)]


# -- simulated vs measured ------------------------------------------------------------------
def simulated_vs_measured(table: Table) -> Figure:
    """Simulated against measured time (per epoch when an epochs column exists) with
    the y = x line; with up to ten runs each point has its own colour and marker and the
    legend names it with its relative error (simulated − measured) / measured (names beside
    the points would overlap where points lie close); more runs are coloured by protocol.
    The title gives the median |relative error| (as ``ddlsim validate`` prints it); see
    :func:`sim_measured_pairs`."""
    title = "Simulated vs measured time"
    pairs = sim_measured_pairs(table or Table())
    if not pairs:
        return no_data(title, "no measured (live) run to compare with a simulation")
    unit = "per epoch (s)" if all(p["per_epoch"] for p in pairs) else "per run (s)"
    fig = new_figure(9.0 if len(pairs) <= len(MARKERS) else 6.5, 5.5)
    ax = fig.add_subplot()
    xs = [p["measured"] for p in pairs]
    ys = [p["simulated"] for p in pairs]
    lo, hi = min(xs + ys), max(xs + ys)
    ends = [lo * 0.8, hi * 1.2] if lo > 0 else [lo - 1, hi + 1]
    ax.plot(ends, ends, color="0.3", linestyle="--", linewidth=1, label="y = x (exact prediction)")
    if len(pairs) <= len(MARKERS):  # few runs: each point its own mark, named with its error in the legend
        for p, (color, _), marker in zip(pairs, styles(len(pairs)), _markers(len(pairs))):
            ax.scatter([p["measured"]], [p["simulated"]], color=color, marker=marker, zorder=3,
                       label=f"{p['label']}: {100 * p['rel_error']:+.1f}%")
    else:  # many runs: one colour per protocol, names beside the points would overlap
        proto = [str(p["label"]).split(" ")[0] for p in pairs]
        for k, name in enumerate(dict.fromkeys(proto)):
            sel = [i for i, q in enumerate(proto) if q == name]
            ax.scatter([xs[i] for i in sel], [ys[i] for i in sel], color=f"C{k}", zorder=3, label=name)
    if use_log(xs + ys):
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(f"measured time {unit}")
    ax.set_ylabel(f"simulated time {unit}")
    mare = statistics.median([abs(p["rel_error"]) for p in pairs])
    ax.set_title(f"{title}\nmedian |relative error| {100 * mare:.1f}% over {len(pairs)} "
                 f"run{'s' if len(pairs) > 1 else ''}", fontsize=11)
    ax.grid(alpha=0.3)
    if len(pairs) <= len(MARKERS):
        fig.legend(loc="outside right center", fontsize=8, frameon=False,
                   title="run: (simulated − measured) / measured", title_fontsize=8)
    else:
        ax.legend(fontsize=8, loc="upper left")
    return fig


__all__ = ["error_vs_time", "heatmap", "staleness_histograms", "speedup", "speedups", "pareto",
           "pareto_front", "simulated_vs_measured", "sim_measured_pairs", "is_no_data"]
