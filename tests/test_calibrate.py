"""`ddlsim calibrate`: the latency it writes makes the simulator charge the measured cycle."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest

from ddlsim.backends.calibrate import cycle_scenario
from ddlsim.backends.live import calibrated_latency, round_trip_s
from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import load_text
from ddlsim.simulator.catalog import dataset_info, param_count
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
    # truth: the documented formula applied to the numbers calibrate reports — latency_s =
    # max(0, (round trip − 2·M/bandwidth − apply_s)/2), M = the model's parameters × 4 B —
    # and the simulator itself: the calibration point simulated with the written latency_s
    # (and bandwidth, apply) charges the measured round trip. Both hold whatever the load made
    # the measurements; no measured time is bounded.
    out = tmp_path / "p.toml"
    assert main(["calibrate", "--minibatches", "4", "--out", str(out)]) == 0
    console = capsys.readouterr().out
    assert "live push-pull cycle" in console
    prof = tomllib.loads(out.read_text())
    net, apply_s = prof["network"], prof["server"]["apply_s"]
    rt, bw = net["cycle_round_trip_s"], net["bandwidth_Bps"]
    assert np.isfinite(rt) and rt > 0 and bw > 0 and apply_s >= 0
    message = param_count("mlp", dataset_info("digits")) * 4
    expected = max(0.0, (rt - 2 * message / bw - apply_s) / 2)
    assert net["latency_s"] == pytest.approx(expected, rel=1e-4, abs=1e-5 * rt)  # profile: 6 digits
    said = re.search(r"round trip ([\d.]+) µs → latency_s ([\d.]+) µs", console)
    assert said and float(said[1]) == pytest.approx(rt * 1e6, abs=0.06) \
        and float(said[2]) == pytest.approx(net["latency_s"] * 1e6, abs=0.06)
    sim = simulate(cycle_point(net["latency_s"], bw, apply_s))
    if net["latency_s"] > 0:  # not clamped: the simulated cycle is the measured one
        assert round_trip_s(sim.trace) == pytest.approx(rt, rel=0.05)
    else:  # the measured cycle was shorter than its transfers and apply: the simulator's is not
        assert round_trip_s(sim.trace) >= rt


@pytest.mark.parametrize("model", ["mnist1d_cnn", "mnist1d_mlp"])
def test_calibrate_times_the_mnist1d_models_and_a_scenario_charges_what_it_measured(tmp_path: Path,
                                                                                    model: str) -> None:
    # truth: the profile's own table — a hardsync λ = 1 run with deterministic compute charges
    # each minibatch gradient exactly the seconds calibrate wrote for that μ
    out = tmp_path / "m.toml"
    assert main(["calibrate", "--model", model, "--dataset", "mnist1d", "--no-network", "--minibatches", "2,8",
                 "--out", str(out)]) == 0
    prof = tomllib.loads(out.read_text())
    assert (prof["model"], prof["dataset"], prof["minibatch"]) == (model, "mnist1d", [2, 8])
    p = load_text(f"""
name = "cal"
[workload]
dataset = "mnist1d"
model = "{model}"
epochs = 0.01
[cluster]
learners = 1
minibatch = 8
[cluster.compute]
distribution = "deterministic"
profile = "{out}"
[protocol]
name = "hardsync"
""").points()[0]
    ops = simulate(p).trace.ops
    grads = ops["kind"] == 0
    spans = ops["t_end"][grads] - ops["t_start"][grads]
    assert len(spans) > 0 and np.allclose(spans, prof["seconds"][1], rtol=1e-9)
