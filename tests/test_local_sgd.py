"""Local SGD, DiLoCo and compressed all-reduce: simulator, trace and replay against independent truths.

Each test names its truth: an equivalence between two protocols replayed by two different
interpreters (the generic replay for AllReduce-SGD and plain local SGD, the local replay for
outer ops and compression), a closed form of the simulated time, the byte formula of each
compression counted by hand from the digits MLP's layer sizes, and the CLI's refusals.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from ddlsim.backends.optim import Optimizer, mean_staleness
from ddlsim.backends.replay import make_replayer
from ddlsim.backends.replay_generic import Replayer
from ddlsim.backends.replay_local import LocalReplayer
from ddlsim.backends.workloads import build_model, load_data
from ddlsim.scenarios.cli import main
from ddlsim.simulator import trace as T
from ddlsim.simulator.protocols.local import fragment_tensors
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

torch.set_num_threads(1)

# digits MLP: 64 → 128 → 10 (weights (128, 64), (10, 128); biases 128 and 10)
MLP_P = 128 * 64 + 128 + 10 * 128 + 10


def point(protocol: str, **sets) -> dict:
    base = dict(protocol__name=protocol, cluster__learners=4, cluster__minibatch=8, workload__epochs=1.0,
                workload__evals_per_epoch=2, optimizer__name="sgd", optimizer__momentum=0.0, optimizer__lr=0.1,
                cluster__compute__distribution="deterministic")
    base.update(sets)
    return make_point(**base)


def replayed(p: dict, kind: type | None = None):
    trace = simulate(p).trace
    opt = Optimizer(p["optimizer"], mean_staleness(trace.inputs["staleness"]))
    model = build_model(p)
    if kind is LocalReplayer:
        rep = LocalReplayer(trace, model, load_data(p), opt)
    else:
        rep = make_replayer(trace, model, load_data(p), opt, stacked="off")
        assert kind is None or isinstance(rep, kind)
    rep.run()
    return trace, rep


def node0(rep) -> torch.Tensor:
    return rep.final_states()[0][0]


def test_local_sgd_with_one_local_step_is_allreduce_sgd() -> None:
    # truth: averaging the models after every plain-SGD step is the step on the averaged gradient
    ar_trace, ar = replayed(point("allreduce"), Replayer)
    ls_trace, ls = replayed(point("local_sgd", protocol__local_steps=1), Replayer)
    # the same minibatches in the same order
    g_ar, g_ls = ar_trace.ops["kind"] == T.GRAD, ls_trace.ops["kind"] == T.GRAD
    assert np.array_equal(ar_trace.ops["sample_start"][g_ar], ls_trace.ops["sample_start"][g_ls])
    assert torch.allclose(node0(ar), node0(ls), atol=1e-6, rtol=0)
    for a, b in zip(ar.curves, ls.curves, strict=True):
        assert a["test_error"] == pytest.approx(b["test_error"], abs=1 / 360 + 1e-12)
    # every node holds the average after the last averaging
    states = ls.final_states()
    assert all(torch.allclose(states[k][0], states[0][0], atol=1e-6) for k in states)


def test_local_replay_of_plain_local_sgd_equals_the_generic_replay() -> None:
    # truth: two interpreters of one trace (mixes, per-node applies) agree
    p = point("local_sgd", protocol__local_steps=3, optimizer__momentum=0.9)
    _, gen = replayed(p, Replayer)
    _, loc = replayed(p, LocalReplayer)
    assert torch.allclose(node0(gen), node0(loc), atol=1e-6, rtol=0)


@pytest.mark.parametrize("inner", ["adamw", "sgd"])
def test_diloco_with_outer_sgd_of_rate_one_is_local_sgd(inner: str) -> None:
    # truth: a − 1·(a − mean x_i) = mean x_i: DiLoCo's outer SGD (lr 1, momentum 0) is plain averaging
    sets = dict(protocol__local_steps=4, optimizer__name=inner, optimizer__lr=0.01 if inner == "adamw" else 0.1)
    ls_trace, ls = replayed(point("local_sgd", **sets), Replayer)
    dl_trace, dl = replayed(point("diloco", protocol__outer_lr=1.0, protocol__outer_momentum=0.0, **sets),
                            LocalReplayer)
    assert int((dl_trace.ops["kind"] == T.OUTER).sum()) == math.ceil(int((ls_trace.ops["kind"] == T.APPLY).sum())
                                                                      / 4 / 4)
    assert torch.allclose(node0(ls), node0(dl), atol=1e-5, rtol=0)


def test_diloco_outer_nesterov_step_by_hand() -> None:
    # truth: one round by hand — H inner SGD steps per node, then a ← a − lr·(Δ + μ·Δ) (first
    # Nesterov step: the buffer is Δ), Δ the mean over nodes of a − x_i
    p = point("diloco", protocol__local_steps=2, protocol__outer_lr=0.7, protocol__outer_momentum=0.9,
              workload__epochs=32 / 1437, cluster__learners=2)
    trace, rep = replayed(p, LocalReplayer)
    assert int((trace.ops["kind"] == T.OUTER).sum()) == 1
    model = build_model(p)
    data = load_data(p)
    x0 = torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()
    from ddlsim.backends.flatmodel import FlatModel
    from ddlsim.backends.replay_data import Minibatches
    flat = FlatModel(build_model(p))
    mb = Minibatches(data, int(trace.header["data_seed"]), int(trace.header["samples_per_epoch"]))
    xs = [x0.clone(), x0.clone()]
    for k in range(2):
        for i in range(2):
            xb, yb = mb.one((k * 2 + i) * 8, 8)
            g, _ = flat.grad(xs[i], xb, yb)
            xs[i] = xs[i] - 0.1 * g
    delta = sum(x0 - x for x in xs) / 2
    expect = x0 - 0.7 * (delta + 0.9 * delta)
    assert torch.allclose(node0(rep), expect, atol=1e-6, rtol=0)


def test_powersgd_at_full_rank_is_uncompressed_allreduce() -> None:
    # truth: a rank at or above every matrix's smaller side (64 and 10) sends them exactly
    _, plain = replayed(point("allreduce"), Replayer)
    _, psgd = replayed(point("allreduce", protocol__compression="powersgd", protocol__powersgd_rank=64),
                       LocalReplayer)
    assert torch.allclose(node0(plain), node0(psgd), atol=1e-5, rtol=0)


def test_powersgd_compressing_at_the_gradients_rank_is_uncompressed_allreduce() -> None:
    # truth: with 2 nodes of μ = 4 the mean gradient of the (128, 64) weight has rank ≤ 8, so P = M̄Q
    # spans its columns and P̂P̂ᵀM̄ = M̄ (the error memory keeps each node's M_i − M̄, whose mean is 0):
    # rank 16 sends 16·(128 + 64) elements where the matrix has 8,192, and applies the exact mean.
    # Rank 2 (below the rank) must not, or the comparison could not fail.
    from ddlsim.simulator.compression_bytes import powersgd_compresses

    assert powersgd_compresses((128, 64), 16)
    small = dict(cluster__learners=2, cluster__minibatch=4)
    _, plain = replayed(point("allreduce", **small), Replayer)
    _, exact = replayed(point("allreduce", protocol__compression="powersgd", protocol__powersgd_rank=16, **small),
                        LocalReplayer)
    _, low = replayed(point("allreduce", protocol__compression="powersgd", protocol__powersgd_rank=2, **small),
                      LocalReplayer)
    assert torch.allclose(node0(plain), node0(exact), atol=1e-5, rtol=0)
    assert float((node0(plain) - node0(low)).abs().max()) > 1e-2


def test_fp16_rounding_moves_the_weights_a_little() -> None:
    # truth: fp16 keeps 11 significant bits: the replay differs from float32 by rounding only
    _, plain = replayed(point("allreduce"), Replayer)
    _, half = replayed(point("allreduce", protocol__compression="fp16"), LocalReplayer)
    diff = float((node0(plain) - node0(half)).abs().max())
    assert 0 < diff < 1e-2


@pytest.mark.parametrize("slowdown", [1.0, 3.0])
def test_simulated_time_of_local_sgd_is_the_closed_form(slowdown: float) -> None:
    # truth: deterministic compute, no overlap: K steps of (c + step_s), ⌈K/H⌉ ring all-reduces of
    # the model, each 2(N−1)(α + o) + 2(N−1)/N · 4P/β (hand-written, not the simulator's collectives);
    # with one persistent straggler (a quarter of 4 nodes) every round waits for its c·slowdown steps
    n, mu, H, base, per, step = 4, 8, 5, 0.003, 0.0002, 0.0004
    alpha, o, beta = 1e-4, 2e-5, 1e8
    p = point("local_sgd", protocol__local_steps=H, cluster__compute__base_s=base,
              cluster__compute__per_sample_s=per, cluster__compute__step_s=step, cluster__network__latency_s=alpha,
              cluster__network__overhead_s=o, cluster__network__bandwidth_Bps=beta,
              cluster__stragglers__fraction=0.25 if slowdown > 1 else 0.0, cluster__stragglers__slowdown=slowdown)
    sim = simulate(p)
    K = math.ceil(1437 / (n * mu))
    ring = 2 * (n - 1) * (alpha + o) + 2 * (n - 1) / n * 4 * MLP_P / beta
    expect = K * ((base + per * mu) * slowdown + step) + math.ceil(K / H) * ring
    assert sim.summary["sim_time_s"] == pytest.approx(expect, rel=1e-12)


@pytest.mark.parametrize("compression, rank, elements", [
    ("none", 1, MLP_P),
    ("fp16", 1, MLP_P / 2),                     # 2 bytes of 4
    ("bf16", 1, MLP_P / 2),
    ("powersgd", 2, 2 * (128 + 64) + 2 * (10 + 128) + 128 + 10),   # r·(n + m) per matrix, vectors whole
    ("powersgd", 9, 9 * (128 + 64) + 9 * (10 + 128) + 128 + 10),
    ("powersgd", 10, 10 * (128 + 64) + 10 * 128 + 128 + 10),      # (10, 128) at rank ≥ 10: sent whole
])
def test_bytes_of_each_compression_are_the_formula(compression: str, rank: int, elements: float) -> None:
    # truth: per averaging a ring all-reduce moves 2(N−1) × the payload through the NICs
    n, H = 4, 3
    p = point("local_sgd", protocol__local_steps=H, protocol__compression=compression,
              protocol__powersgd_rank=rank)
    sim = simulate(p)
    K = math.ceil(1437 / (n * 8))
    total = math.ceil(K / H) * 2 * (n - 1) * 4 * elements
    assert sim.summary["bytes_sent_per_node_per_iter"] * n * K == pytest.approx(total, rel=1e-12)


def test_fragments_partition_the_tensors_in_order() -> None:
    # truth: contiguous, every fragment used, balanced by elements where the sizes allow
    assert fragment_tensors([8192, 128, 1280, 10], 2) == [0, 1, 1, 1]
    assert fragment_tensors([1, 1, 1, 1], 4) == [0, 1, 2, 3]
    assert fragment_tensors([5, 5, 5, 5], 2) == [0, 0, 1, 1]
    assert fragment_tensors([100, 1, 1], 3) == [0, 1, 2]


def test_streaming_diloco_synchronises_one_fragment_every_h_over_f_steps() -> None:
    # truth: F = 2, H = 4: an outer op every 2 local steps, fragments in turn, all at the end
    p = point("diloco", protocol__local_steps=4, protocol__fragments=2)
    trace, rep = replayed(p, LocalReplayer)
    outer = trace.ops["kind"] == T.OUTER
    frags = trace.ops["batch_index"][outer].tolist()
    K = math.ceil(1437 / 32)
    assert len(frags) == K // 2 + (2 if K % 2 else 1)
    assert frags[:4] == [0, 1, 0, 1]
    assert not rep.diverged and rep.curves[-1]["test_error"] < 0.5


def test_trace_round_trips_as_schema_2_and_older_traces_stay_version_1(tmp_path: Path) -> None:
    # truth: the file says which schema it needs; schema 1 traces are unchanged
    sim = simulate(point("diloco", protocol__local_steps=2))
    T.write(sim.trace, tmp_path / "d.ddlt")
    back = T.read(tmp_path / "d.ddlt")
    assert back.header["schema_version"] == 2 and back.header["averaging"]["compression"] == "none"
    for name in T.OP_COLUMNS:
        assert np.array_equal(back.ops[name], sim.trace.ops[name])
    old = simulate(point("allreduce")).trace
    T.write(old, tmp_path / "a.ddlt")
    assert T.read(tmp_path / "a.ddlt").header["schema_version"] == 1
    # an outer op in a version-1 file is refused
    header = dict(sim.trace.header, schema_version=1)
    with pytest.raises(T.TraceError, match="outer ops need schema version 2"):
        T.check(T.Trace(header, sim.trace.ops, sim.trace.inputs))


def test_points_without_the_new_keys_keep_their_ids() -> None:
    # truth: a key at its default is left out of the hash, so every earlier point keeps its run id
    from ddlsim.scenarios.load import run_id
    a, b = point("allreduce"), point("allreduce", protocol__local_steps=1, protocol__compression="none")
    assert run_id(a) == run_id(b)
    assert run_id(point("allreduce", protocol__compression="fp16")) != run_id(a)
    assert "local_steps" not in simulate(a).trace.header["point"]["protocol"]


@pytest.mark.parametrize("sets, words", [
    (["protocol.name=\"local_sgd\"", "protocol.local_steps=0"], ["protocol.local_steps", "0"]),
    (["protocol.name=\"allreduce\"", "protocol.compression=\"powersgd\"", "protocol.powersgd_rank=0"],
     ["protocol.powersgd_rank", "0"]),
    (["protocol.name=\"async\"", "protocol.compression=\"fp16\""], ["protocol.compression", "fp16", "async"]),
    (["protocol.name=\"diloco\"", "protocol.outer_momentum=1.0"], ["protocol.outer_momentum", "1"]),
    (["protocol.name=\"diloco\"", "protocol.outer_momentum=-0.1"], ["protocol.outer_momentum", "-0.1"]),
    (["protocol.name=\"local_sgd\"", "protocol.fragments=2", "protocol.local_steps=4"], ["protocol.fragments"]),
    (["protocol.name=\"diloco\"", "protocol.fragments=8", "protocol.local_steps=4"], ["protocol.fragments", "8"]),
    (["protocol.name=\"diloco\"", "protocol.compression=\"lz4\""], ["protocol.compression", "lz4"]),
])
def test_bad_input_is_one_line_naming_key_and_value(tmp_path: Path, capsys: pytest.CaptureFixture, sets: list[str],
                                                    words: list[str]) -> None:
    args = ["simulate", "demo", "--out", str(tmp_path / "o"), "--quiet"]
    for s in sets:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ddlsim: error:") and "\n" not in err and "Traceback" not in err
    for w in words:
        assert w in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("change, words", [
    (lambda h, o: h["averaging"].update(compression="zip"), ["averaging.compression", "zip"]),
    (lambda h, o: h["averaging"].update(powersgd_rank=0), ["averaging.powersgd_rank", "0"]),
    (lambda h, o: h["averaging"].update(tensors=[0, 2, 1, 1]), ["averaging.tensors"]),
    (lambda h, o: o["coef"].__setitem__(o["kind"] == T.OUTER, 0.0), ["coef", "outer learning rate"]),
    (lambda h, o: o["self_coef"].__setitem__(o["kind"] == T.OUTER, 1.0), ["self_coef", "outer momentum"]),
    (lambda h, o: o["batch_index"].__setitem__(o["kind"] == T.OUTER, 5), ["batch_index", "fragment"]),
])
def test_a_replay_refuses_a_bad_schema_2_trace_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                           change, words: list[str]) -> None:
    # truth: check_replayable names the header field or the op's column, before any replay
    p = point("diloco", protocol__local_steps=2, protocol__fragments=2)
    tr = simulate(p).trace
    ops = {k: np.array(v) for k, v in tr.ops.items()}
    header = dict(tr.header, averaging=dict(tr.header["averaging"]))
    change(header, ops)
    T.write(T.Trace(header, ops, tr.inputs), tmp_path / "bad.ddlt")
    assert main(["trace", str(tmp_path / "bad.ddlt")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ddlsim: error:") and "\n" not in err and "bad.ddlt" in err
    for w in words:
        assert w in err


def test_fp16_of_two_byte_parameters_sends_two_bytes_and_bucketed_allreduce_halves_its_bytes() -> None:
    # truth: fp16 sends 2 bytes an element whatever the parameters' width; all-reduce steps
    # of fp16 move half of float32's NIC bytes, bucket by bucket (2(N−1) × bytes per step)
    n = 4
    K = math.ceil(1437 / (n * 8))
    two = simulate(point("local_sgd", protocol__local_steps=1, protocol__compression="fp16",
                         cluster__network__bytes_per_param=2.0)).summary
    assert two["bytes_sent_per_node_per_iter"] * n * K == pytest.approx(K * 2 * (n - 1) * 2 * MLP_P, rel=1e-12)
    plain = simulate(point("allreduce", protocol__bucket_bytes=4096)).summary
    half = simulate(point("allreduce", protocol__bucket_bytes=4096, protocol__compression="fp16")).summary
    assert plain["bytes_sent_per_node_per_iter"] == pytest.approx(K * 2 * (n - 1) * 4 * MLP_P / (n * K), rel=1e-12)
    assert half["bytes_sent_per_node_per_iter"] == pytest.approx(plain["bytes_sent_per_node_per_iter"] / 2, rel=1e-12)


def test_diloco_time_on_two_nodes_of_two_gpus_is_the_hierarchical_closed_form() -> None:
    # truth: per averaging, a hierarchical all-reduce: 2(g−1)(α_i + o) + 2(g−1)/g · B/β_i inside
    # the node, 2(n−1)(α + o) + 2(n−1)/n · B/β between the n = 2 nodes; compute as above
    g, H, c = 2, 3, 0.003 + 0.0002 * 8
    alpha, ai, o, beta, bi = 1e-4, 5e-6, 1e-5, 1e8, 1e10
    p = point("diloco", protocol__local_steps=H, cluster__gpus_per_node=g, cluster__compute__base_s=0.003,
              cluster__compute__per_sample_s=0.0002, cluster__network__latency_s=alpha,
              cluster__network__intra_latency_s=ai, cluster__network__overhead_s=o,
              cluster__network__bandwidth_Bps=beta, cluster__network__intra_bandwidth_Bps=bi)
    sim = simulate(p)
    K = math.ceil(1437 / (4 * 8))
    B = 4 * MLP_P
    inside = 2 * (g - 1) * (ai + o) + 2 * (g - 1) / g * B / bi
    allreduce = inside + 2 * (2 - 1) * (alpha + o) + 2 * (2 - 1) / 2 * B / beta
    assert sim.summary["sim_time_s"] == pytest.approx(K * c + math.ceil(K / H) * allreduce, rel=1e-12)


def test_stacked_replay_of_local_sgd_equals_the_generic_replay() -> None:
    # truth: the stacked strategy batches the nodes' local steps; it executes the same semantics
    from ddlsim.backends.replay_stacked import StackedReplayer

    p = point("local_sgd", protocol__local_steps=4, optimizer__momentum=0.9)
    trace = simulate(p).trace
    finals = []
    for mode in ("off", "on"):
        opt = Optimizer(p["optimizer"], mean_staleness(trace.inputs["staleness"]))
        rep = make_replayer(trace, build_model(p), load_data(p), opt, stacked=mode)
        assert isinstance(rep, StackedReplayer) == (mode == "on")
        rep.run()
        finals.append(node0(rep))
    assert torch.allclose(finals[0], finals[1], atol=1e-6, rtol=0)


@pytest.mark.parametrize("model, dataset", [("mlp", "digits"), ("logistic", "digits"), ("mnist1d_mlp", "mnist1d"),
                                            ("mnist1d_cnn", "mnist1d"), ("lenet", "digits"),
                                            ("rudra_cifar", "digits"), ("resnet18", "digits")])
def test_the_catalogue_s_tensor_shapes_are_the_torch_models(model: str, dataset: str) -> None:
    # truth: the backends' own torch modules, built for the data set
    from ddlsim.simulator.catalog import dataset_info, param_shapes

    p = make_point(workload__model=model, workload__dataset=dataset)
    torch_shapes = [tuple(t.shape) for t in build_model(p).parameters()]
    assert param_shapes(model, dataset_info(dataset)) == torch_shapes


@pytest.mark.parametrize("fragments, tau, beta", [(1, 2, 1e10), (1, 2, 1e6), (2, 1, 1e10), (2, 1, 1e6)])
def test_streaming_diloco_overlapped_time_is_the_closed_form(fragments: int, tau: int, beta: float) -> None:
    # truth (Douillard et al. 2025, streaming DiLoCo; torchft's fragment_sync_delay τ): a fragment's
    # all-reduce starts after the step whose turn it is and runs while the nodes take τ more steps;
    # they wait only for what the τ steps do not hide, max(0, R_f − τ·c'). A turn whose τ steps
    # would reach the end is averaged blocking, and the last step averages every fragment (blocking).
    # Hand count: n = 4, μ = 8, K = ⌈1437 / 32⌉ = 45, H = 4, c' = c + step_s; ring R_f of the
    # fragment's 4-byte elements, 2(N−1)(α + o) + 2(N−1)/N · B/β (not the simulator's collectives).
    n, mu, H, base, per, step, alpha, o = 4, 8, 4, 0.003, 0.0002, 0.0004, 1e-4, 2e-5
    p = point("diloco", protocol__local_steps=H, protocol__fragments=fragments, protocol__overlap=tau,
              cluster__compute__base_s=base, cluster__compute__per_sample_s=per, cluster__compute__step_s=step,
              cluster__network__latency_s=alpha, cluster__network__overhead_s=o, cluster__network__bandwidth_Bps=beta)
    K, c1 = 45, base + per * mu + step

    def ring(elements: int) -> float:
        return 2 * (n - 1) * (alpha + o) + 2 * (n - 1) / n * 4 * elements / beta

    if fragments == 1:
        # turns at 4, 8, …, 44: the ten up to 40 overlapped (40 + 2 < 45), 44 blocking, then the end
        expect = K * c1 + 10 * max(0.0, ring(MLP_P) - tau * c1) + 2 * ring(MLP_P)
    else:
        # fragment 0 the (128, 64) weight, fragment 1 the rest; turns every 2 steps, 0 first:
        # 2 … 42 overlapped (11 of fragment 0, 10 of fragment 1), 44 fragment 1 blocking, the end both
        r0, r1 = ring(128 * 64), ring(MLP_P - 128 * 64)
        expect = (K * c1 + 11 * max(0.0, r0 - tau * c1) + 10 * max(0.0, r1 - tau * c1) + r1 + r0 + r1)
    sim = simulate(p)
    assert sim.summary["sim_time_s"] == pytest.approx(expect, rel=1e-12)
    blocking = simulate(point("diloco", protocol__local_steps=H, protocol__fragments=fragments,
                              cluster__compute__base_s=base, cluster__compute__per_sample_s=per,
                              cluster__compute__step_s=step, cluster__network__latency_s=alpha,
                              cluster__network__overhead_s=o, cluster__network__bandwidth_Bps=beta))
    assert sim.summary["sim_time_s"] < blocking.summary["sim_time_s"]


def test_streaming_diloco_replay_applies_each_fragment_tau_steps_later() -> None:
    # truth: an independent loop of streaming DiLoCo with overlap τ (Douillard et al. 2025; mixing
    # factor α = 0 as torchft): after the step whose turn it is, fragment f's new value is the
    # outer Nesterov step from its anchor on the mean pseudo-gradient of the nodes' states *then*;
    # every node takes it τ steps later, dropping its own progress on f; the end averages blocking
    from ddlsim.backends.flatmodel import FlatModel
    from ddlsim.backends.replay_data import Minibatches
    from ddlsim.simulator.dataorder import global_slice_start

    n, mu, H, F, tau, lr, olr, om = 4, 8, 4, 2, 1, 0.1, 0.7, 0.9
    p = point("diloco", protocol__local_steps=H, protocol__fragments=F, protocol__overlap=tau,
              protocol__outer_lr=olr, protocol__outer_momentum=om, optimizer__lr=lr)
    trace, rep = replayed(p, LocalReplayer)
    assert not rep.diverged
    flat = FlatModel(build_model(p))
    data = load_data(p)
    batches = Minibatches(data, int(trace.header["data_seed"]), int(trace.header["samples_per_epoch"]))
    frag_of = fragment_tensors(flat.sizes, F)
    bounds = np.concatenate([[0], np.cumsum(flat.sizes)])
    span = {f: (int(bounds[frag_of.index(f)]), int(bounds[len(frag_of) - frag_of[::-1].index(f)])) for f in range(F)}
    x0 = flat.work.detach().clone()
    xs = [x0.clone() for _ in range(n)]
    anchor = x0.clone()
    buf: dict[int, torch.Tensor] = {}

    def outer(f: int) -> torch.Tensor:
        lo, hi = span[f]
        a = anchor[lo:hi]
        d = a - torch.stack([x[lo:hi] for x in xs]).mean(0)
        buf[f] = d.clone() if f not in buf else om * buf[f] + d
        return a - olr * (d + om * buf[f])

    def land(f: int, new: torch.Tensor) -> None:
        lo, hi = span[f]
        anchor[lo:hi] = new
        for x in xs:
            x[lo:hi] = new

    K, every, turn = 45, H // F, 0
    pending: tuple[int, torch.Tensor, int] | None = None
    for k in range(K):
        for i in range(n):
            xb, yb = batches.one(global_slice_start(k, i, n, mu), mu)
            g, _ = flat.grad(xs[i], xb, yb)
            xs[i] = xs[i] - lr * g
        done = k + 1
        if pending is not None and done == pending[2]:
            land(pending[0], pending[1])
            pending = None
        if done % every == 0 or done == K:
            if done < K and done + tau < K:
                pending = (turn, outer(turn), done + tau)
                turn = (turn + 1) % F
                continue
            for f in (range(F) if done == K else [turn]):
                land(f, outer(f))
            turn = (turn + 1) % F
    finals = rep.final_states()
    for i in range(n):
        assert torch.allclose(finals[i][0], xs[i], atol=1e-6, rtol=0)


def test_overlap_beyond_a_fragment_s_turn_is_refused_in_one_line() -> None:
    # truth: τ < H/F (torchft: a fragment's sync lands before the next fragment's starts)
    with pytest.raises(ValueError, match=r"protocol.overlap = 2: diloco overlaps at most H/F − 1 = 1 inner steps"):
        p = point("diloco", protocol__local_steps=4, protocol__fragments=2, protocol__overlap=1)
        p["protocol"]["overlap"] = 2  # past the scenario's check: the engine keeps the bound too
        simulate(p)


def test_the_cli_refuses_overlap_beyond_a_fragment_s_turn_before_any_run(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture) -> None:
    # truth: the same bound, τ ≤ H/F − 1 (here 4/2 − 1 = 1), said once for the scenario, naming the key
    scen = tmp_path / "s.toml"
    scen.write_text('[protocol]\nname = "diloco"\nlocal_steps = 4\nfragments = 2\n[workload]\nepochs = 1\n'
                    '[sweep]\n"protocol.overlap" = [1, 2]\n')
    out = tmp_path / "out"
    assert main(["simulate", str(scen), "--out", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "'protocol.overlap' = 2" in err and "at most H/F − 1 = 1" in err
    assert not out.exists()


def test_local_sgd_with_one_local_step_after_warm_up_is_allreduce_sgd_with_momentum() -> None:
    # truth: with momentum the average of the nodes' steps is the step on the mean gradient only when
    # every node carries the all-reduce's momentum buffer into its local steps (linear in the
    # gradients and buffers); a node starting its local steps from a zero buffer breaks it
    sets = dict(optimizer__momentum=0.9, optimizer__lr=0.05)
    _, ar = replayed(point("allreduce", **sets), Replayer)
    _, ls = replayed(point("local_sgd", protocol__local_steps=1, protocol__warmup_steps=10, **sets))
    assert isinstance(ls, LocalReplayer)
    states = ls.final_states()
    for k in states:
        assert torch.allclose(states[k][0], node0(ar), atol=1e-6, rtol=0)


def test_local_sgd_after_warm_up_with_adam_is_an_independent_post_local_sgd_loop() -> None:
    # truth: PostLocalSGDOptimizer's rule written with torch.optim.Adam, one per rank: during the
    # warm-up every rank steps its own Adam on the all-reduced mean gradient, then on its own
    # gradient, the weights averaged after every H local steps and after the last
    from ddlsim.backends.flatmodel import FlatModel
    from ddlsim.backends.replay_data import Minibatches
    from ddlsim.simulator.dataorder import global_slice_start

    n, mu, H, W, lr = 4, 8, 3, 7, 0.003
    p = point("local_sgd", protocol__local_steps=H, protocol__warmup_steps=W, optimizer__name="adam",
              optimizer__lr=lr)
    trace, rep = replayed(p)
    assert isinstance(rep, LocalReplayer) and not rep.diverged
    flat = FlatModel(build_model(p))
    batches = Minibatches(load_data(p), int(trace.header["data_seed"]), int(trace.header["samples_per_epoch"]))
    params = [torch.nn.Parameter(flat.work.detach().clone()) for _ in range(n)]
    adams = [torch.optim.Adam([q], lr=lr, foreach=False) for q in params]
    K = 45

    def grad(k: int, i: int) -> torch.Tensor:
        xb, yb = batches.one(global_slice_start(k, i, n, mu), mu)
        return flat.grad(params[i].detach(), xb, yb)[0]

    local = 0
    for k in range(K):
        gs = [grad(k, i) for i in range(n)]
        if k < W:
            mean = torch.stack(gs).mean(0)
            gs = [mean] * n
        for q, a, g in zip(params, adams, gs):
            q.grad = g.clone()
            a.step()
        if k >= W:
            local += 1
            if local % H == 0 or k == K - 1:
                with torch.no_grad():
                    avg = torch.stack([q.detach() for q in params]).mean(0)
                    for q in params:
                        q.copy_(avg)
    states = rep.final_states()
    for i in range(n):
        assert torch.allclose(states[i][0], params[i].detach(), atol=1e-6, rtol=0)


@pytest.mark.parametrize("sets, ar_steps, averagings", [
    (dict(protocol__name="local_sgd", protocol__local_steps=4), 0, 12),                # ⌈45/4⌉
    (dict(protocol__name="local_sgd", protocol__local_steps=3, protocol__warmup_steps=10), 10, 12),  # ⌈35/3⌉
    (dict(protocol__name="local_sgd", protocol__warmup_steps=99), 45, 0),             # warm-up beyond K
    (dict(protocol__name="diloco", protocol__local_steps=4, protocol__fragments=2), 0, 24),  # 44/2 turns + 2
    (dict(protocol__name="diloco", protocol__local_steps=5, protocol__fragments=2), 0, 24),  # ⌊5/2⌋ = 2
    (dict(protocol__name="diloco", protocol__local_steps=4, protocol__fragments=2, protocol__overlap=1), 0, 24),
    (dict(protocol__name="allreduce", protocol__compression="fp16"), 45, 0),
])
def test_rounds_of_a_local_run_count_its_averagings(sets: dict, ar_steps: int, averagings: int) -> None:
    # truth: hand counts for K = ⌈1437 / 32⌉ = 45 iterations, and the simulated trace's own
    # synchronisations (all-reduce applies of several inputs; outer ops, or node 1's copies)
    from ddlsim.simulator.protocols.local import messages, rounds

    rest = {k: v for k, v in sets.items() if k != "protocol__name"}
    p = point(sets["protocol__name"], **rest)
    r = rounds(p)
    assert (r.allreduce_steps, r.averagings) == (ar_steps, averagings)
    ops = simulate(p).trace.ops
    kind = ops["kind"]
    assert int(((kind == T.APPLY) & (ops["in_count"] > 1)).sum()) == ar_steps
    outer = int((kind == T.OUTER).sum())
    synced = outer if outer else int(((kind == T.MIX) & (ops["node"] == 1)).sum()) - ar_steps
    assert synced == averagings
    assert messages(p, 3) == 4 * (3 * ar_steps + averagings)


def test_the_powersgd_paper_s_models_have_torch_s_shapes() -> None:
    # truth: torch's own modules. The paper's CIFAR ResNet-18 is torchvision's with a 3×3 stride-1
    # stem; its LSTM is nn.Embedding, nn.LSTM and a decoder tied to the embedding (PyTorch's
    # word_language_model RNNModel), on WikiText-2's 33,278 words
    from torchvision.models import resnet18

    from ddlsim.simulator.catalog import cifar_resnet18_shapes, lstm_lm_shapes

    net = resnet18(num_classes=10)
    net.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
    assert cifar_resnet18_shapes(10) == [tuple(t.shape) for t in net.parameters()]
    assert sum(math.prod(s) for s in cifar_resnet18_shapes(10)) == 11_173_962

    class LM(torch.nn.Module):
        def __init__(self, vocab: int, tied: bool) -> None:
            super().__init__()
            self.encoder = torch.nn.Embedding(vocab, 650)
            self.rnn = torch.nn.LSTM(650, 650, 3)
            self.decoder = torch.nn.Linear(650, vocab)
            if tied:
                self.decoder.weight = self.encoder.weight

    for tied in (True, False):
        lm = LM(1000, tied)
        assert lstm_lm_shapes(1000, tied=tied) == [tuple(t.shape) for t in lm.parameters()]
    # 33,278 × 650 + 3 × (2 · 2600 · 650 + 2 · 2600) + 33,278, counted by hand
    assert sum(math.prod(s) for s in lstm_lm_shapes()) == 33_278 * 650 + 3 * (2 * 2600 * 650 + 2 * 2600) + 33_278
