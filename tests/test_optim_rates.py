"""Staleness-aware rates on the step, for every optimizer; Adam and AdamW (backends/optim.py).

Each test names its independent truth: torch.optim's own optimizers stepped by hand, a
closed form worked out by hand, or the equivalence Rudra's rule states (``mean_staleness``
at α0 is ``constant`` at α0/⟨σ⟩ on the same trace).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddlsim.backends.base import RunOptions
from ddlsim.backends.optim import Optimizer, adam_update, mean_staleness, step_rates
from ddlsim.backends.replay import ReplayBackend, make_replayer
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.scenarios.cli import main
from ddlsim.simulator import trace as trace_io
from ddlsim.simulator.dataorder import SampleStream
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import APPLY, GRAD, Trace
from tests.conftest import make_point

torch.set_num_threads(1)

OPTIMIZERS = [("sgd", 0.1), ("nesterov", 0.1), ("adagrad", 0.05), ("adam", 0.01), ("adamw", 0.01)]


def torch_optimizer(name: str, params: list, lr: float, wd: float, momentum: float = 0.8,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float | None = None) -> torch.optim.Optimizer:
    """The torch.optim optimizer the scenario's ``optimizer.name`` stands for (single-tensor loops)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, eps=eps or 1e-8, weight_decay=wd, foreach=False)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps or 1e-8, weight_decay=wd, foreach=False)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, eps=eps or 1e-10, weight_decay=wd, foreach=False)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=wd, nesterov=name == "nesterov",
                           foreach=False)


# -- Adam and AdamW against torch.optim ------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name, wd", [("adam", 0.0), ("adam", 0.01), ("adamw", 0.0), ("adamw", 0.05)])
def test_adam_per_tensor_equals_torch_bit_for_bit(name, wd, dtype):
    # truth: torch.optim.Adam / AdamW (single-tensor loop), step by step, changing lr
    gen = torch.Generator().manual_seed(11)
    p = nn.Parameter(torch.randn(9, generator=gen, dtype=torch.float64).to(dtype))
    ref = torch_optimizer(name, [p], 0.01, wd, betas=(0.8, 0.99), eps=1e-6)
    opt = Optimizer({"name": name, "lr": 0.01, "weight_decay": wd, "betas": [0.8, 0.99], "eps": 1e-6})
    x = p.detach().clone()
    for step in range(6):
        lr = 0.01 / (step + 1)
        g = torch.randn(9, generator=gen, dtype=torch.float64).to(dtype)
        for group in ref.param_groups:
            group["lr"] = lr
        p.grad = g.clone()
        ref.step()
        x = opt.step(0, x, g, lr)
        assert torch.equal(x, p.detach())
    m, v, t = opt.state[0]
    assert t == 6 and torch.equal(m, ref.state[p]["exp_avg"]) and torch.equal(v, ref.state[p]["exp_avg_sq"])


def test_adam_per_tensor_form_is_pure():
    # rule: without own_state the update never modifies its arguments (old versions stay valid)
    x, g = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 0.25])
    state = (torch.tensor([0.1, 0.2]), torch.tensor([0.01, 0.02]), 3)
    keep = [x.clone(), g.clone(), state[0].clone(), state[1].clone()]
    new_x, new_state = adam_update(x, g, state, 0.1, weight_decay=0.1, decoupled=True)
    for a, b in zip((x, g, state[0], state[1]), keep):
        assert torch.equal(a, b)
    assert new_state[2] == 4 and not torch.equal(new_x, x)


@pytest.mark.parametrize("name, wd", [("adam", 0.01), ("adamw", 0.05), ("adam", 0.0)])
def test_adam_row_batched_form_equals_torch_per_row(name, wd):
    # truth: one torch.optim loop per row (A independent models): all rows with one rate (bit
    # for bit), per-row rates, and only some rows stepping (rows then differ in step count),
    # the way the stacked replay gathers and scatters its nodes' state rows
    gen = torch.Generator().manual_seed(5)
    A, P = 4, 7
    start = torch.randn(A, P, generator=gen, dtype=torch.float64)
    params = [nn.Parameter(start[a].clone()) for a in range(A)]
    refs = [torch_optimizer(name, [p], 1.0, wd) for p in params]
    opt = Optimizer({"name": name, "lr": 0.02, "weight_decay": wd})
    x = start.clone()
    state = opt.state_rows(A, x)
    assert state is not None and state.shape == (A, 2 * P + 1)
    for step in range(7):
        g = torch.randn(A, P, generator=gen, dtype=torch.float64)
        rows = [0, 2] if step in (2, 3) else list(range(A))
        lrs = [0.02 * (a + 1) / (step + 1) for a in range(A)] if step % 2 else [0.02] * A
        for a in rows:
            for group in refs[a].param_groups:
                group["lr"] = lrs[a]
            params[a].grad = g[a].clone()
            refs[a].step()
        lr = lrs[0] if step % 2 == 0 else torch.tensor([lrs[a] for a in rows], dtype=torch.float64)
        if rows == list(range(A)):
            opt.step_rows_(x, g, state, lr)
        else:
            idx = torch.tensor(rows)
            xs, ss = x.index_select(0, idx), state.index_select(0, idx)
            opt.step_rows_(xs, g.index_select(0, idx), ss, lr)
            x.index_copy_(0, idx, xs)
            state.index_copy_(0, idx, ss)
        ref_x = torch.stack([p.detach() for p in params])
        if step < 2:  # one shared rate and step count: the per-tensor arithmetic
            assert torch.equal(x, ref_x)
        assert torch.allclose(x, ref_x, rtol=0, atol=1e-12)
    assert state[:, 2 * P].tolist() == [7.0, 5.0, 7.0, 5.0]  # steps taken per row


def test_adam_one_row_into_out_leaves_the_version_read():
    # truth: the per-tensor form; rule: stepping into ``out`` keeps ``x`` (a version still read)
    opt = Optimizer({"name": "adamw", "lr": 0.1, "weight_decay": 0.3})
    x, g = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.3, 0.1, -0.2])
    keep = x.clone()
    state, out = opt.state_rows(1, x)[0], torch.empty(3)
    opt.step_rows_(x, g, state, 0.1, 1.0, out)
    expect, _ = adam_update(keep, g, None, 0.1, weight_decay=0.3, decoupled=True)
    assert torch.equal(x, keep) and torch.equal(out, expect)


def test_adam_weight_decay_on_pushsum_weights_by_hand():
    # truth, by hand: PushSum state x = 4, w = 2 (z = 2), g = 1, lr 0.1, wd 0.5, first step:
    # m̂ = d, v̂ = d², so the step is lr·d/(|d| + eps). Adam: d = g + wd·z = 2 → x = 4 − 0.1·2/(2 + eps);
    # AdamW: z decays by lr·wd, i.e. x by the same factor: x = 4·(1 − 0.05) − 0.1·1/(1 + eps)
    eps = 1e-8
    adam = Optimizer({"name": "adam", "lr": 0.1, "weight_decay": 0.5})
    adamw = Optimizer({"name": "adamw", "lr": 0.1, "weight_decay": 0.5})
    x, g = torch.tensor([4.0], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64)
    assert float(adam.step(0, x, g, 0.1, w=2.0)) == pytest.approx(4 - 0.1 * 2 / (2 + eps), abs=1e-12)
    assert float(adamw.step(0, x, g, 0.1, w=2.0)) == pytest.approx(4 * 0.95 - 0.1 / (1 + eps), abs=1e-12)
    rows = torch.tensor([[4.0], [3.0]], dtype=torch.float64)  # w = (2, 1): z = (2, 3)
    adam.step_rows_(rows, torch.ones(2, 1, dtype=torch.float64), adam.state_rows(2, rows), 0.1, np.array([2.0, 1.0]))
    assert rows[:, 0].tolist() == pytest.approx([4 - 0.1 * 2 / (2 + eps), 3 - 0.1 * 2.5 / (2.5 + eps)], abs=1e-12)


# -- the rule: staleness scales the step's rate ---------------------------------------------
def test_step_rates_by_hand():
    # truth, by hand (α0 = 0.4): applies of (σ 0), (σ 2), (σ 0, σ 2 with weights 1/2), (no input), (σ 4, σ 4)
    w = np.array([1.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    s = np.array([0, 2, 0, 2, 4, 4])
    counts = [1, 1, 2, 0, 2]
    coefs, base = step_rates("per_gradient", 0.4, w, s, counts, 1.5)
    # mixed apply: s = (1, 1/2), s̄ = (0.5 + 0.25) / 1 = 0.75; coefs 0.5·(1/0.75), 0.5·(0.5/0.75)
    assert base.tolist() == [0.4, 0.4 / 2, pytest.approx(0.4 * 0.75), 0.4, 0.4 / 4]
    assert coefs.tolist() == [1.0, 1.0, pytest.approx(2 / 3), pytest.approx(1 / 3), 0.5, 0.5]
    # plain SGD moves by Σ w_i α_i g_i: rate × coef = w_i · α0/σ_i
    assert base[2] * coefs[2] == pytest.approx(0.5 * 0.4) and base[2] * coefs[3] == pytest.approx(0.5 * 0.4 / 2)
    coefs, base = step_rates("mean_staleness", 0.4, w, s, counts, 1.5)
    assert coefs.tolist() == w.tolist() and base.tolist() == [0.4 / 1.5] * 5  # also the apply of no input
    coefs, base = step_rates("mean_staleness", 0.4, w, s, counts, 0.5)  # ⟨σ⟩ < 1: α0
    assert base.tolist() == [0.4] * 5
    coefs, base = step_rates("constant", 0.4, w, s, counts, 1.5)
    assert coefs.tolist() == w.tolist() and base.tolist() == [0.4] * 5


def ps_point(protocol: str, name: str, lr: float, policy: str, **sets) -> dict:
    base = dict(protocol__name=protocol, cluster__learners=4, cluster__minibatch=8, workload__epochs=1.0,
                workload__evals_per_epoch=4, optimizer__name=name, optimizer__lr=lr,
                optimizer__lr_policy=policy, optimizer__weight_decay=1e-3, optimizer__momentum=0.8)
    if protocol == "softsync":
        base["protocol__n"] = 2
    base.update(sets)
    return make_point(**base)


@pytest.mark.parametrize("protocol", ["async", "softsync"])
@pytest.mark.parametrize("name, lr", OPTIMIZERS)
def test_mean_staleness_is_constant_at_alpha_over_mean_sigma(protocol, name, lr):
    # truth: Rudra's rule α = α0/⟨σ⟩ — the same trace replayed with `constant` at α0/⟨σ⟩ gives
    # the same curves and weights, bit for bit (the arithmetic is the same), on the batched
    # and the one-at-a-time path; and the policy does change the run (the rate is not
    # normalised away, as it was for AdaGrad when the policy scaled the gradient)
    mean_rate = ps_point(protocol, name, lr, "mean_staleness")
    trace = simulate(mean_rate).trace
    # ⟨σ⟩ by hand: the σ of every apply input summed exactly (integers) over their count, not by
    # the replay's own function (the replay derives its ⟨σ⟩ from the trace by itself)
    sigmas = [int(v) for v in trace.inputs["staleness"]]
    sigma = math.fsum(sigmas) / len(sigmas)
    assert sigma > 1.2
    constant = ps_point(protocol, name, lr / sigma, "constant")
    undivided = ps_point(protocol, name, lr, "constant")
    for batched in (True, False):
        opts = RunOptions(device="cpu", threads=1, batched=batched)
        a, b, c = (ReplayBackend().run(trace, p, opts) for p in (mean_rate, constant, undivided))
        assert a.curves == b.curves and a.summary == b.summary
        gap = max(abs(r["train_loss"] - q["train_loss"]) for r, q in zip(a.curves[1:], c.curves[1:]))
        assert gap > 0.05  # measured 0.1–1.8: far beyond float rounding


@pytest.mark.parametrize("name, lr", [("adagrad", 0.05), ("adam", 0.01)])
def test_mean_staleness_on_the_stacked_multi_node_replay(name, lr):
    # truth: the same equivalence on an AD-PSGD trace (several nodes, PushSum weights ≠ 1),
    # replayed by the stacked path: final weights of every node equal bit for bit. Its own ⟨σ⟩
    # is below 1, so the optimizer is given ⟨σ⟩ = 2.5, as a measured trace's header gives its own
    base = dict(protocol__name="adpsgd", cluster__learners=8, cluster__minibatch=16, workload__epochs=1.0,
                workload__evals_per_epoch=2, optimizer__name=name, optimizer__weight_decay=1e-3,
                cluster__stragglers__fraction=0.25, cluster__stragglers__slowdown=2.0)
    point = make_point(**base, optimizer__lr=lr, optimizer__lr_policy="mean_staleness")
    trace = simulate(point).trace
    sigma = 2.5
    finals = []
    for p in (point, make_point(**base, optimizer__lr=lr / sigma, optimizer__lr_policy="constant")):
        rep = make_replayer(trace, build_model(p), load_data(p), Optimizer(p["optimizer"], sigma), stacked="on")
        rep.run()
        assert rep.fallback is None
        finals.append(torch.stack([x for x, _ in rep.final_states().values()]))
    assert torch.equal(finals[0], finals[1])


def reference_replay(trace: Trace, point: dict) -> torch.Tensor:
    """An independent parameter-server replay: weights versions kept by hand, each gradient by
    plain autograd on a model loaded with the version it read, each apply one step of the
    torch.optim optimizer with its learning rate set for that step: per_gradient's
    α_i = α0/σ_i (α0 when σ_i = 0); with several gradients, the step's rate α0·s̄
    (s̄ = Σ w_i s_i / Σ w_i, s_i = α_i/α0) on Σ w_i (s_i/s̄) g_i."""
    ops, inp, cfg = trace.ops, trace.inputs, point["optimizer"]
    model, data = build_model(point), load_data(point)
    x = nn.Parameter(nn.utils.parameters_to_vector(model.parameters()).detach().clone())
    ref = torch_optimizer(cfg["name"], [x], cfg["lr"], cfg["weight_decay"], cfg["momentum"])
    stream = SampleStream(int(trace.header["data_seed"]), int(trace.header["samples_per_epoch"]))
    versions, grads = {0: x.detach().clone()}, {}
    for i in range(trace.n_ops):
        if ops["kind"][i] == GRAD:
            nn.utils.vector_to_parameters(versions[int(ops["src_version"][i])], model.parameters())
            model.zero_grad()
            idx = torch.from_numpy(stream.indices(int(ops["sample_start"][i]), int(ops["batch_size"][i])))
            F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
            grads[i] = torch.cat([q.grad.reshape(-1) for q in model.parameters()])
        elif ops["kind"][i] == APPLY:
            s, c = int(ops["in_start"][i]), int(ops["in_count"][i])
            ws = inp["weight"][s:s + c].tolist()
            rates = [1.0 / max(1, sigma) for sigma in inp["staleness"][s:s + c].tolist()]
            mean_rate = sum(w * r for w, r in zip(ws, rates)) / sum(ws)
            x.grad = sum(w * r / mean_rate * grads.pop(int(g)) for g, w, r in zip(inp["grad_op"][s:s + c], ws, rates))
            for group in ref.param_groups:
                group["lr"] = cfg["lr"] * mean_rate
            ref.step()
            versions[int(ops["version"][i]) + 1] = x.detach().clone()
    return x.detach()


@pytest.mark.parametrize("protocol", ["async", "softsync"])
@pytest.mark.parametrize("name, lr", OPTIMIZERS)
def test_per_gradient_rates_equal_torch_optim_stepped_by_hand(protocol, name, lr):
    # truth: reference_replay (torch.optim with the rate set step by step, plain autograd); on
    # async traces every step has one gradient and its rate is exactly α0/σ_i
    point = ps_point(protocol, name, lr, "per_gradient", workload__epochs=0.5)
    trace = simulate(point).trace
    assert trace.inputs["staleness"].max() >= 2
    if protocol == "async":
        assert (trace.ops["in_count"][trace.ops["kind"] == APPLY] == 1).all()
    rep = make_replayer(trace, build_model(point), load_data(point),
                        Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"])), batched=False)
    rep.run()
    assert torch.allclose(rep.final_states()[0][0], reference_replay(trace, point), rtol=0, atol=1e-5)


def test_per_gradient_one_gradient_per_step_is_alpha_over_sigma_exactly():
    # truth: α0/σ_i computed by hand for every apply of an async trace (α0 when σ_i = 0)
    point = ps_point("async", "adam", 0.01, "per_gradient")
    trace = simulate(point).trace
    rep = make_replayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"], 0.0))
    applies = np.flatnonzero(trace.ops["kind"] == APPLY)
    by_hand = [0.01 / sigma if sigma > 0 else 0.01 for sigma in trace.inputs["staleness"].tolist()]
    assert rep.plan.lr[applies].tolist() == by_hand
    assert rep.plan.coefs.tolist() == [1.0] * len(applies)


# -- through the CLI -------------------------------------------------------------------------
SCENARIO = """
name = "rates"
seed = 3
[workload]
epochs = 1
evals_per_epoch = 2
[cluster]
learners = 4
minibatch = 8
[optimizer]
name = "adam"
lr = 0.01
weight_decay = 0.01
betas = [0.85, 0.995]
[protocol]
name = "async"
"""


def _curves(out: Path) -> list[list[str]]:
    lines = (out / "curves.csv").read_text().splitlines()
    head = lines[0].split(",")
    keep = [head.index(k) for k in ("epoch", "sim_time_s", "test_error", "train_loss")]
    return [[row.split(",")[k] for k in keep] for row in lines[1:]]


def test_cli_adam_mean_staleness_equals_constant_at_divided_rate(tmp_path, capsys):
    # truth: the equivalence, through `ddlsim run`: ⟨σ⟩ read from the run's own trace, then the
    # constant policy at α0/⟨σ⟩ (written exactly with repr) gives the same curves.csv values
    scenario = tmp_path / "rates.toml"
    scenario.write_text(SCENARIO)
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", str(scenario), "--out", str(a), "--quiet", "--no-report", "--traces",
                 "--set", 'optimizer.lr_policy="mean_staleness"']) == 0
    trace = trace_io.read(next(a.glob("runs/*/trace.ddlt")))
    sigma = mean_staleness(trace.inputs["staleness"])
    assert sigma > 1
    assert main(["run", str(scenario), "--out", str(b), "--quiet", "--no-report",
                 "--set", f"optimizer.lr={0.01 / sigma!r}"]) == 0
    capsys.readouterr()
    assert _curves(a) == _curves(b) and len(_curves(a)) >= 2
    assert float(_curves(a)[-1][2]) < 0.5  # it learned (chance is 0.9)


@pytest.mark.parametrize("setting, words", [
    ("optimizer.betas=[0.9, 1.0]", ["optimizer.betas", "[0.9, 1.0]", "β2", "< 1"]),
    ("optimizer.betas=[-0.1, 0.9]", ["optimizer.betas", "[-0.1, 0.9]", "β1", "≥ 0"]),
    ("optimizer.betas=[0.9]", ["optimizer.betas", "[0.9]", "two numbers"]),
    ("optimizer.betas=[0.9, 0.99, 0.5]", ["optimizer.betas", "[0.9, 0.99, 0.5]", "two numbers"]),
    ("optimizer.betas=0.9", ["optimizer.betas", "0.9", "array"]),
    ('optimizer.betas=["a", 0.9]', ["optimizer.betas", "β1", "number"]),
    ("optimizer.betas=[nan, 0.9]", ["optimizer.betas", "β1", "NaN"]),
    ("optimizer.eps=0", ["optimizer.eps", "0", "> 0"]),
    ("optimizer.eps=-1e-8", ["optimizer.eps", "-1e-08", "> 0"]),
    ("optimizer.eps=nan", ["optimizer.eps", "NaN"]),
    ("optimizer.eps=inf", ["optimizer.eps", "inf", "finite"]),
    ('optimizer.name="adamax"', ["optimizer.name", "adamax", "adamw"]),
])
def test_bad_betas_and_eps_are_one_line_before_any_work(tmp_path, capsys, setting, words):
    # truth: the schema's ranges (betas each in [0, 1), eps > 0): exit 2, one line naming key
    # and value, nothing written
    scenario = tmp_path / "rates.toml"
    scenario.write_text(SCENARIO)
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--out", str(out), "--quiet", "--set", setting]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ddlsim: error: ") and "\n" not in err and "Traceback" not in err
    for w in words:
        assert w in err, (w, err)
    assert not out.exists()


def test_optimizer_refuses_bad_values_when_called_directly():
    # truth: the same ranges, for a backend called without the scenario loader
    for cfg, key in [({"betas": [0.9, 1.0]}, "optimizer.betas"), ({"eps": 0.0}, "optimizer.eps"),
                     ({"eps": math.nan}, "optimizer.eps"), ({"name": "adamax"}, "optimizer.name"),
                     ({"lr_policy": "sometimes"}, "optimizer.lr_policy")]:
        with pytest.raises(ValueError, match=key):
            Optimizer({"name": "adam", "lr": 0.1, **cfg})
    assert Optimizer({"name": "adagrad", "lr": 0.1}).eps == 1e-10
    assert Optimizer({"name": "adam", "lr": 0.1, "eps": None}).eps == 1e-8


# -- the live backend steps with the same rule -------------------------------------------------
@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_live_server_steps_as_the_replay_of_its_trace():
    # truth: the live server's final weights; the replay sees only the measured trace (softsync
    # c = 2: steps of two gradients of different staleness, per-gradient rates, Adam)
    from tests.test_live import live, point, replay_final

    p = point("softsync", learners=4, policy="per_gradient", protocol__n=2, optimizer__name="adam",
              optimizer__lr=0.01, optimizer__weight_decay=0.01)
    r = live(p)
    inputs = r.trace.inputs
    assert int(inputs["staleness"].max()) >= 1 and (r.trace.ops["in_count"] == 2).any()
    assert torch.allclose(replay_final(r.trace, p), r.final_weights, atol=1e-5, rtol=0)


@pytest.mark.live
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_live_gossip_nodes_step_as_the_replay_of_their_trace():
    # truth: every node's live de-biased weights x_i / w_i (SGP, AdamW); the replay sees only
    # the merged trace
    from ddlsim.backends.replay_generic import Replayer
    from tests.test_live import live, point

    p = point("sgp", learners=4, mb=8, optimizer__name="adamw", optimizer__lr=0.01, optimizer__weight_decay=0.01)
    r = live(p)
    rep = Replayer(r.trace, build_model(p), load_data(p), Optimizer(p["optimizer"], 0.0), batched=False)
    rep.run()
    fin = rep.final_states()
    z = torch.stack([fin[i][0] / fin[i][1] for i in range(4)])
    assert torch.allclose(z, r.final_weights, atol=1e-5, rtol=0)


def test_the_schema_offers_exactly_the_optimizers_and_policies_there_are():
    # truth: backends/optim.py's tables (the schema cannot import torch, so it spells them too)
    from ddlsim.backends.optim import OPTIMIZERS as NAMES, POLICIES
    from ddlsim.scenarios.schema import FIELD_BY_KEY

    assert FIELD_BY_KEY["optimizer.name"].choices == NAMES
    assert FIELD_BY_KEY["optimizer.lr_policy"].choices == POLICIES
