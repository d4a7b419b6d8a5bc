"""AD-PSGD run for real over ``torch.distributed``, around the simulator's rules.

The rules are :class:`~ddlsim.simulator.protocols.gossip_rules.ADPSGDRules`': the active
nodes (those with candidates) and, per active node and iteration, the passive partner the
seeded picks name (the simulator's own picks); both sides of an averaging at
``AVERAGE_COEF`` = ½; σ by ``adpsgd_staleness``. Every node computes without waiting for
anyone:

* an **active** node ``i`` at iteration ``k`` on version ``v`` sends its state (a float64
  header ``[v, w]``, then ``x``) to its partner ``j = peer(i, k)``, posts the receive of the
  answer and computes its gradient at ``x(v)``; with the answer (``j``'s state before the
  averaging, version ``u``) in, it mixes ``x ← ½x + ½x_j(u)`` (its state is still ``v``: only
  its own averaging changes it), then applies its gradient (σ 0);
* a **passive** node computes and applies its gradients on its latest state (σ = the
  averagings by others since its gradient's read), while a server thread answers the
  requests (gloo's any-source ``recv``): under the node's lock it takes its state ``x_j(u)``,
  mixes ``x_j ← ½x_j + ½x_i(v)`` and sends ``x_j(u)`` back. The pair's averaging is atomic:
  both sides end at the same average, and Σx is conserved.

The active node records its averaging when it has waited for the answer, after its gradient;
the ops use :class:`~ddlsim.backends.live_gossip.Node`'s log, which the gossip merger writes
into the simulator's trace encoding.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from ..simulator.dataorder import shard_start
from ..simulator.protocols.gossip_rules import AVERAGE_COEF, ADPSGDRules, adpsgd_staleness

if TYPE_CHECKING:
    from .live_gossip import Node

REQUEST_HEADER, REQUEST_STATE, ANSWER_HEADER, ANSWER_STATE = 0, 1, 2, 3  # message tags


def _done(work: dist.Work | None) -> None:
    """Wait for a point-to-point request (``isend``/``irecv`` in the default group return one)."""
    assert work is not None
    work.wait()


def adpsgd(me: Node, K: int) -> None:
    """Node ``me.i``'s K iterations of AD-PSGD: active or passive as the rules say."""
    rules = ADPSGDRules.of_point(me.point, K)
    if rules.active(me.i):
        _active(me, K, rules)
    else:
        _passive(me, K, rules)


def _step(me: Node, g: torch.Tensor, k: int, read: int, active: bool) -> None:
    """Apply gradient ``g`` (read at version ``read``) to the node's latest state; σ by the rules."""
    epoch = (k + 1) * me.n * me.mu / me.spe  # the learning rate follows this node's own progress
    sigma = adpsgd_staleness(me.version, read, active)
    me.x = me.opt.step(me.i, me.x, g, me.opt.apply_rate(epoch, [1.0], [sigma])[1], me.w)
    me.log.append((time.monotonic(), "apply", me.version, epoch, sigma))
    me.version += 1


def _active(me: Node, K: int, rules: ADPSGDRules) -> None:
    i, half = me.i, AVERAGE_COEF
    for k in range(K):
        v, x_v = me.version, me.x  # me.x is replaced below, never written in place
        j = rules.peer(i, k)
        sends = [dist.isend(torch.tensor([v, me.w], dtype=torch.float64), j, tag=REQUEST_HEADER),
                 dist.isend(x_v, j, tag=REQUEST_STATE)]
        h, xj = torch.zeros(2, dtype=torch.float64), torch.zeros_like(x_v)
        answer = [dist.irecv(h, j, tag=ANSWER_HEADER), dist.irecv(xj, j, tag=ANSWER_STATE)]
        start = shard_start(k, i, me.n, me.mu, me.spe)
        g, t0, t1 = me.gradient(start)
        me.log.append((t1, "grad", i, v, start, k, t0))
        for r in answer:
            _done(r)
        me.x = torch.add(me.x * half, xj, alpha=half)  # = the replay's mix
        me.w = half * me.w + half * float(h[1])
        me.log.append((time.monotonic(), "mix", i, me.version, j, int(h[0]), half, half))
        me.version += 1
        _step(me, g, k, v, True)
        for r in sends:
            _done(r)


def _passive(me: Node, K: int, rules: ADPSGDRules) -> None:
    i, half = me.i, AVERAGE_COEF
    requests = sum(1 for a in range(me.n) if rules.active(a) for k in range(K) if rules.peer(a, k) == i)
    lock = threading.Lock()
    failed: list[BaseException] = []

    def answer() -> None:
        replies: list[dist.Work | None] = []
        try:
            for _ in range(requests):
                h = torch.zeros(2, dtype=torch.float64)
                src = dist.recv(h, None, tag=REQUEST_HEADER)
                xs = torch.zeros_like(me.x)
                dist.recv(xs, src, tag=REQUEST_STATE)
                with lock:
                    u, x_u, w_u = me.version, me.x, me.w
                    me.x = torch.add(x_u * half, xs, alpha=half)  # = the replay's mix
                    me.w = half * w_u + half * float(h[1])
                    me.log.append((time.monotonic(), "mix", i, u, src, int(h[0]), half, half))
                    me.version += 1
                replies.append(dist.isend(torch.tensor([u, w_u], dtype=torch.float64), src, tag=ANSWER_HEADER))
                replies.append(dist.isend(x_u, src, tag=ANSWER_STATE))
            for r in replies:
                _done(r)
        except BaseException as e:  # raised again by the node's own loop
            failed.append(e)

    server = threading.Thread(target=answer, name="adpsgd-answer", daemon=True)
    server.start()
    for k in range(K):
        with lock:
            v, state = me.version, (me.x, me.w)
        start = shard_start(k, i, me.n, me.mu, me.spe)
        g, t0, t1 = me.gradient(start, state)
        with lock:
            me.log.append((t1, "grad", i, v, start, k, t0))
            _step(me, g, k, v, False)
        if failed:
            raise failed[0]
    server.join()
    if failed:
        raise failed[0]
