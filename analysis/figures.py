"""The catalogue of figures of a results directory, and writing them as PNG and SVG.

``FIGURES`` lists every figure once, with the explanation the report prints under it.
A figure applies when its drawing function finds data (it does not return a "no
data" figure); figures that do not apply are skipped.
"""

from __future__ import annotations

import io
import os
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import matplotlib
from matplotlib.figure import Figure

from . import plots
from ._figure import is_no_data
from ..simulator.results_folder import place
from .results import Results, load_results

FORMATS = ("png", "svg")


@dataclass(frozen=True)
class FigureSpec:
    """One figure: file stem, heading, what it shows, and how to draw it."""

    name: str
    title: str
    explanation: str
    draw: Callable[[Results], Figure]


FIGURES: tuple[FigureSpec, ...] = (
    FigureSpec(
        "error_vs_time", "Test error over simulated time",
        "Test error of each configuration against simulated wall-clock time: the accuracy/runtime "
        "tradeoff itself. With replicates, the line is the mean over the seeds and the band spans their "
        "lowest to highest error. Lower and further left is better; faded lines diverged. A large "
        "sweep gets one panel per protocol configuration, colour = learners λ, style = minibatch μ.",
        lambda r: plots.error_vs_time(r.curves, r.summary, target=r.target_error)),
    FigureSpec(
        "pareto", "Pareto frontier of time and error",
        "Every configuration as a point of simulated run time and final test error (with replicates: "
        "their means, the bars spanning each mean's 95 % interval over the seeds). The step line joins "
        "the configurations no other beats on both; those are the ones worth choosing.",
        lambda r: plots.pareto(r.summary)),
    FigureSpec(
        "heatmap_final_error", "Final test error by learners and minibatch",
        "Final test error for each learners λ × minibatch μ cell, one panel per protocol "
        "configuration (with replicates: the mean, and the seeds' range beneath where it is wider than "
        "a point). Rudra's rule: keep λμ about constant.",
        lambda r: plots.heatmap(r.summary, "final_test_error")),
    FigureSpec(
        "heatmap_time_to_target", "Time to target error by learners and minibatch",
        "Simulated time until the test error first reached the target; \"—\" marks runs that "
        "never reached it, blank cells configurations not run.",
        lambda r: plots.heatmap(r.summary, "time_to_target_s")),
    FigureSpec(
        "heatmap_sim_time", "Simulated run time by learners and minibatch",
        "Simulated time of the whole run for each λ × μ cell, as predicted by the simulator.",
        lambda r: plots.heatmap(r.summary, "sim_time_s")),
    FigureSpec(
        "speedup", "Speed-up over one learner",
        "Run time of one learner divided by the run time with λ learners (log2 axes); the "
        "dashed line is linear speed-up. Configurations with identical speed-ups share one line "
        "whose legend names them all. Rudra reports 22–28× with up to 30 learners.",
        lambda r: plots.speedup(r.summary)),
    FigureSpec(
        "speedup_to_target", "Speed-up of time to target error",
        "The same ratio for the time to reach the target error, which also charges a "
        "protocol for the accuracy it loses to staleness. A configuration that reached the target "
        "only with one learner has no line; the legend names it.",
        lambda r: plots.speedup(r.summary, "time_to_target_s")),
    FigureSpec(
        "staleness", "Staleness distributions",
        "Frequency of each gradient staleness σ per run, with the mean ⟨σ⟩ (red). For "
        "n-softsync Rudra finds ⟨σ⟩ ≈ n (dashed) and σ rarely above 2n. Runs with σ = 0 for every "
        "gradient (hardsync, one learner) get no panel; the title names them.",
        lambda r: plots.staleness_histograms(r.staleness)),
    FigureSpec(
        "simulated_vs_measured", "Simulated against measured time",
        "Simulated time against the time measured by live runs of the same configuration; "
        "points on the dashed line are predicted exactly, labels give the relative error.",
        lambda r: plots.simulated_vs_measured(r.summary)),
)


def render(results: Results) -> Iterator[tuple[FigureSpec, Figure]]:
    """Each applicable figure of ``results`` with its spec, in catalogue order.

    A figure that fails to draw is skipped with a warning naming it, so that one
    unexpected table cannot cost the user every other figure and the report."""
    for spec in FIGURES:
        try:
            fig = spec.draw(results)
        except Exception as e:
            warnings.warn(f"figure {spec.name!r} skipped: {type(e).__name__}: {e}", stacklevel=2)
            continue
        if not is_no_data(fig):
            yield spec, fig


def figure_bytes(fig: Figure, fmt: str, dpi: int = 110) -> bytes:
    """The figure encoded as ``fmt`` ("png" or "svg"), without timestamps (stable output)."""
    buf = io.BytesIO()
    meta = {"Date": None} if fmt == "svg" else {"Software": None} if fmt == "png" else None
    with matplotlib.rc_context({"svg.hashsalt": "ddlsim", "svg.fonttype": "path"}):
        fig.savefig(buf, format=fmt, dpi=dpi, metadata=meta)
    return buf.getvalue()


def render_bytes(results: Results, formats: tuple[str, ...] = FORMATS) -> list[tuple[FigureSpec, dict[str, bytes]]]:
    """Each applicable figure of ``results`` drawn once and encoded in every one of ``formats``."""
    out = []
    for spec, fig in render(results):
        try:
            out.append((spec, {fmt: figure_bytes(fig, fmt) for fmt in formats}))
        except (ValueError, OverflowError) as e:  # a number near the float limit in a hand-edited table
            warnings.warn(f"figure {spec.name!r} skipped: {type(e).__name__}: {e}", stacklevel=2)
    return out


def save_figures(rendered: list[tuple[FigureSpec, dict[str, bytes]]], out: Path, force: bool = False) -> list[Path]:
    """Write each encoded figure as ``out/<name>.<fmt>``, each file atomically, as ddlsim's files
    of the results folder holding ``out`` (:mod:`ddlsim.simulator.results_folder`); the figures
    ddlsim wrote there before and did not draw now (they describe runs that are gone) are
    deleted. The paths written, in order."""
    names = [f"{spec.name}.{fmt}" for spec, enc in rendered for fmt in enc]
    folder, prefix = place(out, force)
    with folder:
        folder.claim([prefix + n for n in names])
        paths = [folder.write(prefix + f"{spec.name}.{fmt}", data)
                 for spec, enc in rendered for fmt, data in enc.items()]
        drawable = {f"{prefix}{spec.name}.{fmt}" for spec in FIGURES for fmt in FORMATS}
        folder.remove(f for f in folder.under(prefix) if f in drawable and f not in {prefix + n for n in names})
    return paths


def write_figures(results_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None,
                  formats: tuple[str, ...] = FORMATS, force: bool = False) -> list[Path]:
    """Draw every applicable figure of ``results_dir`` and write it as ``<name>.<fmt>``
    for each of ``formats`` into ``out_dir`` (default ``results_dir/figures``), each file
    atomically. Returns the paths written, in catalogue order."""
    results = load_results(results_dir)
    out = Path(out_dir) if out_dir is not None else results.root / "figures"
    return save_figures(render_bytes(results, formats), out, force)


__all__ = ["FigureSpec", "FIGURES", "render", "render_bytes", "save_figures", "figure_bytes", "write_figures"]
