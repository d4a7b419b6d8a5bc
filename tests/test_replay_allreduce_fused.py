"""All-reduce rounds fused like hardsync rounds (backends/replay_plan.py: equal_states).

An AllReduce-SGD trace (docs/decentralized.md) has every node compute its gradient on its own
version, each a copy of node 0's (a mix of self_coef 0, coef 1) or the initial weights; one
apply on node 0 combines them. The plan proves those versions equal from the ops alone and
computes the round as one forward/backward over its λμ samples. The truths here: the
per-node paths (each gradient on its own node's version: plain autograd one at a time, and
row batches), an independent per-node loop written below (one module per node, torch.optim on
node 0, copies to the others), and SGD with minibatch λμ; where copies may differ (a
hand-made trace), the per-gradient replay and the states each gradient read.

Tolerance: that of tests/test_replay_speed_paths.py (two orders of summing N per-sample
terms differ by N·2⁻²⁴; over K ≤ 12 steps at lr 0.05 and momentum 0.9 with N = λμ ≤ 36 the
weights differ by ≲ 1.3e-5): 2e-5, with the weights moved by far more. No test times anything.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ddlsim.backends.optim import Optimizer, mean_staleness
from ddlsim.backends.replay import make_replayer
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.replay_local import LocalReplayer
from ddlsim.backends.replay_plan import FUSED, FUSED_IN_BUFFER, ROWS, equal_states, plan_trace
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.simulator.dataorder import SampleStream
from ddlsim.simulator.run import simulate
from ddlsim.simulator.trace import APPLY, GRAD, MIX, Trace, TraceBuilder
from tests.conftest import make_point

torch.set_num_threads(1)
N_DIGITS = 1437
TOL = 2e-5  # module doc
ROUNDS = 12
STRAGGLY = {"cluster__stragglers__fraction": 0.34, "cluster__stragglers__slowdown": 2.0}
ADAM = {"optimizer__name": "adam", "optimizer__lr": 1e-3, "optimizer__momentum": 0.0,
        "optimizer__weight_decay": 0.0}


def point_of(protocol: str, lam: int, mu: int, rounds: int = ROUNDS, **sets) -> dict:
    """A simulated point of ``rounds`` iterations: ⌈epochs · 1437 / (λμ)⌉ = rounds."""
    base = dict(protocol__name=protocol, cluster__learners=lam, cluster__minibatch=mu,
                workload__epochs=(rounds * lam * mu - 0.5) / N_DIGITS, optimizer__lr=0.05,
                optimizer__momentum=0.9, optimizer__weight_decay=1e-3)
    base.update(sets)
    return make_point(**base)


def replayer(trace: Trace, point: dict, cls: type[Replayer] = Replayer, **kw) -> Replayer:
    return cls(trace, build_model(point), load_data(point), Optimizer(point["optimizer"],
               mean_staleness(trace.inputs["staleness"])), **kw)


def replay(trace: Trace, point: dict, **kw) -> Replayer:
    rep = replayer(trace, point, **kw)
    rep.run()
    return rep


def node_states(rep: Replayer) -> list[torch.Tensor]:
    states = rep.final_states()
    return [states[k][0] / states[k][1] for k in sorted(states)]


def initial(point: dict) -> torch.Tensor:
    return nn.utils.parameters_to_vector(build_model(point).parameters()).detach()


def torch_optimizer(point: dict, params) -> torch.optim.Optimizer:
    o = point["optimizer"]
    if o["name"] == "adam":
        return torch.optim.Adam(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"] or 1e-8)
    return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], weight_decay=o["weight_decay"])


def per_node_reference(point: dict, lam: int, mu: int, rounds: int) -> torch.Tensor:
    """AllReduce-SGD written out: node i holds its own module, computes the mean cross-entropy
    gradient of slice i of global batch k on it, the λ gradients are averaged, node 0 steps
    (torch.optim) and every node loads node 0's weights."""
    data = load_data(point)
    nodes = [build_model(point) for _ in range(lam)]
    opt = torch_optimizer(point, nodes[0].parameters())
    stream = SampleStream(point["seed"], N_DIGITS)
    for k in range(rounds):
        grads = []
        for i, m in enumerate(nodes):
            idx = torch.from_numpy(stream.indices(k * lam * mu + i * mu, mu))
            m.zero_grad()
            F.cross_entropy(m(data.train_x[idx]), data.train_y[idx]).backward()
            grads.append([p.grad.clone() for p in m.parameters()])
        for j, p in enumerate(nodes[0].parameters()):
            p.grad = sum(g[j] for g in grads) / lam
        opt.step()
        for m in nodes[1:]:
            m.load_state_dict(nodes[0].state_dict())
    return nn.utils.parameters_to_vector(nodes[0].parameters()).detach()


def sgd_loop(point: dict, lam: int, mu: int, rounds: int) -> torch.Tensor:
    """One learner's torch.optim loop with minibatch λμ over the global order."""
    data, model = load_data(point), build_model(point)
    opt = torch_optimizer(point, model.parameters())
    stream = SampleStream(point["seed"], N_DIGITS)
    for k in range(rounds):
        idx = torch.from_numpy(stream.indices(k * lam * mu, lam * mu))
        opt.zero_grad()
        F.cross_entropy(model(data.train_x[idx]), data.train_y[idx]).backward()
        opt.step()
    return nn.utils.parameters_to_vector(model.parameters()).detach()


# -- the rule ----------------------------------------------------------------------------------
def test_equal_states_rule_on_a_hand_made_trace():
    # truth: the rule worked out by hand. Three nodes; state ids: node 0 → 0..3, node 1 → 4..7,
    # node 2 → 8..10 (offset = version 0 of each)
    tb = TraceBuilder()
    g = tb.grad(0, 0, 0, 0, 4, 0, 0.0, 1.0, 0.0)
    tb.apply(0, 0, [g], [1.0], [0], 1.0, 0.0)               # (0,1): a step, its own
    tb.mix(1, 0, 0, 1, 1.0, 0.0, 1.0, 1.0, 0.0)              # (1,1) ← copy of (0,1)
    tb.mix(2, 0, 1, 1, 1.0, 0.0, 1.0, 1.0, 0.0)              # (2,1) ← copy of (1,1): a chain
    tb.mix(1, 1, 0, 0, 1.0, 0.0, 1.0, 1.0, 0.0)              # (1,2) ← copy of the stale (0,0)
    tb.mix(0, 1, 2, 0, 0.5, 0.0, 1.0, 1.0, 0.0)              # (0,2) ← ½ (2,0): not a copy (w ½)
    tb.mix(2, 1, 0, 1, 1.0, 0.5, 1.0, 1.0, 0.0)              # (2,2) ← ½ (2,1) + (0,1): not a copy
    tb.mix(1, 2, 2, 1, 1.0, 0.0, 1.0, 1.0, 0.0)              # (1,3) ← copy of (2,1) = (0,1)
    tb.mix(0, 2, 1, 2, 1.0, 0.0, 1.0, 1.0, 0.0)              # (0,3) ← copy of (1,2) = (0,0)
    trace = tb.build({"nodes": 3, "data_seed": 0, "samples_per_epoch": N_DIGITS})
    plan = plan_trace(trace, Optimizer(make_point()["optimizer"]), False)
    assert plan.offset.tolist() == [0, 4, 8]
    same = equal_states(trace.ops, plan.offset, 11)
    #                        (0,0..3)       (1,0..3)       (2,0..2)
    assert same.tolist() == [0, 1, 2, 0] + [0, 1, 0, 1] + [0, 1, 10]


def test_a_fragment_copy_is_not_a_copy_of_the_whole():
    # truth: docs/trace.md — a mix whose batch_index names a fragment copies only that
    # fragment; the rest of the node's weights stay, so the version is its own
    tb = TraceBuilder()
    g = tb.grad(0, 0, 0, 0, 4, 0, 0.0, 1.0, 0.0)
    tb.apply(0, 0, [g], [1.0], [0], 1.0, 0.0)
    tb.fragment_mix(1, 0, 0, 1, 0, 1.0, 1.0, 0.0)
    ops = tb.build({"nodes": 2, "data_seed": 0, "samples_per_epoch": N_DIGITS}).ops
    assert equal_states(ops, np.array([0, 2]), 4).tolist() == [0, 1, 0, 3]


# -- fused ≡ per node, on simulated all-reduce traces ---------------------------------------------
@pytest.mark.parametrize("lam,mu", [(2, 12), (3, 12), (9, 4)])
@pytest.mark.parametrize("straggly", [False, True])
@pytest.mark.parametrize("opt", ["momentum", "adam"])
def test_fused_allreduce_equals_the_per_node_paths(lam, mu, straggly, opt):
    # truth: each node's gradient on its own version — ddlsim's per-gradient paths (plain
    # autograd one at a time; row batches, not fused) and per_node_reference above
    point = point_of("allreduce", lam, mu, **(STRAGGLY if straggly else {}), **(ADAM if opt == "adam" else {}))
    trace = simulate(point).trace
    assert trace.header["iterations"] == ROUNDS
    auto = make_replayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"], 0.0))
    assert type(auto) is Replayer and auto.plan.kinds == [FUSED_IN_BUFFER] * ROUNDS  # one call a round
    assert auto.plan.calls == ROUNDS
    fused = replay(trace, point)
    alone = replay(trace, point, batched=False)
    rows = replay(trace, point, batching="always", fuse=False)
    assert alone.plan.calls == lam * ROUNDS and FUSED_IN_BUFFER not in rows.plan.kinds
    ref = per_node_reference(point, lam, mu, ROUNDS)
    assert float((ref - initial(point)).abs().max()) > 250 * TOL  # the weights moved (Adam: ≤ lr a step)
    for other in (alone, rows):
        for a, b in zip(node_states(fused), node_states(other)):
            assert torch.allclose(a, b, atol=TOL, rtol=0)
        for a, b in zip(fused.curves, other.curves):
            assert a["updates"] == b["updates"]
            assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-5, nan_ok=True)
            assert a["test_error"] == pytest.approx(b["test_error"], abs=1 / 360 + 1e-9)
    for x in node_states(fused):  # every node holds node 0's weights
        assert torch.allclose(x, ref, atol=TOL, rtol=0)
    assert all(r["consensus_distance"] < 1e-5 for r in fused.curves)  # (the mean of λ equal rows rounds)


def test_fused_allreduce_reads_what_each_node_reads():
    # truth: the per-gradient replay's own reads; the on_grad_reads hook sees, for every
    # gradient of a fused round, a state equal to the one its node's gradient reads there
    seen: dict[str, dict[int, torch.Tensor]] = {"fused": {}, "alone": {}}

    def probe(key: str) -> type[Replayer]:
        class Probe(Replayer):
            def on_grad_reads(self, ops, x, w):
                assert all(v == 1.0 for v in w)
                for op, row in zip(ops, x):
                    seen[key][op] = row.clone()
        return Probe

    point = point_of("allreduce", 3, 12, rounds=4, **STRAGGLY)
    trace = simulate(point).trace
    for key, kw in (("fused", {}), ("alone", {"batched": False})):
        replayer(trace, point, probe(key), **kw).run()
    assert sorted(seen["fused"]) == sorted(seen["alone"]) == np.flatnonzero(trace.ops["kind"] == GRAD).tolist()
    for op, x in seen["alone"].items():
        assert torch.allclose(seen["fused"][op], x, atol=TOL, rtol=0)


def test_fused_allreduce_divergence_stops_where_the_per_gradient_path_stops():
    # truth: the one-at-a-time replay of the same diverging trace
    point = point_of("allreduce", 4, 8, optimizer__lr=1e5)
    trace = simulate(point).trace
    fused, alone = replay(trace, point), replay(trace, point, batched=False)
    assert fused.diverged and alone.diverged
    assert fused.diverged_at_update == alone.diverged_at_update
    assert len(fused.curves) == len(alone.curves)


# -- where copies may differ: no fusion ----------------------------------------------------------
def straying_trace(lam: int, mu: int, rounds: int, stray: int) -> Trace:
    """AllReduce-SGD's encoding, except in round ``stray``: node 1 takes a local step of its own
    after the copy (local SGD's second step) and node 2 averages half its old state with node
    0's new one instead of copying it; from round ``stray + 2`` on the copies agree again."""
    tb = TraceBuilder()
    v = [0] * lam
    tb.eval(-1, -1, 0.0, 0.0)
    pos = 0
    for k in range(rounds):
        gops = [tb.grad(i, i, v[i], pos + i * mu, mu, k, k, k + 0.5, pos / N_DIGITS) for i in range(lam)]
        pos += lam * mu
        tb.apply(0, v[0], gops, [1.0 / lam] * lam, [0] * lam, k + 1.0, pos / N_DIGITS)
        v[0] += 1
        for i in range(1, lam):
            half = k == stray and i == 2
            tb.mix(i, v[i], 0, v[0], 0.5 if half else 1.0, 0.5 if half else 0.0, k + 1.0, k + 1.0, pos / N_DIGITS)
            v[i] += 1
        if k == stray:
            g = tb.grad(1, 1, v[1], 1200, mu, k, k + 1.0, k + 1.5, pos / N_DIGITS)
            tb.apply(1, v[1], [g], [1.0], [0], k + 1.5, pos / N_DIGITS)
            v[1] += 1
    tb.eval(-1, -1, float(rounds), pos / N_DIGITS)
    return tb.build({"nodes": lam, "data_seed": 0, "samples_per_epoch": N_DIGITS})


def inputs_of(trace: Trace, apply_op: int) -> list[int]:
    """The grad ops apply ``apply_op`` combines, in the order of its inputs."""
    s, c = int(trace.ops["in_start"][apply_op]), int(trace.ops["in_count"][apply_op])
    return trace.inputs["grad_op"][s:s + c].tolist()


def test_rounds_on_copies_that_differ_are_not_fused():
    # truth: the per-gradient replay (plain autograd, each gradient on its own node's state),
    # and the states it read: in round stray+1 they differ, so fusing it would be wrong
    lam, mu, rounds, stray = 3, 12, 8, 3
    trace = straying_trace(lam, mu, rounds, stray)
    point = point_of("allreduce", lam, mu)
    reads: dict[int, torch.Tensor] = {}

    class Probe(Replayer):
        def on_grad_reads(self, ops, x, w):
            for op, row in zip(ops, x):
                reads[op] = row.clone()

    alone = replayer(trace, point, Probe, batched=False)
    alone.run()
    fused = replay(trace, point)
    applies = np.flatnonzero((trace.ops["kind"] == APPLY) & (trace.ops["node"] == 0))
    fused_batches = {frozenset(b.tolist()) for b, k in zip(fused.plan.batches, fused.plan.kinds)
                     if k in (FUSED, FUSED_IN_BUFFER)}
    assert len(fused_batches) == len([k for k in fused.plan.kinds if k != ROWS])
    assert [k for k, a in enumerate(applies) if frozenset(inputs_of(trace, a)) in fused_batches] == \
        [k for k in range(rounds) if k != stray + 1]
    g = inputs_of(trace, applies[stray + 1])
    assert float((reads[g[1]] - reads[g[0]]).abs().max()) > 100 * TOL   # node 1's own step
    assert float((reads[g[2]] - reads[g[0]]).abs().max()) > 100 * TOL   # node 2's half average
    for a, b in zip(node_states(fused), node_states(alone)):
        assert torch.allclose(a, b, atol=TOL, rtol=0)
    assert fused.curves[-1]["consensus_distance"] == pytest.approx(alone.curves[-1]["consensus_distance"], abs=1e-5)


def test_a_copy_is_the_arithmetic_of_its_mix():
    # truth: docs/trace.md's mix x ← self_coef·x + coef·x_src, w likewise, computed here by hand:
    # with self_coef 0 and coef 1 it is x_src exactly for finite x
    trace = straying_trace(3, 12, 2, stray=5)
    point = point_of("allreduce", 3, 12)
    rep = replay(trace, point)
    x = initial(point)
    xs = rep.final_states()[0][0]
    assert torch.equal(torch.add(x * 0.0, xs, alpha=1.0), xs)
    for x_i, w_i in rep.final_states().values():
        assert torch.equal(x_i, xs) and w_i == 1.0


@pytest.mark.parametrize("protocol,sets", [
    ("dpsgd", STRAGGLY), ("sgp", STRAGGLY), ("local_sgd", {"protocol__local_steps": 3, **STRAGGLY}),
])
def test_other_decentralized_traces_are_not_fused(protocol, sets):
    # truth: docs/decentralized.md — D-PSGD and SGP apply each node's gradient to its own state
    # (applies of one input: nothing to fuse); local SGD's H > 1 local steps diverge the copies
    point = point_of(protocol, 4, 8, **sets)
    trace = simulate(point).trace
    rep = replayer(trace, point)  # the generic plan (what fuses; the stacked replay never does)
    assert not any(k in (FUSED, FUSED_IN_BUFFER) for k in rep.plan.kinds)
    if protocol == "local_sgd":  # the averaged states are copies (equal), the local steps are not
        applies = trace.ops["kind"] == APPLY
        assert (trace.ops["in_count"][applies] == 1).all() and (trace.ops["kind"] == MIX).any()


def test_compressed_allreduce_is_the_local_replay():
    # truth: docs/replay.md — a compressed averaging is LocalReplayer's (its arithmetic is on
    # the real gradients), never fused by the generic plan
    point = point_of("allreduce", 4, 8, protocol__compression="fp16")
    trace = simulate(point).trace
    rep = make_replayer(trace, build_model(point), load_data(point), Optimizer(point["optimizer"], 0.0))
    assert isinstance(rep, LocalReplayer)


# -- AllReduce-SGD ≡ hardsync ≡ SGD with minibatch λμ ---------------------------------------------
@pytest.mark.parametrize("lam,mu", [(3, 12), (6, 6)])
def test_allreduce_equals_hardsync_equals_sgd_of_minibatch_lambda_mu(lam, mu):
    # truth: docs/design.md — both protocols take slice i of global batch k for node/learner i
    # (global_slice), so each round holds the same λμ samples at weight 1/λ: SGD with
    # minibatch λμ (a plain torch.optim loop over SampleStream(seed, 1437))
    ar_point, hs_point = point_of("allreduce", lam, mu, **STRAGGLY), point_of("hardsync", lam, mu, **STRAGGLY)
    ar, hs = simulate(ar_point).trace, simulate(hs_point).trace
    for t in (ar, hs):  # the traces' sample orders agree: round k is [kλμ, (k+1)λμ)
        ops, inp = t.ops, t.inputs
        applies = np.flatnonzero(ops["kind"] == APPLY)
        assert len(applies) == ROUNDS and (ops["in_count"][applies] == lam).all()
        for k, a in enumerate(applies):
            g = inp["grad_op"][ops["in_start"][a]:ops["in_start"][a] + lam]
            assert sorted(ops["sample_start"][g].tolist()) == list(range(k * lam * mu, (k + 1) * lam * mu, mu))
            assert (ops["batch_size"][g] == mu).all() and np.allclose(inp["weight"][ops["in_start"][a]:][:lam], 1 / lam)
    assert ar.header["data_seed"] == hs.header["data_seed"]
    assert np.array_equal(ar.ops["epoch"][ar.ops["kind"] == APPLY], hs.ops["epoch"][hs.ops["kind"] == APPLY])
    ar_rep, hs_rep = replay(ar, ar_point), replay(hs, hs_point)
    assert ar_rep.plan.calls == hs_rep.plan.calls == ROUNDS
    ref = sgd_loop(ar_point, lam, mu, ROUNDS)
    assert float((ref - initial(ar_point)).abs().max()) > 1e3 * TOL
    assert torch.allclose(node_states(ar_rep)[0], node_states(hs_rep)[0], atol=TOL, rtol=0)
    for x in node_states(ar_rep) + node_states(hs_rep):
        assert torch.allclose(x, ref, atol=TOL, rtol=0)


def _overwritten_after_blowing_up(coef: float) -> Trace:
    """Two nodes: a round averaged on node 0 and copied to node 1, then node 1 alone applies a
    gradient at weight ``coef`` and is copied over from node 0: ``x ← 0·x + x_src``."""
    tb, mu = TraceBuilder(), 8
    tb.eval(-1, -1, 0.0, 0.0)
    g0 = tb.grad(0, 0, 0, 0, mu, 0, 0.0, 0.5, 0.0)
    g1 = tb.grad(1, 1, 0, mu, mu, 0, 0.0, 0.5, 0.0)
    tb.apply(0, 0, [g0, g1], [0.5, 0.5], [0, 0], 1.0, 16 / N_DIGITS)
    tb.mix(1, 0, 0, 1, 1.0, 0.0, 1.0, 1.0, 16 / N_DIGITS)  # node 1's version 1: a copy of node 0's
    g = tb.grad(1, 1, 1, 2 * mu, mu, 1, 1.0, 1.5, 16 / N_DIGITS)
    tb.apply(1, 1, [g], [coef], [0], 1.5, 24 / N_DIGITS)
    tb.mix(1, 2, 0, 1, 1.0, 0.0, 2.0, 2.0, 24 / N_DIGITS)  # the copy over node 1's own step
    tb.eval(-1, -1, 2.0, 24 / N_DIGITS)
    return tb.build({"nodes": 2, "data_seed": 0, "samples_per_epoch": N_DIGITS})


@pytest.mark.parametrize("batched", [True, False])
def test_a_copy_over_a_state_that_blew_up_is_divergence(batched: bool) -> None:
    # truth: the trace's arithmetic, 0·inf + x_src = NaN (IEEE 754): a copy does not heal a node
    # whose own step overflowed, so the replay says the run diverged; a finite step copied over
    # is no divergence
    point = point_of("allreduce", 2, 8, optimizer__momentum=0.0, optimizer__weight_decay=0.0)
    assert torch.isnan(torch.add(torch.tensor([float("inf")]) * 0.0, torch.tensor([2.0]))).all()
    assert not replay(_overwritten_after_blowing_up(1.0), point, batched=batched).diverged
    assert replay(_overwritten_after_blowing_up(1e45), point, batched=batched).diverged
