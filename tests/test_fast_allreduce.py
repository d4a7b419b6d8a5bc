"""The fast AllReduce engine against the SimPy engine (the reference model): byte-identical
traces and equal summaries on a property-based grid of scenarios."""

from __future__ import annotations

import math
from unittest.mock import MagicMock, patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlsim.simulator import fast_allreduce, fast_ps, run
from ddlsim.simulator import trace as T
from ddlsim.simulator.run import fast_engine, simulate
from tests.conftest import make_point


def scenario(nodes: int, g: int, mb: int, epochs: float, evals: int, seed: int, dist: str, cv: float, frac: float,
             slow: float, rate: float, stall: float, lat: float, bw: float, o: float, ilat: float, ibw: float,
             step: float, bf: float, bucket: int, algorithm: str) -> dict:
    inf = lambda x: "inf" if math.isinf(x) else x  # noqa: E731
    return make_point(f"""
seed = {seed}
[workload]
dataset = "cifar10"
model = "lenet"
epochs = {epochs}
samples_per_epoch = 2048
evals_per_epoch = {evals}
[cluster]
learners = {nodes * g}
minibatch = {mb}
gpus_per_node = {g}
[cluster.compute]
distribution = "{dist}"
base_s = 0.002
per_sample_s = 0.0005
cv = {cv}
backward_fraction = {bf}
step_s = {step}
[cluster.stragglers]
fraction = {frac}
slowdown = {slow}
stall_rate_per_s = {rate}
stall_mean_s = {stall}
[cluster.network]
latency_s = {lat}
bandwidth_Bps = {inf(bw)}
overhead_s = {o}
intra_latency_s = {ilat}
intra_bandwidth_Bps = {inf(ibw)}
[protocol]
name = "allreduce"
bucket_bytes = {bucket}
allreduce_algorithm = "{algorithm}"
""")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.integers(1, 9), g=st.sampled_from([1, 2, 4]), mb=st.sampled_from([1, 8, 64]),
       epochs=st.sampled_from([0.3, 1.0, 2.5]), evals=st.integers(1, 5), seed=st.integers(0, 10**6),
       dist=st.sampled_from(["deterministic", "exponential", "lognormal"]), cv=st.sampled_from([0.0, 0.3]),
       frac=st.sampled_from([0.0, 0.3]), slow=st.sampled_from([1.0, 3.0]), rate=st.sampled_from([0.0, 30.0]),
       stall=st.sampled_from([0.0, 0.01]), lat=st.sampled_from([0.0, 5e-5]), bw=st.sampled_from([math.inf, 1.25e9]),
       o=st.sampled_from([0.0, 1e-5]), ilat=st.sampled_from([0.0, 3e-6]), ibw=st.sampled_from([math.inf, 1.5e11]),
       step=st.sampled_from([0.0, 1e-3]), bf=st.sampled_from([0.1, 2 / 3, 1.0]),
       bucket=st.sampled_from([0, 40_000, 100_000, 10**9]),
       algorithm=st.sampled_from(["ring", "hierarchical", "halving_doubling", "recursive_doubling"]))
def test_fast_allreduce_is_byte_identical_to_simpy(nodes, g, mb, epochs, evals, seed, dist, cv, frac, slow, rate,
                                                   stall, lat, bw, o, ilat, ibw, step, bf, bucket, algorithm) -> None:
    p = scenario(nodes, g, mb, epochs, evals, seed, dist, cv, frac, slow, rate, stall, lat, bw, o, ilat, ibw, step,
                 bf, bucket, algorithm)
    assert fast_engine(p)[0] is fast_allreduce.simulate_allreduce_fast
    ref, fast = simulate(p, "simpy"), simulate(p, "fast")
    assert T.encode(fast.trace) == T.encode(ref.trace)
    assert fast.summary == ref.summary
    assert (fast.histogram, fast.evals, fast.sim_id) == (ref.histogram, ref.evals, ref.sim_id)
    # without the trace, and with blocks of a few rounds: the same numbers
    with patch.object(fast_allreduce, "BLOCK_VALUES", 3 * p["cluster"]["learners"]):
        bare = simulate(p, "fast", keep_trace=False)
    assert bare.trace is None
    assert (bare.summary, bare.histogram, bare.evals, bare.sim_id) == (ref.summary, ref.histogram, ref.evals,
                                                                       ref.sim_id)


def test_auto_picks_the_fast_allreduce_engine_and_fast_refuses_what_no_fast_engine_covers() -> None:
    p = scenario(4, 2, 8, 1.0, 2, 0, "lognormal", 0.3, 0.0, 1.0, 0.0, 0.0, 5e-5, 1.25e9, 0.0, 3e-6, 1.5e11, 0.0,
                 2 / 3, 100_000, "ring")
    spy = MagicMock(wraps=fast_allreduce.simulate_allreduce_fast)
    with patch.dict(run.FAST, {"allreduce": (fast_allreduce.covers, spy)}):
        simulate(p)  # auto
    assert spy.called
    grouped = make_point('[cluster]\nlearners = 4\n[cluster.server]\ngroup_size = 2\n[protocol]\nname = "ssp"\n')
    with patch.object(fast_ps, "numba", None), \
            pytest.raises(ValueError, match="does not cover this point: numba is not installed"):
        simulate(grouped, "fast")
