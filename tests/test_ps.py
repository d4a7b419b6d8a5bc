"""The parameter-server engine against closed forms and hand-computed timelines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddlsim.simulator import trace as T
from ddlsim.simulator.dataorder import global_slice_start, shard_start
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

FREE = """
[cluster.network]
latency_s = 0.0
bandwidth_Bps = inf
[cluster.server]
apply_s = 0.0
"""


def point(protocol: str, learners: int, *, epochs: float, spe: int, mb: int = 1, dist: str = "exponential",
          extra: str = FREE, **kw) -> dict:
    toml = f"""
seed = 3
[workload]
epochs = {epochs}
samples_per_epoch = {spe}
[cluster]
learners = {learners}
minibatch = {mb}
[cluster.compute]
distribution = "{dist}"
base_s = 1.0
per_sample_s = 0.0
[protocol]
name = "{protocol}"
""" + extra
    return make_point(toml, **kw)


def harmonic(n: int) -> float:
    return sum(1.0 / k for k in range(1, n + 1))


def test_hardsync_time_per_update_is_Z_times_harmonic_number() -> None:
    # Truth: with exponential compute of mean Z and free server/network, a hardsync round
    # lasts as long as the slowest of λ learners: E[max of λ Exp(Z)] = Z·H_λ.
    lam, rounds = 8, 4000
    r = simulate(point("hardsync", lam, epochs=1, spe=lam * rounds))
    assert r.summary["updates"] == rounds
    assert r.summary["staleness_max"] == 0
    per_update = r.summary["sim_time_s"] / rounds
    assert per_update == pytest.approx(harmonic(lam), rel=0.03)


@pytest.mark.parametrize("lam,n", [(8, 1), (8, 2), (8, 8), (6, 3)])
def test_softsync_mean_staleness_matches_its_expectation(lam: int, n: int) -> None:
    # Truth (derivation in docs/simulator.md): with memoryless compute and a free server, the
    # other λ−1 learners push λ−1 gradients on average while one computes; an update takes
    # c = ⌊λ/n⌋ gradients and the accumulator's fill is uniform over 0..c−1, so by Hermite's
    # identity E[σ] = (λ−1)/c, close to Rudra's ⟨σ⟩ ≈ n.
    c = max(1, lam // n)
    r = simulate(point("softsync", lam, epochs=1, spe=60_000, protocol__n=n))
    assert r.summary["staleness_mean"] == pytest.approx((lam - 1) / c, abs=0.04 * max(1, (lam - 1) / c))


@pytest.mark.parametrize("n", [1, 15, 30])
def test_rudra_staleness_at_30_learners(n: int) -> None:
    # Truth: Rudra (ICDM 2016) measured at λ = 30 with near-homogeneous learners: 1-softsync
    # has σ ∈ {0, 1, 2}; 15- and 30-softsync have ⟨σ⟩ ≈ 15 and 30; σ rarely exceeds 2n.
    r = simulate(point("softsync", 30, epochs=1, spe=30_000, dist="lognormal", protocol__n=n))
    s = r.trace.inputs["staleness"]
    if n == 1:
        assert set(np.unique(s).tolist()) <= {0, 1, 2}
    else:
        assert r.summary["staleness_mean"] == pytest.approx(n, rel=0.1)
    assert (s > 2 * n).mean() < 0.01


def mva_throughput(customers: int, think: float, service: float) -> float:
    """Exact mean-value analysis of one FCFS exponential queue plus a delay station."""
    q = 0.0
    x = 0.0
    for k in range(1, customers + 1):
        r = service * (1 + q)
        x = k / (think + r)
        q = x * r
    return x


@pytest.mark.parametrize("service", [0.05, 0.2])
def test_async_throughput_matches_mean_value_analysis(service: float) -> None:
    # Truth: async learners blocked until their push is processed form a closed queueing
    # network: λ customers, a delay station (compute, mean Z) and the server (FCFS, exponential
    # service S). MVA gives its throughput exactly.
    lam = 8
    extra = f"""
[cluster.network]
latency_s = 0.0
bandwidth_Bps = inf
[cluster.server]
apply_s = {service}
apply_distribution = "exponential"
"""
    r = simulate(point("async", lam, epochs=1, spe=60_000, extra=extra))
    assert r.summary["gradients_per_s"] == pytest.approx(mva_throughput(lam, 1.0, service), rel=0.025)
    # and the server's utilisation is throughput × service time (utilisation law)
    assert r.summary["server_utilization"] == pytest.approx(r.summary["gradients_per_s"] * service, rel=0.03)


@pytest.mark.parametrize("bound", [0, 2])
def test_ssp_never_exceeds_its_bound(bound: int) -> None:
    # Truth: SSP's rule itself — a learner starts clock k only when the slowest learner's
    # clock (gradients processed) is at least k − s. Checked on every gradient of the trace.
    extra = FREE + """
[cluster.stragglers]
fraction = 0.25
slowdown = 3.0
"""
    lam = 4
    r = simulate(point("ssp", lam, epochs=1, spe=2000, extra=extra, protocol__staleness_bound=bound))
    ops = r.trace.ops
    grads = np.flatnonzero(ops["kind"] == T.GRAD)
    applies = np.flatnonzero(ops["kind"] == T.APPLY)
    g_of_apply = r.trace.inputs["grad_op"][ops["in_start"][applies]]
    processed = {i: np.sort(ops["t_start"][applies][ops["node"][g_of_apply] == i]) for i in range(lam)}
    worst = 0
    for g in grads:
        learner, k, t = ops["node"][g], ops["batch_index"][g], ops["t_start"][g]
        slowest = min(np.searchsorted(processed[j], t, side="right") for j in range(lam))
        worst = max(worst, k - slowest)
        assert k - slowest <= bound, (learner, k, slowest)
    assert worst == bound  # the straggler makes the bound bind


def test_hand_computed_hardsync_timeline() -> None:
    # Hand timeline: 2 learners, compute 1 s, message 4000 B at 20000 B/s (0.2 s on a link) +
    # 0.1 s latency, apply 0.05 s. Pulls leave the server NIC one after the other:
    # L0 weights arrive 0.3, L1 0.5; ready 1.3 / 1.5; pushes occupy NIC-in 1.3–1.5 / 1.5–1.7,
    # reach the server 1.6 / 1.8, applied 1.65 / 1.85 → update at 1.85; next pulls arrive
    # 2.15 / 2.35, ready 3.15 / 3.35.
    extra = """
[cluster.network]
latency_s = 0.1
bandwidth_Bps = 20000.0
bytes_per_param = 4
[cluster.server]
apply_s = 0.05
"""
    r = simulate(point("hardsync", 2, epochs=1, spe=4, dist="deterministic", extra=extra,
                       workload__param_count=1000))
    ops = r.trace.ops
    log = [(T.KIND_NAMES[k], int(n), round(float(a), 9), round(float(b), 9))
           for k, n, a, b in zip(ops["kind"], ops["node"], ops["t_start"], ops["t_end"])]
    assert log == [
        ("eval", 0, 0.0, 0.0),
        ("grad", 0, 0.3, 1.3), ("grad", 1, 0.5, 1.5), ("apply", 0, 1.85, 1.85),
        ("grad", 0, 2.15, 3.15), ("grad", 1, 2.35, 3.35), ("apply", 0, 3.7, 3.7),
        ("eval", 0, 3.7, 3.7),
    ]


def test_persistent_straggler_sets_the_hardsync_pace() -> None:
    # Truth: deterministic compute 1 s, one learner 3× slower, free network → every round lasts 3 s.
    extra = FREE + "\n[cluster.stragglers]\nfraction = 0.25\nslowdown = 3.0\n"
    r = simulate(point("hardsync", 4, epochs=1, spe=400, dist="deterministic", extra=extra))
    assert r.summary["sim_time_s"] == pytest.approx(3.0 * 100)


def test_transient_stalls_cost_their_expected_share() -> None:
    # Truth: stalls arrive as a Poisson process (rate r) and last Exp(m); while a learner
    # computes, each stall that starts adds its length, so a compute of mean Z takes
    # Z·(1 + r·m) on average (overlaps are rare at r·m = 0.05).
    extra = FREE + "\n[cluster.stragglers]\nstall_rate_per_s = 0.05\nstall_mean_s = 1.0\n"
    r = simulate(point("async", 1, epochs=1, spe=20_000, dist="deterministic", extra=extra))
    assert r.summary["sim_time_s"] / 20_000 == pytest.approx(1.05, rel=0.02)


def test_tree_aggregation_cuts_server_fan_in() -> None:
    # Truth: with groups of g learners the server processes one message per group round, so
    # its busy time is (gradients / g) × apply_s; every gradient is still applied once.
    extra = """
[cluster.network]
latency_s = 0.0
bandwidth_Bps = inf
[cluster.server]
apply_s = 0.01
group_size = 4
"""
    r = simulate(point("async", 8, epochs=1, spe=800, dist="deterministic", extra=extra))
    assert r.summary["gradients"] == 800
    busy = r.summary["server_utilization"] * r.summary["sim_time_s"]
    assert busy == pytest.approx(800 / 4 * 0.01)
    assert sorted(r.trace.inputs["grad_op"]) == list(np.flatnonzero(r.trace.ops["kind"] == T.GRAD))


def test_same_seed_same_bytes_and_other_seed_differs() -> None:
    p = point("async", 6, epochs=1, spe=600, extra="")
    a, b = T.encode(simulate(p).trace), T.encode(simulate(p).trace)
    assert a == b
    q = point("async", 6, epochs=1, spe=600, extra="", seed=4)
    assert T.encode(simulate(q).trace) != a


@pytest.mark.parametrize("protocol", ["hardsync", "softsync", "async", "ssp", "bounded_softsync"])
def test_every_trace_is_valid_and_covers_the_epochs(protocol: str) -> None:
    p = point(protocol, 5, epochs=2, spe=300, mb=4, extra="")
    r = simulate(p)
    T.check(r.trace)
    sizes = r.trace.ops["batch_size"][r.trace.ops["kind"] == T.GRAD]
    assert sizes.sum() >= 2 * 300
    evals = r.trace.ops["epoch"][r.trace.ops["kind"] == T.EVAL]
    assert evals[0] == 0 and evals[-1] >= 2 - 1e-9 and len(evals) >= 3
    assert math.isfinite(r.summary["sim_time_s"])
    # data order (docs/design.md): hardsync takes slice i of global batch k, others their own shard
    g = r.trace.ops["kind"] == T.GRAD
    node, k, start = (r.trace.ops[c][g] for c in ("node", "batch_index", "sample_start"))
    if protocol == "hardsync":
        expect = [global_slice_start(kk, i, 5, 4) for kk, i in zip(k, node)]
    else:
        expect = [shard_start(kk, i, 5, 4, 300) for kk, i in zip(k, node)]
    assert start.tolist() == expect


STRAGGLER = FREE + """
[cluster.stragglers]
fraction = 0.25
slowdown = 3.0
"""


def _worst_lead(trace: T.Trace, lam: int) -> int:
    """Largest k − (gradients the least advanced learner has finished by the start of learner
    i's k-th gradient) over the trace: SSP's clock difference, seen from finished gradients
    (a processed gradient was finished first, so a bound s on processed clocks bounds this)."""
    ops = trace.ops
    g = np.flatnonzero(ops["kind"] == T.GRAD)
    ends = {i: np.sort(ops["t_end"][g][ops["node"][g] == i]) for i in range(lam)}
    return max(int(ops["batch_index"][x]) - min(int(np.searchsorted(ends[m], ops["t_start"][x], side="right"))
                                               for m in range(lam)) for x in g)


@pytest.mark.parametrize("bound", [0, 2])
def test_bounded_softsync_keeps_the_bound_that_softsync_breaks(bound: int) -> None:
    # Truth: SSP's rule (a learner starts clock k only when the slowest has ≥ k − s processed),
    # checked on every gradient; plain softsync with the same straggler runs far ahead.
    lam = 4
    kw = dict(epochs=2, spe=2000, extra=STRAGGLER, protocol__n=2, protocol__staleness_bound=bound)
    bounded = simulate(point("bounded_softsync", lam, **kw))
    free = simulate(point("softsync", lam, **kw))
    assert _worst_lead(bounded.trace, lam) <= bound < _worst_lead(free.trace, lam)
    # every update still averages c = ⌊λ/n⌋ = 2 gradients (the last may be partial)
    counts = bounded.trace.ops["in_count"][bounded.trace.ops["kind"] == T.APPLY]
    assert (counts[:-1] == 2).all() and counts[-1] in (1, 2)


def _columns(trace: T.Trace) -> dict:
    return {k: v.tolist() for k, v in {**trace.ops, **{f"in_{k}": v for k, v in trace.inputs.items()}}.items()}


def test_bounded_softsync_reduces_to_ssp_and_to_softsync() -> None:
    # Truth: the definitions — with n = λ (c = 1) it is SSP with the same bound; with a bound
    # no learner can reach it is softsync. Same ops and inputs, column by column.
    lam = 4
    kw = dict(epochs=1, spe=800, extra=STRAGGLER)
    assert _columns(simulate(point("bounded_softsync", lam, protocol__n=lam, protocol__staleness_bound=1,
                                   **kw)).trace) == _columns(simulate(point("ssp", lam, protocol__staleness_bound=1,
                                                                            **kw)).trace)
    assert _columns(simulate(point("bounded_softsync", lam, protocol__n=2, protocol__staleness_bound=10**6,
                                   **kw)).trace) == _columns(simulate(point("softsync", lam, protocol__n=2,
                                                                            **kw)).trace)


def test_the_async_specialisation_of_the_core_is_its_general_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    # Truth: PSCore's general push (pending list, apply, release) on the same async run
    from ddlsim.simulator.protocols.ps import PSCore

    p = point("async", 5, epochs=2, spe=600, mb=4, extra=STRAGGLER, workload__evals_per_epoch=3)
    fast = T.encode(simulate(p).trace)
    monkeypatch.setattr(PSCore, "_push_one_alone", PSCore.push_one)
    assert T.encode(simulate(p).trace) == fast
