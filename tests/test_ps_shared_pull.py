"""The shared layer-wise pull (``cluster.server.pull = "layerwise-shared"``): every piece's transfer
starts at once and the pieces in flight share each link equally. Checked against processor-sharing
completion times and iteration times worked out by hand."""

from __future__ import annotations

import pytest

from ddlsim.scenarios.load import ScenarioError, check_engine
from ddlsim.simulator.ps import processor_sharing_ends
from ddlsim.simulator.run import fast_engine, simulate
from tests.conftest import pull_point

ITERATIONS = 3


def _point(pull: str, work: float, learners: int = 1, param_count: int = 37_500_000) -> dict:
    """One shard at 1 GB/s, no latency, no apply time, 60 MB buckets. The default 150 MB model cuts
    into pieces of 60, 60, 30 MB in backward order: 30, 60, 60 MB (0.03, 0.06, 0.06 s) in forward
    order. Forward F = W/3 (backward_fraction 2/3)."""
    return pull_point(pull, work, samples=16 * learners * ITERATIONS, learners=learners, param_count=param_count,
                      bucket_bytes=60_000_000)


def _per_iteration(p: dict) -> float:
    return float(simulate(p, "simpy").summary["sim_time_s"]) / ITERATIONS


def test_processor_sharing_of_1_2_3_seconds_ends_at_3_5_6() -> None:
    # by hand: 3 in flight until the 1 s one ends (3 × 1), 2 until the 2 s one (+ 2 × 1), then 1 (+ 1)
    assert processor_sharing_ends(0.0, [1.0, 2.0, 3.0]) == pytest.approx([3.0, 5.0, 6.0])
    # the order of the input is kept, and a later start shifts every end
    assert processor_sharing_ends(10.0, [3.0, 1.0, 2.0]) == pytest.approx([16.0, 13.0, 15.0])
    # equal transfers end together, at their sum (the link busy as long as one after another)
    assert processor_sharing_ends(0.0, [0.5] * 4) == pytest.approx([2.0] * 4)


@pytest.mark.parametrize("work,period", [(3.0, 3.12), (0.3, 0.48)])
def test_one_learner_iteration_is_the_closed_form(work: float, period: float) -> None:
    """By hand, pieces 0.03, 0.06, 0.06 s (forward order) shared: the 30 MB piece ends at 3 × 0.03 =
    0.09, both 60 MB pieces at 0.03 + 2 × 0.06 = 0.15. The compute starts at max(0.09 − 0,
    0.15 − F · 0.2, 0.15 − F · 0.6): W = 3 (F = 1): 0.09; W = 0.3 (F = 0.1): 0.13. Backward pushes
    60 MB at start + 0.6 W and start + 0.8667 W (0.06 s each) and 30 MB at start + W (0.03 s):
    W = 3: the last is alone, the iteration is 0.09 + 3 + 0.03 = 3.12; W = 0.3: the second push
    holds the NIC in until start + 0.32, the last ends at start + 0.35 = 0.48."""
    assert _per_iteration(_point("layerwise-shared", work)) == pytest.approx(period, rel=1e-12)


def test_one_learner_in_forward_order_for_comparison() -> None:
    # by hand, one transfer after another in forward order: 0.03, 0.09, 0.15; W = 3 starts at 0.03
    assert _per_iteration(_point("layerwise", 3.0)) == pytest.approx(0.03 + 3.0 + 0.03, rel=1e-12)


def test_two_learners_released_together_share_the_servers_nic() -> None:
    """By hand, two learners, six pieces on the server's NIC out (0.03, 0.03, 0.06 × 4 s): both 30 MB
    pieces end at 6 × 0.03 = 0.18, the four 60 MB ones at 0.06 + 4 × 0.06 = 0.30. W = 3 (F = 1):
    each starts at max(0.18, 0.30 − 0.2, 0.30 − 0.6) = 0.18; the pushes queue on the NIC in:
    60 MB at 1.98 (to 2.04, 2.10), at 2.78 (to 2.84, 2.90), 30 MB at 3.18 (to 3.21, 3.24): the
    update is in at 3.24, and every iteration repeats it."""
    assert _per_iteration(_point("layerwise-shared", 3.0, learners=2)) == pytest.approx(3.24, rel=1e-12)


def test_two_learners_with_equal_pieces_get_the_model_at_the_same_time() -> None:
    """By hand, a 120 MB model in two 60 MB pieces, two learners: the four 0.06 s pieces end together
    at 0.24 (taking turns in order would give learner 0 its model by 0.18). W = 0.3: both compute
    from 0.24; the 60 MB pushes at 0.44 (to 0.50, 0.56) and 0.54 (to 0.62, 0.68): 0.68."""
    p = _point("layerwise-shared", 0.3, learners=2, param_count=30_000_000)
    assert _per_iteration(p) == pytest.approx(0.68, rel=1e-12)


def test_fast_engine_refuses_the_shared_pull_in_one_line() -> None:
    p = _point("layerwise-shared", 0.3)
    fast, reason = fast_engine(p)
    assert fast is None and reason is not None and "layerwise-shared" in reason
    with pytest.raises(ScenarioError, match="layerwise-shared") as err:
        check_engine([p], "fast")
    assert "\n" not in str(err.value)
    assert simulate(p, "auto").summary == simulate(p, "simpy").summary
