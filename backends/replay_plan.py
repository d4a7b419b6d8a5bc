"""The replay's plan: what it needs to know about a trace before executing it (NumPy only).

Derived once per trace: when each weights version can be freed (after its last reader),
which gradients are computed at all (those an apply consumes), which are computed together
(a batch: later gradients whose versions already exist, same minibatch size, up to the
cap), each apply input's coefficient and each apply's learning rate (the staleness policy
scales the rate of the step: :func:`.optim.step_rates`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..simulator.trace import APPLY, EVAL, GRAD, MIX, Trace, TraceError, check_replayable
from .base import BackendError
from .optim import Optimizer

BATCH_CAP = 64              # most gradients in one vmap call
LOOKAHEAD = 256             # grad ops scanned ahead for a batch
BATCH_BUDGET_FLOATS = 1 << 26  # stacked weights + gradients of one batch (256 MiB in fp32)

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
    ``sid`` the state a grad reads, ``interval`` the number of evals before it, ``coef``
    the coefficient applied when it is computed (1 unless it is its apply's only input);
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

    @property
    def calls(self) -> int:
        """Gradient computations: batched calls plus gradients computed alone."""
        return len(self.batches) + int((self.lead <= ALONE).sum())


def plan_trace(trace: Trace, opt: Optimizer, batched: bool, cap: int = BATCH_CAP,
               lookahead: int = LOOKAHEAD) -> Plan:
    """Derive state lifetimes, gradient batches and apply coefficients from ``trace``."""
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
    if batched and cap > 1:
        ready, sizes = created[sid[grads]], ops["batch_size"][grads]
        done = np.zeros(len(grads), bool)
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
    lr = np.zeros(n)
    lr[applies] = opt.lr(ops["epoch"][applies], base)
    interval = np.zeros(n, np.int64)
    interval[grads] = np.searchsorted(evals, grads)
    return Plan(offset, np.argsort(last, kind="stable"), np.bincount(last, minlength=n + 1)[:n], grads,
                lead, batches, sid, interval, coef, lr, coefs, evals)
