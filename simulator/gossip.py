"""The decentralized family on SimPy: AllReduce-SGD, D-PSGD, AD-PSGD and Stochastic Gradient Push.

``N`` nodes each hold a state ``(x_i, w_i)`` (trace versions 0, 1, …) and run
``K = ⌈epochs · samples_per_epoch / (N μ)⌉`` iterations of: compute a gradient on
their own minibatch, step, communicate. Three concerns are kept apart:

* **who talks to whom** — :mod:`.topology` (graphs per iteration);
* **with what weights** — :mod:`.mixing` (PushSum shares, symmetric averaging weights);
* **how bytes move** — :class:`Transport` here (each node's NIC out and NIC in are FIFO
  links; a message of ``B`` bytes holds the sender's NIC out for ``B/bandwidth``, starts
  arriving ``latency_s`` after it started leaving and holds the receiver's NIC in for
  ``B/bandwidth``: uncontended it is delivered ``latency_s + B/bandwidth`` after it is sent;
  several messages through one NIC queue up, which is where contention comes from).

Protocols and their trace encoding (docs/decentralized.md has the full write-up):

* ``allreduce`` (AR-SGD): every node computes a gradient on its own state (all equal);
  backward produces the gradient in buckets, each all-reduced when every node has it and
  the previous bucket's all-reduce is done (:mod:`.collectives`: ring, hierarchical,
  halving/doubling, recursive doubling; a straggler delays everyone); the NICs are charged
  for the bytes. Trace: the ``N`` grads; one apply on node 0 with all ``N`` gradients at
  weight ``1/N`` (a gradient may be applied only once, so node 0 stands for everyone);
  then on every other node a mix ``x_i ← 0·x_i + 1·x_0`` copying node 0's new version.
  Data layout ``global_slice``: a replay equals SGD with minibatch ``Nμ``.
* ``dpsgd`` (Lian et al. 2017) with the neighbours of :func:`.topology.symmetric_neighbors`.
  ``overlap`` 0 (default; the SGP reference code's blocking gossip): compute, step, send
  the stepped state, mix the neighbours' stepped states. Trace: grad on ``(i, v)``; apply
  (σ = 0); one mix per neighbour ``j`` (ascending) reading ``j``'s version at its send
  (first ``self_coef = W_ii, coef = W_ij``, then ``self_coef = 1``). ``overlap`` 1 (Lian et
  al.'s steps 1 and 2 in parallel): send ``x_i`` while computing the gradient at it; when
  both are there mix, then apply: ``x_i ← Σ_j W_ij x_j − γ g_i(x_i)``.
* ``adpsgd`` (Lian et al. 2018): odd nodes are active, even passive; every node computes
  without waiting for anyone. An active node, when it starts iteration ``k`` on version
  ``v``, sends its state to a random passive neighbour (:func:`.topology.adpsgd_candidates`,
  seeded); the passive node, on arrival, averages ``x_j ← ½x_j + ½x_i(v)`` and returns
  its pre-average state ``u``; on arrival the active node averages ``x_i ← ½x_i + ½x_j(u)``
  (its own state has not changed since ``v``: Σx is conserved exactly), then applies its
  gradient once it is computed. Passive nodes apply theirs to their latest state.
  σ = averaging mixes *by other nodes* that landed between the gradient's read and its
  apply (0 for active nodes).
* ``sgp`` (Assran et al. 2019, Alg. 1; ``overlap`` τ as their overlap SGP): iteration
  ``k`` of node ``i`` on version ``v``: grad on ``(i, v)`` at ``x/w``; apply (→ ``v+1``,
  σ = 0); send ``(x, w)/(d+1)`` of version ``v+1`` to its ``d`` out-peers (non-blocking);
  keep one share: mix ``(src = i, src_version = v+1, coef = 0, self_coef = 1/(d+1))``;
  then mix every received message of iteration ≤ k (``self_coef = 1``,
  ``coef = 1/(d_sender+1)``, ``src_version`` = the sender's version right after its
  apply, i.e. at send time). The node may start iteration ``k+1`` only when every
  message of iterations ≤ ``k − τ`` has arrived (τ = 0: a blocking receive of this
  iteration's messages, exactly Alg. 1); while blocked, and after its last iteration, it
  mixes messages as they arrive. So a message is mixed 0..τ iterations after it was sent.

Evals (node −1 = the average of the nodes' latest de-biased states, version −1): at
t = 0, every ``samples_per_epoch / evals_per_epoch`` samples applied, and at the end.

The rules above (graphs, weights, send order, SGP's boundary, AD-PSGD's picks) are
:mod:`.protocols.gossip_rules`'; the engines here add time and the network, the live nodes
(:mod:`ddlsim.backends.live_gossip`) add torch.distributed, and the fast engines read the
rules' tables and compile its functions.

Engine: no process or Resource per event; every state change is one :class:`.events.Wake`
on the SimPy heap (a compute finishing, a message entering a NIC in, a message
delivered; AllReduce has one event per round).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy
from simpy.core import NORMAL

from . import collectives
from .compute import learner_clocks
from .events import Wake
from .protocols import GLOBAL_SLICE, SHARD, GossipRecorder
from .protocols import gossip_rules as rules
from .protocols.gossip_rules import (AVERAGE_COEF, KEPT_COEF, RECEIVED_SELF_COEF, adpsgd_staleness, sgp_advance,
                                     sgp_may_advance, sgp_mix_at_boundary, sgp_mix_on_arrival)
from .protocols.gossip import run_figures, trace_header
from .resources import FifoServer
from .trace import Trace, TraceBuilder


class Transport:
    """How bytes move: FIFO NICs (out and in) per node, a link per GPU inside a node.

    Workers ``i`` and ``j`` share a node when ``i // g == j // g`` (``g`` = GPUs per node);
    their messages use the intra-node links (each worker's own, out and in), the others the
    nodes' NICs, which the node's workers share. Every message pays ``latency`` + the
    software ``overhead`` (a fixed cost, not occupying a link) and holds a link for
    ``bytes / bandwidth``. ``send`` reserves the sender's link out now; the message enters
    the receiver's link in ``latency + overhead`` after it started leaving (one event, so that
    in-link reservations are made in time order, as :class:`FifoServer` requires) and is
    delivered when the in-link is done with it (a second event calling ``deliver(wake)`` with
    ``wake.payload = payload``). With infinite bandwidth transfers are free and a message
    takes ``latency + overhead`` flat. Collectives (:meth:`collective`) hold every NIC.
    """

    def __init__(self, env: simpy.Environment, n: int, latency_s: float, bandwidth_Bps: float,
                 message_bytes: float, *, gpus_per_node: int = 1, overhead_s: float = 0.0,
                 intra_latency_s: float = 0.0, intra_bandwidth_Bps: float = math.inf) -> None:
        self.env = env
        self.n = n
        self.g = gpus_per_node
        self.lat = latency_s + overhead_s
        self.bw = bandwidth_Bps
        self.message_bytes = message_bytes
        self.tx = 0.0 if math.isinf(bandwidth_Bps) else message_bytes / bandwidth_Bps
        nodes = n // gpus_per_node
        self.nic_out = [FifoServer(f"node{i}.out") for i in range(nodes)]
        self.nic_in = [FifoServer(f"node{i}.in") for i in range(nodes)]
        if gpus_per_node > 1:
            self.intra_lat = intra_latency_s + overhead_s
            self.intra_tx = 0.0 if math.isinf(intra_bandwidth_Bps) else message_bytes / intra_bandwidth_Bps
            self.intra_out = [FifoServer(f"gpu{i}.out") for i in range(n)]
            self.intra_in = [FifoServer(f"gpu{i}.in") for i in range(n)]
        self.bytes_sent = 0.0
        self.messages = 0
        # SimPy's schedule, given a Wake in place of an event (its step reads only callbacks and _ok)
        self._schedule: Callable[[Wake, int, float], None] = env.schedule  # type: ignore[assignment]

    def send(self, src: int, dst: int, deliver: Callable[[Wake], None], payload: Any) -> None:
        """Send one message of ``message_bytes`` from worker ``src`` to worker ``dst`` now."""
        now = self.env.now
        self.messages += 1
        g = self.g
        if g > 1 and src // g == dst // g:
            out, inn, tx, lat = self.intra_out[src], self.intra_in[dst], self.intra_tx, self.intra_lat
        else:
            self.bytes_sent += self.message_bytes
            out, inn, tx, lat = self.nic_out[src // g], self.nic_in[dst // g], self.tx, self.lat
        if tx == 0.0:
            self._schedule(Wake(deliver, payload), NORMAL, lat)
            return
        leave_start = out.reserve(now, tx) - tx
        delay = leave_start + lat - now
        self._schedule(Wake(self._enter, (inn, tx, deliver, payload)), NORMAL, delay if delay > 0 else 0.0)

    def _enter(self, ev: Wake) -> None:
        inn, tx, deliver, payload = ev.payload
        now = self.env.now
        delay = inn.reserve(now, tx) - now
        self._schedule(Wake(deliver, payload), NORMAL, delay if delay > 0 else 0.0)

    def collective(self, start: float, busy: float, fixed: float, nic_bytes: float, messages: int) -> float:
        """A collective starting at ``start`` that holds every NIC ``busy`` seconds and adds
        ``fixed`` (per-step latencies, software costs, intra-node stages): its end."""
        self.bytes_sent += nic_bytes
        self.messages += messages
        end = start
        for out, inn in zip(self.nic_out, self.nic_in):
            e = max(out.reserve(start, busy), inn.reserve(start, busy))
            if e > end:
                end = e
        return end + fixed

    def utilization(self, horizon_s: float) -> tuple[float, float]:
        """Mean utilisation of the NICs in and out over ``[0, horizon_s]``."""
        return (float(np.mean([q.utilization(horizon_s) for q in self.nic_in])),
                float(np.mean([q.utilization(horizon_s) for q in self.nic_out])))


class GossipRun:
    """What every decentralized engine shares: sizes, clocks, the recorder and the figures.

    Ops are written through :class:`.protocols.GossipRecorder` (``self.rec``: the trace
    encoding and the eval cadence); the engines add time.
    """

    layout = SHARD
    # per node, kept by the engines that compute freely (D-PSGD, AD-PSGD; _gradient_ready)
    gop: list[int]
    t_start: list[float]
    t_ready: list[float]
    computed: list[bool]

    def __init__(self, point: dict[str, Any]) -> None:
        self.point = point
        cl, proto, wl, net = point["cluster"], point["protocol"], point["workload"], point["cluster"]["network"]
        self.rec = GossipRecorder(point)
        self.tb = self.rec.tb
        self.version = self.rec.version  # each node's latest version (the recorder keeps it)
        self.n = n = cl["learners"]
        self.mu = cl["minibatch"]
        self.K = self.rec.K
        self.topology = proto["topology"]
        self.peers = proto["peers"]
        self.overlap = proto["overlap"]
        self.env = simpy.Environment()
        self._schedule: Callable[[Wake, int, float], None] = self.env.schedule  # type: ignore[assignment]
        self.net = Transport(self.env, n, net["latency_s"], net["bandwidth_Bps"],
                             wl["param_count"] * net["bytes_per_param"], gpus_per_node=cl["gpus_per_node"],
                             overhead_s=net["overhead_s"], intra_latency_s=net["intra_latency_s"],
                             intra_bandwidth_Bps=net["intra_bandwidth_Bps"])
        self.clocks = learner_clocks(point, n)
        self.compute_s = 0.0
        self.blocked_s = 0.0
        self.delay_sum = 0
        self.delay_count = 0

    # -- helpers shared by the engines ---------------------------------------------------
    def _later(self, t: float, cb: Callable[[Wake], None], value: Any) -> None:
        delay = t - self.env.now
        self._schedule(Wake(cb, value), NORMAL, delay if delay > 0 else 0.0)

    def _compute(self, i: int, t: float) -> float:
        """Node ``i`` starts a minibatch at ``t``: when it finishes."""
        clock = self.clocks[i]
        work = clock.draws.next()
        self.compute_s += work
        return clock.finish(t, work)

    def _buckets_ready(self, t: float, produced: list[float]) -> tuple[list[float], list[float]]:
        """Every node starts a minibatch at ``t``: when each finishes, and when each bucket is
        ready (when the last node has produced it; ``produced``: the share of a minibatch's work
        done at each bucket). Without shares, one bucket, ready when the last node finishes."""
        if not produced:
            ready = [self._compute(i, t) for i in range(self.n)]
            return ready, [max(ready)]
        marks = []
        for clock in self.clocks:
            work = clock.draws.next()
            self.compute_s += work
            marks.append(clock.finish_many(t, [work * f for f in produced] + [work]))
        return [m[-1] for m in marks], [max(col) for col in zip(*marks)]

    def _gradient_ready(self, ev: Wake) -> tuple[int, float]:
        """Node ``i`` finished computing (payload ``(i, k, v)``): record the gradient, note it
        is ready to apply (D-PSGD, AD-PSGD); return ``(i, now)``."""
        i, k, v = ev.payload
        now = self.env.now
        self.gop[i] = self.rec.grad(i, k, v, self.t_start[i], now)
        self.computed[i] = True
        self.t_ready[i] = now
        return i, now

    def start(self) -> None:
        raise NotImplementedError

    def run(self) -> TraceBuilder:
        """Simulate to the end; the trace starts and ends with an eval of the nodes' average."""
        self.rec.begin()
        self.start()
        self.env.run()
        self.end_time = self.env.now
        self.rec.finish(self.end_time)
        return self.tb

    def stats(self) -> dict[str, Any]:
        """Runtime and communication figures of the finished run."""
        T = self.end_time
        link_in, link_out = self.net.utilization(T)
        return run_figures(self.n, self.K, T, self.rec.grads, self.rec.applies, self.compute_s, link_in, link_out,
                           self.net.bytes_sent, self.net.messages, self.blocked_s, self.delay_sum, self.delay_count)


class AllReduceRun(GossipRun):
    """AR-SGD: every node computes; gradient buckets are all-reduced as backward produces them
    (one event per iteration).

    Compute splits into forward and backward (``backward_fraction``); backward produces the
    buckets (:func:`.collectives.bucket_sizes`) in proportion to their bytes. The all-reduce of
    bucket b starts when every node has produced it and bucket b − 1's is done, and lasts
    :func:`.collectives.allreduce_time`; the iteration ends with the last bucket's, plus the
    optimizer step (``step_s``). One bucket (``bucket_bytes`` 0, or a model smaller than a
    bucket): compute, barrier, one all-reduce.
    """

    layout = GLOBAL_SLICE

    def start(self) -> None:
        cl, proto = self.point["cluster"], self.point["protocol"]
        sizes = collectives.bucket_sizes(self.net.message_bytes, proto["bucket_bytes"])
        self.collectives = collectives.bucket_plan(collectives.Fabric.of_cluster(cl), proto["allreduce_algorithm"],
                                                   sizes)
        # share of a minibatch's work done when each bucket is ready
        self.produced = collectives.produced_shares(sizes, cl["compute"]["backward_fraction"], sum(sizes))
        self.step_s = cl["compute"]["step_s"]
        self._round(0, 0.0)

    def _round(self, k: int, t: float) -> None:
        ready, bucket_ready = self._buckets_ready(t, self.produced)
        end = t
        collective = self.net.collective if self.n > 1 else None
        for (busy, fixed, nbytes, msgs), at in zip(self.collectives, bucket_ready):
            begin = at if at > end else end
            end = collective(begin, busy, fixed, nbytes, msgs) if collective else begin
        end += self.step_s
        self.blocked_s += sum(end - r for r in ready)
        self._later(end, self._done, (k, t, ready))

    def _done(self, ev: Wake) -> None:
        k, t0, ready = ev.payload
        now = self.env.now
        self.rec.allreduce_round(k, [t0] * self.n, ready, now)
        if k + 1 < self.K:
            self._round(k + 1, now)


class DPSGDRun(GossipRun):
    """D-PSGD (Lian et al. 2017): ``x_i ← Σ_j W_ij x_j`` with the neighbours of the symmetric
    graph, and the gradient step. Two schedules (``protocol.overlap``):

    * 0 (default), as facebookresearch/stochastic_gradient_push runs it (blocking gossip, no
      overlap): compute the gradient at ``x_i``, step, send the stepped state to the
      neighbours, wait for theirs, mix; the next iteration starts from the mixed state;
    * 1, as Lian et al. write it: send ``x_i`` to the neighbours while computing the gradient
      at it; when both are there, mix and step (``x ← Σ_j W_ij x_j − γ g(x_i)``).

    A node sends to its neighbours in order of distance ``(j − i) mod N`` (a symmetric
    schedule: on a circulant graph every node sends and receives alike).
    """

    def start(self) -> None:
        n = self.n
        self.rules = r = rules.DPSGDRules.of_point(self.point)
        self.phases, self.weights, self.send_order, self.blocking = r.phases, r.weights, r.send_order, r.blocking
        self.iter = [0] * n
        self.t_start = [0.0] * n
        self.t_ready = [0.0] * n
        self.computed = [False] * n
        self.gop = [-1] * n
        self.inbox: list[dict[int, dict[int, tuple[int, float]]]] = [{} for _ in range(n)]
        for i in range(n):
            self._begin(i, 0.0)

    def _send_state(self, i: int, k: int, t: float) -> None:
        v, send = self.version[i], self.net.send
        for j in self.send_order[k % self.phases][i]:
            send(i, j, self._arrive, (j, k, i, v, t))

    def _begin(self, i: int, t: float) -> None:
        k = self.iter[i]
        v = self.version[i]
        self.t_start[i] = t
        self.computed[i] = False
        if not self.blocking:
            self._send_state(i, k, t)
        self._later(self._compute(i, t), self._computed, (i, k, v))

    def _computed(self, ev: Wake) -> None:
        i, now = self._gradient_ready(ev)
        if self.blocking:  # step first, then gossip the stepped state
            self.rec.apply(i, self.gop[i], 0, now)
            self._send_state(i, self.iter[i], now)
        self._try_finish(i, now)

    def _arrive(self, ev: Wake) -> None:
        j, k, src, v, t_sent = ev.payload
        self.inbox[j].setdefault(k, {})[src] = (v, t_sent)
        if self.iter[j] == k and self.computed[j]:
            self._try_finish(j, self.env.now)

    def _try_finish(self, i: int, now: float) -> None:
        k = self.iter[i]
        plan = self.rules.plan[k % self.phases][i]
        got = self.inbox[i].get(k, {})
        if len(got) < len(plan):
            return
        self.inbox[i].pop(k, None)
        for j, wij, self_coef in plan:
            v, t_sent = got[j]
            self.rec.mix(i, j, v, wij, self_coef, t_sent, now)
        if not self.blocking:
            self.rec.apply(i, self.gop[i], 0, now)
        self.blocked_s += now - self.t_ready[i]
        self.iter[i] = k + 1
        if k + 1 < self.K:
            self._begin(i, now)


class ADPSGDRun(GossipRun):
    """AD-PSGD: compute freely; active nodes average pairwise with passive ones meanwhile."""

    def start(self) -> None:
        n = self.n
        self.rules = r = rules.ADPSGDRules.of_point(self.point, self.K)
        self.cands = r.cands
        self.active = [r.active(i) for i in range(n)]
        self.picks = r.picks.tolist()
        self.iter = [0] * n
        self.t_start = [0.0] * n
        self.t_ready = [0.0] * n
        self.read = [0] * n
        self.gop = [-1] * n
        self.computed = [False] * n
        self.averaged = [False] * n
        for i in range(n):
            self._begin(i, 0.0)

    def _begin(self, i: int, t: float) -> None:
        k, v = self.iter[i], self.version[i]
        self.t_start[i], self.read[i] = t, v
        self.computed[i] = False
        cands = self.cands[i]
        if cands:
            self.averaged[i] = False
            j = cands[self.picks[i][k]]
            self.net.send(i, j, self._request, (j, i, v, t))
        else:
            self.averaged[i] = True
        self._later(self._compute(i, t), self._computed, (i, k, v))

    def _request(self, ev: Wake) -> None:
        j, i, v, t_sent = ev.payload
        now = self.env.now
        u = self.version[j]
        self.rec.mix(j, i, v, AVERAGE_COEF, AVERAGE_COEF, t_sent, now)
        self.net.send(j, i, self._reply, (i, j, u, now))

    def _reply(self, ev: Wake) -> None:
        i, j, u, t_sent = ev.payload
        now = self.env.now
        self.rec.mix(i, j, u, AVERAGE_COEF, AVERAGE_COEF, t_sent, now)
        self.averaged[i] = True
        if self.computed[i]:
            self.blocked_s += now - self.t_ready[i]
            self._finish(i, now)

    def _computed(self, ev: Wake) -> None:
        i, now = self._gradient_ready(ev)
        if self.averaged[i]:
            self._finish(i, now)

    def _finish(self, i: int, now: float) -> None:
        self.rec.apply(i, self.gop[i], adpsgd_staleness(self.version[i], self.read[i], self.active[i]), now)
        k = self.iter[i] = self.iter[i] + 1
        if k < self.K:
            self._begin(i, now)


class SGPRun(GossipRun):
    """Stochastic Gradient Push with overlap τ (τ = 0: synchronous, blocking receive)."""

    def start(self) -> None:
        n = self.n
        self.rules = r = rules.SGPRules.of_point(self.point)
        self.tau, self.phases, self.outs, self.indeg, self.coefs = r.tau, r.phases, r.outs, r.indeg, r.coefs
        self.indeg_flat = [d for row in r.indeg for d in row]  # sgp_advance's form
        self.iter = [0] * n
        self.t_start = [0.0] * n
        self.held: list[list[tuple[int, int, int, float, float]]] = [[] for _ in range(n)]
        # arrivals per node and iteration (sgp_advance's ring, of K slots per node: never wrapped)
        self.arrived: list[int] = [0] * (n * self.K)
        self.complete = [-1] * n     # every message of iterations ≤ this has arrived
        self.blocked_at = [-1] * n   # boundary iteration the node waits at, or −1
        self.block_start = [0.0] * n
        self.done = [False] * n
        for i in range(n):
            self._begin(i, 0.0)

    def _begin(self, i: int, t: float) -> None:
        self.t_start[i] = t
        self._later(self._compute(i, t), self._computed, (i, self.iter[i], self.version[i]))

    def _computed(self, ev: Wake) -> None:
        i, k, v = ev.payload
        now = self.env.now
        gop = self.rec.grad(i, k, v, self.t_start[i], now)
        self.rec.apply(i, gop, 0, now)
        sent = v + 1
        ph = k % self.phases
        coef = self.coefs[ph][i]
        send, arrive = self.net.send, self._arrive
        for j in self.outs[ph][i]:
            send(i, j, arrive, (j, k, i, sent, coef, now))
        self.rec.mix(i, i, sent, KEPT_COEF, coef, now, now)  # keep one share
        # the boundary of iteration k: mix what arrived, then go on or wait
        held = self.held[i]
        if held:
            keep = []
            at_boundary = sgp_mix_at_boundary
            for msg in held:
                if at_boundary(msg[0], k):
                    self._mix_msg(i, msg, k, now)
                else:
                    keep.append(msg)
            self.held[i] = keep
        K = self.K
        c = self.complete[i] = sgp_advance(self.arrived, K, self.complete[i], K, self.indeg_flat, self.phases,
                                           self.n, i)
        if sgp_may_advance(c, k, self.tau):
            self._next(i, k, now)
        else:
            self.blocked_at[i] = k
            self.block_start[i] = now

    def _advance(self, j: int) -> int:
        """Move node ``j``'s "all messages of iterations ≤ c are in" mark as far as it goes."""
        c = self.complete[j] = sgp_advance(self.arrived, self.K, self.complete[j], self.K, self.indeg_flat,
                                           self.phases, self.n, j)
        return c

    def _mix_msg(self, i: int, msg: tuple[int, int, int, float, float], k_now: int, now: float) -> None:
        k_msg, src, src_version, coef, t_sent = msg
        self.rec.mix(i, src, src_version, coef, RECEIVED_SELF_COEF, t_sent, now)
        self.delay_sum += k_now - k_msg
        self.delay_count += 1

    def _next(self, i: int, k: int, now: float) -> None:
        if k + 1 < self.K:
            self.iter[i] = k + 1
            self._begin(i, now)
        else:
            self.done[i] = True
            self.blocked_at[i] = self.K - 1  # from now on, mix whatever arrives

    def _arrive(self, ev: Wake) -> None:
        j, k_msg, src, src_version, coef, t_sent = ev.payload
        now = self.env.now
        K = self.K
        self.arrived[j * K + k_msg] += 1
        c = self.complete[j] = sgp_advance(self.arrived, K, self.complete[j], K, self.indeg_flat, self.phases,
                                           self.n, j)
        kb = self.blocked_at[j]
        msg = (k_msg, src, src_version, coef, t_sent)
        if sgp_mix_on_arrival(k_msg, kb):  # waiting at a boundary (or finished): mix on arrival
            self._mix_msg(j, msg, kb, now)
            if not self.done[j] and sgp_may_advance(c, kb, self.tau):
                self.blocked_at[j] = -1
                self.blocked_s += now - self.block_start[j]
                self._next(j, kb, now)
        else:
            self.held[j].append(msg)


ENGINES: dict[str, type[GossipRun]] = {
    "allreduce": AllReduceRun,
    "dpsgd": DPSGDRun,
    "adpsgd": ADPSGDRun,
    "sgp": SGPRun,
}


def simulate_gossip(point: dict[str, Any]) -> tuple[Trace, dict[str, Any]]:
    """Run a decentralized protocol for a validated scenario point: ``(trace, summary)``."""
    name = point["protocol"]["name"]
    engine = ENGINES[name](point)
    builder = engine.run()
    return builder.build(trace_header(point, engine.layout)), engine.stats()
