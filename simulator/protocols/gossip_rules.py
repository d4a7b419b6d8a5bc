"""The decentralized protocols' rules, without time: who sends what to whom at iteration k,
with which weights, when a node may advance, and the picks drawn from the seeded stream.

Each rule is written once, here, and used by

* the SimPy engines (:mod:`ddlsim.simulator.gossip`), which add time and the network;
* the live nodes (:mod:`ddlsim.backends.live_gossip`), loops of sends and receives around the
  same objects (as :mod:`ddlsim.backends.live_ps` is around :class:`~.ps.PSCore`);
* the fast engines (:mod:`ddlsim.simulator.fast_sgp`, ``fast_dpsgd``, ``fast_adpsgd``,
  ``fast_allreduce``), which read the tables the classes below generate (:meth:`SGPRules.tables`,
  …) and compile the scalar rules (:func:`sgp_may_advance`, :func:`sgp_advance`, …) with
  numba. Those functions are written in the subset numba compiles; called from Python they are
  plain functions, so the SimPy engine runs the very definition the kernel compiles.

Tables are read at run time; the compiled functions are copied into the kernels that call them,
and numba's on-disk cache of a kernel is invalidated by its own module's source only: after an
edit of a function here, delete ``simulator/__pycache__/fast_sgp.*.nb*`` and ``fast_adpsgd.*.nb*``
before trusting a cached fast engine (tests/test_fast_gossip.py compares the two engines).

The rules (docs/decentralized.md has the full write-up):

* **SGP** (PushSum, Assran et al. 2019, Alg. 1 with overlap τ): at iteration ``k`` node ``i``
  sends ``(x, w)·s`` to each out-peer of :func:`..topology.peer_table`, ``s = 1/(d+1)``
  (:func:`..mixing.share`), and keeps one share (a mix ``coef 0, self_coef s``); a received
  message is mixed with ``coef`` = its sender's share, ``self_coef 1``. At the boundary of
  iteration ``k`` a node mixes the held messages of iterations ≤ k; it may start ``k + 1``
  when every message of iterations ≤ ``k − τ`` has arrived; while it waits (and after its
  last iteration) it mixes a message of an iteration ≤ the one it waits at on arrival.
* **D-PSGD** (Lian et al. 2017): the neighbours of :func:`..topology.symmetric_table` with the
  Metropolis weights of :func:`..mixing.symmetric_weights`; a node sends its state to its
  neighbours in order of distance ``(j − i) mod N`` and mixes theirs in ascending order, the
  first mix scaling its own state by ``W_ii`` (``self_coef``), the others by 1; an iteration
  ends when the gradient is computed and every neighbour's state of that iteration is in.
* **AD-PSGD** (Lian et al. 2018): an active (odd) node averages with the passive neighbour its
  seeded pick names (:func:`adpsgd_picks`), both sides at ``½, ½``; σ of an apply counts the
  averaging mixes by other nodes since the gradient's read.
* **AllReduce-SGD**: every node's gradient of slice ``i`` of global batch ``k``, averaged at
  weight ``1/N`` (:func:`allreduce_weights`); every node advances when the round is reduced.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .. import mixing, seeds, topology

# -- SGP --------------------------------------------------------------------------------------

RECEIVED_SELF_COEF = 1.0  # SGP: a received message adds to the node's state (PushSum)
KEPT_COEF = 0.0           # SGP: the kept share's mix reads no other state


def sgp_may_advance(complete: int, k: int, tau: int) -> bool:
    """SGP: a node at the boundary of iteration ``k`` may start ``k + 1`` when every message of
    iterations ≤ ``k − τ`` has arrived (``complete``: the mark of :func:`sgp_advance`)."""
    return complete >= k - tau


def sgp_mix_at_boundary(k_msg: int, k: int) -> bool:
    """SGP: a held message of iteration ``k_msg`` is mixed at the boundary of iteration ``k``
    when it was sent at an iteration ≤ k (later ones stay held)."""
    return k_msg <= k


def sgp_mix_on_arrival(k_msg: int, waiting_at: int) -> bool:
    """SGP: a message arriving while its receiver waits at the boundary of iteration
    ``waiting_at`` (−1: computing; K − 1: finished) is mixed at once when ``k_msg ≤ waiting_at``."""
    return waiting_at >= k_msg


def sgp_advance(arrived: Any, R: int, c: int, K: int, indeg: Any, phases: int, n: int, j: int) -> int:
    """SGP: node ``j``'s mark "every message of iterations ≤ c has arrived", moved as far as it
    goes (K iterations). ``arrived[j·R + k % R]``: messages of iteration ``k`` arrived at ``j`` and
    not yet counted into the mark (a ring of ``R`` iterations per node, flat; its slots are cleared
    as the mark passes them); ``indeg[(k % phases)·n + j]``: how many node ``j`` receives at
    iteration ``k`` (flat). Lists or 1-D NumPy arrays (numba compiles it for the latter)."""
    base = j * R
    while c + 1 < K and arrived[base + (c + 1) % R] >= indeg[((c + 1) % phases) * n + j]:
        arrived[base + (c + 1) % R] = 0
        c += 1
    return c


class SGPRules:
    """SGP's graph, shares and boundary on ``n`` nodes: ``topology``, ``peers``, overlap ``tau``.

    Per phase ``ph`` of the graph's period: ``outs[ph][i]`` (the out-peers, in the send order),
    ``ins[ph][i]`` (ascending), ``indeg[ph][i]`` and ``coefs[ph][i]`` (node i's share).
    """

    def __init__(self, topo: str, n: int, peers: int, tau: int) -> None:
        self.n, self.tau = n, tau
        self.phases = topology.period(topo, n, peers)
        tables = [topology.peer_table(topo, ph, n, peers) for ph in range(self.phases)]
        self.outs: list[tuple[tuple[int, ...], ...]] = [t[0] for t in tables]
        self.ins: list[tuple[tuple[int, ...], ...]] = [t[1] for t in tables]
        self.indeg: list[list[int]] = [[len(x) for x in t[1]] for t in tables]
        self.coefs: list[list[float]] = [[mixing.share(len(o)) for o in t[0]] for t in tables]

    @classmethod
    def of_point(cls, point: dict[str, Any]) -> SGPRules:
        """The rules of a validated SGP point."""
        proto = point["protocol"]
        return cls(proto["topology"], point["cluster"]["learners"], proto["peers"], proto["overlap"])

    def sends(self, i: int, k: int) -> tuple[int, ...]:
        """The nodes ``i`` sends its share to at iteration ``k``, in send order."""
        return self.outs[k % self.phases][i]

    def senders(self, i: int, k: int) -> tuple[int, ...]:
        """The nodes whose iteration-``k`` message ``i`` receives (ascending)."""
        return self.ins[k % self.phases][i]

    def share(self, i: int, k: int) -> float:
        """Node ``i``'s share at iteration ``k``: what it keeps and what each message carries."""
        return self.coefs[k % self.phases][i]

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The same graph as arrays for a kernel: ``(out_ptr, out_idx, indeg, coefs)`` with node
        i's out-peers at phase ph ``out_idx[out_ptr[ph, i]:out_ptr[ph, i + 1]]``."""
        n = self.n
        out_ptr = np.zeros((self.phases, n + 1), np.int64)
        flat: list[int] = []
        for ph, outs in enumerate(self.outs):
            for i in range(n):
                out_ptr[ph, i] = len(flat)
                flat.extend(outs[i])
            out_ptr[ph, n] = len(flat)
        return (out_ptr, np.array(flat, np.int64), np.array(self.indeg, np.int64).reshape(self.phases, n),
                np.array(self.coefs, np.float64).reshape(self.phases, n))


# -- D-PSGD -----------------------------------------------------------------------------------

def dpsgd_send_order(i: int, neighbours: Sequence[int], n: int) -> list[int]:
    """D-PSGD: node ``i`` sends to its neighbours in order of distance ``(j − i) mod n`` (on a
    circulant graph every node then sends and receives alike)."""
    return sorted(neighbours, key=lambda j: (j - i) % n)


class DPSGDRules:
    """D-PSGD's graph and weights on ``n`` nodes; ``overlap`` 0 blocking (step, then exchange the
    stepped states), 1 overlapped (exchange while computing, mix, then step).

    Per phase ``ph``: ``weights[ph][i] = (W_ii, [(j, W_ij) for neighbours j ascending])``,
    ``send_order[ph][i]`` and ``plan[ph][i]`` (:meth:`mixes`).
    """

    def __init__(self, topo: str, n: int, peers: int, overlap: int) -> None:
        self.n = n
        self.blocking = overlap == 0
        self.phases = topology.period(topology.symmetric_topology(topo), n, peers)
        self.weights = [[mixing.symmetric_weights(topo, i, ph, n, peers) for i in range(n)]
                        for ph in range(self.phases)]
        self.send_order = [[dpsgd_send_order(i, [j for j, _ in self.weights[ph][i][1]], n) for i in range(n)]
                           for ph in range(self.phases)]
        self.plan = [[[(j, w, w_ii if m == 0 else 1.0) for m, (j, w) in enumerate(pairs)]
                      for w_ii, pairs in row] for row in self.weights]

    @classmethod
    def of_point(cls, point: dict[str, Any]) -> DPSGDRules:
        """The rules of a validated D-PSGD point."""
        proto = point["protocol"]
        return cls(proto["topology"], point["cluster"]["learners"], proto["peers"], proto["overlap"])

    def sends(self, i: int, k: int) -> list[int]:
        """The neighbours ``i`` sends its state to at iteration ``k``, in send order."""
        return self.send_order[k % self.phases][i]

    def mixes(self, i: int, k: int) -> list[tuple[int, float, float]]:
        """Node ``i``'s mixes at iteration ``k``: ``(j, coef W_ij, self_coef)`` in order, the first
        with ``self_coef = W_ii``, the others 1 (so that ``x_i ← Σ_j W_ij x_j``)."""
        return self.plan[k % self.phases][i]

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The same as arrays for a kernel: ``(nb_ptr, nb_idx, nb_w, nb_self, send_idx)``: node i's
        mixes at phase ph are entries ``nb_ptr[ph, i] … nb_ptr[ph, i + 1] − 1`` of ``nb_idx``
        (the neighbour), ``nb_w`` (its coef) and ``nb_self`` (the self_coef) in :meth:`mixes`'
        order; ``send_idx`` the same slice in send order."""
        n = self.n
        nb_ptr = np.zeros((self.phases, n + 1), np.int64)
        nb: list[tuple[int, float, float]] = []
        send_idx: list[int] = []
        for ph in range(self.phases):
            for i in range(n):
                nb_ptr[ph, i] = len(nb)
                nb.extend(self.plan[ph][i])
                send_idx.extend(self.send_order[ph][i])
            nb_ptr[ph, n] = len(nb)
        return (nb_ptr, np.array([j for j, _, _ in nb], np.int64), np.array([w for _, w, _ in nb], np.float64),
                np.array([c for _, _, c in nb], np.float64), np.array(send_idx, np.int64))


# -- AD-PSGD ----------------------------------------------------------------------------------

AVERAGE_COEF = 0.5  # AD-PSGD: both sides of an averaging keep half and take half


def adpsgd_picks(seed: int, cands: Sequence[Sequence[int]], K: int) -> np.ndarray:
    """AD-PSGD's seeded picks: ``picks[i, k]`` indexes node i's candidates at iteration k (0 for
    a passive node). One stream ``SeedSequence([seed, ADPSGD_PEERS])``, K draws per node in
    node order."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), seeds.ADPSGD_PEERS]))
    return np.array([rng.integers(0, max(1, len(c)), size=K) for c in cands], np.int64).reshape(len(cands), K)


def adpsgd_staleness(version: int, read: int, active: bool) -> int:
    """AD-PSGD: σ of a gradient read at ``read`` and applied on ``version``: the mixes in
    between, less an active node's own averaging (part of its step)."""
    return version - read - (1 if active else 0)


class ADPSGDRules:
    """AD-PSGD's pairs: ``cands[i]`` (:func:`..topology.adpsgd_candidates`; empty for a passive
    node) and the seeded ``picks`` of ``K`` iterations."""

    def __init__(self, topo: str, n: int, peers: int, seed: int, K: int) -> None:
        self.n = n
        self.cands = [topology.adpsgd_candidates(topo, i, n, peers) for i in range(n)]
        self.picks = adpsgd_picks(seed, self.cands, K)

    @classmethod
    def of_point(cls, point: dict[str, Any], K: int) -> ADPSGDRules:
        """The rules of a validated AD-PSGD point with ``K`` iterations per node."""
        proto = point["protocol"]
        return cls(proto["topology"], point["cluster"]["learners"], proto["peers"], point["seed"], K)

    def active(self, i: int) -> bool:
        """Node ``i`` starts averagings (it has candidates)."""
        return bool(self.cands[i])

    def peer(self, i: int, k: int) -> int:
        """The passive node active node ``i`` averages with at iteration ``k``."""
        return self.cands[i][int(self.picks[i, k])]

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The same as arrays for a kernel: ``(c_ptr, c_idx, picks)``, node i's candidates
        ``c_idx[c_ptr[i]:c_ptr[i + 1]]``."""
        c_ptr = np.array([0] + np.cumsum([len(c) for c in self.cands]).tolist(), np.int64)
        c_idx = np.array([j for c in self.cands for j in c], np.int64)
        return c_ptr, c_idx, self.picks


# -- AllReduce-SGD ----------------------------------------------------------------------------

def allreduce_weights(n: int) -> list[float]:
    """AllReduce-SGD: the weight of each of the ``n`` gradients in the round's average."""
    return [1.0 / n] * n
