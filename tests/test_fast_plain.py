"""The fast engine's plain kernels (``fast_ps._plain_kernel``, and ``_plain_summary_kernel`` for a
summary-only run: async and n-softsync with one bucket, no aggregators, a NIC per learner, no
transient stalls) against the SimPy engine:
byte-identical traces and equal summaries, staleness histograms and eval schedules on a
property-based grid of the points it runs, and across each of its stops (draw refills,
buffer flushes, staleness beyond the range the summary-only kernel counts)."""

from __future__ import annotations

import math
from collections import Counter
from unittest.mock import patch

import numpy as np

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlsim.simulator import fast_ps
from ddlsim.simulator.fast_core import value_counts
from ddlsim.simulator import trace as T
from ddlsim.simulator.run import simulate
from tests.conftest import make_point
from tests.test_fast import scenario


def plain_run(p: dict, keep_trace: bool = True) -> tuple:
    """The fast engine's result on ``p`` and the statuses its plain kernels returned (none: they did not run)."""
    seen: list[int] = []

    def noting(kernel):
        def run(*args):
            seen.append(kernel(*args))
            return seen[-1]
        return run

    with (patch.object(fast_ps, "_plain_kernel", noting(fast_ps._plain_kernel)),
          patch.object(fast_ps, "_plain_summary_kernel", noting(fast_ps._plain_summary_kernel))):
        return simulate(p, "fast", keep_trace), seen


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(protocol=st.sampled_from(["async", "softsync"]), learners=st.integers(1, 12), n_frac=st.floats(0, 1),
       mb=st.sampled_from([1, 4, 16]), dist=st.sampled_from(["deterministic", "exponential", "lognormal"]),
       cv=st.sampled_from([0.0, 0.3]), frac=st.sampled_from([0.0, 0.3]), slow=st.sampled_from([1.0, 3.0]),
       lat=st.sampled_from([0.0, 1e-4]), bw=st.sampled_from([math.inf, 1e8, 1e7]), shards=st.integers(1, 3),
       apply_s=st.sampled_from([0.0, 2e-4]), apply_dist=st.sampled_from(["deterministic", "exponential"]),
       evals=st.integers(1, 4), seed=st.integers(0, 10**6), epochs=st.sampled_from([0.3, 1.0]))
def test_the_plain_kernel_is_byte_identical_to_simpy(protocol, learners, n_frac, mb, dist, cv, frac, slow, lat, bw,
                                                     shards, apply_s, apply_dist, evals, seed, epochs) -> None:
    n = max(1, min(learners, round(n_frac * learners)))
    p = scenario(protocol, learners, n, 0, mb, dist, cv, frac, slow, 0.0, 0.0, lat, bw, shards, apply_s,
                 apply_dist, evals, seed, epochs)
    ref = simulate(p, "simpy")
    fast, seen = plain_run(p)
    assert seen and seen[-1] == fast_ps.DONE  # the plain kernel ran the whole point
    assert T.encode(fast.trace) == T.encode(ref.trace)
    assert fast.summary == ref.summary
    lean, seen = plain_run(p, keep_trace=False)  # staleness counted in the kernel, no grad or apply rows
    assert seen[-1] == fast_ps.DONE
    assert lean.summary == ref.summary and lean.histogram == ref.histogram and lean.evals == ref.evals
    # staleness 0 and 1 counted in the kernel; larger values (input rows) and the evals through
    # 8-row buffers, folded at each NEED_FLUSH
    with (patch.object(fast_ps, "FLUSH_OPS_PLAIN", 8), patch.object(fast_ps, "HIST_PER_LEARNER", 0),
          patch.object(fast_ps, "HIST_BINS", 2)):
        lean, seen = plain_run(p, keep_trace=False)
    rows = int((ref.trace.inputs["staleness"] >= 2).sum() + (ref.trace.ops["kind"] == T.EVAL).sum())
    assert fast_ps.NEED_FLUSH in seen or rows <= 16
    assert lean.summary == ref.summary and lean.histogram == ref.histogram and lean.evals == ref.evals


def test_the_plain_kernel_resumes_after_each_refill() -> None:
    # a learner far luckier than its share (a persistent 20× straggler beside it) outruns its
    # first compute draws (NEED_WORK), and a summary-only run of more applies than its first
    # apply draws (here one chunk) asks for more (NEED_APPLY): the kernel stops, is refilled,
    # resumes as one run would
    p = make_point(protocol__name="async", cluster__learners=2, workload__epochs=6, cluster__minibatch=1,
                   cluster__stragglers__fraction=0.5, cluster__stragglers__slowdown=20.0, cluster__server__shards=2)
    ref = simulate(p, "simpy")
    fast, seen = plain_run(p)
    assert fast_ps.NEED_WORK in seen and T.encode(fast.trace) == T.encode(ref.trace)
    with patch.object(fast_ps, "SUMMARY_APPLY_CHUNKS", 1):
        lean, seen = plain_run(p, keep_trace=False)
    assert {fast_ps.NEED_WORK, fast_ps.NEED_APPLY} <= set(seen)
    assert lean.summary == ref.summary and lean.histogram == ref.histogram and lean.evals == ref.evals


def test_points_outside_the_plain_set_run_on_the_general_kernel() -> None:
    # Truth: the rule's own terms; each point breaks one of them and must not reach the plain kernel
    for sets in ({"protocol__name": "hardsync"}, {"protocol__name": "ssp"},
                 {"cluster__stragglers__stall_rate_per_s": 20.0, "cluster__stragglers__stall_mean_s": 0.01},
                 {"protocol__bucket_bytes": 8000}, {"cluster__server__group_size": 2}, {"cluster__gpus_per_node": 2}):
        p = make_point(cluster__learners=4, workload__epochs=0.05, **({"protocol__name": "async"} | sets))
        fast, seen = plain_run(p)
        assert not seen, sets
        assert T.encode(fast.trace) == T.encode(simulate(p, "simpy").trace)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(-3, 70_000), max_size=200), dtype=st.sampled_from(["i4", "i8"]))
def test_value_counts_are_the_values_counted(values, dtype) -> None:
    # Truth: collections.Counter of the values, sorted; a summary-only run folds its staleness so
    assert value_counts(np.array(values, dtype=dtype)) == sorted(Counter(values).items())
