"""How long an all-reduce takes: the alpha-beta cost of each algorithm on a two-level cluster.

``N`` workers (one per GPU), ``g`` of them per node, ``n = N / g`` nodes. Inside a node a
link of latency ``α_i`` and bandwidth ``β_i`` per GPU (NVLink or PCIe); between nodes each
node's NIC, latency ``α`` and bandwidth ``β`` per direction, shared by the node's GPUs.
Every message (one step of a collective) also pays the software cost ``o`` (a fixed cost per
message, not per byte). An all-reduce of ``B`` bytes (Thakur, Rabenseifner & Gropp 2005;
NCCL's bus-bandwidth model, docs/hardware.md):

* ``ring`` (flat, all N workers in one ring): ``2(N−1)`` steps, each moving ``B/N`` bytes
  over every edge of the ring at once; a step lasts as long as its slowest edge (the NIC
  between nodes, when there are several): ``2(N−1)·(α + o) + 2(N−1)/N · B/β``.
* ``hierarchical``: reduce-scatter inside each node (ring of g: ``(g−1)`` steps of ``B/g``),
  all-reduce of each GPU's ``B/g`` shard across the nodes (g rings of n, sharing the NIC:
  the NIC carries ``2(n−1)/n · B``), all-gather inside the node:
  ``2(g−1)·(α_i + o) + 2(g−1)/g · B/β_i + 2(n−1)·(α + o) + 2(n−1)/n · B/β``.
* ``halving_doubling`` (recursive halving reduce-scatter, recursive doubling all-gather;
  Goyal et al. 2017 across servers): between nodes ``2⌈log2 n⌉`` steps instead of
  ``2(n−1)``, the same bytes; inside nodes (g > 1) as ``hierarchical``.
* ``recursive_doubling`` (PyTorch's TCP backend before 1.0, ``DataChannelTCP::allReduce``):
  between nodes ``⌈log2 n⌉`` exchanges of the *whole* message (two more when n is not a
  power of two): ``s·(α + o) + s·B/β``; inside nodes as ``hierarchical``.

With ``g = 1`` the intra-node terms vanish and ``hierarchical`` is the flat ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALGORITHMS = ("ring", "hierarchical", "halving_doubling", "recursive_doubling")


@dataclass(frozen=True)
class Fabric:
    """The links an all-reduce runs over (module doc): per message ``latency_s`` +
    ``overhead_s``; ``bandwidth_Bps`` per NIC direction, ``intra_*`` inside a node."""

    workers: int
    gpus_per_node: int
    latency_s: float
    bandwidth_Bps: float
    intra_latency_s: float
    intra_bandwidth_Bps: float
    overhead_s: float = 0.0

    @property
    def nodes(self) -> int:
        return self.workers // self.gpus_per_node

    @classmethod
    def of_cluster(cls, cluster: dict) -> Fabric:
        """The fabric of a scenario's ``cluster`` table (one worker per learner)."""
        net = cluster["network"]
        return cls(cluster["learners"], cluster["gpus_per_node"], net["latency_s"], net["bandwidth_Bps"],
                   net["intra_latency_s"], net["intra_bandwidth_Bps"], net["overhead_s"])


def bucket_plan(f: Fabric, algorithm: str, sizes: list[float]) -> list[tuple[float, float, float, int]]:
    """Per bucket, in the order backward produces them: ``(busy, fixed, NIC bytes, messages)``
    of its all-reduce (:func:`allreduce_parts`, :func:`nic_bytes`, :func:`messages`)."""
    return [(*allreduce_parts(f, algorithm, b), nic_bytes(f, algorithm, b), messages(f, algorithm)) for b in sizes]


def transfer_time(nbytes: float, bandwidth: float) -> float:
    """Seconds ``nbytes`` hold a link of ``bandwidth`` bytes/s: ``nbytes / bandwidth``, and 0 on a
    free link (infinite bandwidth), for every engine (the fast kernels' twin:
    :func:`.fast_core.transfer_time`)."""
    return 0.0 if math.isinf(bandwidth) else nbytes / bandwidth


def allreduce_parts(f: Fabric, algorithm: str, nbytes: float) -> tuple[float, float]:
    """``(busy, fixed)`` seconds of an all-reduce of ``nbytes``: ``busy`` is the time bytes hold
    the node's NIC (the intra-node link on a single node), ``fixed`` the rest: per-step
    latencies and software costs, and the other level's transfers. It lasts ``busy + fixed``."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r} (one of {', '.join(ALGORITHMS)})")
    N, g, n = f.workers, f.gpus_per_node, f.nodes
    if N <= 1:
        return 0.0, 0.0
    a, o, ai = f.latency_s, f.overhead_s, f.intra_latency_s
    if algorithm == "ring" and n > 1 and g > 1:  # one ring through every GPU: the slowest edge per step
        steps = 2 * (N - 1)
        chunk = nbytes / N
        step = max(a + transfer_time(chunk, f.bandwidth_Bps), ai + transfer_time(chunk, f.intra_bandwidth_Bps))
        busy = steps * transfer_time(chunk, f.bandwidth_Bps)
        return busy, steps * (step + o) - busy
    # otherwise: the intra-node stages (hierarchical, halving/doubling; a single node's ring)
    # and the inter-node stage (a flat ring when g = 1)
    intra_busy = 2.0 * (g - 1) / g * transfer_time(nbytes, f.intra_bandwidth_Bps) if g > 1 else 0.0
    intra_fixed = 2 * (g - 1) * (ai + o) if g > 1 else 0.0
    if n == 1:
        return intra_busy, intra_fixed
    if algorithm == "recursive_doubling":
        inter_steps = math.ceil(math.log2(n)) + (0 if n & (n - 1) == 0 else 2)
        busy = inter_steps * transfer_time(nbytes, f.bandwidth_Bps)
    else:
        inter_steps = 2 * math.ceil(math.log2(n)) if algorithm == "halving_doubling" else 2 * (n - 1)
        busy = 2.0 * (n - 1) / n * transfer_time(nbytes, f.bandwidth_Bps)
    return busy, inter_steps * (a + o) + intra_busy + intra_fixed


def nic_bytes(f: Fabric, algorithm: str, nbytes: float) -> float:
    """Bytes all the NICs together send in an all-reduce of ``nbytes`` (nothing on one node)."""
    n = f.nodes
    if n <= 1:
        return 0.0
    if algorithm == "ring" and f.gpus_per_node > 1:
        return n * 2 * (f.workers - 1) * nbytes / f.workers
    if algorithm == "recursive_doubling":
        return n * (math.ceil(math.log2(n)) + (0 if n & (n - 1) == 0 else 2)) * nbytes
    return 2.0 * (n - 1) * nbytes


def messages(f: Fabric, algorithm: str) -> int:
    """Messages (steps × senders) of one all-reduce."""
    N, g, n = f.workers, f.gpus_per_node, f.nodes
    if N <= 1:
        return 0
    if algorithm == "ring" or (g == 1 and algorithm == "hierarchical"):
        return 2 * (N - 1) * N
    intra = 2 * (g - 1) * N if g > 1 else 0
    if n == 1:
        return intra
    if algorithm == "recursive_doubling":
        steps = math.ceil(math.log2(n)) + (0 if n & (n - 1) == 0 else 2)
    elif algorithm == "halving_doubling":
        steps = 2 * math.ceil(math.log2(n))
    else:
        steps = 2 * (n - 1)
    return intra + steps * N


def bucket_sizes(nbytes: float, bucket_bytes: int) -> list[float]:
    """A gradient of ``nbytes`` in buckets of ``bucket_bytes`` (the last one smaller), in the
    order backward produces them; ``bucket_bytes`` 0 (or at least ``nbytes``): one bucket."""
    if bucket_bytes <= 0 or bucket_bytes >= nbytes:
        return [nbytes]
    full = int(nbytes // bucket_bytes)
    rest = nbytes - full * bucket_bytes
    return [float(bucket_bytes)] * full + ([rest] if rest > 0 else [])


def produced_shares(sizes: list[float], backward_fraction: float, total: float) -> list[float]:
    """The share of a minibatch's work done when each bucket but the last is ready: forward,
    then backward producing ``total`` bytes of gradient in bucket order, bytes evenly in time
    (the last bucket is ready when the work is done)."""
    out, cum = [], 0.0
    for b in sizes[:-1]:
        cum += b
        out.append((1.0 - backward_fraction) + backward_fraction * cum / total)
    return out


def allreduce_time(f: Fabric, algorithm: str, nbytes: float) -> float:
    """Seconds of an all-reduce of ``nbytes`` (module doc)."""
    busy, fixed = allreduce_parts(f, algorithm, nbytes)
    return busy + fixed


def default_algorithm(gpus_per_node: int) -> str:
    """``ring`` with one GPU per node, ``hierarchical`` otherwise."""
    return "ring" if gpus_per_node == 1 else "hierarchical"
