"""The parameter-server rules that PSCore and the fast engine share (simulator/protocols/ps.py):
n-softsync's grouping and weights, SSP's release, tree aggregation's forward rule, each held to
its definition; and the fast engine compiling those same functions (one place)."""

from __future__ import annotations

import numpy as np
import pytest

from ddlsim.simulator import fast_ps
from ddlsim.simulator.protocols import ps as rules
from ddlsim.simulator.protocols.ps import PSCore
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import APPLY
from ddlsim.tests.conftest import make_point


def test_the_fast_engine_compiles_the_core_s_own_rule_functions() -> None:
    for compiled, rule in ((fast_ps._update_due, rules.update_due), (fast_ps._group_weight, rules.group_weight),
                           (fast_ps._ssp_release, rules.ssp_release), (fast_ps._forward_due, rules.forward_due),
                           (fast_ps._group_members, rules.group_members)):
        assert getattr(compiled, "py_func", compiled) is rule


def test_softsync_applies_every_c_gradients_with_weights_one_over_c_and_a_last_partial_group() -> None:
    # λ = 6, n = 2: c = ⌊6/2⌋ = 3 gradients per update, each weighted 1/3; 0.05 epochs of 1,437
    # digits samples at μ = 8: ⌈71.85 / 8⌉ = 9 gradients → 3 updates of 3
    p = make_point(protocol__name="softsync", protocol__n=2, cluster__learners=6, cluster__minibatch=8,
                   workload__epochs=0.05)
    assert PSCore(p).c == 3
    for engine in ("simpy", "fast"):
        tr = simulate(p, engine).trace
        applies = np.flatnonzero(tr.ops["kind"] == APPLY)
        counts = tr.ops["in_count"][applies]
        total = PSCore(p).total
        assert counts.sum() == total and (counts[:-1] == 3).all() and 1 <= counts[-1] <= 3
        weights = tr.inputs["weight"]
        assert np.allclose(weights[: 3 * (len(counts) - 1)], 1 / 3)
    assert [rules.update_due(n, 3, p_, 10) for n, p_ in ((2, 5), (3, 6), (1, 10), (0, 9))] == [False, True, True, False]
    assert rules.group_weight(4) == 0.25 and rules.group_weight(1) == 1.0


@pytest.mark.parametrize("bound,group", [(0, 1), (1, 1), (3, 1), (1, 2)])
def test_ssp_release_is_the_definition_every_waiting_learner_within_the_bound_in_index_order(bound, group) -> None:
    """The definition, kept here independently: after a push, every learner that has pushed and
    not pulled again (the pushed ones included) whose processed count is within the slowest's
    + the bound pulls, in index order. Checked at every push of SSP runs with stragglers."""
    p = make_point(protocol__name="ssp", protocol__staleness_bound=bound, cluster__learners=6, cluster__minibatch=4,
                   workload__epochs=0.4, cluster__stragglers__fraction=0.34, cluster__stragglers__slowdown=3.0,
                   cluster__compute__cv=0.4, cluster__server__group_size=group)
    calls = {"n": 0, "waited": 0}
    waiting: set[int] = set()
    real = PSCore._release

    def checked(core: PSCore, pushed: list[int]) -> list[int]:
        limit = core.slowest + core.bound
        candidates = waiting | set(pushed)
        want = sorted(i for i in candidates if core.done_clock[i] <= limit)
        got = real(core, pushed)
        assert got == want
        waiting.clear()
        waiting.update(candidates - set(want))
        assert len({core.done_clock[i] for i in waiting}) <= 1  # the invariant ssp_release rests on
        calls["n"] += 1
        calls["waited"] += len(waiting)
        return got

    from unittest.mock import patch
    with patch.object(PSCore, "_release", checked):
        ref = simulate(p, "simpy")
    assert calls["n"] > 50 and calls["waited"] > 0  # learners did wait
    assert simulate(p, "fast").summary == ref.summary


def test_tree_aggregation_forwards_when_every_member_that_can_still_send_has_sent() -> None:
    # groups of 3 among λ = 7: aggregators 0, 1 hold 3 learners, aggregator 2 one
    assert [rules.group_members(a, 3, 7) for a in range(3)] == [3, 3, 1]
    assert rules.forward_due(3, 3, issued=5, total=100, inflight=0)
    assert not rules.forward_due(2, 3, issued=5, total=100, inflight=0)    # a member still to send
    assert rules.forward_due(2, 3, issued=100, total=100, inflight=0)      # the third will never send
    assert not rules.forward_due(2, 3, issued=100, total=100, inflight=1)  # one still computing
    assert not rules.forward_due(0, 3, issued=100, total=100, inflight=0)  # nothing to forward
