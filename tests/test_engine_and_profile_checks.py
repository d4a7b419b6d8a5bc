"""Two checks before any run: ``--engine fast`` with a layer-wise pull is refused in one line
(exit 2, nothing written), and ``validate --profile`` with a network profile applies every
``[network]`` key of it, as a scenario naming the profile would."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import ScenarioError, load
from ddlsim.scenarios.validate import apply_profile
from ddlsim.simulator.run import simulate

PS_SCENARIO = """
name = "fast-layerwise"
[workload]
dataset = "digits"
model = "mlp"
param_count = 1000000
epochs = 1
samples_per_epoch = 64
[cluster]
learners = 2
minibatch = 16
[cluster.server]
pull = "{pull}"
[protocol]
name = "hardsync"
bucket_bytes = 1000000
"""


@pytest.mark.parametrize("pull", ["layerwise", "layerwise-random"])
def test_engine_fast_with_a_layerwise_pull_is_refused_before_any_run(tmp_path: Path, pull: str,
                                                                      capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "s.toml").write_text(PS_SCENARIO.format(pull=pull))
    out = tmp_path / "out"
    rc = main(["simulate", str(tmp_path / "s.toml"), "--engine", "fast", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--engine fast" in err and f"cluster.server.pull' = {pull!r}" in err
    assert not out.exists()  # refused before the results folder is made


@pytest.mark.parametrize("sets", [["protocol.name=diloco"], ["protocol.name=local_sgd"],
                                  ["protocol.name=allreduce", "protocol.compression=fp16"]])
def test_engine_fast_with_a_local_protocol_is_refused_before_any_run(tmp_path: Path, sets: list[str],
                                                                     capsys: pytest.CaptureFixture) -> None:
    # truth: these protocols have one engine, a loop without an event queue (docs/low-communication.md)
    (tmp_path / "s.toml").write_text(PS_SCENARIO.format(pull="whole"))
    out = tmp_path / "out"
    args = [a for s in sets for a in ("--set", s)]
    rc = main(["simulate", str(tmp_path / "s.toml"), "--engine", "fast", "--out", str(out), "--quiet", *args])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert "--engine fast" in err and "have one engine" in err
    assert not out.exists()


@pytest.mark.parametrize("sets, needle", [
    (["protocol.name=allreduce", "cluster.server.pull=layerwise"], "has no parameter server to pull from"),
    (["protocol.name=local_sgd", "protocol.overlap=1"], "'local_sgd' does not overlap"),
    (["protocol.name=async", "protocol.overlap=2"], "'async' does not overlap"),
])
def test_a_key_the_protocol_does_not_use_is_refused_not_ignored(tmp_path: Path, sets: list[str], needle: str,
                                                                  capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "s.toml").write_text(PS_SCENARIO.format(pull="whole"))
    out = tmp_path / "out"
    args = [a for s in sets for a in ("--set", s)]
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(out), "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err
    assert not out.exists()


def test_engine_auto_runs_the_layerwise_pull(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "s.toml").write_text(PS_SCENARIO.format(pull="layerwise"))
    assert main(["simulate", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 0


ALLREDUCE_SCENARIO = """
name = "profile"
[workload]
dataset = "digits"
model = "mlp"
param_count = 5000000
epochs = 1
samples_per_epoch = 256
[cluster]
learners = 4
gpus_per_node = 2
minibatch = 16
[cluster.compute]
distribution = "deterministic"
base_s = 0.01
per_sample_s = 0.0
[protocol]
name = "allreduce"
"""

NETWORK_PROFILE = """# ddlsim network profile: test
[network]
latency_s = 3e-5
overhead_s = 2e-4
bandwidth_Bps = 2e9
intra_latency_s = 7e-6
intra_bandwidth_Bps = 3e9

[fit]
source = "test"
"""


def test_validate_profile_applies_every_network_key_of_a_network_profile(tmp_path: Path) -> None:
    # truth: the same five keys set as ordinary scenario keys (load's --set), not through validate
    (tmp_path / "s.toml").write_text(ALLREDUCE_SCENARIO)
    (tmp_path / "net.toml").write_text(NETWORK_PROFILE)
    sets = ["cluster.network.latency_s=3e-5", "cluster.network.overhead_s=2e-4", "cluster.network.bandwidth_Bps=2e9",
            "cluster.network.intra_latency_s=7e-6", "cluster.network.intra_bandwidth_Bps=3e9"]
    point = load(tmp_path / "s.toml").points()[0]
    expected = load(tmp_path / "s.toml", sets).points()[0]
    profiled = apply_profile(point, str(tmp_path / "net.toml"))
    assert profiled["cluster"]["network"] == expected["cluster"]["network"]
    assert simulate(profiled).summary["sim_time_s"] == simulate(expected).summary["sim_time_s"]
    assert simulate(profiled).summary["sim_time_s"] != simulate(point).summary["sim_time_s"]


def test_a_bad_network_profile_figure_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text(ALLREDUCE_SCENARIO)
    bad = tmp_path / "bad.toml"
    bad.write_text(NETWORK_PROFILE.replace("intra_bandwidth_Bps = 3e9", "intra_bandwidth_Bps = 0"))
    with pytest.raises(ScenarioError, match=r"--profile .*bad.toml: \[network\] intra_bandwidth_Bps = 0") as err:
        apply_profile(load(tmp_path / "s.toml").points()[0], str(bad))
    assert "\n" not in str(err.value)
