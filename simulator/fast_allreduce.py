"""The fast engine of AllReduce-SGD: the SimPy engine's rounds as a closed form per round,
the trace written as whole columns; byte-identical traces.

AR-SGD's iteration ``k`` (:class:`.gossip.AllReduceRun`): every node computes from the round's
start ``t_k``; bucket ``b`` is all-reduced when every node has produced it and bucket
``b − 1``'s all-reduce is done; the round ends with the last bucket's, plus the optimizer
step. Nothing else uses the NICs, so every NIC is reserved alike and one scalar stands for
their FIFO state. What makes it fast:

* each node's minibatch times are drawn for a block of rounds at once (the node's own seeded
  stream, the same values as one draw at a time: NumPy fills arrays sequentially);
* without transient stalls a node's bucket ``b`` is ready at ``t_k + w·f_b`` and, rounding
  being monotonic, ``max_i (t_k + w_i·f_b) = t_k + max_i (w_i·f_b)`` exactly: the maxima of a
  whole block are one NumPy reduction, and the per-round recurrence is a few scalar
  operations per bucket; with stalls each node's clock walks its stalls
  (:class:`.compute.LearnerClock`, the SimPy engine's own objects);
* the trace's rows (per round: ``N`` grads, an apply, ``N − 1`` mixes, perhaps an eval;
  :meth:`.protocols.GossipRecorder.allreduce_round`) are written as columns by index
  arithmetic, not row by row.

Identity with the SimPy engine: the same draws, the same float operations in the same order
(``now + delay`` event times, the FIFO reservation, Python's ``sum`` for the blocked time,
sequential accumulations), the same eval cadence; tests/test_fast_allreduce.py holds the two
byte for byte on a property grid, and a rule changes in :mod:`.gossip` first and here second.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import collectives
from .compute import learner_clocks
from .protocols import GLOBAL_SLICE, AVERAGE, EvalCadence, sim_id
from .protocols.gossip import iterations, run_figures, trace_header
from .protocols.gossip_rules import allreduce_weights
from .trace import APPLY, EVAL, GRAD, MIX, Trace, blank_columns

BLOCK_VALUES = 1 << 20  # a block of rounds holds at most this many (rounds × nodes × buckets) values


def covers(point: dict[str, Any]) -> str | None:
    """None when this engine simulates ``point`` exactly; otherwise why not (one phrase)."""
    if point["protocol"]["name"] != "allreduce":
        return "not allreduce"
    return None


def simulate_allreduce_fast(point: dict[str, Any], keep_trace: bool = True
                            ) -> tuple[Trace | None, dict[str, Any], list[tuple[int, int]],
                                       list[tuple[float, float]], str]:
    """The SimPy engine's ``(trace, summary)`` of an AllReduce-SGD point, with the staleness
    histogram, the evaluation schedule (simulated time, epoch) and the simulation's id.
    ``keep_trace=False``: no trace (None); every other number is the same."""
    cl, proto, wl = point["cluster"], point["protocol"], point["workload"]
    n, mu, spe = cl["learners"], cl["minibatch"], wl["samples_per_epoch"]
    K = iterations(point)
    fabric = collectives.Fabric.of_cluster(cl)
    sizes = collectives.bucket_sizes(wl["param_count"] * cl["network"]["bytes_per_param"], proto["bucket_bytes"])
    plan = collectives.bucket_plan(fabric, proto["allreduce_algorithm"], sizes)
    produced = collectives.produced_shares(sizes, cl["compute"]["backward_fraction"], sum(sizes))
    step_s = cl["compute"]["step_s"]
    clocks = learner_clocks(point, n)
    stalled = any(c._s != math.inf for c in clocks)
    shares = np.array(produced, dtype=np.float64)
    B = len(sizes)

    starts = np.zeros(K + 1)          # t_k: round k starts (the SimPy time of round k − 1's end)
    ready = np.zeros((K, n)) if keep_trace else None
    compute_s = blocked_s = bytes_sent = nic_busy = 0.0
    messages = 0
    free = 0.0                        # when the NICs are free (FIFO: every NIC alike)
    t = 0.0
    rows = max(1, BLOCK_VALUES // (n * B))  # rounds per block: work (rows × n) and maxima (rows × B) bounded
    for k0 in range(0, K, rows):
        k1 = min(K, k0 + rows)
        work = np.empty((k1 - k0, n))
        for i, clock in enumerate(clocks):
            work[:, i] = clock.draws._fn(k1 - k0)
        compute_s = float(np.add.accumulate(np.concatenate(([compute_s], work.ravel())))[-1])
        if not stalled:  # bucket b ready at t + max_i(w_i·f_b); the last one at t + max_i w_i
            lead = np.empty((k1 - k0, B))
            for b in range(len(produced)):
                lead[:, b] = (work * shares[b]).max(axis=1)
            lead[:, B - 1] = work.max(axis=1)
            leads = lead.tolist()
        for r in range(k1 - k0):
            k = k0 + r
            if stalled:
                marks = [clock.finish_many(t, [w * f for f in produced] + [w])
                         for clock, w in zip(clocks, work[r].tolist())]
                done = [m[-1] for m in marks]
                at = [max(col) for col in zip(*marks)]
            else:
                at = [t + x for x in leads[r]]
            end = t
            for (busy, fixed, nbytes, msgs), a in zip(plan, at):
                begin = a if a > end else end
                if n > 1:  # Transport.collective: every NIC reserved at begin for busy seconds
                    bytes_sent += nbytes
                    messages += msgs
                    start = free if free > begin else begin
                    free = start + busy
                    nic_busy += busy
                    end = (free if free > begin else begin) + fixed
                else:
                    end = begin
            end += step_s
            row = np.array(done) if stalled else t + work[r]
            blocked_s += sum((end - row).tolist())
            if ready is not None:
                ready[k] = row
            delay = end - t
            t = t + (delay if delay > 0 else 0.0)
            starts[k + 1] = t
    T = t

    # the eval cadence, round by round (GossipRecorder: samples += N·μ per round)
    cadence = EvalCadence(spe, wl["evals_per_epoch"], end=K * n * mu)
    evals_after = np.array([cadence.due((k + 1) * n * mu) for k in range(K)], dtype=bool)
    schedule = [(0.0, 0.0)] + [(float(starts[k + 1]), (k + 1) * n * mu / spe) for k in np.flatnonzero(evals_after)]
    final = not (K and evals_after[-1])
    if final:
        schedule.append((T, K * n * mu / spe))

    trace = _trace(point, n, mu, spe, K, starts, ready, evals_after, final) if ready is not None else None
    nodes = fabric.nodes
    util = (min(1.0, nic_busy / T) if T > 0 else 0.0) if n > 1 else 0.0
    link = float(np.mean([util] * nodes))
    grads = n * K
    summary = run_figures(n, K, T, grads, K, compute_s, link, link, bytes_sent, messages, blocked_s, 0, 0)
    return trace, summary, [(0, grads)], schedule, sim_id(point)


def _trace(point: dict[str, Any], n: int, mu: int, spe: int, K: int, starts: np.ndarray, ready: np.ndarray,
           evals_after: np.ndarray, final: bool) -> Trace:
    """GossipRecorder's rows of the whole run as columns: an eval; per round k the N grads
    (slice i of global batch k on version k), the apply on node 0 (weights 1/N, σ 0), the
    mixes copying node 0's new version to nodes 1 … N−1, an eval when due; the final eval."""
    per = 2 * n + evals_after.astype(np.int64)               # rows of round k
    first = 1 + np.concatenate(([0], np.cumsum(per)[:-1]))  # its first row
    n_ops = 1 + int(per.sum()) + int(final)
    ops, inputs = blank_columns(n_ops, n * K)
    ks = np.arange(K, dtype=np.int64)
    after = starts[1:]
    epoch_before = (ks * n * mu) / spe
    epoch_after = ((ks + 1) * n * mu) / spe
    ops["kind"][:] = MIX
    # grads: rows first_k + i
    g = (first[:, None] + np.arange(n)).ravel()
    node = np.tile(np.arange(n, dtype=np.int64), K)
    kk = np.repeat(ks, n)
    ops["kind"][g] = GRAD
    ops["node"][g] = node
    ops["src_node"][g] = node
    ops["src_version"][g] = kk
    ops["sample_start"][g] = (kk * n + node) * mu
    ops["batch_size"][g] = mu
    ops["batch_index"][g] = kk
    ops["t_start"][g] = np.repeat(starts[:K], n)
    ops["t_end"][g] = ready.ravel()
    ops["epoch"][g] = np.repeat(epoch_before, n)
    # applies: row first_k + n, inputs k·N … k·N + N − 1 (the round's grads)
    a = first + n
    ops["kind"][a] = APPLY
    ops["node"][a] = 0
    ops["version"][a] = ks
    ops["in_start"][a] = ks * n
    ops["in_count"][a] = n
    ops["t_start"][a] = ops["t_end"][a] = after
    ops["epoch"][a] = epoch_after
    inputs["grad_op"][:] = g
    inputs["weight"].reshape(K, n)[:] = allreduce_weights(n)  # each round's weights
    # mixes: rows first_k + n + 1 … first_k + 2n − 1, node i ← node 0's version k + 1
    if n > 1:
        m = (first[:, None] + n + np.arange(1, n)).ravel()
        ops["node"][m] = np.tile(np.arange(1, n, dtype=np.int64), K)
        ops["version"][m] = np.repeat(ks, n - 1)
        ops["src_node"][m] = 0
        ops["src_version"][m] = np.repeat(ks + 1, n - 1)
        ops["coef"][m] = 1.0
        ops["self_coef"][m] = 0.0
        ops["t_start"][m] = ops["t_end"][m] = np.repeat(after, n - 1)
        ops["epoch"][m] = np.repeat(epoch_after, n - 1)
    # evals of the nodes' average: at 0, when due after a round, at the end
    e = [0] + (first + 2 * n)[evals_after].tolist() + ([n_ops - 1] if final else [])
    ops["kind"][e] = EVAL
    ops["node"][e] = AVERAGE
    ops["version"][e] = AVERAGE
    t_eval = np.concatenate(([0.0], after[evals_after], [starts[K]] if final else []))
    ops["t_start"][e] = ops["t_end"][e] = t_eval
    ops["epoch"][e] = np.concatenate(([0.0], epoch_after[evals_after], [epoch_after[-1]] if final else []))
    return Trace(trace_header(point, GLOBAL_SLICE), ops, inputs)
