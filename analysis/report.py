"""One self-contained HTML page per results directory.

Rules: the page references no file and no URL (figures are embedded as
``data:image/svg+xml;base64`` URIs, the style sheet is inline, links are ``#`` anchors
within the page), so it reads offline and can be mailed as one file; every value from
the results is HTML-escaped; the page is written atomically.
"""

from __future__ import annotations

import base64
import html
import os
from pathlib import Path
from typing import Any

from ._figure import fmt_value
from ..simulator.results_folder import write_file
from .figures import FORMATS, FigureSpec, render_bytes, save_figures
from .findings import answers, findings, learned
from .metrics import pareto_front
from .results import Results, load_results
from .table import Table, labels

MIME = {"svg": "image/svg+xml", "png": "image/png"}

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2rem auto;
       max-width: 1200px; padding: 0 1rem; color: #222; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: .2rem; } h2 { font-size: 1.2rem; margin-top: 2.2rem; }
.meta { color: #666; margin-top: 0; } nav ul { columns: 2; padding-left: 1.2rem; }
figure { margin: .6rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
.scroll { overflow-x: auto; max-height: 70vh; overflow-y: auto; border: 1px solid #ddd; }
table { border-collapse: collapse; font-size: .8rem; white-space: nowrap; }
th, td { border-bottom: 1px solid #eee; padding: .2rem .5rem; text-align: right; }
th { position: sticky; top: 0; background: #f4f4f4; text-align: center; }
td.text { text-align: left; } tr.front td { background: #eef7ee; font-weight: 600; }
tr.diverged td { color: #a33; }
"""


def write_report(results_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None,
                 image_format: str = "svg", force: bool = False) -> Path:
    """Write the report of ``results_dir`` to ``out`` (default ``results_dir/report.html``):
    scenario name, key results, every applicable figure with its explanation, and the
    summary table. Returns the path written."""
    results = load_results(results_dir)
    path = Path(out) if out is not None else results.root / "report.html"
    return write_file(path, report_html(results, image_format), force)


def write_figures_and_report(results_dir: str | os.PathLike[str]) -> tuple[list[Path], Path]:
    """``results_dir/figures/<name>.png|svg`` and ``results_dir/report.html``, each figure
    drawn once for both. Returns (figure paths, report path)."""
    results = load_results(results_dir)
    rendered = render_bytes(results, FORMATS)
    figures = save_figures(rendered, results.root / "figures")
    page = report_html(results, "svg", rendered)
    return figures, write_file(results.root / "report.html", page)


def report_html(results: Results, image_format: str = "svg",
                rendered: list[tuple[FigureSpec, dict[str, bytes]]] | None = None) -> str:
    """The report page of ``results`` as one HTML string (see the module rules); ``rendered``
    reuses figures already encoded (:func:`.figures.render_bytes`) in ``image_format``."""
    if rendered is None:
        rendered = render_bytes(results, (image_format,))
    figures = [(spec, _data_uri(enc[image_format], image_format)) for spec, enc in rendered]
    name = html.escape(results.name)
    nav = "".join(f'<li><a href="#fig-{spec.name}">{html.escape(spec.title)}</a></li>'
                  for spec, _ in figures) + '<li><a href="#summary">Summary table</a></li>'
    sections = "".join(
        f'<section id="fig-{spec.name}"><h2>{html.escape(spec.title)}</h2>'
        f"<p>{html.escape(spec.explanation)}</p>"
        f'<figure><img src="{uri}" alt="{html.escape(spec.title)}"></figure></section>\n'
        for spec, uri in figures)
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>ddlsim report: {name}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n"
        f"<h1>ddlsim report: {name}</h1>\n<p class=\"meta\">{_meta(results)}</p>\n"
        f"{_highlights(results)}\n<nav><ul>{nav}</ul></nav>\n{sections}"
        f"<section id=\"summary\"><h2>Summary table</h2>{_summary_table(results.summary)}</section>\n"
        "</body>\n</html>\n")


def _data_uri(data: bytes, fmt: str) -> str:
    return f"data:{MIME[fmt]};base64,{base64.b64encode(data).decode('ascii')}"


def _meta(results: Results) -> str:
    s = results.summary
    runs = len(s) or len({r.get("run_id") for r in results.curves})
    protos = sorted({str(p) for p in s.column("protocol") if p is not None})
    parts = [f"{runs} run{'s' if runs != 1 else ''}"]
    if protos:
        parts.append("protocols: " + ", ".join(protos))
    diverged = sum(1 for v in s.column("diverged") if v is True)
    if diverged:
        parts.append(f"{diverged} diverged")
    stuck = sum(1 for r in s if r.get("did_not_learn") is True and r.get("diverged") is not True)
    if stuck:
        parts.append(f"{stuck} did not learn")
    failed = sum(1 for v in s.column("error") if v)
    if failed:
        parts.append(f"{failed} failed (see the error column)")
    if results.target_error is not None:
        parts.append(f"target error {100 * results.target_error:g}%")
    parts.append(f"results directory: {results.root.resolve().name}")
    return html.escape(" · ".join(parts))


def _highlights(results: Results) -> str:
    """What the sweep found (:func:`.findings.findings`), then the key answers: lowest final
    error, fastest to target, shortest run (runs that learned; ties to the shorter time) and
    the time/error frontier of the runs that learned."""
    rows = list(results.summary)
    if not rows:
        return ""
    names = labels(rows)
    items = [_esc(f) for f in findings(rows)]
    items += [f"{q}: <b>{_esc(names[str(r['run_id'])])}</b>, {_esc(v)}" for q, r, v in answers(rows)]
    front = pareto_front([r for r in rows if learned(r)])
    if front:
        items.append("Pareto-optimal runs (time, final error): " + "; ".join(
            f"{_esc(names[str(r['run_id'])])} ({fmt_value('sim_time_s', r['sim_time_s'])}, "
            f"{fmt_value('final_test_error', r['final_test_error'])})" for r in front))
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""


def _esc(v: Any) -> str:
    return html.escape(str(v))


def _cell(v: Any) -> tuple[str, bool]:
    """Cell text and whether it is text (left-aligned) rather than a number."""
    if v is None:
        return "", False
    if isinstance(v, bool):
        return str(v), True
    if isinstance(v, float):
        return f"{v:.4g}", False
    return _esc(v), not isinstance(v, int)


def _summary_table(summary: Table) -> str:
    """All summary columns, Pareto-optimal rows highlighted, rows that diverged or did not learn red."""
    if not summary:
        return "<p>No summary.csv in this results directory.</p>"
    front = {id(r) for r in pareto_front([r for r in summary.rows if learned(r)])}
    head = "".join(f"<th>{_esc(c)}</th>" for c in summary.columns)
    body = []
    for r in summary:
        cls = "front" if id(r) in front else "diverged" if not learned(r) and r.get("final_test_error") is not None else ""
        cells = "".join(f'<td class="text">{t}</td>' if is_text else f"<td>{t}</td>"
                        for t, is_text in (_cell(r.get(c)) for c in summary.columns))
        body.append(f'<tr class="{cls}">{cells}</tr>' if cls else f"<tr>{cells}</tr>")
    note = ("<p>Rows in green are Pareto-optimal (no run is both faster and more accurate); "
            "red rows diverged or did not learn.</p>" if front else "")
    return (f'{note}<div class="scroll"><table><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div>")


__all__ = ["write_report", "write_figures_and_report", "report_html"]
