"""Crafted traces into ``ddlsim trace`` and ``ddlsim replay``: a valid small trace (the
simulator's own, written by the trace module's writer) with one header field or column
edited is refused in one line naming the file and that field or column, exit status 2,
before any large allocation or long loop, and nothing is written."""

from __future__ import annotations

import hashlib
import json
import math
import struct
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ddlsim.scenarios.cli import main
from ddlsim.simulator import trace as T
from ddlsim.simulator.protocols.header import clean_point
from ddlsim.simulator.run import simulate
from tests.conftest import make_point

TINY = """
[workload]
epochs = 0.25
[cluster]
learners = 2
minibatch = 32
[protocol]
name = "async"
"""


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``ps``: a 2-learner async trace recording its point and ⟨σ⟩ (as a live run's does, so
    ``ddlsim replay`` needs no scenario); ``gossip``: a 2-node D-PSGD trace (it mixes)."""
    folder = tmp_path_factory.mktemp("traces")
    out = {}
    for name, proto in (("ps", "async"), ("gossip", "dpsgd")):
        point = make_point(TINY, protocol__name=proto)
        trace = simulate(point, engine="simpy").trace
        trace.header.update(replay_point=clean_point(point), mean_staleness=0.5)
        T.write(trace, folder / f"{name}.ddlt")
        out[name] = folder / f"{name}.ddlt"
    return out


def _split(data: bytes) -> tuple[dict[str, Any], bytes]:
    (hlen,) = struct.unpack_from("<Q", data, 8)
    return json.loads(data[16:16 + hlen]), data[16 + hlen:-32]


def _join(head: dict[str, Any], columns: bytes) -> bytes:
    """A file of ``head`` and the column bytes, its checksum redone (a crafted file, not a damaged one)."""
    hb = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
    body = T.MAGIC + struct.pack("<Q", len(hb)) + hb + columns
    return body + hashlib.sha256(body).digest()


def with_header(src: Path, dst: Path, **fields: Any) -> Path:
    head, columns = _split(src.read_bytes())
    head.update(fields)
    dst.write_bytes(_join(head, columns))
    return dst


def with_value(src: Path, dst: Path, table: str, column: str, row: Any, value: Any) -> Path:
    """``src`` with ``table[column][row]`` set to ``value``; ``row`` an int or a function of the trace."""
    tr = T.read(src)
    ops = {k: np.array(v) for k, v in tr.ops.items()}
    inputs = {k: np.array(v) for k, v in tr.inputs.items()}
    r = row(tr) if callable(row) else row
    (ops if table == "ops" else inputs)[column][r] = value
    T.write(T.Trace(tr.header, ops, inputs), dst)
    return dst


def first(kind: int):
    return lambda tr: int(np.flatnonzero(tr.ops["kind"] == kind)[0])


def refused(capsys: pytest.CaptureFixture, argv: list[str], *words: str) -> str:
    """The command exits 2 with one line on stderr that names each of ``words``."""
    rc = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("ddlsim: error: "), err
    for w in words:
        assert w in err[0], (w, err[0])
    return err[0]


def replay_argv(trace: Path, out: Path) -> list[str]:
    return ["replay", str(trace), "--out", str(out), "--no-report", "--device", "cpu"]


HEADER_CASES = [
    ("nodes", 10**5),              # the ops name one node: a replay would hold 10⁵ states
    ("nodes", 10**12),             # beyond cluster.learners' maximum
    ("nodes", True),
    ("samples_per_epoch", 0),      # a permutation of nothing
    ("samples_per_epoch", 10**15),  # a permutation of 8 PB
    ("samples_per_epoch", "abc"),
    ("data_seed", [1]),
    ("data_seed", None),
    ("data_seed", "abc"),
    ("data_seed", -1),
    ("mean_staleness", [1]),
    ("mean_staleness", None),
    ("mean_staleness", -1.0),
    ("mean_staleness", "nan"),
    ("wall_s", "long"),
    ("measured", "yes"),
    ("protocol", ["async"]),
    ("protocol", "warp"),          # no protocol ddlsim has: what the trace ran is unknown
]


@pytest.mark.parametrize("command", ["trace", "replay"])
@pytest.mark.parametrize("key, value", HEADER_CASES)
def test_a_header_field_out_of_its_range_is_refused_in_one_line(traces, tmp_path, capsys, command, key, value):
    bad = with_header(traces["ps"], tmp_path / "bad.ddlt", **{key: value})
    argv = ["trace", str(bad)] if command == "trace" else replay_argv(bad, tmp_path / "out")
    refused(capsys, argv, str(bad), f"'{key}'")
    assert not (tmp_path / "out").exists()


COLUMN_CASES = [
    ("ps", "ops", "batch_size", first(T.GRAD), 2**31 - 1),  # a 16 GiB index array
    ("ps", "ops", "batch_size", first(T.GRAD), -4),
    ("ps", "ops", "batch_size", first(T.GRAD), 0),
    ("ps", "ops", "sample_start", first(T.GRAD), 2**62),    # ≈ 10¹⁶ epochs away from its neighbours
    ("ps", "ops", "sample_start", first(T.GRAD), 2**63 - 1),
    ("ps", "ops", "sample_start", first(T.GRAD), -1),
    ("ps", "ops", "sample_start", first(T.GRAD), 10**12),   # beyond any layout's k-th minibatch
    ("ps", "ops", "batch_index", first(T.GRAD), -1),
    ("ps", "ops", "batch_index", first(T.GRAD), 10**9),     # beyond the op count
    ("ps", "ops", "node", first(T.GRAD), -1),               # a learner
    ("ps", "ops", "node", first(T.GRAD), 10**6),
    ("ps", "ops", "node", first(T.EVAL), 3),                # a state node ≥ nodes
    ("ps", "ops", "epoch", first(T.APPLY), math.nan),
    ("ps", "ops", "epoch", first(T.APPLY), -1.0),
    ("ps", "ops", "in_start", first(T.APPLY), 2**63 - 1),   # start + count overflows
    ("ps", "inputs", "grad_op", 0, 2**63 - 1),
    ("ps", "inputs", "weight", 0, math.nan),
    ("ps", "inputs", "weight", 0, -1.0),
    ("ps", "inputs", "staleness", 0, -1),
    ("gossip", "ops", "coef", first(T.MIX), math.nan),
    ("gossip", "ops", "coef", first(T.MIX), math.inf),
    ("gossip", "ops", "self_coef", first(T.MIX), -0.5),
]


@pytest.mark.parametrize("command", ["trace", "replay"])
@pytest.mark.parametrize("base, table, column, row, value", COLUMN_CASES)
def test_a_column_value_a_replay_cannot_take_is_refused_in_one_line(traces, tmp_path, capsys, command, base, table,
                                                                     column, row, value):
    bad = with_value(traces[base], tmp_path / "bad.ddlt", table, column, row, value)
    argv = ["trace", str(bad)] if command == "trace" else replay_argv(bad, tmp_path / "out")
    refused(capsys, argv, str(bad), f"'{column}'")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("point, words", [
    ({"optimizer": {"lr": 0.1}}, ["lacks the [workload] table"]),           # was: KeyError 'workload'
    ([1, 2], ["lacks the [workload] table"]),
    ({"workload": {"dataset": "nope"}, "optimizer": {}}, ["'workload.dataset'"]),
    ({"workload": {"epochz": 1}, "optimizer": {}}, ["'workload.epochz'"]),
    ({"workload": {}, "optimizer": {"lr": "fast"}}, ["'optimizer.lr'"]),
    ({"workload": {}, "optimizer": {}, "protocol": {"name": "softsync", "n": 99}}, ["'protocol.n'"]),
])
@pytest.mark.parametrize("command", ["trace", "replay"])
def test_a_recorded_point_is_validated_as_a_scenario_point(traces, tmp_path, capsys, point, words, command):
    bad = with_header(traces["ps"], tmp_path / "bad.ddlt", replay_point=point)
    argv = ["trace", str(bad)] if command == "trace" else replay_argv(bad, tmp_path / "out")
    refused(capsys, argv, str(bad), "replay_point", *words)
    assert not (tmp_path / "out").exists()


def test_the_unedited_traces_replay_and_a_non_finite_number_spelled_as_json_is_read_back(traces, tmp_path, capsys):
    # the control: the refusals above come from the edits. The header spells bandwidth_Bps = inf "inf"
    head, _ = _split(traces["ps"].read_bytes())
    point = head["replay_point"]
    point["cluster"]["network"]["bandwidth_Bps"] = "inf"
    ok = with_header(traces["ps"], tmp_path / "ok.ddlt", replay_point=point)
    assert main(replay_argv(ok, tmp_path / "out")) == 0
    assert "final test error" in capsys.readouterr().out
    assert main(["trace", str(traces["gossip"])]) == 0


def test_trace_names_the_learners_of_a_parameter_server_trace(traces, capsys):
    # truth: the tiny scenario's λ = 2; a PS trace has one state (the server's), a gossip trace one per node
    assert main(["trace", str(traces["ps"])]) == 0
    out = capsys.readouterr().out
    assert "protocol async, learners 2," in out and "nodes" not in out
    assert main(["trace", str(traces["gossip"])]) == 0
    assert "protocol dpsgd, nodes 2," in capsys.readouterr().out


def test_evals_times_nodes_is_bounded(tmp_path, capsys):
    # 1,001 evals (after 999 applies of no gradient, cheap to write) of a trace whose one grad
    # names node 99,999: each eval would read 10⁵ nodes' states, 10⁸ reads in all
    b = T.TraceBuilder()
    b.eval(0, 0, 0.0, 0.0)
    b.grad(0, 99_999, 0, 0, 8, 0, 0.0, 1.0, 0.0)
    for v in range(999):
        b.apply(0, v, [], [], [], 1.0, 0.0)
        b.eval(0, v + 1, 1.0, 0.0)
    b.eval(T.AVERAGE_NODE, T.AVERAGE_NODE, 1.0, 0.0)
    f = tmp_path / "wide.ddlt"
    T.write(b.build({"nodes": 100_000, "protocol": "dpsgd", "data_seed": 0, "samples_per_epoch": 1797}), f)
    refused(capsys, ["trace", str(f)], str(f), "1,001 eval ops × 100,000 nodes")


def kind_only(n: int, kind: int) -> bytes:
    """A file of ``n`` ops storing only ``kind``; every other column is one constant in the
    header (a consistent graph: grads reading version 0 of node 0, or evals of it)."""
    const = {"node": 0, "version": 0, "src_node": 0, "src_version": 0, "sample_start": 0, "batch_size": 8,
             "batch_index": 0, "t_start": 0.0, "t_end": 0.0, "epoch": 0.0, "coef": 0.0, "self_coef": 1.0,
             "in_start": -1, "in_count": 0}
    cols = [{"table": "ops", "name": "kind", "dtype": "u1", "length": n}]
    cols += [{"table": "ops", "name": c, "const": v, "length": n} for c, v in const.items()]
    cols += [{"table": "inputs", "name": "grad_op", "dtype": "i1", "length": 0},
             {"table": "inputs", "name": "weight", "const": 1.0, "length": 0},
             {"table": "inputs", "name": "staleness", "const": 0, "length": 0}]
    head = {"schema_version": 1, "nodes": 1, "protocol": "async", "data_seed": 0, "samples_per_epoch": 1797,
            "columns": cols}
    return _join(head, bytes([kind]) * n)


def peak_bytes(argv: list[str]) -> tuple[int, int]:
    tracemalloc.start()
    try:
        rc = main(argv)
        return rc, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind, words", [(T.GRAD, "no apply consumes"), (T.EVAL, "eval ops for 0 applies")])
@pytest.mark.parametrize("command", ["trace", "replay"])
def test_memory_is_bounded_by_the_stored_columns_not_the_constant_ones(tmp_path, capsys, kind, words, command):
    # a file of n ops storing only `kind` (1 byte an op) used to become 15 full columns (≈ 100
    # bytes an op) when read, and a replay's plan on top. Truth: the growth of the peak memory
    # from n to 4n ops, per op added, is the file's byte and the kind column's (checks go a
    # chunk of ops at a time)
    peaks = []
    for n in (1 << 21, 1 << 23):
        f = tmp_path / f"k{n}.ddlt"
        f.write_bytes(kind_only(n, kind))
        argv = ["trace", str(f)] if command == "trace" else replay_argv(f, tmp_path / "out")
        rc, peak = peak_bytes(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and str(f) in err[0] and words in err[0], err
        peaks.append(peak)
    per_op = (peaks[1] - peaks[0]) / ((1 << 23) - (1 << 21))
    assert per_op < 4, per_op
    assert not (tmp_path / "out").exists()


def test_minibatches_far_apart_in_the_stream_cost_their_size_not_the_distance():
    # truth: SampleStream, the data order's reference. Two minibatches 2⁵⁰ positions apart used
    # to walk every epoch between them (≈ 10¹² epochs of 1797 samples)
    import torch

    from ddlsim.backends.replay_data import Minibatches
    from ddlsim.backends.workloads import Data
    from ddlsim.simulator.catalog import DatasetInfo
    from ddlsim.simulator.dataorder import SampleStream

    x, y = torch.zeros(1797, 4), torch.zeros(1797, dtype=torch.long)
    mb = Minibatches(Data(x, y, x, y, DatasetInfo("zeros", 1797, 1797, (4,), 2)), 7, 1797)
    starts = np.array([5, 2**50 + 3, 1795])
    got = mb.indices(starts, 4)
    ref = SampleStream(7, 1797)
    assert got.tolist() == [ref.indices(int(s), 4).tolist() for s in starts]
