"""The layer-wise pulls with a model whose layers the catalogue knows: a piece per layer, each
piece's forward share its layer's share of the forward multiply-adds. A three-layer model, its
iteration time worked out by hand under each pull order."""

from __future__ import annotations

import pytest

from ddlsim.simulator import ps
from ddlsim.simulator.catalog import Layer
from ddlsim.simulator.run import simulate
from tests.conftest import pull_point

# Forward order: 2.5, 5 and 7.5 M parameters (10, 20, 30 MB: 0.01, 0.02, 0.03 s at 1 GB/s) and
# 30, 15, 15 M multiply-adds (forward shares 1/2, 1/4, 1/4: before each, 0, 1/2, 3/4), as a
# convolution network's early layers hold few weights and most of the work
LAYERS = [Layer((2500, 1000), False, False, 12), Layer((5000, 1000), False, False, 3),
          Layer((7500, 1000), False, False, 2)]


@pytest.fixture
def three_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ps, "model_layers", lambda model, data: LAYERS)


def _point(pull: str, work: float, iterations: int, seed: int = 1) -> dict:
    """One learner, one shard at 1 GB/s, no latency nor apply time; the push one 60 MB message
    (0.06 s) after the compute; forward F = W/3 (backward_fraction 2/3)."""
    return pull_point(pull, work, samples=16 * iterations, param_count=15_000_000, bucket_bytes=0, seed=seed)


def _seconds(pull: str, work: float, iterations: int = 3, seed: int = 1) -> float:
    return float(simulate(_point(pull, work, iterations, seed), "simpy").summary["sim_time_s"])


@pytest.mark.usefixtures("three_layers")
def test_the_pieces_are_the_layers_with_their_flop_shares() -> None:
    pieces = ps.pull_pieces(_point("layerwise", 0.3, 1), 60e6)
    assert pieces == pytest.approx([(1 / 6, 0.0), (1 / 3, 0.5), (1 / 2, 0.75)], rel=1e-15)


@pytest.mark.usefixtures("three_layers")
@pytest.mark.parametrize("work,start", [(0.3, 0.01), (0.06, 0.045)])
def test_forward_order_iteration_is_the_closed_form(work: float, start: float) -> None:
    """By hand: arrivals 0.01, 0.03, 0.06; the compute starts at max(0.01, 0.03 − F/2, 0.06 − 3F/4):
    W = 0.3 (F = 0.1): 0.01; W = 0.06 (F = 0.02): 0.045 (with the forward spread over the bytes,
    shares before 0, 1/6, 1/2, it would be 0.05). An iteration: start + W + the 0.06 s push."""
    assert _seconds("layerwise", work) == pytest.approx(3 * (start + work + 0.06), rel=1e-12)


@pytest.mark.usefixtures("three_layers")
@pytest.mark.parametrize("work,start", [(0.3, 0.03), (0.06, 0.045)])
def test_shared_iteration_is_the_closed_form(work: float, start: float) -> None:
    """By hand, the three transfers sharing the link: the 0.01 s one ends at 3 × 0.01 = 0.03, the
    0.02 s one at 0.01 + 2 × 0.02 = 0.05, the 0.03 s one at 0.06. The compute starts at
    max(0.03, 0.05 − F/2, 0.06 − 3F/4): W = 0.3: 0.03; W = 0.06: 0.045."""
    assert _seconds("layerwise-shared", work) == pytest.approx(3 * (start + work + 0.06), rel=1e-12)


@pytest.mark.usefixtures("three_layers")
def test_random_order_iteration_is_one_of_the_orders_closed_forms() -> None:
    """By hand, W = 0.3 (F = 0.1: F·before 0, 0.05, 0.075), one transfer after another in the pull's
    order; start = max(a_1, a_2 − 0.05, a_3 − 0.075): 123: 0.01, 132: 0.01, 213: 0.03, 231: 0.06,
    312: 0.04, 321: 0.06. One iteration is start + 0.3 + 0.06, and the seeds give more than one."""
    ends = {round(0.36 + s, 9) for s in (0.01, 0.03, 0.04, 0.06)}
    seen = {round(_seconds("layerwise-random", 0.3, 1, seed), 9) for seed in range(1, 13)}
    assert seen <= ends and len(seen) > 1
