"""The reproduction note: `--quick` writes the note and its figures, and the staleness
table agrees with the closed form E[σ] = (λ−1)/c, c = ⌊λ/n⌋."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ddlsim.scenarios import reproduce as R

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def note(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("reproduce")
    assert R.main(["--quick", "--out", str(root / "docs"), "--results", str(root / "results"),
                   "--jobs", "1", "--quiet"]) == 0
    return root / "docs" / "reproductions.md"


def test_quick_writes_the_note_and_every_figure_it_names(note: Path) -> None:
    text = note.read_text(encoding="utf-8")
    assert "Mode: quick" in text
    for part in ("## (a) Staleness at λ = 30", "## (b) Constant against staleness-aware",
                 "## (c) The μ × λ grid"):
        assert part in text
    figures = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", text)
    assert len(figures) == 4
    for rel in figures:
        data = (note.parent / rel).read_bytes()
        assert data.startswith(PNG) and len(data) < 250_000  # small PNGs
    # every claim gets a verdict sentence
    assert len(re.findall(r"\*\*(Reproduced|Not reproduced)", text)) == 3


def test_staleness_table_agrees_with_the_closed_form(note: Path) -> None:
    text = note.read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|", text, re.M)
    assert [int(r[0]) for r in rows] == [1, 15, 30]
    lam = R.LAMBDA
    for n, c, closed, mean, _p99, smax in rows:
        n, c = int(n), int(c)
        assert c == max(1, lam // n)
        assert float(closed) == pytest.approx((lam - 1) / c, abs=1e-3)
        assert float(mean) == pytest.approx((lam - 1) / c, rel=0.05)
        if n == 1:
            assert float(smax) <= 2  # Rudra: 1-softsync σ ∈ {0, 1, 2}


def test_eta_squared() -> None:
    assert R.eta_squared([("a", 1.0), ("a", 1.0), ("b", 3.0), ("b", 3.0)]) == pytest.approx(1.0)
    assert R.eta_squared([("a", 1.0), ("a", 3.0), ("b", 1.0), ("b", 3.0)]) == pytest.approx(0.0)


def test_lr_table_gives_the_mean_and_range_of_the_seeds_summary_rows(note: Path) -> None:
    # truth: the runs' own summary.csv (one row per seed): each table cell is their mean and range
    import csv

    text = note.read_text(encoding="utf-8")
    with open(note.parent.parent / "results" / "lr_policy" / "summary.csv", newline="", encoding="utf-8") as f:
        runs = list(csv.DictReader(f))
    assert len({r["seed"] for r in runs}) == R.QUICK.replicates
    rows = re.findall(r"^\| (\d+)-softsync \| (\w+) \| [^|]+ \| ([\d.]+) % \(([\d.]+)–([\d.]+)\)", text, re.M)
    assert len(rows) == 9
    for n, policy, mean, lo, hi in rows:
        vals = [100 * float(r["final_test_error"]) for r in runs
                if r["softsync_n"] == n and r["optimizer.lr_policy"] == policy]
        assert len(vals) == R.QUICK.replicates
        assert float(mean) == pytest.approx(sum(vals) / len(vals), abs=0.051)
        assert (float(lo), float(hi)) == (pytest.approx(min(vals), abs=0.051), pytest.approx(max(vals), abs=0.051))


def test_without_out_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    # the note goes only where --out says: no default path into the source tree or the working directory
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        R.main(["--quick", "--quiet"])
    assert e.value.code == 2 and "--out" in capsys.readouterr().err.splitlines()[-1]
    assert list(tmp_path.iterdir()) == []
