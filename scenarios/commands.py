"""Sub-commands beyond simulate/run: figures and the report (more are added here)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .schema import ScenarioError


def _results_dir(path: str) -> Path:
    p = Path(path)
    if not (p / "summary.csv").is_file():
        raise ScenarioError(f"{p}: not a results directory (no summary.csv); run `ddlsim simulate` or "
                            "`ddlsim run` with --out first")
    return p


def cmd_plot(args: argparse.Namespace) -> int:
    from ..analysis.figures import write_figures

    files = write_figures(_results_dir(args.results), args.out)
    for f in files:
        print(f)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from ..analysis.report import write_report

    print(f"report: {write_report(_results_dir(args.results), args.out)}")
    return 0


def register(sub: Any) -> None:
    """Add the plot and report commands to the ``ddlsim`` parser."""
    p = sub.add_parser("plot", help="draw the tradeoff figures of a results directory (PNG and SVG)")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="figure directory (default RESULTS/figures)")
    p.set_defaults(func=cmd_plot)
    p = sub.add_parser("report", help="write one self-contained HTML report of a results directory")
    p.add_argument("results", help="results directory")
    p.add_argument("--out", help="HTML file (default RESULTS/report.html)")
    p.set_defaults(func=cmd_report)
    from .advise import register as register_advise

    register_advise(sub)
