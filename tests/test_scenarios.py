"""Scenario files: defaults, sweeps, overrides, and one clear line for every bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import ScenarioError, load, load_text
from ddlsim.scenarios.schema import FIELDS

CORPUS = sorted((Path(__file__).parent / "invalid_scenarios").glob("*.toml"))
DESIGN_EXAMPLE = '''
name = "example"
seed = 0
backend = "replay"
[workload]
dataset = "digits"
model = "mlp"
epochs = 20
target_error = 0.10
[optimizer]
name = "sgd"
lr = 0.05
momentum = 0.9
weight_decay = 0.0
lr_policy = "per_gradient"
milestones = [[15, 0.1]]
warmup_epochs = 0
[cluster]
learners = 8
minibatch = 16
[cluster.compute]
distribution = "lognormal"
base_s = 0.002
per_sample_s = 0.0005
cv = 0.1
[cluster.stragglers]
fraction = 0.0
slowdown = 1.0
stall_rate_per_s = 0.0
stall_mean_s = 0.0
[cluster.network]
latency_s = 5e-5
bandwidth_Bps = 1.25e9
bytes_per_param = 4
[cluster.server]
shards = 1
apply_s = 1e-4
apply_distribution = "deterministic"
[protocol]
name = "softsync"
n = 1
staleness_bound = 3
topology = "npdde"
peers = 1
overlap = 0
[sweep]
"cluster.learners" = [1, 2, 4, 8, 16, 30]
"cluster.minibatch" = [4, 16, 128]
'''


def test_design_example_is_accepted_and_expanded() -> None:
    s = load_text(DESIGN_EXAMPLE)
    points = s.points()
    assert len(points) == 18
    assert [(p["cluster"]["learners"], p["cluster"]["minibatch"]) for p in points[:4]] == [
        (1, 4), (1, 16), (1, 128), (2, 4)]
    p = points[0]
    assert p["optimizer"]["milestones"] == [[15, 0.1]]
    assert p["workload"]["samples_per_epoch"] == 1437 and p["workload"]["param_count"] == 9610
    assert len({q["_id"] for q in points}) == 18


def test_defaults_fill_every_key() -> None:
    p = load_text("").points()[0]
    for f in FIELDS:
        node = p
        for part in f.key.split("."):
            node = node[part]


def test_set_overrides_replace_a_sweep_axis_and_lists_sweep() -> None:
    s = load_text(DESIGN_EXAMPLE, overrides=["cluster.learners=16", 'protocol.name="async"'])
    points = s.points()
    assert len(points) == 3 and {p["cluster"]["learners"] for p in points} == {16}
    assert points[0]["protocol"]["name"] == "async"
    s = load_text("", overrides=["cluster.learners=[2,4]", "protocol.name=hardsync"])
    assert [p["cluster"]["learners"] for p in s.points()] == [2, 4]
    assert s.points()[0]["protocol"]["name"] == "hardsync"


def test_bad_overrides_are_refused() -> None:
    with pytest.raises(ScenarioError, match="--set: unknown key 'cluster.lerners'"):
        load_text("", overrides=["cluster.lerners=4"])
    with pytest.raises(ScenarioError, match="expected key=value"):
        load_text("", overrides=["cluster.learners"])
    with pytest.raises(ScenarioError, match="'cluster.learners' = -1"):
        load_text("", overrides=["cluster.learners=-1"])


def test_corpus_is_large_enough() -> None:
    assert len(CORPUS) >= 25


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_invalid_scenario_gives_one_clear_line_and_exit_2(path: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture) -> None:
    expect = path.read_text().splitlines()[0].removeprefix("# expect: ")
    code = main(["simulate", str(path), "--out", str(tmp_path / "out"), "--quiet"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith("ddlsim: error: ")
    assert str(path) in err[0]
    assert expect in err[0]
    assert not (tmp_path / "out").exists()  # nothing was started


def test_missing_file_and_directory(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["simulate", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such scenario file" in capsys.readouterr().err
    assert main(["simulate", str(tmp_path) + "/"]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert main(["simulate", "no-such-bundled"]) == 2
    assert "bundled: " in capsys.readouterr().err


def test_profile_is_resolved_relative_to_the_scenario(tmp_path: Path) -> None:
    (tmp_path / "prof.toml").write_text("minibatch = [1, 8]\nseconds = [0.01, 0.05]\n")
    (tmp_path / "s.toml").write_text('[cluster.compute]\nprofile = "prof.toml"\n')
    p = load(tmp_path / "s.toml").points()[0]
    assert p["cluster"]["compute"]["profile"] == str((tmp_path / "prof.toml").resolve())
