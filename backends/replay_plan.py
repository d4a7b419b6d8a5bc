"""The replay's plan: what it needs to know about a trace before executing it (NumPy only).

Derived once per trace: when each weights version can be freed (after its last reader),
which gradients are computed at all (those an apply consumes), which are computed together,
each apply input's coefficient and each apply's learning rate (the staleness policy scales
the rate of the step: :func:`.optim.step_rates`). Two kinds of batch:

* **fused**: the inputs of one apply that all read the same weights — one version (a hardsync
  round), or versions :func:`equal_states` proves equal in value (an all-reduce round, each
  node's gradient on its own copy of the weights). Their combined gradient ``Σ_j c_j ∇ mean_j(ℓ)`` is
  ``∇ Σ_s a_s ℓ_s`` with ``a_s = c_j / μ_j`` for each sample ``s`` of gradient ``j``: one
  forward and backward over all their samples computes it (exact up to float rounding, also
  with unequal minibatches or weights), as a plain loop with minibatch λμ does;
* **rows**: later gradients whose versions already exist, same minibatch size, up to
  :func:`batch_rows` of them, one row each in a batched call (the stacked-versions batch).

:func:`batch_rows` is the rule that decides, once per replay from the model's size and
kernel and the device, whether row batches pay at all (docs/replay.md, "Which per-gradient
path").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..simulator.trace import APPLY, EVAL, GRAD, MIX, Trace, TraceError, check_replayable
from .base import BackendError
from .optim import Optimizer

BATCH_CAP = 64              # most gradients in one vmap call (and in one fused call)
LOOKAHEAD = 256             # grad ops scanned ahead for a batch
BATCH_BUDGET_FLOATS = 1 << 26  # stacked weights + gradients of one batch (256 MiB in fp32)
# On a CPU a row batch copies every version it reads into one (B, P) block and writes a
# (B, P) block of gradients: worth it only while those stay in cache. Measured against one
# gradient at a time (async traces, μ = 4, one thread; docs/replay.md "Which per-gradient
# path"): the hand-written MLP kernels break even near 8 rows of 65–130k parameters, vmap near
# 30 rows of 18k on an MLP-shaped model (both a 2–4 MiB block), and 90 rows of the digits MLP
# (3.4 MiB) cost twice as much per row as 30 (1.2 MiB); on rudra_cifar (90k) both paths run alike.
STACK_BUDGET_BYTES = 2 << 20
STACK_MIN_ROWS = 8          # fewer rows fit: gradients one at a time (row batches do not pay)

# a batch's kind (``Plan.kinds``)
ROWS = 0             # one row per gradient (stacked weights)
FUSED = 1            # one apply's gradients on one version (or equal ones): one call over all their samples
FUSED_IN_BUFFER = 2  # fused, and its apply comes before any other gradient is computed

# what the replay does at a grad op (``Plan.lead``; a value ≥ 0 is a batch index)
NOTHING = -1    # computed with an earlier op's batch, or never (no apply consumes it)
ALONE = -2      # computed alone, here
IN_BUFFER = -3  # computed alone, here, and left in the model's gradient buffer for its apply


def check_header(trace: Trace, name: str = "trace") -> None:
    """Refuse (:class:`BackendError`) a trace a replay cannot execute within bounded memory
    and time: :func:`~ddlsim.simulator.trace.check_replayable`, the one place of those bounds."""
    try:
        check_replayable(trace, name)
    except TraceError as e:
        raise BackendError(str(e)) from None


def capped(param_count: int, cap: int = BATCH_CAP) -> int:
    """Gradients per batched call: at most ``cap``, and within the memory budget."""
    return max(1, min(cap, BATCH_BUDGET_FLOATS // (2 * param_count)))


def batch_rows(param_count: int, elt_bytes: int, device_type: str, kernel: str, cap: int = BATCH_CAP) -> int:
    """Gradients per row batch, decided once per replay from the model and the device; 1 means
    gradients one at a time, because row batches would cost more than they save.

    On an accelerator (every small op a kernel launch) :func:`capped`. On a CPU the stacked
    weights of a batch must also fit ``STACK_BUDGET_BYTES``, and at least ``STACK_MIN_ROWS``
    must fit; else 1. ``kernel`` ("mlp": the hand-written kernels of :mod:`.mlp_batched`,
    "vmap") was measured to break even at the same block size, so it does not enter the rule.
    The rule never changes what is computed, only how many gradients share a call: results
    agree to float rounding either way."""
    rows = capped(param_count, cap)
    if device_type != "cpu":
        return rows
    fit = STACK_BUDGET_BYTES // max(1, param_count * elt_bytes)
    return min(rows, fit) if fit >= STACK_MIN_ROWS else 1


@dataclass
class Plan:
    """What the replay needs to know up front, derived from the trace with NumPy.

    States are numbered ``sid = offset[node] + version``. ``free_order`` lists state ids
    by the op after which they are freed (``free_count[i]`` of them after op ``i``); a
    node's latest version lives to the end. ``grads``: the consumed grad ops. Per op:
    ``lead`` is :data:`ALONE` for a gradient computed alone at its op, :data:`IN_BUFFER`
    for one computed alone whose apply (its only input) comes before any other gradient is
    computed (it stays in the model's gradient buffer, scaled in place), ``b ≥ 0`` for the
    op at which the multi-gradient batch ``batches[b]`` (grad op indices) is computed,
    :data:`NOTHING` otherwise;
    ``kinds[b]`` is batch ``b``'s kind (:data:`ROWS`, :data:`FUSED`, :data:`FUSED_IN_BUFFER`);
    ``sid`` the state a grad reads, ``interval`` the number of evals before it, ``coef``
    the coefficient applied when it is computed (1 unless it is its apply's only input or
    in a fused batch: then its apply coefficient);
    ``lr`` an apply's learning rate, staleness-aware. ``coefs``: the coefficient of every apply
    input (:func:`.optim.step_rates`: the averaging weight, re-weighted only by mixed
    per-gradient rates).
    """

    offset: np.ndarray
    free_order: np.ndarray
    free_count: np.ndarray
    grads: np.ndarray
    lead: np.ndarray
    batches: list[np.ndarray]
    sid: np.ndarray
    interval: np.ndarray
    coef: np.ndarray
    lr: np.ndarray
    coefs: np.ndarray
    evals: np.ndarray
    kinds: list[int]

    @property
    def calls(self) -> int:
        """Gradient computations: batched calls plus gradients computed alone."""
        return len(self.batches) + int((self.lead <= ALONE).sum())


def plan_trace(trace: Trace, opt: Optimizer, batched: bool, cap: int = BATCH_CAP,
               lookahead: int = LOOKAHEAD, fuse: bool | None = None) -> Plan:
    """Derive state lifetimes, gradient batches and apply coefficients from ``trace``.

    ``batched``: batches at all (else every gradient alone); ``cap``: gradients per row batch
    (1: none); ``fuse`` (default ``batched``): fused batches of the applies whose inputs all
    read one version or versions equal to it (:func:`equal_states`; at most ``BATCH_CAP``
    gradients each). A fused batch is computed at its first grad op, on the state that op reads."""
    ops, inp = trace.ops, trace.inputs
    kind, node, version = ops["kind"], ops["node"].astype(np.int64), ops["version"].astype(np.int64)
    src_node, src_ver = ops["src_node"].astype(np.int64), ops["src_version"].astype(np.int64)
    n, nodes = len(kind), int(trace.header["nodes"])
    mut = np.flatnonzero((kind == APPLY) | (kind == MIX))
    per_node = np.bincount(node[mut], minlength=nodes)
    offset = np.concatenate([[0], np.cumsum(per_node + 1)[:-1]]).astype(np.int64)
    n_states = int(per_node.sum() + nodes)
    created = np.full(n_states, -1, np.int64)
    created[offset[node[mut]] + version[mut] + 1] = mut
    last = np.full(n_states, -1, np.int64)
    last[offset[node[mut]] + version[mut]] = mut          # the mutation reads its state
    last[offset + per_node] = n                            # latest versions live to the end
    applies = np.flatnonzero(kind == APPLY)
    owner = np.repeat(applies, ops["in_count"][applies])
    consumer = np.full(n, -1, np.int64)
    consumer[inp["grad_op"]] = owner
    grads = np.flatnonzero((kind == GRAD) & (consumer >= 0))
    sid = np.full(n, -1, np.int64)
    sid[grads] = offset[src_node[grads]] + src_ver[grads]
    np.maximum.at(last, sid[grads], grads)
    mixes = np.flatnonzero(kind == MIX)
    np.maximum.at(last, offset[src_node[mixes]] + src_ver[mixes], mixes)
    evals = np.flatnonzero(kind == EVAL)
    ev_state = evals[node[evals] >= 0]
    np.maximum.at(last, offset[node[ev_state]] + version[ev_state], ev_state)

    lead = np.full(n, NOTHING, np.int64)
    lead[grads] = ALONE
    batches: list[np.ndarray] = []
    kinds: list[int] = []
    done = np.zeros(len(grads), bool)
    if batched if fuse is None else fuse:
        same = sid.copy()
        same[grads] = equal_states(ops, offset, n_states)[sid[grads]]
        for group in _fused_groups(ops, inp, applies, same):
            done[np.searchsorted(grads, group)] = True
            lead[group[1:]] = NOTHING
            lead[group[0]] = len(batches)
            batches.append(group)
            kinds.append(FUSED)
    if batched and cap > 1:
        ready, sizes = created[sid[grads]], ops["batch_size"][grads]
        for k in range(len(grads)):
            if done[k]:
                continue
            hi = min(len(grads), k + 1 + lookahead)
            ok = ~done[k + 1:hi] & (ready[k + 1:hi] < grads[k]) & (sizes[k + 1:hi] == sizes[k])
            more = k + 1 + np.flatnonzero(ok)[:cap - 1]
            done[k] = True
            if len(more):
                done[more] = True
                lead[grads[more]] = NOTHING
                lead[grads[k]] = len(batches)
                batches.append(grads[np.concatenate([[k], more])])
                kinds.append(ROWS)

    # the staleness policy scales the step's rate (optim.step_rates): coefs weigh the inputs
    coefs, base = opt.rates(inp["weight"], inp["staleness"], ops["in_count"][applies])
    # a gradient that is its apply's only input is scaled once, when it is computed
    single = np.repeat(ops["in_count"][applies] == 1, ops["in_count"][applies])
    # ... and, computed alone, stays in the gradient buffer if its apply comes first
    computed = grads[lead[grads] != NOTHING]
    alone = computed[lead[computed] == ALONE]
    nxt = np.append(computed, n)[np.searchsorted(computed, alone, side="right")]
    sole = np.zeros(n, bool)
    sole[inp["grad_op"][single]] = True
    lead[alone[sole[alone] & (consumer[alone] < nxt)]] = IN_BUFFER
    coef = np.ones(n)
    coef[inp["grad_op"][single]] = coefs[single]
    fused = [b for b, k in enumerate(kinds) if k == FUSED]
    if fused:
        # a fused batch weighs its samples by the apply coefficients of its gradients ...
        in_fused = np.concatenate([batches[b] for b in fused])
        position = np.empty(n, np.int64)
        position[inp["grad_op"]] = np.arange(len(inp["grad_op"]))
        coef[in_fused] = coefs[position[in_fused]]
        # ... and stays in the gradient buffer when it is its apply's only part and the apply
        # comes before the next gradient computation
        firsts = np.array([batches[b][0] for b in fused])
        after = np.append(computed, n)[np.searchsorted(computed, firsts, side="right")]
        whole = np.array([len(batches[b]) == ops["in_count"][consumer[batches[b][0]]] for b in fused])
        for b, keep in zip(fused, whole & (consumer[firsts] < after)):
            if keep:
                kinds[b] = FUSED_IN_BUFFER
    lr = np.zeros(n)
    lr[applies] = opt.lr(ops["epoch"][applies], base)
    interval = np.zeros(n, np.int64)
    interval[grads] = np.searchsorted(evals, grads)
    return Plan(offset, np.argsort(last, kind="stable"), np.bincount(last, minlength=n + 1)[:n], grads,
                lead, batches, sid, interval, coef, lr, coefs, evals, kinds)


def equal_states(ops: dict[str, np.ndarray], offset: np.ndarray, n_states: int) -> np.ndarray:
    """For every state id, the smallest id of a state its value (``x`` and ``w``) provably equals.

    The rule, read from the ops alone: every node's version 0 is the model's initial weights
    with ``w = 1`` (the replay starts every node there), so all of them equal node 0's; a mix
    of the whole model (``batch_index`` −1, not a fragment) with ``self_coef = 0`` and ``coef = 1``
    makes its new version ``0·x + x_src``, ``0·w + w_src``,
    which is ``(x_src, w_src)`` exactly in float arithmetic for finite ``x`` (the generic replay
    checks that the state a copy replaces is finite, and stops the run as diverged where it is
    not); equality is transitive, and a version never changes
    once created. Every other version (an apply's step, any other mix) is its own."""
    kind, node, version = ops["kind"], ops["node"].astype(np.int64), ops["version"].astype(np.int64)
    rep = np.arange(n_states, dtype=np.int64)
    rep[offset] = offset[0]
    copy = np.flatnonzero((kind == MIX) & (ops["self_coef"] == 0.0) & (ops["coef"] == 1.0) & (ops["batch_index"] < 0))
    rep[offset[node[copy]] + version[copy] + 1] = (offset[ops["src_node"][copy].astype(np.int64)]
                                                   + ops["src_version"][copy].astype(np.int64))
    while True:  # pointer jumping: each pass halves every chain of copies
        nxt = rep[rep]
        if np.array_equal(nxt, rep):
            return rep
        rep = nxt


def _fused_groups(ops: dict[str, np.ndarray], inp: dict[str, np.ndarray], applies: np.ndarray,
                  sid: np.ndarray) -> list[np.ndarray]:
    """The fused batches: for every apply of at least two inputs that all read one state
    (``sid``: a grad op's state, or the one it provably equals), its grad ops in trace order,
    in pieces of at most ``BATCH_CAP``."""
    counts = ops["in_count"][applies].astype(np.int64)
    multi = counts >= 2
    if not multi.any():
        return []
    starts, counts = ops["in_start"][applies][multi].astype(np.int64), counts[multi]
    seg = np.cumsum(counts) - counts
    pos = np.repeat(starts - seg, counts) + np.arange(int(counts.sum()))
    reads = sid[inp["grad_op"][pos]]
    one = np.minimum.reduceat(reads, seg) == np.maximum.reduceat(reads, seg)
    if not one.any():
        return []
    c = counts[one]
    g = inp["grad_op"][pos[np.repeat(one, counts)]].astype(np.int64)
    g = g[np.lexsort((g, np.repeat(np.arange(len(c)), c)))]  # each apply's grad ops in trace order
    groups = np.split(g, np.cumsum(c)[:-1])
    if c.max() <= BATCH_CAP:
        return groups
    return [grp[i:i + BATCH_CAP] for grp in groups for i in range(0, len(grp), BATCH_CAP)]
