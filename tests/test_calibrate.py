"""`ddlsim calibrate`: the latency it writes makes the simulator charge the measured cycle."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from ddlsim.backends.calibrate import cycle_scenario
from ddlsim.backends.live import calibrated_latency, round_trip_s
from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import load_text
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import TraceBuilder

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def cycle_point(latency_s: float, bandwidth_Bps: float, apply_s: float) -> dict:
    p = load_text(cycle_scenario("mlp", "digits", apply_s, bandwidth_Bps)).points()[0]
    p["cluster"]["network"]["latency_s"] = latency_s
    return p


def test_calibrated_latency_inverts_the_cycle_by_hand() -> None:
    # truth, by hand: the mean gap (1.0 and 1.4 ms → 1.2 ms) = 2·latency + 2·M/bandwidth + apply;
    # M = 9,610 params × 4 B sent in 0.5 ms each way: apply 0 → latency (1.2 − 1.0)/2 = 0.1 ms,
    # apply 0.2 ms → 0; infinite bandwidth, apply 0.2 ms → (1.2 − 0.2)/2 = 0.5 ms
    tb = TraceBuilder()
    tb.grad(0, 0, 0, 0, 8, 0, 0.0, 0.010, 0.0)
    tb.grad(0, 0, 1, 8, 8, 1, 0.011, 0.021, 0.0)      # gap 1.0 ms
    tb.grad(0, 0, 2, 16, 8, 2, 0.0224, 0.0324, 0.0)   # gap 1.4 ms
    trace = tb.build({"nodes": 1, "data_seed": 0, "samples_per_epoch": 1437})
    assert round_trip_s(trace) == pytest.approx(1.2e-3)
    assert calibrated_latency(trace, cycle_point(0.0, 9610 * 4 / 0.5e-3, 0.0)) == pytest.approx(0.1e-3)
    assert calibrated_latency(trace, cycle_point(0.0, 9610 * 4 / 0.5e-3, 0.2e-3)) == pytest.approx(0.0, abs=1e-12)
    assert calibrated_latency(trace, cycle_point(0.0, float("inf"), 0.2e-3)) == pytest.approx(0.5e-3)
    assert calibrated_latency(trace, cycle_point(0.0, float("inf"), 5e-3)) == 0.0  # never negative


def test_calibrate_writes_the_latency_that_reproduces_the_measured_cycle(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    # truth: the simulator itself — the calibration point simulated with the written
    # latency_s (and bandwidth, apply) charges the live run's measured push → compute gap
    out = tmp_path / "p.toml"
    assert main(["calibrate", "--minibatches", "4", "--out", str(out)]) == 0
    assert "live push-pull cycle" in capsys.readouterr().out
    prof = tomllib.loads(out.read_text())
    net, apply_s = prof["network"], prof["server"]["apply_s"]
    assert net["cycle_round_trip_s"] > 2 * net["pingpong_latency_s"] > 0  # a cycle does more than 2 messages
    sim = simulate(cycle_point(net["latency_s"], net["bandwidth_Bps"], apply_s))
    assert round_trip_s(sim.trace) == pytest.approx(net["cycle_round_trip_s"], rel=0.05)
    assert np.isfinite(net["latency_s"]) and net["latency_s"] > 0
