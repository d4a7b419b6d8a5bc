"""ddlsim against published measurements of real clusters: ``python -m ddlsim.scenarios.published``.

Every row is a figure a paper, a project's benchmark page or a maintainer published for a
real cluster, and ddlsim's prediction of it from the setting the source states: the model
(its parameter count), the GPUs per node and their link, the network (the hardware
catalogue's preset), the communication library's algorithm and bucket size, and the
compute time of one GPU *as the same source reports it* (its single-GPU throughput), so
that what is predicted is what distribution adds. No row is fitted; a hardware setup may
have one calibrated constant, stated in the table (only the SGP paper's 10 GbE cluster
has one). The script writes docs/published-validation.md; the sources are in
docs/hardware.md (the catalogue's [sources]).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..simulator.files import atomic_write
from ..simulator.run import simulate
from .hardware import catalogue
from .load import load_text

DOCS = Path(__file__).resolve().parents[1] / "docs"
ITERATIONS = 3            # simulated iterations per row (deterministic compute: all alike)
SGP_ITERATIONS = 14_076   # ⌈90 · 1,281,167 / (32 · 256)⌉: the SGP paper's 90 ImageNet epochs
MIB = 2**20


@dataclass(frozen=True)
class Row:
    """One published figure and the setting ddlsim predicts it from."""

    id: str
    source: str               # key of the catalogue's [sources]
    where: str                # table / figure / section in the source
    what: str                 # the setting, in words
    metric: str               # sec_per_iter | images_per_s | efficiency | hours
    published: float
    keys: dict[str, Any]      # scenario keys of the setting
    single_per_s: float       # one GPU's throughput in the same source (the compute model)
    bound: str = ""           # "lower": the source gives a lower bound (e.g. "over 5 h")
    mechanism: str = ""       # why the model misses, where it misses by more than 10 %
    calibrated: str = ""      # the setup's calibrated constant, when it has one
    fitted: bool = False      # the calibration point itself: not counted in the statistics


def _setup(model: str, gpus: int, per_node: int, batch: int, single_per_s: float, *, preset: str, intra: str,
           bucket: int, algorithm: str, protocol: str = "allreduce", **more: Any) -> dict[str, Any]:
    link = catalogue()["intra"][intra]
    keys = {"workload.model": model, "workload.dataset": "imagenet", "cluster.learners": gpus,
            "cluster.gpus_per_node": per_node, "cluster.minibatch": batch,
            "cluster.compute.distribution": "deterministic", "cluster.compute.base_s": 0.0,
            "cluster.compute.per_sample_s": 1.0 / single_per_s, "cluster.network.preset": preset,
            "cluster.network.intra_bandwidth_Bps": float(link["bandwidth_Bps"]),
            "cluster.network.intra_latency_s": float(link["latency_s"]), "protocol.name": protocol,
            "protocol.bucket_bytes": bucket, "protocol.allreduce_algorithm": algorithm}
    keys.update(more)
    return keys


def _ddp(model: str, gpus: int, single_s: float) -> dict[str, Any]:
    """PyTorch DDP benchmark: DGX-1 V100 (NVLink 2), 4 × EDR per machine, NCCL ring, 25 MB buckets."""
    return _setup(model, gpus, 8, 32, 32 / single_s, preset="ib-edr-x4", intra="nvlink2", bucket=25 * MIB,
                  algorithm="ring")


def _horovod(model: str, gpus: int, single: float, net: str) -> dict[str, Any]:
    """Horovod on Uber's cluster: 4 Pascal GPUs per server (PCIe), 25 GbE, NCCL ring, Tensor Fusion 64 MB."""
    return _setup(model, gpus, 4, 64, single, preset=net, intra="pcie3", bucket=64 * MIB, algorithm="ring")


def _dle(model: str, gpus: int, batch: int, single: float, intra: str) -> dict[str, Any]:
    """NVIDIA DeepLearningExamples on one DGX: PyTorch DDP over NVLink, 25 MB buckets."""
    return _setup(model, gpus, gpus, batch, single, preset="ib-edr", intra=intra, bucket=25 * MIB, algorithm="ring")


# SGP paper, 10 GbE: 32 nodes of 8 V100 each running one process (torch DataParallel inside the
# node: 256 images, 32 per GPU, at the catalogue's 367 img/s per V100), gossip and all-reduce
# over PyTorch 0.5's TCP backend (recursive doubling, one message of the whole model after the
# step; facebookresearch/stochastic_gradient_push, gossip_module/ar_distributed.py). The one
# calibrated constant: the TCP backend's effective bandwidth, from SGP's published 1.6 h:
# 1.6 h / 14,076 iterations = 0.409 s = 256 / (8 · 367) s of compute + 102.2 MB / bandwidth.
SGP_COMPUTE_S = 256 / (8 * 367)
SGP_BANDWIDTH = 25_557_032 * 4 / (1.6 * 3600 / SGP_ITERATIONS - SGP_COMPUTE_S)


def _sgp(protocol: str, algorithm: str = "ring") -> dict[str, Any]:
    keys = _setup("resnet50", 32, 1, 256, 8 * 367, preset="10gbe-tcp", intra="nvlink2", bucket=0,
                  algorithm=algorithm, protocol=protocol)
    keys["cluster.network.bandwidth_Bps"] = SGP_BANDWIDTH
    keys["protocol.topology"] = "npdde"
    keys["protocol.overlap"] = 0
    return keys


ROWS: tuple[Row, ...] = (
    Row("P1", "pytorch-ddp-bench", "README example output", "ResNet-50, 8 V100 (1 DGX-1), batch 32/GPU",
        "sec_per_iter", 0.104, _ddp("resnet50", 8, 0.097), 32 / 0.097),
    Row("P2", "pytorch-ddp-bench", "README example output", "ResNet-50, 16 V100 (2 DGX-1, 4×EDR)",
        "sec_per_iter", 0.104, _ddp("resnet50", 16, 0.097), 32 / 0.097),
    Row("P3", "pytorch-ddp-bench", "README example output", "ResNet-101, 8 V100 (1 DGX-1)",
        "sec_per_iter", 0.179, _ddp("resnet101", 8, 0.162), 32 / 0.162),
    Row("P4", "pytorch-ddp-bench", "README example output", "ResNet-101, 16 V100 (2 DGX-1, 4×EDR)",
        "sec_per_iter", 0.179, _ddp("resnet101", 16, 0.162), 32 / 0.162),
    Row("H1", "horovod-readme", "table 'On 16 GPUs'", "Inception V3, 16 Pascal (4/server), 25 GbE TCP",
        "images_per_s", 1990.7, _horovod("inception_v3", 16, 134.4, "25gbe-tcp"), 134.4),
    Row("H2", "horovod-readme", "table 'On 16 GPUs'", "Inception V3, 16 Pascal, 25 GbE RDMA",
        "images_per_s", 2022.6, _horovod("inception_v3", 16, 134.4, "25gbe-roce"), 134.4),
    Row("H3", "horovod-readme", "table 'On 16 GPUs'", "ResNet-101, 16 Pascal, 25 GbE TCP",
        "images_per_s", 1685.1, _horovod("resnet101", 16, 119.4, "25gbe-tcp"), 119.4),
    Row("H4", "horovod-readme", "table 'On 16 GPUs'", "ResNet-101, 16 Pascal, 25 GbE RDMA",
        "images_per_s", 1746.2, _horovod("resnet101", 16, 119.4, "25gbe-roce"), 119.4),
    Row("H5", "horovod-readme", "table 'On 16 GPUs'", "VGG-16, 16 Pascal, 25 GbE TCP",
        "images_per_s", 1308.7, _horovod("vgg16", 16, 130.9, "25gbe-tcp"), 130.9,
        mechanism="TCP below line rate: VGG-16's 553 MB gradient makes the row bandwidth-bound, and the "
        "source's own TCP/RDMA ratio (0.73) says Horovod's TCP path moved ~60 % of what RDMA did; the "
        "catalogue's TCP preset is line rate (deepspeed-1bit measured 4.1 of 40 Gbit/s on TCP)"),
    Row("H6", "horovod-readme", "table 'On 16 GPUs'", "VGG-16, 16 Pascal, 25 GbE RDMA",
        "images_per_s", 1787.4, _horovod("vgg16", 16, 130.9, "25gbe-roce"), 130.9),
    Row("H7", "horovod-docs", "docs/benchmarks.rst", "Inception V3, 512 Pascal (128 servers), 25 GbE RoCE",
        "efficiency", 0.90, _horovod("inception_v3", 512, 134.4, "25gbe-roce"), 134.4),
    Row("H8", "horovod-docs", "docs/benchmarks.rst", "ResNet-101, 512 Pascal, 25 GbE RoCE",
        "efficiency", 0.90, _horovod("resnet101", 512, 119.4, "25gbe-roce"), 119.4),
    Row("H9", "horovod-docs", "docs/benchmarks.rst", "VGG-16, 512 Pascal, 25 GbE RoCE",
        "efficiency", 0.68, _horovod("vgg16", 512, 130.9, "25gbe-roce"), 130.9),
    Row("I1", "horovod-416", "issue body", "ResNet-101, 4 V100 (PCIe switch, one server)",
        "images_per_s", 650.92, _setup("resnet101", 4, 4, 64, 202.78, preset="40gbe-roce", intra="pcie3",
                                        bucket=64 * MIB, algorithm="ring"), 202.78,
        mechanism="V100s behind PCIe switches: the GPUs of a switch share its uplink, so the intra-node "
        "ring runs well below the 16 GB/s per GPU the model gives each (the maintainers' reply: 'V100s really "
        "need NVLink')"),
    Row("I2", "horovod-416", "issue body", "ResNet-101, 16 V100 (2 servers of 8, PCIe), 40 Gb RoCE",
        "images_per_s", 2379.56, _setup("resnet101", 16, 8, 64, 202.78, preset="40gbe-roce", intra="pcie3",
                                         bucket=64 * MIB, algorithm="ring"), 202.78,
        mechanism="as I1: the shared PCIe switches (8 GPUs per server here), plus RoCE below line rate"),
    Row("T1", "tf-benchmarks", "'NVIDIA DGX-1 (P100)', synthetic", "VGG-16, 4 P100 (NVLink), NCCL replicated",
        "images_per_s", 584, _dle("vgg16", 4, 64, 154, "nvlink1"), 154),
    Row("T2", "tf-benchmarks", "'NVIDIA DGX-1 (P100)', synthetic", "VGG-16, 8 P100 (NVLink), NCCL replicated",
        "images_per_s", 1081, _dle("vgg16", 8, 64, 154, "nvlink1"), 154,
        mechanism="DGX-1's hybrid cube-mesh: with 8 P100s some GPU pairs are two NVLink hops or PCIe apart, "
        "so TF's NCCL rings get less than the 80 GB/s of one GPU's links (4 GPUs: +5 %)"),
    Row("N1", "nvidia-dle-rn50", "'Training performance: DGX-1 16GB'", "ResNet-50, 8 V100, FP32, batch 112",
        "images_per_s", 2855, _dle("resnet50", 8, 112, 367, "nvlink2"), 367),
    Row("N2", "nvidia-dle-rn50", "'Training performance: DGX-1 16GB'", "ResNet-50, 8 V100, AMP, batch 256",
        "images_per_s", 8322, _dle("resnet50", 8, 256, 1200, "nvlink2"), 1200,
        mechanism="the input pipeline: at 1,200 img/s per GPU mixed-precision training is bound by data "
        "loading and augmentation shared by the node's CPUs (FP32, 367 img/s, is predicted within 3 %)"),
    Row("N3", "nvidia-dle-rn50", "'Training performance: DGX A100'", "ResNet-50, 8 A100, TF32, batch 256",
        "images_per_s", 7248, _dle("resnet50", 8, 256, 938, "nvlink3"), 938),
    Row("N4", "nvidia-dle-rn50", "'Training performance: DGX A100'", "ResNet-50, 8 A100, AMP, batch 256",
        "images_per_s", 16621, _dle("resnet50", 8, 256, 2470, "nvlink3"), 2470,
        mechanism="as N2: 8 × 2,470 img/s of decoding and augmentation per node (TF32 is within 4 %)"),
    Row("S1", "sgp-paper", "abstract", "SGP, 32 nodes × 8 V100, 10 GbE, 90 epochs",
        "hours", 1.6, _sgp("sgp"), 8 * 367, calibrated="TCP effective bandwidth "
        f"{SGP_BANDWIDTH * 8 / 1e9:.2f} Gbit/s, from this row", fitted=True),
    Row("S2", "sgp-paper", "abstract", "AllReduce-SGD, 32 nodes × 8 V100, 10 GbE, 90 epochs",
        "hours", 5.0, _sgp("allreduce", "recursive_doubling"), 8 * 367, bound="lower",
        calibrated="the same bandwidth (row S1)"),
)


@dataclass
class Result:
    row: Row
    predicted: float
    sec_per_iter: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def error(self) -> float:
        """Relative error of the prediction; 0 when a lower bound is met."""
        if self.row.bound == "lower" and self.predicted >= self.row.published:
            return 0.0
        return (self.predicted - self.row.published) / self.row.published


def _point(keys: dict[str, Any]) -> dict[str, Any]:
    lam, mu = keys["cluster.learners"], keys["cluster.minibatch"]
    lines = ["name = \"published\"", "[workload]", "epochs = 1", f"samples_per_epoch = {lam * mu * ITERATIONS}"]
    sets = [f"{k}={v!r}".replace("'", '"') if isinstance(v, str) else f"{k}={v!r}" for k, v in keys.items()]
    return load_text("\n".join(lines), "<published>", sets).points()[0]


def predict(row: Row) -> Result:
    """Simulate ``row``'s setting; its predicted value in the row's metric."""
    point = _point(row.keys)
    sim = simulate(point)
    lam, mu = point["cluster"]["learners"], point["cluster"]["minibatch"]
    per_iter = sim.summary["sim_time_s"] / (sim.summary["gradients"] / lam)
    rate = lam * mu / per_iter
    value = {"sec_per_iter": per_iter, "images_per_s": rate, "efficiency": rate / (lam * row.single_per_s),
             "hours": per_iter * SGP_ITERATIONS / 3600}[row.metric]
    return Result(row, value, per_iter)


def _fmt(metric: str, v: float) -> str:
    return {"sec_per_iter": f"{v:.3f} s/iter", "images_per_s": f"{v:,.0f} img/s", "efficiency": f"{v:.0%}",
            "hours": f"{v:.2f} h"}[metric]


def note(results: list[Result]) -> str:
    """docs/published-validation.md."""
    counted = [r for r in results if not r.row.fitted]
    errs = [abs(r.error) for r in counted]
    worst = max(counted, key=lambda r: abs(r.error))
    lines = [
        "# ddlsim against published measurements",
        "",
        "Generated by `python -m ddlsim.scenarios.published` (every row one simulation; sources in",
        "[docs/hardware.md](hardware.md)). Each row predicts a published figure of a real cluster",
        "from the setting its source states: the model's parameter count, GPUs per node and their",
        "link, the network (the hardware catalogue's preset), the library's all-reduce algorithm and",
        "bucket size, and the compute time of one GPU **as the same source reports it** (its",
        "single-GPU throughput), so the prediction is what distribution adds. No row is fitted; one",
        "hardware setup (the SGP paper's 10 GbE cluster) has one calibrated constant, stated.",
        "",
        f"**{len(counted)} predicted rows (and one calibration point) from {len({r.row.source for r in results})} "
        f"sources: median |relative error| {statistics.median(errs):.1%}, mean {statistics.mean(errs):.1%}; "
        f"worst {worst.row.id} ({worst.error:+.1%}): {worst.row.mechanism or 'see below'}.**",
        "",
        "| id | source | setting | metric | published | ddlsim | error | calibrated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        pub = ("≥ " if r.row.bound == "lower" else "") + _fmt(r.row.metric, r.row.published)
        lines.append(f"| {r.row.id} | {r.row.source} ({r.row.where}) | {r.row.what} | {r.row.metric} | {pub} | "
                     f"{_fmt(r.row.metric, r.predicted)} | {r.error:+.1%} | {r.row.calibrated or '—'} |")
    missed = [r for r in counted if abs(r.error) > 0.10]
    lines += ["", "## Where the model misses by more than 10 %, and why", ""]
    lines += [f"* **{r.row.id}** ({r.error:+.1%}): {r.row.mechanism}." for r in missed]
    lines += ["", "Every miss over-predicts throughput: the model gives each link its nominal bandwidth and",
              "each GPU its single-GPU speed; what it lacks is a shared bottleneck the source does not state",
              "(TCP below line rate, shared PCIe switches, the CPU input pipeline).", "",
              "## Settings", "",
              "Deterministic compute at the source's single-GPU rate; backward 2/3 of it, producing the",
              "gradient buckets (25 MB for PyTorch DDP and TensorFlow, Horovod's 64 MB Tensor Fusion",
              "buffer, one message for the SGP code's all-reduce); NCCL and Horovod as a ring, PyTorch",
              "0.5's TCP backend as recursive doubling; the network preset's latency, bandwidth and",
              "per-message software cost (docs/hardware.md). `ROWS` in `scenarios/published.py` holds",
              "every key. The SGP rows: 32 nodes of 8 V100s, each node one process (256 images at the",
              "catalogue's 367 img/s per V100) — see docs/decentralized.md for the whole SGP table."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddlsim.scenarios.published", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DOCS / "published-validation.md"), help="the note to write")
    ap.add_argument("--print", action="store_true", help="print the rows instead of writing the note")
    args = ap.parse_args(argv)
    results = [predict(row) for row in ROWS]
    text = note(results)
    if args.print:
        print(text)
    else:
        print(f"note: {atomic_write(args.out, text)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
