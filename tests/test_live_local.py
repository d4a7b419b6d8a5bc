"""Live local SGD, DiLoCo and compressed all-reduce (backends/live_local.py).

Truths: the simulator's own trace of the point (written by its engine's loop, not by the live
schedule) for the structure of what a live run records, and the live processes' final weights
for the replay of their measured trace (the replay never sees them)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ddlsim.backends.base import RunOptions
from ddlsim.backends.live import LiveBackend
from ddlsim.backends.live_local import covers, merge, schedule
from ddlsim.backends.optim import Optimizer
from ddlsim.backends.replay import make_replayer
from ddlsim.backends.replay_local import LocalReplayer
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

COLUMNS = ("kind", "node", "version", "src_node", "src_version", "batch_index", "sample_start", "batch_size",
           "coef", "self_coef", "in_count", "epoch")


def point(**sets) -> dict:
    base = dict(cluster__learners=2, cluster__minibatch=8, workload__epochs=0.3, workload__evals_per_epoch=2,
                optimizer__name="sgd", optimizer__momentum=0.9, optimizer__lr=0.1,
                cluster__compute__distribution="deterministic", live__compute="real", live__timeout_s=60)
    base.update(sets)
    return make_point(**base)


SCHEDULES = [
    dict(protocol__name="local_sgd", protocol__local_steps=3, protocol__warmup_steps=2),
    dict(protocol__name="local_sgd", protocol__local_steps=4, protocol__compression="bf16", cluster__learners=3),
    dict(protocol__name="diloco", protocol__local_steps=4, protocol__fragments=2),
    dict(protocol__name="diloco", protocol__local_steps=5, protocol__fragments=3, cluster__learners=3),
    dict(protocol__name="diloco", protocol__local_steps=2, protocol__compression="powersgd"),
    dict(protocol__name="allreduce", protocol__compression="fp16"),
    dict(protocol__name="allreduce", protocol__compression="powersgd", protocol__powersgd_warmup=3),
    dict(protocol__name="diloco", protocol__local_steps=4, protocol__fragments=2, protocol__overlap=1),
    dict(protocol__name="diloco", protocol__local_steps=3, protocol__overlap=2, cluster__learners=3),
]


@pytest.mark.parametrize("sets", SCHEDULES)
def test_the_live_schedule_records_the_simulated_trace(sets: dict) -> None:
    # truth: the simulator's trace of the same point; the live merge sees only per-node logs
    p = point(**sets)
    assert covers(p)
    sim = simulate(p).trace
    n = p["cluster"]["learners"]
    logs: list[list[tuple]] = [[] for _ in range(n)]
    t = 0.0
    for k, is_ar, acts in schedule(p):
        for i in range(n):
            logs[i].append(("ar" if is_ar else "local", k, t, t + 0.5, t + 0.6))
        t += 1.0
        for what, f in acts:
            for i in range(n):
                logs[i].append((what, f, t, t + 0.25))
            t += 1.0
    trace = merge(p, logs, 0.0).tb.build(dict(sim.header))
    assert trace.n_ops == sim.n_ops
    for c in COLUMNS:
        assert np.array_equal(trace.ops[c], sim.ops[c]), c
    for c in ("grad_op", "weight", "staleness"):
        assert np.array_equal(trace.inputs[c], sim.inputs[c]), c


def test_allreduce_without_compression_stays_with_the_gossip_nodes() -> None:
    assert not covers(point(protocol__name="allreduce"))
    assert not covers(point(protocol__name="sgp"))


LIVE_CASES = {
    # plain local SGD after a warm-up, with momentum: weights averaged by torch's average_parameters
    # (the replay's mixes); every rank carries the warm-up's momentum into its local steps
    "local_sgd": (dict(protocol__name="local_sgd", protocol__local_steps=3, protocol__warmup_steps=2,
                       cluster__learners=3), 1e-5),
    # DiLoCo, two fragments, PowerSGD on the pseudo-gradients (error feedback, warm start per fragment)
    "diloco_powersgd": (dict(protocol__name="diloco", protocol__local_steps=4, protocol__fragments=2,
                             protocol__compression="powersgd", protocol__powersgd_rank=2), 1e-5),
    # streaming DiLoCo overlapping each fragment's all-reduce with one inner step (async all_reduce)
    "diloco_overlap": (dict(protocol__name="diloco", protocol__local_steps=4, protocol__fragments=2,
                            protocol__overlap=1), 1e-5),
    # compressed gradients: fp16 casts summed in fp16 (two nodes: gloo's sum is the replay's)
    "allreduce_fp16": (dict(protocol__name="allreduce", protocol__compression="fp16"), 1e-5),
}


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("name", sorted(LIVE_CASES))
def test_replaying_the_measured_trace_reproduces_the_live_nodes(name: str) -> None:
    sets, tol = LIVE_CASES[name]
    p = point(**sets)
    sim = simulate(p).trace
    r = LiveBackend().run(sim, p, RunOptions(device="cpu", threads=1))
    assert r.trace.header["measured"]
    for c in ("kind", "node", "version", "src_node", "src_version", "batch_index", "sample_start"):
        assert np.array_equal(r.trace.ops[c], sim.ops[c]), c
    torch.set_num_threads(1)
    rep = make_replayer(r.trace, build_model(p), load_data(p), Optimizer(p["optimizer"], 0.0), batched=False)
    assert isinstance(rep, LocalReplayer)  # (local SGD after warm-up: the nodes' optimizer states shared)
    rep.run()
    fin = rep.final_states()
    z = torch.stack([fin[i][0] for i in range(p["cluster"]["learners"])])
    assert torch.allclose(z, r.final_weights, atol=tol, rtol=0), float((z - r.final_weights).abs().max())
    assert torch.allclose(r.final_weights[0], r.final_weights[-1], atol=1e-6)  # the run ends averaged
