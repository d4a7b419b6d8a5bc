"""The fast engine of Stochastic Gradient Push: the SimPy engine's event loop compiled by numba,
byte-identical traces.

Covered: SGP with any overlap τ, topology and peers, network latency/bandwidth/overhead, GPUs
per node (intra-node links), persistent stragglers and transient stalls, any compute
distribution.

What it transcribes (:class:`.gossip.SGPRun`, :class:`.gossip.Transport`,
:class:`.protocols.GossipRecorder`): iteration ``k`` of node ``i`` on version ``v`` — a grad,
an apply, the sends of ``(x, w)/(d+1)`` to the out-peers, the kept share (a mix), the mixes of
the held messages of iterations ≤ k; then go on when every message of iterations ≤ k − τ has
arrived, else wait and mix messages as they arrive. A message leaves through the sender's
link out (FIFO), enters the receiver's link in ``latency + overhead`` after it started leaving
(an event) and is delivered when the link in is done with it (a second event); free links
(infinite bandwidth): delivered ``latency + overhead`` after it is sent.

Identity: the same draws, the same float operations in the same order (the FIFO
reservations, ``now + delay`` event times), the same event order (a heap keyed by (time,
schedule counter), as SimPy's; a node's next compute is always the last thing its handler
schedules, so it is scheduled at the top of the loop, where the draws are checked first), the
same eval cadence. tests/test_fast_gossip.py holds the two byte for byte on a property grid. The
rules (the graph's tables, the shares, the τ boundary, the mark of arrived iterations) are
:mod:`.protocols.gossip_rules`' tables and functions, compiled here as the SimPy engine runs them.

Storage: events and messages live in arrays (a message pool with a free list); a node's
held messages, its count of arrived messages per iteration (a ring) and the draw buffers are
grown by the Python side when the kernel asks (a status code), so the kernel stops before it
changes anything and resumes where it stopped. The trace's length is known in advance
(3 rows per node-iteration, one mix per message, the evals), so its columns are allocated once;
without the trace they hold a bounded number of rows, folded away when full (:class:`.fast_nodes.Run`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import fast_nodes
from .fast_nodes import (C_GRAD_OP, C_KIND, DELIVER, DONE, ENTER, FP_EVERY, FS_BLOCKED, FS_NOW, IP_CAD_END,
                         IP_GPUS_PER_NODE, IP_K, IP_MU, IP_N, IP_PER_EPOCH, IP_SHARD_LEN, IP_SPE, MF_COEF, MF_SENT,
                         MI_DST, MI_ITER, MI_SRC, MI_SRC_VERSION, MI_STATE, NEED_POOL, NEED_ROWS, NEED_STALL,
                         ST_DELAY_COUNT, ST_DELAY_SUM, ST_FREE, ST_HEAP, ST_NEED, ST_PEND_HEAD, ST_PEND_TAIL,
                         WALK_RESUME, apply_row, draws_short, enter, grad_row, mix_row, queue_begin, release,
                         rows_short, send, start_compute)
from .fast_core import heap_pop, kernel
from .protocols import gossip_rules
from .protocols.gossip import iterations
from .trace import Trace

NEED_HELD, NEED_RING = 5, 6  # this kernel's own status codes
# this kernel's own parameters (int), ``gp``, indexed by these names only: τ, phases, the arrival ring's length R
GP_TAU, GP_PHASES, GP_RING = range(3)
GP_SIZE = 3


def covers(point: dict[str, Any]) -> str | None:
    """None when this engine simulates ``point`` exactly; otherwise why not (one phrase)."""
    return fast_nodes.covers(point, "sgp")


@kernel
def _kernel(ip: np.ndarray, gp: np.ndarray, fp: np.ndarray, st: np.ndarray, fst: np.ndarray,
            wdraw: np.ndarray, wpos: np.ndarray, wlen: np.ndarray, stall: np.ndarray, sdraw: np.ndarray,
            spos: np.ndarray, slen: np.ndarray, walk: np.ndarray,
            out_ptr: np.ndarray, out_idx: np.ndarray, indeg: np.ndarray, coefs: np.ndarray,
            links: np.ndarray, it: np.ndarray, t_start: np.ndarray, version: np.ndarray, complete: np.ndarray,
            blocked_at: np.ndarray, block_start: np.ndarray, done: np.ndarray, ev_k: np.ndarray, ev_v: np.ndarray,
            pend: np.ndarray, pend_t: np.ndarray, held: np.ndarray, held_n: np.ndarray, arrived: np.ndarray,
            m_i: np.ndarray, m_f: np.ndarray, free: np.ndarray, ht: np.ndarray, hk: np.ndarray, hs: np.ndarray,
            cols: tuple) -> int:
    """Run until done or until a buffer needs room (the returned status). ``ip``, ``fp``,
    ``st``, ``fst``, links, messages, columns: :mod:`.fast_nodes`; ``gp`` (``GP_*``): τ, phases,
    the arrival ring's length R. ``arrived[j·R + k % R]``: messages of iteration k arrived at node
    j and not yet counted into its mark; ``indeg[ph·n + j]``: how many node j receives at phase ph (flat, as
    :func:`.protocols.gossip_rules.sgp_advance` reads them).
    Heap slots: ``i < n`` node i's compute (its k, v in ``ev_k``, ``ev_v``); ``n + m`` message m.
    """
    n, mu, spe, K = ip[IP_N], ip[IP_MU], ip[IP_SPE], ip[IP_K]
    shard_len, per_epoch, g, cad_end = ip[IP_SHARD_LEN], ip[IP_PER_EPOCH], ip[IP_GPUS_PER_NODE], ip[IP_CAD_END]
    tau, phases, R = gp[GP_TAU], gp[GP_PHASES], gp[GP_RING]
    every = fp[FP_EVERY]
    H = held.shape[1]
    n_ops, n_inputs = cols[C_KIND].shape[0], cols[C_GRAD_OP].shape[0]  # the trace buffers' sizes (fixed in a call)
    while True:
        # a node that may start its next iteration does (SGPRun._begin): last thing its handler did
        while st[ST_PEND_HEAD] < st[ST_PEND_TAIL]:
            i = pend[st[ST_PEND_HEAD] % n]
            if walk[i, WALK_RESUME] == 0.0:  # (1: a stall walk to resume)
                short = draws_short(i, wpos, wlen, stall, spos, slen, st)
                if short:
                    return short
                t_start[i] = pend_t[i]
                ev_k[i] = it[i]
                ev_v[i] = version[i]
            if not start_compute(i, pend_t[i], fst[FS_NOW], st, fst, fp, wdraw, wpos, stall, sdraw, spos, slen, walk,
                                 ht, hk, hs):
                st[ST_NEED] = i
                return NEED_STALL
            st[ST_PEND_HEAD] += 1
        if st[ST_HEAP] == 0:
            return DONE
        if rows_short(st, n_ops, n_inputs, 5 + H):  # a compute writes ≤ 4 + its held messages
            return NEED_ROWS
        slot = hs[0]
        if slot < n:  # a compute finishing: room for its messages first
            ph = ev_k[slot] % phases
            if st[ST_FREE] < out_ptr[ph, slot + 1] - out_ptr[ph, slot]:
                st[ST_NEED] = slot
                return NEED_POOL
        elif m_i[slot - n, MI_STATE] == DELIVER:
            m = slot - n
            j = m_i[m, MI_DST]
            if m_i[m, MI_ITER] - complete[j] >= R:
                st[ST_NEED] = m
                return NEED_RING
            if held_n[j] >= H:
                st[ST_NEED] = j
                return NEED_HELD
        now = ht[0]
        st[ST_HEAP] = heap_pop(ht, hk, hs, st[ST_HEAP])
        fst[FS_NOW] = now
        if slot < n:  # SGPRun._computed
            i = slot
            k = ev_k[i]
            v = ev_v[i]
            gop = grad_row(st, cols, i, k, v, t_start[i], now, mu, spe, shard_len, per_epoch)
            apply_row(st, fst, cols, i, gop, 0, now, version, mu, spe, every, cad_end)
            sent = v + 1
            ph = k % phases
            c = coefs[ph, i]
            for x in range(out_ptr[ph, i], out_ptr[ph, i + 1]):
                send(st, fst, fp, i, out_idx[x], k, sent, c, now, n, g, links, m_i, m_f, free, ht, hk, hs)
            mix_row(st, cols, i, i, sent, KEPT_COEF, c, now, now, version, spe)  # keep one share
            # the boundary of iteration k: mix what arrived of iterations ≤ k (in arrival order)
            keep = 0
            for y in range(held_n[i]):
                hm = held[i, y]
                if _mix_at_boundary(m_i[hm, MI_ITER], k):
                    _mix_msg(st, cols, i, hm, k, now, m_i, m_f, free, version, spe)
                else:
                    held[i, keep] = hm
                    keep += 1
            held_n[i] = keep
            if _may_advance(_advance(i, K, phases, n, R, indeg, arrived, complete), k, tau):
                _next(i, k, now, K, it, done, blocked_at, pend, pend_t, st)
            else:
                blocked_at[i] = k
                block_start[i] = now
            continue
        m = slot - n
        if m_i[m, MI_STATE] == ENTER:
            enter(st, m, now, n, links, m_i, m_f, ht, hk, hs)
            continue
        # SGPRun._arrive
        j = m_i[m, MI_DST]
        k_msg = m_i[m, MI_ITER]
        arrived[j * R + k_msg % R] += 1
        cc = _advance(j, K, phases, n, R, indeg, arrived, complete)
        kb = blocked_at[j]
        if _mix_on_arrival(k_msg, kb):
            _mix_msg(st, cols, j, m, kb, now, m_i, m_f, free, version, spe)
            if done[j] == 0 and _may_advance(cc, kb, tau):
                blocked_at[j] = -1
                fst[FS_BLOCKED] += now - block_start[j]
                _next(j, kb, now, K, it, done, blocked_at, pend, pend_t, st)
        else:
            held[j, held_n[j]] = m
            held_n[j] += 1


@kernel
def _advance(j: int, K: int, phases: int, n: int, R: int, indeg: np.ndarray, arrived: np.ndarray,
             complete: np.ndarray) -> int:
    """SGPRun._advance: move node j's "every message of iterations ≤ c is in" mark
    (:func:`.protocols.gossip_rules.sgp_advance`)."""
    c = _sgp_advance(arrived, R, complete[j], K, indeg, phases, n, j)
    complete[j] = c
    return c


@kernel
def _next(i: int, k: int, now: float, K: int, it: np.ndarray, done: np.ndarray, blocked_at: np.ndarray,
          pend: np.ndarray, pend_t: np.ndarray, st: np.ndarray) -> None:
    """SGPRun._next: iteration k + 1 begins now (at the loop's top), or the node is done."""
    if k + 1 < K:
        it[i] = k + 1
        queue_begin(i, now, pend, pend_t, st)
    else:
        done[i] = 1
        blocked_at[i] = K - 1


@kernel
def _mix_msg(st: np.ndarray, cols: tuple, i: int, m: int, k_now: int, now: float, m_i: np.ndarray,
             m_f: np.ndarray, free: np.ndarray, version: np.ndarray, spe: int) -> None:
    """SGPRun._mix_msg; message m's slot goes back to the pool."""
    mix_row(st, cols, i, m_i[m, MI_SRC], m_i[m, MI_SRC_VERSION], m_f[m, MF_COEF], RECEIVED_SELF_COEF, m_f[m, MF_SENT],
            now, version, spe)
    st[ST_DELAY_SUM] += k_now - m_i[m, MI_ITER]
    st[ST_DELAY_COUNT] += 1
    release(st, m, free)


# the rules, as the SimPy engine runs them, compiled into the kernels that call them (numba's IR
# inlining: no call in the hot loop; plain where fast_core.kernel leaves the code plain)
_may_advance, _mix_at_boundary, _mix_on_arrival, _sgp_advance = (
    kernel(rule, inline=True) for rule in (gossip_rules.sgp_may_advance, gossip_rules.sgp_mix_at_boundary,
                                            gossip_rules.sgp_mix_on_arrival, gossip_rules.sgp_advance))
KEPT_COEF, RECEIVED_SELF_COEF = gossip_rules.KEPT_COEF, gossip_rules.RECEIVED_SELF_COEF


def _initial_sizes(n: int, tau: int, indeg: int) -> tuple[int, int, int]:
    """Held messages per node, the arrival ring's length and the message pool to start with
    (each grows when the run needs more): a few iterations' worth."""
    return 8, max(4, 2 * (tau + 2)), max(16, 4 * n * max(1, indeg) * (tau + 1))


def simulate_sgp_fast(point: dict[str, Any], keep_trace: bool = True
                      ) -> tuple[Trace | None, dict[str, Any], list[tuple[int, int]], list[tuple[float, float]], str]:
    """The SimPy engine's ``(trace, summary)`` of a covered SGP point, with the staleness
    histogram, the evaluation schedule and the simulation's id (``keep_trace=False``: no trace)."""
    reason = covers(point)
    if reason is not None:
        raise ValueError(f"the fast SGP engine does not cover this point: {reason}")
    n = point["cluster"]["learners"]
    K = iterations(point)
    rules = gossip_rules.SGPRules.of_point(point)
    out_ptr, out_idx, indeg, coefs = rules.tables()
    tau, phases = rules.tau, rules.phases
    per_phase = out_ptr[:, n] - out_ptr[:, 0]  # messages sent in an iteration of each phase
    sends = int(per_phase.sum()) * (K // phases) + int(per_phase[:K % phases].sum())

    held_w, ring, size = _initial_sizes(n, tau, int(indeg.max()))
    run = fast_nodes.Run(point, K, size, 1 + 3 * n * K + sends, 5 + held_w, keep_trace)
    gp = np.zeros(GP_SIZE, np.int64)
    gp[GP_TAU], gp[GP_PHASES], gp[GP_RING] = tau, phases, ring
    indeg_flat = indeg.reshape(-1)
    it, version, complete = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64)
    blocked_at, done = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    t_start, block_start = np.zeros(n), np.zeros(n)
    ev_k, ev_v = np.zeros(n, np.int64), np.zeros(n, np.int64)
    held, held_n = np.zeros((n, held_w), np.int64), np.zeros(n, np.int64)
    arrived = np.zeros((n, ring), np.int64)
    while True:
        ip, fp, st, fst, *draws = run.head()
        status = _kernel(ip, gp, fp, st, fst, *draws, out_ptr, out_idx, indeg_flat, coefs, run.links, it, t_start,
                         version, complete, blocked_at, block_start, done, ev_k, ev_v, run.pend, run.pend_t, held,
                         held_n, arrived.reshape(-1), *run.pool.arrays(), run.cols)
        if status == DONE:
            break
        if run.grow(status):
            continue
        if status == NEED_HELD:
            held = np.concatenate([held, np.zeros_like(held)], axis=1)
        elif status == NEED_RING:  # the arrival counts of iterations complete + 1 …
            arrived = fast_nodes.doubled_ring(arrived, complete + 1)
            gp[GP_RING] = arrived.shape[1]
        else:  # pragma: no cover - the kernel returns no other status
            raise RuntimeError(f"fast SGP engine: unknown status {status}")
    return run.result(keep_trace)
