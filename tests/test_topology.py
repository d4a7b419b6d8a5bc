"""Gossip graphs and mixing weights (simulator/topology.py, simulator/mixing.py).

Each test names its independent truth in a comment: docs/design.md's peer formula, the
definition of a (column-/doubly) stochastic matrix, the digit argument for exact
averaging, or the peer books of facebookresearch/stochastic_gradient_push re-derived here.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from ddlsim.simulator import mixing
from ddlsim.simulator import topology as topo

SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16, 17, 32)
PEERS = (1, 2, 3)


def all_cases():
    for t in topo.TOPOLOGIES:
        for n in SIZES:
            for p in PEERS:
                yield t, n, p


@pytest.mark.parametrize("t", topo.TOPOLOGIES)
def test_mixing_matrices_are_column_stochastic_for_every_topology_and_iteration(t: str) -> None:
    # Truth: the definition — non-negative entries, every column sums to 1 — which is
    # what makes PushSum conserve Σx and Σw. Checked over two whole periods.
    for n in SIZES:
        for p in PEERS:
            for k in range(2 * topo.period(t, n, p) + 1):
                P = mixing.mixing_matrix(t, k, n, p)
                assert mixing.is_column_stochastic(P), (t, n, p, k)
                # on these (regular) graphs every node also receives as many shares: w stays 1
                assert mixing.is_doubly_stochastic(P), (t, n, p, k)


@pytest.mark.parametrize("t", topo.TOPOLOGIES)
def test_symmetric_matrices_are_symmetric_and_doubly_stochastic(t: str) -> None:
    # Truth: Metropolis–Hastings weights W_ij = 1/(1+max(d_i, d_j)) are symmetric and rows sum
    # to 1 by construction of W_ii; symmetric + row-stochastic ⇒ doubly stochastic.
    for n in SIZES:
        for p in PEERS:
            for k in range(2 * topo.period(topo.symmetric_topology(t), n, p) + 1):
                W = mixing.symmetric_matrix(t, k, n, p)
                assert np.allclose(W, W.T), (t, n, p, k)
                assert mixing.is_doubly_stochastic(W), (t, n, p, k)


def test_out_and_in_peers_are_consistent_distinct_and_never_self() -> None:
    # Truth: j ∈ out(i) ⇔ i ∈ in(j) (the definition of in-peers); a node is never its own peer.
    for t, n, p in all_cases():
        for k in range(topo.period(t, n, p)):
            for i in range(n):
                out = topo.out_peers(t, i, k, n, p)
                assert len(set(out)) == len(out) and i not in out
                for j in out:
                    assert i in topo.in_peers(t, j, k, n, p)
                for j in topo.in_peers(t, i, k, n, p):
                    assert i in topo.out_peers(t, j, k, n, p)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 13, 16, 31, 32, 33])
def test_one_peer_npdde_is_designs_formula(n: int) -> None:
    # Truth: docs/design.md — peer of r at iteration k is (r + 2^(k mod L)) mod N, L = ⌊log2(N−1)⌋+1
    # (computed here with floating log2, independently of topology.digits).
    L = math.floor(math.log2(n - 1) + 1e-12) + 1 if n > 1 else 1
    for k in range(3 * L):
        for r in range(n):
            assert topo.out_peers("npdde", r, k, n, 1) == [(r + 2 ** (k % L)) % n]


def test_p_peer_npdde_uses_distances_j_times_base_power_i() -> None:
    # Truth: the NPDDE book of facebookresearch/stochastic_gradient_push (graph type 5):
    # distances j·(p+1)^i for j = 1..p, peer group i = k mod L at iteration k.
    n, p = 27, 2
    for k in range(6):
        i = k % 3
        assert topo.out_peers("npdde", 5, k, n, p) == [(5 + j * 3 ** i) % n for j in (1, 2)]


@pytest.mark.parametrize("n", [8, 32])
def test_one_peer_npdde_averages_exactly_after_log2_n_steps_and_dde_does_not(n: int) -> None:
    # Truth: the digit argument (topology docstring): step i averages binary digit i of the
    # index, so after log2 N steps P_{L-1}…P_0 = (1/N)·11ᵀ. DDE's ±2^i book repeats digits.
    steps = int(math.log2(n))
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(n, 3)), np.ones(n)
    xe, we = mixing.pushsum_steps("npdde", x, w, 0, steps)
    assert mixing.consensus_error(xe, we) < 1e-12
    assert np.allclose(xe, x.mean(axis=0))
    xd, wd = mixing.pushsum_steps("dde", x, w, 0, steps)
    assert mixing.consensus_error(xd, wd) > 1e-3
    prod = np.eye(n)
    for k in range(steps):
        prod = mixing.mixing_matrix("npdde", k, n) @ prod
    assert np.allclose(prod, np.full((n, n), 1 / n))
    # one step fewer is not enough
    xs, ws = mixing.pushsum_steps("npdde", x, w, 0, steps - 1)
    assert mixing.consensus_error(xs, ws) > 1e-3


@pytest.mark.parametrize("n,p", [(9, 2), (27, 2), (16, 3)])
def test_p_peer_npdde_averages_exactly_after_log_base_p_plus_1_steps(n: int, p: int) -> None:
    # Truth: the same digit argument in base p+1 (N = (p+1)^m ⇒ exact after m steps).
    m = round(math.log(n, p + 1))
    x, w = np.random.default_rng(1).normal(size=(n, 2)), np.ones(n)
    xe, we = mixing.pushsum_steps("npdde", x, w, 0, m, p)
    assert mixing.consensus_error(xe, we) < 1e-12


def _repo_book(n: int, kind: str, rank: int) -> list[int]:
    """Peer books as built by facebookresearch/stochastic_gradient_push graph_manager.py."""
    book: list[int] = []
    for i in range(0, int(math.log(n - 1, 2)) + 1):
        if kind == "dde":
            pairs = [((rank + 2 ** i) % n, (rank - 2 ** i) % n)]
        else:
            d = 1 if i == 0 else 1 + 2 ** i
            f, b = (rank + d) % n, (rank - d) % n
            passive = rank % 2 == 0
            if not passive and f % 2 == 0 and b % 2 == 0:
                pairs = [(f, b)]
            elif passive and f % 2 == 1 and b % 2 == 1:
                pairs = [(b, f)]
            else:
                pairs = []
        for pair in pairs:
            for q in pair:
                if q not in book:
                    book.append(q)
    return book


@pytest.mark.parametrize("n", [4, 8, 16, 32])
@pytest.mark.parametrize("kind", ["dde", "bipartite_exp"])
def test_dde_and_bipartite_books_match_the_reference_code(n: int, kind: str) -> None:
    # Truth: the reference implementation's phone books and its rotating group index
    # (iteration k uses entry k mod len for one peer), re-derived above.
    for r in range(n):
        book = [q for q in _repo_book(n, kind, r) if q != r]
        for k in range(2 * len(book)):
            assert topo.out_peers(kind, r, k, n, 1) == [book[k % len(book)]], (kind, n, r, k)


@pytest.mark.parametrize("n", [2, 4, 8, 10, 32, 3, 5, 7, 9, 31])
def test_bipartite_exp_is_a_matching_every_iteration(n: int) -> None:
    # Truth: a perfect (odd n: all but one node) matching is a set of disjoint pairs whose
    # partner relation is an involution; for even n partners have opposite parity.
    for k in range(topo.period("bipartite_exp", n, 1)):
        partner = {r: topo.out_peers("bipartite_exp", r, k, n, 1) for r in range(n)}
        alone = [r for r, p in partner.items() if not p]
        assert len(alone) == n % 2
        for r, p in partner.items():
            if p:
                assert partner[p[0]] == [r]
                if n % 2 == 0:
                    assert (r + p[0]) % 2 == 1


def test_symmetric_neighbors_of_directed_graphs_are_the_bipartite_pairs() -> None:
    # Truth: the documented rule — D-PSGD replaces the directed exponential graphs by
    # bipartite_exp; a ring gives both ring neighbours (Lian et al. 2017, weights 1/3).
    for k in range(6):
        for r in range(8):
            assert topo.symmetric_neighbors("npdde", r, k, 8) == topo.out_peers("bipartite_exp", r, k, 8)
    assert topo.symmetric_neighbors("ring", 0, 0, 8) == [1, 7]
    self_w, pairs = mixing.symmetric_weights("ring", 0, 0, 8)
    assert self_w == pytest.approx(1 / 3) and [w for _, w in pairs] == pytest.approx([1 / 3, 1 / 3])


def test_adpsgd_candidates_are_passive_and_never_empty_for_active_nodes() -> None:
    # Truth: AD-PSGD's bipartition (Lian et al. 2018): active nodes average only with passive
    # ones, so no two actives ever wait on each other.
    for t in topo.TOPOLOGIES:
        for n in (2, 3, 5, 8, 9, 32):
            for r in range(n):
                c = topo.adpsgd_candidates(t, r, n)
                if r % 2 == 1:
                    assert c and all(q % 2 == 0 and q != r for q in c)
                else:
                    assert c == []


def test_npdde_period_is_the_number_of_digits() -> None:
    # Truth: L = ⌊log_{p+1}(N−1)⌋ + 1 (floating logs, nudged against rounding).
    for n in range(2, 70):
        for p in PEERS:
            expect = math.floor(math.log(n - 1, p + 1) + 1e-9) + 1 if n > 2 else 1
            assert topo.period("npdde", n, p) == expect, (n, p)


def test_unknown_topology_is_refused() -> None:
    # Truth: the schema's list of topologies.
    with pytest.raises(ValueError, match="unknown topology"):
        topo.out_peers("star", 0, 0, 4)
