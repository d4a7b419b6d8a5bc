"""The hardware catalogue (``hardware.toml``): GPUs, links and networks with published figures.

* ``cluster.gpu = "v100"`` (with ``cluster.precision``) sets ``cluster.compute`` to the GPU's
  published throughput for the point's model (``per_sample_s = 1 / throughput``, ``base_s
  = 0``, deterministic; the line through two published batch sizes where the source gives
  both) and the intra-node link to the GPU's (``intra_bandwidth_Bps``, ``intra_latency_s``);
  a GPU with a ``multi_gpu_slowdown`` (k80: calibrated, labelled so in its source) fills
  ``cluster.compute.multi_gpu_slowdown``;
* ``cluster.compute.multi_gpu_slowdown`` (the key, or the GPU preset's figure): whenever a node
  runs more than one GPU, ``base_s`` += the share × the minibatch's compute time, on the compute
  the point states or the preset gave (before the library's figures and the input cap);
* ``cluster.network.preset = "ib-edr"`` sets ``latency_s``, ``bandwidth_Bps`` and
  ``overhead_s``;
* ``protocol.library = "nccl"`` applies a library's figures (``libraries.toml``, :mod:`.libraries`).

A key the scenario sets itself (in the file, a sweep or ``--set``) wins over a preset.
``ddlsim hardware`` lists the catalogue; ``python -m ddlsim.scenarios.hardware`` prints
docs/hardware.md's tables.
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path
from typing import Any

from . import libraries
from .schema import ScenarioError, did_you_mean, set_dotted

CATALOGUE_FILE = Path(__file__).resolve().parent / "hardware.toml"
PRECISIONS = ("fp32", "mixed")


@functools.lru_cache(maxsize=1)
def catalogue() -> dict[str, Any]:
    """The parsed catalogue (``gpu``, ``intra``, ``network``, ``sources`` tables)."""
    return tomllib.loads(CATALOGUE_FILE.read_text(encoding="utf-8"))


def gpu_throughput(gpu: str, precision: str, model: str) -> dict[str, Any] | None:
    """The catalogue's entry ``{per_s, batch, source}`` for one GPU of ``gpu`` training
    ``model`` in ``precision``, or None when no published figure is catalogued."""
    return catalogue()["gpu"].get(gpu, {}).get(precision, {}).get(model)


def compute_model(entry: dict[str, Any]) -> tuple[float, float]:
    """``(per_sample_s, base_s)`` of a catalogue entry: the line through its two published
    (batch, seconds) points when it has a smaller batch's figure, else ``(1 / per_s, 0)``."""
    if "small_per_s" not in entry:
        return 1.0 / entry["per_s"], 0.0
    big, small = entry["batch"], entry["small_batch"]
    t_big, t_small = big / entry["per_s"], small / entry["small_per_s"]
    per_sample = (t_big - t_small) / (big - small)
    return per_sample, t_small - small * per_sample


def apply_presets(point: dict[str, Any], explicit: frozenset[str], where: str, label: str = "") -> None:
    """Fill the point's compute and network keys from its presets, in place (module doc);
    an unknown preset or a model without a published figure is one :class:`ScenarioError`."""
    cat = catalogue()
    cl = point["cluster"]

    def fill(key: str, value: Any) -> None:
        if key not in explicit:
            set_dotted(point, key, value)

    gpu = cl["gpu"]
    if gpu is not None:
        if gpu not in cat["gpu"]:
            raise ScenarioError(f"{where}: key 'cluster.gpu' = {gpu!r}{label}: not in the hardware catalogue"
                                f"{did_you_mean(gpu, list(cat['gpu']))} (one of {', '.join(cat['gpu'])}; "
                                "`ddlsim hardware` lists them)")
        model, precision = point["workload"]["model"], cl["precision"]
        entry = gpu_throughput(gpu, precision, model)
        if entry is None and "cluster.compute.per_sample_s" not in explicit:
            have = sorted(cat["gpu"][gpu].get(precision, {}))
            raise ScenarioError(
                f"{where}: key 'cluster.gpu' = {gpu!r}{label}: no published {precision} throughput for model {model!r} "
                f"in the hardware catalogue (it has: {', '.join(have) or 'none'}); set cluster.compute.per_sample_s "
                "(and cluster.compute.base_s) yourself")
        base = 0.0
        if entry is not None:
            per_sample, fixed = compute_model(entry)
            fill("cluster.compute.per_sample_s", per_sample)
            if "cluster.compute.per_sample_s" not in explicit:
                base = fixed
        fill("cluster.compute.base_s", base)
        fill("cluster.compute.distribution", "deterministic")
        if "multi_gpu_slowdown" in cat["gpu"][gpu] and cl["gpus_per_node"] > 1:
            fill("cluster.compute.multi_gpu_slowdown", float(cat["gpu"][gpu]["multi_gpu_slowdown"]))
        link = cat["intra"][cat["gpu"][gpu]["intra"]]
        fill("cluster.network.intra_bandwidth_Bps", float(link["bandwidth_Bps"]))
        fill("cluster.network.intra_latency_s", float(link["latency_s"]))
        achieved = bool(link.get("achieved", False))
    else:
        achieved = False
    comp = cl["compute"]
    if comp.get("multi_gpu_slowdown") and cl["gpus_per_node"] > 1:
        comp["base_s"] += comp["multi_gpu_slowdown"] * (comp["base_s"] + cl["minibatch"] * comp["per_sample_s"])
    preset = cl["network"]["preset"]
    if preset is not None:
        if preset not in cat["network"]:
            raise ScenarioError(f"{where}: key 'cluster.network.preset' = {preset!r}{label}: not in the hardware "
                                f"catalogue{did_you_mean(preset, list(cat['network']))} (one of "
                                f"{', '.join(cat['network'])})")
        net = cat["network"][preset]
        for key in ("latency_s", "bandwidth_Bps", "overhead_s"):
            fill(f"cluster.network.{key}", float(net[key]))
    host = cat["gpu"][gpu].get("host_memory_Bps") if gpu is not None else None
    libraries.apply_library(point, explicit, where, label, host_memory_Bps=None if host is None else float(host),
                            intra_achieved=achieved)


def listing() -> str:
    """The catalogue in a few lines per section (``ddlsim hardware``)."""
    cat = catalogue()
    lines = ["GPUs (cluster.gpu; images or sequences per second on one GPU, cluster.precision fp32 | mixed):"]
    for key, g in cat["gpu"].items():
        figures = [f"{p} {m} {e['per_s']:g}" for p in PRECISIONS for m, e in g.get(p, {}).items()]
        host = f"; host memory {g['host_memory_Bps'] / 1e9:g} GB/s" if "host_memory_Bps" in g else ""
        if "multi_gpu_slowdown" in g:
            host += (f"; {g['multi_gpu_slowdown']:.2%} slower with more than one per node (CALIBRATED) "
                     f"[{g['multi_gpu_source']}]")
        lines.append(f"  {key:12s} {g['name']}; intra-node {g['intra']}{host}")
        lines.append(f"               {', '.join(figures) if figures else 'no published per-GPU figure catalogued'}")
    lines.append("Networks (cluster.network.preset):")
    for key, n in cat["network"].items():
        lines.append(f"  {key:12s} {n['bandwidth_Bps'] / 1e9:7.3g} GB/s  latency {n['latency_s'] * 1e6:5.3g} µs  "
                     f"overhead {n['overhead_s'] * 1e6:5.3g} µs  {n['name']}")
    lines.append("Intra-node links (set by cluster.gpu):")
    for key, n in cat["intra"].items():
        lines.append(f"  {key:12s} {n['bandwidth_Bps'] / 1e9:7.3g} GB/s  latency {n['latency_s'] * 1e6:5.3g} µs  "
                     f"{n['name']}")
    lines += libraries.listing()
    lines.append("Sources: docs/hardware.md")
    return "\n".join(lines)


def markdown() -> str:
    """docs/hardware.md's tables, every figure with its source."""
    cat = catalogue()
    out = ["| GPU | precision | model | per second | batch | source |", "|---|---|---|---|---|---|"]
    for key, g in cat["gpu"].items():
        rows = [(p, m, e) for p in PRECISIONS for m, e in g.get(p, {}).items()]
        if not rows:
            out.append(f"| {key} ({g['name']}) | | | none catalogued | | |")
        for p, m, e in rows:
            small = f" ({e['small_per_s']:g} at {e['small_batch']})" if "small_per_s" in e else ""
            out.append(f"| {key} ({g['name']}) | {p} | {m} | {e['per_s']:g}{small} | {e['batch']} | "
                       f"[{e['source']}](#sources) |")
    hosts = [(key, g) for key, g in cat["gpu"].items() if "host_memory_Bps" in g]
    if hosts:
        out += ["", "| GPU | host memory bandwidth (B/s, the servers' CPU apply) | source |", "|---|---|---|"]
        out += [f"| {key} | {g['host_memory_Bps']:g} | [{g['host_source']}](#sources) |" for key, g in hosts]
    slow = [(key, g) for key, g in cat["gpu"].items() if "multi_gpu_slowdown" in g]
    if slow:
        out += ["", "| GPU | compute slowdown with more than one GPU per node (**calibrated**) | source |",
                "|---|---|---|"]
        out += [f"| {key} | {g['multi_gpu_slowdown']:g} | [{g['multi_gpu_source']}](#sources) |" for key, g in slow]
    out += ["", "| link | bandwidth (B/s, per direction) | latency (s) | overhead (s) | name | source |",
            "|---|---|---|---|---|---|"]
    for table in ("intra", "network"):
        for key, n in cat[table].items():
            out.append(f"| `{key}` ({table}) | {n['bandwidth_Bps']:g} | {n['latency_s']:g} | "
                       f"{n.get('overhead_s', 0.0):g} | {n['name']} | {n['source']} |")
    out += ["", *libraries.markdown()]
    out += ["", "### Sources", ""]
    out += [f"* **{key}**: {text}" for key, text in cat["sources"].items()]
    return "\n".join(out) + "\n"


def check_catalogue() -> list[str]:
    """Problems of the catalogue file (every figure needs a known source; every GPU a link)."""
    cat = catalogue()
    problems = []
    for key, g in cat["gpu"].items():
        if g.get("intra") not in cat["intra"]:
            problems.append(f"gpu {key}: unknown intra link {g.get('intra')!r}")
        for p in PRECISIONS:
            for m, e in g.get(p, {}).items():
                if e.get("source") not in cat["sources"]:
                    problems.append(f"gpu {key} {p} {m}: unknown source {e.get('source')!r}")
                if not e.get("per_s", 0) > 0:
                    problems.append(f"gpu {key} {p} {m}: per_s must be > 0")
                elif "small_per_s" in e:
                    if not 0 < e.get("small_batch", 0) < e["batch"]:
                        problems.append(f"gpu {key} {p} {m}: small_batch must be > 0 and < batch")
                    elif min(compute_model(e)) < 0:
                        problems.append(f"gpu {key} {p} {m}: its two points give a negative base_s or per_sample_s")
        if "host_memory_Bps" in g and g.get("host_source") not in cat["sources"]:
            problems.append(f"gpu {key} host_memory_Bps: unknown source {g.get('host_source')!r}")
        if "multi_gpu_slowdown" in g:
            if g.get("multi_gpu_source") not in cat["sources"]:
                problems.append(f"gpu {key} multi_gpu_slowdown: unknown source {g.get('multi_gpu_source')!r}")
            if not isinstance(g["multi_gpu_slowdown"], (int, float)) or not 0 <= g["multi_gpu_slowdown"] < 1:
                problems.append(f"gpu {key} multi_gpu_slowdown: must be >= 0 and < 1")
    for key, lib in libraries.libraries().items():
        for f in libraries.FIGURES:
            if f in lib and libraries.source_of(lib, f) not in cat["sources"]:
                problems.append(f"library {key} {f}: unknown source {libraries.source_of(lib, f)!r}")
    for table in ("intra", "network"):
        for key, n in cat[table].items():
            cited = [s.strip() for s in str(n.get("source", "")).split(";")]
            if not any(c in cat["sources"] or c.split(" (")[-1].rstrip(")") in cat["sources"] or
                       any(k in c for k in cat["sources"]) for c in cited):
                problems.append(f"{table} {key}: no known source in {n.get('source')!r}")
            if "achieved" in n and not isinstance(n["achieved"], bool):
                problems.append(f"{table} {key} achieved: must be true or false")
    return problems


if __name__ == "__main__":
    print(markdown(), end="")


__all__ = ["catalogue", "apply_presets", "compute_model", "gpu_throughput", "listing", "markdown", "check_catalogue"]
