"""The replay's faster paths compute what the per-gradient paths compute (to float rounding).

Two speed paths (backends/replay_plan.py, docs/replay.md "Which per-gradient path"):

* **fused**: an apply's gradients that all read one version (a hardsync round) are computed by
  one forward and backward over all their samples, each weighted by its gradient's coefficient
  over its minibatch size. The truth it is held to: the per-gradient paths (each gradient by
  itself, then ``Σ c_j g_j``), and, where every minibatch has the same size and weight, a
  plain ``torch.optim.SGD`` loop with minibatch λμ;
* **the batching rule** (:func:`batch_rows`): row batches of stacked versions only where they
  pay; otherwise gradients one at a time (an MLP by the hand-written kernels on one row). The
  truth: the same trace replayed with row batches forced and by plain autograd;
* **several replays at once** (:func:`.replay_multi.replay_many`): the requests of replays of
  one model share calls. The truth: each replay's own ``run()``, bit for bit (the kernels'
  rows do not depend on the other rows of a call).

Tolerances, from the float32 arithmetic: two orders of summing N per-sample terms differ by at
most N·2⁻²⁴ of the terms' magnitudes (|per-sample gradient entry| ≤ 1 for these
cross-entropies: |softmax − one-hot| ≤ 1 times inputs and weights of order 1), so one step's
gradients differ by ≲ N·6e-8. A step moves the weights by the rate times the momentum gain
1/(1 − m) times that; over K steps, while the trajectories stay close, the weights differ by
≲ K · lr/(1 − m) · N · 6e-8. With K ≤ 12, lr = 0.05, m = 0.9 and N ≤ 36 that is ≈ 1.3e-5: the
tests allow 2e-5 (and check the weights moved by far more than that). No test times anything.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddlsim.backends.flatmodel import FlatModel
from ddlsim.backends.optim import Optimizer, mean_staleness
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.replay_plan import (BATCH_CAP, FUSED, FUSED_IN_BUFFER, ROWS, STACK_BUDGET_BYTES,
                                         STACK_MIN_ROWS, batch_rows, capped)
from ddlsim.backends.workloads import Data, build_model, load_data
from ddlsim.simulator.dataorder import SampleStream, shard_start
from ddlsim.simulator.trace import Trace, TraceBuilder
from tests.conftest import make_point

torch.set_num_threads(1)
N_DIGITS = 1437
TOL = 2e-5  # module doc: K · lr/(1 − m) · N · 2⁻²⁴ with K ≤ 12, lr 0.05, m 0.9, N ≤ 36, rounded up


def header(n: int = N_DIGITS, seed: int = 0) -> dict:
    return {"nodes": 1, "data_seed": seed, "samples_per_epoch": n}


def hardsync_trace(lam: int, mu: int, rounds: int, partial: list[int] | None = None,
                   weights: list[float] | None = None, n: int = N_DIGITS) -> Trace:
    """λ gradients per round on the current version (global slices), one apply of them.

    ``partial``: the last round's minibatch sizes instead of μ each (a partial last batch);
    ``weights``: the apply weights (default 1/λ each)."""
    tb = TraceBuilder()
    tb.eval(0, 0, 0.0, 0.0)
    pos = 0
    for k in range(rounds):
        sizes = partial if (partial is not None and k == rounds - 1) else [mu] * lam
        gops = []
        for i, size in enumerate(sizes):
            gops.append(tb.grad(i, 0, k, pos, size, k, k, k + 0.5, pos / n))
            pos += size
        w = weights if weights is not None else [1.0 / lam] * lam
        tb.apply(0, k, gops[::-1], w[::-1], [0] * lam, k + 1.0, pos / n)  # inputs not in trace order
        if k % 4 == 3 or k == rounds - 1:
            tb.eval(0, k + 1, k + 1.0, pos / n)
    return tb.build(header(n))


def async_trace(lam: int, mu: int, grads: int, n: int = N_DIGITS) -> Trace:
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
    tb.eval(0, v, float(grads), v * mu / n)
    return tb.build(header(n))


def point_of(model: str = "mlp", **sets) -> dict:
    base = dict(optimizer__lr=0.05, optimizer__momentum=0.9, optimizer__weight_decay=1e-3, workload__model=model)
    base.update(sets)
    return make_point(**base)


def replay(trace: Trace, point: dict, data: Data | None = None, **kw) -> Replayer:
    opt = Optimizer(point["optimizer"], mean_staleness(trace.inputs["staleness"]))
    rep = Replayer(trace, build_model(point), data if data is not None else load_data(point), opt, **kw)
    rep.run()
    return rep


def final(rep: Replayer) -> torch.Tensor:
    x, w = rep.final_states()[0]
    return x / w


def initial(point: dict) -> torch.Tensor:
    return nn.utils.parameters_to_vector(build_model(point).parameters()).detach()


# -- fused: an apply's gradients on one version ------------------------------------------------
@pytest.mark.parametrize("model", ["mlp", "rudra_cifar"])
@pytest.mark.parametrize("optimizer", ["sgd", "nesterov"])
def test_fused_hardsync_equals_the_per_gradient_paths(model, optimizer):
    # truth: the same trace with every gradient computed by itself (row batches, and plain
    # autograd one at a time), combined Σ c_j g_j; momentum and weight decay on
    lam, mu, rounds = 6, 6, 12
    point = point_of(model, optimizer__name=optimizer)
    trace = hardsync_trace(lam, mu, rounds)
    fused = replay(trace, point)
    rows = replay(trace, point, fuse=False, batching="always")
    alone = replay(trace, point, batched=False)
    assert fused.plan.kinds == [FUSED_IN_BUFFER] * rounds and fused.plan.calls == rounds
    assert set(rows.plan.kinds) == {ROWS} and alone.plan.calls == lam * rounds
    assert float((final(fused) - initial(point)).abs().max()) > 1e3 * TOL  # the weights moved
    for other in (rows, alone):
        assert torch.allclose(final(fused), final(other), atol=TOL, rtol=0)
        for a, b in zip(fused.curves, other.curves):
            assert a["updates"] == b["updates"]
            assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5, nan_ok=True)
            assert a["test_error"] == pytest.approx(b["test_error"], abs=1 / 360 + 1e-9)
    assert fused.peak_live_grads == rows.peak_live_grads == lam


def test_fused_hardsync_equals_a_plain_sgd_loop_of_minibatch_lambda_mu():
    # truth: torch.optim.SGD (momentum, weight decay) with minibatch λμ over the same samples
    lam, mu, rounds = 5, 6, 10
    point = point_of()
    trace = hardsync_trace(lam, mu, rounds)
    rep = replay(trace, point)
    model, data = build_model(point), load_data(point)
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    stream = SampleStream(0, N_DIGITS)
    for k in range(rounds):
        idx = torch.from_numpy(stream.indices(k * lam * mu, lam * mu))
        sgd.zero_grad()
        F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        sgd.step()
    ref = nn.utils.parameters_to_vector(model.parameters()).detach()
    assert rep.plan.calls == rounds and torch.allclose(final(rep), ref, atol=TOL, rtol=0)


@pytest.mark.parametrize("model", ["mlp", "rudra_cifar"])
def test_fused_with_a_partial_last_batch_and_unequal_weights(model):
    # truth: the per-gradient paths; the last round's minibatches are 6, 6, 6, 6, 2 and 4
    # samples, every round's weights unequal: the fused loss weighs sample s of gradient j by
    # c_j / μ_j, so it is still Σ c_j g_j
    lam, mu, rounds = 6, 6, 8
    weights = [0.3, 0.1, 0.2, 0.15, 0.05, 0.2]
    point = point_of(model)
    trace = hardsync_trace(lam, mu, rounds, partial=[6, 6, 6, 6, 2, 4], weights=weights)
    fused = replay(trace, point)
    rows = replay(trace, point, fuse=False)
    alone = replay(trace, point, batched=False)
    assert all(k in (FUSED, FUSED_IN_BUFFER) for k in fused.plan.kinds) and fused.plan.calls == rounds
    assert float((final(fused) - initial(point)).abs().max()) > 1e3 * TOL
    for other in (rows, alone):
        assert torch.allclose(final(fused), final(other), atol=TOL, rtol=0)
        assert fused.curves[-1]["train_loss"] == pytest.approx(other.curves[-1]["train_loss"], abs=1e-5)


def test_fused_gradients_apart_in_the_stream_and_of_several_sizes():
    # truth: plain autograd one at a time. Apply 0's gradients a, b, c read v0 and lie apart in
    # the data stream (a gather, not a slice), of sizes 3, 5, 3; f, also on v0, is computed
    # before apply 0, so the fused sum is copied out of the gradient buffer (FUSED); apply 1
    # combines d (v1) and the stale f (v0): not fused
    tb = TraceBuilder()
    a = tb.grad(0, 0, 0, 0, 3, 0, 0.0, 1.0, 0.0)
    b = tb.grad(1, 0, 0, 500, 5, 0, 0.0, 1.0, 0.0)
    c = tb.grad(2, 0, 0, 900, 3, 0, 0.0, 1.0, 0.0)
    f = tb.grad(3, 0, 0, 40, 5, 0, 0.0, 1.0, 0.0)
    tb.apply(0, 0, [a, b, c], [0.5, 0.25, 0.25], [0, 0, 0], 1.0, 0.01)
    d = tb.grad(0, 0, 1, 1200, 5, 1, 1.0, 2.0, 0.01)
    tb.apply(0, 1, [d, f], [0.5, 0.5], [0, 1], 2.0, 0.02)
    tb.eval(0, 2, 2.0, 0.02)
    trace = tb.build(header())
    point = point_of()
    fused, alone = replay(trace, point), replay(trace, point, batched=False)
    assert fused.plan.kinds == [FUSED] and fused.plan.batches[0].tolist() == [a, b, c]
    assert torch.allclose(final(fused), final(alone), atol=1e-6, rtol=0)
    assert fused.curves[0]["train_loss"] == pytest.approx(alone.curves[0]["train_loss"], abs=1e-6)


def test_more_gradients_than_a_call_holds_are_fused_in_pieces():
    # truth: plain autograd one at a time; 70 gradients of one round: two fused calls (64 + 6)
    # whose sums the apply adds
    lam, mu, rounds = 70, 1, 3
    point = point_of()
    trace = hardsync_trace(lam, mu, rounds)
    fused, alone = replay(trace, point), replay(trace, point, batched=False)
    assert len(fused.plan.batches) == 2 * rounds and [len(b) for b in fused.plan.batches[:2]] == [BATCH_CAP, 6]
    assert torch.allclose(final(fused), final(alone), atol=TOL, rtol=0)


def test_fused_divergence_stops_where_the_per_gradient_path_stops():
    # truth: the one-at-a-time replay of the same diverging trace
    point = point_of(optimizer__lr=1e5)
    trace = hardsync_trace(4, 8, 12)
    fused, alone = replay(trace, point), replay(trace, point, batched=False)
    assert fused.diverged and alone.diverged
    assert fused.diverged_at_update == alone.diverged_at_update
    assert len(fused.curves) == len(alone.curves)


def test_fused_reads_are_reported_to_the_hook():
    # the on_grad_reads hook sees every gradient of a fused batch with the state it reads
    seen: list[tuple[list[int], float]] = []

    class Probe(Replayer):
        def on_grad_reads(self, ops, x, w):
            seen.append((list(ops), float(x[:, 0].sum())))

    point = point_of()
    trace = hardsync_trace(3, 4, 2)
    rep = Probe(trace, build_model(point), load_data(point), Optimizer(point["optimizer"], 0.0))
    rep.run()
    x0 = float(initial(point)[0])
    assert [ops for ops, _ in seen] == [b.tolist() for b in rep.plan.batches]
    assert seen[0][1] == pytest.approx(3 * x0)


# -- the batching rule ---------------------------------------------------------------------------
def test_batch_rows_rule_closed_form():
    # truth: the rule's arithmetic by hand (a 2 MiB block of stacked weights, at least 8 rows)
    assert STACK_BUDGET_BYTES == 2 << 20 and STACK_MIN_ROWS == 8
    assert batch_rows(9_610, 4, "cpu", "mlp") == (2 << 20) // (9_610 * 4) == 54   # digits MLP
    assert batch_rows(21_386, 4, "cpu", "vmap") == 24                               # lenet on digits
    assert batch_rows(65_536, 4, "cpu", "mlp") == batch_rows(65_536, 4, "cpu", "vmap") == 8
    assert batch_rows(65_537, 4, "cpu", "mlp") == 1                                 # 7 rows fit
    assert batch_rows(500_618, 4, "cpu", "mlp") == 1
    assert batch_rows(89_578, 4, "cpu", "vmap") == 1                 # rudra_cifar on CIFAR-10: 5 fit
    assert batch_rows(1_000, 4, "cpu", "mlp") == BATCH_CAP == 64     # the cap still holds
    assert batch_rows(500_618, 4, "cuda", "mlp") == capped(500_618) == 64
    assert batch_rows(1 << 24, 4, "cuda", "vmap") == capped(1 << 24) == 2


def _wide_mlp_setup() -> tuple[dict, Data]:
    """An MLP of 78k parameters (600 inputs → 128 → 10): more than the rule batches on a CPU."""
    point = make_point(workload__dataset="teacher", workload__teacher_features=600, workload__teacher_samples=512,
                       optimizer__lr=0.05, optimizer__momentum=0.9, optimizer__weight_decay=1e-3)
    return point, load_data(point)


def test_a_wide_mlp_replays_one_gradient_at_a_time_and_agrees_with_row_batches():
    # truth: the same async trace with row batches forced, and by plain autograd one at a time
    point, data = _wide_mlp_setup()
    trace = async_trace(6, 4, 48, n=512)
    auto = replay(trace, point, data)
    rows = replay(trace, point, data, batching="always")
    alone = replay(trace, point, data, batched=False)
    assert auto.rows == 1 and auto.flat.row_kernel and auto.plan.calls == 48 and not auto.plan.batches
    assert rows.rows == 64 and rows.plan.calls < 48
    assert float((final(auto) - initial(point)).abs().max()) > 1e3 * TOL
    for other in (rows, alone):
        assert torch.allclose(final(auto), final(other), atol=TOL, rtol=0)
        assert auto.curves[-1]["train_loss"] == pytest.approx(other.curves[-1]["train_loss"], abs=1e-5)


@pytest.mark.parametrize("in_place", [False, True])
def test_the_row_kernel_equals_plain_autograd(in_place):
    # truth: plain autograd (FlatModel.grad without the row kernel), scaled afterwards
    torch.manual_seed(3)
    for model in (nn.Sequential(nn.Flatten(), nn.Linear(12, 7), nn.ReLU(), nn.Linear(7, 4)),
                  nn.Sequential(nn.Linear(12, 5), nn.ReLU(), nn.Linear(5, 4, bias=False))):
        flat = FlatModel(model)
        z = torch.randn(flat.size)
        xb = torch.randn(5, 3, 4) if isinstance(model[0], nn.Flatten) else torch.randn(5, 12)
        yb = torch.randint(0, 4, (5,))
        ref, ref_loss = flat.grad(z, xb, yb, 0.5)
        ref = ref.clone()
        flat.row_kernel = True
        g, loss = flat.grad(z, xb, yb, 0.5, in_place)
        assert (g.data_ptr() == flat.grad_buf.data_ptr()) == in_place
        assert torch.allclose(g, ref, atol=1e-6, rtol=1e-5)
        assert float(loss) == pytest.approx(float(ref_loss.detach()), rel=1e-6)


def test_fused_on_a_wide_mlp_and_with_adam():
    # truth: plain autograd one at a time; the fused path does not depend on the row rule
    point, data = _wide_mlp_setup()
    point["optimizer"].update(name="adam", lr=1e-3, betas=[0.9, 0.999], eps=1e-8)
    trace = hardsync_trace(4, 4, 6, n=512)
    fused, alone = replay(trace, point, data), replay(trace, point, data, batched=False)
    assert fused.rows == 1 and fused.plan.calls == 6
    assert torch.allclose(final(fused), final(alone), atol=TOL, rtol=0)


# -- several replays at once ---------------------------------------------------------------------
def _seeds(make_trace, seeds: list[int], **sets) -> tuple[list[dict], list[Trace], Data]:
    points = [point_of(seed=s, **sets) for s in seeds]
    return points, [make_trace(s) for s in seeds], load_data(points[0])


def _replayers(points: list[dict], traces: list[Trace], data: Data) -> list[Replayer]:
    return [Replayer(t, build_model(p), data, Optimizer(p["optimizer"], mean_staleness(t.inputs["staleness"])))
            for p, t in zip(points, traces)]


def _same_run(a: Replayer, b: Replayer) -> None:
    """Bit for bit: final weights, curves, divergence."""
    assert torch.equal(final(a), final(b))
    assert len(a.curves) == len(b.curves)
    for ra, rb in zip(a.curves, b.curves):
        assert ra.keys() == rb.keys()
        assert all(ra[k] == rb[k] or (np.isnan(ra[k]) and np.isnan(rb[k])) for k in ra)
    assert (a.diverged, a.diverged_at_update, a.updates) == (b.diverged, b.diverged_at_update, b.updates)


def _count_calls(monkeypatch) -> dict[str, int]:
    calls = {"rows": 0, "fused": 0}
    rows, fused = FlatModel.grad_batch, FlatModel.grad_weighted_batch

    def count_rows(self, *a, **k):
        calls["rows"] += 1
        return rows(self, *a, **k)

    def count_fused(self, *a, **k):
        calls["fused"] += 1
        return fused(self, *a, **k)

    monkeypatch.setattr(FlatModel, "grad_batch", count_rows)
    monkeypatch.setattr(FlatModel, "grad_weighted_batch", count_fused)
    return calls


def test_replays_at_once_equal_each_replay_alone_hardsync(monkeypatch):
    # truth: each replay's own run(); three seeds (weights, data order) of a hardsync trace:
    # one fused call per round for all three instead of three
    from ddlsim.backends.replay_multi import replay_many, shares_calls

    rounds = 10
    points, traces, data = _seeds(lambda s: hardsync_trace(4, 6, rounds), [0, 1, 2])
    traces = [Trace({**t.header, "data_seed": s}, t.ops, t.inputs) for s, t in enumerate(traces)]
    alone = _replayers(points, traces, data)
    for r in alone:
        r.run()
    together = _replayers(points, traces, data)
    assert all(shares_calls(r) for r in together)
    calls = _count_calls(monkeypatch)
    curves = replay_many(together)
    assert calls["fused"] == rounds  # was 3 × rounds one by one
    for a, b, c in zip(alone, together, curves):
        _same_run(a, b)
        assert c is b.curves
    assert not torch.equal(final(alone[0]), final(alone[1]))  # the seeds differ


def test_replays_at_once_equal_each_replay_alone_rows(monkeypatch):
    # truth: each replay's own run(); async traces of 4 learners: row batches of 4, three
    # replays' rows in one call
    from ddlsim.backends.replay_multi import replay_many

    points, traces, data = _seeds(lambda s: async_trace(4, 4, 80), [3, 4, 5])
    traces = [Trace({**t.header, "data_seed": s}, t.ops, t.inputs) for s, t in enumerate(traces)]
    alone = _replayers(points, traces, data)
    for r in alone:
        r.run()
    per_replay = len(alone[0].plan.batches)
    together = _replayers(points, traces, data)
    calls = _count_calls(monkeypatch)
    replay_many(together)
    assert calls["rows"] == per_replay < 80  # one shared call per step, not three
    for a, b in zip(alone, together):
        _same_run(a, b)


def test_replays_at_once_with_one_diverging_and_other_models():
    # truth: each replay's own run(): a diverging replay stops where it stops alone and the
    # others go on; a CNN (vmap path, calls not shared) and an MLP of another data order
    from ddlsim.backends.replay_multi import replay_many, shares_calls

    data = load_data(point_of())
    specs = [(point_of(seed=0), hardsync_trace(4, 6, 10)),
             (point_of(seed=1, optimizer__lr=1e5), hardsync_trace(4, 6, 10)),
             (point_of("rudra_cifar", seed=2), hardsync_trace(4, 6, 10)),
             (point_of(seed=3), async_trace(4, 4, 40))]
    points, traces = [p for p, _ in specs], [t for _, t in specs]
    alone = _replayers(points, traces, data)
    for r in alone:
        r.run()
    together = _replayers(points, traces, data)
    assert [shares_calls(r) for r in together] == [True, True, False, True]
    replay_many(together)
    assert alone[1].diverged and not alone[0].diverged
    for a, b in zip(alone, together):
        _same_run(a, b)
