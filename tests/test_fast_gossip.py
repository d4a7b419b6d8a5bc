"""The fast engines of SGP, D-PSGD and AD-PSGD against their SimPy engines (the reference
model): byte-identical traces and equal summaries on a property-based grid of scenarios."""

from __future__ import annotations

import math
from unittest.mock import patch

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ddlsim.simulator import fast_adpsgd, fast_dpsgd, fast_nodes, fast_ps, fast_sgp
from ddlsim.simulator import trace as T
from ddlsim.simulator.run import fast_engine, simulate
from tests.conftest import make_point

ENGINES = {"sgp": fast_sgp.simulate_sgp_fast, "dpsgd": fast_dpsgd.simulate_dpsgd_fast,
           "adpsgd": fast_adpsgd.simulate_adpsgd_fast}
OVERLAPS = {"sgp": [0, 0, 1, 2, 5], "dpsgd": [0, 1], "adpsgd": [0]}  # SGP's τ; D-PSGD's schedule


def scenario(protocol: str, n: int, g: int, mb: int, epochs: float, evals: int, seed: int, dist: str, cv: float,
             frac: float, slow: float, lat: float, bw: float, o: float, ilat: float, ibw: float, topo: str,
             peers: int, overlap: int, rate: float = 0.0, stall: float = 0.01) -> dict:
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
learners = {n}
minibatch = {mb}
gpus_per_node = {g}
[cluster.compute]
distribution = "{dist}"
base_s = 0.002
per_sample_s = 0.0005
cv = {cv}
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
name = "{protocol}"
topology = "{topo}"
peers = {peers}
overlap = {overlap}
""")


@settings(max_examples=90, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(protocol=st.sampled_from(sorted(ENGINES)), nodes=st.integers(1, 8), g=st.sampled_from([1, 1, 2, 4]),
       mb=st.sampled_from([1, 8, 64]), epochs=st.sampled_from([0.3, 1.0, 2.5]), evals=st.integers(1, 5),
       seed=st.integers(0, 10**6), dist=st.sampled_from(["deterministic", "exponential", "lognormal"]),
       cv=st.sampled_from([0.0, 0.3]), frac=st.sampled_from([0.0, 0.3]), slow=st.sampled_from([1.0, 3.0]),
       lat=st.sampled_from([0.0, 5e-5, 2e-3]), bw=st.sampled_from([math.inf, 1.25e9, 2e7]),
       o=st.sampled_from([0.0, 1e-5]), ilat=st.sampled_from([0.0, 3e-6]), ibw=st.sampled_from([math.inf, 1.5e11, 5e7]),
       topo=st.sampled_from(["npdde", "dde", "ring", "complete", "bipartite_exp"]), peers=st.integers(1, 3),
       pick=st.integers(0, 4), rate=st.sampled_from([0.0, 0.0, 30.0]))
def test_fast_gossip_engines_are_byte_identical_to_simpy(protocol, nodes, g, mb, epochs, evals, seed, dist, cv, frac,
                                                         slow, lat, bw, o, ilat, ibw, topo, peers, pick, rate) -> None:
    overlap = OVERLAPS[protocol][pick % len(OVERLAPS[protocol])]
    try:
        p = scenario(protocol, nodes * g, g, mb, epochs, evals, seed, dist, cv, frac, slow, lat, bw, o, ilat, ibw,
                     topo, peers, overlap, rate)
    except Exception:  # a graph the scenario refuses (e.g. more peers than nodes): nothing to compare
        return
    assert fast_engine(p)[0] is ENGINES[protocol]
    ref, fast = simulate(p, "simpy"), simulate(p, "fast")
    assert T.encode(fast.trace) == T.encode(ref.trace)
    assert fast.summary == ref.summary
    assert (fast.histogram, fast.evals, fast.sim_id) == (ref.histogram, ref.evals, ref.sim_id)
    bare = simulate(p, "fast", keep_trace=False)
    assert bare.trace is None
    assert (bare.summary, bare.histogram, bare.evals) == (ref.summary, ref.histogram, ref.evals)


SHARED = {fast_nodes.NEED_WORK, fast_nodes.NEED_POOL, fast_nodes.NEED_STALL, fast_nodes.NEED_ROWS}
SMALLEST = {  # every buffer an engine grows, at its smallest; the statuses that must come back
    "sgp": (fast_sgp, "_initial_sizes", lambda n, tau, indeg: (1, 1, 1), 3,
            SHARED | {fast_sgp.NEED_HELD, fast_sgp.NEED_RING}),
    "dpsgd": (fast_dpsgd, "_initial_sizes", lambda n, degree: (1, 1), 1, SHARED | {fast_dpsgd.NEED_RING}),
    "adpsgd": (fast_adpsgd, "_initial_pool", lambda n: 1, 0, SHARED),
}


def small_columns(n_ops: int, n_inputs: int):
    """A run's first trace columns at 16 ops and 4 inputs: the columns must grow."""
    return REAL_COLUMNS(min(n_ops, 16), min(n_inputs, 4))


REAL_COLUMNS = fast_nodes.trace_columns


@pytest.mark.parametrize("protocol", sorted(SMALLEST))
def test_the_fast_gossip_engines_grow_their_buffers_as_the_run_asks(protocol) -> None:
    """Draw buffers of 2, refills of 3, stall draws of 12, a message pool (and held lists,
    arrival and inbox rings) of 1, trace columns of 16 ops: every refill and growth path runs,
    and the trace is still the reference's. Without the trace, buffers of 16 rows are folded
    away hundreds of times, and the summary, histogram and schedule are the reference's."""
    module, name, smallest, overlap, expected = SMALLEST[protocol]
    p = scenario(protocol, 12, 2, 8, 3.0, 3, 7, "exponential", 0.0, 0.3, 3.0, 1e-3, 2e7, 1e-5, 3e-6, 5e7, "npdde",
                 2, overlap, rate=200.0, stall=0.001)
    ref = simulate(p, "simpy")
    real, kernel = fast_nodes.Buffers, module._kernel
    statuses: set[int] = set()

    def recording(*args):
        status = kernel(*args)
        statuses.add(status)
        return status

    with patch.object(fast_nodes, "CHUNK", 3), patch.object(fast_ps, "CHUNK", 3), \
            patch.object(fast_nodes, "Buffers", lambda rows, cap: real(rows, 2)), \
            patch.object(module, name, smallest), \
            patch.object(module, "_kernel", recording), patch.object(fast_nodes, "trace_columns", small_columns):
        fast = simulate(p, "fast")
    assert statuses == expected | {fast_nodes.DONE}
    assert T.encode(fast.trace) == T.encode(ref.trace)
    assert fast.summary == ref.summary
    folds = []
    fold = fast_nodes.Run._rows

    def counting(run):
        folds.append((int(run.st[0]), len(run.ops["kind"])))
        return fold(run)

    with patch.object(fast_nodes, "FLUSH_OPS", 16), patch.object(fast_nodes.Run, "_rows", counting):
        bare = simulate(p, "fast", keep_trace=False)
    assert bare.trace is None and len(folds) > 100
    assert max(rows for rows, _ in folds) <= 32 and max(size for _, size in folds) <= 64  # never the whole run
    assert (bare.summary, bare.histogram, bare.evals) == (ref.summary, ref.histogram, ref.evals)


@pytest.mark.parametrize("protocol", sorted(ENGINES))
def test_a_minibatch_spanning_hundreds_of_stalls_resumes_its_walk_after_a_refill(protocol) -> None:
    """≈ 600 stalls of 1 µs inside each 6 ms minibatch, stall draws 256 at a time (128 stalls): a
    walk outruns the draws a node has, stops, has them refilled and resumes where it stopped."""
    p = scenario(protocol, 4, 1, 8, 0.1, 1, 3, "lognormal", 0.3, 0.0, 1.0, 5e-5, 1.25e9, 0.0, 0.0, math.inf,
                 "npdde", 1, 0, rate=1e5, stall=1e-6)
    assert fast_engine(p)[0] is ENGINES[protocol]
    ref = simulate(p, "simpy")
    resumed = []
    grow = fast_nodes.Run.grow

    def noting(run, status):
        resumed.append(status == fast_nodes.NEED_STALL and bool(run.walk[:, 0].any()))
        return grow(run, status)

    with patch.object(fast_nodes, "CHUNK", 64), patch.object(fast_ps, "CHUNK", 64), \
            patch.object(fast_nodes.Run, "grow", noting):
        fast = simulate(p, "fast")
    assert any(resumed)
    assert T.encode(fast.trace) == T.encode(ref.trace)
    assert fast.summary == ref.summary


def test_the_kernels_column_places_follow_columns_order() -> None:
    """``C_KIND`` … ``C_STALENESS`` are the places of :data:`.fast_nodes.COLUMNS` in order."""
    names = [name for _, name in fast_nodes.COLUMNS]
    assert [getattr(fast_nodes, "C_" + name.upper()) for name in names] == list(range(len(names)))
