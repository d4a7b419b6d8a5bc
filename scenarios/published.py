"""ddlsim against published measurements of real clusters: ``python -m ddlsim.scenarios.published``.

Every row is a figure a paper, a project's benchmark page or a maintainer published for a
real cluster, and ddlsim's prediction of it from the setting the source states, the way a
user states it: ``cluster.gpu``, ``cluster.gpus_per_node``, ``cluster.network.preset``,
``protocol.library``, the protocol and bucket keys, and the compute time of one GPU *as the
same source reports it* (``per_sample_s`` from its single-GPU throughput). What is scored is
what distribution adds, the overhead ``t_N / t_1 − 1``, beside two baselines computed here:
perfect linear scaling, and alpha-beta without overlap. No row is fitted; a constant
calibrated from a row is labelled, and that row leaves the statistics. ``--out FILE`` (required)
writes the note there; the repository's docs/published-validation.md is regenerated from the
repository root with ``python -m ddlsim.scenarios.published --out docs/published-validation.md``.
The sources are in docs/hardware.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from dataclasses import dataclass, field
from collections.abc import Sequence
from typing import Any

from ..analysis.findings import spearman
from ..simulator.catalog import dataset_info, param_count
from ..simulator.files import atomic_write
from ..simulator.run import simulate
from .hardware import catalogue
from .libraries import libraries, source_of
from .load import load_text

ITERATIONS = 12           # simulated iterations per row (compute jitter: a barrier per iteration)
RANDOM_PULL_ITERATIONS = 96  # rows with a random pull order: a mean over many orders
SGP_ITERATIONS = 14_076   # ⌈90 · 1,281,167 / (32 · 256)⌉: the SGP paper's 90 ImageNet epochs
MIB = 2**20
PS_PROTOCOLS = ("hardsync",)


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
    mechanism: str = ""       # what the model lacks, where it misses the overhead by more than 25 %
    calibrated: str = ""      # the setup's calibrated constant, when it has one
    fitted: bool = False      # the calibration point itself: not counted in the statistics
    single_from: str = ""     # the single-GPU figure and its source, where the row's source states none

    @property
    def gpus(self) -> int:
        return int(self.keys["cluster.learners"])

    @property
    def nodes(self) -> int:
        return self.gpus // int(self.keys["cluster.gpus_per_node"])

    @property
    def t1(self) -> float:
        """One GPU's iteration time in the source."""
        return self.keys["cluster.minibatch"] / self.single_per_s

    def seconds(self, value: float) -> float:
        """The iteration time of the N-GPU setting that ``value`` (in the row's metric) means."""
        n, mu = self.gpus, self.keys["cluster.minibatch"]
        return {"sec_per_iter": value, "images_per_s": n * mu / value if value else math.inf,
                "efficiency": self.t1 / value if value else math.inf,
                "hours": value * 3600 / SGP_ITERATIONS}[self.metric]

    def value(self, seconds: float) -> float:
        """``seconds`` per iteration in the row's metric."""
        n, mu = self.gpus, self.keys["cluster.minibatch"]
        return {"sec_per_iter": seconds, "images_per_s": n * mu / seconds, "efficiency": self.t1 / seconds,
                "hours": seconds * SGP_ITERATIONS / 3600}[self.metric]


def _keys(model: str, gpus: int, per_node: int, batch: int, single_per_s: float, *, gpu: str, preset: str,
          library: str | None, protocol: str = "allreduce", **more: Any) -> dict[str, Any]:
    """A row's setting as a user writes it (the source's single-GPU rate as ``per_sample_s``)."""
    keys = {"workload.model": model, "workload.dataset": "imagenet", "cluster.learners": gpus,
            "cluster.gpus_per_node": per_node, "cluster.minibatch": batch, "cluster.gpu": gpu,
            "cluster.compute.per_sample_s": 1.0 / single_per_s, "cluster.network.preset": preset,
            "protocol.name": protocol}
    if library is not None:
        keys["protocol.library"] = library
    keys.update({k.replace("__", "."): v for k, v in more.items()})
    return keys


def _ddp(model: str, gpus: int, single_s: float) -> dict[str, Any]:
    """PyTorch DDP benchmark: DGX-1 V100 (NVLink 2), 4 × EDR per machine, NCCL ring."""
    return _keys(model, gpus, 8, 32, 32 / single_s, gpu="v100", preset="ib-edr-x4", library="nccl",
                 protocol__allreduce_algorithm="ring")


def _horovod(model: str, gpus: int, single: float, net: str) -> dict[str, Any]:
    """Horovod on Uber's cluster: 4 Pascal GPUs per server (PCIe), 25 GbE, NCCL ring, Tensor Fusion."""
    return _keys(model, gpus, 4, 64, single, gpu="pascal-pcie", preset=net, library="horovod",
                 protocol__allreduce_algorithm="ring")


def _dle(model: str, gpus: int, batch: int, single: float, gpu: str, precision: str = "fp32") -> dict[str, Any]:
    """NVIDIA DeepLearningExamples on one DGX: PyTorch DDP over NVLink."""
    return _keys(model, gpus, gpus, batch, single, gpu=gpu, preset="ib-edr", library="nccl",
                 cluster__precision=precision, protocol__allreduce_algorithm="ring")


def _tf_dgx(model: str, gpus: int, batch: int, single: float) -> dict[str, Any]:
    """tf_cnn_benchmarks on a DGX-1 (P100, NVLink 1): replicated variables, NCCL all-reduce."""
    return _keys(model, gpus, gpus, batch, single, gpu="p100", preset="ib-edr", library="tf-nccl",
                 protocol__allreduce_algorithm="ring")


def _tf_ec2(model: str, gpus: int, batch: int, single: float, ps: int) -> dict[str, Any]:
    """tf_cnn_benchmarks on p2.8xlarge (8 K80 on PCIe, 10 GbE): distributed_replicated: the GPUs of a
    machine aggregate, then push to ``ps`` parameter servers run on the worker machines (gRPC)."""
    return _keys(model, gpus, 8, batch, single, gpu="k80", preset="10gbe-tcp", library="tf-distributed-replicated",
                 protocol="hardsync", cluster__server__aggregation="machine",
                 cluster__server__placement="colocated", cluster__server__shards=ps)


# SGP paper, 10 GbE: 32 nodes of 8 V100 each running one process (torch DataParallel inside the
# node: 256 images, 32 per GPU, at the catalogue's 367 img/s per V100), gossip and all-reduce
# over PyTorch 0.5's TCP backend (recursive doubling, one message of the whole model after the
# step; facebookresearch/stochastic_gradient_push, gossip_module/ar_distributed.py). The one
# calibrated constant: the TCP backend's effective bandwidth, from SGP's published 1.6 h:
# 1.6 h / 14,076 iterations = 0.409 s = 256 / (8 · 367) s of compute + 102.2 MB / bandwidth.
SGP_COMPUTE_S = 256 / (8 * 367)
SGP_SINGLE = "2,936 img/s a node: 8 × 367 (nvidia-dle-rn50; the paper states none)"
SGP_BANDWIDTH = 25_557_032 * 4 / (1.6 * 3600 / SGP_ITERATIONS - SGP_COMPUTE_S)


def _sgp(protocol: str, algorithm: str = "ring") -> dict[str, Any]:
    link = catalogue()["intra"]["nvlink2"]
    return _keys("resnet50", 32, 1, 256, 8 * 367, gpu="v100", preset="10gbe-tcp", library=None, protocol=protocol,
                 cluster__compute__base_s=0.0, cluster__compute__distribution="deterministic",
                 cluster__network__bandwidth_Bps=SGP_BANDWIDTH,
                 cluster__network__intra_bandwidth_Bps=float(link["bandwidth_Bps"]),
                 protocol__bucket_bytes=0, protocol__allreduce_algorithm=algorithm, protocol__topology="npdde",
                 protocol__overlap=0)


TFB = "tf-benchmarks"
DGX_SYN = "'Details for NVIDIA DGX-1 (P100)', training synthetic data"
EC2_DIST = "'Details for Amazon EC2 Distributed (K80)', training synthetic data"
K80_OVER = ("over-predicted: the calibrated K80 slowdown (+3.39 %), the in-machine reduce (0.7 %) and the first "
            "layers' round trip come to 4.6 %, more than the 3.5 % this row loses in all, within the spread of the "
            "page's single-GPU rates (below)")

# what the model lacks, by row family, where a row states no mechanism of its own
MISSING = {
    "P": "DDP on 8 NVLink V100s loses more than the model's framework cost (per parameter, from the ResNeXt "
         "lines) and calibrated overlap slowdown, and most of it already on one GPU: the benchmark's ResNet-101 "
         "lines are 0.162 s without DDP and 0.171 s with DDP on 1 GPU (9 ms), where 44.5 M parameters at "
         "9.6e-11 s charge 4.3 ms, so about 4.7 ms of P3's 6 ms shortfall (0.179 against 0.173 s); from 2 to 8 "
         "GPUs the lines rise 0.176, 0.176, 0.179 s (3 ms). Missing: DDP's own cost as a model's tensors make "
         "it (ResNet-101 has about as many tensors as ResNeXt-101 with half the parameters), measured apart "
         "from these rows",
    "H": "Horovod's per-tensor negotiation beyond one cycle per iteration (a cycle per fused buffer, the "
         "coordinator's allgather of the ready lists), and TCP/RoCE below line rate",
    "T": "TensorFlow 1.x's tf.contrib.nccl is the open-source NCCL 1: one ring in device order, one all-reduce "
         "per tensor (modelled: a ring step over one NVLink, 18.31 GB/s, within a quad; at most 10 GB/s of bus "
         "bandwidth on 8 GPUs, the upper bound nccl-76 reports). A candidate for what decides how much of that "
         "ring the backward hides is in its NcclManager (tf-nccl-manager): a tensor's all-reduce starts only "
         "when every GPU's participant has arrived, its NCCL stream then waits for the participant's whole "
         "compute stream (not for the kernel that produced the tensor), so it also waits for every kernel the "
         "host enqueued before it, and one collective at a time queues its kernels; ROCm's port of that code "
         "measured ResNet-50 on 2, 4 and 8 GPUs at 0.958, 0.864 and 0.793 scaling efficiency with the wait on "
         "the stream, 0.997, 0.959 and 0.939 with an event per tensor instead (rocm-tf-577). How far the wait "
         "moves a collective past its tensor depends on how far the host's enqueue runs ahead of the GPU, "
         "which no source states, so the preset keeps each bucket's start as the backward produces it; 6 of "
         "the 9 rows lie between that and the whole ring after the backward, T5 and T6 above both and T7 below "
         "both (the line under the mechanisms below). Per iteration, of the unoverlapped ring, the rows leave "
         "exposed: AlexNet 72 % on 2 GPUs (T4: 9.6 of 13.4 ms), more than all of it on 4 and 8 (T5: 23.5 ms "
         "against 20.0 ms at 18.31 GB/s; T6: 58.4 ms against 42.8 ms at 10 GB/s, at most 7.3 GB/s even without "
         "overlap); VGG-16 on 2 GPUs 61 % at batch 64 and 18 % at batch 32 (T3: 18.3 of 30.2 ms, T7: 5.5 of "
         "30.2, less than the calibrated overlap slowdown's 8.0 ms alone), on 4 GPUs 50 % and 24 % (T1: 22.8 "
         "of 45.3, T8: 10.9 of 45.3), on 8 GPUs 60 % and 93 % (T2: 58.1 of 96.9, T9: 90.0 of 96.9). Missing, "
         "for want of a source measured apart from these rows: how far TensorFlow 1.x's executor enqueues "
         "ahead of a P100 (which sets the wait), and the rate of the 8-GPU ring's two steps through host "
         "memory (GPU 3 to 4 and 7 to 0, zero-copy over PCIe and QPI)",
    "E": "under-predicted, and more with more machines: the rows' mode, tf_cnn_benchmarks' distributed_replicated "
         "(tf-cnn-dist-replicated), is modelled as it is written (the replicated pull): each variable pushed as the "
         "backward produces it, applied, past a barrier across the workers and read back during the rest of the "
         "backward, the next forward after the first layer's copies. The push and pull then hide behind the backward, "
         "and what is left exposed is the in-machine reduce, the first layers' round trip and the calibrated K80 "
         "slowdown, which hardly grow with the machines (ResNet-50 at batch 64, E5-E8: 0.070 s per iteration on one "
         "machine, 0.078 s on eight), while the rows' exposure doubles (0.133 to 0.271 s). Not a per-RPC cost of the "
         "size measured apart from the rows, if the RPCs run concurrently as the protocol issues them "
         "(tf-grpc-concurrent): TensorFlow's RPC benchmark (tf-rpcbench, 5-6 us per 8-byte transfer with hundreds "
         "in flight) gives E5's 2 x 161 RPCs per step 1.8 ms and E8's 161 x (2 + 7) with the barrier's tokens "
         "8.0 ms, 35 and 24 times less than the 0.063 and 0.193 s the rows expose beyond the model; one after "
         "another at the loopback hop's 81 us (26 and 117 ms) they would still fall short, and only at the 204 us "
         "gRPC takes between two VMs (grpc-pingpong: 66 ms and 0.30 s) would they cover both gaps, which the source "
         "of the concurrency says they are not. Not the RPC stack's rate either: the rows' build (b1e174e, May "
         "2017) is older than gRPC's upgrade of August 2017, and worker-to-worker transfers of one pair of "
         "TensorFlow processes, without a fetch into Python or sharding, were measured before it at under 0.1 to "
         "0.9 GB/s by benchmark, message and machine (tf-grpc-pre-upgrade); the preset keeps its 800 MB/s (762 "
         "MB/s with the copy from GPU memory), about the 0.9 GB/s, "
         "and at 196 MB/s (tried on the rows, not adopted) the ResNet-152 rows go to +217 to +621 % while "
         "ResNet-50's at batch 64 sit at -25 to +32 %: no rate of that range fits both, for on one machine the rows "
         "expose 0.07-0.13 s per iteration for models of 95 to 241 MB alike, which is not a cost per byte. Still "
         "open: what grows with the machines",
    "N": "over-predicted: DDP's framework cost and overlap slowdown come from PyTorch 1.4 at batch 32; "
         "at batches of 112-256 with NVIDIA's newer PyTorch and NCCL they cost less, which the constants "
         "(per parameter, and a share of compute) do not follow",
    "I": "V100s without NVLink: ring steps through PCIe switches and the CPUs' root complexes",
}


def calibration(row: Row) -> str:
    """The calibrated constants a row's prediction uses: its own, its library's overlap slowdown
    (N > 1), and the multi-GPU slowdown its GPU preset filled in (``cluster.compute.multi_gpu_slowdown``
    of the built point)."""
    labels = [row.calibrated] if row.calibrated else []
    lib = libraries().get(row.keys.get("protocol.library") or "", {})
    if "overlap_slowdown" in lib and row.gpus > 1:
        labels.append(f"overlap_slowdown {lib['overlap_slowdown']:.1%} ({source_of(lib, 'overlap_slowdown')}'s 2-GPU "
                      "lines, not rows)")
    share = gpu_slowdown(row)
    if share:
        source = catalogue()["gpu"][row.keys["cluster.gpu"]]["multi_gpu_source"]
        labels.append(f"{row.keys['cluster.gpu']}'s multi-GPU slowdown +{share:.2%} ({source}: the page's "
                      "single-machine 2-GPU entries, not rows)")
    return "; ".join(labels)


def gpu_slowdown(row: Row) -> float:
    """The multi-GPU slowdown a row's GPU preset filled in (0 where none, or where the row sets it)."""
    if "cluster.compute.multi_gpu_slowdown" in row.keys:
        return 0.0
    return float(_point(row.keys)["cluster"]["compute"]["multi_gpu_slowdown"] or 0.0)


def missing(row: Row) -> str:
    """The mechanism the model lacks for ``row``: its own text, or its family's."""
    return row.mechanism or MISSING.get(row.id.rstrip("0123456789"), "not identified")
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
        mechanism="TCP below line rate: VGG-16's 553 MB gradient makes the row bandwidth-bound; the source's "
        "own TCP/RDMA throughput ratio is 0.73, TCP exposing 293.6 ms per iteration against RDMA's 84.0 ms, and "
        "if RDMA moved line rate (a ring of 332 ms at 25 Gbit/s, 248 ms of it hidden) and TCP hid as much, TCP "
        "moved about 61 % of line rate (an estimate under those two assumptions, not a measurement); the "
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
        "images_per_s", 650.92, _keys("resnet101", 4, 4, 64, 202.78, gpu="v100-pcie", preset="40gbe-roce",
                                       library="horovod", protocol__allreduce_algorithm="ring"), 202.78,
        mechanism="V100s under one PCIe switch (the issue: 4 GPUs on one switch, one x16 link from it to one "
        "of the server's two CPUs, joined by QPI): the row exposes 77.7 ms per iteration, 4.6 times the "
        "unoverlapped ring of ResNet-101's 178.8 MB at PCIe 3.0 x16 (16.8 ms at 16 GB/s; PCI-SIG's 8 GT/s x 16 "
        "lanes x 128/130 = 15.75 GB/s changes it by 2 %): without overlap it implies 3.45 GB/s of bus bandwidth. "
        "A ring through host memory, the 4 GPUs sharing the switch's one x16 uplink (15.75 / 4 = 3.9 GB/s each), "
        "would give about that; missing: whether peer-to-peer was enabled (the issue does not say) and a "
        "measured all-reduce rate of that system"),
    Row("I2", "horovod-416", "issue body", "ResNet-101, 16 V100 (2 servers of 8, PCIe), 40 Gb RoCE",
        "images_per_s", 2379.56, _keys("resnet101", 16, 8, 64, 202.78, gpu="v100-pcie", preset="40gbe-roce",
                                        library="horovod", protocol__allreduce_algorithm="ring"), 202.78,
        mechanism="as I1, and the 8 GPUs of a server sit under two switches on the two CPUs, so the ring also "
        "crosses QPI, where a step goes through host memory: the row exposes 114.7 ms (2.92 GB/s of bus "
        "bandwidth if unoverlapped); missing: a measured all-reduce rate of such a server, and RoCE's below "
        "line rate"),
    Row("T1", TFB, DGX_SYN, "VGG-16, 4 P100 (NVLink), NCCL replicated", "images_per_s", 584,
        _tf_dgx("vgg16", 4, 64, 154), 154),
    Row("T2", TFB, DGX_SYN, "VGG-16, 8 P100 (NVLink), NCCL replicated", "images_per_s", 1081,
        _tf_dgx("vgg16", 8, 64, 154), 154),
    Row("T3", TFB, DGX_SYN, "VGG-16, 2 P100 (NVLink), NCCL replicated", "images_per_s", 295,
        _tf_dgx("vgg16", 2, 64, 154), 154),
    Row("T4", TFB, DGX_SYN, "AlexNet, 2 P100, batch 512, NCCL replicated", "images_per_s", 5658,
        _tf_dgx("alexnet", 2, 512, 2987), 2987),
    Row("T5", TFB, DGX_SYN, "AlexNet, 4 P100, batch 512, NCCL replicated", "images_per_s", 10509,
        _tf_dgx("alexnet", 4, 512, 2987), 2987),
    Row("T6", TFB, DGX_SYN, "AlexNet, 8 P100, batch 512, NCCL replicated", "images_per_s", 17822,
        _tf_dgx("alexnet", 8, 512, 2987), 2987),
    Row("T7", TFB, DGX_SYN + " (batch 32)", "VGG-16, 2 P100, batch 32, NCCL replicated", "images_per_s", 281,
        _tf_dgx("vgg16", 2, 32, 144), 144,
        mechanism="over-predicted: the overlap slowdown calibrated from PyTorch DDP's 2-GPU lines on V100s "
        "(3.6 %), extended to TensorFlow on P100s, is more than these 2 P100s lose (2.5 % in all: 5.5 ms per "
        "iteration, of a 30.2 ms ring at one NVLink's 18.31 GB/s)"),
    Row("T8", TFB, DGX_SYN + " (batch 32)", "VGG-16, 4 P100, batch 32, NCCL replicated", "images_per_s", 549,
        _tf_dgx("vgg16", 4, 32, 144), 144),
    Row("T9", TFB, DGX_SYN + " (batch 32)", "VGG-16, 8 P100, batch 32, NCCL replicated", "images_per_s", 820,
        _tf_dgx("vgg16", 8, 32, 144), 144),
    Row("E1", TFB, EC2_DIST, "Inception V3, 8 K80 (1 p2.8xlarge), 1 PS, gRPC", "images_per_s", 229,
        _tf_ec2("inception_v3", 8, 64, 29.7, 1), 29.7),
    Row("E2", TFB, EC2_DIST, "Inception V3, 16 K80 (2 machines, 2 PS), 10 GbE", "images_per_s", 459,
        _tf_ec2("inception_v3", 16, 64, 29.7, 2), 29.7, mechanism=K80_OVER),
    Row("E3", TFB, EC2_DIST, "Inception V3, 32 K80 (4 machines, 4 PS)", "images_per_s", 902,
        _tf_ec2("inception_v3", 32, 64, 29.7, 4), 29.7),
    Row("E4", TFB, EC2_DIST, "Inception V3, 64 K80 (8 machines, 6 PS)", "images_per_s", 1783,
        _tf_ec2("inception_v3", 64, 64, 29.7, 6), 29.7),
    Row("E5", TFB, EC2_DIST, "ResNet-50, 8 K80 (1 machine, 1 PS)", "images_per_s", 378,
        _tf_ec2("resnet50", 8, 64, 52.4, 1), 52.4),
    Row("E6", TFB, EC2_DIST, "ResNet-50, 16 K80 (2 machines, 2 PS)", "images_per_s", 751,
        _tf_ec2("resnet50", 16, 64, 52.4, 2), 52.4),
    Row("E7", TFB, EC2_DIST, "ResNet-50, 32 K80 (4 machines, 4 PS)", "images_per_s", 1388,
        _tf_ec2("resnet50", 32, 64, 52.4, 4), 52.4),
    Row("E8", TFB, EC2_DIST, "ResNet-50, 64 K80 (8 machines, 8 PS)", "images_per_s", 2744,
        _tf_ec2("resnet50", 64, 64, 52.4, 8), 52.4),
    Row("E9", TFB, EC2_DIST, "ResNet-152, 8 K80 (1 machine, 1 PS), batch 32", "images_per_s", 146,
        _tf_ec2("resnet152", 8, 32, 19.4, 1), 19.4),
    Row("E10", TFB, EC2_DIST, "ResNet-152, 16 K80 (2 machines, 2 PS), batch 32", "images_per_s", 291,
        _tf_ec2("resnet152", 16, 32, 19.4, 2), 19.4),
    Row("E11", TFB, EC2_DIST, "ResNet-152, 32 K80 (4 machines, 4 PS), batch 32", "images_per_s", 565,
        _tf_ec2("resnet152", 32, 32, 19.4, 4), 19.4),
    Row("E12", TFB, EC2_DIST, "ResNet-152, 64 K80 (8 machines, 4 PS), batch 32", "images_per_s", 981,
        _tf_ec2("resnet152", 64, 32, 19.4, 4), 19.4),
    Row("E13", TFB, EC2_DIST + " (batch 32)", "Inception V3, 8 K80 (1 machine, 1 PS), batch 32", "images_per_s",
        219, _tf_ec2("inception_v3", 8, 32, 29.2, 1), 29.2),
    Row("E14", TFB, EC2_DIST + " (batch 32)", "Inception V3, 16 K80 (2 machines, 2 PS), batch 32", "images_per_s",
        427, _tf_ec2("inception_v3", 16, 32, 29.2, 2), 29.2),
    Row("E15", TFB, EC2_DIST + " (batch 32)", "Inception V3, 32 K80 (4 machines, 4 PS), batch 32", "images_per_s",
        820, _tf_ec2("inception_v3", 32, 32, 29.2, 4), 29.2),
    Row("E16", TFB, EC2_DIST + " (batch 32)", "Inception V3, 64 K80 (8 machines, 6 PS), batch 32", "images_per_s",
        1608, _tf_ec2("inception_v3", 64, 32, 29.2, 6), 29.2),
    Row("E17", TFB, EC2_DIST + " (batch 32)", "ResNet-50, 8 K80 (1 machine, 1 PS), batch 32", "images_per_s",
        333, _tf_ec2("resnet50", 8, 32, 48.4, 1), 48.4),
    Row("E18", TFB, EC2_DIST + " (batch 32)", "ResNet-50, 16 K80 (2 machines, 2 PS), batch 32", "images_per_s",
        667, _tf_ec2("resnet50", 16, 32, 48.4, 2), 48.4),
    Row("E19", TFB, EC2_DIST + " (batch 32)", "ResNet-50, 32 K80 (4 machines, 4 PS), batch 32", "images_per_s",
        1180, _tf_ec2("resnet50", 32, 32, 48.4, 4), 48.4),
    Row("E20", TFB, EC2_DIST + " (batch 32)", "ResNet-50, 64 K80 (8 machines, 4 PS), batch 32", "images_per_s",
        2315, _tf_ec2("resnet50", 64, 32, 48.4, 4), 48.4),
    Row("N1", "nvidia-dle-rn50", "'Training performance: DGX-1 16GB'", "ResNet-50, 8 V100, FP32, batch 112",
        "images_per_s", 2855, _dle("resnet50", 8, 112, 367, "v100"), 367),
    Row("N2", "nvidia-dle-rn50", "'Training performance: DGX-1 16GB'", "ResNet-50, 8 V100, AMP, batch 256",
        "images_per_s", 8322, _dle("resnet50", 8, 256, 1200, "v100", "mixed"), 1200,
        mechanism="not the all-reduce: the README's results use PyTorch's native AMP (its changelog: February 2021, "
        "moved from APEX AMP to native AMP; results in the pytorch-21.03 container), which keeps float32 "
        "gradients, so DDP reduces the same 102 MB as in FP32: the unoverlapped ring over NVLink is 1.5 ms of"
        " the 32.8 ms per iteration this row exposes (N4: 0.8 of 19.6 ms). The benchmark reads real JPEGs with "
        "PyTorch's DataLoader, not DALI (dle-rn50-loader: at the commit that published the rows configs.yml sets "
        "data_backend pytorch and 8 loader processes per GPU on DGX-1V, 16 on DGX A100, and benchmark_training "
        "keeps that backend): PIL decodes and torchvision crops, resizes and flips every image in the workers, so "
        "8 GPUs' 64 processes share the node's two 20-core Xeons where one GPU had them alone, and at AMP's "
        "2.6-3.3 times faster compute (the README's speedups) that node cap is what we believe binds. Missing: "
        "that pipeline's rate on a DGX-1 or DGX A100 measured apart from these rows (cluster.input.samples_per_s "
        "would take it; the rows' own 8,322 and 16,621 img/s are what is predicted); searched: "
        "DeepLearningExamples' READMEs, NVIDIA's 'Case Study: ResNet50 with DALI', Mohan et al. (VLDB 2021), "
        "FFCV's benchmarks, DALI, timm and PyTorch issues; found only other loaders' rates on a DGX-1 "
        "(tensorpack's Python dataflow 5.6k img/s, tf.data 10k; docs/hardware.md)"),
    Row("N3", "nvidia-dle-rn50", "'Training performance: DGX A100'", "ResNet-50, 8 A100, TF32, batch 256",
        "images_per_s", 7248, _dle("resnet50", 8, 256, 938, "a100"), 938),
    Row("N4", "nvidia-dle-rn50", "'Training performance: DGX A100'", "ResNet-50, 8 A100, AMP, batch 256",
        "images_per_s", 16621, _dle("resnet50", 8, 256, 2470, "a100", "mixed"), 2470,
        mechanism="as N2: 8 × 2,470 img/s of decoding and augmentation per node, by 128 loader processes (16 "
        "per GPU); the ring is 0.8 of the 19.6 ms per iteration the row exposes (at the measured 232.54 GB/s of "
        "bus bandwidth)"),
    Row("S1", "sgp-paper", "abstract", "SGP, 32 nodes × 8 V100, 10 GbE, 90 epochs",
        "hours", 1.6, _sgp("sgp"), 8 * 367, calibrated="TCP effective bandwidth "
        f"{SGP_BANDWIDTH * 8 / 1e9:.2f} Gbit/s, from this row", fitted=True, single_from=SGP_SINGLE),
    Row("S2", "sgp-paper", "abstract", "AllReduce-SGD, 32 nodes × 8 V100, 10 GbE, 90 epochs",
        "hours", 5.0, _sgp("allreduce", "recursive_doubling"), 8 * 367, bound="lower",
        calibrated="the same bandwidth (row S1)", single_from=SGP_SINGLE),
)


@dataclass
class Result:
    """A row's prediction (seconds per iteration) and the two baselines'."""

    row: Row
    sec_per_iter: float
    alpha_beta_s: float
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def published_s(self) -> float:
        return self.row.seconds(self.row.published)

    @property
    def predicted(self) -> float:
        return self.row.value(self.sec_per_iter)

    def total_error(self, seconds: float) -> float:
        """Relative error of an iteration time on the published one; 0 when a lower bound is met."""
        pub = self.published_s
        if self.row.bound == "lower" and seconds >= pub:
            return 0.0
        return (seconds - pub) / pub

    def overhead(self, seconds: float) -> float:
        """``t_N / t_1 − 1`` of an iteration time."""
        return seconds / self.row.t1 - 1.0

    def overhead_error(self, seconds: float) -> float | None:
        """Relative error of the overhead; 0 when a lower bound is met; None when the published
        overhead is not positive (no relative error of it exists)."""
        pub = self.overhead(self.published_s)
        if self.row.bound == "lower" and seconds >= self.published_s:
            return 0.0
        if pub <= 0:
            return None
        return (self.overhead(seconds) - pub) / pub

    @property
    def error(self) -> float:
        """The prediction's error on the published figure's iteration time."""
        return self.total_error(self.sec_per_iter)

    def model_seconds(self, model: str) -> float:
        return {"ddlsim": self.sec_per_iter, "linear": self.row.t1, "alpha-beta": self.alpha_beta_s}[model]


MODELS = ("ddlsim", "linear", "alpha-beta")


def _point(keys: dict[str, Any]) -> dict[str, Any]:
    lam, mu = keys["cluster.learners"], keys["cluster.minibatch"]
    its = RANDOM_PULL_ITERATIONS if keys.get("cluster.server.pull") == "layerwise-random" else ITERATIONS
    lines = ["name = \"published\"", "[workload]", "epochs = 1", f"samples_per_epoch = {lam * mu * its}"]
    sets = [f"{k}={v!r}".replace("'", '"') if isinstance(v, str) else f"{k}={v!r}" for k, v in keys.items()]
    return load_text("\n".join(lines), "<published>", sets).points()[0]


def alpha_beta(row: Row) -> float:
    """The textbook baseline: compute + 2(N−1)/N · B/β for a ring (all-reduce, gossip), compute
    + 2B/β for a parameter server; β the bottleneck link as the presets state it (the network
    preset's NIC across nodes, or the row's own bandwidth where it sets one; the GPU preset's
    intra-node link on one node), B the model's float32 gradient. The ring formula stands for
    every all-reduce row, whatever its algorithm."""
    k, cat = row.keys, catalogue()
    nbytes = 4.0 * param_count(k["workload.model"], dataset_info("imagenet"))
    if row.nodes > 1:
        nominal = cat["network"][k["cluster.network.preset"]]["bandwidth_Bps"]
        beta = float(k.get("cluster.network.bandwidth_Bps", nominal))
    else:
        beta = float(cat["intra"][cat["gpu"][k["cluster.gpu"]]["intra"]]["bandwidth_Bps"])
    n = row.gpus
    comm = 2.0 * nbytes / beta if k["protocol.name"] in PS_PROTOCOLS else 2.0 * (n - 1) / n * nbytes / beta
    return row.t1 + comm


def predict(row: Row, extra: dict[str, Any] | None = None) -> Result:
    """Simulate ``row``'s setting (with the keys ``extra`` added); its iteration time and the
    alpha-beta baseline's."""
    point = _point({**row.keys, **(extra or {})})
    sim = simulate(point)
    iterations = sim.summary["gradients"] / point["cluster"]["learners"]
    return Result(row, sim.summary["sim_time_s"] / iterations, alpha_beta(row))


def scores(results: list[Result]) -> dict[str, dict[str, float]]:
    """Per model: median and mean |error| on the total and on the overhead, the rank
    correlation of predicted and published overhead, over the counted rows."""
    counted = [r for r in results if not r.row.fitted]
    out = {}
    for m in MODELS:
        tot = [abs(r.total_error(r.model_seconds(m))) for r in counted]
        ovh = [abs(e) for r in counted if (e := r.overhead_error(r.model_seconds(m))) is not None]
        scored = [r for r in counted if r.overhead_error(r.model_seconds(m)) is not None]
        rho = spearman([r.overhead(r.published_s) for r in scored], [r.overhead(r.model_seconds(m)) for r in scored])
        out[m] = {"total_median": statistics.median(tot), "total_mean": statistics.mean(tot),
                  "overhead_median": statistics.median(ovh), "overhead_mean": statistics.mean(ovh),
                  "spearman": rho, "overhead_rows": float(len(ovh))}
    single = [r for r in counted if r.row.nodes == 1 and r.overhead(r.published_s) > 0]
    ratios = [r.overhead(r.sec_per_iter) / r.overhead(r.published_s) for r in single]
    out["single_node"] = {"rows": float(len(single)),
                          "within_1_5": float(sum(1 / 1.5 <= q <= 1.5 for q in ratios)),
                          "median_ratio": statistics.median(ratios) if ratios else math.nan}
    return out


def _fmt(metric: str, v: float) -> str:
    return {"sec_per_iter": f"{v:.3f} s/iter", "images_per_s": f"{v:,.0f} img/s", "efficiency": f"{v:.0%}",
            "hours": f"{v:.2f} h"}[metric]


def single(row: Row) -> str:
    """The single-GPU figure a row's overhead is measured from, as its source states it."""
    if row.single_from:
        return row.single_from
    return f"{row.t1:.3f} s/iter" if row.metric == "sec_per_iter" else f"{row.single_per_s:,.4g} img/s"


def _pct(x: float | None) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.0%}"


RULE = [
    "## Which rows, decided before any prediction",
    "",
    "A row is a published iteration time, throughput or scaling efficiency of N > 1 GPUs whose source",
    "also states the single-GPU throughput (the compute model) and the setting: GPU, GPUs per node,",
    "network, library and protocol. From TensorFlow's benchmark page (tf-benchmarks) every",
    "synthetic-data entry with N > 1 of the two tables whose setting ddlsim's presets state: the",
    "DGX-1 (P100) models run with replicated variables and NCCL (VGG-16, AlexNet; both batch",
    "tables) and the EC2 distributed (K80) tables (distributed_replicated over gRPC, both batch",
    "tables). Left out by the same rule: the real-data tables (their input pipeline's capacity is",
    "not stated), the DGX-1 table's `parameter_server` models (`local_parameter_device = cpu`: a",
    "parameter server on the host, reached over PCIe) and the single-machine K80 tables of GCE and",
    "EC2 (`parameter_server` or `replicated` without NCCL), modes for which no preset exists (this",
    "sentence's wording was made exact; the rule is unchanged). Every row stays",
    "in the table whatever its error; a row whose published overhead is not positive has no",
    "relative overhead error and leaves the overhead statistics only (none does today). The SGP rows",
    "(S1, S2) came before this rule, among the first 22: the SGP paper states no single-GPU rate, so",
    "theirs is NVIDIA's V100 figure (the 1 GPU column says so); S1 is the calibration point and leaves",
    "the statistics; S2's published figure is a lower bound (over 5 h), and a prediction that meets it",
    "counts as an error of 0.",
]


# the benchmark page's single-GPU InceptionV3 rate on a p2.8xlarge: 29.7 img/s in the distributed
# table, 30.8 in the single-machine one
INCEPTION_T1_SPREAD = 30.8 / 29.7 - 1


def noise_lines(results: list[Result]) -> list[str]:
    """How far the published figures' own precision moves the overhead errors: the DDP benchmark's
    times, printed to the millisecond, and the EC2 page's two single-GPU rates of one model."""
    out = ["## Noise in the published figures", ""]
    ms = [r for r in results if r.row.metric == "sec_per_iter"]
    if ms:
        parts = []
        for r in ms:
            t1, tn, half = r.row.t1, r.published_s, 0.0005
            lo, hi = (tn - half) / (t1 + half) - 1, (tn + half) / (t1 - half) - 1
            pred = r.overhead(r.sec_per_iter)
            parts.append(f"{r.row.id} {lo:.1%}-{hi:.1%} (its error {pred / hi - 1:+.0%} to {pred / lo - 1:+.0%})")
        out.append("The DDP benchmark prints its times to the millisecond, so a published overhead is a range "
                   "(each time ± 0.5 ms): " + ", ".join(parts) + "; the statistics score the printed figures.")
    inc = [r for r in results if r.row.keys.get("protocol.library") == "tf-distributed-replicated"
           and r.row.keys["workload.model"] == "inception_v3"
           and r.overhead(r.published_s) < 2 * INCEPTION_T1_SPREAD]
    if inc:
        ids = ", ".join(r.row.id for r in inc)
        if ms:
            out.append("")
        lo, hi = min(r.overhead(r.published_s) for r in inc), max(r.overhead(r.published_s) for r in inc)
        out.append(f"The benchmark page's single-GPU InceptionV3 rate on the same instance differs by "
                   f"{INCEPTION_T1_SPREAD:.1%} between its tables (29.7 and 30.8 img/s), which moves an overhead "
                   f"by about as many points: {ids} publish {lo:.1%}-{hi:.1%} in all, so their errors, good or "
                   "bad, are within that spread.")
    return out


def pull_order_line(results: list[Result]) -> str:
    """The distributed_replicated rows' median overhead error with the preset's replicated pull and,
    re-simulated, with the parameter_server mode's pulls, which overlap the forward: shared (tf-grpc's),
    in forward order (TicTac's enforced order) and one transfer after another in random order."""
    ps = [r for r in results if r.row.keys.get("protocol.library") == "tf-distributed-replicated"
          and not r.row.fitted]
    if not ps:
        return ""
    shared = [predict(r.row, {"cluster.server.pull": "layerwise-shared"}) for r in ps]
    forward = [predict(r.row, {"cluster.server.pull": "layerwise"}) for r in ps]
    random = [predict(r.row, {"cluster.server.pull": "layerwise-random"}) for r in ps]

    def med(rs: list[Result]) -> float:
        return statistics.median(e for r in rs if (e := r.overhead_error(r.sec_per_iter)) is not None)
    return (f"The {len(ps)} parameter-server rows' median overhead error: {med(ps):+.0%} with the replicated "
            f"pull (the preset); with the parameter_server mode's pulls instead, overlapping the forward: "
            f"{med(shared):+.0%} with the transfers sharing the link (tf-grpc's), {med(forward):+.0%} in forward "
            f"order, {med(random):+.0%} one after another in random order ({RANDOM_PULL_ITERATIONS} iterations, a "
            "mean over orders).")


# the tf-nccl rows with no all-reduce overlapping the backward: one message of the whole gradient
# after it, and no compute slowed by an overlapping ring: an explicit base_s (0, the only base_s these
# P100 rows have) keeps the library from adding its overlap slowdown to it
UNOVERLAPPED = {"protocol.bucket_bytes": 0, "cluster.compute.base_s": 0.0}


def nccl_wait_line(results: list[Result]) -> str:
    """The tf-nccl rows beside two limits of the overlap TensorFlow 1.x's NCCL wait leaves, at the
    modelled ring rates: the preset (every bucket's all-reduce starts when the backward produces it)
    and none overlapped (the whole ring after the backward, re-simulated with ``UNOVERLAPPED``); the
    median overhead error of each and the rows whose published overhead lies between the two."""
    rows = [r for r in results if r.row.keys.get("protocol.library") == "tf-nccl" and not r.row.fitted]
    if not rows:
        return ""
    after = {id(r): predict(r.row, UNOVERLAPPED) for r in rows}

    def med(rs: list[Result]) -> float:
        return statistics.median(e for r in rs if (e := r.overhead_error(r.sec_per_iter)) is not None)
    outside = []
    for r in rows:
        pub, lo, hi = (r.overhead(s) for s in (r.published_s, r.sec_per_iter, after[id(r)].sec_per_iter))
        if pub > max(lo, hi):
            outside.append(f"{r.row.id} above both")
        elif pub < min(lo, hi):
            outside.append(f"{r.row.id} below both")
    between = len(rows) - len(outside)
    return (f"The {len(rows)} tf-nccl rows' median overhead error: {med(rows):+.0%} with every 25 MiB "
            f"bucket's all-reduce started as the backward produces it (the preset), "
            f"{med(list(after.values())):+.0%} with the whole ring after the backward and no compute slowed by "
            "it; the published overhead lies between the two in "
            f"{between} of {len(rows)}" + (f" ({', '.join(outside)})" if outside else "") + ".")


def uncalibrated_gpu_line(results: list[Result]) -> str:
    """The scores with the GPU presets' calibrated multi-GPU slowdown left out: the rows it
    applies to re-simulated with ``cluster.compute.multi_gpu_slowdown = 0``."""
    touched = [r for r in results if gpu_slowdown(r.row)]
    if not touched:
        return ""
    plain = {id(r): predict(r.row, {"cluster.compute.multi_gpu_slowdown": 0.0}) for r in touched}
    both = scores([plain.get(id(r), r) for r in results])
    sc, sn = both["ddlsim"], both["single_node"]
    return (f" Without it (the {len(touched)} K80 rows re-simulated without the slowdown): overhead median "
            f"|error| {sc['overhead_median']:.0%} (mean {sc['overhead_mean']:.0%}), rank correlation "
            f"{sc['spearman']:.2f}, total median {sc['total_median']:.1%} (mean {sc['total_mean']:.1%}), "
            f"{int(sn['within_1_5'])} of {int(sn['rows'])} single-node rows within a factor 1.5.")


def note(results: list[Result]) -> str:
    """docs/published-validation.md."""
    counted = [r for r in results if not r.row.fitted]
    sc = scores(results)
    pull_order = pull_order_line(results)
    nccl_wait = nccl_wait_line(results)
    uncalibrated = uncalibrated_gpu_line(results)
    d, lin, ab, sn = sc["ddlsim"], sc["linear"], sc["alpha-beta"], sc["single_node"]
    lines = [
        "# ddlsim against published measurements",
        "",
        "Generated by `python -m ddlsim.scenarios.published --out docs/published-validation.md` (every",
        "row one simulation; sources in",
        "[docs/hardware.md](hardware.md)). Each row predicts a published figure of a real cluster",
        "from the setting its source states, written as a user writes it (`cluster.gpu`,",
        "`cluster.gpus_per_node`, `cluster.network.preset`, `protocol.library`, the protocol and",
        "bucket keys) and the compute time of one GPU **as the same source reports it**. What is",
        "scored first is what distribution adds: the **overhead** `t_N / t_1 − 1`, with `t_1` the",
        "source's single-GPU iteration time.",
        "",
        f"**{len(counted)} predicted rows (and one calibration point) from "
        f"{len({r.row.source for r in results})} sources. On the overhead: ddlsim's median |error| "
        f"{d['overhead_median']:.0%} (mean {d['overhead_mean']:.0%}), rank correlation with the published "
        f"overhead {d['spearman']:.2f}; alpha-beta without overlap {ab['overhead_median']:.0%} (mean "
        f"{ab['overhead_mean']:.0%}, rank correlation {ab['spearman']:.2f}); perfect linear scaling 100 %. "
        f"On the total: ddlsim {d['total_median']:.1%} median (mean {d['total_mean']:.1%}), alpha-beta "
        f"{ab['total_median']:.1%} ({ab['total_mean']:.1%}), linear {lin['total_median']:.1%} "
        f"({lin['total_mean']:.1%}). Single-node rows: {int(sn['within_1_5'])} of {int(sn['rows'])} within a "
        f"factor 1.5 of the published overhead (median ratio {sn['median_ratio']:.2f}).**",
        "",
        "| model | overhead: median \\|error\\| | mean | rank correlation | total: median \\|error\\| | mean |",
        "|---|---|---|---|---|---|",
    ]
    for m in MODELS:
        s = sc[m]
        rho = "—" if math.isnan(s["spearman"]) else f"{s['spearman']:.2f}"
        lines.append(f"| {m} | {s['overhead_median']:.0%} | {s['overhead_mean']:.0%} | {rho} | "
                     f"{s['total_median']:.1%} | {s['total_mean']:.1%} |")
    lines += [
        "",
        "Goals (issue): overhead median ≤ 30 %, rank correlation ≥ 0.8, single-node overheads within a",
        "factor 1.5, total median ≤ 5 %, ahead of both baselines on the overhead. "
        + ("Met." if (d["overhead_median"] <= 0.30 and d["spearman"] >= 0.8 and sn["within_1_5"] == sn["rows"]
                       and d["total_median"] <= 0.05 and d["overhead_median"] < ab["overhead_median"])
           else "Not all met: the table says which rows miss and the mechanism each lacks."),
        "",
        "| id | source | setting | 1 GPU | published | ddlsim | overhead: published | ddlsim | error | alpha-beta | "
        "total error | calibrated |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        pub = ("≥ " if r.row.bound == "lower" else "") + _fmt(r.row.metric, r.row.published)
        oe = r.overhead_error(r.sec_per_iter)
        lines.append(
            f"| {r.row.id} | {r.row.source} ({r.row.where}) | {r.row.what} | {single(r.row)} | {pub} | "
            f"{_fmt(r.row.metric, r.predicted)} | "
            f"{r.overhead(r.published_s):.1%} | {r.overhead(r.sec_per_iter):.1%} | {_pct(oe)} | "
            f"{r.overhead(r.alpha_beta_s):.1%} | {r.error:+.1%} | {calibration(r.row) or '—'} |")
    missed = [r for r in counted if (e := r.overhead_error(r.sec_per_iter)) is not None and abs(e) > 0.25]
    lines += ["", "## Rows whose overhead the model misses by more than 25 %, and the mechanism it lacks", ""]
    groups: dict[str, list[Result]] = {}
    for r in missed:
        groups.setdefault(missing(r.row), []).append(r)
    lines += ["* " + ", ".join(f"**{r.row.id}** ({_pct(r.overhead_error(r.sec_per_iter))})" for r in rs)
              + f": {text}." for text, rs in groups.items()]
    lines += ["", *noise_lines(counted), "", *RULE, "",
              "## The mechanisms and the baselines", "",
              "Each row's library preset (docs/hardware.md, `scenarios/libraries.toml`) supplies: the",
              "bucket; the achievable share of the intra-node link in a collective (NCCL's ~20 % protocol",
              "overhead, of a nominal link rate: the A100 preset's link is a measured bus bandwidth, which it",
              "does not reduce again); DDP's own per-iteration cost per parameter and one GPU's iteration-time",
              "spread (both from the DDP benchmark's 1-GPU lines, not from its rows); Horovod's negotiation",
              "cycle; the gRPC stack's effective bandwidth (800 MB/s on the 10 GbE preset, 762 MB/s with the",
              "copy between GPU and host memory below). The parameter-server rows add the in-machine",
              "aggregation (`cluster.server.aggregation = \"machine\"`), shards on the worker machines",
              "(`cluster.server.placement = \"colocated\"`) and, from `tf-distributed-replicated` (the rows'",
              "`variable_update`), the replicated pull (`cluster.server.pull = \"replicated\"`: every GPU keeps",
              "a copy of the weights, so the gradient goes out piece by piece in backward order as backward",
              "produces it, a piece per layer of the model (its weight, bias and batch-norm vectors), each",
              "ready when backward has done its layers' multiply-adds; a piece is pulled back to every",
              "machine once every machine's push of it has been applied (tf_cnn_benchmarks' barrier per",
              "variable), its transfers sharing the server's NIC (gRPC, tf-grpc-concurrent), and the next",
              "forward starts when the last piece, the first layer, has arrived; `tf-grpc`, the",
              "`parameter_server` mode, has the layer-wise pull instead, overlapping the forward: every",
              "variable's receive issued at a step's start, those in flight sharing each link equally",
              "(`\"layerwise-shared\"`; TicTac, MLSys 2019, describes the overlap, forward order its best case)),",
              "each message's copy between GPU and host memory at the node's PCIe bandwidth before the wire",
              "(TensorFlow's RecvTensor fills a host proto from GPU memory first), and the parameter servers'",
              "apply on the CPU (plain SGD, tf_cnn_benchmarks' default: 12 bytes read and written per",
              "parameter at the p2's 76.8 GB/s peak memory bandwidth). " + pull_order + " `tf-nccl`'s ring moves at "
              "one NVLink's rate,",
              "18.31 GB/s (a P100 link measured by p2pBandwidthLatencyTest; NCCL 1 builds one ring, each step",
              "over one link: nccl1-one-link), and on more than 4 GPUs of a node at most 10 GB/s of bus",
              "bandwidth: TensorFlow 1.x built tf.contrib.nccl from",
              "the open-source NCCL 1, whose device-order ring leaves a DGX-1's NVLink quads, and a user",
              "measured that NCCL 1 under 10 GB/s on a DGX-1 (nccl-76; an upper bound, measured apart from",
              "these rows). " + nccl_wait,
              "Three figures are **calibrated**, and labelled so: the SGP rows' TCP bandwidth",
              "(from row S1, which leaves the statistics; below);",
              "`overlap_slowdown` (3.6 %, compute slowed while NCCL all-reduces overlap backward), from the",
              "DDP benchmark's 2-GPU lines of ResNeXt-50 and ResNeXt-101, which are not rows; it applies to",
              "every NCCL-based library (nccl, horovod, tf-nccl) with N > 1, an extension beyond DDP on V100.",
              "And the k80 preset's `multi_gpu_slowdown` (+3.39 % compute whenever a node runs more than one",
              "K80; `cluster.compute.multi_gpu_slowdown`; k80-two-gpu-loss): the benchmark page's single-machine",
              "EC2 K80 tables, which are not rows (one machine, parameter_server or replicated without NCCL),",
              "take 4.0-10.0 % longer per iteration at 2 GPUs than at 1 in every model; less the in-machine",
              "transfer ddlsim itself charges two GPUs, the median is ResNet-152's 3.39 %. What makes the loss",
              "is not identified (no measurement of a K80 die's clock with its board's other die loaded was",
              "found), so it is a calibration, and the E rows' calibrated column says so. Tried on the rows",
              "before this rule was fixed: 5 % and 4.79 % (the median with the transfer left in); the review",
              "that proposed the subtraction had scored shares of 3-8 % on the rows. The 2-GPU entries are",
              "the ones farthest from the rows (a machine of 8 is the E rows' own node); the same rule gives",
              "4.32 % at 4 GPUs and 6.37 % at 8, less 3(g − 1)/g × the gradient over PCIe (GCE: 4.07, 5.97,",
              "6.79 %): the excess grows with the GPUs",
              "of a node, which one share does not follow." + uncalibrated,
              "The rows state `cluster.compute.per_sample_s` (the source's single-GPU rate), so the GPU",
              "preset's two-batch-size line does not enter them (the k80 slowdown does).",
              "",
              "Alpha-beta: the single-GPU time plus 2(N−1)/N · B/β (ring) or 2B/β (parameter server), β the",
              "link as the presets state it (the network preset's NIC across nodes, a line rate or a measured",
              "TCP rate by preset, or the row's own bandwidth where it sets one, as S1-S2 do; the GPU preset's",
              "link on one node, nominal or, for the A100, a measured bus bandwidth), B the float32 gradient.",
              "The ring formula stands for every all-reduce row: S2 runs recursive doubling, whose textbook",
              "cost, 5B/β on 32 nodes, would put alpha-beta at ddlsim's figure there (1846 %).",
              "Linear: the single-GPU time (overhead 0, error −100 %). The SGP rows: 32",
              "nodes of 8 V100s, each node one process, with the 10 GbE TCP bandwidth calibrated from S1",
              "(S1 leaves the statistics) — see docs/decentralized.md for the whole SGP table."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddlsim.scenarios.published", description=__doc__.splitlines()[0])
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--out", help="the note to write (the repository's: docs/published-validation.md)")
    what.add_argument("--print", action="store_true", help="print the note instead of writing it")
    args = ap.parse_args(argv)
    results = [predict(row) for row in ROWS]
    text = note(results)
    if args.print:
        print(text)
        return 0
    try:
        print(f"note: {atomic_write(args.out, text)}")
    except OSError as e:
        print(f"error: --out {args.out!r}: cannot write the note ({e.strerror or e})", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
