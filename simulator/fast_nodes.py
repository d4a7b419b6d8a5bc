"""What the decentralized fast kernels share (:mod:`.fast_sgp`, :mod:`.fast_dpsgd`): the
recorder's rows and the transport, transcribed from :class:`.protocols.GossipRecorder` and
:class:`.gossip.Transport`, and the Python side's buffers and figures.

One layout every one of them shares, its records indexed by the names below only: the
parameters ``ip`` (int, ``IP_*``: n, mu, samples per epoch, K, shard length, per epoch, GPUs
per node, the cadence's end in samples) and ``fp`` (float, ``FP_*``: tx, lat, intra-node tx
and lat, the eval interval, message bytes, the stalls' mean gap and mean length); the state
``st`` (int, ``ST_*``: ops and inputs written, heap size, schedule counter, samples applied,
grads, applies, messages, delay sum and count, the node or message a status needs, last op
kind, free message slots, pending begins head and tail) and ``fst`` (float, ``FS_*``: next
eval, compute seconds, blocked seconds, bytes sent, now). An engine's own parameters
(``gp``) are named in its module.
The trace columns travel as one tuple (:data:`COLUMNS` order, indexed by the ``C_*`` names).
Messages live in a pool (``m_i``, ``MI_*``: destination, iteration, source, source version,
link-in row, state; ``m_f``, ``MF_*``: coefficient, send time, transfer seconds) with a stack
of free slots; heap slot ``n + m`` is message ``m``. Links are FIFO rows (:mod:`.fast_core`'s
``FREE_AT`` … ``LAST_ARRIVAL``): the nodes' NICs out, then in, then (GPUs per node > 1) each
GPU's intra-node link out, then in. A node's ``walk`` row: ``WALK_RESUME`` (1: a stall walk
to resume), then :mod:`.fast_core`'s ``WALK_T``, ``WALK_LEFT``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .collectives import transfer_time
from .compute import CHUNK, learner_clocks
from .dataorder import ShardLayout
from .fast_core import (BUSY, DONE, FIFO_FIELDS, FLUSH_OPS, NEED_POOL, NEED_ROWS, NEED_STALL, NEED_WORK,  # noqa: F401 (DONE: the engines')
                        STALL_MARGIN, STALL_START, WALK_LEFT, WALK_T, Buffers, finish_work,
                        cadence_due, fold_rows, heap_push, kernel, make_room, numba, reserve, shard_start,
                        stall_state, walk_stalls)
from .protocols import AVERAGE, SHARD, EvalCadence, sim_id
from .protocols.gossip import run_figures, trace_header
from .trace import APPLY, EVAL, GRAD, MIX, Trace, blank_columns

ENTER, DELIVER = 0, 1                 # message states

# the kernels' parameters and state, one layout (the module doc): ``ip`` (parameters, int), ``fp``
# (parameters, float), ``st`` (state, int) and ``fst`` (state, float) are indexed by these names only
IP_N, IP_MU, IP_SPE, IP_K, IP_SHARD_LEN, IP_PER_EPOCH, IP_GPUS_PER_NODE, IP_CAD_END = range(8)
IP_SIZE = 8
FP_TX, FP_LAT, FP_INTRA_TX, FP_INTRA_LAT, FP_EVERY, FP_MSG_BYTES, FP_SCALE_GAP, FP_SCALE_LEN = range(8)
FP_SIZE = 8
(ST_N_OPS, ST_N_INPUTS, ST_HEAP, ST_COUNTER, ST_SAMPLES, ST_GRADS, ST_APPLIES, ST_MESSAGES, ST_DELAY_SUM,
 ST_DELAY_COUNT, ST_NEED, ST_LAST_KIND, ST_FREE, ST_PEND_HEAD, ST_PEND_TAIL) = range(15)
ST_SIZE = 15
FS_NEXT_EVAL, FS_COMPUTE, FS_BLOCKED, FS_BYTES, FS_NOW = range(5)
FS_SIZE = 5
# a message's fields, one layout (the pool's rows): ``m_i`` (int) and ``m_f`` (float) by these names only
MI_DST, MI_ITER, MI_SRC, MI_SRC_VERSION, MI_LINK_IN, MI_STATE = range(6)
MI_SIZE = 6
MF_COEF, MF_SENT, MF_TX = range(3)
MF_SIZE = 3
# a node's stall-walk row (start_compute): resume flag, then fast_core's WALK_T, WALK_LEFT
WALK_RESUME = 0
WALK_SIZE = WALK_LEFT + 1


def covers(point: dict[str, Any], protocol: str) -> str | None:
    """None when the fast engine of ``protocol`` simulates ``point`` exactly; else why not."""
    if numba is None:
        return "numba is not installed"
    if point["protocol"]["name"] != protocol:
        return f"not {protocol}"
    return None
COLUMNS = (("ops", "kind"), ("ops", "node"), ("ops", "version"), ("ops", "src_node"), ("ops", "src_version"),
           ("ops", "sample_start"), ("ops", "batch_size"), ("ops", "batch_index"), ("ops", "t_start"),
           ("ops", "t_end"), ("ops", "epoch"), ("ops", "coef"), ("ops", "self_coef"), ("ops", "in_start"),
           ("ops", "in_count"), ("inputs", "grad_op"), ("inputs", "weight"), ("inputs", "staleness"))
# the columns' places in the kernels' tuple (COLUMNS order), by these names only
(C_KIND, C_NODE, C_VERSION, C_SRC_NODE, C_SRC_VERSION, C_SAMPLE_START, C_BATCH_SIZE, C_BATCH_INDEX, C_T_START,
 C_T_END, C_EPOCH, C_COEF, C_SELF_COEF, C_IN_START, C_IN_COUNT, C_GRAD_OP, C_WEIGHT, C_STALENESS) = range(18)


@kernel
def grad_row(st: np.ndarray, cols: tuple, i: int, k: int, v: int, ta: float, tb: float, mu: int, spe: int,
             shard_len: int, per_epoch: int) -> int:
    """GossipRecorder.grad: node i's k-th minibatch (its shard) on its version v; the row."""
    st[ST_GRADS] += 1
    r = st[ST_N_OPS]
    cols[C_KIND][r] = GRAD
    cols[C_NODE][r] = i
    cols[C_SRC_NODE][r] = i
    cols[C_SRC_VERSION][r] = v
    cols[C_SAMPLE_START][r] = shard_start(k, i, mu, spe, shard_len, per_epoch)
    cols[C_BATCH_SIZE][r] = mu
    cols[C_BATCH_INDEX][r] = k
    cols[C_T_START][r] = ta
    cols[C_T_END][r] = tb
    cols[C_EPOCH][r] = st[ST_SAMPLES] / spe
    st[ST_N_OPS] = r + 1
    st[ST_LAST_KIND] = GRAD
    return r


@kernel
def apply_row(st: np.ndarray, fst: np.ndarray, cols: tuple, i: int, gop: int, stale: int, t: float,
              version: np.ndarray, mu: int, spe: int, every: float, cad_end: int) -> None:
    """GossipRecorder.apply: node i applies gradient ``gop``; then the eval cadence."""
    st[ST_SAMPLES] += mu
    st[ST_APPLIES] += 1
    r = st[ST_N_OPS]
    cols[C_KIND][r] = APPLY
    cols[C_NODE][r] = i
    cols[C_VERSION][r] = version[i]
    cols[C_IN_START][r] = st[ST_N_INPUTS]
    cols[C_IN_COUNT][r] = 1
    cols[C_T_START][r] = t
    cols[C_T_END][r] = t
    cols[C_EPOCH][r] = st[ST_SAMPLES] / spe
    cols[C_GRAD_OP][st[ST_N_INPUTS]] = gop
    cols[C_WEIGHT][st[ST_N_INPUTS]] = 1.0
    cols[C_STALENESS][st[ST_N_INPUTS]] = stale
    st[ST_N_INPUTS] += 1
    st[ST_N_OPS] = r + 1
    st[ST_LAST_KIND] = APPLY
    version[i] += 1
    samples = st[ST_SAMPLES]
    if not cadence_due(fst, FS_NEXT_EVAL, every, samples, cad_end):  # EvalCadence.due, with its end
        return
    r = st[ST_N_OPS]
    cols[C_KIND][r] = EVAL
    cols[C_NODE][r] = AVERAGE
    cols[C_VERSION][r] = AVERAGE
    cols[C_T_START][r] = t
    cols[C_T_END][r] = t
    cols[C_EPOCH][r] = samples / spe
    st[ST_N_OPS] = r + 1
    st[ST_LAST_KIND] = EVAL


@kernel
def mix_row(st: np.ndarray, cols: tuple, i: int, src: int, sv: int, c: float, sc: float, ta: float, tb: float,
            version: np.ndarray, spe: int) -> None:
    """GossipRecorder.mix: x_i ← sc·x_i + c·x_src(sv)."""
    r = st[ST_N_OPS]
    cols[C_KIND][r] = MIX
    cols[C_NODE][r] = i
    cols[C_VERSION][r] = version[i]
    cols[C_SRC_NODE][r] = src
    cols[C_SRC_VERSION][r] = sv
    cols[C_T_START][r] = ta
    cols[C_T_END][r] = tb
    cols[C_EPOCH][r] = st[ST_SAMPLES] / spe
    cols[C_COEF][r] = c
    cols[C_SELF_COEF][r] = sc
    st[ST_N_OPS] = r + 1
    st[ST_LAST_KIND] = MIX
    version[i] += 1


@kernel
def send(st: np.ndarray, fst: np.ndarray, fp: np.ndarray, i: int, j: int, k: int, sv: int, c: float, now: float,
         n: int, g: int, links: np.ndarray, m_i: np.ndarray, m_f: np.ndarray, free: np.ndarray, ht: np.ndarray,
         hk: np.ndarray, hs: np.ndarray) -> None:
    """Transport.send of one message from node i to node j now (a pool slot must be free)."""
    nodes = (links.shape[0] - (2 * n if g > 1 else 0)) // 2
    st[ST_MESSAGES] += 1
    if g > 1 and i // g == j // g:
        out_row, in_row, tx, lat = 2 * nodes + i, 2 * nodes + n + j, fp[FP_INTRA_TX], fp[FP_INTRA_LAT]
    else:
        fst[FS_BYTES] += fp[FP_MSG_BYTES]
        out_row, in_row, tx, lat = i // g, nodes + j // g, fp[FP_TX], fp[FP_LAT]
    st[ST_FREE] -= 1
    m = free[st[ST_FREE]]
    m_i[m, MI_DST] = j
    m_i[m, MI_ITER] = k
    m_i[m, MI_SRC] = i
    m_i[m, MI_SRC_VERSION] = sv
    m_i[m, MI_LINK_IN] = in_row
    m_f[m, MF_COEF] = c
    m_f[m, MF_SENT] = now
    m_f[m, MF_TX] = tx
    if tx == 0.0:
        m_i[m, MI_STATE] = DELIVER
        at = now + lat
    else:
        m_i[m, MI_STATE] = ENTER
        delay = reserve(links, out_row, now, tx) - tx + lat - now
        if not delay > 0.0:  # (as `delay if delay > 0 else 0.0`: NaN too)
            delay = 0.0
        at = now + delay
    st[ST_HEAP] = heap_push(ht, hk, hs, st[ST_HEAP], at, st[ST_COUNTER], n + m)
    st[ST_COUNTER] += 1


@kernel
def enter(st: np.ndarray, m: int, now: float, n: int, links: np.ndarray, m_i: np.ndarray, m_f: np.ndarray,
          ht: np.ndarray, hk: np.ndarray, hs: np.ndarray) -> None:
    """Transport._enter: message m enters its link in now; delivered when the link is done."""
    delay = reserve(links, m_i[m, MI_LINK_IN], now, m_f[m, MF_TX]) - now
    if not delay > 0.0:  # (as `delay if delay > 0 else 0.0`: NaN too)
        delay = 0.0
    m_i[m, MI_STATE] = DELIVER
    st[ST_HEAP] = heap_push(ht, hk, hs, st[ST_HEAP], now + delay, st[ST_COUNTER], n + m)
    st[ST_COUNTER] += 1


@kernel
def queue_begin(i: int, now: float, pend: np.ndarray, pend_t: np.ndarray, st: np.ndarray) -> None:
    """Node i begins its next iteration now: at the top of the kernel's loop (its handler
    schedules nothing after it, so the schedule order is SimPy's)."""
    pend[st[ST_PEND_TAIL] % pend.shape[0]] = i
    pend_t[i] = now
    st[ST_PEND_TAIL] += 1


@kernel
def draws_short(i: int, wpos: np.ndarray, wlen: np.ndarray, stall: np.ndarray, spos: np.ndarray,
                slen: np.ndarray, st: np.ndarray) -> int:
    """Before node i begins a minibatch: NEED_WORK or NEED_STALL when its draws run short (the
    node noted in ``st[ST_NEED]``), else 0."""
    if wpos[i] >= wlen[i]:
        st[ST_NEED] = i
        return NEED_WORK
    if stall[i, STALL_START] != math.inf and slen[i] - spos[i] < STALL_MARGIN:
        st[ST_NEED] = i
        return NEED_STALL
    return 0


@kernel
def start_compute(i: int, t: float, now: float, st: np.ndarray, fst: np.ndarray, fp: np.ndarray,
                  wdraw: np.ndarray, wpos: np.ndarray, stall: np.ndarray, sdraw: np.ndarray, spos: np.ndarray,
                  slen: np.ndarray, walk: np.ndarray, ht: np.ndarray, hk: np.ndarray, hs: np.ndarray) -> bool:
    """GossipRun._compute and ``_later``: node i computes its next minibatch from t, its stalls
    pausing the work (LearnerClock.finish); its compute event (slot i) at ``now + max(0, end −
    now)``. False when the stall draws ran out mid-walk: ``walk[i]`` keeps the walk
    (``WALK_RESUME`` 1, t and work left at ``WALK_T``, ``WALK_LEFT``) and the next call, after a
    refill, resumes it."""
    if walk[i, WALK_RESUME] == 1.0:
        end = walk_stalls(i, walk[i, WALK_T], walk[i, WALK_LEFT], stall, sdraw, spos, slen, fp[FP_SCALE_GAP],
                          fp[FP_SCALE_LEN], walk[i])
    else:
        work = wdraw[i, wpos[i]]
        wpos[i] += 1
        fst[FS_COMPUTE] += work
        end = finish_work(i, t, work, stall, sdraw, spos, slen, fp[FP_SCALE_GAP], fp[FP_SCALE_LEN], walk[i])
    if end < 0.0:
        walk[i, WALK_RESUME] = 1.0
        return False
    walk[i, WALK_RESUME] = 0.0
    delay = end - now
    if not delay > 0.0:  # (as `delay if delay > 0 else 0.0`: NaN too)
        delay = 0.0
    st[ST_HEAP] = heap_push(ht, hk, hs, st[ST_HEAP], now + delay, st[ST_COUNTER], i)
    st[ST_COUNTER] += 1
    return True


@kernel
def rows_short(st: np.ndarray, n_ops: int, n_inputs: int, margin: int) -> bool:
    """Before an event: True when trace buffers of ``n_ops`` ops and ``n_inputs`` inputs may lack
    room for what it writes (at most ``margin`` − 1 ops and one input, the run's final eval
    kept in reserve). (The kernel reads the sizes once per call: passing the columns' tuple
    to a compiled function per event costs a third of an SGP run.)"""
    return st[ST_N_OPS] + margin > n_ops or st[ST_N_INPUTS] + 2 > n_inputs


@kernel
def release(st: np.ndarray, m: int, free: np.ndarray) -> None:
    """Message m's slot goes back to the pool."""
    free[st[ST_FREE]] = m
    st[ST_FREE] += 1


# ---------------------------------------------------------------------------------------------
# the Python side

def doubled_ring(ring: np.ndarray, first: np.ndarray) -> np.ndarray:
    """A per-node ring of iterations (axis 1, entry k at k mod R) twice as long: node j's entries
    for iterations ``first[j]`` … ``first[j] + R − 1`` re-placed at k mod 2R."""
    R = ring.shape[1]
    bigger = np.zeros((ring.shape[0], 2 * R) + ring.shape[2:], ring.dtype)
    for j in range(ring.shape[0]):
        for k in range(int(first[j]), int(first[j]) + R):
            bigger[j, k % (2 * R)] = ring[j, k % R]
    return bigger


class Pool:
    """The message pool, its free stack and the event heap (n compute slots + the messages)."""

    def __init__(self, n: int, size: int) -> None:
        self.n = n
        self.m_i, self.m_f = np.zeros((size, MI_SIZE), np.int64), np.zeros((size, MF_SIZE))
        self.free = np.arange(size - 1, -1, -1, dtype=np.int64)
        self.ht, self.hk, self.hs = np.zeros(n + size + 1), np.zeros(n + size + 1, np.int64), \
            np.zeros(n + size + 1, np.int64)

    def grow(self, st: np.ndarray) -> None:
        """Twice the slots (the heap too); the new ones free."""
        P = self.m_i.shape[0]
        self.m_i = np.concatenate([self.m_i, np.zeros_like(self.m_i)])
        self.m_f = np.concatenate([self.m_f, np.zeros_like(self.m_f)])
        top = int(st[ST_FREE])
        bigger = np.zeros(2 * P, np.int64)
        bigger[:top] = self.free[:top]
        bigger[top:top + P] = np.arange(P, 2 * P)
        self.free = bigger
        st[ST_FREE] = top + P
        self.ht, self.hk, self.hs = (np.concatenate([h, np.zeros(P, h.dtype)]) for h in (self.ht, self.hk, self.hs))

    def arrays(self) -> tuple:
        return self.m_i, self.m_f, self.free, self.ht, self.hk, self.hs


class Run:
    """The Python side of one decentralized fast run: the kernel's parameters and state
    (:func:`kernel_params`), the links, the nodes' draw buffers (each node's own seeded
    stream), the pending begins (every node begins at t = 0), the message pool and the trace
    columns (``rows``: the run's ops but the evals, which are added; ``margin``: the most ops
    one event writes, plus one).

    With ``keep_trace`` the columns hold the whole run (grown if the kernel asks, NEED_ROWS);
    without, they hold at most ``FLUSH_OPS`` rows, which are folded into the staleness
    histogram and the evaluation schedule when the kernel asks for room, and reused: memory
    does not grow with the run."""

    def __init__(self, point: dict[str, Any], K: int, pool_size: int, rows: int, margin: int,
                 keep_trace: bool = True) -> None:
        self.point, self.K, self.keep = point, K, keep_trace
        n = self.n = point["cluster"]["learners"]
        self.ip, self.fp, self.st, self.fst, link_rows = kernel_params(point, K)
        self.links = np.zeros((link_rows, FIFO_FIELDS))
        self.clocks = learner_clocks(point, n)
        self.work = Buffers(n, min(K, 4 * CHUNK))  # the rest as the kernel asks (NEED_WORK)
        for i, clock in enumerate(self.clocks):
            self.work.grow_row(i, np.asarray(clock.draws._fn(self.work.data.shape[1]), dtype=np.float64))
        self.stall, self.stall_draws, scale_gap, scale_len = stall_state(point, self.clocks, CHUNK)
        self.fp[FP_SCALE_GAP], self.fp[FP_SCALE_LEN] = scale_gap, scale_len
        self.walk = np.zeros((n, WALK_SIZE))  # a minibatch's stall walk that ran out of draws (start_compute)
        self.pend, self.pend_t = np.arange(n, dtype=np.int64), np.zeros(n)
        self.st[ST_PEND_TAIL] = n
        self.pool = Pool(n, pool_size)
        self.st[ST_FREE] = pool_size
        evals = min(n * K, int(K * n * point["cluster"]["minibatch"] / self.fp[FP_EVERY])) + 3  # ≤ one per apply
        n_ops, n_inputs = rows + evals + margin, n * K + 2
        if not keep_trace:
            n_ops, n_inputs = min(n_ops, max(FLUSH_OPS, 2 * margin)), min(n_inputs, FLUSH_OPS)
        self.ops, self.inputs = trace_columns(n_ops, n_inputs)
        self.cols = columns_tuple(self.ops, self.inputs)
        self.st[ST_N_OPS], self.st[ST_LAST_KIND] = 1, EVAL
        self.hist: list[tuple[int, int]] = []      # folded rows (summary-only)
        self.evals: list[tuple[float, float]] = []

    def head(self) -> tuple:
        """The kernel's leading arguments: ip, fp, st, fst, the draw buffers, the stalls."""
        sd = self.stall_draws
        return (self.ip, self.fp, self.st, self.fst, self.work.data, self.work.pos, self.work.len, self.stall,
                sd.data, sd.pos, sd.len, self.walk)

    def grow(self, status: int) -> bool:
        """Give the kernel what a shared status asks for; False for another status."""
        x = int(self.st[ST_NEED])
        if status == NEED_WORK:
            self.work.grow_row(x, np.asarray(self.clocks[x].draws._fn(CHUNK), dtype=np.float64))
        elif status == NEED_POOL:
            self.pool.grow(self.st)
        elif status == NEED_STALL:
            self.stall_draws.grow_row(x, self.clocks[x]._rng.standard_exponential(4 * CHUNK))
        elif status == NEED_ROWS:
            self._rows()
        else:
            return False
        return True

    def _rows(self) -> None:
        """Room for the next event's rows: twice the columns (trace kept, or nothing left to
        fold), or the rows so far folded into the histogram and the schedule and the columns
        blank again from row 0 (the rows' numbers are only written, never read back: a grad
        op's number in its apply)."""
        n_ops, n_in = int(self.st[ST_N_OPS]), int(self.st[ST_N_INPUTS])
        self.ops, self.inputs, self.hist, folded = make_room(self.keep, self.ops, self.inputs, n_ops, n_in,
                                                             self.hist, self.evals)
        if not folded:
            self.cols = columns_tuple(self.ops, self.inputs)
            return
        blank_ops, blank_in = blank_columns(1, 1)
        for table, blank, used in ((self.ops, blank_ops, n_ops), (self.inputs, blank_in, n_in)):
            for k, v in table.items():
                v[:used] = blank[k][0]
        self.st[ST_N_OPS] = self.st[ST_N_INPUTS] = 0

    def result(self, keep_trace: bool) -> tuple[Any, dict[str, Any], list[tuple[int, int]],
                                                list[tuple[float, float]], str]:
        """What a fast engine returns: :func:`finish` of this run."""
        return finish(self.point, self.K, self.st, self.fst, self.links, self.ops, self.inputs,
                      keep_trace and self.keep, SHARD, self.hist, self.evals)


def kernel_params(point: dict[str, Any], K: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """``(ip, fp, st, fst, links rows)`` every decentralized kernel starts from (the ``IP_*``,
    ``FP_*``, ``ST_*``, ``FS_*`` layout; the stalls' ``FP_SCALE_GAP``, ``FP_SCALE_LEN`` set by
    :class:`Run`)."""
    cl, wl, net = point["cluster"], point["workload"], point["cluster"]["network"]
    n, mu, spe, g = cl["learners"], cl["minibatch"], wl["samples_per_epoch"], cl["gpus_per_node"]
    bw, ibw = net["bandwidth_Bps"], net["intra_bandwidth_Bps"]
    mbytes = wl["param_count"] * net["bytes_per_param"]
    cad = EvalCadence(spe, wl["evals_per_epoch"], end=K * n * mu)
    shards = ShardLayout(n, mu, spe)  # the data order's layout
    ip = np.zeros(IP_SIZE, np.int64)
    ip[IP_N], ip[IP_MU], ip[IP_SPE], ip[IP_K], ip[IP_GPUS_PER_NODE] = n, mu, spe, K, g
    ip[IP_SHARD_LEN], ip[IP_PER_EPOCH], ip[IP_CAD_END] = shards.shard, shards.per_epoch, K * n * mu
    fp = np.zeros(FP_SIZE)
    fp[FP_TX], fp[FP_LAT] = transfer_time(mbytes, bw), net["latency_s"] + net["overhead_s"]
    fp[FP_INTRA_TX], fp[FP_INTRA_LAT] = transfer_time(mbytes, ibw), net["intra_latency_s"] + net["overhead_s"]
    fp[FP_EVERY], fp[FP_MSG_BYTES] = cad.every, mbytes
    st = np.zeros(ST_SIZE, np.int64)
    fst = np.zeros(FS_SIZE)
    fst[FS_NEXT_EVAL] = cad.next
    return ip, fp, st, fst, 2 * (n // g) + (2 * n if g > 1 else 0)


def trace_columns(n_ops: int, n_inputs: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Blank columns; row 0 is the run's first eval (GossipRecorder.begin)."""
    ops, inputs = blank_columns(n_ops, n_inputs)
    ops["kind"][0], ops["node"][0], ops["version"][0] = EVAL, AVERAGE, AVERAGE
    return ops, inputs


def columns_tuple(ops: dict[str, np.ndarray], inputs: dict[str, np.ndarray]) -> tuple:
    """The kernel's tuple of the columns, in :data:`COLUMNS` order."""
    tables = {"ops": ops, "inputs": inputs}
    return tuple(tables[t][c] for t, c in COLUMNS)


def finish(point: dict[str, Any], K: int, st: np.ndarray, fst: np.ndarray, links: np.ndarray,
           ops: dict[str, np.ndarray], inputs: dict[str, np.ndarray], keep_trace: bool, layout: str,
           folded_hist: list[tuple[int, int]], folded_evals: list[tuple[float, float]]
           ) -> tuple[Any, dict[str, Any], list[tuple[int, int]], list[tuple[float, float]], str]:
    """GossipRecorder.finish (the final eval) and GossipRun.stats: what the fast engines return
    (``folded_*``: the histogram and schedule of rows already folded away, summary-only runs)."""
    cl, spe = point["cluster"], point["workload"]["samples_per_epoch"]
    n, g = cl["learners"], cl["gpus_per_node"]
    T = float(fst[FS_NOW])
    if st[ST_LAST_KIND] != EVAL:
        r = int(st[ST_N_OPS])
        ops["kind"][r], ops["node"][r], ops["version"][r] = EVAL, AVERAGE, AVERAGE
        ops["t_start"][r] = ops["t_end"][r] = T
        ops["epoch"][r] = int(st[ST_SAMPLES]) / spe
        st[ST_N_OPS] += 1
    n_ops = int(st[ST_N_OPS])
    ops = {k: v[:n_ops] for k, v in ops.items()}
    trace = Trace(trace_header(point, layout), ops, {k: v[:int(st[ST_N_INPUTS])] for k, v in inputs.items()}) \
        if keep_trace else None
    schedule = list(folded_evals)
    hist = fold_rows(folded_hist, schedule, ops, inputs, n_ops, int(st[ST_N_INPUTS]))
    nodes = n // g
    util = lambda rows: float(np.mean([min(1.0, q[BUSY] / T) if T > 0 else 0.0 for q in rows]))  # noqa: E731
    summary = run_figures(n, K, T, int(st[ST_GRADS]), int(st[ST_APPLIES]), float(fst[FS_COMPUTE]),
                          util(links[nodes:2 * nodes]), util(links[:nodes]), float(fst[FS_BYTES]),
                          int(st[ST_MESSAGES]), float(fst[FS_BLOCKED]), int(st[ST_DELAY_SUM]),
                          int(st[ST_DELAY_COUNT]))
    return trace, summary, hist, schedule, sim_id(point)
