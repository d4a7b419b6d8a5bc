"""Library presets (``protocol.library``) and the parameter-server and input mechanisms.

Each mechanism is a transformation of the point into the parameters the engines already
have, made when the point is built (both engines stay in agreement):

* **framework cost** (``framework_s_per_param``): ``cluster.compute.base_s`` += parameters ×
  the figure (DDP's hooks and bucket copies, measured on one GPU with and without DDP);
* **compute slowed by concurrent communication** (``overlap_slowdown``): with N > 1 learners,
  ``base_s`` += the share × the minibatch's compute time (NCCL kernels share the GPU);
* **negotiation cycle** (``cycle_s``): ``cluster.compute.step_s`` += half a cycle (the last
  bucket waits for the next tick on average);
* **achievable intra-node bandwidth** (``intra_efficiency``): ``intra_bandwidth_Bps`` × the share
  (a nominal rate's; not where the GPU preset's link is a collective's measured rate, ``achieved``);
* **compute jitter** (``jitter_cv``): lognormal compute of that coefficient of variation, so a
  barrier waits for the slowest of N draws (the engines' own draws);
* **the bucket** (``bucket_bytes``): ``protocol.bucket_bytes``;
* **a ring that leaves the NVLink mesh** (``wide_ring_gpus``, ``wide_ring_bus_Bps``): with more
  than ``wide_ring_gpus`` GPUs per node, ``intra_bandwidth_Bps`` is at most ``wide_ring_bus_Bps``
  (NCCL 1's ring in device order on a DGX-1 steps from GPU 3 to 4 and 7 to 0, which no NVLink joins);
* **layer-wise pull** (``pull``): ``cluster.server.pull`` (the pull of the weights overlaps the
  forward pass, :mod:`..simulator.ps`; ``layerwise-random``: its pieces in a random order;
  ``layerwise-shared``: every piece in flight at once, sharing each link equally;
  ``replicated``: each piece pulled back after every learner's push of it is applied, during
  the backward, and the forward after the last piece);
* **GPU-host staging** (``staging = "host"``): a parameter-server message leaves GPU memory
  for a host buffer before the wire (and comes back the same way), one copy at the node's
  ``intra_bandwidth_Bps`` (PCIe) before the transfer: the network bandwidth β becomes
  1 / (1/β + 1/intra), the copy folded into each message's transfer time;
* **the servers' apply on the CPU** (``apply_bytes_per_param``): ``cluster.server.apply_s`` =
  the bytes the optimizer reads and writes per parameter × parameters / shards / the host's
  memory bandwidth (the GPU preset's ``host_memory_Bps``; a nominal peak, so a lower bound).

A figure only applies to a key the scenario does not set itself, and only with a library
named: a point of plain numbers is unchanged. Independently of the library:

* ``cluster.server.aggregation = "machine"`` (hardsync): the g GPUs of a machine all-reduce
  over the intra-node link, then push once. The simulated learners become the machines
  (minibatch g·μ, ``per_sample_s`` / g), the in-machine reduce and the weights' broadcast,
  3(g−1)/g · B / intra bandwidth + 2(g−1) intra latencies, added to ``base_s``;
* ``cluster.server.placement = "colocated"``: the S shards run on the M worker machines. A
  shard's NIC also carries its machine's own push and pull, less what stays local, so its
  bandwidth is × M / (M + S − 2); one machine and one shard: the loopback (below);
* an RPC stack (``rpc_efficiency``): the network bandwidth × the share; between processes of
  one machine the library's ``rpc_loopback_Bps``;
* ``cluster.input.samples_per_s``: a node feeds its g GPUs at most that many samples per
  second, so ``per_sample_s`` ≥ g / cap (first, before the library's figures).
"""

from __future__ import annotations

import functools
import math
import tomllib
from pathlib import Path
from typing import Any

from ..simulator.catalog import dataset_info, param_count
from ..simulator.compute import MAX_MINIBATCH
from ..simulator.protocols import is_ps
from .schema import ScenarioError, did_you_mean, set_dotted

LIBRARIES_FILE = Path(__file__).resolve().parent / "libraries.toml"
FIGURES = ("bucket_bytes", "intra_efficiency", "framework_s_per_param", "cycle_s", "overlap_slowdown", "jitter_cv",
           "rpc_efficiency", "rpc_loopback_Bps", "pull", "staging", "apply_bytes_per_param", "wide_ring_gpus",
           "wide_ring_bus_Bps")


@functools.lru_cache(maxsize=1)
def libraries() -> dict[str, dict[str, Any]]:
    """The parsed presets, by name."""
    return tomllib.loads(LIBRARIES_FILE.read_text(encoding="utf-8"))["library"]


def source_of(lib: dict[str, Any], figure: str) -> str:
    """The source key of a figure of a preset (``<figure>_source``, or the bucket's, …)."""
    base = figure
    for suffix in ("_s_per_param", "_Bps", "_bytes", "_s", "_cv"):
        base = base.removesuffix(suffix)
    for key in (f"{figure}_source", f"{base}_source"):
        if key in lib:
            return str(lib[key])
    return ""


def _params(point: dict[str, Any]) -> int:
    wl = point["workload"]
    if wl.get("param_count") is not None:
        return int(wl["param_count"])
    return param_count(wl["model"], dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"]))


def apply_library(point: dict[str, Any], explicit: frozenset[str], where: str, label: str = "",
                  host_memory_Bps: float | None = None, intra_achieved: bool = False) -> None:
    """Apply ``protocol.library``'s figures, the parameter-server placement and aggregation,
    and the input cap to the point, in place (module doc); unknown names are one line.
    ``host_memory_Bps``: the memory bandwidth of the machine hosting the GPUs (the GPU preset's),
    which a library's CPU apply reads and writes at; ``intra_achieved``: the intra-node rate is a
    collective's measured bus bandwidth (the GPU preset's link says so), which a library's
    ``intra_efficiency``, a share of a nominal rate, does not reduce again."""
    name = point["protocol"].get("library")
    lib: dict[str, Any] = {}
    if name is not None:
        libs = libraries()
        if name not in libs:
            raise ScenarioError(f"{where}: key 'protocol.library' = {name!r}{label}: not a library preset"
                                f"{did_you_mean(name, list(libs))} (one of {', '.join(libs)}; `ddlsim hardware` "
                                "lists them)")
        lib = libs[name]
        if (lib["family"] == "ps") != is_ps(point):
            kind = "a parameter-server" if lib["family"] == "ps" else "a collective (all-reduce, gossip)"
            raise ScenarioError(f"{where}: key 'protocol.library' = {name!r}{label}: {kind} library, and "
                                f"protocol.name = {point['protocol']['name']!r} is not of that family")
    cl, net, comp = point["cluster"], point["cluster"]["network"], point["cluster"]["compute"]

    def fill(key: str, value: Any) -> None:
        if key not in explicit:
            set_dotted(point, key, value)

    cap = cl["input"]["samples_per_s"]
    if cap is not None and not math.isinf(cap):
        comp["per_sample_s"] = max(comp["per_sample_s"], cl["gpus_per_node"] / cap)
    nbytes = None
    if lib:
        nbytes = _params(point) * net["bytes_per_param"]
        if "bucket_bytes" in lib:
            fill("protocol.bucket_bytes", int(lib["bucket_bytes"]))
        if "intra_efficiency" in lib and not intra_achieved:
            fill("cluster.network.intra_bandwidth_Bps", net["intra_bandwidth_Bps"] * float(lib["intra_efficiency"]))
        if "wide_ring_bus_Bps" in lib and cl["gpus_per_node"] > int(lib["wide_ring_gpus"]):
            fill("cluster.network.intra_bandwidth_Bps",
                 min(net["intra_bandwidth_Bps"], float(lib["wide_ring_bus_Bps"])))
        if "pull" in lib:
            fill("cluster.server.pull", str(lib["pull"]))
        if "framework_s_per_param" in lib:
            fill("cluster.compute.base_s", comp["base_s"] + float(lib["framework_s_per_param"]) * _params(point))
        if "overlap_slowdown" in lib and cl["learners"] > 1:
            work = comp["base_s"] + cl["minibatch"] * comp["per_sample_s"]
            fill("cluster.compute.base_s", comp["base_s"] + float(lib["overlap_slowdown"]) * work)
        if "cycle_s" in lib:
            fill("cluster.compute.step_s", comp["step_s"] + float(lib["cycle_s"]) / 2)
        if lib.get("jitter_cv", 0) > 0 and "cluster.compute.distribution" not in explicit \
                and "cluster.compute.cv" not in explicit:
            comp["distribution"] = "lognormal"
            comp["cv"] = float(lib["jitter_cv"])
    _server_mechanisms(point, explicit, lib, where, label, nbytes)
    if lib and is_ps(point):
        _host_mechanisms(point, explicit, lib, host_memory_Bps)


def _host_mechanisms(point: dict[str, Any], explicit: frozenset[str], lib: dict[str, Any],
                     host_memory_Bps: float | None) -> None:
    """The GPU-host copy of every message and the servers' apply on the CPU (module doc)."""
    net, srv = point["cluster"]["network"], point["cluster"]["server"]
    intra = net["intra_bandwidth_Bps"]
    if lib.get("staging") == "host" and "cluster.network.bandwidth_Bps" not in explicit and not math.isinf(intra):
        net["bandwidth_Bps"] = 1.0 / (1.0 / net["bandwidth_Bps"] + 1.0 / intra)
    if "apply_bytes_per_param" in lib and host_memory_Bps and "cluster.server.apply_s" not in explicit:
        srv["apply_s"] = float(lib["apply_bytes_per_param"]) * _params(point) / srv["shards"] / host_memory_Bps


def _server_mechanisms(point: dict[str, Any], explicit: frozenset[str], lib: dict[str, Any], where: str, label: str,
                       nbytes: float | None) -> None:
    """In-machine aggregation, co-located shards and the RPC stack (module doc)."""
    cl, net, comp, srv = point["cluster"], point["cluster"]["network"], point["cluster"]["compute"], \
        point["cluster"]["server"]
    ps = is_ps(point)
    if srv["aggregation"] == "machine":
        if point["protocol"]["name"] != "hardsync":
            raise ScenarioError(f"{where}: key 'cluster.server.aggregation' = 'machine'{label}: needs protocol.name = "
                                f"'hardsync' (a machine pushes the sum of its GPUs' gradients of one step), not "
                                f"{point['protocol']['name']!r}")
        g = cl["gpus_per_node"]
        if g > 1:
            mu = cl["minibatch"] * g
            if mu > MAX_MINIBATCH:
                raise ScenarioError(f"{where}: key 'cluster.server.aggregation' = 'machine'{label}: a machine's "
                                    f"minibatch {mu:,} (gpus_per_node × minibatch) is over {MAX_MINIBATCH:,}")
            if nbytes is None:
                nbytes = _params(point) * net["bytes_per_param"]
            bw = net["intra_bandwidth_Bps"]
            local = (0.0 if math.isinf(bw) else 3.0 * (g - 1) / g * nbytes / bw) + 2 * (g - 1) * net["intra_latency_s"]
            cl["learners"] //= g
            cl["minibatch"] = mu
            cl["gpus_per_node"] = 1
            comp["per_sample_s"] /= g
            comp["base_s"] += local
    if not ps:
        return
    machines = cl["learners"] // cl["gpus_per_node"]
    shards = srv["shards"]
    if srv["placement"] == "colocated":
        spread = machines + shards - 2
        if spread <= 0:  # one machine, one shard: every push and pull stays on the machine
            if "cluster.network.bandwidth_Bps" not in explicit:
                net["bandwidth_Bps"] = float(lib.get("rpc_loopback_Bps", math.inf))
            return
        if "cluster.network.bandwidth_Bps" not in explicit:
            net["bandwidth_Bps"] = net["bandwidth_Bps"] * machines / spread
    if "rpc_efficiency" in lib and "cluster.network.bandwidth_Bps" not in explicit:
        net["bandwidth_Bps"] = net["bandwidth_Bps"] * float(lib["rpc_efficiency"])


def _figure(value: Any) -> str:
    """A figure as the listings print it: a number in ``g`` format, a word as it is."""
    return value if isinstance(value, str) else f"{value:g}"


def listing() -> list[str]:
    """The presets in a few lines each (``ddlsim hardware``)."""
    lines = ["Libraries (protocol.library; each figure's source in docs/hardware.md):"]
    for key, lib in libraries().items():
        figures = [f"{f} {_figure(lib[f])} [{source_of(lib, f)}]" for f in FIGURES if f in lib]
        lines.append(f"  {key:10s} {lib['name']}")
        lines.append(f"             {', '.join(figures)}")
    return lines


def markdown() -> list[str]:
    """docs/hardware.md's table of the presets."""
    out = ["| library | name | family | figure | value | source |", "|---|---|---|---|---|---|"]
    for key, lib in libraries().items():
        for f in FIGURES:
            if f in lib:
                out.append(f"| `{key}` | {lib['name']} | {lib['family']} | {f} | {_figure(lib[f])} | "
                           f"{source_of(lib, f)} |")
    return out


__all__ = ["libraries", "apply_library", "listing", "markdown", "source_of"]
