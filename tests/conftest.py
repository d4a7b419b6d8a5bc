"""Shared helpers for the tests: scenario points from TOML snippets."""

from __future__ import annotations

from typing import Any

import shutil
from pathlib import Path

import pytest

from ddlsim.scenarios.load import load_text


def make_point(toml: str = "", **sets: Any) -> dict[str, Any]:
    """The single validated point of a scenario snippet, with ``--set`` style overrides."""
    overrides = [f"{k.replace('__', '.')}={v!r}" if isinstance(v, str) else f"{k.replace('__', '.')}={v}"
                 for k, v in sets.items()]
    overrides = [o.replace("'", '"') for o in overrides]
    points = load_text(toml, "<test>", overrides).points()
    assert len(points) == 1
    return points[0]


def pull_point(pull: str | None, work: float, *, samples: int, learners: int = 1, param_count: int,
               bucket_bytes: int, seed: int | None = None, extra: str = "") -> dict[str, Any]:
    """The parameter-server point the pull tests work out by hand: hardsync, one shard at 1 GB/s,
    no latency, overhead nor apply time, deterministic compute of ``work`` seconds, the digits MLP
    sized to ``param_count`` parameters (4 B each); ``pull`` None leaves the key at its default."""
    server = f'pull = "{pull}"\n' if pull else ""
    head = f"seed = {seed}\n" if seed is not None else ""
    return load_text(f"""{head}
[workload]
dataset = "digits"
model = "mlp"
param_count = {param_count}
epochs = 1
samples_per_epoch = {samples}
[cluster]
learners = {learners}
minibatch = 16
[cluster.compute]
distribution = "deterministic"
base_s = {work}
per_sample_s = 0.0
[cluster.network]
latency_s = 0.0
overhead_s = 0.0
bandwidth_Bps = 1e9
[cluster.server]
apply_s = 0.0
{server}[protocol]
name = "hardsync"
bucket_bytes = {bucket_bytes}
{extra}""").points()[0]


@pytest.fixture
def point_factory():
    return make_point


@pytest.fixture(scope="session")
def _simulated_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ddlsim.scenarios.cli import main

    out = tmp_path_factory.mktemp("shared") / "r"
    assert main(["simulate", "demo", "--out", str(out), "--quiet", "--set", "workload.epochs=0.2",
                 "--set", "cluster.learners=[1,4]", "--set", "cluster.minibatch=[8,32]", "--set", "replicates=1"]) == 0
    return out


@pytest.fixture
def simulated_results(_simulated_results: Path, tmp_path: Path) -> Path:
    """A results folder of a small simulated sweep of the demo (24 points), a fresh copy per
    test: simulated once per session, for tests that only need a folder to read or damage."""
    out = tmp_path / "r"
    shutil.copytree(_simulated_results, out, symlinks=True)
    return out
