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
from collections.abc import Mapping
from typing import Any

from ._figure import fmt_value
from ..simulator.results_folder import write_file
from .figures import FORMATS, FigureSpec, render_bytes, save_figures
from .findings import TIE_SAMPLES, answers, configuration_rows, findings, learned, span, tie_width, tied
from .metrics import pareto_front
from .results import Results, load_results
from .table import Table, config_labels, is_number, is_value, sort_key

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
table.summary { display: grid; }
table.summary thead, table.summary tbody, table.summary tr { display: contents; }
table.summary th { order: -1; z-index: 1; white-space: normal; vertical-align: bottom; }
table.summary .more { display: none; }
#all-columns:checked ~ .scroll table.summary .more { display: block; }
input.control { position: absolute; opacity: 0; pointer-events: none; }
.controls label, th label { cursor: pointer; user-select: none; }
.controls label { color: #06c; } th label.dir { color: #999; font-size: .7rem; padding-left: .1rem; }
.notes { color: #8a5a00; }
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
    table, table_style = _summary_table(results.summary)
    configs = _configurations_table(results.summary)
    if configs:
        nav += '<li><a href="#configurations">Configurations (mean over seeds)</a></li>'
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        f"<title>ddlsim report: {name}</title>\n<style>{STYLE}{table_style}</style>\n</head>\n<body>\n"
        f"<h1>ddlsim report: {name}</h1>\n<p class=\"meta\">{_meta(results)}</p>\n"
        f"{_highlights(results)}\n<nav><ul>{nav}</ul></nav>\n{sections}"
        f"{configs}<section id=\"summary\"><h2>Summary table</h2>{table}</section>\n"
        f"{_notes(results)}"
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
    """What the sweep found (:func:`.findings.findings`), then the key answers, asked of
    configurations (the mean over their seeds, :func:`.findings.answers`): lowest final error
    with the configurations tied with it (:func:`.findings.tied`), fastest to target, shortest
    run that reached the target, and the time/error frontier of those that learned."""
    rows = list(results.summary)
    if not rows:
        return ""
    names = config_labels(rows)
    items = [_esc(f) for f in findings(rows, results.curves, results.test_size, results.target_error)]
    configs = configuration_rows(rows)
    multi = any(r.get("replicates", 1) > 1 for r in configs)
    for q, r, v in answers(rows):
        if r is None:
            items.append(f"{q}: {_esc(v)}")
            continue
        items.append(f"{q}: <b>{_esc(names[str(r['run_id'])])}</b>, {_esc(v)}"
                     + (_ties(configs, r, names, results.test_size) if q.startswith("Lowest") else ""))
    front = pareto_front([r for r in configs if learned(r)])
    if front:
        items.append((f"Pareto-optimal configurations (mean run length, mean final error; means only, so a "
                      f"difference within {TIE_SAMPLES} test samples is noise): " if multi else
                      "Pareto-optimal runs (run length, final error): ") + "; ".join(
            f"{_esc(names[str(r['run_id'])])} ({fmt_value('sim_time_s', r['sim_time_s'])}, "
            f"{fmt_value('final_test_error', r['final_test_error'])})" for r in front))
    return "<ul>" + "".join(f"<li>{i}</li>" for i in items) + "</ul>" if items else ""


def _ties(rows: list[dict[str, Any]], winner: Mapping[str, Any], names: dict[str, str],
          test_size: int | None) -> str:
    """The sentence naming the runs (configurations, with replicates) tied with the lowest final
    error, and the fastest of them."""
    others = tied(rows, winner, "final_test_error", test_size)
    if not others:
        return ""
    multi = any(r.get("replicates", 1) > 1 for r in rows)
    noise = (f"within {TIE_SAMPLES} test samples ({fmt_value('final_test_error', tie_width(test_size))} of a "
             f"{test_size}-sample test set: differences that small are noise)" if test_size
             else "at the same error (the test set's size is unknown, so only equal errors count as tied)")
    if multi:
        noise = (f"within {TIE_SAMPLES} test samples, {fmt_value('final_test_error', tie_width(test_size))} of a "
                 f"{test_size}-sample test set: differences that small are noise" if test_size else
                 "at the same mean error")
    within = (f"(each one's mean within the other's 95 % interval over the seeds, or {noise})" if multi else noise)
    timed = [r for r in [winner, *others] if isinstance(r.get("sim_time_s"), (int, float))]
    fastest = min(timed, key=lambda r: r["sim_time_s"], default=None)
    quick = ""
    if fastest is not None and fastest is not winner:
        quick = (f"; the shortest run of them (its whole length, not a speed): "
                 f"<b>{_esc(names[str(fastest['run_id'])])}</b> "
                 f"({fmt_value('final_test_error', fastest['final_test_error'])} after "
                 f"{fmt_value('sim_time_s', fastest['sim_time_s'])})")
    listed = "; ".join(f"{_esc(names[str(r['run_id'])])} ({fmt_value('final_test_error', r['final_test_error'])}, "
                       f"{fmt_value('sim_time_s', r.get('sim_time_s'))})" for r in others)
    what = "configuration" if multi else "run"
    return (f"; tied with {len(others)} other {what}{'s' * (len(others) != 1)} {_esc(within)}{quick}"
            f'<details class="ties"><summary>the {len(others)} tied {what}{"s" * (len(others) != 1)}</summary>'
            f"{listed}</details>")


def _notes(results: Results) -> str:
    """What reading the results folder left out (cells read as missing, files skipped)."""
    if not results.notes:
        return ""
    shown = results.notes[:20]
    more = f"<li>and {len(results.notes) - len(shown)} more</li>" if len(results.notes) > len(shown) else ""
    return ('<section id="notes"><h2>Notes on the results files</h2><ul class="notes">'
            + "".join(f"<li>{_esc(n)}</li>" for n in shown) + more + "</ul></section>\n")


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


# The summary table's columns: what identifies a run, then what it measured; the rest collapse.
IDENTITY = ("run_id", "protocol", "softsync_n", "learners", "minibatch", "seed")
RESULTS = ("final_test_error", "best_test_error", "time_to_target_s", "sim_time_s", "staleness_mean",
           "diverged", "did_not_learn", "error")
SIM_RESULTS = ("gradients_per_s", "staleness_max", "server_utilization", "link_in_utilization",
               "link_out_utilization")  # shown too when no run was trained (a simulation only)
HEADINGS = {"run_id": "run", "softsync_n": "n", "learners": "λ", "minibatch": "μ",
            "final_test_error": "final error", "best_test_error": "best error",
            "time_to_target_s": "time to target", "sim_time_s": "run time", "staleness_mean": "⟨σ⟩",
            "staleness_max": "σ max", "gradients_per_s": "gradients/s", "server_utilization": "server util",
            "link_in_utilization": "NIC in util", "link_out_utilization": "NIC out util",
            "did_not_learn": "did not learn"}
FORMATTED = {"final_test_error", "best_test_error", "time_to_target_s", "sim_time_s"}


def heading(column: str) -> str:
    """A column's heading in the summary table: a short name (the CSV name is its tooltip);
    a swept key by its last part."""
    return HEADINGS.get(column, column.rsplit(".", 1)[-1] if "." in column else column)


def summary_columns(summary: Table) -> tuple[list[str], list[str]]:
    """(shown, collapsed) columns of the summary table: the identifying columns and the swept
    keys, then the results (:data:`RESULTS`, and :data:`SIM_RESULTS` for a simulation only),
    each only where some run has a value; every other column collapses."""
    swept = [c for c in summary.columns if "." in c and summary.has(c)]
    trained = summary.has("final_test_error")
    lead = [c for c in (*IDENTITY, *swept, *RESULTS, *(() if trained else SIM_RESULTS))
            if c in summary.columns and (c == "run_id" or summary.has(c))]
    return lead, [c for c in summary.columns if c not in lead]


def _ranks(rows: list[dict[str, Any]], column: str, descending: bool) -> list[int]:
    """Each row's place (0 first) when sorted by ``column``; empty cells last either way,
    equal cells in table order (so every place is distinct)."""
    def key(i: int) -> tuple[Any, ...]:
        k = sort_key(rows[i].get(column))
        if not descending or k[0] == 2:
            return (k[0], k[1], i)
        if k[0] == 0:
            return (0, -k[1], i)
        return (1, tuple(-ord(ch) for ch in k[1]), i)
    order = sorted(range(len(rows)), key=key)
    place = [0] * len(rows)
    for p, i in enumerate(order):
        place[i] = p
    return place


CONFIG_HEADINGS = (("configuration", "configuration"), ("replicates", "seeds"), ("final", "final error: mean"),
                   ("final_range", "range"), ("final_ci", "95 % interval"), ("best", "best error: mean"),
                   ("ttt", "time to target: mean"), ("reached", "reached"), ("time", "run time: mean"),
                   ("did_not_learn", "did not learn"))


def _configurations_table(summary: Table) -> str:
    """With replicates, one row per configuration: the mean, range and 95 % Student-t interval
    of its final error over the seeds (none where every seed ended at one error: n seeds without
    spread make no interval), its mean best error, time to target (over the seeds that reached it,
    counted) and run time, and how many seeds did not learn (configurations.csv's numbers);
    nothing when every configuration ran once."""
    configs = configuration_rows(summary)
    if not any(r.get("replicates", 1) > 1 for r in configs):
        return ""
    names = config_labels(summary)

    def err(v: Any) -> str:
        return fmt_value("final_test_error", v) if is_number(v) else ""

    body = []
    for r in configs:
        n = r.get("replicates", 1)
        finals = [x["final_test_error"] for x in r["_runs"] if is_number(x.get("final_test_error"))]
        lo, hi = r.get("final_test_error_ci_low"), r.get("final_test_error_ci_high")
        # every seed at one error: no spread to make an interval of (the seeds agree; it is not a certainty)
        ci = ("" if not is_number(lo) else f"none: all {n} seeds at {err(lo)}" if lo == hi
              else f"{err(lo)}–{err(hi)}")
        reached = r.get("time_to_target_reached")
        cells = [names[str(r["run_id"])], str(n), err(r.get("final_test_error_mean")),
                 span(finals, lambda v: f"{100 * v:.1f}%") if finals else "", ci, err(r.get("best_test_error_mean")),
                 fmt_value("time_to_target_s", r["time_to_target_s_mean"]) if is_number(r.get("time_to_target_s_mean"))
                 else "", f"{reached}/{n}" if reached is not None else "",
                 fmt_value("sim_time_s", r["sim_time_s_mean"]) if is_number(r.get("sim_time_s_mean")) else "",
                 f"{sum(x.get('did_not_learn') is True for x in r['_runs'])}/{n}"
                 if any("did_not_learn" in x for x in r["_runs"]) else ""]
        body.append("<tr>" + "".join(f'<td class="text">{_esc(c)}</td>' if i == 0 else f"<td>{_esc(c)}</td>"
                                     for i, c in enumerate(cells)) + "</tr>")
    head = "".join(f"<th>{_esc(h)}</th>" for _, h in CONFIG_HEADINGS)
    return ('<section id="configurations"><h2>Configurations (mean over seeds)</h2>'
            "<p>One row per configuration, its numbers over its seeds (configurations.csv): the mean, range and 95 % "
            "Student-t interval of the final test error, and the seeds that reached the target.</p>"
            f'<div class="scroll"><table class="configs"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div></section>\n")


def _summary_table(summary: Table) -> tuple[str, str]:
    """The summary table: identifying and result columns first (:func:`summary_columns`), the
    others collapsed behind "show all columns"; Pareto-optimal rows highlighted, rows that
    diverged or did not learn red. Sortable by any column, ascending or descending, without
    script: each row carries its place under every sort as a CSS variable, and the checked
    sort control orders the cells of the grid by it. Returns (HTML, its style rules)."""
    if not summary:
        return "<p>No summary.csv in this results directory.</p>", ""
    rows = summary.rows
    lead, rest = summary_columns(summary)
    columns = lead + rest
    front = {id(r) for r in pareto_front([r for r in rows if learned(r)])}
    places = {(k, d): _ranks(rows, c, d) for k, c in enumerate(columns) for d in (False, True)}
    more = ' class="more"'
    head = "".join(
        f'<th{more if c in rest else ""} title="{_esc(c)}">'
        f'<label for="sort-{k}-a">{_esc(heading(c))}</label>'
        f'<label class="dir" for="sort-{k}-a" title="sort ascending">▲</label>'
        f'<label class="dir" for="sort-{k}-d" title="sort descending">▼</label></th>'
        for k, c in enumerate(columns))
    body = []
    for i, r in enumerate(rows):
        diverged = not learned(r) and r.get("final_test_error") is not None
        cls = "front" if id(r) in front else "diverged" if diverged else ""
        style = ";".join(f"--{'d' if d else 'a'}{k}:{places[(k, d)][i]}" for k in range(len(columns))
                         for d in (False, True))
        cells = "".join(_td(c, r.get(c), c in rest) for c in columns)
        klass = f' class="{cls}"' if cls else ""
        body.append(f'<tr{klass} style="{style}">{cells}</tr>')
    note = ("<p>Rows in green are Pareto-optimal (no run is both shorter and more accurate); "
            "red rows diverged or did not learn.</p>" if front else "")
    controls = ('<input type="checkbox" class="control" id="all-columns">'
                '<input type="radio" class="control" name="sort" id="sort-none" checked>'
                + "".join(f'<input type="radio" class="control" name="sort" id="sort-{k}-{d}">'
                          for k in range(len(columns)) for d in "ad"))
    links = ('<p class="controls">Click a heading to sort (▲ ascending, ▼ descending; '
             '<label for="sort-none">table order</label>) · '
             + (f'<label for="all-columns">show or hide the other {len(rest)} columns</label> '
                f"({_esc(', '.join(rest))})" if rest else "every column shown") + "</p>")
    return (f'{note}<div class="sortable">{controls}{links}'
            f'<div class="scroll"><table class="summary"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table></div></div>"), _sort_style(len(lead), len(columns))


def _sort_style(shown: int, total: int) -> str:
    """The grid's column counts (collapsed and expanded) and one ordering rule per sort control."""
    rules = [f"table.summary {{ grid-template-columns: repeat({shown}, auto); }}",
             f"#all-columns:checked ~ .scroll table.summary {{ grid-template-columns: repeat({total}, auto); }}"]
    for k in range(total):
        for d in "ad":
            rules.append(f"#sort-{k}-{d}:checked ~ .scroll td {{ order: var(--{d}{k}); }}")
            rules.append(f'#sort-{k}-{d}:checked ~ .scroll th label[for="sort-{k}-{d}"] {{ color: #06c; }}')
    return "\n" + "\n".join(rules) + "\n"


def _td(column: str, v: Any, collapsed: bool) -> str:
    """One cell: results in their unit (errors in %, times in s/min/h), else :func:`_cell`."""
    if column in FORMATTED and isinstance(v, (int, float)) and not isinstance(v, bool) and is_value(v):
        text, is_text = _esc(fmt_value(column, v)), False
    else:
        text, is_text = _cell(v)
    cls = " ".join(c for c in ("text" if is_text else "", "more" if collapsed else "") if c)
    return f'<td class="{cls}">{text}</td>' if cls else f"<td>{text}</td>"


__all__ = ["write_report", "write_figures_and_report", "report_html"]
