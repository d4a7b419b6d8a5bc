"""Replaying decentralized traces: the generic interpreter and the stacked replay
(backends/replay.py, backends/replay_stacked.py) against independent references.

Every trace here is simulated by ``simulator.run.simulate`` (all-reduce, D-PSGD, AD-PSGD,
SGP) and replayed on the digits MLP. Each test names its independent truth in a comment.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddlsim.backends.base import BackendError, RunOptions
from ddlsim.backends.optim import Optimizer, mean_staleness
from ddlsim.backends.replay import ReplayBackend, make_replayer
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.replay_stacked import StackedReplayer, gradient_rounds
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.simulator.dataorder import SampleStream, shard_start
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import APPLY, GRAD, MIX, Trace, TraceBuilder
from tests.conftest import make_point

torch.set_num_threads(1)
N_DIGITS = 1437
STRAGGLY = {"cluster__stragglers__fraction": 0.25, "cluster__stragglers__slowdown": 2.0}


def gossip_point(protocol: str, n: int = 8, mu: int = 16, epochs: float = 2.0, **sets) -> dict:
    base = dict(protocol__name=protocol, cluster__learners=n, cluster__minibatch=mu, workload__epochs=epochs,
                workload__evals_per_epoch=2, optimizer__lr=0.1, optimizer__momentum=0.9,
                optimizer__weight_decay=1e-3)
    base.update(sets)
    return make_point(**base)


def replay(trace: Trace, point: dict, mode: str, opt: Optimizer | None = None) -> Replayer:
    opt = opt or Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"]))
    rep = make_replayer(trace, build_model(point), load_data(point), opt, stacked=mode)
    assert isinstance(rep, StackedReplayer) == (mode == "on")
    rep.run()
    return rep


def final(rep: Replayer) -> tuple[torch.Tensor, np.ndarray]:
    states = rep.final_states()
    return torch.stack([states[k][0] for k in sorted(states)]), np.array([states[k][1] for k in sorted(states)])


def flat_init(point: dict) -> torch.Tensor:
    return nn.utils.parameters_to_vector(build_model(point).parameters()).detach()


# -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["off", "on"])
def test_allreduce_replay_equals_single_learner_sgd(mode):
    # truth: docs/design.md — AR-SGD with N nodes and minibatch μ is SGD with minibatch Nμ on the
    # global_slice data order; the reference is a plain torch.optim.SGD loop over
    # SampleStream(seed, samples_per_epoch).indices(k·N·μ, N·μ) (lr halves from epoch 0.3 on)
    n, mu = 4, 8
    point = gossip_point("allreduce", n=n, mu=mu, epochs=0.6, optimizer__weight_decay=1e-4,
                         optimizer__milestones=[[0.3, 0.5]], **STRAGGLY)
    trace = simulate(point).trace
    rounds = trace.header["iterations"]
    rep = replay(trace, point, mode)
    if mode == "on":
        assert rep.fallback is None

    model, data = build_model(point), load_data(point)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    stream = SampleStream(point["seed"], N_DIGITS)
    for k in range(rounds):
        idx = torch.from_numpy(stream.indices(k * n * mu, n * mu))
        for group in sgd.param_groups:
            group["lr"] = 0.1 if (k + 1) * n * mu / N_DIGITS < 0.3 else 0.05
        sgd.zero_grad()
        F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        sgd.step()
    ref = nn.utils.parameters_to_vector(model.parameters()).detach()
    xs, ws = final(rep)
    assert not rep.diverged and rep.updates == rounds
    assert np.all(ws == 1.0)
    for i in range(n):  # every node ends on the same state: node 0's, copied
        assert torch.allclose(xs[i], ref, atol=1e-5, rtol=0)
    assert (ref - flat_init(point)).abs().max() > 1e-2  # the weights did move


# -------------------------------------------------------------------------------------------
def test_one_peer_sgp_converges_like_allreduce_on_digits():
    # truth: the SGP paper (Assran et al. 2019) — 1-peer SGP reaches AR-SGD's accuracy with
    # the same learning rate and epochs; its nodes approach consensus as the steps shrink.
    # Measured by the replay backend (default mode) on 8 nodes, 8 epochs, lr ÷10 at epoch 5.
    res = {}
    for protocol in ("allreduce", "sgp"):
        point = gossip_point(protocol, epochs=8.0, optimizer__weight_decay=0.0, optimizer__milestones=[[5.0, 0.1]])
        res[protocol] = ReplayBackend().run(simulate(point).trace, point, RunOptions(device="cpu"))
    ar, sgp = (res[p].summary["final_test_error"] for p in ("allreduce", "sgp"))
    assert ar < 0.08 and sgp < 0.08  # both converged (chance is 0.9)
    assert abs(ar - sgp) <= 0.01 + 1e-9
    dist = [r["consensus_distance"] for r in res["sgp"].curves]
    assert dist[0] < 1e-5  # every node starts from the same weights (up to rounding of the mean)
    early, late = np.mean(dist[1:5]), np.mean(dist[-4:])
    assert early > 0.05 and late < 0.25 * early
    assert all(r["consensus_distance"] < 1e-5 for r in res["allreduce"].curves)


# -------------------------------------------------------------------------------------------
class _Reads:
    """Records, through the replay's hook, the (x, w) every gradient reads."""

    def on_grad_reads(self, ops, x, w):
        store = self.__dict__.setdefault("reads", {})
        for op, xr, wr in zip(ops, x, w):
            store[op] = (xr.clone(), wr)


class GenericReads(_Reads, Replayer):
    pass


class StackedReads(_Reads, StackedReplayer):
    pass


def reference_grad(point: dict, data, z: torch.Tensor, start: int, mu: int) -> torch.Tensor:
    """Plain autograd of the model at ``z`` on the minibatch at stream position ``start``."""
    model = build_model(point)
    nn.utils.vector_to_parameters(z, model.parameters())
    idx = torch.from_numpy(SampleStream(point["seed"], N_DIGITS).indices(start, mu))
    loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
    return nn.utils.parameters_to_vector(torch.autograd.grad(loss, list(model.parameters())))


@pytest.mark.parametrize("mode", ["off", "on"])
@pytest.mark.parametrize("tau", [0, 1])
@pytest.mark.parametrize("lr", [0.0, 0.5])
def test_pushsum_invariants_during_sgp_replay(mode, tau, lr):
    # truth: PushSum algebra (docs/design.md, SGP invariants), with gradients from plain autograd.
    # τ = 0 (Alg. 1, blocking receive): the versions the nodes' k-th gradients read form a
    # consistent cut — every message of iterations < k mixed, none later — so there
    # Σ_i w_i = N and Σ_i x^(k+1) = Σ_i x^(k) − lr Σ_i ∇L_i(x_i^(k) / w_i^(k)). Any τ: at the
    # end Σ w = N and Σ x = N·x0 − lr Σ (every gradient); with lr = 0 every version read is
    # x = w·x0 (identical starts), so de-biasing x / w gives back x0 even where w ≠ 1.
    n, mu = 8, 8
    point = gossip_point("sgp", n=n, mu=mu, epochs=0.5, protocol__overlap=tau, **STRAGGLY)
    trace = simulate(point).trace
    K = trace.header["iterations"]
    opt = Optimizer({"name": "sgd", "lr": lr, "momentum": 0.0, "weight_decay": 0.0}, 0.0)
    cls = StackedReads if mode == "on" else GenericReads
    data = load_data(point)
    rep = cls(trace, build_model(point), data, opt)
    rep.run()
    assert mode == "off" or rep.fallback is None
    ops = trace.ops
    x0 = flat_init(point)
    at: dict[tuple[int, int], tuple[torch.Tensor, float]] = {}
    for op, (x, w) in rep.reads.items():
        at[(int(ops["node"][op]), int(ops["batch_index"][op]))] = (x.double(), w)
    assert len(at) == n * K
    steps = {}
    for (i, k), (x, w) in at.items():
        z = (x / w).float()
        steps[(i, k)] = lr * reference_grad(point, data, z, shard_start(k, i, n, mu, N_DIGITS), mu).double()
        if lr == 0.0:
            assert torch.allclose(x, w * x0.double(), atol=1e-6, rtol=0)
    xs, ws = final(rep)
    sum_x = [sum(at[(i, k)][0] for i in range(n)) for k in range(K)] + [xs.double().sum(0)]
    if tau == 0:
        for k in range(K):
            assert sum(at[(i, k)][1] for i in range(n)) == pytest.approx(n, abs=1e-12)
            expect = sum_x[k] - sum(steps[(i, k)] for i in range(n))
            assert torch.allclose(sum_x[k + 1], expect, atol=1e-5, rtol=0)
    else:
        assert any(abs(w - 1.0) > 1e-3 for _, w in at.values())  # late messages: w ≠ 1 mid-run
    assert ws.sum() == pytest.approx(n, abs=1e-12)
    total = n * x0.double() - sum(steps.values())
    assert torch.allclose(sum_x[-1], total, atol=1e-5, rtol=0)
    if lr > 0:
        assert (sum_x[-1] - n * x0.double()).abs().max() > 1e-2  # the gradient steps did count


# -------------------------------------------------------------------------------------------
CASES = [
    ("sgp", {}), ("sgp", {"protocol__overlap": 1}), ("sgp", {"protocol__overlap": 2, "protocol__peers": 2}),
    ("dpsgd", {}), ("dpsgd", {"protocol__topology": "ring", "optimizer__name": "nesterov"}),
    ("adpsgd", {"optimizer__lr_policy": "per_gradient"}), ("adpsgd", {"optimizer__name": "adagrad"}),
    ("adpsgd", {"optimizer__name": "adam", "optimizer__lr": 0.01, "optimizer__lr_policy": "per_gradient"}),
    ("sgp", {"optimizer__name": "adamw", "optimizer__lr": 0.01, "optimizer__weight_decay": 0.05}),
    ("allreduce", {}),
]


def _superseded_reads(trace: Trace) -> int:
    """Mixes that read a sender's version older than the sender's latest at that point."""
    ops = trace.ops
    latest: dict[int, int] = {}
    count = 0
    for k, nd, v, src, sv in zip(ops["kind"].tolist(), ops["node"].tolist(), ops["version"].tolist(),
                                 ops["src_node"].tolist(), ops["src_version"].tolist()):
        if k == MIX and sv < latest.get(src, 0):
            count += 1
        if k in (APPLY, MIX):
            latest[nd] = v + 1
    return count


@pytest.mark.parametrize("protocol,sets", CASES)
def test_stacked_replay_equals_generic(protocol, sets):
    # truth: the generic interpreter (ops one at a time, in trace order; itself checked against
    # references in tests/test_replay.py) — the stacked replay must give the same weights,
    # PushSum weights and curves to 1e-5, while reading superseded versions where the trace does
    point = gossip_point(protocol, **{**STRAGGLY, **sets})
    trace = simulate(point).trace
    gen, stk = replay(trace, point, "off"), replay(trace, point, "on")
    assert stk.fallback is None and not gen.diverged and not stk.diverged
    (xg, wg), (xs, ws) = final(gen), final(stk)
    assert np.array_equal(wg, ws)
    assert torch.allclose(xg, xs, atol=1e-5, rtol=0)
    assert len(gen.curves) == len(stk.curves) >= 4
    for a, b in zip(gen.curves, stk.curves):
        assert list(a) == list(b)
        assert (a["epoch"], a["updates"], a["sim_time_s"]) == (b["epoch"], b["updates"], b["sim_time_s"])
        assert abs(a["test_error"] - b["test_error"]) <= 1 / 360 + 1e-12
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5, nan_ok=True)
        assert a["consensus_distance"] == pytest.approx(b["consensus_distance"], abs=1e-5)
    assert stk.updates == gen.updates
    if protocol in ("sgp", "adpsgd"):
        assert _superseded_reads(trace) > 0  # SGP: post-step versions; AD-PSGD: pre-average replies
    # one call per iteration where the generic lookahead splits them; memory stays O(N)
    assert stk.grad_calls <= gen.plan.calls
    assert stk.peak_live_states <= 3 * trace.header["nodes"] + 4


class ScatteredRows(StackedReplayer):
    """Puts every other new version in a row beyond the home rows: scattered batches,
    gathers and scatters, a pool that keeps growing."""

    def _target(self, node, region):
        self._flip = not getattr(self, "_flip", False)
        if self._flip:
            return super()._target(node, region)
        if not self._free:
            old = self._pool
            self._pool = torch.cat([old, torch.empty_like(old[:1])])
            self._free = [len(old)]
        return self._free.pop()


@pytest.mark.parametrize("protocol,sets", [CASES[1], CASES[2], CASES[4], CASES[5]])
def test_stacked_replay_with_scattered_rows_equals_generic(protocol, sets):
    # truth: the generic interpreter, as above; the row layout must not matter
    point = gossip_point(protocol, epochs=1.0, **{**STRAGGLY, **sets})
    trace = simulate(point).trace
    gen = replay(trace, point, "off")
    stk = ScatteredRows(trace, build_model(point), load_data(point),
                        Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"])))
    stk.run()
    assert stk.fallback is None and len(stk._pool) > 2 * trace.header["nodes"] + 4  # it grew
    (xg, wg), (xs, ws) = final(gen), final(stk)
    assert np.array_equal(wg, ws) and torch.allclose(xg, xs, atol=1e-5, rtol=0)
    assert [r["consensus_distance"] for r in gen.curves] == pytest.approx(
        [r["consensus_distance"] for r in stk.curves], abs=1e-5)


def synthetic_trace(nodes: int = 4, iters: int = 8, seed: int = 3) -> Trace:
    """Ops no bundled protocol writes: two gradients per apply (μ 8 and 4, one read from a
    neighbour's previous version), mixes that do not keep Σw (so w ≠ 1), reads of old
    versions, evals of one node and of the average, applies of one iteration on both sides of
    epoch 0.45 (a milestone there gives one batch two learning rates)."""
    tb = TraceBuilder()
    tb.eval(-1, -1, 0.0, 0.0)
    v, pos = [0] * nodes, 0
    for k in range(iters):
        gops = []
        for i in range(nodes):
            j = (i + 1) % nodes
            epoch = (k + i / nodes) / iters
            a = tb.grad(i, i, v[i], pos, 8, 2 * k, k, k + 0.5, epoch)
            b = tb.grad(i, j, max(0, v[j] - 1), pos + 8, 4, 2 * k + 1, k, k + 0.5, epoch)
            pos += 12
            gops.append((a, b, epoch))
        for i, (a, b, epoch) in enumerate(gops):
            tb.apply(i, v[i], [a, b], [0.75, 0.25], [0, 1], k + 0.6, epoch)
            v[i] += 1
        for i in range(nodes):
            j = (i + 3) % nodes
            tb.mix(i, v[i], j, v[j] - (k % 2) if v[j] > 1 else v[j], 0.3 + 0.05 * i, 0.6, k + 0.7, k + 0.8,
                   (k + 1) / iters)
            v[i] += 1
        tb.eval(k % nodes, v[k % nodes], k + 0.9, (k + 1) / iters)
        if k % 3 == 2:
            tb.eval(-1, -1, k + 0.9, (k + 1) / iters)
    return tb.build({"nodes": nodes, "data_seed": seed, "samples_per_epoch": N_DIGITS})


@pytest.mark.parametrize("opt", [
    {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 1e-3, "milestones": [[0.45, 0.3]]},
    {"name": "nesterov", "lr": 0.1, "momentum": 0.5, "weight_decay": 0.0},
    {"name": "adagrad", "lr": 0.05, "weight_decay": 1e-3, "milestones": [[0.45, 0.3]]},
    {"name": "adam", "lr": 0.01, "weight_decay": 1e-3, "milestones": [[0.45, 0.3]]},
    {"name": "adamw", "lr": 0.01, "weight_decay": 0.05, "betas": [0.8, 0.99], "eps": 1e-6},
])
@pytest.mark.parametrize("cap", [64, 3])
def test_stacked_replay_of_arbitrary_multi_node_ops_equals_generic(opt, cap):
    # truth: the generic interpreter on a hand-built trace (see synthetic_trace)
    point = gossip_point("sgp", n=4)
    trace = synthetic_trace()
    gen = Replayer(trace, build_model(point), load_data(point), Optimizer(opt, 0.0))
    stk = StackedReplayer(trace, build_model(point), load_data(point), Optimizer(opt, 0.0), batch_cap=cap)
    gen.run()
    stk.run()
    assert stk.fallback is None
    (xg, wg), (xs, ws) = final(gen), final(stk)
    assert np.allclose(wg, ws, rtol=0, atol=1e-12) and np.any(np.abs(ws - 1.0) > 0.1)
    assert torch.allclose(xg, xs, atol=1e-5, rtol=0)
    assert len(gen.curves) == len(stk.curves) == 11
    for a, b in zip(gen.curves, stk.curves):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5, nan_ok=True)
        assert a["consensus_distance"] == pytest.approx(b["consensus_distance"], abs=1e-5)
        assert abs(a["test_error"] - b["test_error"]) <= 1 / 360 + 1e-12
    # per iteration one call for μ 8 and one for μ 4; with a cap of 3, leftovers of a round
    # join the next round's gradients, so the prediction is then an upper bound
    rounds = gradient_rounds(trace, gen.plan, cap)
    if cap == 64:
        assert stk.grad_calls == rounds == 2 * 8
    else:
        assert 2 * 8 < stk.grad_calls <= rounds


def test_stacked_replay_falls_back_to_generic_on_divergence():
    # truth: the generic interpreter's divergence semantics (docs/replay.md, "Divergence")
    point = gossip_point("sgp", epochs=1.0, protocol__overlap=1, workload__evals_per_epoch=4)
    point["optimizer"]["lr"] = 1e30  # past the schema's bound on purpose: the replay must cope
    trace = simulate(point).trace
    gen, stk = replay(trace, point, "off"), replay(trace, point, "on")
    assert gen.diverged and stk.diverged and stk.fallback == "diverged"
    assert stk.diverged_at_update == gen.diverged_at_update
    assert stk.curves == gen.curves


def test_auto_mode_predicts_the_stacked_gradient_calls_and_picks_the_fewer():
    # truth: the stacked replay's own count of vmap calls (gradient_rounds must predict it
    # exactly), and the documented rule: stacked when it saves ≥ 1 call per 20 gradients
    seen = set()
    for sets in ({}, STRAGGLY):
        point = gossip_point("sgp", epochs=3.0, **sets)
        trace = simulate(point).trace
        stk = replay(trace, point, "on")
        gen = Replayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"]))
        assert gradient_rounds(trace, gen.plan, 64) == stk.grad_calls
        auto = make_replayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"]),
                             stacked="auto")
        saved = gen.plan.calls - stk.grad_calls
        assert isinstance(auto, StackedReplayer) == (saved >= len(gen.plan.grads) / 20)
        seen.add(type(auto))
    assert seen == {Replayer, StackedReplayer}  # both choices happen on these two traces
    with pytest.raises(BackendError, match="stacked replay mode"):
        make_replayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"]), stacked="yes")


def test_stacked_replay_of_a_single_node_trace_is_the_generic_one():
    # truth: docs/replay.md — single-node traces are not stacked (nothing to stack)
    point = make_point(protocol__name="async", cluster__learners=4, cluster__minibatch=8, workload__epochs=0.2)
    trace = simulate(point).trace
    stk = StackedReplayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"]))
    stk.run()
    gen = replay(trace, point, "off")
    assert stk.fallback == "single node"
    assert stk.curves == gen.curves and math.isfinite(stk.curves[-1]["test_error"])
    assert int((trace.ops["kind"] == GRAD).sum()) > 0


def test_run_option_stacked_chooses_the_path(monkeypatch):
    # rule: RunOptions.stacked (ddlsim run --stacked) alone picks the multi-node replay path
    # (no environment variable: DDLSIM_REPLAY_STACKED is ignored); both paths give the same
    # curves (1e-5 / one test sample); the default is "auto"
    monkeypatch.setenv("DDLSIM_REPLAY_STACKED", "on")
    point = gossip_point("sgp", n=4, epochs=1.0, **STRAGGLY)
    trace = simulate(point).trace
    used: list[str] = []
    real_run = StackedReplayer.run

    def spy(self):
        used.append("stacked")
        return real_run(self)

    monkeypatch.setattr(StackedReplayer, "run", spy)
    on = ReplayBackend().run(trace, point, RunOptions(device="cpu", stacked="on"))
    assert used == ["stacked"]
    off = ReplayBackend().run(trace, point, RunOptions(device="cpu", stacked="off"))
    assert used == ["stacked"]  # "off" took the generic path, whatever the environment says
    auto = make_replayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"], 0.0))
    default = ReplayBackend().run(trace, point, RunOptions(device="cpu"))
    assert RunOptions().stacked == "auto" and len(used) == 1 + isinstance(auto, StackedReplayer)
    for a, b in zip(on.curves, off.curves):
        assert a["test_error"] == pytest.approx(b["test_error"], abs=1 / 360 + 1e-9)
    same = on if isinstance(auto, StackedReplayer) else off
    assert [r["test_error"] for r in default.curves] == [r["test_error"] for r in same.curves]
    with pytest.raises(BackendError, match="stacked replay mode 'sideways'"):
        ReplayBackend().run(trace, point, RunOptions(device="cpu", stacked="sideways"))
