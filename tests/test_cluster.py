"""Real clusters: gradient buckets overlapped with backward, per-message cost, GPUs per node,
all-reduce algorithms, symmetric gossip schedules — each against a closed form written here."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ddlsim.simulator import trace as T
from ddlsim.simulator.collectives import Fabric, allreduce_time
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

M = 25_557_032 * 4  # ResNet-50 gradient bytes


def ar_point(nodes: int, *, g: int = 1, compute: float = 0.3, bucket: int = 0, algorithm: str | None = None,
             lat: float = 5e-5, bw: float = 1.25e9, o: float = 0.0, step: float = 0.0, bf: float = 2 / 3,
             ilat: float = 3e-6, ibw: float = 1.5e11, iters: int = 4, proto: str = "allreduce", **sets) -> dict:
    workers = nodes * g
    spe = 256 * workers * iters
    toml = f"""
seed = 1
[workload]
dataset = "imagenet"
model = "resnet50"
epochs = 1
samples_per_epoch = {spe}
[cluster]
learners = {workers}
minibatch = 256
gpus_per_node = {g}
[cluster.compute]
distribution = "deterministic"
base_s = {compute}
per_sample_s = 0.0
backward_fraction = {bf}
step_s = {step}
[cluster.network]
latency_s = {lat}
bandwidth_Bps = {bw}
overhead_s = {o}
intra_latency_s = {ilat}
intra_bandwidth_Bps = {ibw}
[protocol]
name = "{proto}"
bucket_bytes = {bucket}
"""
    if algorithm:
        toml += f'allreduce_algorithm = "{algorithm}"\n'
    return make_point(toml, **sets)


def per_iteration(point: dict) -> float:
    r = simulate(point)
    return r.summary["sim_time_s"] / (r.summary["gradients"] / point["cluster"]["learners"])


def ring(n: int, nbytes: float, lat: float, bw: float, o: float = 0.0) -> float:
    """Independent closed form: 2(n−1) steps of latency + software cost, 2(n−1)/n of the bytes."""
    return 2 * (n - 1) * (lat + o) + 2 * (n - 1) / n * nbytes / bw


def buckets(total: float, size: int) -> list[float]:
    out, left = [], total
    while left > 0:
        out.append(min(size, left))
        left -= size
    return out


def test_one_bucket_is_compute_then_one_ring_all_reduce() -> None:
    # truth: docs/design.md's AR-SGD cost, compute + 2(N−1)·α + 2(N−1)/N·M/β, with bucket_bytes 0 and
    # with a bucket larger than the model (both: one message after backward)
    for bucket in (0, 2 * M):
        p = ar_point(8, bucket=bucket)
        assert per_iteration(p) == pytest.approx(0.3 + ring(8, M, 5e-5, 1.25e9), rel=1e-12)


def test_overlap_hides_all_but_the_last_bucket_when_backward_is_longer() -> None:
    # truth: each bucket's all-reduce is shorter than the backward time left after it, so the
    # iteration is forward + backward + the last bucket's all-reduce (+ the optimizer step)
    size = 10 * 2**20
    sizes = buckets(M, size)
    p = ar_point(4, compute=2.0, bucket=size, bw=1.25e10, step=0.01)
    per_bucket_bwd = [2.0 * (2 / 3) * b / M for b in sizes]
    assert all(ring(4, b, 5e-5, 1.25e10) < t for b, t in zip(sizes[:-1], per_bucket_bwd[1:]))
    expect = 2.0 + ring(4, sizes[-1], 5e-5, 1.25e10) + 0.01
    assert per_iteration(p) == pytest.approx(expect, rel=1e-9)


def test_communication_bound_iteration_is_first_bucket_then_every_all_reduce() -> None:
    # truth: the all-reduces are longer than the backward between buckets, so they run back to
    # back from the first bucket's production: forward + its share of backward + Σ all-reduces
    size = 25 * 2**20
    sizes = buckets(M, size)
    p = ar_point(8, compute=0.2, bucket=size, bw=1.25e9, o=2e-4)
    first = 0.2 / 3 + 0.2 * (2 / 3) * sizes[0] / M
    expect = first + sum(ring(8, b, 5e-5, 1.25e9, 2e-4) for b in sizes)
    assert per_iteration(p) == pytest.approx(expect, rel=1e-9)


def hierarchical(nodes: int, g: int, nbytes: float, lat: float, bw: float, ilat: float, ibw: float,
                 o: float) -> float:
    """Independent closed form: reduce-scatter in the node, all-reduce of B/g per GPU across
    nodes (g rings sharing the NIC), all-gather in the node."""
    intra = 2 * ((g - 1) * (ilat + o) + (g - 1) / g * nbytes / ibw)
    inter = 2 * (nodes - 1) * (lat + o) + g * (2 * (nodes - 1) / nodes * (nbytes / g)) / bw
    return intra + inter


@pytest.mark.parametrize("nodes", [2, 4])
def test_hierarchical_all_reduce_is_its_alpha_beta_closed_form(nodes: int) -> None:
    f = Fabric(nodes * 8, 8, 5e-6, 1.25e10, 3e-6, 1.5e11, 1e-5)
    expect = hierarchical(nodes, 8, M, 5e-6, 1.25e10, 3e-6, 1.5e11, 1e-5)
    assert allreduce_time(f, "hierarchical", M) == pytest.approx(expect, rel=1e-12)
    # and the engine: 8 GPUs per node default to it; one bucket after compute
    p = ar_point(nodes, g=8, lat=5e-6, bw=1.25e10, o=1e-5)
    assert p["protocol"]["allreduce_algorithm"] == "hierarchical"
    assert per_iteration(p) == pytest.approx(0.3 + expect, rel=1e-9)


def test_halving_doubling_and_ring_differ_only_in_steps() -> None:
    # truth: Thakur et al. — the same bytes; 2·log2(n) steps instead of 2(n−1)
    f = Fabric(256, 1, 1e-4, 1.25e10, 0.0, math.inf, 0.0)
    b = 4e6
    hd = allreduce_time(f, "halving_doubling", b)
    assert hd == pytest.approx(2 * 8 * 1e-4 + 2 * 255 / 256 * b / 1.25e10)
    assert allreduce_time(f, "ring", b) - hd == pytest.approx((2 * 255 - 16) * 1e-4)


def test_recursive_doubling_moves_the_whole_message_each_step() -> None:
    # truth: PyTorch's TCP backend before 1.0 — ⌈log2 n⌉ full exchanges (+2 off powers of two)
    assert allreduce_time(Fabric(32, 1, 1e-4, 1e9, 0, math.inf), "recursive_doubling", 1e8) == pytest.approx(
        5 * (1e-4 + 0.1))
    assert allreduce_time(Fabric(12, 1, 1e-4, 1e9, 0, math.inf), "recursive_doubling", 1e8) == pytest.approx(
        6 * (1e-4 + 0.1))


@pytest.mark.parametrize("overlap", [0, 1])
def test_ring_dpsgd_gives_every_node_the_same_iteration_time(overlap: int) -> None:
    # truth: symmetry — on a ring every node has two neighbours and the same schedule
    p = ar_point(8, proto="dpsgd", compute=0.01, bw=1.25e9, protocol__topology="ring", protocol__overlap=overlap,
                 workload__model="resnet50")
    ops = simulate(p).trace.ops
    applies = ops["kind"] == T.APPLY
    times = [ops["t_start"][applies & (ops["node"] == i)] for i in range(8)]
    for t in times[1:]:
        assert np.allclose(t, times[0], rtol=0, atol=1e-12)


def test_dpsgd_blocking_adds_the_exchange_overlapped_hides_it() -> None:
    # truth: one-peer bipartite pairs, deterministic compute C, message time X = α + M/β (NIC out
    # then NIC in, cut at the latency): blocking C + X per iteration, overlapped max(C, X)
    X = 5e-5 + M / 1.25e9
    for compute, overlap, expect in ((0.3, 0, 0.3 + X), (0.3, 1, 0.3), (0.03, 1, X)):
        p = ar_point(8, proto="dpsgd", compute=compute, protocol__topology="bipartite_exp",
                     protocol__overlap=overlap)
        assert per_iteration(p) == pytest.approx(expect, rel=1e-6), (compute, overlap)


def test_ps_learners_on_one_node_share_its_nic() -> None:
    # truth: async, free compute, every push and pull of M bytes through one node NIC: the NIC
    # sends at most bandwidth/M pushes per second (the server's 8 shards are not the limit)
    lam = 8
    base = dict(compute=1e-4, bw=1e9, lat=0.0, proto="async", cluster__server__apply_s=0.0,
                cluster__server__shards=8, workload__model="mlp", workload__dataset="digits", iters=200)
    shared = ar_point(1, g=lam, **base)
    r = simulate(shared)
    nbytes = shared["workload"]["param_count"] * 4
    assert r.summary["gradients_per_s"] == pytest.approx(1e9 / nbytes, rel=0.02)
    alone = simulate(ar_point(lam, g=1, **base))
    assert alone.summary["gradients_per_s"] > 2.5 * r.summary["gradients_per_s"]


def test_per_message_overhead_adds_to_every_ps_message() -> None:
    # truth, by hand: one async learner, compute C, push and pull each latency + overhead +
    # M/β, apply A: cycle C + 2(α + o) + 2M/β + A
    base = dict(compute=0.01, bw=1e9, lat=1e-4, proto="async", workload__model="mlp", workload__dataset="digits",
                cluster__server__apply_s=2e-4, iters=50)
    nbytes = make_point(workload__model="mlp")["workload"]["param_count"] * 4
    for o in (0.0, 3e-4):
        r = simulate(ar_point(1, o=o, **base))
        cycle = 0.01 + 2 * (1e-4 + o) + 2 * nbytes / 1e9 + 2e-4
        assert r.summary["sim_time_s"] / r.summary["gradients"] == pytest.approx(cycle, rel=0.02)


def test_ps_buckets_overlap_the_push_with_backward() -> None:
    # truth: with buckets the push of all but the last bucket happens during backward, so a
    # communication-heavy async learner cycles faster than with one message after backward,
    # and never faster than compute + the last bucket's push + the pull
    base = dict(compute=0.3, bw=1.25e9, lat=0.0, proto="async", cluster__server__apply_s=0.0, iters=20)
    one = per_iteration(ar_point(1, bucket=0, **base))
    many = per_iteration(ar_point(1, bucket=10 * 2**20, **base))
    assert one == pytest.approx(0.3 + 2 * M / 1.25e9, rel=1e-6)
    last = buckets(M, 10 * 2**20)[-1]
    assert 0.3 + last / 1.25e9 + M / 1.25e9 - 1e-9 <= many < one


def test_infinite_bandwidth_runs_end_to_end_through_the_cli(tmp_path: Path) -> None:
    # truth: docs/scenarios.md — bandwidth_Bps = inf means free transfers; simulate and run work
    for cmd in ("simulate", "run"):
        out = tmp_path / cmd  # a run replacing the simulation's 18 points would need --force
        proc = subprocess.run([sys.executable, "-m", "ddlsim", cmd, "demo", "--out", str(out),
                               "--quiet", "--jobs", "1", "--set", "cluster.network.bandwidth_Bps=inf",
                               "--set", 'protocol.name="async"', "--set", 'optimizer.lr_policy="constant"',
                               "--set", "cluster.learners=30", "--set", "cluster.minibatch=8", "--set", "replicates=1",
                               "--no-report"] if cmd == "run" else
                              [sys.executable, "-m", "ddlsim", cmd, "demo", "--out", str(out),
                               "--quiet", "--jobs", "1", "--set", "cluster.network.bandwidth_Bps=inf",
                               "--set", "cluster.learners=[1,30]"],
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-1500:]
        assert "Traceback" not in proc.stderr
    assert (out / "summary.csv").read_text().count("\n") == 2  # header + the one run point
