"""What a user sees: the table `ddlsim simulate` prints, the figures, the report page, the
tables read back from a hand-edited results folder, and `ddlsim advise`'s table.

Figures are checked on the Figure objects (drawn, then every title, label and legend text
measured against the figure's box); the report by parsing its HTML; the truths are hand
computed (a closed form for the NIC's busy time, sorted lists, counts of test samples)."""

from __future__ import annotations

import csv
import html
import json
import os
import re
from html.parser import HTMLParser
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.text import Text

from ddlsim.analysis import plots
from ddlsim.analysis.report import report_html
from ddlsim.analysis.results import load_results
from ddlsim.analysis.table import Table
from ddlsim.scenarios.cli import main

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


# -- the table `ddlsim simulate` prints ---------------------------------------------------------
NET_BOUND = """
name = "net-bound"
seed = 0
[workload]
dataset = "digits"
model = "mlp"
epochs = 1
[cluster]
learners = 16
minibatch = 8
[cluster.compute]
distribution = "deterministic"
base_s = 0.0001
per_sample_s = 0.0
[cluster.network]
latency_s = 0.0
bandwidth_Bps = 1e6
[protocol]
name = "async"
"""


def test_simulate_table_shows_the_nic_that_binds(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # 16 async learners push 9,610-parameter gradients (digits MLP 64-128-10: 64·128 + 128 +
    # 128·10 + 10) over a 1 MB/s link: every gradient holds the server's NIC in for
    # 4·9610/1e6 s, the server applies it in no time. The NIC is the bottleneck.
    (tmp_path / "s.toml").write_text(NET_BOUND)
    out = tmp_path / "o"
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    head, row = lines[0], lines[1]
    summary = next(csv.DictReader(open(out / "summary.csv", encoding="utf-8")))
    busy = int(summary["gradients"]) * 4 * 9610 / 1e6        # seconds the NIC in carried gradients
    nic_in = busy / float(summary["sim_time_s"])
    col = head.index("NIC in util")
    assert row[col:].split()[0] == f"{nic_in:.4g}" and nic_in > 0.99
    server = float(row[head.index("server util"):].split()[0])
    assert server < 0.01  # the server is idle: its utilization alone would hide the bottleneck
    assert "NIC out util" in head


# -- figures ------------------------------------------------------------------------------------
def texts_outside(fig: Figure) -> list[str]:
    """Titles, axis labels, legend entries and annotations (not tick labels) that reach beyond the
    figure once drawn."""
    FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ticks = {id(t) for ax in fig.axes for a in (ax.xaxis, ax.yaxis) for t in a.get_ticklabels(which="both")}
    box = fig.bbox
    out = []
    for t in fig.findobj(Text):
        if id(t) in ticks or not t.get_visible() or not t.get_text().strip():
            continue
        b = t.get_window_extent(renderer)
        if b.x0 < box.x0 - 0.5 or b.y0 < box.y0 - 0.5 or b.x1 > box.x1 + 0.5 or b.y1 > box.y1 + 0.5:
            out.append(t.get_text())
    return out


def legend_texts(fig: Figure) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text().replace("\n", " ").replace("\u00a0", " ") for lg in legends for t in lg.get_texts()]


def ttt_rows() -> list[dict]:
    """The demo's shape: times to target at λ ∈ {1, 4, 16, 30}; hardsync's two lr policies
    identical, async's with a constant rate reaching the target only with one learner."""
    rows = []
    base = {("hardsync", 8): (40.0, 8.0, 5.0, 4.0), ("hardsync", 32): (40.0, 20.0, 10.0, 8.0),
            ("async", 8): (40.0, 30.0, None, None), ("async", 32): (40.0, 30.0, None, None)}
    for proto in ("hardsync", "async"):
        for mu in (8, 32):
            for pol in ("constant", "per_gradient"):
                for lam, t in zip((1, 4, 16, 30), base[(proto, mu)]):
                    if proto == "async" and pol == "per_gradient" and t is None:
                        t = 20.0 / lam
                    if proto == "async" and pol == "constant" and lam > 1:
                        t = None
                    rows.append({"run_id": f"{proto}-{lam}-{mu}-{pol}", "protocol": proto, "learners": lam,
                                 "minibatch": mu, "optimizer.lr_policy": pol, "sim_time_s": 100.0 / lam,
                                 "time_to_target_s": None if t is None else t * mu / 8})
    return rows


def test_speedup_to_target_reads_whole_and_names_every_configuration() -> None:
    fig = plots.speedup(Table(ttt_rows()), "time_to_target_s")
    assert not plots.is_no_data(fig)
    assert texts_outside(fig) == []  # the title and the y-label are whole, nothing clipped
    ax = fig.axes[0]
    assert fig.get_suptitle() == "Speed-up of simulated time to target error over one learner"
    assert "_" not in ax.get_ylabel() and "_" not in ax.get_xlabel() and "×" in ax.get_ylabel()
    legend = legend_texts(fig)
    assert not any("more" in t for t in legend)
    # hardsync: the lr policy changes nothing, so both μ's policies share one named line each
    assert "hardsync μ=8 constant/per_gradient (2 identical)" in legend
    assert "hardsync μ=32 constant/per_gradient (2 identical)" in legend
    # async per_gradient: μ=8 and μ=32 scale alike (times × 4): one line naming both
    assert "async μ=8/32 per_gradient (2 identical)" in legend
    # async constant reached the target only with one learner: no line, but named
    assert "not drawn (2: only λ = 1 reached the target): async μ=8/32 constant" in legend
    assert len(ax.lines) == 3 + 1 + 1  # three series, the ideal line, the note's empty handle


def test_speedup_of_only_one_learner_is_no_data() -> None:
    rows = [r for r in ttt_rows() if r["protocol"] == "async" and r["optimizer.lr_policy"] == "constant"]
    assert plots.is_no_data(plots.speedup(Table(rows), "time_to_target_s"))


def stale(rid: str, proto: str, lam: int, hist: dict[int, int], n: int | None = None) -> list[dict]:
    return [{"run_id": rid, "protocol": proto, "learners": lam, "minibatch": 8, "softsync_n": n,
             "staleness": s, "count": c} for s, c in hist.items()]


def test_staleness_leaves_out_runs_without_staleness_and_keeps_bars_off_the_frame() -> None:
    wide = {s: 1 + (s % 7) for s in range(0, 128)}  # async λ = 128: σ from 0 to 127
    rows = (stale("h4", "hardsync", 4, {0: 40}) + stale("h8", "hardsync", 8, {0: 80})
            + stale("a128", "async", 128, wide) + stale("s4", "softsync", 4, {0: 2, 1: 5, 2: 3}, n=1))
    fig = plots.staleness_histograms(Table(rows))
    assert len(fig.axes) == 2  # async and 1-softsync; hardsync's single bar at 0 gets no panel
    assert fig.get_suptitle().endswith("not shown: 2 runs with σ = 0 for every gradient (hardsync λ ∈ {4, 8})")
    assert texts_outside(fig) == []
    ax = next(a for a in fig.axes if a.get_title().startswith("async"))
    lo, hi = ax.get_xlim()
    half = max(p.get_width() for p in ax.patches) / 2
    # the outermost bars (σ = 0 and σ = 127) keep at least 2 % of the axis clear of the frame
    assert (hi - (127 + half)) / (hi - lo) >= 0.02 and ((0 - half) - lo) / (hi - lo) >= 0.02
    only_hardsync = Table(stale("h4", "hardsync", 4, {0: 40}))
    assert plots.is_no_data(plots.staleness_histograms(only_hardsync))


def test_validation_figure_names_close_points_without_overlap() -> None:
    from ddlsim.scenarios.validate import figure

    # six runs, three pairs of them almost on top of each other
    times = {("hardsync", 0.0): (1.76, 1.70), ("softsync", 0.0): (1.60, 1.64), ("async", 0.0): (1.60, 1.60),
             ("hardsync", 0.25): (2.81, 2.91), ("softsync", 0.25): (2.56, 2.50), ("async", 0.25): (2.56, 2.55)}
    rows = [{"run_id": f"{p}-{s}", "protocol": p, "learners": 2, "stragglers": s, "epochs": 4,
             "measured_time_per_epoch_s": m, "simulated_time_per_epoch_s": t} for (p, s), (m, t) in times.items()]
    fig = figure(rows)
    assert texts_outside(fig) == []
    legend = legend_texts(fig)
    for (p, s), (m, t) in times.items():
        assert f"{p} λ=2 stragglers={s:g}: {100 * (t - m) / m:+.1f}%" in legend
    renderer = fig.canvas.get_renderer()
    ticks = {id(t) for ax in fig.axes for a in (ax.xaxis, ax.yaxis) for t in a.get_ticklabels(which="both")}
    boxes = [t.get_window_extent(renderer) for t in fig.findobj(Text)
             if id(t) not in ticks and t.get_visible() and t.get_text().strip()]
    overlaps = [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert overlaps == []


# -- the report ---------------------------------------------------------------------------------
class SummaryTable(HTMLParser):
    """The report's summary table (heading cells with their attributes, body rows with their
    style and cell texts) and the page's style sheet."""

    def __init__(self) -> None:
        super().__init__()
        self.heads: list[dict] = []
        self.rows: list[dict] = []
        self.style = ""
        self.items: list[str] = []
        self._in: str | None = None
        self._cell: dict | None = None
        self._table = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and "summary" in (a.get("class") or ""):
            self._table = True
        if tag == "style":
            self._in = "style"
        if tag == "li" and not self._table:
            self.items.append("")
            self._in = "li"
        if not self._table:
            return
        if tag == "tr" and a.get("style"):
            self.rows.append({"style": a["style"], "cells": []})
        if tag in ("th", "td"):
            self._cell = {"class": a.get("class") or "", "title": a.get("title"), "text": "", "for": []}
            (self.heads if tag == "th" else self.rows[-1]["cells"]).append(self._cell)
        if tag == "label" and self._cell is not None:
            self._cell["for"].append(a.get("for"))

    def handle_endtag(self, tag):
        if tag == "table":
            self._table = False
        if tag in ("th", "td"):
            self._cell = None
        if tag in ("style", "li"):
            self._in = None

    def handle_data(self, data):
        if self._in == "style":
            self.style += data
        elif self._cell is not None:
            self._cell["text"] += data
        elif self._in == "li" and self.items:
            self.items[-1] += data

    def handle_entityref(self, name):  # convert_charrefs is on: not reached
        pass


def parse(page: str) -> SummaryTable:
    p = SummaryTable()
    p.feed(page)
    return p


def demo_like(n: int = 12) -> list[dict]:
    """Rows with every column a `ddlsim run` summary has (the demo's), long run ids included."""
    rows = []
    for i in range(n):
        proto = ("hardsync", "softsync", "async")[i % 3]
        lam = (1, 4, 16, 30)[i % 4]
        rows.append({"run_id": f"{proto}{'1' if proto == 'softsync' else ''}-l{lam}-m128-{i:08x}", "protocol": proto,
                     "learners": lam, "minibatch": 128, "softsync_n": 1 if proto == "softsync" else None,
                     "optimizer.lr_policy": ("constant", "per_gradient")[i % 2], "gradients": 2160, "updates": 2160,
                     "sim_time_s": 22.21906351629735 / lam, "gradients_per_s": 97.21 * lam,
                     "staleness_mean": 28.883333 if proto == "async" else 0.0, "staleness_p50": 29.0,
                     "staleness_p99": 44.0, "staleness_max": 61.0, "server_utilization": 0.27734,
                     "server_wait_mean_s": 0.00123, "final_test_error": 0.01 + 0.037 * ((i * 5) % 12),
                     "best_test_error": 0.01, "time_to_target_s": 2.1618497 / lam if i % 4 else None,
                     "diverged": False, "did_not_learn": i % 6 == 5, "link_in_utilization": 0.312,
                     "link_out_utilization": 0.5431, "compute_utilization": 0.9123,
                     "sim_id": f"sim-{proto}-l{lam}-m128-{i:010x}", "diverged_at_update": None, "error": None,
                     "wall_s": 0.12345})
    return rows


def test_report_table_leads_with_what_identifies_and_what_was_measured(tmp_path: Path) -> None:
    rows = demo_like()
    Table(rows).write_csv(tmp_path / "summary.csv")
    page = parse(report_html(load_results(tmp_path), rendered=[]))
    shown = [h for h in page.heads if "more" not in h["class"].split()]
    names = [h["title"] for h in shown]
    assert names == ["run_id", "protocol", "softsync_n", "learners", "minibatch", "optimizer.lr_policy",
                     "final_test_error", "best_test_error", "time_to_target_s", "sim_time_s", "staleness_mean",
                     "diverged", "did_not_learn"]
    collapsed = {h["title"] for h in page.heads} - set(names)
    assert {"gradients", "sim_id", "wall_s", "staleness_p99", "compute_utilization"} <= collapsed
    # the shown columns fit the page's 1,200 px column less its padding (1,168 px) at its 0.8 rem
    # (12.8 px) table font: at most 0.6 em a character, 1 rem of padding a cell, headings may
    # wrap between words
    k = {h["title"]: i for i, h in enumerate(page.heads)}
    width = 0.0
    for name in names:
        cells = [r["cells"][k[name]]["text"] for r in page.rows]
        heading = max(len(w) for w in page.heads[k[name]]["text"].rstrip("▲▼").split())
        width += 0.6 * 12.8 * max(heading, *(len(c) for c in cells)) + 16
    assert width <= 1168, width


@pytest.mark.parametrize("column", ["final_test_error", "time_to_target_s", "protocol"])
def test_report_table_sorts_by_any_column_both_ways(tmp_path: Path, column: str) -> None:
    rows = demo_like()
    Table(rows).write_csv(tmp_path / "summary.csv")
    page = parse(report_html(load_results(tmp_path), rendered=[]))
    k = next(i for i, h in enumerate(page.heads) if h["title"] == column)
    assert page.heads[k]["for"] == [f"sort-{k}-a", f"sort-{k}-a", f"sort-{k}-d"]
    places = [dict(re.findall(r"--([ad]\d+):(\d+)", r["style"])) for r in page.rows]
    by_run = {r["run_id"]: r for r in rows}
    run_col = next(i for i, h in enumerate(page.heads) if h["title"] == "run_id")
    ids = [r["cells"][run_col]["text"] for r in page.rows]
    for d, reverse in (("a", False), ("d", True)):
        assert f"#sort-{k}-{d}:checked ~ .scroll td {{ order: var(--{d}{k}); }}" in page.style
        order = [ids[i] for i in sorted(range(len(ids)), key=lambda i: int(places[i][f"{d}{k}"]))]
        values = [by_run[rid][column] for rid in ids]
        present = sorted((v for v in values if v is not None), reverse=reverse)
        assert [by_run[rid][column] for rid in order] == present + [None] * (len(values) - len(present))
        assert sorted(int(p[f"{d}{k}"]) for p in places) == list(range(len(rows)))  # every place once


def run_row(rid: str, lam: int, err: float | None, t: float, ttt: float | None, **kw) -> dict:
    return {"run_id": rid, "protocol": "async", "learners": lam, "minibatch": 8, "sim_time_s": t,
            "final_test_error": err, "time_to_target_s": ttt, "diverged": False, "did_not_learn": False, **kw}


def highlights(root: Path, rows: list[dict], dataset: str | None = "digits") -> list[str]:
    """The report's list of findings and answers (the page without its figures)."""
    Table(rows).write_csv(root / "summary.csv")
    if dataset:
        (root / "scenario.json").write_text(json.dumps(
            {"name": "t", "target_error": 0.1, "base": {"workload": {"dataset": dataset, "target_error": 0.1}}}))
    return parse(report_html(load_results(root), rendered=[])).items


def test_shortest_run_is_one_that_reached_the_target(tmp_path: Path) -> None:
    rows = [run_row("quick-but-poor", 30, 0.469, 0.53, None), run_row("ok", 16, 0.05, 0.75, 0.6),
            run_row("slow", 1, 0.02, 5.0, 1.0), run_row("stuck", 64, 0.9, 0.2, None, did_not_learn=True)]
    items = highlights(tmp_path, rows)
    line = next(i for i in items if i.startswith("Shortest simulated run"))
    assert line == ("Shortest simulated run (its whole length, not a time to the same error) that reached the target "
                    "error: async λ=16 μ=8, 0.75 s (5.0 % final error)")
    none = [run_row("a", 30, 0.469, 0.53, None), run_row("b", 16, 0.3, 0.9, None)]
    items = highlights(tmp_path, none)
    assert ("Shortest simulated run (its whole length, not a time to the same error) that reached the target error: "
            "none of the 2 runs reached the target error") in items


def test_lowest_error_names_the_runs_tied_within_two_test_samples(tmp_path: Path) -> None:
    # digits: 360 test samples. 5, 6 and 7 wrong are within two samples of each other; 8 is not.
    rows = [run_row("five", 1, 5 / 360, 10.0, 1.0), run_row("six", 4, 6 / 360, 4.0, 1.0),
            run_row("seven", 2, 7 / 360, 8.0, 1.0), run_row("eight", 16, 8 / 360, 1.0, 0.5)]
    items = highlights(tmp_path, rows)
    line = next(i for i in items if i.startswith("Lowest final test error"))
    assert line.startswith("Lowest final test error: async λ=1 μ=8, 1.4 % after 10 s; tied with 2 other runs "
                           "within 2 test samples (0.6% of a 360-sample test set")
    assert "the shortest run of them (its whole length, not a speed): async λ=4 μ=8 (1.7% after 4 s)" in line
    assert "async λ=4 μ=8 (1.7%, 4 s); async λ=2 μ=8 (1.9%, 8 s)" in line and "λ=16" not in line
    # the test set's size unknown: only equal errors are ties
    (tmp_path / "unknown").mkdir()
    items = highlights(tmp_path / "unknown", rows, dataset=None)
    line = next(i for i in items if i.startswith("Lowest final test error"))
    assert "tied" not in line


# -- hand-edited results folders ------------------------------------------------------------------
def small_results(root: Path) -> list[dict]:
    rows = []
    for proto, sigma in (("hardsync", 0.0), ("async", 3.0)):
        for lam in (1, 4):
            for pol in ("constant", "per_gradient"):
                bad = proto == "async" and lam == 4 and pol == "constant"
                rows.append({"run_id": f"{proto}-l{lam}-{pol}", "protocol": proto, "learners": lam, "minibatch": 8,
                             "optimizer.lr_policy": pol, "updates": 100, "sim_time_s": 10.0 / lam,
                             "staleness_mean": sigma if lam > 1 else 0.0, "final_test_error": 0.9 if bad else 0.05,
                             "time_to_target_s": None if bad else 5.0 / lam, "diverged": False, "did_not_learn": bad})
    Table(rows).write_csv(root / "summary.csv")
    (root / "scenario.json").write_text(json.dumps({"name": "hand-edited", "target_error": 0.1}))
    return rows


def edit_cell(root: Path, column: str, text: str, line: int | None = None) -> None:
    """Replace ``column``'s cell on data ``line`` (1 = first row; None: every row) by ``text``."""
    with open(root / "summary.csv", newline="", encoding="utf-8") as f:
        table = list(csv.reader(f))
    c = table[0].index(column)
    for i, r in enumerate(table[1:], 1):
        if line is None or i == line:
            r[c] = text
    with open(root / "summary.csv", "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(table)


HUGE = "1" + "0" * 400  # beyond a float's range


def test_hand_edited_cells_are_read_as_missing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    small_results(tmp_path)
    edit_cell(tmp_path, "sim_time_s", HUGE, 1)
    edit_cell(tmp_path, "final_test_error", HUGE, 2)
    edit_cell(tmp_path, "learners", HUGE, 3)
    edit_cell(tmp_path, "learners", "many", 5)
    (tmp_path / "scenario.json").write_text('{"name": "x", "target_error": ' + HUGE + "}")
    assert main(["report", str(tmp_path)]) == 0 and main(["plot", str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    page = html.unescape((tmp_path / "report.html").read_text(encoding="utf-8"))
    for note in ("column 'sim_time_s', line 2: '100000000000000000000000…' is too large for a number",
                 "column 'final_test_error', line 3: '100000000000000000000000…' is too large for a number",
                 "column 'learners', line 4: '100000000000000000000000…' is too large for a number",
                 "column 'learners', line 6: 'many' is not a number"):
        assert note + "; read as missing" in page
    meta = re.search(r'<p class="meta">(.*?)</p>', page).group(1)
    assert "runs" in meta and "target error" not in meta  # the scenario's huge target: none
    assert (tmp_path / "figures" / "pareto.png").is_file()


@pytest.mark.parametrize("column, text", [("learners", ""), ("sim_time_s", "0")])
def test_a_column_emptied_or_zeroed_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture, column: str,
                                            text: str) -> None:
    small_results(tmp_path)
    edit_cell(tmp_path, column, text)
    assert main(["report", str(tmp_path)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert 'id="notes"' not in (tmp_path / "report.html").read_text(encoding="utf-8")  # nothing was unreadable


def test_staleness_finding_survives_a_zero_time(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # hardsync's run time edited to 0: the comparison "in N % less time" cannot be made, the rest can
    small_results(tmp_path)
    edit_cell(tmp_path, "sim_time_s", "0", 3)  # hardsync λ = 4, constant
    edit_cell(tmp_path, "sim_time_s", "0", 4)  # hardsync λ = 4, per_gradient
    assert main(["report", str(tmp_path)]) == 0
    items = parse((tmp_path / "report.html").read_text(encoding="utf-8")).items
    finding = next(i for i in items if "does not learn" in i)
    assert finding.startswith("async with a constant learning rate does not learn at λ = 4, μ = 8 (90.0 % test error")
    assert "less time" not in finding and "more time" not in finding


@pytest.mark.parametrize("command", ["report", "plot"])
def test_a_header_field_beyond_the_limit_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                     command: str) -> None:
    small_results(tmp_path)
    text = (tmp_path / "summary.csv").read_text(encoding="utf-8")
    (tmp_path / "summary.csv").write_text(text.replace("run_id,", "run_id," + "x" * (2 << 20) + ",", 1))
    assert main([command, str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("ddlsim: error: ") and "summary.csv" in err
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "figures").exists()


# -- advise's table -------------------------------------------------------------------------------
def advice(n: int, tmp_path: Path):
    from ddlsim.scenarios.advise.model import Advice, Candidate

    cands = []
    for i in range(n):
        row = {"run_id": f"p{i}", "protocol": "async", "learners": i + 1, "minibatch": 8, "sim_time_s": 1.0 + i,
               "staleness_mean": float(i), "staleness_max": float(2 * i), "updates": 100}
        c = Candidate(i, {"optimizer": {"lr_policy": "per_gradient"}, "workload": {"epochs": 2,
                                                                                   "samples_per_epoch": 800}},
                      row, f"async λ={i + 1} μ=8 per_gradient", evals=[(0.0, 0.0), (0.5 + i / 2, 1.0), (1.0 + i, 2.0)])
        c.status, c.rank = ("replayed" if i == 0 else "not replayed"), i + 1
        cands.append(c)
    first = cands[0]
    first.error, first.at_s, first.at_epoch = 0.05, 1.0, 2.0
    return Advice("t", 2.0, None, 1, tmp_path, cands, [first], first, None)


def test_advise_prints_the_top_rows_and_says_where_the_rest_are(tmp_path: Path) -> None:
    from ddlsim.scenarios.advise.render import render

    adv = advice(14, tmp_path)
    text = render(adv, top=5).splitlines()
    head = next(i for i, line in enumerate(text) if line.startswith("#  configuration"))
    shown = text[head + 1:head + 6]
    assert [re.search(r"λ=\d+", line).group() for line in shown] == ["λ=1", "λ=2", "λ=3", "λ=4", "λ=5"]
    assert text[head + 6] == (f"… 9 more rows not shown (--top 5; --top 0 prints every row); all 14 are in "
                              f"{tmp_path / 'advice.csv'} and {tmp_path / 'advice.txt'}")
    full = render(adv).splitlines()
    assert sum(line.startswith("   async λ=") or line.startswith("1  async") for line in full) == 14
    assert render(adv, top=14) == render(adv)  # nothing hidden, nothing said


def test_advise_refuses_a_negative_top_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "never"
    assert main(["advise", "demo", "--budget-s", "1", "--top", "-1", "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--top = -1" in err
    assert not out.exists()


def test_numbers_at_the_float_limit_in_hand_edited_tables_are_no_traceback(tmp_path) -> None:
    # truth: the guarantee of docs/robustness.md (hand-edited results folders: no traceback)
    import csv as _csv
    import subprocess
    import sys

    (tmp_path / "s.toml").write_text('name = "edge"\nreplicates = 2\n[workload]\nepochs = 0.3\n[cluster]\n'
                                     'learners = 2\nminibatch = 8\n[protocol]\nname = "async"\n')
    out = tmp_path / "o"
    run = [sys.executable, "-m", "ddlsim"]
    proc = subprocess.run(run + ["run", str(tmp_path / "s.toml"), "--out", str(out), "--quiet", "--device", "cpu",
                                 "--no-report"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for name, col in (("summary.csv", "final_test_error"), ("summary.csv", "staleness_mean"),
                      ("curves.csv", "test_error")):
        rows = list(_csv.reader(open(out / name, newline="")))
        rows[1][rows[0].index(col)] = "1e308"
        with open(out / name, "w", newline="") as f:
            _csv.writer(f).writerows(rows)
    for cmd in ("plot", "report"):
        proc = subprocess.run(run + [cmd, str(out)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
