"""Who talks to whom: the gossip graphs of the decentralized protocols (pure, NumPy only).

Every graph is on nodes ``0 .. n−1`` and may change with the iteration ``k``; it is
periodic in ``k`` (:func:`period`). ``out_peers(topology, r, k, n, peers)`` are the nodes
``r`` sends to at iteration ``k``; ``in_peers`` the nodes that send to ``r``. A node is
never its own peer and never appears twice in one list. Distances are taken mod ``n``;
a distance ≡ 0 (mod n) is dropped and a repeated residue counted once, so on small ``n``
a node may have fewer than ``peers`` peers (every node the same number: all graphs but
odd-``n`` ``bipartite_exp`` are circulant, hence regular).

``npdde`` — the p-peer time-varying directed exponential graph of SGP (Assran et al.
2019; graph type 5 of facebookresearch/stochastic_gradient_push). With ``b = p + 1``
and ``L = `` the number of base-``b`` digits of ``n − 1`` (``⌊log_b(n−1)⌋ + 1``; 0 when
``n = 1``), node ``r`` at iteration ``k`` sends to

    (r + j · b^i) mod n   for j = 1 .. p,   where i = k mod L.

For p = 1 this is DESIGN's ``(r + 2^(k mod L)) mod n`` with ``L = ⌊log2(n−1)⌋ + 1``.
Why it averages exactly: with uniform weights 1/(p+1) one step at digit ``i`` replaces
``x_r`` by the mean over the ``b`` nodes ``r − j·b^i`` (j = 0..p), i.e. averages out base-b
digit ``i`` of the index; when ``n = b^L`` the ``L`` steps k = 0..L−1 average every digit,
so every node holds the exact average after ``L = log_b n`` steps (log2 n for one peer).

``dde`` — the directed exponential graph with alternating signs (graph type 0 of the same
code): the phone book is the distances ``+2^0, −2^0, +2^1, −2^1, …, ±2^(L2−1)``
(``L2 = ⌊log2(n−1)⌋ + 1``), residues mod n, first occurrence kept, 0 dropped; at
iteration ``k`` a node uses the book entries ``(k·p + j) mod len`` for ``j = 0..p−1``
(the code's rotating group indices). It mixes well but does not average exactly after
log2 n steps (the −2^i steps repeat digits).

``bipartite_exp`` — D-PSGD's bipartite exponential graph (graph type 1): odd nodes are
*active*, even nodes *passive*; the book, seen from an active node, is the odd signed
distances ``+1, −1, +3, −3, +5, −5, +9, −9, …, ±(1 + 2^i)`` for ``i < L2`` (residues,
first occurrence kept). At iteration ``k`` entry ``e = book[(k·p + j) mod len]`` pairs
each active ``r`` with passive ``r + e`` (so the passive ``q`` pairs with ``q − e``): for
``p = 1`` a perfect matching, the pairs D-PSGD averages symmetrically. Out- and in-peers
coincide. For odd ``n`` no perfect matching exists: node ``s = k mod n`` sits the
iteration out and the others, relabelled ``q = (r − s − 1) mod n`` (so 0..n−2), use the
graph of ``n − 1`` nodes.

``ring`` — static: ``r`` sends to ``r + 1 .. r + p``.

``complete`` — static: ``r`` sends to every other node (``peers`` is ignored).

:func:`symmetric_neighbors` gives the undirected graph D-PSGD averages over:
``bipartite_exp`` as is, ``ring`` both directions (Lian et al. 2017's ring), ``complete``
as is, and the directed ``npdde``/``dde`` replaced by ``bipartite_exp`` (symmetric
averaging needs pairs; the SGP paper's D-PSGD runs use that graph).
:func:`adpsgd_candidates` gives AD-PSGD's passive neighbours of an active node.
"""

from __future__ import annotations

from functools import lru_cache, cache

TOPOLOGIES = ("npdde", "dde", "bipartite_exp", "ring", "complete")


def digits(m: int, base: int) -> int:
    """Number of base-``base`` digits of ``m`` ≥ 0 (0 for m = 0): ⌊log_base m⌋ + 1."""
    count = 0
    while m > 0:
        m //= base
        count += 1
    return count


def _check(topology: str, n: int, peers: int) -> None:
    if topology not in TOPOLOGIES:
        raise ValueError(f"unknown topology {topology!r} (one of {', '.join(TOPOLOGIES)})")
    if n < 1:
        raise ValueError(f"need at least one node, got n = {n}")
    if peers < 1:
        raise ValueError(f"need peers ≥ 1, got {peers}")


def _residues(distances: list[int], n: int) -> tuple[int, ...]:
    """Distances mod n, first occurrence kept, 0 dropped."""
    out: list[int] = []
    for d in distances:
        r = d % n
        if r and r not in out:
            out.append(r)
    return tuple(out)


@cache
def _dde_book(n: int) -> tuple[int, ...]:
    book: list[int] = []
    for i in range(digits(n - 1, 2)):
        book += [2 ** i, -(2 ** i)]
    return _residues(book, n)


@cache
def _bipartite_book(n: int) -> tuple[int, ...]:
    """Signed odd distances seen from an active node, as residues (n even)."""
    book: list[int] = []
    for i in range(digits(n - 1, 2)):
        d = 1 if i == 0 else 1 + 2 ** i
        book += [d, -d]
    return _residues(book, n)


def period(topology: str, n: int, peers: int = 1) -> int:
    """The graph at iteration ``k`` equals the graph at ``k mod period``."""
    _check(topology, n, peers)
    if n == 1 or topology in ("ring", "complete"):
        return 1
    if topology == "npdde":
        return digits(n - 1, peers + 1)
    if topology == "dde":
        book = len(_dde_book(n))
        return book // _gcd(book, peers)
    # bipartite_exp
    if n % 2 == 0:
        book = len(_bipartite_book(n))
        return book // _gcd(book, peers)
    book = len(_bipartite_book(n - 1))
    inner = book // _gcd(book, peers)
    return n * inner // _gcd(n, inner)


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


def distances(topology: str, iteration: int, n: int, peers: int = 1) -> tuple[int, ...]:
    """Out-distances (residues mod n) of every node at ``iteration`` for the circulant graphs.

    ``bipartite_exp`` is not circulant (the sign depends on the node's side): use
    :func:`out_peers` for it.
    """
    _check(topology, n, peers)
    if topology == "bipartite_exp":
        raise ValueError("bipartite_exp is not circulant; use out_peers()")
    if n == 1:
        return ()
    if topology == "npdde":
        b = peers + 1
        i = iteration % digits(n - 1, b)
        return _residues([j * b ** i for j in range(1, peers + 1)], n)
    if topology == "dde":
        book = _dde_book(n)
        return _residues([book[(iteration * peers + j) % len(book)] for j in range(peers)], n)
    if topology == "ring":
        return _residues(list(range(1, peers + 1)), n)
    return tuple(range(1, n))  # complete


def _bipartite_partners(node: int, iteration: int, n: int, peers: int) -> list[int]:
    if n == 1:
        return []
    if n % 2:
        sit = iteration % n
        if node == sit:
            return []
        q = (node - sit - 1) % n
        return [(p + sit + 1) % n for p in _bipartite_partners(q, iteration, n - 1, peers)]
    book = _bipartite_book(n)
    sign = 1 if node % 2 else -1  # active (odd) adds the entry, passive subtracts it
    out: list[int] = []
    for j in range(min(peers, len(book))):
        peer = (node + sign * book[(iteration * peers + j) % len(book)]) % n
        if peer not in out:
            out.append(peer)
    return out


def out_peers(topology: str, node: int, iteration: int, n: int, peers: int = 1) -> list[int]:
    """The nodes ``node`` sends to at ``iteration``."""
    return list(peer_table(topology, iteration, n, peers)[0][node])


def in_peers(topology: str, node: int, iteration: int, n: int, peers: int = 1) -> list[int]:
    """The nodes that send to ``node`` at ``iteration`` (ascending)."""
    return list(peer_table(topology, iteration, n, peers)[1][node])


@lru_cache(maxsize=4096)
def _table(topology: str, phase: int, n: int, peers: int) -> tuple[tuple[tuple[int, ...], ...],
                                                                    tuple[tuple[int, ...], ...]]:
    if topology == "bipartite_exp":
        outs = tuple(tuple(_bipartite_partners(r, phase, n, peers)) for r in range(n))
    else:
        ds = distances(topology, phase, n, peers)
        outs = tuple(tuple((r + d) % n for d in ds) for r in range(n))
    ins: list[list[int]] = [[] for _ in range(n)]
    for r, targets in enumerate(outs):
        for t in targets:
            ins[t].append(r)
    return outs, tuple(tuple(sorted(x)) for x in ins)


def peer_table(topology: str, iteration: int, n: int, peers: int = 1) -> tuple[
        tuple[tuple[int, ...], ...], tuple[tuple[int, ...], ...]]:
    """``(out, in)``: for every node, its out-peers and in-peers at ``iteration`` (cached)."""
    _check(topology, n, peers)
    return _table(topology, iteration % period(topology, n, peers), n, peers)


def symmetric_topology(topology: str) -> str:
    """The undirected graph D-PSGD uses for ``topology`` (directed exponential → bipartite)."""
    return "bipartite_exp" if topology in ("npdde", "dde") else topology


@lru_cache(maxsize=4096)
def _sym_table(topology: str, phase: int, n: int, peers: int) -> tuple[tuple[int, ...], ...]:
    outs, ins = _table(topology, phase, n, peers)
    return tuple(tuple(sorted(set(o) | set(i))) for o, i in zip(outs, ins))


def symmetric_neighbors(topology: str, node: int, iteration: int, n: int, peers: int = 1) -> list[int]:
    """D-PSGD's neighbours of ``node`` at ``iteration`` (ascending; the relation is symmetric)."""
    return list(symmetric_table(topology, iteration, n, peers)[node])


def symmetric_table(topology: str, iteration: int, n: int, peers: int = 1) -> tuple[tuple[int, ...], ...]:
    """Every node's D-PSGD neighbours at ``iteration``: out- ∪ in-peers of the symmetric graph."""
    topo = symmetric_topology(topology)
    _check(topo, n, peers)
    return _sym_table(topo, iteration % period(topo, n, peers), n, peers)


def is_active(node: int) -> bool:
    """AD-PSGD's bipartition: odd nodes are active (initiate averaging), even passive."""
    return node % 2 == 1


def adpsgd_candidates(topology: str, node: int, n: int, peers: int = 1) -> list[int]:
    """Passive (even) nodes an active ``node`` may average with (AD-PSGD, Lian et al. 2018).

    ``ring``: the passive ones among ``node ± 1``; ``complete``: every passive node;
    otherwise the passive nodes at the bipartite exponential graph's odd distances
    ``±1, ±3, ±5, ±9, …`` (over a whole period). Passive nodes get ``[]``.
    """
    _check(topology, n, peers)
    if not is_active(node) or n == 1:
        return []
    if topology == "complete":
        cands = list(range(0, n, 2))
    elif topology == "ring":
        cands = [(node - 1) % n, (node + 1) % n]
    else:
        book: list[int] = []
        for i in range(digits(n - 1, 2)):
            d = 1 if i == 0 else 1 + 2 ** i
            book += [d, -d]
        cands = [(node + d) % n for d in book]
    out: list[int] = []
    for c in cands:
        if c % 2 == 0 and c != node and c not in out:
            out.append(c)
    return sorted(out)
