"""tf-grpc's host-side mechanisms of the parameter servers: every message copied between GPU and
host memory at the node's PCIe bandwidth (``staging = "host"``), and the servers' optimizer
apply on the CPU at the host's memory bandwidth (``apply_bytes_per_param``), each against the
closed form of the figures its source states."""

from __future__ import annotations

import pytest

from ddlsim.scenarios.load import load_text
from ddlsim.simulator.run import simulate

RESNET50_PARAMS = 25_557_032  # torchvision's ResNet-50 (He et al. 2016), the catalogue's resnet50
PCIE3 = 1.6e10                # hardware.toml intra.pcie3 (alibaba-nvlink)
TCP_10GBE = 1.1625e9          # hardware.toml network.10gbe-tcp (tf-issue-29)
RPC_BPS = 8e8                 # tf-grpc's RPC rate on 10 GbE: 800 MB/s between two processes (tf-issue-6116)
HOST_MEMORY = 4 * 2400e6 * 8  # one Xeon E5-2600 v4: 4 DDR4 channels at 2400 MT/s, 8 bytes each


def _point(library: str | None, extra: list[str] | None = None) -> dict:
    lib = f'library = "{library}"\n' if library else ""
    text = f"""
[workload]
dataset = "imagenet"
model = "resnet50"
epochs = 1
samples_per_epoch = 256
[cluster]
learners = 2
minibatch = 32
gpu = "k80"
[cluster.network]
preset = "10gbe-tcp"
[cluster.server]
shards = 2
[protocol]
name = "hardsync"
{lib}"""
    return load_text(text, "<t>", extra or []).points()[0]


def test_each_message_pays_a_pcie_copy_folded_into_the_bandwidth() -> None:
    # store and forward: B/β_rpc on the wire after B/PCIe of copy = B / (1 / (1/β_rpc + 1/PCIe))
    point = _point("tf-grpc")
    expected = 1.0 / (1.0 / RPC_BPS + 1.0 / PCIE3)
    assert point["cluster"]["network"]["bandwidth_Bps"] == pytest.approx(expected, rel=1e-9)  # the share to 9 digits
    assert _point(None)["cluster"]["network"]["bandwidth_Bps"] == TCP_10GBE  # no library: the preset's


def test_the_servers_apply_reads_and_writes_twelve_bytes_a_parameter_at_the_hosts_memory_bandwidth() -> None:
    # plain SGD on float32: read w and g, write w; each of the 2 shards holds half the parameters
    point = _point("tf-grpc")
    assert point["cluster"]["server"]["apply_s"] == pytest.approx(12 * RESNET50_PARAMS / 2 / HOST_MEMORY, rel=1e-12)
    assert _point(None)["cluster"]["server"]["apply_s"] == 1e-4  # the schema default without a library


def test_explicit_keys_win_over_both_mechanisms() -> None:
    point = _point("tf-grpc", ["cluster.network.bandwidth_Bps=1e9", "cluster.server.apply_s=0.002"])
    assert point["cluster"]["network"]["bandwidth_Bps"] == 1e9
    assert point["cluster"]["server"]["apply_s"] == 0.002


def test_the_apply_time_enters_the_iteration_as_the_closed_form() -> None:
    """By hand, one learner, one shard, whole pull, one bucket, no latency: an iteration is the
    pull (B/β), the compute W, the push (B/β) and the apply; the apply the library sets."""
    text = """
[workload]
dataset = "imagenet"
model = "resnet50"
epochs = 1
samples_per_epoch = 96
[cluster]
learners = 1
minibatch = 32
gpu = "k80"
[cluster.compute]
per_sample_s = 0.01
base_s = 0.0
[cluster.network]
preset = "10gbe-tcp"
latency_s = 0.0
overhead_s = 0.0
[cluster.server]
pull = "whole"
[protocol]
name = "hardsync"
library = "tf-grpc"
bucket_bytes = 0
"""
    point = load_text(text).points()[0]
    beta = 1.0 / (1.0 / RPC_BPS + 1.0 / PCIE3)
    nbytes = 4.0 * RESNET50_PARAMS
    apply = 12 * RESNET50_PARAMS / HOST_MEMORY
    iteration = 2 * nbytes / beta + 32 * 0.01 + apply
    assert simulate(point, "simpy").summary["sim_time_s"] == pytest.approx(3 * iteration, rel=1e-9)
