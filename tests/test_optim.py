"""Tests for backends/optim.py: update rules, learning-rate schedule, staleness policies."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ddlsim.backends.optim import (Optimizer, adagrad_update, lr_at, mean_staleness, sgd_update,
                                   staleness_scale)

torch.set_num_threads(1)


def t(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float64)


def test_sgd_plain_step_by_hand():
    # truth: x − lr·g = [1 − 0.1·0.5, 2 + 0.1·1]
    x, buf = sgd_update(t(1.0, 2.0), t(0.5, -1.0), None, lr=0.1)
    assert torch.allclose(x, t(0.95, 2.1)) and buf is None


def test_sgd_momentum_two_steps_by_hand():
    # truth, by hand: buf1 = g1 = 1, x1 = 0 − 0.1·1; buf2 = g2 + 0.9·buf1 = 2.9, x2 = x1 − 0.29
    x, buf = sgd_update(t(0.0), t(1.0), None, 0.1, momentum=0.9)
    assert torch.allclose(x, t(-0.1)) and torch.allclose(buf, t(1.0))
    x, buf = sgd_update(x, t(2.0), buf, 0.1, momentum=0.9)
    assert torch.allclose(x, t(-0.39)) and torch.allclose(buf, t(2.9))


def test_nesterov_two_steps_by_hand():
    # truth, by hand: step1 = g1 + 0.9·buf1 = 1.9; buf2 = 2.9, step2 = g2 + 0.9·2.9 = 4.61
    x, buf = sgd_update(t(0.0), t(1.0), None, 0.1, momentum=0.9, nesterov=True)
    assert torch.allclose(x, t(-0.19))
    x, buf = sgd_update(x, t(2.0), buf, 0.1, momentum=0.9, nesterov=True)
    assert torch.allclose(x, t(-0.19 - 0.461))


def test_weight_decay_by_hand():
    # truth: d = g + wd·x = 1 + 0.5·2 = 2; x = 2 − 0.1·2
    x, _ = sgd_update(t(2.0), t(1.0), None, 0.1, weight_decay=0.5)
    assert torch.allclose(x, t(1.8))


def test_adagrad_two_steps_by_hand():
    # truth, by hand: acc = 4, x1 = 1 − 0.1·2/2 = 0.9; acc = 5, x2 = 0.9 − 0.1·1/√5
    x, acc = adagrad_update(t(1.0), t(2.0), None, 0.1)
    assert torch.allclose(x, t(0.9)) and torch.allclose(acc, t(4.0))
    x, acc = adagrad_update(x, t(1.0), acc, 0.1)
    assert torch.allclose(x, t(0.9 - 0.1 / math.sqrt(5.0)))


@pytest.mark.parametrize("name, wd", [("sgd", 0.01), ("sgd", 0.0), ("nesterov", 0.01), ("adagrad", 0.01)])
def test_matches_torch_optim(name, wd):
    # truth: torch.optim.SGD / torch.optim.Adagrad on the same gradient sequence
    gen = torch.Generator().manual_seed(3)
    p = torch.nn.Parameter(torch.randn(7, generator=gen, dtype=torch.float64))
    x = p.detach().clone()
    cfg = {"name": name, "lr": 0.05, "momentum": 0.8, "weight_decay": wd, "lr_policy": "constant"}
    ref = (torch.optim.Adagrad([p], lr=0.05, weight_decay=wd) if name == "adagrad" else
           torch.optim.SGD([p], lr=0.05, momentum=0.8, weight_decay=wd, nesterov=name == "nesterov"))
    opt = Optimizer(cfg)
    for _ in range(5):
        g = torch.randn(7, generator=gen, dtype=torch.float64)
        p.grad = g.clone()
        ref.step()
        x = opt.step(0, x, g, 0.05)
    assert torch.allclose(x, p.detach(), atol=1e-12)


def test_updates_are_pure():
    # rule: the update functions never modify their arguments (old versions stay valid)
    x, g, buf = t(1.0, 2.0), t(0.3, 0.4), t(0.1, 0.1)
    keep = [x.clone(), g.clone(), buf.clone()]
    sgd_update(x, g, buf, 0.1, momentum=0.9, nesterov=True, weight_decay=0.1)
    adagrad_update(x, g, buf, 0.1, weight_decay=0.1)
    for a, b in zip((x, g, buf), keep):
        assert torch.equal(a, b)


def test_own_state_updates_only_the_state_in_place():
    # rule: own_state lets the optimizer state change in place; x and g never change
    x, g, buf = t(1.0, 2.0), t(0.3, 0.4), t(0.1, 0.1)
    keep_x, keep_g = x.clone(), g.clone()
    new_x, new_buf = sgd_update(x, g, buf, 0.1, momentum=0.9, own_state=True)
    assert new_buf is buf and torch.allclose(buf, t(0.3 + 0.09, 0.4 + 0.09))
    assert torch.equal(x, keep_x) and torch.equal(g, keep_g) and new_x is not x
    acc = t(1.0, 1.0)
    _, new_acc = adagrad_update(x, g, acc, 0.1, own_state=True)
    assert new_acc is acc and torch.allclose(acc, t(1.09, 1.16))


def test_lr_schedule_by_hand():
    # truth, by hand: α0 = 0.1, warm-up 2 epochs, ×0.1 from epoch 5, then ×0.5 from epoch 8
    cfg = {"lr": 0.1, "warmup_epochs": 2.0, "milestones": [[5, 0.1], [8, 0.5]]}
    assert lr_at(0.0, cfg) == 0.0
    assert lr_at(1.0, cfg) == pytest.approx(0.05)
    assert lr_at(3.0, cfg) == pytest.approx(0.1)
    assert lr_at(4.99, cfg) == pytest.approx(0.1)
    assert lr_at(5.0, cfg) == pytest.approx(0.01)
    assert lr_at(9.0, cfg) == pytest.approx(0.005)
    arr = lr_at(np.array([1.0, 5.0, 9.0]), cfg)
    assert np.allclose(arr, [0.05, 0.01, 0.005])
    assert lr_at(7.0, {"lr": 0.2}) == pytest.approx(0.2)


def test_staleness_policies_by_hand():
    # truth: docs/design.md — constant α0; α0/⟨σ⟩ (α0 when ⟨σ⟩ < 1); α0/σ_i (α0 when σ_i = 0)
    s = np.array([0, 1, 2, 4])
    assert mean_staleness(s) == pytest.approx(1.75)
    assert np.allclose(staleness_scale("constant", s, 1.75), 1.0)
    assert np.allclose(staleness_scale("mean_staleness", s, 4.0), 0.25)
    assert np.allclose(staleness_scale("mean_staleness", s, 0.5), 1.0)
    assert np.allclose(staleness_scale("per_gradient", s, 1.75), [1.0, 1.0, 0.5, 0.25])
    with pytest.raises(ValueError):
        staleness_scale("bogus", s, 1.0)


def test_optimizer_state_is_per_node():
    # truth: two nodes stepping with momentum equal two independent single-node runs
    cfg = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}
    both = Optimizer(cfg)
    a, b = t(0.0), t(0.0)
    for _ in range(3):
        a = both.step(0, a, t(1.0), 0.1)
        b = both.step(1, b, t(-2.0), 0.1)
    solo = Optimizer(cfg)
    c = t(0.0)
    for _ in range(3):
        c = solo.step(0, c, t(1.0), 0.1)
    assert torch.allclose(a, c) and torch.allclose(b, -2 * c)


def test_weight_decay_acts_on_debiased_weights():
    # truth, by hand: PushSum state x = 4, w = 2 → z = 2; d = g + wd·z = 1 + 0.5·2 = 2; x − 0.1·2
    opt = Optimizer({"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.5})
    assert torch.allclose(opt.step(0, t(4.0), t(1.0), 0.1, w=2.0), t(3.8))


@pytest.mark.parametrize("name, wd", [("sgd", 0.01), ("sgd", 0.0), ("nesterov", 0.01), ("adagrad", 0.01),
                                      ("adagrad", 0.0)])
def test_row_batched_form_matches_torch_optim_per_row(name, wd):
    # truth: one torch.optim loop per row (A independent models), each with its own learning-rate
    # schedule; the batched form steps all rows at once (per-row rates, then a shared rate)
    gen = torch.Generator().manual_seed(7)
    A, P = 3, 6
    cfg = {"name": name, "lr": 0.05, "momentum": 0.8, "weight_decay": wd, "lr_policy": "constant"}
    start = torch.randn(A, P, generator=gen, dtype=torch.float64)
    params = [torch.nn.Parameter(start[a].clone()) for a in range(A)]
    refs = [torch.optim.Adagrad([p], lr=1.0, weight_decay=wd) if name == "adagrad" else
            torch.optim.SGD([p], lr=1.0, momentum=0.8, weight_decay=wd, nesterov=name == "nesterov")
            for p in params]
    opt = Optimizer(cfg)
    x, state = start.clone(), torch.zeros(A, P, dtype=torch.float64)
    for step in range(5):
        g = torch.randn(A, P, generator=gen, dtype=torch.float64)
        lrs = [0.05 * (a + 1) / (step + 1) for a in range(A)] if step % 2 else [0.03] * A
        for a in range(A):
            for group in refs[a].param_groups:
                group["lr"] = lrs[a]
            params[a].grad = g[a].clone()
            refs[a].step()
        lr = lrs[0] if step % 2 == 0 else torch.tensor(lrs, dtype=torch.float64)
        opt.step_rows_(x, g, state, lr)
    assert torch.allclose(x, torch.stack([p.detach() for p in params]), atol=1e-12)


def test_row_batched_weight_decay_acts_on_debiased_rows():
    # truth, by hand: rows x = (4, 3) with PushSum w = (2, 1) → z = (2, 3); d = g + wd·z;
    # plain SGD: x − lr·d = (4 − 0.1·(1 + 0.5·2), 3 − 0.1·(1 + 0.5·3))
    opt = Optimizer({"name": "sgd", "lr": 0.1, "momentum": 0.0, "weight_decay": 0.5})
    x = torch.tensor([[4.0], [3.0]], dtype=torch.float64)
    opt.step_rows_(x, torch.ones(2, 1, dtype=torch.float64), None, 0.1, np.array([2.0, 1.0]))
    assert torch.allclose(x, torch.tensor([[3.8], [2.75]], dtype=torch.float64))
    y = torch.tensor(4.0, dtype=torch.float64)
    out = torch.empty((), dtype=torch.float64)
    opt.step_rows_(y, torch.tensor(1.0, dtype=torch.float64), None, 0.1, 2.0, out=out)  # one 0-d row, into out
    assert float(out) == pytest.approx(3.8) and float(y) == 4.0
