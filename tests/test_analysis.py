"""Tests of ddlsim.analysis: Table, labels, derived metrics, plots and write_figures."""

from __future__ import annotations

import io
import math
import os

os.environ.setdefault("MPLBACKEND", "Agg")

import pytest
from matplotlib.figure import Figure

from ddlsim.analysis import plots
from ddlsim.analysis.figures import FIGURES, write_figures
from ddlsim.analysis.metrics import pareto_front, sim_measured_pairs, speedups
from ddlsim.analysis.results import load_results
from ddlsim.analysis.table import Table, config_key, label, labels, varying_keys


# -- helpers -------------------------------------------------------------------------
def run(rid: str, protocol: str, lam: int, mu: int, **kw) -> dict:
    row = {"run_id": rid, "protocol": protocol, "learners": lam, "minibatch": mu,
           "softsync_n": kw.pop("n", None), "sim_time_s": 100.0 / lam}
    row.update(kw)
    return row


def summary_rows() -> list[dict]:
    """Three protocols, λ ∈ {1, 2, 4}, with errors, times to target, a measured run."""
    rows = []
    for proto, lams, n in (("hardsync", (1, 2, 4), None), ("softsync", (2, 4), 2),
                           ("async", (1, 2, 4), None)):
        for lam in lams:
            err = 0.10 + 0.01 * lam + (0.3 if proto == "async" and lam == 4 else 0.0)
            rows.append(run(f"{proto}{n or ''}-l{lam}", proto, lam, 8, n=n,
                            **{"optimizer.lr_policy": "per_gradient"},
                            final_test_error=err, best_test_error=err - 0.01,
                            time_to_target_s=None if err > 0.3 else 50.0 / lam,
                            diverged=err > 0.3, staleness_mean=float(n or 0)))
    rows[1]["measured_sim_time_s"] = 55.0
    rows[2]["measured_sim_time_s"] = 22.0
    return rows


def curve_rows(summary: list[dict]) -> list[dict]:
    return [{"run_id": r["run_id"], "epoch": e, "updates": 10 * e,
             "sim_time_s": r["sim_time_s"] * e / 4, "test_error": 0.9 / e + r["final_test_error"] - 0.225,
             "train_loss": 1.0 / e} for r in summary for e in range(1, 5)]


def stale_rows() -> list[dict]:
    return [{"run_id": "softsync2-l4", "protocol": "softsync", "learners": 4, "softsync_n": 2,
             "staleness": s, "count": c} for s, c in ((0, 2), (1, 5), (2, 9), (3, 4), (4, 1))] + \
           [{"run_id": "hardsync-l4", "protocol": "hardsync", "learners": 4, "softsync_n": None,
             "staleness": 0, "count": 40}]


def make_results(root, with_staleness: bool = True):
    s = summary_rows()
    Table(s).write_csv(root / "summary.csv")
    Table(curve_rows(s)).write_csv(root / "curves.csv")
    if with_staleness:
        for (rid,), t in Table(stale_rows()).group_by("run_id").items():
            Table([{"staleness": r["staleness"], "count": r["count"]} for r in t]).write_csv(
                root / "runs" / rid / "staleness.csv")
    return root


def drawn(fig: Figure) -> bytes:
    """Render a figure (catches errors that only happen at draw time)."""
    assert isinstance(fig, Figure)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    assert buf.getbuffer().nbytes > 0
    return buf.getvalue()


# -- Table ---------------------------------------------------------------------------
def test_table_csv_round_trip(tmp_path):
    rows = [
        {"run_id": "a-1", "learners": 4, "lr": 0.1, "tiny": 1e-9, "ok": True, "t": None,
         "name": "x,y \"q\"", "big": 12345678901234, "neg": -2.5},
        {"run_id": "b-2", "learners": 30, "lr": 1 / 3, "tiny": 2.5e-300, "ok": False, "t": 7.0,
         "name": "", "big": 0, "neg": float("inf")},
    ]
    rows[1]["name"] = None  # an empty cell reads back as None
    path = Table(rows).write_csv(tmp_path / "sub" / "t.csv")
    back = Table.read_csv(path)
    assert back.columns == list(rows[0])
    assert back.rows == rows
    assert type(back.rows[0]["learners"]) is int and type(back.rows[1]["t"]) is float
    assert back.rows[0]["ok"] is True and back.rows[1]["ok"] is False
    assert [p.name for p in path.parent.iterdir()] == ["t.csv"]  # no temporary file left


def test_table_typing_is_per_column(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("run_id,x,flag,extra\n1e5,1,True,\nabc,2.5,False,\n,,,\n")
    t = Table.read_csv(p)
    assert t.column("run_id") == ["1e5", "abc", None]  # mixed column keeps its text
    assert t.column("x") == [1, 2.5, None]
    assert t.column("flag") == [True, False, None]
    assert t.column("extra") == [None, None, None] and not t.has("extra")
    assert t.column("absent") == [None, None, None]


def test_table_write_is_atomic_replace(tmp_path):
    p = tmp_path / "s.csv"
    Table([{"a": 1}]).write_csv(p)
    Table([{"a": 2}, {"a": 3, "b": "z"}]).write_csv(p)
    assert Table.read_csv(p).rows == [{"a": 2, "b": None}, {"a": 3, "b": "z"}]
    assert sorted(x.name for x in tmp_path.iterdir()) == ["s.csv"]


def test_filter_group_by_sort():
    t = Table(summary_rows())
    assert len(t.filter(protocol="async")) == 3
    assert len(t.filter(lambda r: r["learners"] > 1, protocol="hardsync")) == 2
    groups = t.group_by("protocol")
    assert list(groups) == [("hardsync",), ("softsync",), ("async",)]
    assert [len(g) for g in groups.values()] == [3, 2, 3]
    assert t.sort_by("learners").column("learners")[:2] == [1, 1]


# -- labels ----------------------------------------------------------------------------
def test_label_examples():
    row = run("x", "async", 30, 4, **{"optimizer.lr_policy": "per_gradient", "optimizer.lr": 0.05})
    assert label(row, ["optimizer.lr_policy"]) == "async λ=30 μ=4 per_gradient"
    assert label(row) == "async λ=30 μ=4 per_gradient lr=0.05"
    assert label(run("y", "softsync", 30, 4, n=15), []) == "15-softsync λ=30 μ=4"
    assert label(run("y", "softsync", 30, 4, n=15), [], omit=("learners",)) == "15-softsync μ=4"
    assert label({"run_id": "orphan"}) == "orphan"


def test_labels_show_only_varying_keys_and_are_unique():
    rows = [run(rid, "async", 8, 4, **{"optimizer.lr_policy": p, "optimizer.lr": 0.1})
            for rid, p in (("a", "constant"), ("b", "per_gradient"))]
    rows.append(run("c", "async", 8, 4, **{"optimizer.lr_policy": "constant", "optimizer.lr": 0.1}))
    assert varying_keys(rows) == ["optimizer.lr_policy"]
    names = labels(rows)
    assert names["a"] == "async λ=8 μ=4 constant [a]"
    assert names["c"] == "async λ=8 μ=4 constant [c]"
    assert names["b"] == "async λ=8 μ=4 per_gradient" and "lr=" not in names["a"]
    assert labels([rows[1]])["b"] == "async λ=8 μ=4"


def test_config_key_ignores_softsync_n_outside_softsync():
    a = run("a", "async", 8, 4, n=8)
    b = run("b", "async", 8, 4, n=None, sim_time_s=3.0)
    assert config_key(a) == config_key(b)
    assert config_key(run("c", "softsync", 8, 4, n=2)) != config_key(run("d", "softsync", 8, 4, n=4))


# -- metrics -----------------------------------------------------------------------------
def test_pareto_front_hand_computed():
    pts = {"a": (1, 9), "b": (2, 5), "c": (2, 6), "d": (3, 5), "e": (4, 2), "f": (4, 2),
           "g": (5, 3), "h": (6, 1), "i": (7, 1), "j": (None, 0), "k": (0.5, float("nan"))}
    rows = [{"run_id": k, "t": x, "e": y} for k, (x, y) in pts.items()]
    # a: fastest; b beats c (same time) and d (same error); e and f tie; g loses to e;
    # h is the most accurate; i loses to h; j and k lack a value.
    assert [r["run_id"] for r in pareto_front(rows, "t", "e")] == ["a", "b", "e", "f", "h"]
    assert pareto_front([], "t", "e") == []
    assert [r["run_id"] for r in pareto_front(rows[:1], "t", "e")] == ["a"]
    # the demo's two hardsync means of 2.5 %, one summed to 0.024999999999999998 and one to
    # 0.025000000000000005: the slower one is no improvement, a last-bit tie is equal
    tie = [{"run_id": "fast", "t": 1.15, "e": 0.025000000000000005},
           {"run_id": "slow", "t": 1.99, "e": 0.024999999999999998},
           {"run_id": "same", "t": 1.15 + 1e-15, "e": 0.025}]
    assert [r["run_id"] for r in pareto_front(tie, "t", "e")] == ["fast", "same"]
    # the same in time: one bit slower and far more accurate dominates
    bit = [{"run_id": "A", "t": 10.0, "e": 0.30}, {"run_id": "B", "t": 10.0 * (1 + 1e-15), "e": 0.20}]
    assert [r["run_id"] for r in pareto_front(bit, "t", "e")] == ["B"]


def test_speedups_hand_computed():
    rows = [run("h1", "hardsync", 1, 8, sim_time_s=120.0), run("h2", "hardsync", 2, 8, sim_time_s=80.0),
            run("h4", "hardsync", 4, 8, sim_time_s=40.0),
            run("h4b", "hardsync", 4, 8, sim_time_s=20.0),  # a second seed: averaged (30 s)
            run("s2", "softsync", 2, 8, n=2, sim_time_s=50.0),  # baseline: the λ=1 runs at μ=8
            run("s4", "softsync", 4, 8, n=2, sim_time_s=24.0),
            run("a2", "async", 2, 16, sim_time_s=10.0)]       # no λ=1 run at μ=16: skipped
    got = {(d["series"], d["learners"]): d["speedup"] for d in speedups(rows)}
    assert got == pytest.approx({("hardsync μ=8", 1): 1.0, ("hardsync μ=8", 2): 1.5,
                                 ("hardsync μ=8", 4): 4.0, ("2-softsync μ=8", 2): 2.4,
                                 ("2-softsync μ=8", 4): 5.0})
    tt = [dict(r, time_to_target_s=r["sim_time_s"] / 2) for r in rows]
    tt[1]["time_to_target_s"] = None
    got = {(d["series"], d["learners"]): d["speedup"] for d in speedups(tt, "time_to_target_s")}
    assert ("hardsync μ=8", 2) not in got and got[("hardsync μ=8", 4)] == pytest.approx(4.0)


def test_sim_measured_pairs_both_forms():
    rows = [run("a", "async", 4, 8, sim_time_s=100.0, measured_sim_time_s=80.0, **{"workload.epochs": 10}),
            run("b", "async", 8, 8, sim_time_s=60.0, source="simulated"),
            run("c", "async", 8, 8, sim_time_s=50.0, source="measured"),
            run("d", "async", 16, 8, sim_time_s=40.0, source="measured")]  # nothing to compare
    pairs = {p["run_id"]: p for p in sim_measured_pairs(rows)}
    assert set(pairs) == {"a", "c"}
    assert pairs["a"]["simulated"] == 10.0 and pairs["a"]["measured"] == 8.0 and pairs["a"]["per_epoch"]
    assert pairs["a"]["rel_error"] == pytest.approx(0.25)
    assert pairs["c"]["simulated"] == 60.0 and pairs["c"]["rel_error"] == pytest.approx(0.2)


# -- plots ---------------------------------------------------------------------------------
def test_every_plot_draws_from_small_tables():
    s = Table(summary_rows())
    c = Table(curve_rows(s.rows))
    figs = {
        "error_vs_time": plots.error_vs_time(c, s, target=0.15),
        "heatmap": plots.heatmap(s),
        "heatmap_ttt": plots.heatmap(s, value="time_to_target_s"),
        "staleness": plots.staleness_histograms(Table(stale_rows())),
        "speedup": plots.speedup(s),
        "speedup_ttt": plots.speedup(s, metric="time_to_target_s"),
        "pareto": plots.pareto(s),
        "sim_vs_measured": plots.simulated_vs_measured(s),
    }
    for name, fig in figs.items():
        assert not plots.is_no_data(fig), name
        drawn(fig)
    assert figs["error_vs_time"].axes[0].get_xlabel() == "simulated wall-clock time (s)"
    # hardsync's σ = 0 throughout gets no panel, only a line in the title
    assert len(figs["staleness"].axes) == 1 and figs["staleness"].get_suptitle().endswith(
        "not shown: 1 run with σ = 0 for every gradient (hardsync λ = 4)")


@pytest.mark.parametrize("n", [1, 2])
def test_plots_with_one_or_two_runs(n):
    s = Table(summary_rows()[:n])
    c = Table(curve_rows(s.rows))
    for fig in (plots.error_vs_time(c, s), plots.error_vs_time(c), plots.heatmap(s),
                plots.speedup(s), plots.pareto(s), plots.simulated_vs_measured(s)):
        drawn(fig)
    assert not plots.is_no_data(plots.heatmap(s)) and not plots.is_no_data(plots.pareto(s))


def test_many_runs_use_panels():
    rows = [run(f"{p}-{lam}-{mu}", p, lam, mu, final_test_error=0.1 if p == "hardsync" else 0.2)
            for p in ("hardsync", "async") for lam in (1, 2, 4, 8) for mu in (4, 16)]
    fig = plots.error_vs_time(Table(curve_rows(rows)), Table(rows))
    assert len(fig.axes) == 2 and [a.get_title() for a in fig.axes] == ["async", "hardsync"]


def test_error_vs_time_log_axis_leaves_out_time_zero():
    rows = [{"run_id": f"r{lam}", "sim_time_s": t / lam, "test_error": 0.9 - t / 2000}
            for lam in (1, 64) for t in (0.0, 10.0, 100.0, 1000.0)]
    fig = plots.error_vs_time(Table(rows))
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    assert all(min(line.get_xdata()) > 0 for line in ax.lines if len(line.get_xdata()) > 2)
    assert plots.error_vs_time(Table(rows), logx=False).axes[0].get_xscale() == "linear"
    drawn(fig)


def test_plots_say_no_data_instead_of_raising():
    empty = Table()
    bare = Table([{"run_id": "x", "protocol": "async"}])
    nones = Table([run("x", "async", 1, 4, sim_time_s=None, final_test_error=None,
                       time_to_target_s=None)])
    for fig in (plots.error_vs_time(empty), plots.error_vs_time(bare, bare),
                plots.error_vs_time(Table([{"run_id": "x", "sim_time_s": None, "test_error": 0.5}])),
                plots.heatmap(empty), plots.heatmap(bare), plots.heatmap(nones),
                plots.heatmap(nones, value="time_to_target_s"),
                plots.staleness_histograms(empty), plots.staleness_histograms(bare),
                plots.speedup(empty), plots.speedup(nones), plots.speedup(bare, metric="nope"),
                plots.pareto(empty), plots.pareto(nones), plots.pareto(bare, x="nope"),
                plots.simulated_vs_measured(empty), plots.simulated_vs_measured(nones)):
        assert plots.is_no_data(fig)
        drawn(fig)


def test_heatmap_marks_missing_and_unreached_cells():
    rows = [run("a", "hardsync", 1, 4, time_to_target_s=10.0), run("b", "hardsync", 2, 8, time_to_target_s=None),
            run("c", "hardsync", 2, 4, time_to_target_s=float("nan"))]
    fig = plots.heatmap(Table(rows), value="time_to_target_s")
    texts = sorted(t.get_text() for t in fig.axes[0].texts)
    assert texts == ["10 s", "—", "—"]  # (1, 8) was not run: blank, no text
    image = fig.axes[0].images[0].get_array()
    assert image.mask.sum() == 3 and not math.isnan(image[0, 0])


# -- files ------------------------------------------------------------------------------
def test_write_figures_writes_every_applicable_figure(tmp_path):
    root = make_results(tmp_path / "res")
    paths = write_figures(root)
    names = {p.stem for p in paths}
    assert names == {f.name for f in FIGURES}  # every figure applies to this data
    assert {p.suffix for p in paths} == {".png", ".svg"} and len(paths) == 2 * len(FIGURES)
    for p in paths:
        assert p.parent == root / "figures" and p.is_file() and p.stat().st_size > 1000
    assert paths[0].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"<svg" in (root / "figures" / "pareto.svg").read_bytes()[:2000]


def test_write_figures_skips_absent_data(tmp_path):
    root = tmp_path / "res"
    rows = [run("a", "hardsync", 1, 4), run("b", "hardsync", 2, 4)]  # simulator only
    Table(rows).write_csv(root / "summary.csv")
    paths = write_figures(root, tmp_path / "out", formats=("png",))
    assert sorted(p.name for p in paths) == ["heatmap_sim_time.png", "speedup.png"]
    assert all(p.parent == tmp_path / "out" for p in paths)


def test_load_results(tmp_path):
    root = make_results(tmp_path)
    (root / "scenario.toml").write_text('name = "tiny"\n[workload]\ntarget_error = 0.2\n')
    res = load_results(root)
    assert res.name == "tiny" and res.target_error == 0.2
    assert len(res.summary) == 8 and len(res.curves) == 32
    st = res.staleness.filter(run_id="softsync2-l4")
    assert st.column("count") == [2, 5, 9, 4, 1] and set(st.column("softsync_n")) == {2}
    with pytest.raises(FileNotFoundError, match="summary.csv"):
        load_results(tmp_path / "nothing")


def test_load_results_reads_the_runners_scenario_json(tmp_path):
    root = make_results(tmp_path / "res", with_staleness=False)
    toml = tmp_path / "sweep.toml"
    toml.write_text('name = "from-toml"\n[workload]\ntarget_error = 0.07\n')
    (root / "scenario.json").write_text(f'{{"name": "sweep", "path": "{toml}", "axes": []}}')
    res = load_results(root)
    assert res.name == "sweep" and res.target_error == 0.07 and len(res.staleness) == 0
    (root / "scenario.json").write_text('{"name": "sweep", "path": "/nonexistent.toml"}')
    assert load_results(root).target_error is None


def test_a_failing_figure_is_skipped_with_a_warning(tmp_path, monkeypatch):
    from ddlsim.analysis import figures

    def broken(results):
        raise RuntimeError("boom")

    spec = figures.FigureSpec("broken", "Broken", "never drawn", broken)
    monkeypatch.setattr(figures, "FIGURES", (spec, figures.FIGURES[-1]))
    root = make_results(tmp_path / "res")
    with pytest.warns(UserWarning, match="'broken' skipped: RuntimeError: boom"):
        paths = figures.write_figures(root, formats=("png",))
    assert [p.name for p in paths] == ["simulated_vs_measured.png"]


def test_heatmap_marks_failed_runs():
    rows = [run("a", "hardsync", 1, 4, final_test_error=0.2),
            run("b", "hardsync", 2, 4, final_test_error=None, error="RuntimeError: x")]
    texts = sorted(t.get_text() for t in plots.heatmap(Table(rows)).axes[0].texts)
    assert texts == ["20.0%", "failed"]
