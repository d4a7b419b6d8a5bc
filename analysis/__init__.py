"""Result tables, figures and the HTML report of a results directory.

Public API (used by ``ddlsim plot DIR`` and ``ddlsim report DIR``)::

    write_figures(results_dir, out_dir=None) -> list[Path]   # PNG + SVG per figure
    write_report(results_dir, out=None) -> Path              # one self-contained HTML page
    Table.read_csv(path), label(row), labels(rows)           # result tables
    ddlsim.analysis.plots.*                                  # figures as matplotlib Figures

The figure and report modules import matplotlib; they are loaded on first use so that
``import ddlsim.analysis`` stays cheap.
"""

from __future__ import annotations

from typing import Any

from .table import Table, label, labels

_LAZY = {"write_figures": "figures", "write_report": "report", "load_results": "results",
         "pareto_front": "metrics", "speedups": "metrics"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module
        return getattr(import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Table", "label", "labels", "write_figures", "write_report", "load_results",
           "pareto_front", "speedups"]
