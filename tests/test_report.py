"""Tests of ddlsim.analysis.report: one self-contained, escaped HTML page."""

from __future__ import annotations

import base64
import html
import os
import re
from html.parser import HTMLParser

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest

from ddlsim.analysis import write_report
from ddlsim.analysis.figures import FIGURES
from ddlsim.analysis.table import Table

NASTY_ID = 'async-l2-<b>&"x"'


class Page(HTMLParser):
    """Collects every URL-bearing attribute, the images and the element ids."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.images: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            if name == "id":
                self.ids.add(value)
            if any(k in name for k in ("src", "href", "action", "poster", "data", "background")):
                self.refs.append((tag, name, value or ""))
            if tag == "img" and name == "src":
                self.images.append(value)


def make_results(root, *, measured: bool = True, name: str | None = "tiny-sweep"):
    rows, curves = [], []
    for proto, lam, n in (("hardsync", 1, None), ("hardsync", 2, None), ("softsync", 2, 2),
                          ("async", 1, None), ("async", 2, None)):
        rid = NASTY_ID if (proto, lam) == ("async", 2) else f"{proto}-l{lam}"
        err = 0.1 + 0.02 * lam + (0.01 if n else 0.0)
        rows.append({"run_id": rid, "protocol": proto, "learners": lam, "minibatch": 8,
                     "softsync_n": n, "sim_time_s": 100.0 / lam, "final_test_error": err,
                     "time_to_target_s": 60.0 / lam, "diverged": False,
                     "measured_sim_time_s": 90.0 / lam if measured and proto == "hardsync" else None})
        curves += [{"run_id": rid, "epoch": e, "sim_time_s": 25.0 * e / lam,
                    "test_error": err + 0.5 / e, "train_loss": 1.0 / e} for e in range(1, 5)]
    Table(rows).write_csv(root / "summary.csv")
    Table(curves).write_csv(root / "curves.csv")
    Table([{"staleness": s, "count": c} for s, c in ((0, 3), (1, 6), (2, 2))]).write_csv(
        root / "runs" / "softsync-l2" / "staleness.csv")
    if name:
        (root / "scenario.toml").write_text(f'name = "{name}"\n[workload]\ntarget_error = 0.15\n')
    return rows


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("res")
    rows = make_results(root)
    path = write_report(root)
    return root, rows, path, path.read_text(encoding="utf-8")


def test_report_is_written_next_to_the_results(report):
    root, _, path, text = report
    assert path == root / "report.html" and path.stat().st_size > 10_000
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert not [p for p in root.iterdir() if p.name.endswith(".tmp")]


def test_report_references_no_file_or_url(report):
    text = report[3]
    page = Page()
    page.feed(text)
    assert page.refs, "expected the figures' src attributes"
    for tag, attr, value in page.refs:
        assert value.startswith(("data:", "#")), (tag, attr, value[:80])
        if value.startswith("#"):
            assert value[1:] in page.ids, value  # in-page anchors resolve
    outside_data = re.sub(r"data:[^\"'\s)]+", "", text)
    for bad in ("http://", "https://", "file:", "url(", "@import", "<link", "<script"):
        assert bad not in outside_data, bad


def test_report_contains_every_figure(report):
    text = report[3]
    page = Page()
    page.feed(text)
    assert {f"fig-{f.name}" for f in FIGURES} <= page.ids  # every figure applies here
    assert len(page.images) == len(FIGURES)
    for f in FIGURES:
        assert html.escape(f.explanation) in text
    for src in page.images:
        head, _, data = src.partition(",")
        assert head == "data:image/svg+xml;base64"
        assert b"<svg" in base64.b64decode(data, validate=True)[:2000]


def test_report_lists_every_run_escaped(report):
    _, rows, _, text = report
    for r in rows:
        assert f'<td class="text">{html.escape(r["run_id"])}</td>' in text
    assert "<b>&" not in text and NASTY_ID not in text
    assert "tiny-sweep" in text and "<title>ddlsim report: tiny-sweep</title>" in text


def test_report_of_a_simulation_only_directory(tmp_path):
    root = tmp_path / "sim-only"
    Table([{"run_id": "hardsync-l1", "protocol": "hardsync", "learners": 1, "minibatch": 4,
            "sim_time_s": 10.0},
           {"run_id": "hardsync-l2", "protocol": "hardsync", "learners": 2, "minibatch": 4,
            "sim_time_s": 6.0}]).write_csv(root / "summary.csv")
    out = write_report(root, tmp_path / "elsewhere" / "r.html", image_format="png")
    text = out.read_text(encoding="utf-8")
    page = Page()
    page.feed(text)
    assert out.parent.name == "elsewhere"
    assert page.ids >= {"fig-speedup", "fig-heatmap_sim_time"} and "fig-pareto" not in page.ids
    assert all(src.startswith("data:image/png;base64,") for src in page.images)
    assert "hardsync-l1" in text and "hardsync-l2" in text
    assert "ddlsim report: sim-only" in text  # no scenario file: the directory names it


def test_report_refuses_a_directory_without_results(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_report(tmp_path)


def test_report_out_never_names_a_results_file(tmp_path, capsys):
    # a report is one HTML file: --out naming the folder's summary.csv (or any file that is not
    # .html) is one line, exit 2, and the table is as it was
    from ddlsim.scenarios.cli import main

    root = tmp_path / "res"
    make_results(root)
    before = (root / "summary.csv").read_bytes()
    for target in (root / "summary.csv", root / "runs" / "softsync-l2" / "staleness.csv", tmp_path / "r.txt"):
        assert main(["report", str(root), "--out", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "a report is one HTML file" in err
    assert (root / "summary.csv").read_bytes() == before and not (tmp_path / "r.txt").exists()
    assert main(["report", str(root), "--out", str(tmp_path / "r.HTML")]) == 0


def test_seeds_that_agree_exactly_give_no_interval(tmp_path):
    # three seeds at 7/360 each: a Student-t interval of zero width is no interval; the varied
    # configuration keeps its interval (the t-interval of 0.01, 0.02, 0.03: 2 ± 4.303·0.01/√3 · … %)
    from ddlsim.analysis.report import _configurations_table

    rows = [{"run_id": f"a-{s}", "protocol": "hardsync", "learners": 4, "minibatch": 8, "seed": s,
             "final_test_error": 7 / 360, "sim_time_s": 1.0} for s in range(3)]
    rows += [{"run_id": f"b-{s}", "protocol": "async", "learners": 4, "minibatch": 8, "seed": s,
              "final_test_error": e, "sim_time_s": 1.0} for s, e in enumerate((0.01, 0.02, 0.03))]
    page = _configurations_table(Table(rows))
    assert "none: all 3 seeds at 1.9%" in page and "1.9%–1.9%" not in page
    assert "–4.5%" in page  # 2 % + 4.303 · 1 % / √3 = 4.48 %
