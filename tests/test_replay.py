"""Tests for backends/replay.py: the trace interpreter against independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddlsim.backends.base import BackendResult, RunOptions
from ddlsim.backends.optim import Optimizer, mean_staleness
from ddlsim.backends.flatmodel import FlatModel
from ddlsim.backends.replay import ReplayBackend, summarize
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.workloads import Data, build_model, load_data
from ddlsim.simulator.catalog import DatasetInfo
from ddlsim.simulator.dataorder import SampleStream, global_slice_start, shard_start
from ddlsim.simulator.trace import APPLY, GRAD, Trace, TraceBuilder
from tests.conftest import make_point

torch.set_num_threads(1)
N_DIGITS = 1437


def header(nodes: int = 1, seed: int = 0, n: int = N_DIGITS) -> dict:
    return {"nodes": nodes, "data_seed": seed, "samples_per_epoch": n}


def hardsync_trace(lam: int, mu: int, rounds: int, seed: int = 0, n: int = N_DIGITS) -> Trace:
    """λ grads per round on the current version (global slices), one apply of weight 1/λ."""
    tb = TraceBuilder()
    tb.eval(0, 0, 0.0, 0.0)
    for k in range(rounds):
        gops = [tb.grad(i, 0, k, global_slice_start(k, i, lam, mu), mu, k, k, k + 0.5, k * lam * mu / n)
                for i in range(lam)]
        tb.apply(0, k, gops, [1.0 / lam] * lam, [0] * lam, k + 1.0, (k + 1) * lam * mu / n)
        if k % 5 == 4:
            tb.eval(0, k + 1, k + 1.0, (k + 1) * lam * mu / n)
    return tb.build(header(seed=seed, n=n))


def async_trace(lam: int, mu: int, grads: int, seed: int = 0, n: int = N_DIGITS, eval_every: int = 0) -> Trace:
    """Round-robin ASGD: each gradient reads the version its learner last pulled (σ = λ − 1)."""
    tb = TraceBuilder()
    tb.eval(0, 0, 0.0, 0.0)
    read, k, v = [0] * lam, [0] * lam, 0
    for step in range(grads):
        i = step % lam
        g = tb.grad(i, 0, read[i], shard_start(k[i], i, lam, mu, n), mu, k[i], step, step + 1.0, v * mu / n)
        k[i] += 1
        tb.apply(0, v, [g], [1.0], [v - read[i]], step + 1.0, (v + 1) * mu / n)
        v += 1
        read[i] = v
        if eval_every and v % eval_every == 0:
            tb.eval(0, v, step + 1.0, v * mu / n)
    return tb.build(header(seed=seed, n=n))


def digits_point(**sets) -> dict:
    base = dict(optimizer__lr=0.1, optimizer__momentum=0.9, optimizer__weight_decay=1e-4,
                workload__target_error=0.5)
    base.update(sets)
    return make_point(**base)


def replayer(trace: Trace, point: dict, batched: bool, **kw) -> Replayer:
    opt = Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"]))
    return Replayer(trace, build_model(point), load_data(point), opt, batched=batched, **kw)


def final_x(rep: Replayer, node: int = 0) -> torch.Tensor:
    x, w = rep.final_states()[node]
    return x / w


# (a) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("batched", [False, True])
def test_hardsync_equals_single_learner_sgd(batched):
    # truth: docs/design.md — hardsync(λ, μ) reproduces one learner with minibatch λμ on the same
    # data order; the reference is a plain torch.optim.SGD loop (lr halves from epoch 0.3 on)
    lam, mu, rounds = 4, 8, 30
    point = digits_point(optimizer__milestones=[[0.3, 0.5]])
    trace = hardsync_trace(lam, mu, rounds)
    rep = replayer(trace, point, batched)
    rep.run()

    model, data = build_model(point), load_data(point)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    stream = SampleStream(0, N_DIGITS)
    for k in range(rounds):
        idx = torch.from_numpy(stream.indices(k * lam * mu, lam * mu))
        for group in sgd.param_groups:
            group["lr"] = 0.1 if (k + 1) * lam * mu / N_DIGITS < 0.3 else 0.05
        sgd.zero_grad()
        F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        sgd.step()
    ref = nn.utils.parameters_to_vector(model.parameters()).detach()
    assert not rep.diverged and rep.updates == rounds
    assert torch.allclose(final_x(rep), ref, atol=1e-5, rtol=0)
    init = nn.utils.parameters_to_vector(build_model(point).parameters()).detach()
    assert (final_x(rep) - init).abs().max() > 1e-3  # the weights did move
    if batched:
        assert len(rep.plan.batches) == rounds and rep.plan.calls == rounds  # one vmap call per round


# (b) ------------------------------------------------------------------------------------
def _linear_setup():
    rng = np.random.default_rng(11)
    xs = rng.standard_normal((8, 3)).astype(np.float32)
    ys = np.array([0, 1, 1, 0, 1, 0, 0, 1])
    data = Data(torch.from_numpy(xs), torch.from_numpy(ys), torch.from_numpy(xs[:4]),
                torch.from_numpy(ys[:4]), DatasetInfo("toy", 8, 4, (3,), 2))
    model = nn.Sequential(nn.Flatten(), nn.Linear(3, 2))
    W0 = rng.standard_normal((2, 3)) * 0.5
    b0 = rng.standard_normal(2) * 0.1
    with torch.no_grad():
        model[1].weight.copy_(torch.from_numpy(W0))
        model[1].bias.copy_(torch.from_numpy(b0))
    return xs.astype(np.float64), ys, data, model, np.concatenate([W0.ravel(), b0])


def _ce_grad(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """Closed form: softmax cross-entropy of a linear model, mean over the minibatch."""
    W, b = theta[:6].reshape(2, 3), theta[6:]
    z = x @ W.T + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    loss = float(-np.mean(np.log(p[np.arange(len(y)), y])))
    d = (p - np.eye(2)[y]) / len(y)
    return np.concatenate([(d.T @ x).ravel(), d.sum(0)]), loss


@pytest.mark.parametrize("batched", [False, True])
def test_stale_gradients_per_gradient_policy_linear(batched):
    # truth: hand-derived by numpy (closed-form softmax-CE gradient), α_i = α0/σ_i, plain SGD
    xs, ys, data, model, theta0 = _linear_setup()
    tb = TraceBuilder()
    A = tb.grad(0, 0, 0, 0, 2, 0, 0, 1, 0)          # learner 0 on v0
    B = tb.grad(1, 0, 0, 2, 2, 0, 0, 1, 0)          # learner 1 on v0
    tb.apply(0, 0, [A], [1.0], [0], 1, 0.25)        # v1 = v0 − α·gA          (σ = 0)
    C = tb.grad(0, 0, 1, 4, 2, 1, 1, 2, 0.25)       # learner 0 on v1
    tb.apply(0, 1, [B], [1.0], [1], 2, 0.5)         # v2 = v1 − α/1·gB        (σ = 1)
    tb.eval(0, 2, 2, 0.5)
    D = tb.grad(1, 0, 2, 6, 2, 1, 2, 3, 0.5)        # learner 1 on v2
    tb.apply(0, 2, [C], [1.0], [2], 3, 0.75)        # v3 = v2 − α/2·gC        (σ = 2)
    E = tb.grad(0, 0, 3, 8, 2, 2, 3, 4, 0.75)       # learner 0 on v3 (next epoch)
    tb.apply(0, 3, [D, E], [0.5, 0.5], [1, 0], 4, 1.25)  # v4 = v3 − α(gD/1 + gE)/2
    tb.eval(0, 4, 4, 1.25)
    trace = tb.build(header(seed=5, n=8))
    cfg = {"name": "sgd", "lr": 0.4, "momentum": 0.0, "weight_decay": 0.0, "lr_policy": "per_gradient"}
    rep = Replayer(trace, model, data, Optimizer(cfg, mean_staleness(trace.inputs["staleness"])),
                   batched=batched)
    curves = rep.run()

    stream = SampleStream(5, 8)

    def grad(theta, start):
        idx = stream.indices(start, 2)
        return _ce_grad(theta, xs[idx], ys[idx])

    a = 0.4
    v0 = theta0
    gA, lA = grad(v0, 0)
    gB, lB = grad(v0, 2)
    v1 = v0 - a * gA
    gC, lC = grad(v1, 4)
    v2 = v1 - a / 1 * gB
    gD, lD = grad(v2, 6)
    v3 = v2 - a / 2 * gC
    gE, lE = grad(v3, 8)
    v4 = v3 - a * (0.5 * gD / 1 + 0.5 * gE)
    assert np.allclose(final_x(rep).double().numpy(), v4, atol=1e-5)
    # train_loss = mean minibatch loss of the grads since the previous eval
    assert curves[0]["train_loss"] == pytest.approx(np.mean([lA, lB, lC]), abs=1e-5)
    assert curves[1]["train_loss"] == pytest.approx(np.mean([lD, lE]), abs=1e-5)
    assert [r["updates"] for r in curves] == [2, 4]


def test_gradient_left_in_buffer_only_when_its_apply_comes_first():
    # truth: numpy closed form; rule: a gradient stays in the model's gradient buffer (lead −3)
    # only if its apply runs before the next gradient is computed, else it is copied (−2)
    xs, ys, data, model, theta0 = _linear_setup()
    tb = TraceBuilder()
    A = tb.grad(0, 0, 0, 0, 2, 0, 0, 1, 0)          # computed before A's apply: B follows
    B = tb.grad(1, 0, 0, 2, 2, 0, 0, 1, 0)
    tb.apply(0, 0, [A], [1.0], [0], 1, 0.25)        # v1 = v0 − α·gA
    tb.apply(0, 1, [B], [1.0], [1], 2, 0.5)         # v2 = v1 − α·gB (σ = 1, constant policy)
    C = tb.grad(0, 0, 2, 4, 2, 1, 2, 3, 0.5)
    tb.eval(0, 2, 2, 0.5)                           # an eval between C and its apply
    tb.apply(0, 2, [C], [1.0], [0], 3, 0.75)        # v3 = v2 − α·gC
    tb.eval(0, 3, 3, 0.75)
    trace = tb.build(header(seed=5, n=8))
    cfg = {"name": "sgd", "lr": 0.4, "momentum": 0.5, "weight_decay": 0.0, "lr_policy": "constant"}
    rep = Replayer(trace, model, data, Optimizer(cfg, 0.0), batched=False)
    rep.run()
    assert rep.plan.lead[[A, B, C]].tolist() == [-2, -3, -3]

    stream = SampleStream(5, 8)

    def grad(theta: torch.Tensor, start: int) -> torch.Tensor:
        return _ce_grad(theta, xs[stream.indices(start, 2)], ys[stream.indices(start, 2)])[0]

    gA, gB = grad(theta0, 0), grad(theta0, 2)
    buf = gA
    v1 = theta0 - 0.4 * buf
    buf = gB + 0.5 * buf
    v2 = v1 - 0.4 * buf
    buf = grad(v2, 4) + 0.5 * buf
    v3 = v2 - 0.4 * buf
    assert np.allclose(final_x(rep).double().numpy(), v3, atol=1e-6)


def test_apply_without_inputs_is_a_zero_gradient_step():
    # truth, by hand: momentum SGD on g = 0 still moves by the momentum buffer
    xs, ys, data, model, theta0 = _linear_setup()
    tb = TraceBuilder()
    A = tb.grad(0, 0, 0, 0, 2, 0, 0, 1, 0)
    tb.apply(0, 0, [A], [1.0], [0], 1, 0.25)        # buf = gA, v1 = v0 − α·gA
    tb.apply(0, 1, [], [], [], 2, 0.25)             # buf = 0.5·gA, v2 = v1 − α·0.5·gA
    tb.eval(0, 2, 2, 0.25)
    trace = tb.build(header(seed=5, n=8))
    cfg = {"name": "sgd", "lr": 0.4, "momentum": 0.5, "weight_decay": 0.0, "lr_policy": "constant"}
    rep = Replayer(trace, model, data, Optimizer(cfg, 0.0), batched=False)
    rep.run()
    stream = SampleStream(5, 8)
    gA = _ce_grad(theta0, xs[stream.indices(0, 2)], ys[stream.indices(0, 2)])[0]
    v2 = theta0 - 0.4 * gA - 0.4 * 0.5 * gA
    assert not rep.diverged and rep.updates == 2
    assert np.allclose(final_x(rep).double().numpy(), v2, atol=1e-6)


# (c) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("model, grads", [("mlp", 150), ("lenet", 60)])
def test_batched_equals_one_at_a_time(model, grads):
    # truth: the one-at-a-time path (plain autograd) for the same trace and point
    point = digits_point(optimizer__lr_policy="per_gradient", optimizer__name="nesterov", workload__model=model)
    trace = async_trace(6, 4, grads, eval_every=grads // 3)
    one = replayer(trace, point, batched=False)
    many = replayer(trace, point, batched=True)
    c1, c2 = one.run(), many.run()
    assert many.plan.calls <= grads // 4 and one.plan.calls == grads  # really batched
    assert torch.allclose(final_x(one), final_x(many), atol=1e-5, rtol=0)
    for r1, r2 in zip(c1, c2):
        assert r1["test_error"] == pytest.approx(r2["test_error"], abs=1 / 360 + 1e-9)
        assert r1["train_loss"] == pytest.approx(r2["train_loss"], abs=1e-5, nan_ok=True)


class _WithUnused(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.used = nn.Linear(3, 2)
        self.unused = nn.Linear(2, 2)  # never called: its gradient is zero

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.used(x)


def test_batched_gradients_equal_plain_autograd_rows():
    # truth: plain autograd, one minibatch at a time, scaled afterwards; an unused parameter
    # gets a zero gradient in both paths
    torch.manual_seed(0)
    flat = FlatModel(_WithUnused())
    zs = [flat.work.clone() + 0.1 * k for k in range(3)]
    xb, yb = torch.randn(3, 5, 3), torch.randint(0, 2, (3, 5))
    scale = torch.tensor([1.0, 0.5, 0.25])
    batch, losses = flat.grad_batch(zs, xb, yb, scale)
    for k in range(3):
        g, loss = flat.grad(zs[k], xb[k], yb[k], float(scale[k]))
        assert torch.allclose(batch[k], g, atol=1e-6)
        assert float(losses[k]) == pytest.approx(float(loss.detach()), abs=1e-6)
    assert float(batch[:, -6:].abs().max()) == 0.0 and float(batch[:, :8].abs().max()) > 0


@pytest.mark.parametrize("make,shape", [
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.ReLU(), nn.Linear(7, 4)), (3, 4)),
    (lambda: nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 5, bias=False), nn.ReLU(),
                           nn.Linear(5, 3)), (6,)),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(6, 3, bias=False)), (6,)),
])
def test_the_hand_written_mlp_kernel_equals_autograd_row_by_row(make, shape):
    # truth: plain autograd of F.cross_entropy on an independent copy of the model, one row at a time
    from ddlsim.backends.mlp_batched import mlp_layers

    torch.manual_seed(1)
    model = make()
    flat = FlatModel(model)
    assert flat._mlp is not None
    b, mu = 5, 4
    zs = torch.randn(b, flat.size)
    xb, yb = torch.randn(b, mu, *shape), torch.randint(0, 3, (b, mu))
    scale = torch.tensor([1.0, 0.5, 2.0, 0.0, -1.0])
    batch, losses = flat.grad_batch(zs, xb, yb, scale)
    for k in range(b):
        ref = make()
        torch.nn.utils.vector_to_parameters(zs[k], ref.parameters())
        loss = F.cross_entropy(ref(xb[k]), yb[k])
        gs = torch.autograd.grad(loss * float(scale[k]), list(ref.parameters()))
        assert torch.allclose(batch[k], torch.cat([g.reshape(-1) for g in gs]), atol=1e-6, rtol=1e-5)
        assert float(losses[k]) == pytest.approx(float(loss.detach()), rel=1e-6)
    # one set of weights for every row, no scale
    same, _ = flat.grad_batch([zs[0]], xb, yb)
    for k in range(b):
        assert torch.allclose(same[k], flat.grad(zs[0], xb[k], yb[k])[0], atol=1e-6)
    # not a plain Linear/ReLU stack: the vmap path
    assert mlp_layers(nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2))) is None
    assert mlp_layers(nn.Sequential(nn.Linear(3, 3), nn.ReLU())) is None
    assert mlp_layers(nn.Sequential(nn.Flatten(2), nn.Linear(3, 2))) is None
    # a frozen layer gets no gradient on either batched path, as with plain autograd
    for make_frozen in (lambda: nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)),
                        lambda: nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))):
        torch.manual_seed(2)
        fm = make_frozen()
        fm[0].weight.requires_grad_(False)
        ff = FlatModel(fm)
        zs2, xb2, yb2 = torch.randn(3, ff.size), torch.randn(3, 5, 4), torch.randint(0, 2, (3, 5))
        rows, _ = ff.grad_batch(zs2, xb2, yb2)
        for k in range(3):
            assert torch.allclose(rows[k], ff.grad(zs2[k], xb2[k], yb2[k])[0], atol=1e-6)
        assert float(rows[:, :12].abs().max()) == 0.0
    tied = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    tied[2].weight = tied[0].weight  # a tied weight's gradient is a sum: not for the kernels
    assert mlp_layers(tied) is None
    twice = nn.Linear(3, 3)
    assert mlp_layers(nn.Sequential(twice, nn.ReLU(), twice)) is None
    extra = nn.Sequential(nn.Linear(3, 2))
    extra.register_parameter("temperature", nn.Parameter(torch.ones(1)))  # a parameter outside the layers
    assert mlp_layers(extra) is None


# (d) ------------------------------------------------------------------------------------
def test_same_seed_same_curves():
    # rule: docs/design.md — the same seed gives the same accuracy; another init seed differs
    trace = async_trace(4, 8, 80, eval_every=20)
    backend = ReplayBackend()
    opts = RunOptions(device="cpu", batched=True)
    r1 = backend.run(trace, digits_point(seed=2), opts)
    r2 = backend.run(trace, digits_point(seed=2), opts)
    r3 = backend.run(trace, digits_point(seed=3), opts)
    assert isinstance(r1, BackendResult) and r1.trace is None
    assert r1.curves == r2.curves and r1.summary == r2.summary
    assert [r["train_loss"] for r in r1.curves[1:]] != [r["train_loss"] for r in r3.curves[1:]]
    assert set(r1.curves[0]) == {"epoch", "updates", "sim_time_s", "test_error", "train_loss"}
    assert set(r1.summary) == {"final_test_error", "best_test_error", "time_to_target_s", "diverged",
                               "diverged_at_update", "did_not_learn"}


# (e) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("batched", [False, True])
def test_divergence_recorded_not_raised(batched):
    # truth: the brief — a diverging run stops, keeps its curves and reports where
    point = digits_point(optimizer__lr=1e6, optimizer__momentum=0.9)
    trace = async_trace(4, 8, 200, eval_every=50)
    res = ReplayBackend().run(trace, point, RunOptions(device="cpu", batched=batched))
    s = res.summary
    assert s["diverged"] is True and isinstance(s["diverged_at_update"], int)
    assert 0 < s["diverged_at_update"] < 200
    assert len(res.curves) >= 1 and res.curves[0]["updates"] == 0  # the eval before any update
    assert s["final_test_error"] == res.curves[-1]["test_error"]
    assert all(math.isfinite(r["test_error"]) for r in res.curves)


@pytest.mark.parametrize("lr", [0.1, 1e6])
def test_losses_read_lazily_as_on_an_accelerator(lr):
    # rule: on an accelerator losses are read in groups; curves and the divergence point
    # must equal those of reading every loss at once (the CPU path)
    point = digits_point(optimizer__lr=lr)
    trace = async_trace(4, 8, 200, eval_every=50)
    eager, lazy = replayer(trace, point, True), replayer(trace, point, True)
    lazy._lazy_losses = True
    assert eager.run() == lazy.run()
    assert (eager.diverged, eager.diverged_at_update) == (lazy.diverged, lazy.diverged_at_update)
    assert eager.diverged == (lr > 1)


def test_divergence_without_measurement_gives_nan():
    point = digits_point(optimizer__lr=1e6)
    tb = TraceBuilder()
    prev = None
    for v in range(30):
        g = tb.grad(0, 0, v, v * 8, 8, v, v, v + 1, 0)
        tb.apply(0, v, [g], [1.0], [0], v + 1, 0)
        prev = v + 1
    tb.eval(0, prev, 31, 0)
    res = ReplayBackend().run(tb.build(header()), point, RunOptions(device="cpu"))
    assert res.summary["diverged"] and res.curves == []
    assert math.isnan(res.summary["final_test_error"]) and math.isnan(res.summary["best_test_error"])
    assert res.summary["time_to_target_s"] is None


# (f) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("batched", [False, True])
def test_version_lifetime_bounded(batched):
    # rule: only versions that later ops still read are kept: with λ learners in ASGD the
    # live versions are the λ last pulled ones (+ the current); 400 versions exist in all
    lam = 5
    point = digits_point()
    rep = replayer(async_trace(lam, 4, 400), point, batched)
    rep.run()
    assert rep.updates == 400
    assert rep.peak_live_states <= lam + 1
    assert len(rep.states) == 1  # at the end only the final version is left
    assert rep.peak_live_grads <= (lam if not batched else 2 * lam)
    assert rep.grads == {}


@pytest.mark.parametrize("batched", [False, True])
def test_chunked_execution_is_seamless(monkeypatch, batched):
    # rule: the hot loop works on chunks of ops; results must not depend on the chunk size
    from ddlsim.backends import replay_generic as replay_mod

    point = digits_point()
    trace = async_trace(5, 4, 120, eval_every=40)
    whole = replayer(trace, point, batched)
    whole.run()
    monkeypatch.setattr(replay_mod, "RUN_CHUNK", 7)
    chunked = replayer(trace, point, batched)
    chunked.run()
    assert whole.curves == chunked.curves and torch.equal(final_x(whole), final_x(chunked))
    assert chunked.peak_live_states == whole.peak_live_states and chunked.states.keys() == whole.states.keys()


def test_unconsumed_gradients_not_computed():
    # rule: a gradient no apply consumes (in flight at the end) is never computed
    point = digits_point()
    tb = TraceBuilder()
    g0 = tb.grad(0, 0, 0, 0, 8, 0, 0, 1, 0)
    tb.grad(1, 0, 0, 8, 8, 0, 0, 1, 0)
    tb.apply(0, 0, [g0], [1.0], [0], 1, 0)
    tb.eval(0, 1, 1, 0)
    rep = replayer(tb.build(header()), point, batched=True)
    rep.run()
    assert rep.peak_live_grads == 1 and len(rep.plan.grads) == 1


# (g) ------------------------------------------------------------------------------------
def _line_setup():
    """Linear(1, 2) on 1000 test points t ∈ [−1, 1], label t > 0: the error locates the
    decision boundary to 1e-3, so different averaging rules give different errors."""
    t = torch.linspace(-1, 1, 1000).unsqueeze(1)
    y = (t[:, 0] > 0).long()
    data = Data(t, y, t, y, DatasetInfo("line", 1000, 1000, (1,), 2))
    model = nn.Sequential(nn.Linear(1, 2))
    with torch.no_grad():
        model[0].weight.copy_(torch.tensor([[-1.0], [1.0]]))
        model[0].bias.copy_(torch.tensor([0.3, -0.3]))
    return data, model


def _line_error(z: torch.Tensor, data: Data) -> float:
    logits = data.test_x @ z[:2].view(2, 1).T + z[2:]
    return int((logits.argmax(1) != data.test_y).sum()) / len(data.test_y)


def test_mix_and_average_eval_formulas():
    # truth: trace.py — MIX: x ← self_coef·x + coef·x_src(src_version), w likewise;
    # EVAL of node −1 = mean over nodes of the latest x/w. Hand case (PushSum shares):
    data, model = _line_setup()
    x0 = torch.tensor([-1.0, 1.0, 0.3, -0.3])
    tb = TraceBuilder()
    g = tb.grad(1, 1, 0, 0, 1000, 0, 0, 1, 0)      # node 1 takes one full-batch step
    tb.apply(1, 0, [g], [1.0], [0], 1, 1)          # (1, v1): x1, w = 1
    tb.mix(1, 1, 1, 1, 0.0, 0.5, 1, 2, 1)           # (1, v2): keeps half, 0.5·x1, w = 0.5
    tb.mix(0, 0, 1, 1, 0.5, 1.0, 1, 2, 1)           # (0, v1): x0 + 0.5·x1, w = 1.5
    tb.mix(1, 2, 1, 2, 0.0, 0.5, 2, 3, 1)           # (1, v3): 0.25·x1, w = 0.25
    tb.mix(0, 1, 1, 2, 0.5, 1.0, 2, 3, 1)           # (0, v2): + 0.5·(1, v2), w = 1.5 + 0.25
    tb.eval(-1, 0, 3, 1)
    tb.eval(0, 1, 3, 1)
    trace = tb.build(header(nodes=2, n=1000))
    cfg = {"name": "sgd", "lr": 2.0, "momentum": 0.0, "weight_decay": 0.0}
    rep = Replayer(trace, model, data, Optimizer(cfg), batched=False)
    curves = rep.run()

    # node 1's step, from the gradient of the same mean cross-entropy (plain torch autograd)
    m = nn.Sequential(nn.Linear(1, 2))
    nn.utils.vector_to_parameters(x0, m.parameters())
    F.cross_entropy(m(data.train_x), data.train_y).backward()
    x1 = x0 - 2.0 * torch.cat([p.grad.reshape(-1) for p in m.parameters()])
    st = rep.final_states()
    assert torch.allclose(st[1][0], 0.25 * x1, atol=1e-6) and st[1][1] == pytest.approx(0.25)
    assert torch.allclose(st[0][0], x0 + 0.75 * x1, atol=1e-6) and st[0][1] == pytest.approx(1.75)
    z0, z1 = (x0 + 0.75 * x1) / 1.75, x1
    avg = (z0 + z1) / 2                              # mean of the de-biased states
    wrong_avg = (x0 + x1) / 2                        # Σx/Σw, a different rule
    assert abs(_line_error(avg, data) - _line_error(wrong_avg, data)) > 0.01  # the case discriminates
    assert curves[0]["test_error"] == pytest.approx(_line_error(avg, data), abs=1e-9)
    assert curves[1]["test_error"] == pytest.approx(_line_error((x0 + 0.5 * x1) / 1.5, data), abs=1e-9)
    assert curves[0]["updates"] == 1
    # consensus distance = mean_n ‖z_n − z̄‖ = ‖z0 − z1‖/2 for two nodes (each is half the gap away)
    assert curves[0]["consensus_distance"] == pytest.approx(float(((z0 - z1) ** 2).sum()) ** 0.5 / 2, rel=1e-5)


# summary, registry-facing backend and the simulator end to end ---------------------------
def test_summary_time_to_target():
    # truth: base.py — first eval with test_error ≤ target, else None
    rows = [{"test_error": e, "sim_time_s": t} for e, t in ((0.5, 1.0), (0.08, 2.0), (0.2, 3.0))]
    s = summarize(rows, 0.1, False, None, final_evals=1)
    assert s == {"final_test_error": 0.2, "best_test_error": 0.08, "time_to_target_s": 2.0,
                 "diverged": False, "diverged_at_update": None}
    assert summarize(rows, 0.01, False, None)["time_to_target_s"] is None
    # by default the final error is the mean of the last three evaluations (workload.final_evals)
    assert summarize(rows, 0.1, False, None)["final_test_error"] == pytest.approx((0.5 + 0.08 + 0.2) / 3)


def test_unavailable_device_is_a_backend_error():
    from ddlsim.backends.base import BackendError
    from ddlsim.backends.replay import resolve_device

    assert resolve_device("cpu").type == "cpu"
    assert resolve_device(None).type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(BackendError):
        resolve_device("warp-drive")


def test_trace_header_must_carry_data_order():
    from ddlsim.backends.base import BackendError

    tb = TraceBuilder()
    tb.eval(0, 0, 0, 0)
    with pytest.raises(BackendError, match="data_seed"):
        replayer(tb.build({"nodes": 1}), digits_point(), True)


def test_simulated_hardsync_replays_as_single_learner_sgd():
    # truth: docs/design.md — hardsync(λ, μ) = single-learner SGD with λμ; reference: torch.optim.SGD
    # over the union of each apply's minibatches (the simulator's global slices)
    from ddlsim.simulator.run import simulate

    point = make_point(protocol__name="hardsync", cluster__learners=4, cluster__minibatch=8,
                       workload__epochs=1, optimizer__lr=0.1, optimizer__momentum=0.9,
                       cluster__compute__distribution="exponential", seed=4)
    trace = simulate(point).trace
    res = ReplayBackend().run(trace, point, RunOptions(device="cpu"))
    assert not res.summary["diverged"] and res.curves[-1]["test_error"] < res.curves[0]["test_error"]
    rep = replayer(trace, point, batched=True)
    rep.run()

    model, data = build_model(point), load_data(point)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    stream = SampleStream(trace.header["data_seed"], trace.header["samples_per_epoch"])
    ops, inp = trace.ops, trace.inputs
    for i in np.flatnonzero(ops["kind"] == APPLY):
        s, c = ops["in_start"][i], ops["in_count"][i]
        gops = inp["grad_op"][s:s + c]
        starts = np.sort(ops["sample_start"][gops])
        assert np.all(np.diff(starts) == 8) and np.all(ops["kind"][gops] == GRAD)
        idx = torch.from_numpy(stream.indices(int(starts[0]), 8 * c))
        sgd.zero_grad()
        F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        sgd.step()
    ref = nn.utils.parameters_to_vector(model.parameters()).detach()
    assert torch.allclose(final_x(rep), ref, atol=1e-5, rtol=0)


def reference_ps_replay(trace: Trace, point: dict) -> torch.Tensor:
    """An independent parameter-server replay: a dict of weights versions, each gradient by
    plain autograd on a copy of the model at the version it read, each apply one
    ``torch.optim.SGD`` step (momentum, weight decay) at Rudra's rate with the per-gradient
    rates α_i = α0·s_i (per_gradient: s_i = 1/σ_i, 1 when σ_i = 0) of docs/replay.md: the
    step's rate α0·s̄, s̄ = Σ w_i s_i / Σ w_i, on Σ w_i (s_i / s̄) g_i (plain SGD: Σ w_i α_i g_i)."""
    ops, inp = trace.ops, trace.inputs
    model, data = build_model(point), load_data(point)
    params = list(model.parameters())
    sgd = torch.optim.SGD(params, lr=point["optimizer"]["lr"], momentum=point["optimizer"]["momentum"],
                          weight_decay=point["optimizer"]["weight_decay"])
    stream = SampleStream(int(trace.header["data_seed"]), int(trace.header["samples_per_epoch"]))
    versions = {0: [p.detach().clone() for p in params]}
    grads: dict[int, list[torch.Tensor]] = {}
    for i in range(trace.n_ops):
        if ops["kind"][i] == GRAD:
            probe = build_model(point)
            for q, w in zip(probe.parameters(), versions[int(ops["src_version"][i])]):
                q.data.copy_(w)
            idx = torch.from_numpy(stream.indices(int(ops["sample_start"][i]), int(ops["batch_size"][i])))
            F.cross_entropy(probe(data.train_x[idx]), data.train_y[idx]).backward()
            grads[i] = [q.grad.detach().clone() for q in probe.parameters()]
        elif ops["kind"][i] == APPLY:
            s, c = int(ops["in_start"][i]), int(ops["in_count"][i])
            for p in params:
                p.grad = torch.zeros_like(p)
            ws, sigmas = inp["weight"][s:s + c].tolist(), inp["staleness"][s:s + c].tolist()
            rates = [1.0 / sigma if (point["optimizer"]["lr_policy"] == "per_gradient" and sigma > 0) else 1.0
                     for sigma in sigmas]
            mean_rate = sum(w * r for w, r in zip(ws, rates)) / sum(ws)
            for g_op, w, r in zip(inp["grad_op"][s:s + c], ws, rates):
                for p, g in zip(params, grads.pop(int(g_op))):
                    p.grad.add_(g, alpha=w * r / mean_rate)
            for group in sgd.param_groups:
                group["lr"] = point["optimizer"]["lr"] * mean_rate
            sgd.step()
            versions[int(ops["version"][i]) + 1] = [p.detach().clone() for p in params]
    return torch.cat([p.detach().reshape(-1) for p in params])


@pytest.mark.parametrize("protocol", ["bounded_softsync", "ssp", "softsync"])
def test_simulated_ps_traces_replay_as_the_reference(protocol):
    # truth: reference_ps_replay (torch.optim.SGD, plain autograd, versions kept by hand) on the
    # simulator's trace of a straggler-bound run, staleness-aware learning rate
    point = make_point(protocol__name=protocol, protocol__n=2, protocol__staleness_bound=1, cluster__learners=4,
                       cluster__minibatch=8, workload__epochs=0.25, optimizer__lr=0.1,
                       optimizer__lr_policy="per_gradient", optimizer__weight_decay=1e-4,
                       cluster__stragglers__fraction=0.25, cluster__stragglers__slowdown=3.0)
    from ddlsim.simulator.run import simulate

    trace = simulate(point).trace
    assert trace.inputs["staleness"].max() >= 1  # stale gradients, so the policy matters
    rep = replayer(trace, point, batched=True)
    rep.run()
    assert torch.allclose(final_x(rep), reference_ps_replay(trace, point), atol=1e-5)
