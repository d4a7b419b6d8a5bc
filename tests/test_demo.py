"""The README's first command, run once through the CLI, and what a user reads from it: the
files and their modes, the rows, the findings, the figures; then `advise` on the same sweep
against the demo's full replay (every point replayed: the truth)."""

from __future__ import annotations

import csv
import re
import stat
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "ddlsim"]
ROOT = Path(__file__).resolve().parents[1]


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("demo") / "demo"
    proc = subprocess.run(CLI + ["run", "demo", "--out", str(out), "--quiet", "--device", "cpu"],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, proc


def test_readme_demo_runs_end_to_end(demo) -> None:
    # Truths: hardsync has σ = 0, so its two learning-rate policies are the same run; Rudra's
    # finding — at λ = 30 async with a constant rate does not learn (error near chance:
    # flagged), dividing it by each gradient's staleness does; with μλ = 3840 > the 1437
    # training images hardsync makes 8 updates in 20 epochs and errs more than at μλ = 8.
    out, proc = demo
    assert f"report: {out / 'report.html'}" in proc.stdout
    assert f"figures: 16 files in {out / 'figures'}" in proc.stdout
    every = {(r["protocol"], r["optimizer.lr_policy"], int(r["learners"]), int(r["minibatch"]), int(r["seed"])): r
             for r in read_csv(out / "summary.csv")}
    assert len(every) == 2 * 3 * 4 * 3 * 3 and all(r["error"] == "" for r in every.values())  # 3 seeds each
    for seed in (0, 1, 2):
        rows = {k[:4]: r for k, r in every.items() if k[4] == seed}
        err = {k: float(r["final_test_error"]) for k, r in rows.items()}
        for lam in (1, 4, 16, 30):
            for mu in (8, 32, 128):
                assert err[("hardsync", "constant", lam, mu)] == err[("hardsync", "per_gradient", lam, mu)]
        assert err[("async", "constant", 30, 8)] > 0.7 and err[("async", "per_gradient", 30, 8)] < 0.1
        assert rows[("async", "constant", 30, 8)]["did_not_learn"] == "True"
        assert rows[("async", "per_gradient", 30, 8)]["did_not_learn"] == "False"
        assert err[("hardsync", "constant", 30, 128)] > err[("hardsync", "constant", 1, 8)] + 0.1
    assert len(read_csv(out / "configurations.csv")) == 72
    assert "does not learn at λ = 30, μ = 8" in proc.stdout
    # "error tracks μλ" only where no seed shows a U: 1-softsync's mean final error by μλ, per seed,
    # lowest at an interior μλ by more than two test samples below both ends
    def u_in(policy: str, seed: int) -> bool:
        by: dict[int, list[float]] = {}
        for (proto, pol, lam, mu, s), r in every.items():
            if proto == "softsync" and pol == policy and s == seed:
                by.setdefault(lam * mu, []).append(float(r["final_test_error"]))
        means = [sum(v) / len(v) for _, v in sorted(by.items())]
        low = min(range(len(means)), key=means.__getitem__)
        return 0 < low < len(means) - 1 and min(means[0], means[-1]) - means[low] > 2 / 360
    for policy in ("constant", "per_gradient"):
        said = f"1-softsync {policy} (η²" in proc.stdout
        assert not (said and any(u_in(policy, s) for s in (0, 1, 2)))
    page = (out / "report.html").read_text()
    assert "async with a constant learning rate does not learn at λ = 30, μ = 8" in page
    figs = sorted(p.name for p in (out / "figures").iterdir())
    assert len(figs) == 16 and {p.rsplit(".", 1)[1] for p in figs} == {"png", "svg"}
    for f in [out / "summary.csv", out / "curves.csv", out / "report.html", out / "figures" / figs[0]]:
        assert stat.S_IMODE(f.stat().st_mode) == 0o644, f
    assert len(read_csv(out / "curves.csv")) >= 72 * 3 * 20


NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
POINTS = 2.0  # 7 of the 360 test samples, in points of test error


def same_but_rounding(note: str, run: str) -> list[str]:
    """How a note made on another machine (other CPU kernels: another rounding of the same
    draws) and this run disagree beyond what docs/demo.md says rounding may change: every line
    the same with its numbers masked, but the note's statement of its machine; every table cell
    the same but the final error (mean and the seeds' range within POINTS where every seed
    learned, unchecked where none did) and the seconds to the target (its count of seeds the
    same); a percentage elsewhere (the findings) within POINTS, seconds unchecked."""
    from ddlsim.scenarios import demodoc

    wrong = []
    a, b = note.splitlines(), run.splitlines()
    if len(a) != len(b):
        return [f"{len(a)} lines against {len(b)}"]
    for x, y in zip(a, b):
        if x.startswith(demodoc.NUMERICS) and y.startswith(demodoc.NUMERICS):
            continue
        if NUMBER.sub("#", x) != NUMBER.sub("#", y):
            wrong.append(f"{x!r} / {y!r}")
            continue
        if x.startswith("| ") and not x.startswith("| protocol"):
            cx, cy = x.split(" | "), y.split(" | ")
            if cx[:7] != cy[:7] or cx[9] != cy[9] or cx[8].split("(")[-1] != cy[8].split("(")[-1]:
                wrong.append(f"{x!r} / {y!r}")
            elif cx[9].startswith("0 of") and any(
                    abs(float(u) - float(v)) > POINTS for u, v in zip(NUMBER.findall(cx[7]), NUMBER.findall(cy[7]))):
                wrong.append(f"{x!r} / {y!r}: the final error beyond {POINTS} points")
            continue
        for u, v in zip(re.findall(r"(-?\d+(?:\.\d+)?)(?=(?:–-?\d+(?:\.\d+)?)? %)", x),
                        re.findall(r"(-?\d+(?:\.\d+)?)(?=(?:–-?\d+(?:\.\d+)?)? %)", y)):
            if abs(float(u) - float(v)) > POINTS:
                wrong.append(f"{x!r} / {y!r}: {u} % against {v} %")
                break
    return wrong


def test_the_rounding_tolerance_refuses_what_rounding_does_not_change() -> None:
    # hand-made pairs: the note's row and this run's, one difference each
    row = "| hardsync | either | 1 | 8 | 8 | 22.3 s | 0 | 4.0 % (3.5–4.4 %) | 3.69 s (3 of 3) | 0 of 3 |"
    dead = "| async | constant | 30 | 8 | 240 | 0.749 s | 28.9 | 90.9 % (90.0–92.4 %) | never (0 of 3) | **3 of 3** |"
    found = "* it brings it to 4.0–5.6 % (hardsync: 2.3–2.9 %) and takes 0.341–0.487 s."
    note = "\n".join(["Replayed with torch 9, AVX512 CPU kernels, GenuineIntel x86_64 (see below).", row, dead, found])
    ok = [("3.4 % (3.2–3.6 %) | 2.95 s (3 of 3)", "4.0 % (3.5–4.4 %) | 3.69 s (3 of 3)"),
          ("89.2 % (88.6–89.8 %)", "90.9 % (90.0–92.4 %)"), ("4.5–5.6 %", "4.0–5.6 %"), ("0.3–0.5 s", "0.341–0.487 s")]
    for theirs, ours in ok:
        assert same_but_rounding(note.replace(ours, theirs), note) == [], theirs
    bad = [("4.0 % (3.5–4.4 %)", "6.1 % (3.5–4.4 %)"), ("(3.5–4.4 %)", "(0.1–4.4 %)"), ("(3 of 3) | 0", "(2 of 3) | 0"),
           ("3.69 s (3 of 3)", "never (0 of 3)"), ("**3 of 3**", "**2 of 3**"), ("4.0–5.6 %", "1.9–5.6 %"),
           ("22.3 s", "22.4 s"), ("it brings", "it keeps"), ("Replayed with torch 9", "Replayed using torch 9")]
    for ours, theirs in bad:
        assert theirs != ours and same_but_rounding(note.replace(ours, theirs, 1), note), theirs


def test_docs_and_readme_quote_the_demo_as_it_runs(demo) -> None:
    # truth: this run of the demo. docs/demo.md's generated part and the README's quoted findings
    # are what `python -m ddlsim.scenarios.demodoc` writes from it (rerun it when they differ)
    from ddlsim.analysis.results import load_results
    from ddlsim.scenarios import demodoc

    out, proc = demo
    results = load_results(out)
    note = (ROOT / "docs" / "demo.md").read_text(encoding="utf-8")
    stale = "stale: regenerate with python -m ddlsim.scenarios.demodoc"
    part, now = demodoc.current_part(note, demodoc.BEGIN, demodoc.END), demodoc.generated(results).rstrip("\n")
    assert results.numerics and results.numerics.startswith("torch ")  # the run recorded its machine
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quote = demodoc.current_part(readme, demodoc.README_BEGIN, demodoc.README_END)
    printed = [line[2:] for line in proc.stdout.splitlines() if line.startswith("* ")]
    assert printed and printed == demodoc.demo_findings(results)  # what the terminal said
    if demodoc.numerics_in(part) == results.numerics:  # the machine the note was made on: the same numbers
        assert part == now, stale
        assert quote == demodoc.readme_quote(results), stale
        assert all(f"* {f}" in note for f in printed)
    else:  # another machine's note: the same but what rounding changes (docs/demo.md)
        assert not (wrong := same_but_rounding(part, now)), f"{stale}: " + "; ".join(wrong[:3])
        assert not (wrong := same_but_rounding(quote, demodoc.readme_quote(results))), f"{stale}: {wrong}"


def test_advise_by_successive_halving_is_within_two_test_samples_of_the_best(demo, tmp_path: Path) -> None:
    # truth: the demo's full replay — the lowest mean over a configuration's seeds of the test
    # error at the last evaluation by 1 s; advise replays rungs of it (docs/advise.md)
    out, _ = demo
    config = {r["run_id"]: r.get("config_id") or r["run_id"] for r in read_csv(out / "summary.csv")}
    curves: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for r in read_csv(out / "curves.csv"):
        curves[r["run_id"]].append((float(r["sim_time_s"]), float(r["test_error"])))
    runs: dict[str, list[float]] = defaultdict(list)
    for rid, pts in curves.items():
        runs[config[rid]].append([p for p in sorted(pts) if p[0] <= 1.0 + 1e-9][-1][1])
    best = min(sum(v) / len(v) for v in runs.values())
    proc = subprocess.run(CLI + ["advise", "demo", "--budget-s", "1.0", "--out", str(tmp_path / "a"), "--quiet",
                                 "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(s for s in proc.stdout.splitlines() if s.startswith("Recommended:"))
    got = float(re.search(r"([0-9.]+) % test error", line).group(1)) / 100
    assert best <= got + 0.0005 + 1e-9 and got - best <= 2 / 360 + 1e-9, (line, best)  # printed to 0.1 %


def test_demodoc_writes_only_where_docs_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    # no default path into the source tree: without --docs it refuses before running the demo
    from ddlsim.scenarios import demodoc

    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        demodoc.main([])
    assert e.value.code == 2 and "--docs" in capsys.readouterr().err.splitlines()[-1]
    # a folder without demo.md, or a missing README, is refused in one line before the demo runs
    (tmp_path / "docs").mkdir()
    assert demodoc.main(["--docs", "docs"]) == 2
    assert capsys.readouterr().err == ("demodoc: error: --docs docs: no demo.md there (its generated part is "
                                       "replaced, so it must exist)\n")
    (tmp_path / "docs" / "demo.md").write_text("# Demo\n", encoding="utf-8")
    assert demodoc.main(["--docs", "docs", "--readme", "README.md"]) == 2
    assert capsys.readouterr().err.startswith("demodoc: error: --readme README.md: not a file")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["demo.md", "docs"]  # no results/demo: nothing ran
