"""The trace format: round trip, determinism, and refusal of bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ddlsim.simulator import trace as T


def toy() -> T.TraceBuilder:
    """Hand-made 2-learner async trace: g0, g1 on v0; apply g0 (σ 0), apply g1 (σ 1)."""
    b = T.TraceBuilder()
    b.eval(0, 0, 0.0, 0.0)
    g0 = b.grad(0, 0, 0, 0, 4, 0, 0.0, 1.0, 0.0)
    g1 = b.grad(1, 0, 0, 4, 4, 0, 0.0, 1.5, 0.0)
    b.apply(0, 0, [g0], [1.0], [0], 1.1, 0.5)
    b.apply(0, 1, [g1], [1.0], [1], 1.6, 1.0)
    b.eval(0, 2, 1.6, 1.0)
    return b


def header() -> dict:
    return {"nodes": 1, "protocol": "async", "seed": 0}


def test_round_trip_keeps_every_column(tmp_path: Path) -> None:
    tr = toy().build(header())
    T.write(tr, tmp_path / "t.ddlt")
    back = T.read(tmp_path / "t.ddlt")
    assert back.header["protocol"] == "async" and back.header["schema_version"] == T.SCHEMA_VERSION
    for k in T.OP_COLUMNS:
        assert np.array_equal(back.ops[k], tr.ops[k]), k
    for k in T.INPUT_COLUMNS:
        assert np.array_equal(back.inputs[k], tr.inputs[k]), k
    assert back.ops["kind"].tolist() == [T.EVAL, T.GRAD, T.GRAD, T.APPLY, T.APPLY, T.EVAL]
    assert back.inputs["staleness"].tolist() == [0, 1]
    assert back.ops["t_end"][3] == back.ops["t_start"][3] == 1.1


def test_encoding_is_deterministic() -> None:
    assert T.encode(toy().build(header())) == T.encode(toy().build(header()))


def test_truncated_file_is_refused(tmp_path: Path) -> None:
    data = T.encode(toy().build(header()))
    for cut in (10, len(data) // 2, len(data) - 1):
        (tmp_path / "t.ddlt").write_bytes(data[:cut])
        with pytest.raises(T.TraceError, match="truncated|not a ddlsim trace|corrupt"):
            T.read(tmp_path / "t.ddlt")


def test_flipped_byte_is_refused() -> None:
    data = bytearray(T.encode(toy().build(header())))
    data[-40] ^= 0xFF
    with pytest.raises(T.TraceError, match="checksum"):
        T.decode(bytes(data))


def test_missing_file_and_wrong_version(tmp_path: Path) -> None:
    with pytest.raises(T.TraceError, match="no such trace"):
        T.read(tmp_path / "nope.ddlt")
    tr = toy().build(header())
    tr.header["schema_version"] = 99
    data = T.encode(tr).replace(b'"schema_version":1', b'"schema_version":9')
    with pytest.raises(T.TraceError, match="schema version 9"):
        T.decode(data[:-32] + __import__("hashlib").sha256(data[:-32]).digest())


def test_inconsistent_graphs_are_refused() -> None:
    # version read before it exists
    b = T.TraceBuilder()
    b.grad(0, 0, 1, 0, 4, 0, 0.0, 1.0, 0.0)
    with pytest.raises(T.TraceError, match="before it exists"):
        T.check(b.build(header()))
    # mutation out of sequence
    b = T.TraceBuilder()
    g = b.grad(0, 0, 0, 0, 4, 0, 0.0, 1.0, 0.0)
    b.apply(0, 1, [g], [1.0], [0], 1.0, 0.1)
    with pytest.raises(T.TraceError, match="out of sequence"):
        T.check(b.build(header()))
    # gradient applied twice
    b = T.TraceBuilder()
    g = b.grad(0, 0, 0, 0, 4, 0, 0.0, 1.0, 0.0)
    b.apply(0, 0, [g], [1.0], [0], 1.0, 0.1)
    b.apply(0, 1, [g], [1.0], [1], 1.0, 0.1)
    with pytest.raises(T.TraceError, match="more than once"):
        T.check(b.build(header()))
    # apply consumes a non-grad op
    b = T.TraceBuilder()
    e = b.eval(0, 0, 0.0, 0.0)
    b.apply(0, 0, [e], [1.0], [0], 1.0, 0.1)
    with pytest.raises(T.TraceError, match="does not name a grad op"):
        T.check(b.build(header()))
    # a node outside the header's count
    b = T.TraceBuilder()
    b.grad(0, 3, 0, 0, 4, 0, 0.0, 1.0, 0.0)
    with pytest.raises(T.TraceError, match="outside"):
        T.check(b.build(header()))
    # time running backwards inside an op
    b = T.TraceBuilder()
    b.grad(0, 0, 0, 0, 4, 0, 2.0, 1.0, 0.0)
    with pytest.raises(T.TraceError, match="ends before it starts"):
        T.check(b.build(header()))


def test_mix_versions_follow_the_same_rules() -> None:
    b = T.TraceBuilder()
    b.mix(0, 0, 1, 0, 0.5, 0.5, 0.0, 1.0, 0.0)  # node 0 absorbs node 1's version 0
    b.mix(1, 0, 0, 0, 0.5, 0.5, 0.0, 1.0, 0.0)
    b.eval(T.AVERAGE_NODE, 0, 1.0, 0.0)
    T.check(b.build({"nodes": 2}))
    b.mix(1, 1, 0, 5, 0.5, 0.5, 1.0, 2.0, 0.0)
    with pytest.raises(T.TraceError, match="before it exists"):
        T.check(b.build({"nodes": 2}))
