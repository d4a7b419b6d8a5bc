"""The hardware catalogue, its presets, and the predictions of published measurements."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from ddlsim.scenarios import published
from ddlsim.scenarios.cli import main
from ddlsim.scenarios.hardware import catalogue, check_catalogue, markdown
from ddlsim.scenarios.load import ScenarioError, load_text

DOCS = Path(__file__).resolve().parents[1] / "docs"
BASE = """
[workload]
dataset = "imagenet"
model = "resnet50"
[cluster]
learners = 16
gpus_per_node = 8
"""


def test_every_figure_has_a_known_source_and_every_gpu_a_link() -> None:
    assert check_catalogue() == []
    assert len(catalogue()["sources"]) >= 10


def test_gpu_preset_fills_compute_and_intra_link_from_the_catalogue() -> None:
    # truth: the catalogue's published figures (V100 FP32 ResNet-50 367 img/s; NVLink 2)
    p = load_text(BASE + 'gpu = "v100"\n').points()[0]
    assert p["cluster"]["compute"]["per_sample_s"] == pytest.approx(1 / 367)
    assert p["cluster"]["compute"]["base_s"] == 0.0
    assert p["cluster"]["network"]["intra_bandwidth_Bps"] == 1.5e11
    mixed = load_text(BASE + 'gpu = "v100"\nprecision = "mixed"\n').points()[0]
    assert mixed["cluster"]["compute"]["per_sample_s"] == pytest.approx(1 / 1200)


def test_two_published_batch_sizes_give_the_gpu_a_fixed_cost() -> None:
    # truth: tf-benchmarks' DGX-1 table, one P100 on ResNet-50: 219 img/s at batch 64, 195 at 32;
    # the compute model passes through both (64/219 s and 32/195 s per minibatch)
    text = BASE.replace("learners = 16\ngpus_per_node = 8", "learners = 1") + 'gpu = "p100"\n'
    for mu, per_s in ((64, 219), (32, 195)):
        c = load_text(text + f"minibatch = {mu}\n").points()[0]["cluster"]["compute"]
        assert c["base_s"] + mu * c["per_sample_s"] == pytest.approx(mu / per_s)
    assert c["base_s"] > 0
    given = load_text(text + "[cluster.compute]\nper_sample_s = 0.01\n").points()[0]["cluster"]["compute"]
    assert (given["base_s"], given["per_sample_s"]) == (0.0, 0.01)    # the user's own linear model


def test_explicit_keys_win_over_presets_in_the_file_in_a_sweep_and_by_set() -> None:
    text = BASE + 'gpu = "a100"\n[cluster.compute]\nper_sample_s = 0.01\n[cluster.network]\npreset = "ib-hdr"\n'
    p = load_text(text, "<t>", ["cluster.network.latency_s=1e-3"]).points()[0]
    assert p["cluster"]["compute"]["per_sample_s"] == 0.01        # the file's
    assert p["cluster"]["network"]["latency_s"] == 1e-3           # --set's
    assert p["cluster"]["network"]["bandwidth_Bps"] == 2.5e10     # the preset's
    sweep = load_text(BASE + '[sweep]\n"cluster.gpu" = ["v100", "a100"]\n').points()
    assert [q["cluster"]["compute"]["per_sample_s"] for q in sweep] == pytest.approx([1 / 367, 1 / 938])


def test_a_gpu_without_a_figure_for_the_model_is_one_line_unless_compute_is_given() -> None:
    with pytest.raises(ScenarioError, match="no published fp32 throughput for model 'vgg16'") as e:
        load_text(BASE.replace("resnet50", "vgg16") + 'gpu = "v100"\n')
    assert "\n" not in str(e.value)
    given = BASE.replace("resnet50", "vgg16") + 'gpu = "v100"\n[cluster.compute]\nbase_s = 0.1\nper_sample_s = 0.0\n'
    assert load_text(given).points()[0]["cluster"]["network"]["intra_bandwidth_Bps"] == 1.5e11


def test_hardware_command_lists_the_catalogue(capsys: pytest.CaptureFixture) -> None:
    assert main(["hardware"]) == 0
    out = capsys.readouterr().out
    assert "v100" in out and "ib-edr" in out and "nvlink3" in out


def test_docs_hardware_tables_are_current() -> None:
    assert markdown() in (DOCS / "hardware.md").read_text(encoding="utf-8")


def test_published_validation_is_current_and_meets_its_goal() -> None:
    # the acceptance: ≥ 15 rows from ≥ 4 sources, median |relative error| ≤ 10 %,
    # every row's source in the catalogue, and the note in docs/ regenerated from this code
    results = [published.predict(row) for row in published.ROWS]
    counted = [r for r in results if not r.row.fitted]
    assert len(counted) >= 15 and len({r.row.source for r in counted}) >= 4
    assert statistics.median(abs(r.error) for r in counted) <= 0.10
    assert all(r.row.source in catalogue()["sources"] for r in results)
    assert all(published.missing(r.row) != "not identified" for r in counted if abs(r.error) > 0.10)
    # scored on the overhead (issue: ahead of both baselines), with every miss over 25 % explained
    sc = published.scores(results)
    assert len(counted) >= 40
    assert sc["ddlsim"]["overhead_median"] < min(sc["alpha-beta"]["overhead_median"], sc["linear"]["overhead_median"])
    assert sc["ddlsim"]["total_median"] <= 0.05
    assert all(published.missing(r.row) != "not identified" for r in counted
               if (e := r.overhead_error(r.sec_per_iter)) is not None and abs(e) > 0.25)
    assert (DOCS / "published-validation.md").read_text(encoding="utf-8") == published.note(results)
