"""Shared figure helpers: blank "no data" figures, panel grids, number formats.

Figures are built with :class:`matplotlib.figure.Figure` directly (never ``pyplot``),
so no GUI backend is involved, no global figure list grows, and rendering goes through
Agg (PNG) or the SVG writer whatever backend the user has configured.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

NO_DATA = "ddlsim:no-data"
ERROR_COLUMNS = {"final_test_error", "best_test_error", "test_error"}
UNITS = {
    "final_test_error": "final test error",
    "best_test_error": "best test error",
    "test_error": "test error",
    "sim_time_s": "simulated run time (s)",
    "time_to_target_s": "simulated time to target error (s)",
    "measured_sim_time_s": "measured run time (s)",
    "gradients_per_s": "gradients per simulated second",
    "staleness_mean": "mean staleness ⟨σ⟩ (updates)",
    "server_utilization": "server utilization",
    "server_wait_mean_s": "mean server wait (s)",
}


def describe(column: str) -> str:
    """Axis text (with unit) of a result column."""
    return UNITS.get(column, column.replace("_", " "))


def new_figure(width: float = 7.0, height: float = 4.5) -> Figure:
    """A figure with constrained layout (labels and legends never clipped)."""
    return Figure(figsize=(width, height), layout="constrained")


def no_data(title: str, reason: str) -> Figure:
    """A figure that says plainly why there is nothing to draw; marked by its label."""
    fig = new_figure(6.0, 2.5)
    fig.set_label(NO_DATA)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"no data\n{reason}", ha="center", va="center", fontsize=11,
            color="0.35", transform=ax.transAxes, wrap=True)
    return fig


def is_no_data(fig: Figure) -> bool:
    """True for a figure made by :func:`no_data`."""
    return fig.get_label() == NO_DATA


def panel_grid(fig: Figure, count: int, max_cols: int = 3, share: bool = False) -> list[Axes]:
    """``count`` axes in a grid of at most ``max_cols`` columns (extra cells removed);
    ``share`` shares both axes' limits and scales."""
    cols = max(1, min(max_cols, count))
    rows = math.ceil(count / cols)
    axes = fig.subplots(rows, cols, squeeze=False, sharex=share, sharey=share).ravel()
    for ax in axes[count:]:
        ax.remove()
    return list(axes[:count])


def panel_size(count: int, max_cols: int = 3, w: float = 4.2, h: float = 3.3) -> tuple[float, float]:
    """Figure size in inches for ``count`` panels of ``w`` × ``h``."""
    cols = max(1, min(max_cols, count))
    return (w * cols + 0.6, h * math.ceil(count / cols) + 0.4)


def fmt_value(column: str, v: Any) -> str:
    """Compact text of a metric: errors in %, seconds with a unit, else 3 digits."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    if column in ERROR_COLUMNS:
        return f"{100 * v:.1f}%"
    if column.endswith("_s"):
        return fmt_seconds(v)
    return f"{v:.3g}"


def fmt_seconds(v: float) -> str:
    """Seconds, minutes or hours with 3 significant digits."""
    if abs(v) >= 7200:
        return f"{v / 3600:.3g} h"
    if abs(v) >= 120:
        return f"{v / 60:.3g} min"
    if abs(v) >= 0.1 or v == 0:
        return f"{v:.3g} s"
    return f"{v * 1e3:.3g} ms"


def percent_axis(ax: Axes, axis: str = "y") -> None:
    """Show a 0–1 error axis in percent."""
    f = FuncFormatter(lambda v, _pos: "" if not math.isfinite(100 * v) else f"{100 * v:.0f}%"
                      if abs(100 * v - round(100 * v)) < 1e-9 else f"{100 * v:.1f}%")
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(f)


def use_log(values: Sequence[float], ratio: float = 30.0) -> bool:
    """Log scale when positive values span more than ``ratio``."""
    pos = [v for v in values if v > 0]
    return len(pos) > 1 and max(pos) / min(pos) > ratio and len(pos) == len(values)


def plain_log2_axis(ax: Axes, axis: str, ticks: Sequence[float]) -> None:
    """Base-2 log axis with ticks at ``ticks`` written as plain numbers."""
    set_scale = ax.set_xscale if axis == "x" else ax.set_yscale
    set_scale("log", base=2)
    target = ax.xaxis if axis == "x" else ax.yaxis
    target.set_major_formatter(FuncFormatter(lambda v, _p: f"{v:g}"))
    if ticks:
        (ax.set_xticks if axis == "x" else ax.set_yticks)(sorted(set(ticks)))
    target.set_minor_formatter(FuncFormatter(lambda v, _p: ""))


def wrap(text: str, width: int = 44) -> str:
    """``text`` broken into lines of at most ``width`` characters (a legend entry, a note)."""
    return "\n".join(textwrap.wrap(text, width, break_on_hyphens=False)) or text


def same_text(names: Sequence[str], identical: bool = True, width: int = 44) -> str:
    """One legend entry naming every one of ``names`` (labels of configurations drawn as one).

    Names of the same shape that differ in some words, and together are every combination of
    those words, are written once with the alternatives joined by "/" (``"async/1-softsync
    μ=8/32 constant"`` for four); any other set is listed in full, joined by "≡"
    (``identical``) or ",". With ``identical`` and several names, "(N identical)" follows.
    Wrapped at ``width``, never inside that count."""
    names = list(dict.fromkeys(names))
    if len(names) < 2:
        return wrap(names[0] if names else "", width)
    words = [n.split(" ") for n in names]
    same_shape = len({len(w) for w in words}) == 1
    options = [list(dict.fromkeys(w[i] for w in words)) for i in range(len(words[0]))] if same_shape else []
    if same_shape and math.prod(len(o) for o in options) == len(names):
        text = " ".join(_alternatives(o) for o in options)
    else:
        text = (" ≡ " if identical else ", ").join(names)
    return wrap(text + (f" ({len(names)}\u00a0identical)" if identical else ""), width)


def _alternatives(words: list[str]) -> str:
    """``"a/b"``; ``"μ=8/32"`` for words that all name the same key."""
    keys = {w.partition("=")[0] for w in words}
    if len(words) > 1 and len(keys) == 1 and all("=" in w for w in words):
        return f"{keys.pop()}=" + "/".join(w.partition("=")[2] for w in words)
    return "/".join(words)


LINESTYLES = ("-", "--", ":", "-.")


def styles(n: int) -> list[tuple[Any, str]]:
    """``n`` distinct (colour, line style) pairs: ten colours, then the next style."""
    cmap = colormaps["tab10"]
    return [(cmap(i % 10), LINESTYLES[(i // 10) % len(LINESTYLES)]) for i in range(n)]


def text_color(rgba: Sequence[float]) -> str:
    """Black or white, whichever reads better on a cell of colour ``rgba``."""
    r, g, b = rgba[:3]
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "white"
