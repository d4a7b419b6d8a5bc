"""The decentralized protocols' rules (simulator/protocols/gossip_rules.py) against hand-computed
cases, and the live nodes against the simulator: the same structure per node and iteration."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from ddlsim.simulator.protocols import gossip_rules as R
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import APPLY, EVAL, GRAD, MIX, Trace
from tests.conftest import make_point

try:
    import numba
except ImportError:  # pragma: no cover
    numba = None


# -- the rules against hand-computed cases --------------------------------------------------

def test_sgp_rules_on_the_4_node_one_peer_exponential_graph() -> None:
    # Truth by hand: npdde, n = 4, p = 1: L = ⌊log2 3⌋ + 1 = 2 phases; node r sends to r + 1 at
    # even iterations and to r + 2 at odd ones; every node has one out-peer: share ½.
    r = R.SGPRules("npdde", 4, 1, tau=0)
    assert r.phases == 2
    assert [r.sends(i, 0) for i in range(4)] == [(1,), (2,), (3,), (0,)]
    assert [r.sends(i, 3) for i in range(4)] == [(2,), (3,), (0,), (1,)]
    assert [r.senders(i, 0) for i in range(4)] == [(3,), (0,), (1,), (2,)]
    assert r.share(2, 5) == 0.5 and r.indeg == [[1] * 4, [1] * 4]
    # two peers on 9 nodes: base 3, distances 1, 2 then 3, 6: share ⅓, each receives two
    r2 = R.SGPRules("npdde", 9, 2, tau=1)
    assert r2.sends(4, 0) == (5, 6) and r2.sends(4, 1) == (7, 1) and r2.senders(0, 1) == (3, 6)
    assert r2.share(0, 0) == 1 / 3
    out_ptr, out_idx, indeg, coefs = r2.tables()
    assert out_idx[out_ptr[1, 4]:out_ptr[1, 5]].tolist() == [7, 1]
    assert (indeg == 2).all() and np.allclose(coefs, 1 / 3, rtol=0, atol=0)


def test_sgp_boundary_rules() -> None:
    # τ = 0: iteration k + 1 needs every message of k; τ = 1: those of k − 1
    assert not R.sgp_may_advance(complete=2, k=3, tau=0) and R.sgp_may_advance(3, 3, 0)
    assert R.sgp_may_advance(2, 3, 1) and not R.sgp_may_advance(1, 3, 1)
    # a held message is mixed at the boundary of its own iteration or a later one
    assert R.sgp_mix_at_boundary(3, 3) and R.sgp_mix_at_boundary(2, 3) and not R.sgp_mix_at_boundary(4, 3)
    # on arrival: only while waiting at a boundary ≥ its iteration (−1: computing)
    assert not R.sgp_mix_on_arrival(0, -1) and R.sgp_mix_on_arrival(2, 2) and not R.sgp_mix_on_arrival(3, 2)


@pytest.mark.parametrize("compiled", [False, True])
def test_sgp_mark_moves_over_complete_iterations_only(compiled: bool) -> None:
    # Truth by hand: node 1 of 2 receives 2 messages at even iterations, 1 at odd ones;
    # iterations 0 (2 in), 1 (1 in), 2 (1 of 2) and 3 (1 in) on a ring of 4: the mark moves to 1
    # and clears the slots of 0 and 1; iteration 2 is incomplete, so 3 waits though complete.
    if compiled and numba is None:  # pragma: no cover
        pytest.skip("numba is not installed")
    indeg: Any = [0, 2, 0, 1]                # phase-major: [phase 0: node 0, node 1; phase 1: …]
    arrived: Any = [0, 0, 0, 0, 2, 1, 1, 1]  # node-major rings of 4
    fn = R.sgp_advance
    if compiled:  # the kernel's form: NumPy arrays, the function compiled by numba
        fn = numba.njit(cache=True, nogil=True)(R.sgp_advance)  # as the fast engine compiles it
        indeg, arrived = np.array(indeg, np.int64), np.array(arrived, np.int64)
    assert fn(arrived, 4, -1, 6, indeg, 2, 2, 1) == 1 and [int(x) for x in arrived] == [0, 0, 0, 0, 0, 0, 1, 1]
    assert fn(arrived, 4, 1, 6, indeg, 2, 2, 1) == 1  # nothing more came: the mark stays
    arrived[6] += 1  # the second message of iteration 2: the mark passes 2 and 3
    assert fn(arrived, 4, 1, 6, indeg, 2, 2, 1) == 3 and [int(x) for x in arrived[4:]] == [0, 0, 0, 0]
    # the last iteration bounds the mark (K = 2: iterations 0 and 1 only)
    assert R.sgp_advance([0, 0, 1, 1], 2, -1, 2, [0, 1, 0, 1], 2, 2, 1) == 1


def test_dpsgd_rules_on_the_ring() -> None:
    # Truth by hand: ring of 4, both directions: every node has 2 neighbours, Metropolis
    # weights 1/(1 + 2) = ⅓ and W_ii = ⅓; mixes in ascending order, the first scaling x_i by
    # W_ii; sends in order of distance (j − i) mod 4.
    r = R.DPSGDRules("ring", 4, 1, overlap=0)
    third = 1.0 - 2 * (1 / 3)
    assert r.blocking and r.phases == 1
    assert r.mixes(0, 7) == [(1, 1 / 3, third), (3, 1 / 3, 1.0)]
    assert r.mixes(2, 0) == [(1, 1 / 3, third), (3, 1 / 3, 1.0)]
    assert r.sends(0, 0) == [1, 3] and r.sends(2, 0) == [3, 1] and r.sends(1, 0) == [2, 0]
    nb_ptr, nb_idx, nb_w, nb_self, send_idx = r.tables()
    lo, hi = nb_ptr[0, 2], nb_ptr[0, 3]
    assert nb_idx[lo:hi].tolist() == [1, 3] and send_idx[lo:hi].tolist() == [3, 1]
    assert nb_self[lo:hi].tolist() == [third, 1.0] and np.allclose(nb_w, 1 / 3, rtol=0, atol=0)
    # bipartite pairs on 4 nodes: one partner each, ½ and ½; the pairs change with the phase
    b = R.DPSGDRules("npdde", 4, 1, overlap=1)
    assert not b.blocking and b.mixes(1, 0) == [(2, 0.5, 0.5)] and b.mixes(1, 1) == [(0, 0.5, 0.5)]


def test_adpsgd_rules() -> None:
    # Truth: the picks are NumPy's bounded integers from SeedSequence([seed, 11]) in node
    # order, K per node (drawn again here); ring of 4: active nodes 1 and 3, both with
    # passive candidates 0 and 2; passive nodes pick 0 of nothing.
    K = 7
    r = R.ADPSGDRules("ring", 4, 1, seed=3, K=K)
    assert r.cands == [[], [0, 2], [], [0, 2]] and [r.active(i) for i in range(4)] == [False, True, False, True]
    rng = np.random.default_rng(np.random.SeedSequence([3, 11]))
    expect = [rng.integers(0, 1 if i % 2 == 0 else 2, size=K).tolist() for i in range(4)]
    assert r.picks.tolist() == expect
    assert [r.peer(1, k) for k in range(K)] == [[0, 2][p] for p in expect[1]]
    c_ptr, c_idx, picks = r.tables()
    assert c_ptr.tolist() == [0, 0, 2, 2, 4] and c_idx.tolist() == [0, 2, 0, 2] and picks is r.picks
    # σ: the mixes between read and apply, less an active node's own averaging
    assert R.adpsgd_staleness(9, 6, True) == 2 and R.adpsgd_staleness(9, 6, False) == 3
    assert R.AVERAGE_COEF == 0.5


def test_allreduce_weights() -> None:
    assert R.allreduce_weights(4) == [0.25] * 4 and R.allreduce_weights(1) == [1.0]


# -- live against simulated: the same structure ---------------------------------------------

LIVE = """
seed = 2
[workload]
epochs = {epochs}
samples_per_epoch = 256
param_count = 64
[cluster]
learners = 4
minibatch = 8
[cluster.compute]
distribution = "lognormal"
cv = 0.5
base_s = 0.002
per_sample_s = 0.0
[cluster.network]
latency_s = 0.001
[protocol]
name = "{protocol}"
overlap = {overlap}
[live]
compute = "emulated"
timeout_s = 60
"""


def structure(trace: Trace) -> dict[int, list[tuple]]:
    """Per node, per iteration (an iteration starts with the node's grad): the grad's read
    version and minibatch, the order of its op kinds, its applies (version, inputs as (node,
    minibatch, weight, σ)) and its mixes as a multiset of (source, source version, coef,
    self_coef). No times, no epochs, no eval (those depend on timing)."""
    ops, inputs = trace.ops, trace.inputs
    grads = {int(g): (int(ops["node"][g]), int(ops["batch_index"][g])) for g in np.flatnonzero(ops["kind"] == GRAD)}
    out: dict[int, list[tuple]] = {}
    cur: dict[int, list] = {}

    def close(i: int) -> None:
        if i in cur:
            g, kinds, applies, mixes = cur.pop(i)
            out.setdefault(i, []).append((g, "".join(kinds), tuple(applies), tuple(sorted(Counter(mixes).items()))))

    for op in range(len(ops["kind"])):
        kind, i = int(ops["kind"][op]), int(ops["node"][op])
        if kind == EVAL:
            continue
        if kind == GRAD:
            close(i)
            cur[i] = [(int(ops["src_version"][op]), int(ops["sample_start"][op]), int(ops["batch_size"][op]),
                       int(ops["batch_index"][op])), ["G"], [], []]
        elif kind == APPLY:
            lo, cnt = int(ops["in_start"][op]), int(ops["in_count"][op])
            ins = tuple((grads[int(inputs["grad_op"][x])], float(inputs["weight"][x]), int(inputs["staleness"][x]))
                        for x in range(lo, lo + cnt))
            cur[i][1].append("A")
            cur[i][2].append((int(ops["version"][op]), ins))
        elif kind == MIX:
            cur[i][1].append("M")
            cur[i][3].append((int(ops["src_node"][op]), int(ops["src_version"][op]), float(ops["coef"][op]),
                              float(ops["self_coef"][op])))
    for i in list(cur):
        close(i)
    return out


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("protocol,overlap", [("sgp", 0), ("dpsgd", 0), ("dpsgd", 1), ("allreduce", 0)])
def test_live_nodes_have_the_simulated_structure(protocol: str, overlap: int) -> None:
    # Truth: the SimPy engine's trace of the same point (timing aside, each node's iteration is
    # the same ops on the same versions with the same coefficients and weights).
    from ddlsim.backends.live import run_measured

    p = make_point(LIVE.format(protocol=protocol, overlap=overlap, epochs=0.5))
    sim = simulate(p, "simpy").trace
    live, _ = run_measured(p, 0.0)
    s, m = structure(sim), structure(live)
    assert sorted(m) == list(range(4)) and all(len(m[i]) == sim.header["iterations"] for i in m)
    assert m == s
    # the comparison sees a coefficient: one mix of the live trace changed by 1e-3 is caught
    mixes = np.flatnonzero(live.ops["kind"] == MIX)
    live.ops["coef"][mixes[len(mixes) // 2]] += 1e-3
    assert structure(live) != s


def npdde_in_peer(i: int, k: int, n: int) -> int:
    """One-peer NPDDE by hand (docs/design.md): node r sends to (r + 2^(k mod L)) mod N at
    iteration k, L = ⌊log2(N − 1)⌋ + 1; so i receives from (i − 2^(k mod L)) mod N."""
    L = int(np.floor(np.log2(n - 1))) + 1
    return (i - 2 ** (k % L)) % n


def sgp_check(trace: Trace, tau: int) -> tuple[list[str], Counter, dict[int, list[tuple]]]:
    """SGP's timing-independent rules on a one-peer NPDDE trace, recomputed from its ops: the
    rules it breaks (empty: none), the messages mixed as a multiset of (receiver, sender, the
    sender's iteration, coef, self_coef), and per node and iteration the ops that timing
    cannot change (the grad's minibatch, "GAM" with σ 0 and weight 1, the kept share).

    Rules: an iteration starts with grad (on the node's latest version), apply (σ 0, weight 1),
    the kept share (src itself at the applied version, coef 0, self_coef ½); every other mix is
    a message of the in-peer of its iteration m (coef ½, the sender's post-apply version of
    iteration m, self_coef 1), mixed exactly once, at an iteration of its receiver within
    [m, m + τ]; PushSum's weights (w recomputed from the mixes) sum to N at the end."""
    ops, inputs = trace.ops, trace.inputs
    n, K = int(trace.header["nodes"]), int(trace.header["iterations"])
    bad: list[str] = []
    version = [0] * n
    k_of = [-1] * n
    sent: dict[tuple[int, int], int] = {}      # (node, post-apply version) → its iteration
    w: dict[tuple[int, int], float] = {(i, 0): 1.0 for i in range(n)}
    fixed: dict[int, list[tuple]] = {i: [] for i in range(n)}
    msgs: Counter = Counter()
    tail: dict[int, str] = {}
    for op in range(len(ops["kind"])):
        kind, i = int(ops["kind"][op]), int(ops["node"][op])
        if kind == EVAL:
            continue
        v = version[i]
        if kind == GRAD:
            if tail.get(i, "GAM")[:3] != "GAM":
                bad.append(f"node {i} iteration {k_of[i]}: ops {tail[i]}")
            k_of[i] += 1
            tail[i] = "G"
            if int(ops["src_version"][op]) != v:
                bad.append(f"node {i} iteration {k_of[i]}: grad read {int(ops['src_version'][op])}, latest {v}")
            fixed[i].append((int(ops["sample_start"][op]), int(ops["batch_size"][op]), int(ops["batch_index"][op])))
            continue
        k = k_of[i]
        if kind == APPLY:
            tail[i] += "A"
            lo = int(ops["in_start"][op])
            if int(ops["in_count"][op]) != 1 or float(inputs["weight"][lo]) != 1.0 or int(inputs["staleness"][lo]):
                bad.append(f"node {i} iteration {k}: apply inputs")
            sent[(i, v + 1)] = k
            w[(i, v + 1)] = w[(i, v)]
        else:
            tail[i] += "M"
            src, sv = int(ops["src_node"][op]), int(ops["src_version"][op])
            coef, sc = float(ops["coef"][op]), float(ops["self_coef"][op])
            if len(tail[i]) == 3:  # the kept share
                if (src, sv, coef, sc) != (i, v, 0.0, 0.5):
                    bad.append(f"node {i} iteration {k}: kept share {(src, sv, coef, sc)}")
                fixed[i][-1] += (tail[i], (src, sv - v, coef, sc))
            else:
                m = sent.get((src, sv), -1)
                msgs[(i, src, m, coef, sc)] += 1
                if m < 0 or src != npdde_in_peer(i, m, n) or coef != 0.5 or sc != 1.0:
                    bad.append(f"node {i} iteration {k}: mix {(src, sv, coef, sc)} (sender iteration {m})")
                elif not m <= k <= m + tau:
                    bad.append(f"node {i}: message of iteration {m} mixed at iteration {k} (τ = {tau})")
            w[(i, v + 1)] = sc * w[(i, v)] + coef * w[(src, sv)]
        version[i] = v + 1
    expected = Counter((i, npdde_in_peer(i, m, n), m, 0.5, 1.0) for i in range(n) for m in range(K))
    if msgs != expected:
        bad.append(f"messages mixed other than once each: {sorted((msgs - expected) + (expected - msgs))}")
    total = sum(w[(i, version[i])] for i in range(n))
    if abs(total - n) > 1e-12:
        bad.append(f"Σ w = {total}, not {n}")
    return bad, msgs, fixed


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("tau", [1, 2])
def test_live_sgp_with_overlap_keeps_the_rules_that_timing_cannot_change(tau: int) -> None:
    # Truth: SGP's rules recomputed by hand (sgp_check: NPDDE's in-peer, share ½, every message
    # mixed once within τ iterations of its send, Σ w = N) and the SimPy engine's trace of the
    # same point. With τ ≥ 1 which messages an iteration mixes depends on arrival times, so only
    # what timing cannot change is compared: the messages mixed (a multiset), each node's
    # iteration heads (minibatch, grad/apply/kept share), and the bound on each message's age.
    from ddlsim.backends.live import run_measured

    p = make_point(LIVE.format(protocol="sgp", overlap=tau, epochs=1.5))
    assert (p["protocol"]["topology"], p["protocol"]["peers"]) == ("npdde", 1)
    sim = simulate(p, "simpy").trace
    live, _ = run_measured(p, 0.0)
    sim_bad, sim_msgs, sim_fixed = sgp_check(sim, tau)
    bad, msgs, fixed = sgp_check(live, tau)
    assert sim_bad == [] and bad == []
    assert msgs == sim_msgs and fixed == sim_fixed
    assert all(len(fixed[i]) == sim.header["iterations"] == 12 for i in range(4))
    # a coefficient changed by 1e-3 in one received mix is caught
    received = [op for op in np.flatnonzero(live.ops["kind"] == MIX) if live.ops["self_coef"][op] == 1.0]
    live.ops["coef"][received[len(received) // 2]] += 1e-3
    assert sgp_check(live, tau)[0] != []


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_live_sgp_with_overlap_is_reproduced_by_replaying_its_trace() -> None:
    # Truth: every node's live de-biased weights x_i / w_i (τ = 1, real gradients); the replay
    # sees only the merged trace.
    import torch

    from tests.test_live import live, point, replayed_debiased

    p = point("sgp", learners=4, mb=8, dist="lognormal", base=0.002, protocol__overlap=1, cluster__compute__cv=0.5)
    r = live(p)
    assert sgp_check(r.trace, 1)[0] == []
    assert torch.allclose(replayed_debiased(r.trace, p), r.final_weights, atol=1e-5, rtol=0)


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("tau", [0, 1])
def test_live_sgp_on_one_node_runs_as_the_simulator_does(tau: int) -> None:
    # Truth: the SimPy engine's trace of the same point. A lone node receives nothing: every
    # iteration is complete at its boundary (the engine's rule), so it never waits.
    from ddlsim.backends.live import run_measured
    from tests.test_live import point

    p = point("sgp", learners=1, mb=8, epochs=0.25, compute="emulated", timeout=20, protocol__overlap=tau)
    live, _ = run_measured(p, 0.0)
    assert structure(live) == structure(simulate(p, "simpy").trace)


def ring_partners(seed: int, K: int) -> dict[int, list[int]]:
    """AD-PSGD's partners on the ring of 4, by hand: active nodes 1 and 3 each choose between
    passive 0 and 2 (index drawn from SeedSequence([seed, 11]), K per node, in node order; the
    passive nodes' draws from one choice come in between)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 11]))
    picks = [rng.integers(0, 1 if i % 2 == 0 else 2, size=K).tolist() for i in range(4)]
    return {i: [[0, 2][p] for p in picks[i]] for i in (1, 3)}


def adpsgd_check(trace: Trace, partners: dict[int, list[int]]) -> tuple[list[str], Counter]:
    """AD-PSGD's rules on a ring-of-4 trace, recomputed from its ops: the rules it breaks
    (empty: none) and the passive side's averagings as a multiset of (passive, active, active's
    version). Rules: active node i's iteration k is its grad on version 2k (minibatch k), one
    averaging with partners[i][k] at ½, ½ and then its apply (σ 0, weight 1); a passive node's
    mixes are averagings at ½, ½ with an active node's state, and each apply's σ is the mixes
    since its gradient's read; every averaging is one pair: the active node reads the passive
    state of the version the passive node's averaging of that request started from; w stays 1."""
    ops, inputs = trace.ops, trace.inputs
    n, K = int(trace.header["nodes"]), int(trace.header["iterations"])
    bad: list[str] = []
    version = [0] * n
    seen: dict[int, str] = {i: "" for i in range(n)}
    it = [0] * n
    read = [-1] * n
    w: dict[tuple[int, int], float] = {(i, 0): 1.0 for i in range(n)}
    passive_mix: dict[tuple[int, int], tuple[int, int]] = {}  # (passive, version) → (active, its version)
    active_reads: list[tuple[int, int, int, int]] = []         # (active, its version, passive, version)
    grads = {}
    for op in range(len(ops["kind"])):
        kind, i = int(ops["kind"][op]), int(ops["node"][op])
        if kind == EVAL:
            continue
        v, active = version[i], i in partners
        if kind == GRAD:
            seen[i] += "G"
            read[i] = int(ops["src_version"][op])
            grads[op] = read[i]
            if int(ops["batch_index"][op]) != it[i] or (active and read[i] != 2 * it[i]):
                bad.append(f"node {i} iteration {it[i]}: grad of minibatch {int(ops['batch_index'][op])} on {read[i]}")
            continue
        if kind == APPLY:
            lo = int(ops["in_start"][op])
            sigma = int(inputs["staleness"][lo])
            if int(ops["in_count"][op]) != 1 or float(inputs["weight"][lo]) != 1.0:
                bad.append(f"node {i} iteration {it[i]}: apply inputs")
            if sigma != (0 if active else v - grads[int(inputs["grad_op"][lo])]):
                bad.append(f"node {i} iteration {it[i]}: σ {sigma}")
            if active and sorted(seen[i]) != ["G", "M"]:
                bad.append(f"node {i} iteration {it[i]}: ops {seen[i]}A")
            if not active and "G" not in seen[i]:
                bad.append(f"node {i} iteration {it[i]}: apply without a gradient")
            seen[i] = ""
            it[i] += 1
            w[(i, v + 1)] = w[(i, v)]
        else:
            seen[i] += "M"
            src, sv = int(ops["src_node"][op]), int(ops["src_version"][op])
            coef, sc = float(ops["coef"][op]), float(ops["self_coef"][op])
            if (coef, sc) != (0.5, 0.5):
                bad.append(f"node {i}: mix coefficients {(coef, sc)}")
            if active:
                if it[i] >= K or src != partners[i][it[i]]:
                    bad.append(f"node {i} iteration {it[i]}: averaged with {src}")
                active_reads.append((i, v, src, sv))
            else:
                if src not in partners or sv % 2:
                    bad.append(f"node {i}: averaged with node {src} version {sv}")
                passive_mix[(i, v)] = (src, sv)
            w[(i, v + 1)] = sc * w[(i, v)] + coef * w[(src, sv)]
        version[i] = v + 1
    for a, va, p, vp in active_reads:  # the pair: both sides averaged the same two states
        if passive_mix.get((p, vp)) != (a, va):
            bad.append(f"node {a} read node {p} version {vp}, which node {p} did not average with {a}'s {va}")
    if it != [K] * n:
        bad.append(f"iterations {it}, not {K} each")
    if any(w[(i, version[i])] != 1.0 for i in range(n)):
        bad.append("w ≠ 1")
    return bad, Counter((p, a, va) for (p, _), (a, va) in passive_mix.items())


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_live_adpsgd_averages_the_simulated_pairs() -> None:
    # Truth: the partners drawn by hand (ring_partners), AD-PSGD's rules recomputed from the ops
    # (adpsgd_check), and the SimPy engine's trace of the same point: the same pairs per active
    # node and iteration, the same multiset of averagings on the passive side (whose order
    # depends on arrival times), coefficients ½.
    from ddlsim.backends.live import run_measured

    p = make_point(LIVE.format(protocol="adpsgd", overlap=0, epochs=1.5), protocol__topology="ring")
    K = 12
    partners = ring_partners(2, K)
    sim = simulate(p, "simpy").trace
    live, _ = run_measured(p, 0.0)
    assert sim.header["iterations"] == live.header["iterations"] == K
    sim_bad, sim_pairs = adpsgd_check(sim, partners)
    bad, pairs = adpsgd_check(live, partners)
    assert sim_bad == [] and bad == []
    assert pairs == sim_pairs and sum(pairs.values()) == 2 * K
    mixes = np.flatnonzero(live.ops["kind"] == MIX)
    live.ops["coef"][mixes[len(mixes) // 2]] += 1e-3
    assert adpsgd_check(live, partners)[0] != []


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_live_adpsgd_is_reproduced_by_replaying_its_trace() -> None:
    # Truth: every node's live weights (real gradients; passive nodes averaged while computing);
    # the replay sees only the merged trace.
    import torch

    from tests.test_live import live, point, replayed_debiased

    p = point("adpsgd", learners=4, mb=8, dist="lognormal", base=0.002, protocol__topology="ring",
              cluster__compute__cv=0.5)
    r = live(p)
    K = r.trace.header["iterations"]
    assert adpsgd_check(r.trace, ring_partners(5, K))[0] == []
    assert torch.allclose(replayed_debiased(r.trace, p), r.final_weights, atol=1e-5, rtol=0)
