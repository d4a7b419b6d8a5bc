"""The fast engine of AD-PSGD: the SimPy engine's event loop compiled by numba, byte-identical
traces.

Covered: AD-PSGD on any topology and peers, network and intra-node links, persistent
stragglers and transient stalls, any compute distribution.

What it transcribes (:class:`.gossip.ADPSGDRun` on :mod:`.fast_nodes`): every node computes
without waiting; an active node, when it begins iteration k on version v, sends its state to
the passive neighbour its seeded pick names (the same picks, drawn by the same NumPy calls);
the passive node averages on arrival and answers with its pre-average state; the active node
averages on the answer and applies its gradient once it is computed (σ = mixes by others
between read and apply). A node's next iteration is the last thing its handler starts, so
the kernel starts it at the top of its loop. Message kinds ride in the message's iteration
field, ``MI_ITER`` (request 0, reply 1). tests/test_fast_gossip.py holds it byte for byte to
the SimPy engine on a property grid. The candidates, picks, coefficients and σ are
:mod:`.protocols.gossip_rules`' (:class:`~.protocols.gossip_rules.ADPSGDRules`' tables).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import fast_nodes
from .fast_nodes import (C_GRAD_OP, C_KIND, DONE, ENTER, FP_EVERY, FS_BLOCKED, FS_NOW, IP_CAD_END, IP_GPUS_PER_NODE,
                         IP_K, IP_MU, IP_N, IP_PER_EPOCH, IP_SHARD_LEN, IP_SPE, MF_SENT, MI_DST, MI_ITER, MI_SRC,
                         MI_SRC_VERSION, MI_STATE, NEED_POOL, NEED_ROWS, NEED_STALL, ST_FREE, ST_HEAP, ST_NEED,
                         ST_PEND_HEAD, ST_PEND_TAIL, WALK_RESUME, apply_row, draws_short, enter, grad_row, mix_row,
                         queue_begin, release, rows_short, send, start_compute)
from .fast_core import heap_pop, kernel
from .protocols import gossip_rules
from .protocols.gossip import iterations
from .trace import Trace

REQUEST, REPLY = 0, 1  # message kinds


def covers(point: dict[str, Any]) -> str | None:
    """None when this engine simulates ``point`` exactly; otherwise why not (one phrase)."""
    return fast_nodes.covers(point, "adpsgd")


@kernel
def _kernel(ip: np.ndarray, fp: np.ndarray, st: np.ndarray, fst: np.ndarray,
            wdraw: np.ndarray, wpos: np.ndarray, wlen: np.ndarray, stall: np.ndarray, sdraw: np.ndarray,
            spos: np.ndarray, slen: np.ndarray, walk: np.ndarray, c_ptr: np.ndarray, c_idx: np.ndarray,
            picks: np.ndarray, links: np.ndarray, it: np.ndarray, t_start: np.ndarray, t_ready: np.ndarray,
            read: np.ndarray, gop: np.ndarray, computed: np.ndarray, averaged: np.ndarray, version: np.ndarray,
            ev_k: np.ndarray, ev_v: np.ndarray, pend: np.ndarray, pend_t: np.ndarray,
            m_i: np.ndarray, m_f: np.ndarray, free: np.ndarray, ht: np.ndarray, hk: np.ndarray, hs: np.ndarray,
            cols: tuple) -> int:
    """Run until done or until a buffer needs room (the returned status). ``ip``, ``fp``,
    ``st``, ``fst``, links, messages, columns: :mod:`.fast_nodes`. Node i's candidates:
    ``c_idx[c_ptr[i]:c_ptr[i + 1]]`` (none: a passive node); its pick at iteration k
    ``picks[i, k]``."""
    n, mu, spe, K = ip[IP_N], ip[IP_MU], ip[IP_SPE], ip[IP_K]
    shard_len, per_epoch, g, cad_end = ip[IP_SHARD_LEN], ip[IP_PER_EPOCH], ip[IP_GPUS_PER_NODE], ip[IP_CAD_END]
    every = fp[FP_EVERY]
    n_ops, n_inputs = cols[C_KIND].shape[0], cols[C_GRAD_OP].shape[0]  # the trace buffers' sizes (fixed in a call)
    while True:
        # ADPSGDRun._begin of a node whose last iteration ended (the last thing its handler did)
        while st[ST_PEND_HEAD] < st[ST_PEND_TAIL]:
            i = pend[st[ST_PEND_HEAD] % n]
            if walk[i, WALK_RESUME] == 0.0:  # (1: a stall walk to resume; the rest is done)
                short = draws_short(i, wpos, wlen, stall, spos, slen, st)
                if short:
                    return short
                active = c_ptr[i + 1] > c_ptr[i]
                if active and st[ST_FREE] < 1:
                    st[ST_NEED] = i
                    return NEED_POOL
                t = pend_t[i]
                k = it[i]
                v = version[i]
                t_start[i] = t
                read[i] = v
                computed[i] = 0
                if active:
                    averaged[i] = 0
                    send(st, fst, fp, i, c_idx[c_ptr[i] + picks[i, k]], REQUEST, v, 0.0, t, n, g, links, m_i, m_f,
                         free, ht, hk, hs)
                else:
                    averaged[i] = 1
                ev_k[i] = k
                ev_v[i] = v
            if not start_compute(i, pend_t[i], fst[FS_NOW], st, fst, fp, wdraw, wpos, stall, sdraw, spos, slen, walk,
                                 ht, hk, hs):
                st[ST_NEED] = i
                return NEED_STALL
            st[ST_PEND_HEAD] += 1
        if st[ST_HEAP] == 0:
            return DONE
        if rows_short(st, n_ops, n_inputs, 4):  # an event writes ≤ 3 ops
            return NEED_ROWS
        slot = hs[0]
        now = ht[0]
        st[ST_HEAP] = heap_pop(ht, hk, hs, st[ST_HEAP])
        fst[FS_NOW] = now
        if slot < n:  # ADPSGDRun._computed
            i = slot
            gop[i] = grad_row(st, cols, i, ev_k[i], ev_v[i], t_start[i], now, mu, spe, shard_len, per_epoch)
            computed[i] = 1
            t_ready[i] = now
            if averaged[i] == 1:
                _finish(i, now, K, mu, spe, every, cad_end, st, fst, cols, c_ptr, it, read, gop, version, pend,
                        pend_t)
            continue
        m = slot - n
        if m_i[m, MI_STATE] == ENTER:
            enter(st, m, now, n, links, m_i, m_f, ht, hk, hs)
            continue
        dst, src, v, t_sent = m_i[m, MI_DST], m_i[m, MI_SRC], m_i[m, MI_SRC_VERSION], m_f[m, MF_SENT]
        release(st, m, free)  # (the answer below takes this slot again)
        if m_i[m, MI_ITER] == REQUEST:  # ADPSGDRun._request: the passive node averages and answers
            u = version[dst]
            mix_row(st, cols, dst, src, v, AVERAGE_COEF, AVERAGE_COEF, t_sent, now, version, spe)
            send(st, fst, fp, dst, src, REPLY, u, 0.0, now, n, g, links, m_i, m_f, free, ht, hk, hs)
            continue
        # ADPSGDRun._reply: the active node averages; it applies once its gradient is computed
        mix_row(st, cols, dst, src, v, AVERAGE_COEF, AVERAGE_COEF, t_sent, now, version, spe)
        averaged[dst] = 1
        if computed[dst] == 1:
            fst[FS_BLOCKED] += now - t_ready[dst]
            _finish(dst, now, K, mu, spe, every, cad_end, st, fst, cols, c_ptr, it, read, gop, version, pend, pend_t)


@kernel
def _finish(i: int, now: float, K: int, mu: int, spe: int, every: float, cad_end: int, st: np.ndarray,
            fst: np.ndarray, cols: tuple, c_ptr: np.ndarray, it: np.ndarray, read: np.ndarray, gop: np.ndarray,
            version: np.ndarray, pend: np.ndarray, pend_t: np.ndarray) -> None:
    """ADPSGDRun._finish: apply (σ = the mixes by others since the read; an active node's own
    averaging is part of its step), then the next iteration."""
    apply_row(st, fst, cols, i, gop[i], _staleness(version[i], read[i], c_ptr[i + 1] > c_ptr[i]), now, version, mu,
              spe, every, cad_end)
    it[i] += 1
    if it[i] < K:
        queue_begin(i, now, pend, pend_t, st)


# the rules, as the SimPy engine runs them, compiled (fast_core.kernel)
AVERAGE_COEF = gossip_rules.AVERAGE_COEF
_staleness = kernel(gossip_rules.adpsgd_staleness)


def simulate_adpsgd_fast(point: dict[str, Any], keep_trace: bool = True
                         ) -> tuple[Trace | None, dict[str, Any], list[tuple[int, int]], list[tuple[float, float]],
                                    str]:
    """The SimPy engine's ``(trace, summary)`` of a covered AD-PSGD point, with the staleness
    histogram, the evaluation schedule and the simulation's id (``keep_trace=False``: no trace)."""
    reason = covers(point)
    if reason is not None:
        raise ValueError(f"the fast AD-PSGD engine does not cover this point: {reason}")
    cl = point["cluster"]
    n = cl["learners"]
    K = iterations(point)
    c_ptr, c_idx, picks = gossip_rules.ADPSGDRules.of_point(point, K).tables()
    active = int((c_ptr[1:] > c_ptr[:-1]).sum())

    run = fast_nodes.Run(point, K, _initial_pool(n), 1 + 2 * n * K + 2 * active * K, 4, keep_trace)
    it, version, gop, read = (np.zeros(n, np.int64) for _ in range(4))
    computed, averaged, ev_k, ev_v = (np.zeros(n, np.int64) for _ in range(4))
    t_start, t_ready = np.zeros(n), np.zeros(n)
    while True:
        ip, fp, st, fst, *draws = run.head()
        status = _kernel(ip, fp, st, fst, *draws, c_ptr, c_idx, picks, run.links, it, t_start, t_ready, read, gop,
                         computed, averaged, version, ev_k, ev_v, run.pend, run.pend_t, *run.pool.arrays(), run.cols)
        if status == DONE:
            break
        if not run.grow(status):  # pragma: no cover - the kernel returns no other status
            raise RuntimeError(f"fast AD-PSGD engine: unknown status {status}")
    return run.result(keep_trace)


def _initial_pool(n: int) -> int:
    """Message slots to start with: one request or answer in flight per active node, twice over."""
    return max(16, 2 * n)
