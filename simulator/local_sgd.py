"""Local SGD, DiLoCo and compressed AllReduce-SGD in simulated time (docs/simulator.md).

The ops each run writes are :mod:`.protocols.local`'s; this engine supplies their times. No
event queue is needed: between two averagings the nodes never wait for each other, and every
collective starts after the previous one, so a plain loop visits them in time order (what
:class:`.resources.FifoServer`, under the :class:`.gossip.Transport` NICs, requires).

* An **all-reduce step** (local SGD's ``warmup_steps``; every step of ``allreduce`` with
  compression) is AllReduce-SGD's iteration: backward produces the gradient in buckets, each
  all-reduced once every node has it and the previous one is done, then the optimizer step.
  Under fp16/bf16 each bucket carries half the bytes; under PowerSGD the hook runs after
  backward, as one bucket: its three all-reduces (the uncompressed tensors, all P, all Q:
  :func:`.compression_bytes.allreduce_payloads`) one after the other, plus its compute.
* A **local step**: every node computes its minibatch and steps (``step_s``) on its own clock,
  no communication.
* An **averaging** (after every H local steps, and after the last step; with F fragments one
  fragment every H/F steps): a barrier (the last node's step), then the all-reduce of the
  model (or the fragment) as one message of its (compressed) bytes, plus the compression's
  compute; no overlap with compute.
* **Streaming DiLoCo with overlap** τ = ``protocol.overlap`` > 0 (Douillard et al. 2025; torchft's
  ``fragment_sync_delay``): a fragment's averaging starts once the last node has taken the step
  whose turn it is and runs (its compression compute with it) while the nodes take τ more
  steps; after the τ-th each node waits only for what is left of it, then takes the fragment's
  new value. A turn whose τ steps would reach the run's last step is averaged blocking, and the
  last step averages every fragment (blocking), so nothing is in flight at the end.

Compression's compute is counted in FLOPs (:func:`.compression_bytes.powersgd_flops`;
fp16/bf16: two element-wise passes, the cast and the cast back) at the device's rate implied
by the point's own compute model: a minibatch of μ samples costs ≈ 6·P·μ FLOPs (forward and
backward, Kaplan et al. 2020, §2.1), so one FLOP takes ``mean compute s / (6·P·μ)``.
"""

from __future__ import annotations

import math
from typing import Any

from . import collectives
from .catalog import dataset_info, param_shapes
from .compression_bytes import allreduce_payloads, compression_active, powersgd_flops
from .compute import mean_compute_s
from .gossip import GossipRun
from .protocols import GLOBAL_SLICE
from .protocols.gossip import trace_header
from .protocols.local import LocalRecorder, averaging_header, fragment_tensors, max_overlap
from .trace import Trace, TraceBuilder

FLOPS_PER_PARAM_SAMPLE = 6.0   # forward + backward of one sample, per parameter (Kaplan et al. 2020, §2.1)
CAST_FLOPS_PER_ELEMENT = 2.0   # fp16/bf16: cast to the half type and back


def model_shapes(point: dict[str, Any]) -> list[tuple[int, ...]] | None:
    """The parameter shapes of the point's model (None when ddlsim does not know them)."""
    wl = point["workload"]
    return param_shapes(wl["model"], dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"]))


class LocalRun(GossipRun):
    """One run of local SGD, DiLoCo or compressed AllReduce-SGD (module doc)."""

    layout = GLOBAL_SLICE

    def __init__(self, point: dict[str, Any]) -> None:
        super().__init__(point)
        self.rec = self.local = LocalRecorder(point)
        self.tb = self.rec.tb
        self.version = self.rec.version
        cl, proto = point["cluster"], point["protocol"]
        self.name = proto["name"]
        self.compression = proto["compression"]
        self.rank = proto["powersgd_rank"]
        self.ps_warmup = proto["powersgd_warmup"]
        self.H = proto["local_steps"]
        self.F = proto["fragments"]
        # streaming DiLoCo's τ: inner steps the averaging of a fragment overlaps (0: blocking)
        self.tau = proto["overlap"] if self.name == "diloco" else 0
        if self.tau > max_overlap(self.H, self.F):
            raise ValueError(f"protocol.overlap = {self.tau}: diloco overlaps at most H/F − 1 = "
                             f"{max_overlap(self.H, self.F)} inner steps (a fragment's averaging ends before "
                             "the next fragment's starts)")
        self.warmup = self.K if self.name == "allreduce" else (proto["warmup_steps"] if self.name == "local_sgd" else 0)
        self.fabric = collectives.Fabric.of_cluster(cl)
        self.algorithm = proto["allreduce_algorithm"]
        self.step_s = cl["compute"]["step_s"]
        self.bpp = cl["network"]["bytes_per_param"]
        P = point["workload"]["param_count"]
        shapes = model_shapes(point)
        # without known shapes (allowed for none/fp16/bf16 and F = 1): the model as one vector
        self.shapes: list[tuple[int, ...]] = shapes if shapes is not None else [(P,)]
        self.tensors = fragment_tensors([math.prod(s) for s in self.shapes], self.F) if shapes is not None else None
        self.frag_shapes = [[s for s, f in zip(self.shapes, self.tensors or [0] * len(self.shapes)) if f == p]
                            for p in range(self.F)]
        work = mean_compute_s(cl["compute"], self.mu)
        self.s_per_flop = work / (FLOPS_PER_PARAM_SAMPLE * P * self.mu) if P * self.mu > 0 else 0.0
        # averagings done (PowerSGD's warm-up counts them): of gradients (all-reduce steps), and of
        # each fragment's pseudo-gradients (averagings), each with its own PowerSGD state in the replay
        self.ar_steps = 0
        self.averagings = [0] * self.F
        self.compress_s = 0.0
        sizes = collectives.bucket_sizes(P * self.bpp, proto["bucket_bytes"])
        self.produced = collectives.produced_shares(sizes, cl["compute"]["backward_fraction"], sum(sizes))
        self.bucket_sizes = sizes

    # -- costs -----------------------------------------------------------------------------
    def _payloads(self, shapes: list[tuple[int, ...]], step: int) -> tuple[float, ...]:
        """Bytes per node of each all-reduce of one averaging of ``shapes`` at averaging ``step``."""
        comp = self.compression if compression_active(self.compression, step, self.ps_warmup) else "none"
        if comp in ("fp16", "bf16"):  # 2 bytes an element (no more than the parameters' own bytes)
            return (min(2.0, self.bpp) * sum(math.prod(s) for s in shapes),)
        # elements at cluster.network.bytes_per_param each (compression_bytes counts 4-byte floats)
        return tuple(b * self.bpp / 4.0 for b in allreduce_payloads(shapes, comp, self.rank))

    def _compress_flops(self, shapes: list[tuple[int, ...]], step: int) -> float:
        if not compression_active(self.compression, step, self.ps_warmup):
            return 0.0
        if self.compression == "powersgd":
            return float(powersgd_flops(shapes, self.rank))
        return CAST_FLOPS_PER_ELEMENT * sum(math.prod(s) for s in shapes)

    def _collective(self, begin: float, nbytes: float) -> float:
        """One all-reduce of ``nbytes`` per node starting at ``begin``: its end."""
        if self.n <= 1 or nbytes <= 0:
            return begin
        busy, fixed = collectives.allreduce_parts(self.fabric, self.algorithm, nbytes)
        return self.net.collective(begin, busy, fixed, collectives.nic_bytes(self.fabric, self.algorithm, nbytes),
                                   collectives.messages(self.fabric, self.algorithm))

    def _averaging_time(self, begin: float, shapes: list[tuple[int, ...]], step: int) -> float:
        """An averaging of ``shapes`` starting at ``begin`` (compression compute, then its all-reduces)."""
        c = self._compress_flops(shapes, step) * self.s_per_flop
        self.compress_s += c
        end = begin + c
        for nbytes in self._payloads(shapes, step):
            end = self._collective(end, nbytes)
        return end

    # -- the run ---------------------------------------------------------------------------
    def _allreduce_step(self, k: int, t: float) -> float:
        """All-reduce step ``k`` from ``t``: record it, return its end."""
        step = self.ar_steps
        self.ar_steps += 1
        powersgd = self.compression == "powersgd" and compression_active("powersgd", step, self.ps_warmup)
        # PowerSGD compresses the whole gradient after backward: one bucket
        ready, bucket_ready = self._buckets_ready(t, [] if powersgd else self.produced)
        if powersgd:
            end = self._averaging_time(bucket_ready[0], self.shapes, step)
            return self._close_step(k, t, ready, end)
        half = self.compression in ("fp16", "bf16")
        end = t
        sizes = self.bucket_sizes if len(bucket_ready) > 1 else [sum(self.bucket_sizes)]
        for nbytes, at in zip(sizes, bucket_ready):
            begin = at if at > end else end
            if half:
                c = CAST_FLOPS_PER_ELEMENT * nbytes / self.bpp * self.s_per_flop
                self.compress_s += c
                begin += c
            end = self._collective(begin, nbytes * min(2.0, self.bpp) / self.bpp if half else nbytes)
        return self._close_step(k, t, ready, end)

    def _close_step(self, k: int, t: float, ready: list[float], end: float) -> float:
        end += self.step_s
        self.blocked_s += sum(end - r for r in ready)
        self.local.allreduce_step(k, [t] * self.n, ready, end)
        return end

    def _fragments_at(self, last: bool, turn: int) -> list[int]:
        """The fragments a blocking averaging covers: all of the model (−1), every fragment at the
        end of the run, else the fragment whose turn it is."""
        if self.F == 1:
            return [-1]
        return list(range(self.F)) if last else [turn]

    def _average_blocking(self, clock: list[float], fragments: list[int]) -> float:
        """A barrier, then the averagings of ``fragments`` one after the other: their end."""
        begin = max(clock)
        end = begin
        for frag in fragments:
            shapes = self.shapes if frag < 0 else self.frag_shapes[frag]
            f = max(frag, 0)
            s0 = end
            end = self._averaging_time(end, shapes, self.averagings[f])
            self.averagings[f] += 1
            self.local.average(s0, end, frag)
        self.blocked_s += sum(end - c for c in clock)
        return end

    def run(self) -> TraceBuilder:
        """Simulate every step (module doc); the trace starts and ends with an eval of the average."""
        self.rec.begin()
        t = 0.0
        k = 0
        while k < min(self.warmup, self.K):
            t = self._allreduce_step(k, t)
            k += 1
        clock = [t] * self.n
        every = max(1, self.H // self.F)  # local steps between two averagings (of one fragment each)
        local, turn = 0, 0
        pending: tuple[int, int, float, int] | None = None  # overlapped: (fragment, holder, end, sync step)
        while k < self.K:
            starts, ends, applied = [], [], []
            for i in range(self.n):
                e = self._compute(i, clock[i])
                starts.append(clock[i])
                ends.append(e)
                applied.append(e + self.step_s)
                clock[i] = e + self.step_s
            self.local.local_step(k, starts, ends, applied)
            k += 1
            local += 1
            last = k == self.K
            if pending is not None and k == pending[3]:
                frag, holder, end, _ = pending
                pending = None
                done = [end if end > c else c for c in clock]
                self.blocked_s += sum(d - c for d, c in zip(done, clock))
                clock = done
                self.local.sync(frag, holder, done)
            if local % every == 0 or last:
                if self.tau and not last and k + self.tau < self.K:
                    frag = self._fragments_at(False, turn)[0]
                    turn = (turn + 1) % self.F
                    pending = self._prepare(clock, frag, k + self.tau)
                    continue
                fragments = self._fragments_at(last, turn)
                if not last and self.F > 1:
                    turn = (turn + 1) % self.F
                end = self._average_blocking(clock, fragments)
                clock = [end] * self.n
                t = end
        self.end_time = max([t] + clock)
        self.rec.finish(self.end_time)
        return self.tb

    def _prepare(self, clock: list[float], frag: int, sync_step: int) -> tuple[int, int, float, int]:
        """Start the overlapped averaging of ``frag`` once every node has its pseudo-gradient (the
        last node's step): the nodes go on computing; it is applied after local step ``sync_step``."""
        begin = max(clock)
        shapes = self.shapes if frag < 0 else self.frag_shapes[frag]
        f = max(frag, 0)
        end = self._averaging_time(begin, shapes, self.averagings[f])
        self.averagings[f] += 1
        holder = self.local.prepare(begin, end, frag)
        return frag, holder, end, sync_step


def simulate_local(point: dict[str, Any]) -> tuple[Trace, dict[str, Any]]:
    """Run local SGD, DiLoCo or a compressed all-reduce for a validated point: ``(trace, summary)``."""
    engine = LocalRun(point)
    builder = engine.run()
    header = trace_header(point, engine.layout)
    header["averaging"] = averaging_header(point, engine.tensors)
    return builder.build(header), engine.stats()


def covers(point: dict[str, Any]) -> bool:
    """This engine simulates ``point``: local SGD, DiLoCo, or AllReduce-SGD with compression."""
    proto = point["protocol"]
    return proto["name"] in ("local_sgd", "diloco") or (proto["name"] == "allreduce"
                                                        and proto["compression"] != "none")
