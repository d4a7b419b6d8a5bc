"""The decentralized engines (simulator/gossip.py) against algebra and closed forms.

A tiny NumPy interpreter of the trace ops (below) plays the traces with vector states and
a state-dependent fake gradient, independently of the replay backend. Each test names its
independent truth in a comment.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddlsim.simulator import trace as T
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

DIM = 3
LR = 0.05


def point(protocol: str, n: int, *, iters: int = 12, mu: int = 4, dist: str = "lognormal", cv: float = 0.5,
          base: float = 0.01, lat: float = 1e-4, bw: str = "1e9", params: int = 1_000_000,
          topology: str = "npdde", peers: int = 1, overlap: int = 0, seed: int = 5, extra: str = "",
          evals: int = 1) -> dict:
    toml = f"""
seed = {seed}
[workload]
epochs = 1
samples_per_epoch = {n * mu * iters}
param_count = {params}
evals_per_epoch = {evals}
[cluster]
learners = {n}
minibatch = {mu}
[cluster.compute]
distribution = "{dist}"
base_s = {base}
per_sample_s = 0.0
cv = {cv}
[cluster.network]
latency_s = {lat}
bandwidth_Bps = {bw}
bytes_per_param = 4
[protocol]
name = "{protocol}"
topology = "{topology}"
peers = {peers}
overlap = {overlap}
""" + extra
    return make_point(toml)


STRAGGLY = """
[cluster.stragglers]
fraction = 0.25
slowdown = 3.0
stall_rate_per_s = 20.0
stall_mean_s = 0.01
"""

VARIANTS = [
    ("allreduce", {}), ("dpsgd", {}), ("dpsgd", {"topology": "ring"}), ("adpsgd", {}),
    ("sgp", {}), ("sgp", {"peers": 2}), ("sgp", {"overlap": 1}), ("sgp", {"overlap": 3}),
    ("sgp", {"topology": "dde"}), ("sgp", {"topology": "bipartite_exp"}), ("sgp", {"topology": "complete"}),
]


# --------------------------------------------------------------------------- interpreter
class Played:
    """The result of interpreting a trace: every state version, every gradient, per op."""

    def __init__(self, trace: T.Trace, x0: np.ndarray, lr: float = LR) -> None:
        ops, inp = trace.ops, trace.inputs
        n = trace.header["nodes"]
        self.n = n
        self.states: dict[tuple[int, int], tuple[np.ndarray, float]] = {
            (i, 0): (x0[i].astype(float), 1.0) for i in range(n)}
        self.latest = [0] * n
        self.grad: dict[int, np.ndarray] = {}
        self.creator: dict[tuple[int, int], int] = {}
        self.step_total = np.zeros(x0.shape[1])
        for i in range(trace.n_ops):
            kind = int(ops["kind"][i])
            if kind == T.GRAD:
                x, w = self.states[(int(ops["src_node"][i]), int(ops["src_version"][i]))]
                self.grad[i] = fake_gradient(x / w, int(ops["sample_start"][i]))
            elif kind == T.APPLY:
                nd, v = int(ops["node"][i]), int(ops["version"][i])
                assert v == self.latest[nd]
                x, w = self.states[(nd, v)]
                s, c = int(ops["in_start"][i]), int(ops["in_count"][i])
                step = sum(inp["weight"][s + j] * self.grad[int(inp["grad_op"][s + j])] for j in range(c))
                self.states[(nd, v + 1)] = (x - lr * step, w)
                self.step_total += lr * step
                self._bump(nd, v, i)
            elif kind == T.MIX:
                nd, v = int(ops["node"][i]), int(ops["version"][i])
                assert v == self.latest[nd]
                x, w = self.states[(nd, v)]
                xs, ws = self.states[(int(ops["src_node"][i]), int(ops["src_version"][i]))]
                sc, cf = float(ops["self_coef"][i]), float(ops["coef"][i])
                self.states[(nd, v + 1)] = (sc * x + cf * xs, sc * w + cf * ws)
                self._bump(nd, v, i)

    def _bump(self, nd: int, v: int, op: int) -> None:
        self.latest[nd] = v + 1
        self.creator[(nd, v + 1)] = op

    def final(self) -> tuple[np.ndarray, np.ndarray]:
        xs = np.array([self.states[(i, self.latest[i])][0] for i in range(self.n)])
        ws = np.array([self.states[(i, self.latest[i])][1] for i in range(self.n)])
        return xs, ws


def fake_gradient(z: np.ndarray, sample_start: int) -> np.ndarray:
    """A state-dependent 'gradient' (so reading a wrong version changes the result)."""
    return 0.3 * z + np.cos(np.arange(len(z)) + 0.001 * sample_start)


def x0_for(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, DIM))


def start_states(protocol: str, n: int) -> np.ndarray:
    """Distinct per-node start states (a harder test of mixing), except for all-reduce,
    whose copies assume what the replay does: every node starts from the same x0."""
    return np.repeat(x0_for(1), n, axis=0) if protocol == "allreduce" else x0_for(n)


def read_states(trace: T.Trace, played: Played) -> dict[tuple[int, int], tuple[np.ndarray, float]]:
    """(node, iteration k) → the state node's k-th gradient read, i.e. x_i^(k), w_i^(k)."""
    ops = trace.ops
    out = {}
    for i in np.flatnonzero(ops["kind"] == T.GRAD):
        key = (int(ops["node"][i]), int(ops["batch_index"][i]))
        out[key] = played.states[(int(ops["src_node"][i]), int(ops["src_version"][i]))]
    return out


def grads_by_iteration(trace: T.Trace, played: Played, n: int, k: int) -> np.ndarray:
    ops = trace.ops
    rows = np.flatnonzero((ops["kind"] == T.GRAD) & (ops["batch_index"] == k))
    assert len(rows) == n
    return sum(played.grad[int(r)] for r in rows)


# --------------------------------------------------------------------------- structure
@pytest.mark.parametrize("protocol,kw", VARIANTS)
def test_traces_pass_check_and_round_trip(protocol: str, kw: dict) -> None:
    # Truth: trace.check()'s rules (versions in sequence, reads of existing versions, each
    # gradient applied once) and the file format's decode, on odd and even N with stragglers.
    for n in (1, 2, 3, 8):
        r = simulate(point(protocol, n, extra=STRAGGLY, **kw))
        T.check(r.trace)
        again = T.decode(T.encode(r.trace))
        assert again.n_ops == r.trace.n_ops
        assert r.trace.header["nodes"] == n and r.trace.header["protocol"] == protocol
        ops = r.trace.ops
        assert ops["kind"][0] == T.EVAL and ops["t_start"][0] == 0.0
        assert ops["kind"][-1] == T.EVAL and ops["t_start"][-1] == pytest.approx(r.summary["sim_time_s"])
        assert r.summary["gradients"] == n * r.summary["iterations"]


@pytest.mark.parametrize("protocol,kw", VARIANTS)
def test_same_seed_gives_byte_identical_traces(protocol: str, kw: dict) -> None:
    # Truth: docs/design.md's reproducibility rule (same seed → same bytes); another seed differs.
    a = T.encode(simulate(point(protocol, 6, extra=STRAGGLY, **kw)).trace)
    b = T.encode(simulate(point(protocol, 6, extra=STRAGGLY, **kw)).trace)
    c = T.encode(simulate(point(protocol, 6, extra=STRAGGLY, seed=6, **kw)).trace)
    assert a == b
    assert a != c


def test_summary_has_the_ps_keys_and_the_communication_figures() -> None:
    # Truth: the brief's summary contract (summary.csv columns plus gossip figures).
    r = simulate(point("sgp", 4))
    for key in ("gradients", "updates", "sim_time_s", "gradients_per_s", "server_utilization",
                "server_wait_mean_s", "compute_utilization", "bytes_sent_per_node_per_iter",
                "blocked_mean_s", "message_delay_mean_iters", "iterations", "staleness_mean"):
        assert key in r.summary, key
    assert r.summary["server_utilization"] == 0.0


@pytest.mark.parametrize("protocol,n,peers,bytes_per_iter", [
    ("allreduce", 8, 1, 2 * 7 / 8), ("sgp", 8, 1, 1.0), ("sgp", 16, 3, 3.0), ("dpsgd", 8, 1, 1.0),
    ("adpsgd", 8, 1, 1.0)])
def test_bytes_sent_per_node_per_iteration(protocol: str, n: int, peers: int, bytes_per_iter: float) -> None:
    # Truth: ring all-reduce moves 2(N−1)/N·M per node; SGP sends p messages of M; a D-PSGD
    # pair exchanges M each way; AD-PSGD: each active iteration moves 2M, half the nodes active.
    r = simulate(point(protocol, n, peers=peers))
    assert r.summary["bytes_sent_per_node_per_iter"] == pytest.approx(bytes_per_iter * 4_000_000)


# --------------------------------------------------------------------------- invariants
@pytest.mark.parametrize("protocol,kw", [v for v in VARIANTS if v[0] != "adpsgd" and not v[1].get("overlap")])
def test_sum_of_x_changes_only_by_gradient_steps_every_iteration(protocol: str, kw: dict) -> None:
    # Truth: column-stochastic mixing conserves Σ_i x_i and Σ_i w_i (PushSum; D-PSGD's
    # doubly stochastic W; AR-SGD's identical copies), so between the states read at
    # iterations k and k+1: Σx^(k+1) = Σx^(k) − lr·Σ_i g_i^(k), and Σ w = N.
    # (All-reduce copies node 0's state: like the replay, start every node from one x0.)
    n = 8
    r = simulate(point(protocol, n, extra=STRAGGLY, **kw))
    played = Played(r.trace, start_states(protocol, n))
    read = read_states(r.trace, played)
    K = r.summary["iterations"]
    for k in range(K - 1):
        sum_k = sum(read[(i, k)][0] for i in range(n))
        sum_next = sum(read[(i, k + 1)][0] for i in range(n))
        g = grads_by_iteration(r.trace, played, n, k)
        assert np.allclose(sum_next, sum_k - LR * g, atol=1e-10), k
        assert sum(read[(i, k)][1] for i in range(n)) == pytest.approx(n)
        # regular graphs, no overlap: every w stays 1
        assert all(read[(i, k)][1] == pytest.approx(1.0) for i in range(n))


@pytest.mark.parametrize("protocol,kw", VARIANTS)
def test_final_sum_of_x_and_w_after_all_messages_are_mixed(protocol: str, kw: dict) -> None:
    # Truth: the same conservation over the whole run, for the asynchronous protocols too
    # (AD-PSGD's atomic pairwise average, overlap SGP's late messages): at the end every
    # message has been mixed, so Σ x_final = Σ x_0 − lr·Σ(all applied steps) and Σ w = N.
    n = 8
    x0 = start_states(protocol, n)
    r = simulate(point(protocol, n, extra=STRAGGLY, **kw))
    played = Played(r.trace, x0)
    xs, ws = played.final()
    if protocol == "allreduce":  # node 0's step stands for every node's
        assert np.allclose(xs.sum(0), x0.sum(0) - n * played.step_total)
    else:
        assert np.allclose(xs.sum(0), x0.sum(0) - played.step_total, atol=1e-10)
    assert ws.sum() == pytest.approx(n)


def test_overlap_makes_pushsum_weights_differ_from_one_and_debiasing_matters() -> None:
    # Truth: with late messages a node holds only part of its mass, so w_i < 1 for some
    # read states, while Σ w = N over the run's end (previous test); PushSum de-biases.
    n = 8
    r = simulate(point("sgp", n, overlap=2, extra=STRAGGLY, bw="2e8"))
    played = Played(r.trace, x0_for(n))
    ws = [w for _, w in read_states(r.trace, played).values()]
    assert min(ws) < 0.99


@pytest.mark.parametrize("n", [8, 32])
def test_sgp_trace_averages_exactly_after_log2_n_iterations_on_npdde_not_dde(n: int) -> None:
    # Truth: the digit argument (1-peer NPDDE averages exactly after log2 N steps), played
    # through the trace ops with lr = 0 (mixing only) from distinct per-node states.
    L = int(math.log2(n))
    x0 = x0_for(n, 3)
    for topology, exact in (("npdde", True), ("dde", False)):
        r = simulate(point("sgp", n, iters=L + 2, topology=topology))
        played = Played(r.trace, x0, lr=0.0)
        read = read_states(r.trace, played)
        z = np.array([read[(i, L)][0] / read[(i, L)][1] for i in range(n)])
        err = np.abs(z - x0.mean(0)).max()
        assert (err < 1e-12) if exact else (err > 1e-3), (topology, err)


def test_sgp_mixes_read_the_senders_state_right_after_its_step() -> None:
    # Truth: Alg. 1 of the SGP paper sends x^(k+1/2) (after the gradient step): every mix from
    # another node reads a version created by an apply of that node; keep-share mixes are
    # (src = node, coef 0, self_coef 1/(p+1)).
    r = simulate(point("sgp", 8, peers=2, overlap=1, extra=STRAGGLY))
    ops = r.trace.ops
    played = Played(r.trace, x0_for(8))
    mixes = np.flatnonzero(ops["kind"] == T.MIX)
    assert len(mixes)
    for i in mixes:
        src, sv, nd = int(ops["src_node"][i]), int(ops["src_version"][i]), int(ops["node"][i])
        created = played.creator[(src, sv)]
        if src == nd:
            assert ops["coef"][i] == 0.0 and ops["self_coef"][i] == pytest.approx(1 / 3)
            assert ops["kind"][created] == T.APPLY
        else:
            assert ops["kind"][created] == T.APPLY and int(ops["node"][created]) == src
            assert ops["coef"][i] == pytest.approx(1 / 3) and ops["self_coef"][i] == 1.0


def test_allreduce_replays_sgd_with_minibatch_n_mu() -> None:
    # Truth: DESIGN's global_slice layout — round k reads global batch k (positions
    # kNμ .. (k+1)Nμ) on identical states, and every node ends each round on the same state.
    n, mu = 4, 4
    r = simulate(point("allreduce", n, mu=mu, extra=STRAGGLY))
    ops = r.trace.ops
    played = Played(r.trace, np.repeat(x0_for(1), n, axis=0))
    read = read_states(r.trace, played)
    for k in range(r.summary["iterations"]):
        rows = np.flatnonzero((ops["kind"] == T.GRAD) & (ops["batch_index"] == k))
        assert sorted(ops["sample_start"][rows].tolist()) == [(k * n + i) * mu for i in range(n)]
        for i in range(1, n):
            assert np.array_equal(read[(i, k)][0], read[(0, k)][0])
    xs, _ = played.final()
    assert all(np.array_equal(xs[i], xs[0]) for i in range(n))
    assert r.summary["updates"] == r.summary["iterations"]


def test_adpsgd_averages_only_across_the_bipartition() -> None:
    # Truth: AD-PSGD (Lian et al. 2018): active (odd) nodes average with passive (even) ones,
    # each exchange being one mix on each side with weights ½, ½; actives' gradients see no
    # foreign averaging (σ = 0), passives' may (σ ≥ 0).
    r = simulate(point("adpsgd", 8, extra=STRAGGLY))
    ops = r.trace.ops
    mixes = np.flatnonzero(ops["kind"] == T.MIX)
    assert len(mixes) == 2 * 4 * r.summary["iterations"]
    assert ((ops["node"][mixes] + ops["src_node"][mixes]) % 2 == 1).all()
    assert (ops["coef"][mixes] == 0.5).all() and (ops["self_coef"][mixes] == 0.5).all()
    applies = np.flatnonzero(ops["kind"] == T.APPLY)
    stale = r.trace.inputs["staleness"]
    assert (stale[ops["node"][applies] % 2 == 1] == 0).all()
    assert stale.max() >= 1


# --------------------------------------------------------------------------- timing
DET = dict(dist="deterministic", cv=0.0)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_allreduce_iteration_is_compute_plus_alpha_beta_cost(n: int) -> None:
    # Truth: the alpha-beta cost of a ring all-reduce: 2(N−1)·α + 2(N−1)/N · M/β.
    c, lat, M, bw = 0.01, 1e-4, 4e6, 1e9
    r = simulate(point("allreduce", n, **DET))
    expect = c + 2 * (n - 1) * lat + 2 * (n - 1) / n * M / bw
    assert r.summary["sim_time_s"] / r.summary["iterations"] == pytest.approx(expect, rel=1e-9)


def test_allreduce_straggler_delays_everyone() -> None:
    # Truth: the all-reduce is a barrier, so the round lasts as long as the slowest node's
    # compute (here one persistent straggler, 3×) plus the all-reduce.
    n, c, lat, M, bw = 8, 0.01, 1e-4, 4e6, 1e9
    extra = "[cluster.stragglers]\nfraction = 0.125\nslowdown = 3.0\n"
    r = simulate(point("allreduce", n, extra=extra, **DET))
    expect = 3 * c + 2 * (n - 1) * lat + 2 * (n - 1) / n * M / bw
    assert r.summary["sim_time_s"] / r.summary["iterations"] == pytest.approx(expect, rel=1e-9)


@pytest.mark.parametrize("topology", ["npdde", "dde", "bipartite_exp", "ring"])
def test_sync_one_peer_sgp_iteration_is_compute_plus_latency_plus_transfer(topology: str) -> None:
    # Truth: DESIGN's network model — one message in and out of each NIC per iteration,
    # nothing to queue behind: compute + latency + M/bandwidth.
    c, lat, M, bw = 0.01, 1e-4, 4e6, 1e9
    r = simulate(point("sgp", 8, topology=topology, **DET))
    assert r.summary["sim_time_s"] / r.summary["iterations"] == pytest.approx(c + lat + M / bw, rel=1e-9)
    assert r.summary["message_delay_mean_iters"] == 0.0


def test_p_peer_sgp_serializes_its_messages_on_the_nic() -> None:
    # Truth: FIFO NICs — p messages of M bytes leave one after another, so the last one in
    # lands after compute + latency + p·M/bandwidth.
    c, lat, M, bw, p = 0.01, 1e-4, 4e6, 1e9, 3
    r = simulate(point("sgp", 16, peers=p, **DET))
    assert r.summary["sim_time_s"] / r.summary["iterations"] == pytest.approx(c + lat + p * M / bw, rel=1e-9)


def test_overlap_hides_communication_shorter_than_compute() -> None:
    # Truth: with τ = 1 a node needs only the previous iteration's messages, which took
    # latency + M/β < compute: iterations last `compute`; the run ends when the last
    # iteration's messages land (one more latency + transfer).
    c, lat, M, bw = 0.01, 1e-4, 4e6, 1e9
    r = simulate(point("sgp", 8, overlap=1, **DET))
    K = r.summary["iterations"]
    assert r.summary["sim_time_s"] == pytest.approx(K * c + lat + M / bw, rel=1e-9)
    # every message is mixed one iteration late, except the last iteration's, mixed on
    # arrival after the sender's and receiver's final step (age 0)
    assert r.summary["message_delay_mean_iters"] == pytest.approx((K - 1) / K)


@pytest.mark.parametrize("base,comm_bound", [(0.01, False), (0.001, True)])
def test_dpsgd_overlaps_the_exchange_with_compute(base: float, comm_bound: bool) -> None:
    # Truth: Lian et al. 2017 — D-PSGD's neighbour exchange of x_k runs in parallel with the
    # gradient on x_k, so an iteration lasts max(compute, latency + M/bandwidth) on pairs.
    lat, M, bw = 1e-4, 4e6, 1e9
    r = simulate(point("dpsgd", 8, base=base, overlap=1, **DET))
    expect = max(base, lat + M / bw)
    assert r.summary["sim_time_s"] / r.summary["iterations"] == pytest.approx(expect, rel=1e-9)
    assert (r.summary["blocked_mean_s"] > 0) == comm_bound


def test_free_network_makes_every_protocol_compute_bound() -> None:
    # Truth: with zero latency and infinite bandwidth and deterministic compute there is
    # nothing to wait for: K iterations take K·compute.
    for protocol in ("allreduce", "dpsgd", "adpsgd", "sgp"):
        r = simulate(point(protocol, 8, lat=0.0, bw="inf", **DET))
        assert r.summary["sim_time_s"] == pytest.approx(r.summary["iterations"] * 0.01, rel=1e-9), protocol


# --------------------------------------------------------------------------- overlap bound
def message_ages(trace: T.Trace) -> list[int]:
    """Iterations between a message's send and its mixing, from the trace alone.

    A sender's version right after its apply of iteration k is read by the receivers; the
    receiver mixes it after its own apply of iteration k' (the count of its applies so far
    minus one): age = k' − k.
    """
    ops = trace.ops
    n = trace.header["nodes"]
    applies_before = [0] * n
    apply_iter_of_version: dict[tuple[int, int], int] = {}
    ages = []
    for i in range(trace.n_ops):
        kind, nd = int(ops["kind"][i]), int(ops["node"][i])
        if kind == T.APPLY:
            apply_iter_of_version[(nd, int(ops["version"][i]) + 1)] = applies_before[nd]
            applies_before[nd] += 1
        elif kind == T.MIX and int(ops["src_node"][i]) != nd:
            k_sent = apply_iter_of_version[(int(ops["src_node"][i]), int(ops["src_version"][i]))]
            ages.append(applies_before[nd] - 1 - k_sent)
    return ages


@pytest.mark.parametrize("tau", [0, 1, 2, 4])
def test_overlap_never_mixes_a_message_more_than_tau_iterations_old(tau: int) -> None:
    # Truth: the overlap rule — a node may not pass the end of iteration k before every
    # message of iteration ≤ k − τ is in, and never mixes a message before the end of the
    # iteration it was sent in. Ages are recomputed from the trace alone.
    r = simulate(point("sgp", 8, iters=40, overlap=tau, bw="4e8", extra=STRAGGLY))
    ages = message_ages(r.trace)
    assert len(ages) == 8 * r.summary["iterations"]
    assert min(ages) >= 0 and max(ages) <= tau
    if tau:
        assert max(ages) == tau  # stragglers make the bound bite
    assert r.summary["message_delay_mean_iters"] == pytest.approx(np.mean(ages))


def test_evals_happen_every_evals_per_epoch_samples() -> None:
    # Truth: the PS engine's convention — eval at t = 0, each time samples applied cross a
    # multiple of samples_per_epoch / evals_per_epoch, and at the end.
    r = simulate(point("sgp", 4, iters=20, evals=4))
    ops = r.trace.ops
    ev = np.flatnonzero(ops["kind"] == T.EVAL)
    assert (ops["node"][ev] == -1).all()
    assert ops["epoch"][ev].tolist() == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0])
