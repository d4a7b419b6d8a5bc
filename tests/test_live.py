"""The live backend: real processes over torch.distributed (gloo on 127.0.0.1), λ ≤ 4."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from ddlsim.backends.base import BackendError, RunOptions
from ddlsim.backends.live import LiveBackend, calibrated_latency
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.optim import Optimizer
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.simulator.dataorder import SampleStream
from ddlsim.simulator.mixing import symmetric_matrix
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

BASE = """
seed = 5
[workload]
epochs = {epochs}
[cluster]
learners = {learners}
minibatch = {mb}
[cluster.compute]
distribution = "{dist}"
base_s = {base}
per_sample_s = 0.0
[optimizer]
lr = 0.1
momentum = 0.9
lr_policy = "{policy}"
[protocol]
name = "{protocol}"
[live]
compute = "{compute}"
timeout_s = {timeout}
"""


def point(protocol: str, *, learners: int = 3, mb: int = 8, epochs: float = 1, compute: str = "real",
          dist: str = "deterministic", base: float = 0.0, policy: str = "constant", timeout: float = 30,
          **sets) -> dict:
    return make_point(BASE.format(protocol=protocol, learners=learners, mb=mb, epochs=epochs, compute=compute,
                                  dist=dist, base=base, policy=policy, timeout=timeout), **sets)


def live(p: dict):
    return LiveBackend().run(simulate(p).trace, p, RunOptions(device="cpu", threads=1))


def replay_final(trace, p: dict) -> torch.Tensor:
    torch.set_num_threads(1)
    rep = Replayer(trace, build_model(p), load_data(p), Optimizer(p["optimizer"], trace.header["mean_staleness"]),
                   batched=False)
    rep.run()
    return rep.final_states()[0][0]


@pytest.mark.parametrize("protocol,policy", [("async", "per_gradient"), ("softsync", "constant")])
def test_replaying_the_measured_trace_reproduces_the_live_weights(protocol: str, policy: str) -> None:
    # Truth: the live server's final weights; replay never saw them, only the measured trace.
    p = point(protocol, policy=policy, protocol__n=1)
    r = live(p)
    assert r.trace.header["measured"] and int(r.trace.inputs["staleness"].max()) >= (1 if protocol == "async" else 0)
    assert torch.allclose(replay_final(r.trace, p), r.final_weights, atol=1e-5, rtol=0)


def test_live_hardsync_equals_single_learner_sgd_with_lambda_mu() -> None:
    # Truth: a plain torch.optim.SGD loop, one learner, minibatch λμ, the same data order.
    lam, mu = 3, 8
    p = point("hardsync", learners=lam, mb=mu)
    r = live(p)
    torch.manual_seed(0)
    model = build_model(p)
    data = load_data(p)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stream = SampleStream(p["seed"], p["workload"]["samples_per_epoch"])
    rounds = int(r.trace.ops["kind"].tolist().count(1))
    for k in range(rounds):
        idx = torch.from_numpy(stream.indices(k * lam * mu, lam * mu))
        sgd.zero_grad()
        torch.nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        sgd.step()
    ref = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    assert torch.allclose(r.final_weights, ref, atol=1e-5, rtol=0)


def test_a_killed_learner_stops_the_run_with_a_clear_error() -> None:
    # Truth: the fault injected — learner 1 kills itself (SIGKILL) after its first gradient.
    p = point("async", epochs=5, timeout=20, live__fail_learner=1, live__fail_after=1)
    t = time.time()
    with pytest.raises(BackendError, match=r"learner 1 died with signal SIGKILL") as e:
        live(p)
    assert "\n" not in str(e.value)
    assert time.time() - t < 20 + 15  # within the timeout (plus process start-up)


def test_live_async_staleness_matches_the_simulated_distribution() -> None:
    # Truth: the simulator's prediction for the same point (emulated compute: learners sleep
    # for the same seeded compute draws), with its message latency set from the live run's
    # measured push-to-pull round trip (what `ddlsim calibrate` does). Compared as
    # distributions: mean, total variation and Kolmogorov–Smirnov distance.
    p = point("async", learners=4, mb=4, epochs=1, compute="emulated", dist="exponential", base=0.03,
              cluster__server__apply_s=1e-4)
    r = LiveBackend().run(simulate(p).trace, p, RunOptions(device="cpu"))
    p["cluster"]["network"]["latency_s"] = calibrated_latency(r.trace, p)
    sim = simulate(p)
    s_sim, s_live = sim.trace.inputs["staleness"], r.trace.inputs["staleness"]
    assert abs(s_live.mean() - s_sim.mean()) < 0.25
    top = max(s_sim.max(), s_live.max()) + 1
    h_sim = np.bincount(s_sim, minlength=top) / len(s_sim)
    h_live = np.bincount(s_live, minlength=top) / len(s_live)
    assert 0.5 * np.abs(h_sim - h_live).sum() < 0.15
    assert np.abs(np.cumsum(h_sim) - np.cumsum(h_live)).max() < 0.1
    assert r.summary["measured_time_s"] == pytest.approx(sim.summary["sim_time_s"], rel=0.1)


@pytest.mark.parametrize("protocol", ["allreduce", "sgp", "dpsgd"])
def test_live_gossip_nodes_are_reproduced_by_replaying_their_trace(protocol: str) -> None:
    # Truth: every node's live de-biased weights x_i / w_i; replay sees only the merged trace.
    p = point(protocol, learners=4, mb=8)
    r = live(p)
    torch.set_num_threads(1)
    rep = Replayer(r.trace, build_model(p), load_data(p), Optimizer(p["optimizer"], 0.0), batched=False)
    rep.run()
    fin = rep.final_states()
    z = torch.stack([fin[i][0] / fin[i][1] for i in range(4)])
    assert torch.allclose(z, r.final_weights, atol=1e-5, rtol=0)
    if protocol == "allreduce":  # exact averaging: every node holds the same model
        assert torch.allclose(r.final_weights[0], r.final_weights[3], atol=1e-6)
    if protocol == "dpsgd":  # each iteration's mixes are row i of D-PSGD's doubly stochastic W_k
        ops = r.trace.ops
        for i in range(4):
            mine = np.flatnonzero(ops["node"] == i)
            rows, row = [], {}
            for op in mine:
                if ops["kind"][op] == 2:  # mix
                    if not row:
                        row[i] = float(ops["self_coef"][op])
                    row[int(ops["src_node"][op])] = float(ops["coef"][op])
                elif ops["kind"][op] == 1:  # apply: the iteration ends
                    rows.append(row)
                    row = {}
            assert len(rows) == r.trace.header["iterations"]
            for k, row in enumerate(rows):
                W = symmetric_matrix(p["protocol"]["topology"], k, 4, p["protocol"]["peers"])
                assert row == pytest.approx({j: W[i, j] for j in range(4) if W[i, j] > 0}, abs=1e-12)


def test_unsupported_live_protocol_is_one_clear_line() -> None:
    p = point("sgp", learners=4, protocol__overlap=1)
    with pytest.raises(BackendError, match="protocol.overlap = 1: live sgp supports only protocol.overlap = 0"):
        live(p)
