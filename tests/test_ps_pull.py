"""The layer-wise pull of the parameter-server engine (``cluster.server.pull``): the iteration
time against a hand-computed closed form, the engine selection, and the library preset."""

from __future__ import annotations

import pytest

from ddlsim.scenarios.load import load_text
from ddlsim.simulator.protocols import header_for
from ddlsim.simulator.run import fast_engine, simulate
from tests.conftest import pull_point

ITERATIONS = 3


def _point(pull: str | None, work: float, extra: str = "") -> dict:
    """One learner, one shard, a 120 MB model in two 60 MB pieces over 1 GB/s, no latency and
    no apply time: the pull takes tx = 0.12 s, each push piece 0.06 s."""
    return pull_point(pull, work, samples=16 * ITERATIONS, param_count=30_000_000, bucket_bytes=60_000_000,
                      extra=extra)


def _closed_form(work: float, layerwise: bool) -> float:
    """By hand: pieces of half the model each, forward F = W/3 (backward_fraction 2/3).
    Whole pull: compute starts at tx. Layer-wise: piece 1 arrives at tx/2, piece 2 at tx; the
    compute starts at max(tx/2 − 0, tx − F/2). Backward pushes its first half at start + 2W/3
    (over before the end when tx/2 ≤ W/3) and its second at start + W; the iteration ends when
    that 0.06 s push is processed, and the next pull starts then."""
    tx, forward = 0.12, work / 3
    start = max(tx / 2, tx - forward / 2) if layerwise else tx
    assert tx / 2 <= work / 3  # the first push is done before backward ends
    return ITERATIONS * (start + work + tx / 2)


@pytest.mark.parametrize("work", [0.3, 3.0])  # 0.3: the last piece binds; 3.0: the first
def test_layerwise_pull_iteration_time_is_the_closed_form(work: float) -> None:
    whole = simulate(_point("whole", work)).summary["sim_time_s"]
    layer = simulate(_point("layerwise", work)).summary["sim_time_s"]
    assert whole == pytest.approx(_closed_form(work, False), rel=1e-12)
    assert layer == pytest.approx(_closed_form(work, True), rel=1e-12)


@pytest.mark.parametrize("work,whole,layerwise", [(0.3, 0.60, 0.57), (3.0, 3.30, 3.18)])
def test_two_learners_share_the_servers_nic_piece_by_piece(work: float, whole: float, layerwise: float) -> None:
    """By hand, two learners released together, one shard (pieces of 0.06 s on its NIC out):
    whole pull: learner 0 gets the model over [0, 0.12], learner 1 over [0.12, 0.24]. Layer-wise,
    in turn: piece 1 to learner 0 by 0.06 and to learner 1 by 0.12, piece 2 by 0.18 and 0.24; the
    compute starts at max(piece 1, piece 2 − F/2): W = 0.3 (F = 0.1): 0.13 and 0.19; W = 3: 0.06
    and 0.12. Then the four 0.06 s pushes queue on the server's NIC in, in order of production,
    and the update (apply 0) releases both when the last is in: W = 0.3 whole: learner 1's last
    at 0.54 → 0.60; layer-wise: 0.49 → 0.57 (after learner 0's last, 0.43 → 0.51). W = 3 whole:
    3.24 → 3.30; layer-wise: 3.12 → 3.18. Every iteration repeats the first."""
    for pull, period in (("whole", whole), ("layerwise", layerwise)):
        p = _point(pull, work)
        p["cluster"] = dict(p["cluster"], learners=2)
        p["workload"] = dict(p["workload"], samples_per_epoch=2 * 16 * ITERATIONS)
        assert simulate(p, "simpy").summary["sim_time_s"] == pytest.approx(ITERATIONS * period, rel=1e-12)


def test_one_piece_is_the_whole_pull() -> None:
    # truth: with one piece the forward waits for the whole model either way
    one = _point("layerwise", 0.3, "").copy()
    one["protocol"] = dict(one["protocol"], bucket_bytes=0)
    whole = _point("whole", 0.3)
    whole["protocol"] = dict(whole["protocol"], bucket_bytes=0)
    assert simulate(one, "simpy").summary["sim_time_s"] == simulate(whole, "simpy").summary["sim_time_s"]


def test_fast_engine_refuses_the_layerwise_pull_and_auto_chooses_simpy() -> None:
    p = _point("layerwise", 0.3)
    fast, reason = fast_engine(p)
    assert fast is None and reason is not None and "cluster.server.pull" in reason
    with pytest.raises(ValueError, match=r"^engine 'fast' does not cover this point: .*layer-wise pull"):
        simulate(p, "fast")
    assert simulate(p, "auto").summary == simulate(p, "simpy").summary


def test_whole_pull_is_the_default_and_leaves_the_header_unchanged() -> None:
    # truth: a point without the key and one with its default share the run id and header
    plain, explicit = _point(None, 0.3), _point("whole", 0.3)
    assert plain["cluster"]["server"]["pull"] == "whole"
    assert "pull" not in header_for(plain, 1, "global_slice")["point"]["cluster"]["server"]
    assert header_for(plain, 1, "x") == header_for(explicit, 1, "x")


def test_tf_grpc_turns_the_shared_layerwise_pull_on_and_an_explicit_key_wins() -> None:
    # truth: docs/hardware.md states tf-grpc's pull (every transfer at once, sharing the link)
    base = """
[workload]
dataset = "imagenet"
model = "resnet50"
[cluster]
learners = 16
gpus_per_node = 8
gpu = "k80"
[cluster.network]
preset = "10gbe-tcp"
[protocol]
name = "hardsync"
library = "tf-grpc"
"""
    assert load_text(base).points()[0]["cluster"]["server"]["pull"] == "layerwise-shared"
    off = load_text(base, "<t>", ['cluster.server.pull="whole"']).points()[0]
    assert off["cluster"]["server"]["pull"] == "whole"


def test_a_bad_pull_is_one_line() -> None:
    from ddlsim.scenarios.load import ScenarioError
    with pytest.raises(ScenarioError, match=r"cluster.server.pull.*layerwis") as err:
        _point("layerwis", 0.3)
    assert "\n" not in str(err.value)


def test_random_order_pull_takes_one_of_the_two_closed_forms_each_iteration() -> None:
    """By hand, one learner, two 60 MB pieces (tx = 0.12 s for the model), W = 0.3 (F = 0.1):
    forward order, the compute starts at max(0.06, 0.12 − F/2) = 0.07; reversed (the second
    layer's piece first), the first layer's piece arrives at 0.12 and the compute starts then.
    An iteration is its start + W + the last 0.06 s push, so over n iterations of which k pulled
    in reverse the run takes n(W + 0.06) + 0.07(n − k) + 0.12k: k must come out a whole number,
    and with a fresh fair permutation per pull, both orders occur in 40 pulls (all but 2^-39)."""
    n, work = 40, 0.3
    p = _point("layerwise-random", work)
    p["workload"] = dict(p["workload"], samples_per_epoch=16 * n)
    total = simulate(p, "simpy").summary["sim_time_s"]
    k = (total - n * (work + 0.06) - 0.07 * n) / (0.12 - 0.07)
    assert k == pytest.approx(round(k), abs=1e-6)
    assert 0 < round(k) < n
    forward = _point("layerwise", work)
    forward["workload"] = dict(forward["workload"], samples_per_epoch=16 * n)
    assert simulate(forward, "simpy").summary["sim_time_s"] == pytest.approx(n * (work + 0.06 + 0.07), rel=1e-12)


def test_random_order_is_the_seeds_and_the_fast_engine_refuses_it() -> None:
    # truth: the same seed gives the same run, another seed (almost surely) another order
    def run(seed: int) -> float:
        p = _point("layerwise-random", 0.3)
        p["seed"] = seed
        p["workload"] = dict(p["workload"], samples_per_epoch=16 * 40)
        return float(simulate(p, "simpy").summary["sim_time_s"])
    assert run(1) == run(1)
    assert len({run(s) for s in range(1, 6)}) > 1
    fast, reason = fast_engine(_point("layerwise-random", 0.3))
    assert fast is None and reason is not None and "layerwise-random" in reason
