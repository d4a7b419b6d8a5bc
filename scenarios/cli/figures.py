"""``ddlsim plot`` and ``ddlsim report``: the figures and the HTML report of a results folder."""

from __future__ import annotations

import argparse
import csv
from pathlib import Path
from typing import Any

from ...simulator.results_folder import ResultsFolder
from ..schema import ScenarioError


REPORT_SUFFIXES = (".html", ".htm")


def _results_dir(path: str) -> Path:
    """``path`` if it holds a ddlsim summary.csv (a header with ``run_id``), else one clear error."""
    p = Path(path)
    if (p / "summary.csv").exists() and not (p / "summary.csv").is_file():
        raise ScenarioError(f"{p / 'summary.csv'}: not a regular file (a ddlsim summary is a CSV file)")
    if not (p / "summary.csv").is_file():
        raise ScenarioError(f"{p}: not a results directory (no summary.csv); run `ddlsim simulate` or "
                            "`ddlsim run` with --out first")
    try:
        with open(p / "summary.csv", newline="", encoding="utf-8-sig") as f:
            header = next(csv.reader(f), [])
    except UnicodeDecodeError:
        raise ScenarioError(f"{p / 'summary.csv'}: not UTF-8 text (not a ddlsim summary)") from None
    except csv.Error as e:  # e.g. a header field beyond the csv module's field limit
        raise ScenarioError(f"{p / 'summary.csv'}: not a readable CSV table ({e})") from None
    if "run_id" not in header:
        shown = ", ".join(header[:6]) + (", …" if len(header) > 6 else "") or "none"
        raise ScenarioError(f"{p / 'summary.csv'}: not a ddlsim summary (no run_id column; columns: {shown})")
    return p


def cmd_plot(args: argparse.Namespace) -> int:
    from ...analysis.figures import write_figures

    results = _results_dir(args.results)
    with ResultsFolder.open(results, force=args.force):
        files = write_figures(results, args.out, force=args.force)
    if not files:
        raise ScenarioError(f"{results}: no figure applies (its tables have no runs with times, "
                            "errors or staleness to draw)")
    for f in files:
        print(f)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ...analysis.report import write_report

    if args.out is not None and Path(args.out).suffix.lower() not in REPORT_SUFFIXES:
        raise ScenarioError(f"--out {args.out!r}: a report is one HTML file; name a file ending in .html (a "
                            "results folder's other files are its results, which a report never replaces)")
    results = _results_dir(args.results)
    with ResultsFolder.open(results, force=args.force):
        print(f"report: {write_report(results, args.out, force=args.force)}")
    return 0


def register(sub: Any) -> None:
    """Add ``plot`` and ``report`` to the ``ddlsim`` parser."""
    p = sub.add_parser("plot", help="draw the tradeoff figures of a results directory (PNG and SVG)")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="figure directory (default RESULTS/figures)")
    p.add_argument("--force", action="store_true", help="overwrite figure files ddlsim did not write")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("report", help="write one self-contained HTML report of a results directory")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="HTML file (default RESULTS/report.html)")
    p.add_argument("--force", action="store_true", help="overwrite a report file ddlsim did not write")
    p.set_defaults(func=cmd_report)
