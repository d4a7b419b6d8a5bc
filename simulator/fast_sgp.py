"""The fast engine of Stochastic Gradient Push: the SimPy engine's event loop compiled by numba,
byte-identical traces.

Covered: SGP with any overlap τ, topology and peers, network latency/bandwidth/overhead, GPUs
per node (intra-node links), persistent stragglers, any compute distribution — without
transient stalls (:func:`covers`; ``engine = "auto"`` then uses the SimPy engine).

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
same eval cadence. tests/test_fast_sgp.py holds the two byte for byte on a property grid; a
rule changes in :mod:`.gossip` first and here second.

Storage: events and messages live in arrays (a message pool with a free list); a node's
held messages, its count of arrived messages per iteration (a ring) and the draw buffers are
grown by the Python side when the kernel asks (a status code), so the kernel stops before it
changes anything and resumes where it stopped. The trace's length is known in advance
(3 rows per node-iteration, one mix per message, the evals), so its columns are allocated once.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import mixing, topology
from .compute import CHUNK, learner_clocks
from .fast_ps import _Buffers, _heap_pop, _heap_push, _reserve, numba
from .protocols import AVERAGE, EvalCadence, SHARD, header_for
from .protocols.gossip import iterations
from .trace import APPLY, EVAL, GRAD, MIX, Trace, blank_columns

# kernel status codes
DONE, NEED_WORK, NEED_POOL, NEED_HELD, NEED_RING = 0, 1, 2, 3, 4
# message states
ENTER, DELIVER = 0, 1


def covers(point: dict[str, Any]) -> str | None:
    """None when this engine simulates ``point`` exactly; otherwise why not (one phrase)."""
    if numba is None:
        return "numba is not installed"
    if point["protocol"]["name"] != "sgp":
        return "not sgp"
    s = point["cluster"]["stragglers"]
    if s["stall_rate_per_s"] > 0 and s["stall_mean_s"] > 0:
        return "transient stalls"
    return None


def _kernel(ip: np.ndarray, fp: np.ndarray, st: np.ndarray, fst: np.ndarray,
            wdraw: np.ndarray, wpos: np.ndarray, wlen: np.ndarray,
            out_ptr: np.ndarray, out_idx: np.ndarray, indeg: np.ndarray, coefs: np.ndarray,
            links: np.ndarray, it: np.ndarray, t_start: np.ndarray, version: np.ndarray, complete: np.ndarray,
            blocked_at: np.ndarray, block_start: np.ndarray, done: np.ndarray, ev_k: np.ndarray, ev_v: np.ndarray,
            pend: np.ndarray, pend_t: np.ndarray, held: np.ndarray, held_n: np.ndarray, arrived: np.ndarray,
            m_i: np.ndarray, m_f: np.ndarray, free: np.ndarray,
            ht: np.ndarray, hk: np.ndarray, hs: np.ndarray,
            kind: np.ndarray, node: np.ndarray, ver: np.ndarray, src_node: np.ndarray, src_version: np.ndarray,
            sample_start: np.ndarray, batch_size: np.ndarray, batch_index: np.ndarray, t0: np.ndarray,
            t1: np.ndarray, epoch: np.ndarray, coef: np.ndarray, self_coef: np.ndarray, in_start: np.ndarray,
            in_count: np.ndarray, in_grad: np.ndarray, in_weight: np.ndarray, in_stale: np.ndarray) -> int:
    """Run until done or until a buffer needs room (the returned status).

    ``ip``: n, mu, spe, K, tau, phases, g, nodes, shard_len, per_epoch, cadence end (samples).
    ``fp``: tx, lat, intra_tx, intra_lat, every, message_bytes.
    ``st``: n_ops, n_inputs, heap_n, counter, samples, grads, applies, messages, delay_sum,
    delay_count, need (the node or message short of room), last_kind, free_top, pend_head,
    pend_tail. ``fst``: next_eval, compute_s, blocked_s, bytes_sent, now (the last event's time).
    ``links``: FIFO rows (free_at, busy, wait, served, last_arrival): NICs out 0 … nodes−1, in
    nodes … 2·nodes−1, GPUs' intra-node links out 2·nodes …, in 2·nodes + n ….
    Heap slots: ``i < n`` node i's compute; ``n + m`` message m (its state in ``m_i[m, 5]``).
    Message fields ``m_i``: dst, k, src, src_version, link in row, state; ``m_f``: coef, t_sent, tx.
    """
    n, mu, spe, K, tau, phases, g, nodes = ip[0], ip[1], ip[2], ip[3], ip[4], ip[5], ip[6], ip[7]
    shard_len, per_epoch, cad_end = ip[8], ip[9], ip[10]
    tx, lat, itx, ilat, every, mbytes = fp[0], fp[1], fp[2], fp[3], fp[4], fp[5]
    R = arrived.shape[1]
    H = held.shape[1]
    while True:
        # a node that may start its next iteration does (SGPRun._begin): last thing its handler did
        while st[13] < st[14]:
            i = pend[st[13] % n]
            if wpos[i] >= wlen[i]:
                st[10] = i
                return NEED_WORK
            st[13] += 1
            t = pend_t[i]
            now = fst[4]
            t_start[i] = t
            work = wdraw[i, wpos[i]]
            wpos[i] += 1
            fst[1] += work
            end = t + work
            delay = end - now
            if delay < 0.0:
                delay = 0.0
            ev_k[i] = it[i]
            ev_v[i] = version[i]
            st[2] = _heap_push(ht, hk, hs, st[2], now + delay, st[3], i)
            st[3] += 1
        if st[2] == 0:
            return DONE
        slot = hs[0]
        if slot < n:  # a compute finishing: room for its messages first
            i = slot
            ph = ev_k[i] % phases
            d = out_ptr[ph, i + 1] - out_ptr[ph, i]
            if st[12] < d:
                st[10] = i
                return NEED_POOL
        else:
            m = slot - n
            if m_i[m, 5] == DELIVER:
                j = m_i[m, 0]
                if m_i[m, 1] - complete[j] >= R:
                    st[10] = m
                    return NEED_RING
                if held_n[j] >= H:
                    st[10] = j
                    return NEED_HELD
        now = ht[0]
        st[2] = _heap_pop(ht, hk, hs, st[2])
        fst[4] = now
        if slot < n:
            # SGPRun._computed
            i = slot
            k = ev_k[i]
            v = ev_v[i]
            # GossipRecorder.grad
            st[5] += 1
            ep = k // per_epoch
            r = st[0]
            kind[r] = GRAD
            node[r] = i
            src_node[r] = i
            src_version[r] = v
            sample_start[r] = ep * spe + i * shard_len + (k - ep * per_epoch) * mu
            batch_size[r] = mu
            batch_index[r] = k
            t0[r] = t_start[i]
            t1[r] = now
            epoch[r] = st[4] / spe
            gop = r
            st[0] = r + 1
            # GossipRecorder.apply (σ = 0)
            st[4] += mu
            st[6] += 1
            r = st[0]
            kind[r] = APPLY
            node[r] = i
            ver[r] = version[i]
            in_start[r] = st[1]
            in_count[r] = 1
            t0[r] = now
            t1[r] = now
            epoch[r] = st[4] / spe
            in_grad[st[1]] = gop
            in_weight[st[1]] = 1.0
            in_stale[st[1]] = 0
            st[1] += 1
            st[0] = r + 1
            st[11] = APPLY
            version[i] += 1
            _maybe_eval(st, fst, every, cad_end, spe, now, kind, node, ver, t0, t1, epoch)
            sent = v + 1
            ph = k % phases
            c = coefs[ph, i]
            for x in range(out_ptr[ph, i], out_ptr[ph, i + 1]):
                j = out_idx[x]
                # Transport.send
                st[7] += 1
                if g > 1 and i // g == j // g:
                    out_row, in_row, mtx, mlat = 2 * nodes + i, 2 * nodes + n + j, itx, ilat
                else:
                    fst[3] += mbytes
                    out_row, in_row, mtx, mlat = i // g, nodes + j // g, tx, lat
                st[12] -= 1
                m = free[st[12]]
                m_i[m, 0] = j
                m_i[m, 1] = k
                m_i[m, 2] = i
                m_i[m, 3] = sent
                m_i[m, 4] = in_row
                m_f[m, 0] = c
                m_f[m, 1] = now
                m_f[m, 2] = mtx
                if mtx == 0.0:
                    m_i[m, 5] = DELIVER
                    at = now + mlat
                else:
                    m_i[m, 5] = ENTER
                    leave_start = _reserve(links, out_row, now, mtx) - mtx
                    delay = leave_start + mlat - now
                    if delay < 0.0:
                        delay = 0.0
                    at = now + delay
                st[2] = _heap_push(ht, hk, hs, st[2], at, st[3], n + m)
                st[3] += 1
            # keep one share
            _mix(st, i, i, sent, 0.0, c, now, now, version, spe, kind, node, ver, src_node, src_version, t0, t1,
                 epoch, coef, self_coef)
            # the boundary of iteration k: mix what arrived of iterations ≤ k (in arrival order)
            keep = 0
            for y in range(held_n[i]):
                hm = held[i, y]
                if m_i[hm, 1] <= k:
                    _mix_msg(st, fst, i, hm, k, now, m_i, m_f, free, version, spe, kind, node, ver, src_node,
                             src_version, t0, t1, epoch, coef, self_coef)
                else:
                    held[i, keep] = hm
                    keep += 1
            held_n[i] = keep
            if _advance(i, K, phases, indeg, arrived, complete) >= k - tau:
                _next(i, k, now, K, it, done, blocked_at, pend, pend_t, st)
            else:
                blocked_at[i] = k
                block_start[i] = now
            continue
        m = slot - n
        if m_i[m, 5] == ENTER:  # Transport._enter
            delay = _reserve(links, m_i[m, 4], now, m_f[m, 2]) - now
            if delay < 0.0:
                delay = 0.0
            m_i[m, 5] = DELIVER
            st[2] = _heap_push(ht, hk, hs, st[2], now + delay, st[3], n + m)
            st[3] += 1
            continue
        # SGPRun._arrive
        j = m_i[m, 0]
        k_msg = m_i[m, 1]
        arrived[j, k_msg % R] += 1
        cc = _advance(j, K, phases, indeg, arrived, complete)
        kb = blocked_at[j]
        if kb >= k_msg:
            _mix_msg(st, fst, j, m, kb, now, m_i, m_f, free, version, spe, kind, node, ver, src_node, src_version,
                     t0, t1, epoch, coef, self_coef)
            if done[j] == 0 and cc >= kb - tau:
                blocked_at[j] = -1
                fst[2] += now - block_start[j]
                _next(j, kb, now, K, it, done, blocked_at, pend, pend_t, st)
        else:
            held[j, held_n[j]] = m
            held_n[j] += 1


def _advance(j: int, K: int, phases: int, indeg: np.ndarray, arrived: np.ndarray, complete: np.ndarray) -> int:
    """SGPRun._advance: move node j's "every message of iterations ≤ c is in" mark."""
    R = arrived.shape[1]
    c = complete[j]
    while c + 1 < K and arrived[j, (c + 1) % R] >= indeg[(c + 1) % phases, j]:
        arrived[j, (c + 1) % R] = 0
        c += 1
    complete[j] = c
    return c


def _next(i: int, k: int, now: float, K: int, it: np.ndarray, done: np.ndarray, blocked_at: np.ndarray,
          pend: np.ndarray, pend_t: np.ndarray, st: np.ndarray) -> None:
    """SGPRun._next: iteration k + 1 begins now (at the loop's top), or the node is done."""
    if k + 1 < K:
        it[i] = k + 1
        n = pend.shape[0]
        pend[st[14] % n] = i
        pend_t[i] = now
        st[14] += 1
    else:
        done[i] = 1
        blocked_at[i] = K - 1


def _mix(st: np.ndarray, i: int, src: int, sv: int, c: float, sc: float, ta: float, tb: float, version: np.ndarray,
         spe: int, kind: np.ndarray, node: np.ndarray, ver: np.ndarray, src_node: np.ndarray,
         src_version: np.ndarray, t0: np.ndarray, t1: np.ndarray, epoch: np.ndarray, coef: np.ndarray,
         self_coef: np.ndarray) -> None:
    """GossipRecorder.mix."""
    r = st[0]
    kind[r] = MIX
    node[r] = i
    ver[r] = version[i]
    src_node[r] = src
    src_version[r] = sv
    t0[r] = ta
    t1[r] = tb
    epoch[r] = st[4] / spe
    coef[r] = c
    self_coef[r] = sc
    st[0] = r + 1
    st[11] = MIX
    version[i] += 1


def _mix_msg(st: np.ndarray, fst: np.ndarray, i: int, m: int, k_now: int, now: float, m_i: np.ndarray,
             m_f: np.ndarray, free: np.ndarray, version: np.ndarray, spe: int, kind: np.ndarray, node: np.ndarray,
             ver: np.ndarray, src_node: np.ndarray, src_version: np.ndarray, t0: np.ndarray, t1: np.ndarray,
             epoch: np.ndarray, coef: np.ndarray, self_coef: np.ndarray) -> None:
    """SGPRun._mix_msg; message m's slot goes back to the pool."""
    _mix(st, i, m_i[m, 2], m_i[m, 3], m_f[m, 0], 1.0, m_f[m, 1], now, version, spe, kind, node, ver, src_node,
         src_version, t0, t1, epoch, coef, self_coef)
    st[8] += k_now - m_i[m, 1]
    st[9] += 1
    free[st[12]] = m
    st[12] += 1


def _maybe_eval(st: np.ndarray, fst: np.ndarray, every: float, cad_end: int, spe: int, t: float,
                kind: np.ndarray, node: np.ndarray, ver: np.ndarray, t0: np.ndarray, t1: np.ndarray,
                epoch: np.ndarray) -> None:
    """GossipRecorder._maybe_eval (EvalCadence.due with its end)."""
    samples = st[4]
    if samples < fst[0] - 1e-9 or samples >= cad_end:
        return
    while fst[0] <= samples + 1e-9:
        fst[0] += every
    r = st[0]
    kind[r] = EVAL
    node[r] = AVERAGE
    ver[r] = AVERAGE
    t0[r] = t
    t1[r] = t
    epoch[r] = samples / spe
    st[0] = r + 1
    st[11] = EVAL


if numba is not None:
    _jit = numba.njit(cache=True, nogil=True)
    _advance = _jit(_advance)
    _next = _jit(_next)
    _mix = _jit(_mix)
    _mix_msg = _jit(_mix_msg)
    _maybe_eval = _jit(_maybe_eval)
    _kernel = _jit(_kernel)


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
    cl, proto, wl, net = point["cluster"], point["protocol"], point["workload"], point["cluster"]["network"]
    n, mu, spe, g = cl["learners"], cl["minibatch"], wl["samples_per_epoch"], cl["gpus_per_node"]
    K = iterations(point)
    tau = proto["overlap"]
    phases = topology.period(proto["topology"], n, proto["peers"])
    tables = [topology.peer_table(proto["topology"], ph, n, proto["peers"]) for ph in range(phases)]
    out_ptr = np.zeros((phases, n + 1), np.int64)
    flat: list[int] = []
    for ph, (outs, _) in enumerate(tables):
        for i in range(n):
            out_ptr[ph, i] = len(flat)
            flat.extend(outs[i])
        out_ptr[ph, n] = len(flat)
    out_idx = np.array(flat, np.int64)
    indeg = np.array([[len(ins) for ins in t[1]] for t in tables], np.int64)
    coefs = np.array([[mixing.share(len(o)) for o in t[0]] for t in tables])
    per_phase = out_ptr[:, n] - out_ptr[:, 0]  # messages sent in an iteration of each phase
    sends = int(per_phase.sum()) * (K // phases) + int(per_phase[:K % phases].sum())

    nodes = n // g
    bw, ibw = net["bandwidth_Bps"], net["intra_bandwidth_Bps"]
    mbytes = wl["param_count"] * net["bytes_per_param"]
    cad = EvalCadence(spe, wl["evals_per_epoch"], end=K * n * mu)
    ip = np.array([n, mu, spe, K, tau, phases, g, nodes, max(1, spe // n), max(1, max(1, spe // n) // mu),
                   K * n * mu], np.int64)
    fp = np.array([0.0 if math.isinf(bw) else mbytes / bw, net["latency_s"] + net["overhead_s"],
                   0.0 if math.isinf(ibw) else mbytes / ibw, net["intra_latency_s"] + net["overhead_s"],
                   cad.every, mbytes])
    st = np.zeros(15, np.int64)
    fst = np.array([cad.next, 0.0, 0.0, 0.0, 0.0])
    clocks = learner_clocks(point, n)
    work = _Buffers(n, min(K, 4 * CHUNK))   # the rest as the kernel asks (NEED_WORK)
    for i, clock in enumerate(clocks):
        work.grow_row(i, np.asarray(clock.draws._fn(work.data.shape[1]), dtype=np.float64))
    links = np.zeros((2 * nodes + (2 * n if g > 1 else 0), 5))
    it, version, complete = np.zeros(n, np.int64), np.zeros(n, np.int64), np.full(n, -1, np.int64)
    blocked_at, done = np.full(n, -1, np.int64), np.zeros(n, np.int64)
    t_start, block_start = np.zeros(n), np.zeros(n)
    ev_k, ev_v = np.zeros(n, np.int64), np.zeros(n, np.int64)
    pend, pend_t = np.arange(n, dtype=np.int64), np.zeros(n)
    st[14] = n                                   # every node begins at t = 0
    held_w, ring, pool = _initial_sizes(n, tau, int(indeg.max()))
    held, held_n = np.zeros((n, held_w), np.int64), np.zeros(n, np.int64)
    arrived = np.zeros((n, ring), np.int64)
    m_i, m_f = np.zeros((pool, 6), np.int64), np.zeros((pool, 3))
    free = np.arange(pool - 1, -1, -1, dtype=np.int64)
    st[12] = pool
    ht, hk, hs = np.zeros(n + pool + 1), np.zeros(n + pool + 1, np.int64), np.zeros(n + pool + 1, np.int64)
    evals_max = int(K * n * mu / cad.every) + 3
    ops, inputs = blank_columns(1 + 3 * n * K + sends + evals_max, n * K)
    cols = (ops["kind"], ops["node"], ops["version"], ops["src_node"], ops["src_version"], ops["sample_start"],
            ops["batch_size"], ops["batch_index"], ops["t_start"], ops["t_end"], ops["epoch"], ops["coef"],
            ops["self_coef"], ops["in_start"], ops["in_count"], inputs["grad_op"], inputs["weight"],
            inputs["staleness"])
    # GossipRecorder.begin
    ops["kind"][0], ops["node"][0], ops["version"][0] = EVAL, AVERAGE, AVERAGE
    st[0], st[11] = 1, EVAL
    while True:
        status = _kernel(ip, fp, st, fst, work.data, work.pos, work.len, out_ptr, out_idx, indeg, coefs, links, it,
                         t_start, version, complete, blocked_at, block_start, done, ev_k, ev_v, pend, pend_t, held,
                         held_n, arrived, m_i, m_f, free, ht, hk, hs, *cols)
        if status == DONE:
            break
        x = int(st[10])
        if status == NEED_WORK:
            work.grow_row(x, np.asarray(clocks[x].draws._fn(CHUNK), dtype=np.float64))
        elif status == NEED_HELD:
            held = np.concatenate([held, np.zeros_like(held)], axis=1)
        elif status == NEED_RING:  # counts of iterations complete+1 … re-placed in a ring twice as long
            R = arrived.shape[1]
            bigger = np.zeros((n, 2 * R), np.int64)
            for j in range(n):
                for c in range(complete[j] + 1, complete[j] + 1 + R):
                    bigger[j, c % (2 * R)] = arrived[j, c % R]
            arrived = bigger
        elif status == NEED_POOL:
            P = m_i.shape[0]
            m_i = np.concatenate([m_i, np.zeros_like(m_i)])
            m_f = np.concatenate([m_f, np.zeros_like(m_f)])
            top = int(st[12])
            bigger = np.zeros(2 * P, np.int64)
            bigger[:top] = free[:top]
            bigger[top:top + P] = np.arange(P, 2 * P)
            free = bigger
            st[12] = top + P
            ht, hk, hs = (np.concatenate([h, np.zeros(P, h.dtype)]) for h in (ht, hk, hs))
        else:  # pragma: no cover - the kernel returns no other status
            raise RuntimeError(f"fast SGP engine: unknown status {status}")
    T = float(fst[4])
    # GossipRecorder.finish
    if st[11] != EVAL:
        r = int(st[0])
        ops["kind"][r], ops["node"][r], ops["version"][r] = EVAL, AVERAGE, AVERAGE
        ops["t_start"][r] = ops["t_end"][r] = T
        ops["epoch"][r] = int(st[4]) / spe
        st[0] += 1
    n_ops = int(st[0])
    ops = {k: v[:n_ops] for k, v in ops.items()}
    header = header_for(point, n, SHARD)
    header["iterations"] = K
    trace = Trace(header, ops, inputs) if keep_trace else None
    ev = ops["kind"] == EVAL
    schedule = list(zip(ops["t_end"][ev].tolist(), ops["epoch"][ev].tolist()))
    grads = int(st[5])
    nic = links[:2 * nodes]
    util = lambda rows: float(np.mean([min(1.0, q[1] / T) if T > 0 else 0.0 for q in rows]))  # noqa: E731
    summary = {
        "gradients": grads,
        "updates": int(st[6]),
        "iterations": K,
        "sim_time_s": T,
        "iteration_time_s": T / K,
        "gradients_per_s": grads / T if T > 0 else math.inf,
        "server_utilization": 0.0,
        "server_wait_mean_s": math.nan,
        "link_in_utilization": util(nic[nodes:]),
        "link_out_utilization": util(nic[:nodes]),
        "compute_utilization": float(fst[1]) / (n * T) if T > 0 else 0.0,
        "bytes_sent_per_node_per_iter": float(fst[3]) / (n * K),
        "messages": int(st[7]),
        "blocked_mean_s": float(fst[2]) / (n * K),
        "message_delay_mean_iters": int(st[8]) / int(st[9]) if st[9] else 0.0,
    }
    return trace, summary, [(0, grads)], schedule, header["run_id"]
