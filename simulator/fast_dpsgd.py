"""The fast engine of D-PSGD: the SimPy engine's event loop compiled by numba, byte-identical
traces.

Covered: D-PSGD with either schedule (``overlap`` 0: compute, step, send the stepped state,
mix the neighbours' when all are in — the SGP reference code's blocking gossip; ``overlap``
1: send the state while computing, mix and step when both are there), any topology and
peers, network and intra-node links, persistent stragglers and transient stalls, any compute
distribution.

What it transcribes (:class:`.gossip.DPSGDRun` on :class:`.gossip.Transport` and
:class:`.protocols.GossipRecorder`, through :mod:`.fast_nodes`): a node's iteration ends when
its gradient is computed and every neighbour's state of that iteration has arrived; it mixes
them in the order of the symmetric weights (first ``self_coef = W_ii``, then 1) and, with
``overlap`` 1, steps. A node's next iteration is the last thing its handler starts, so the
kernel starts it at the top of its loop (draws, and with ``overlap`` 1 room for its messages,
checked first). Messages wait in the receiver's inbox (per iteration, a ring grown when a
neighbour runs further ahead than it holds). tests/test_fast_gossip.py holds it byte for
byte to the SimPy engine on a property grid. The neighbours, weights, mix order and send order
are the tables of :class:`.protocols.gossip_rules.DPSGDRules`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import fast_nodes
from .fast_nodes import (C_GRAD_OP, C_KIND, DELIVER, DONE, ENTER, FP_EVERY, FS_BLOCKED, FS_NOW, IP_CAD_END,
                         IP_GPUS_PER_NODE, IP_K, IP_MU, IP_N, IP_PER_EPOCH, IP_SHARD_LEN, IP_SPE, MF_SENT, MI_DST,
                         MI_ITER, MI_SRC, MI_SRC_VERSION, MI_STATE, NEED_POOL, NEED_ROWS, NEED_STALL, ST_FREE, ST_HEAP,
                         ST_NEED, ST_PEND_HEAD, ST_PEND_TAIL, WALK_RESUME, apply_row, draws_short, enter, grad_row,
                         mix_row, queue_begin, release, rows_short, send, start_compute)
from .fast_core import heap_pop, kernel
from .protocols import gossip_rules
from .protocols.gossip import iterations
from .trace import Trace

NEED_RING = 5  # this kernel's own status code
# this kernel's own parameters (int), ``gp``, indexed by these names only: blocking (0/1), phases, the rows
# one event may write (rows_short's margin)
GP_BLOCKING, GP_PHASES, GP_MARGIN = range(3)
GP_SIZE = 3


def covers(point: dict[str, Any]) -> str | None:
    """None when this engine simulates ``point`` exactly; otherwise why not (one phrase)."""
    return fast_nodes.covers(point, "dpsgd")


@kernel
def _kernel(ip: np.ndarray, gp: np.ndarray, fp: np.ndarray, st: np.ndarray, fst: np.ndarray,
            wdraw: np.ndarray, wpos: np.ndarray, wlen: np.ndarray, stall: np.ndarray, sdraw: np.ndarray,
            spos: np.ndarray, slen: np.ndarray, walk: np.ndarray,
            nb_ptr: np.ndarray, nb_idx: np.ndarray, nb_w: np.ndarray, nb_self: np.ndarray, send_idx: np.ndarray,
            links: np.ndarray, it: np.ndarray, t_start: np.ndarray, t_ready: np.ndarray, computed: np.ndarray,
            gop: np.ndarray, version: np.ndarray, ev_k: np.ndarray, ev_v: np.ndarray, pend: np.ndarray,
            pend_t: np.ndarray, inb_c: np.ndarray, inb_v: np.ndarray, inb_t: np.ndarray,
            m_i: np.ndarray, m_f: np.ndarray, free: np.ndarray, ht: np.ndarray, hk: np.ndarray, hs: np.ndarray,
            cols: tuple) -> int:
    """Run until done or until a buffer needs room (the returned status). ``ip``, ``fp``,
    ``st``, ``fst``, links, messages, columns: :mod:`.fast_nodes`; ``gp`` (``GP_*``): blocking
    (0/1), phases, the rows' margin. Node i's mixes at phase ph:
    ``nb_idx[nb_ptr[ph, i]:nb_ptr[ph, i + 1]]`` in the rules' order (coefs ``nb_w``, self_coefs
    ``nb_self``), ``send_idx`` the same slice in send order
    (:meth:`.protocols.gossip_rules.DPSGDRules.tables`). Inbox of node i, iteration k:
    ``inb_c[i, k % R]`` arrived, ``inb_v``/``inb_t`` [i, k % R, p] the version and send time of
    neighbour p's state.
    """
    n, mu, spe, K = ip[IP_N], ip[IP_MU], ip[IP_SPE], ip[IP_K]
    shard_len, per_epoch, g, cad_end = ip[IP_SHARD_LEN], ip[IP_PER_EPOCH], ip[IP_GPUS_PER_NODE], ip[IP_CAD_END]
    blocking, phases, margin = gp[GP_BLOCKING], gp[GP_PHASES], gp[GP_MARGIN]
    every = fp[FP_EVERY]
    R = inb_c.shape[1]
    n_ops, n_inputs = cols[C_KIND].shape[0], cols[C_GRAD_OP].shape[0]  # the trace buffers' sizes (fixed in a call)
    while True:
        # DPSGDRun._begin of a node whose last iteration ended (the last thing its handler did)
        while st[ST_PEND_HEAD] < st[ST_PEND_TAIL]:
            i = pend[st[ST_PEND_HEAD] % n]
            if walk[i, WALK_RESUME] == 0.0:  # (1: a stall walk to resume; the rest is done)
                short = draws_short(i, wpos, wlen, stall, spos, slen, st)
                if short:
                    return short
                ph = it[i] % phases
                if blocking == 0 and st[ST_FREE] < nb_ptr[ph, i + 1] - nb_ptr[ph, i]:
                    st[ST_NEED] = i
                    return NEED_POOL
                t = pend_t[i]
                k = it[i]
                v = version[i]
                t_start[i] = t
                computed[i] = 0
                if blocking == 0:
                    for x in range(nb_ptr[ph, i], nb_ptr[ph, i + 1]):
                        send(st, fst, fp, i, send_idx[x], k, v, 0.0, t, n, g, links, m_i, m_f, free, ht, hk, hs)
                ev_k[i] = k
                ev_v[i] = v
            if not start_compute(i, pend_t[i], fst[FS_NOW], st, fst, fp, wdraw, wpos, stall, sdraw, spos, slen, walk,
                                 ht, hk, hs):
                st[ST_NEED] = i
                return NEED_STALL
            st[ST_PEND_HEAD] += 1
        if st[ST_HEAP] == 0:
            return DONE
        if rows_short(st, n_ops, n_inputs, margin):  # an event writes ≤ 3 + degree ops
            return NEED_ROWS
        slot = hs[0]
        if slot < n:  # a compute finishing: blocking gossip sends the stepped state now
            ph = ev_k[slot] % phases
            if blocking == 1 and st[ST_FREE] < nb_ptr[ph, slot + 1] - nb_ptr[ph, slot]:
                st[ST_NEED] = slot
                return NEED_POOL
        elif m_i[slot - n, MI_STATE] == DELIVER and m_i[slot - n, MI_ITER] - it[m_i[slot - n, MI_DST]] >= R:
            st[ST_NEED] = slot - n
            return NEED_RING
        now = ht[0]
        st[ST_HEAP] = heap_pop(ht, hk, hs, st[ST_HEAP])
        fst[FS_NOW] = now
        if slot < n:  # DPSGDRun._computed
            i = slot
            gop[i] = grad_row(st, cols, i, ev_k[i], ev_v[i], t_start[i], now, mu, spe, shard_len, per_epoch)
            computed[i] = 1
            t_ready[i] = now
            if blocking == 1:  # step first, then gossip the stepped state
                apply_row(st, fst, cols, i, gop[i], 0, now, version, mu, spe, every, cad_end)
                k = it[i]
                ph = k % phases
                for x in range(nb_ptr[ph, i], nb_ptr[ph, i + 1]):
                    send(st, fst, fp, i, send_idx[x], k, version[i], 0.0, now, n, g, links, m_i, m_f, free, ht, hk,
                         hs)
            _try_finish(i, now, K, phases, blocking, mu, spe, every, cad_end, st, fst, cols, nb_ptr, nb_idx, nb_w,
                        nb_self, it, t_ready, gop, version, inb_c, inb_v, inb_t, pend, pend_t)
            continue
        m = slot - n
        if m_i[m, MI_STATE] == ENTER:
            enter(st, m, now, n, links, m_i, m_f, ht, hk, hs)
            continue
        # DPSGDRun._arrive: into the inbox of (j, k), at the sender's place among j's neighbours
        j = m_i[m, MI_DST]
        k = m_i[m, MI_ITER]
        src = m_i[m, MI_SRC]
        ph = k % phases
        r = k % R
        for x in range(nb_ptr[ph, j], nb_ptr[ph, j + 1]):
            if nb_idx[x] == src:
                p = x - nb_ptr[ph, j]
                inb_v[j, r, p] = m_i[m, MI_SRC_VERSION]
                inb_t[j, r, p] = m_f[m, MF_SENT]
                break
        inb_c[j, r] += 1
        release(st, m, free)
        if it[j] == k and computed[j] == 1:
            _try_finish(j, now, K, phases, blocking, mu, spe, every, cad_end, st, fst, cols, nb_ptr, nb_idx, nb_w,
                        nb_self, it, t_ready, gop, version, inb_c, inb_v, inb_t, pend, pend_t)


@kernel
def _try_finish(i: int, now: float, K: int, phases: int, blocking: int, mu: int, spe: int, every: float, cad_end: int,
                st: np.ndarray, fst: np.ndarray, cols: tuple, nb_ptr: np.ndarray, nb_idx: np.ndarray,
                nb_w: np.ndarray, nb_self: np.ndarray, it: np.ndarray, t_ready: np.ndarray, gop: np.ndarray,
                version: np.ndarray, inb_c: np.ndarray, inb_v: np.ndarray, inb_t: np.ndarray, pend: np.ndarray,
                pend_t: np.ndarray) -> None:
    """DPSGDRun._try_finish: when every neighbour's state of this iteration is in, mix them (in
    the weights' order), step (overlap 1), and go on to the next iteration."""
    R = inb_c.shape[1]
    k = it[i]
    ph = k % phases
    r = k % R
    lo, hi = nb_ptr[ph, i], nb_ptr[ph, i + 1]
    if inb_c[i, r] < hi - lo:
        return
    inb_c[i, r] = 0
    for x in range(lo, hi):
        mix_row(st, cols, i, nb_idx[x], inb_v[i, r, x - lo], nb_w[x], nb_self[x], inb_t[i, r, x - lo], now,
                version, spe)
    if blocking == 0:
        apply_row(st, fst, cols, i, gop[i], 0, now, version, mu, spe, every, cad_end)
    fst[FS_BLOCKED] += now - t_ready[i]
    it[i] = k + 1
    if k + 1 < K:
        queue_begin(i, now, pend, pend_t, st)


def simulate_dpsgd_fast(point: dict[str, Any], keep_trace: bool = True
                        ) -> tuple[Trace | None, dict[str, Any], list[tuple[int, int]], list[tuple[float, float]],
                                   str]:
    """The SimPy engine's ``(trace, summary)`` of a covered D-PSGD point, with the staleness
    histogram, the evaluation schedule and the simulation's id (``keep_trace=False``: no trace)."""
    reason = covers(point)
    if reason is not None:
        raise ValueError(f"the fast D-PSGD engine does not cover this point: {reason}")
    cl = point["cluster"]
    n = cl["learners"]
    K = iterations(point)
    rules = gossip_rules.DPSGDRules.of_point(point)
    nb = rules.tables()
    nb_ptr = nb[0]
    phases = nb_ptr.shape[0]
    degree = int((nb_ptr[:, 1:] - nb_ptr[:, :-1]).max()) if n > 0 else 0
    per_phase = nb_ptr[:, n] - nb_ptr[:, 0]
    sends = int(per_phase.sum()) * (K // phases) + int(per_phase[:K % phases].sum())

    ring, size = _initial_sizes(n, degree)
    margin = 4 + degree
    run = fast_nodes.Run(point, K, size, 1 + 2 * n * K + sends, margin, keep_trace)
    gp = np.zeros(GP_SIZE, np.int64)
    gp[GP_BLOCKING], gp[GP_PHASES], gp[GP_MARGIN] = 1 if rules.blocking else 0, phases, margin
    it, version, gop = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64)
    computed, ev_k, ev_v = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
    t_start, t_ready = np.zeros(n), np.zeros(n)
    inb_c = np.zeros((n, ring), np.int64)
    inb_v, inb_t = np.zeros((n, ring, max(1, degree)), np.int64), np.zeros((n, ring, max(1, degree)))
    while True:
        ip, fp, st, fst, *draws = run.head()
        status = _kernel(ip, gp, fp, st, fst, *draws, *nb, run.links, it, t_start, t_ready, computed, gop, version,
                         ev_k, ev_v, run.pend, run.pend_t, inb_c, inb_v, inb_t, *run.pool.arrays(), run.cols)
        if status == DONE:
            break
        if run.grow(status):
            continue
        if status == NEED_RING:  # the inboxes of iterations it …
            inb_c, inb_v, inb_t = (fast_nodes.doubled_ring(a, it) for a in (inb_c, inb_v, inb_t))
        else:  # pragma: no cover - the kernel returns no other status
            raise RuntimeError(f"fast D-PSGD engine: unknown status {status}")
    return run.result(keep_trace)


def _initial_sizes(n: int, degree: int) -> tuple[int, int]:
    """The inbox ring's length and the message pool to start with (each grows when needed)."""
    return 4, max(16, 4 * n * max(1, degree))
