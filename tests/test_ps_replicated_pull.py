"""The replicated pull (``cluster.server.pull = "replicated"``, TensorFlow's distributed_replicated):
the gradient pushed piece by piece in backward order, each piece pulled back to every learner after
every learner's push of it has been applied, the next forward after the last piece. Checked against
iteration times worked out by hand, a loop written from the rule (one learner, AlexNet's layers),
hardsync's trace with the whole pull, and the refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ddlsim.scenarios.cli import main
from ddlsim.scenarios.load import ScenarioError, check_engine, load_text
from ddlsim.simulator.catalog import dataset_info, model_layers
from ddlsim.simulator.run import fast_engine, simulate
from ddlsim.simulator.trace import APPLY, GRAD

ITERATIONS = 3
BASE = """
[workload]
dataset = "digits"
model = "mlp"
param_count = 37500000
epochs = 1
samples_per_epoch = {samples}
[cluster]
learners = {learners}
minibatch = 16
[cluster.compute]
distribution = "deterministic"
base_s = {work}
per_sample_s = 0.0
[cluster.network]
latency_s = {latency}
overhead_s = 0.0
bandwidth_Bps = 1e9
[cluster.server]
apply_s = {apply}
pull = "{pull}"
[protocol]
name = "hardsync"
bucket_bytes = 60000000
"""


def _point(pull: str = "replicated", *, work: float = 3.0, learners: int = 2, latency: float = 0.001,
           apply: float = 0.01, sets: list[str] | None = None) -> dict:
    """One shard at 1 GB/s; the 150 MB model (37.5M parameters × 4 B) in 60 MB buckets: pushed as
    60, 60, 30 MB in backward order, pulled as pieces 0, 1, 2 of 30, 60, 60 MB in forward order.
    Forward F = W/3 (backward_fraction 2/3)."""
    text = BASE.format(samples=16 * learners * ITERATIONS, learners=learners, work=work, latency=latency,
                       apply=apply, pull=pull)
    return load_text(text, "<test>", sets or []).points()[0]


def _grads(sim) -> tuple[np.ndarray, np.ndarray]:
    ops = sim.trace.ops
    g = ops["kind"] == GRAD
    return ops["node"][g], ops["t_start"][g]


def test_two_learners_three_pieces_by_hand() -> None:
    """By hand (W = 3, latency 1 ms, apply 10 ms per whole gradient, so 4, 4, 2 ms per piece).
    The first pull at 0 sends pieces 0, 1, 2 to both learners, each piece's two transfers sharing the
    NIC out: 0.06, then 0.12 each, ending 0.06, 0.18, 0.30: both start at s = 0.301. Backward makes
    60 MB at s + 1 + 2·60/150 = s + 1.8, 60 MB at s + 2.6, 30 MB at s + 3. The NIC in takes the two
    learners' 60 MB pushes in turn (to s + 1.86, s + 1.92), each arrives 1 ms later and is applied in
    4 ms: the second at s + 1.925: piece 2's barrier; its pull, both transfers sharing the NIC out
    (0.12 s), arrives at s + 2.046. Piece 1: the same 0.8 s later (barrier s + 2.725, arrives
    s + 2.846). Piece 0: pushes to s + 3.03, s + 3.06, arrive 1 ms later, applied in 2 ms: barrier and
    the update at s + 3.063; both transfers of 30 MB (0.06 s) and the latency: the next forward at
    s + 3.124. Every iteration repeats it: starts 0.301, 3.425, 6.549; the run ends with the third
    update, 6.549 + 3.063."""
    sim = simulate(_point(), "simpy")
    nodes, starts = _grads(sim)
    want = [0.301 + k * 3.124 for k in range(ITERATIONS) for _ in range(2)]
    assert list(nodes) == [0, 1] * ITERATIONS
    assert starts == pytest.approx(want, rel=1e-12)
    assert sim.summary["sim_time_s"] == pytest.approx(0.301 + 2 * 3.124 + 3.063, rel=1e-12)


def test_the_forward_waits_for_every_piece() -> None:
    """By hand, one learner, no latency nor apply (W = 3): the first pull 0.03 + 0.06 + 0.06 = 0.15;
    pieces pushed at s + 1.8 (to + 0.06), s + 2.6 (to + 0.06), s + 3 (to s + 3.03); each pulled
    back at once: piece 0, the last, at s + 3.06. The next forward starts then, though pieces 1
    and 2 arrived long before: no share of the forward starts early (the layer-wise shared pull
    would start it at max(0.09, 0.15 − 0.2, 0.15 − 0.6) = 0.09 in the first iteration)."""
    sim = simulate(_point(learners=1, latency=0.0, apply=0.0), "simpy")
    _, starts = _grads(sim)
    assert starts == pytest.approx([0.15 + k * 3.06 for k in range(ITERATIONS)], rel=1e-12)
    shared = simulate(_point("layerwise-shared", learners=1, latency=0.0, apply=0.0), "simpy")
    assert _grads(shared)[1][0] == pytest.approx(0.09, rel=1e-12)


def _rule_loop(work: float, bw: float, lat: float, apply_s: float, backward_fraction: float,
               iterations: int) -> float:
    """The rule written as a loop, for one learner and one shard of AlexNet: a piece per layer (its
    share of the parameters), ready in backward order when backward has done its layers' multiply-adds;
    each crosses the NIC in (FIFO), is applied (FIFO), then crosses the NIC out in the order of those
    barriers; the next forward when the last has arrived. The end of the last update."""
    layers = model_layers("alexnet", dataset_info("imagenet"))
    assert layers is not None
    params = sum(layer.params for layer in layers)
    macs = sum(layer.macs for layer in layers)
    nbytes = 4.0 * params
    tx = [nbytes * layer.params / params / bw for layer in layers]
    after = [sum(la.macs for la in layers[p:]) / macs for p in range(len(layers))]  # share from p to the last
    out_free = 0.0
    for d in tx:  # the first pull: every piece, in forward order, from 0
        out_free += d
    start = out_free + lat
    end = 0.0
    for _ in range(iterations):
        in_free = q_free = 0.0
        barrier = [0.0] * len(layers)
        for p in reversed(range(len(layers))):
            ready = start + work * ((1.0 - backward_fraction) + backward_fraction * after[p])
            in_free = max(ready, in_free) + tx[p]
            q_free = max(in_free + lat, q_free) + apply_s * layers[p].params / params
            barrier[p] = q_free
        end = max(barrier)
        arrive = 0.0
        for p in sorted(range(len(layers)), key=lambda p: barrier[p]):
            out_free = max(barrier[p], out_free) + tx[p]
            arrive = max(arrive, out_free + lat)
        start = arrive
    return end


@pytest.mark.parametrize("work", [0.05, 0.5])
def test_one_learner_alexnet_is_the_rule_written_as_a_loop(work: float) -> None:
    text = BASE.replace('dataset = "digits"\nmodel = "mlp"\nparam_count = 37500000\n',
                        'dataset = "imagenet"\nmodel = "alexnet"\n')
    p = load_text(text.format(samples=16 * ITERATIONS, learners=1, work=work, latency=0.002, apply=0.03,
                              pull="replicated")).points()[0]
    bf = p["cluster"]["compute"]["backward_fraction"]
    want = _rule_loop(work, 1e9, 0.002, 0.03, bf, ITERATIONS)
    assert float(simulate(p, "simpy").summary["sim_time_s"]) == pytest.approx(want, rel=1e-12)


TIMES = ("t_start", "t_end")


@pytest.mark.parametrize("sets", [
    [],
    ["cluster.learners=4", "cluster.server.shards=2"],
    ["cluster.learners=4", "cluster.gpus_per_node=2"],
])
def test_the_trace_is_hardsyncs_with_the_whole_pull_but_for_times(sets: list[str]) -> None:
    """Deterministic compute: the same ops in the same order (learner, version read, minibatch,
    applies), and each update the same gradients with the same weights; only the times differ. (The
    order of an update's inputs is the order the server took them in, which on two nodes depends on
    the times: learner 2 reaches it before learner 1 once both nodes push at once.)"""
    rep = simulate(_point(sets=sets), "simpy").trace
    whole = simulate(_point("whole", sets=sets), "simpy").trace
    assert rep.ops.keys() == whole.ops.keys()
    for name in rep.ops:
        if name not in TIMES:
            assert np.array_equal(rep.ops[name], whole.ops[name]), name

    def updates(trace) -> list[list[tuple]]:
        o, inp = trace.ops, trace.inputs
        starts = o["in_start"][o["kind"] == APPLY].tolist() + [len(inp["grad_op"])]
        rows = list(zip(inp["grad_op"].tolist(), inp["weight"].tolist(), inp["staleness"].tolist()))
        return [sorted(rows[a:b]) for a, b in zip(starts, starts[1:])]
    assert updates(rep) == updates(whole)
    assert not np.array_equal(rep.ops["t_start"], whole.ops["t_start"])


def test_with_jitter_the_same_gradients_and_updates() -> None:
    """Lognormal compute: the learners finish in an order that depends on the times, so the ops are
    compared as sets: every gradient (learner, version read, minibatch) and every update the same."""
    sets = ["cluster.learners=3", "cluster.compute.distribution=\"lognormal\"", "cluster.compute.cv=0.3"]

    def rows(trace) -> list[tuple]:
        o = trace.ops
        cols = [c for c in o if c not in TIMES and c not in ("epoch", "in_start")]
        return sorted(zip(*(o[c].tolist() for c in cols)))
    rep = simulate(_point(sets=sets), "simpy").trace
    whole = simulate(_point("whole", sets=sets), "simpy").trace
    assert rows(rep) == rows(whole)
    assert sorted(rep.inputs["staleness"].tolist()) == sorted(whole.inputs["staleness"].tolist()) \
        and set(rep.inputs["staleness"].tolist()) == {0}


@pytest.mark.parametrize("sets, match", [
    (["protocol.name=\"async\""], r"'cluster.server.pull' = 'replicated'.*needs protocol.name = 'hardsync'.*'async'"),
    (["protocol.name=\"ssp\""], r"'cluster.server.pull' = 'replicated'.*not protocol.name = 'ssp'"),
    (["cluster.learners=4", "cluster.server.group_size=2"], r"'cluster.server.pull' = 'replicated'.*group_size > 1"),
])
def test_other_protocols_are_refused_in_one_line(sets: list[str], match: str) -> None:
    with pytest.raises(ScenarioError, match=match) as e:
        _point(sets=sets)
    assert "\n" not in str(e.value)


def test_the_library_preset_names_itself_when_it_is_refused() -> None:
    text = BASE.format(samples=96, learners=2, work=1.0, latency=0.0, apply=0.0, pull="whole") \
        .replace('pull = "whole"\n', "").replace('name = "hardsync"', 'name = "softsync"') \
        + 'library = "tf-distributed-replicated"\n'
    with pytest.raises(ScenarioError, match=r"'replicated' \(set by protocol.library 'tf-distributed-replicated'\)"
                       r".*not protocol.name = 'softsync'") as e:
        load_text(text)
    assert "\n" not in str(e.value)


def test_the_cli_refuses_it_with_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    f = tmp_path / "s.toml"
    f.write_text(BASE.format(samples=96, learners=2, work=1.0, latency=0.0, apply=0.0, pull="replicated")
                 .replace('name = "hardsync"', 'name = "async"'))
    assert main(["simulate", str(f), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cluster.server.pull" in err[0] and "'replicated'" in err[0]


def test_fast_engine_refuses_it_in_one_line() -> None:
    p = _point()
    fast, reason = fast_engine(p)
    assert fast is None and reason is not None and "'replicated'" in reason
    with pytest.raises(ScenarioError, match="replicated") as err:
        check_engine([p], "fast")
    assert "\n" not in str(err.value)
    assert simulate(p, "auto").summary == simulate(p, "simpy").summary


def test_the_preset_sets_it_for_hardsync() -> None:
    text = BASE.format(samples=96, learners=2, work=1.0, latency=0.0, apply=0.0, pull="whole") \
        .replace('pull = "whole"\n', "") + 'library = "tf-distributed-replicated"\n'
    assert load_text(text).points()[0]["cluster"]["server"]["pull"] == "replicated"
    tf_grpc = load_text(text.replace("tf-distributed-replicated", "tf-grpc")).points()[0]
    assert tf_grpc["cluster"]["server"]["pull"] == "layerwise-shared"
