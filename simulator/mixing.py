"""With what weights nodes mix: PushSum shares (SGP) and symmetric averaging (D-PSGD).

PushSum (SGP, uniform mixing): at iteration ``k`` node ``i`` with ``d`` out-peers
(:func:`~.topology.out_peers`) splits its ``(x_i, w_i)`` into ``d + 1`` equal shares of
``1/(d+1)``: it keeps one and sends one to each out-peer (``1/(p+1)`` on every graph with
``p`` distinct peers). As a matrix, ``x ← P x`` with ``P[j, i] = 1/(d_i + 1)`` for ``j`` in
``out(i) ∪ {i}``: every column sums to 1 (column-stochastic), which is what keeps
``Σ_i x_i`` and ``Σ_i w_i`` unchanged by mixing. On the circulant graphs of
:mod:`.topology` every node also receives ``d`` shares, so rows sum to 1 too and
``w_i`` stays 1 (the PushSum weight then only matters for late, overlapped messages).

D-PSGD (symmetric): Metropolis–Hastings weights on the undirected graph of
:func:`~.topology.symmetric_neighbors`: ``W[i, j] = 1 / (1 + max(d_i, d_j))`` for
neighbours, ``W[i, i] = 1 − Σ_j W[i, j]``; symmetric and doubly stochastic. On a
regular graph this is uniform ``1/(d+1)``: ½ for a pair, ⅓ on a ring (Lian et al. 2017).
"""

from __future__ import annotations

import numpy as np

from . import topology as topo


def share(out_degree: int) -> float:
    """The PushSum share a node with ``out_degree`` out-peers keeps and sends to each."""
    return 1.0 / (out_degree + 1)


def mixing_matrix(topology: str, iteration: int, n: int, peers: int = 1) -> np.ndarray:
    """PushSum's column-stochastic ``P`` at ``iteration``: ``x_new = P @ x`` (and ``w`` too)."""
    outs, _ = topo.peer_table(topology, iteration, n, peers)
    P = np.zeros((n, n))
    for i, targets in enumerate(outs):
        s = share(len(targets))
        P[i, i] = s
        for j in targets:
            P[j, i] += s
    return P


def symmetric_weights(topology: str, node: int, iteration: int, n: int,
                      peers: int = 1) -> tuple[float, list[tuple[int, float]]]:
    """D-PSGD's ``(W[i, i], [(j, W[i, j]) for neighbours j ascending])`` for ``node`` = i."""
    table = topo.symmetric_table(topology, iteration, n, peers)
    nbrs = table[node]
    d = len(nbrs)
    pairs = [(j, 1.0 / (1 + max(d, len(table[j])))) for j in nbrs]
    return 1.0 - sum(w for _, w in pairs), pairs


def symmetric_matrix(topology: str, iteration: int, n: int, peers: int = 1) -> np.ndarray:
    """D-PSGD's symmetric, doubly stochastic ``W`` at ``iteration``."""
    W = np.zeros((n, n))
    for i in range(n):
        self_w, pairs = symmetric_weights(topology, i, iteration, n, peers)
        W[i, i] = self_w
        for j, w in pairs:
            W[i, j] = w
    return W


def is_column_stochastic(P: np.ndarray, tol: float = 1e-12) -> bool:
    """Non-negative with every column summing to 1."""
    return bool((P >= -tol).all() and np.allclose(P.sum(axis=0), 1.0, rtol=0, atol=tol))


def is_doubly_stochastic(P: np.ndarray, tol: float = 1e-12) -> bool:
    """Column-stochastic with every row summing to 1 as well."""
    return is_column_stochastic(P, tol) and bool(np.allclose(P.sum(axis=1), 1.0, rtol=0, atol=tol))


def pushsum_steps(topology: str, x: np.ndarray, w: np.ndarray, start: int, steps: int,
                  peers: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Apply ``steps`` mixing-only PushSum iterations ``start, start+1, …`` to rows of ``x`` and ``w``."""
    n = len(w)
    for k in range(start, start + steps):
        P = mixing_matrix(topology, k, n, peers)
        x, w = P @ x, P @ w
    return x, w


def consensus_error(x: np.ndarray, w: np.ndarray) -> float:
    """Largest distance of a de-biased node state ``x_i / w_i`` from the average ``Σx / Σw``."""
    z = x / w.reshape(-1, *([1] * (x.ndim - 1)))
    target = x.sum(axis=0) / w.sum()
    return float(np.abs(z - target).max())
