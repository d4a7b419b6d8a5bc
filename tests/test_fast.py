"""The fast engine against the SimPy engine: byte-identical traces and equal summaries on a
property-based grid of scenarios (the SimPy engine is the reference model)."""

from __future__ import annotations

import math
from unittest.mock import MagicMock, patch

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlsim.simulator import trace as T
from ddlsim.simulator import fast_ps
from ddlsim.simulator.fast_ps import covers
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

PROTOCOLS = ["hardsync", "softsync", "async", "ssp", "bounded_softsync"]


def scenario(protocol: str, learners: int, n: int, bound: int, mb: int, dist: str, cv: float, frac: float,
             slow: float, rate: float, stall: float, lat: float, bw: float, shards: int, apply_s: float,
             apply_dist: str, evals: int, seed: int, epochs: float, bucket: int = 0, bf: float = 2 / 3,
             g: int = 1, group: int = 1) -> dict:
    return make_point(f"""
seed = {seed}
[workload]
dataset = "digits"
model = "mlp"
epochs = {epochs}
evals_per_epoch = {evals}
[cluster]
learners = {learners}
minibatch = {mb}
gpus_per_node = {g}
[cluster.compute]
distribution = "{dist}"
base_s = 0.002
per_sample_s = 0.0005
cv = {cv}
backward_fraction = {bf}
[cluster.stragglers]
fraction = {frac}
slowdown = {slow}
stall_rate_per_s = {rate}
stall_mean_s = {stall}
[cluster.network]
latency_s = {lat}
bandwidth_Bps = {"inf" if math.isinf(bw) else bw}
[cluster.server]
shards = {shards}
apply_s = {apply_s}
apply_distribution = "{apply_dist}"
group_size = {group}
[protocol]
name = "{protocol}"
n = {n}
staleness_bound = {bound}
bucket_bytes = {bucket}
""")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(protocol=st.sampled_from(PROTOCOLS), learners=st.integers(1, 12), n_frac=st.floats(0, 1),
       bound=st.integers(0, 3), mb=st.sampled_from([1, 4, 16]),
       dist=st.sampled_from(["deterministic", "exponential", "lognormal"]), cv=st.sampled_from([0.0, 0.3]),
       frac=st.sampled_from([0.0, 0.3]), slow=st.sampled_from([1.0, 3.0]), rate=st.sampled_from([0.0, 20.0]),
       stall=st.sampled_from([0.0, 0.01]), lat=st.sampled_from([0.0, 1e-4]),
       bw=st.sampled_from([math.inf, 1e8, 1e7]), shards=st.integers(1, 3), apply_s=st.sampled_from([0.0, 2e-4]),
       apply_dist=st.sampled_from(["deterministic", "exponential"]), evals=st.integers(1, 4),
       seed=st.integers(0, 10**6), epochs=st.sampled_from([0.3, 1.0]),
       bucket=st.sampled_from([0, 0, 8000, 20000]), bf=st.sampled_from([0.3, 2 / 3, 1.0]),
       g=st.sampled_from([1, 1, 2, 4]), group=st.sampled_from([1, 1, 2, 3]))
def test_fast_engine_is_byte_identical_to_simpy(protocol, learners, n_frac, bound, mb, dist, cv, frac, slow, rate,
                                                stall, lat, bw, shards, apply_s, apply_dist, evals, seed,
                                                epochs, bucket, bf, g, group) -> None:
    learners = max(g, learners - learners % g)  # whole nodes
    group = min(group, learners)                 # aggregators of at most every learner
    n = max(1, min(learners, round(n_frac * learners)))
    p = scenario(protocol, learners, n, bound, mb, dist, cv, frac, slow, rate, stall, lat, bw, shards, apply_s,
                 apply_dist, evals, seed, epochs, bucket, bf, g, group)
    assert covers(p) is None  # (38,440 gradient bytes: 5 or 2 buckets, or one)
    ref, fast = simulate(p, "simpy"), simulate(p, "fast")
    assert T.encode(fast.trace) == T.encode(ref.trace)
    assert fast.summary == ref.summary
    # without the trace: rows through 64-row buffers, draws generated as needed — same numbers
    with patch.object(fast_ps, "FLUSH_OPS", 64):
        lean = simulate(p, "fast", keep_trace=False)
    assert lean.trace is None and lean.summary == ref.summary and lean.sim_id == ref.trace.header["run_id"]
    assert lean.histogram == ref.histogram and lean.evals == ref.evals


def test_auto_uses_the_fast_engine_only_where_it_covers_the_point() -> None:
    covered = make_point(protocol__name="async", cluster__learners=4, workload__epochs=0.2)
    grouped = make_point(protocol__name="ssp", cluster__learners=4, workload__epochs=0.2,
                         cluster__server__group_size=2)
    gossip = make_point(protocol__name="adpsgd", cluster__learners=4, workload__epochs=0.2)
    assert covers(covered) is None and covers(grouped) is None and "parameter-server" in covers(gossip)
    # without numba no fast engine covers a point: auto falls back to the reference; fast refuses
    spy = MagicMock(wraps=fast_ps.simulate_ps_fast)
    with patch.object(fast_ps, "numba", None), patch.object(fast_ps, "simulate_ps_fast", spy):
        assert covers(grouped) == "numba is not installed"
        assert T.encode(simulate(grouped, "auto").trace) == T.encode(simulate(grouped, "simpy").trace)
        with pytest.raises(ValueError, match="does not cover this point: numba is not installed"):
            simulate(grouped, "fast")
    assert not spy.called


def test_the_fast_engine_refills_its_draws_on_long_runs() -> None:
    # a learner far luckier than its share (a persistent 20× straggler beside it) outruns the
    # first draw buffer: the kernel stops, the buffer is refilled from the same stream, it resumes
    p = make_point(protocol__name="async", cluster__learners=2, workload__epochs=6, cluster__minibatch=1,
                   cluster__stragglers__fraction=0.5, cluster__stragglers__slowdown=20.0,
                   cluster__stragglers__stall_rate_per_s=50.0, cluster__stragglers__stall_mean_s=0.001)
    assert T.encode(simulate(p, "fast").trace) == T.encode(simulate(p, "simpy").trace)
    ref = simulate(p, "simpy")
    lean = simulate(p, "fast", keep_trace=False)  # refills drop the draws already used
    assert lean.summary == ref.summary and lean.histogram == ref.histogram


def test_staleness_figures_from_a_histogram_equal_numpys_on_the_values():
    """The σ columns computed from (σ, count) pairs (what a run without a kept trace has) are
    NumPy's mean and linear percentiles of the expanded values, to the last bit for the
    percentiles and within one rounding for the mean."""
    from ddlsim.simulator.stats import histogram, merge_histograms, stats_from_histogram

    rng = np.random.default_rng(7)
    for _ in range(500):
        n = int(rng.integers(1, 400))
        values = rng.geometric(rng.uniform(0.05, 0.9), size=n) - 1
        cut = int(rng.integers(0, n + 1))
        hist = merge_histograms(histogram(values[:cut]), histogram(values[cut:]))
        got = stats_from_histogram(hist)
        s = values.astype(np.float64)
        assert got["staleness_p50"] == np.percentile(s, 50)
        assert got["staleness_p99"] == np.percentile(s, 99)
        assert got["staleness_max"] == s.max()
        assert got["staleness_mean"] == pytest.approx(s.mean(), rel=1e-15, abs=0)
        assert got["staleness_mean"] == int(values.sum()) / n
    assert np.isnan(stats_from_histogram([])["staleness_mean"])


@pytest.mark.parametrize("protocol,bound", [("ssp", 0), ("ssp", 2), ("bounded_softsync", 1), ("hardsync", 0)])
def test_many_learners_waiting_at_once_are_released_as_the_reference_releases_them(protocol, bound) -> None:
    # λ = 80 with a quarter of them 4× stragglers: dozens wait at once for the slowest (SSP) or
    # the barrier (hardsync), and the released are sorted by the fast path (NumPy's sort beyond
    # 32); the SimPy reference keeps its own rule (buckets of counts in a heap)
    p = make_point(protocol__name=protocol, protocol__staleness_bound=bound, cluster__learners=80,
                   cluster__minibatch=4, workload__epochs=1.5, cluster__stragglers__fraction=0.25,
                   cluster__stragglers__slowdown=4.0, cluster__compute__cv=0.3)
    assert covers(p) is None
    ref, fast = simulate(p, "simpy"), simulate(p, "fast")
    assert T.encode(fast.trace) == T.encode(ref.trace)
    # SSP's guarantee: no learner runs more than bound + 1 of its gradients ahead of the slowest
    assert ref.summary["staleness_max"] <= ((bound + 1) * 80 if protocol != "hardsync" else 0)
    assert fast.summary == ref.summary


def test_a_long_wait_under_frequent_stalls_runs_on_the_fast_engine_as_on_simpy() -> None:
    # SSP with 100 stalls/s: a learner waiting for the slowest sits through hundreds of stalls
    # before its next minibatch (the fast engine used to give up on this point)
    p = make_point(protocol__name="ssp", cluster__learners=2, cluster__minibatch=1, workload__epochs=0.3,
                   cluster__stragglers__stall_rate_per_s=100.0, cluster__stragglers__stall_mean_s=0.05)
    assert T.encode(simulate(p, "fast").trace) == T.encode(simulate(p, "simpy").trace)


@pytest.mark.parametrize("bucket", [0, 4000])
def test_a_minibatch_spanning_hundreds_of_stalls_resumes_its_walk_after_a_refill(bucket) -> None:
    # 1 s of work under 1000 stalls/s: ≈ 1000 stalls inside one minibatch, beyond the draws the
    # kernel keeps at hand; the walk stops, the draws are refilled, it resumes where it stopped
    # (with 10 gradient buckets: inside the walk to whichever bucket's mark it had reached)
    p = make_point(protocol__name="async", cluster__learners=2, cluster__minibatch=1, workload__epochs=0.01,
                   cluster__compute__base_s=1.0, cluster__stragglers__stall_rate_per_s=1000.0,
                   cluster__stragglers__stall_mean_s=1e-4, protocol__bucket_bytes=bucket)
    ref = simulate(p, "simpy")
    walked_to = []
    kernel = fast_ps._kernel

    def noting(*args):
        status = kernel(*args)
        walked_to.append(int(args[2][20]) if status == fast_ps.NEED_STALL and args[2][18] else -1)
        return status

    with patch.object(fast_ps, "_kernel", noting):
        fast = simulate(p, "fast")
    resumed = set(walked_to) - {-1}
    assert resumed and (not bucket or max(resumed) > 0)  # with buckets: past the first bucket's mark
    assert T.encode(fast.trace) == T.encode(ref.trace)
    assert T.encode(simulate(p, "fast").trace) == T.encode(ref.trace)
    assert simulate(p, "fast", keep_trace=False).summary == ref.summary


def test_a_huge_staleness_bound_costs_no_memory() -> None:
    # staleness_bound = 10**9 on a 4-learner run: the ring of counts is bounded by the run's length
    p = make_point(protocol__name="ssp", protocol__staleness_bound=10**9, cluster__learners=4, workload__epochs=0.05)
    assert T.encode(simulate(p, "fast").trace) == T.encode(simulate(p, "simpy").trace)


@pytest.mark.parametrize("protocol", ["async", "ssp", "hardsync"])
def test_a_run_of_fewer_gradients_than_a_group_gets_buffers_big_enough_without_its_trace(protocol) -> None:
    # Truth: the SimPy engine. 8 learners in one aggregator group, 3 gradients in the whole run:
    # a summary-only run's buffers (sized by the run) hold less than one group's message needs
    # even when empty, so they must grow rather than be folded again and again (this hung).
    p = make_point(protocol__name=protocol, cluster__learners=8, cluster__server__group_size=8,
                   cluster__minibatch=32, workload__epochs=0.05)
    ref = simulate(p, "simpy")
    lean = simulate(p, "fast", keep_trace=False)
    assert (lean.summary, lean.histogram, lean.evals) == (ref.summary, ref.histogram, ref.evals)
