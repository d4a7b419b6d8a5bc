"""The trace format: round trip, determinism, and refusal of bad files."""

from __future__ import annotations

import struct
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


def wide_file(tr: T.Trace) -> bytes:
    """The file as the first format wrote it (every column at its canonical width), built here
    independently of the writer: magic, header length, header, columns, SHA-256."""
    import hashlib
    import json
    import struct

    header = dict(tr.header, schema_version=T.SCHEMA_VERSION)
    cols = [("ops", n, d, tr.ops[n]) for n, d in T.OP_COLUMNS.items()] + \
        [("inputs", n, d, tr.inputs[n]) for n, d in T.INPUT_COLUMNS.items()]
    header["columns"] = [{"table": t, "name": n, "dtype": d, "length": len(a)} for t, n, d, a in cols]
    hb = json.dumps(header, sort_keys=True, separators=(",", ":")).encode()
    body = b"DDLTRACE" + struct.pack("<Q", len(hb)) + hb + b"".join(
        np.asarray(a, dtype=np.dtype(d).newbyteorder("<")).tobytes() for *_, d, a in cols)
    return body + hashlib.sha256(body).digest()


def test_columns_are_stored_as_narrow_as_their_values_and_read_back_exactly(tmp_path: Path) -> None:
    b = T.TraceBuilder()
    b.eval(0, 0, 0.0, 0.0)
    gs = [b.grad(n, 0, 0, (1 << 40) + n, 4, n, 0.0, 1.0 + n, 0.0) for n in range(300)]
    b.apply(0, 0, gs, [1 / 3] * 300, [0] * 300, 400.0, 1.0)
    b.eval(0, 1, 400.0, 1.0)
    tr = b.build(header())
    T.write(tr, tmp_path / "t.ddlt")
    data = (tmp_path / "t.ddlt").read_bytes()
    assert data == T.encode(tr)  # the streamed file is the encoding
    import json
    import struct

    (hlen,) = struct.unpack_from("<Q", data, 8)
    cols = {c["name"]: c for c in json.loads(data[16:16 + hlen])["columns"]}
    assert cols["node"]["dtype"] == "i2"            # 0 … 299
    assert cols["sample_start"]["dtype"] == "i8"    # −1 … 2**40 + 299
    assert cols["version"]["dtype"] == "i1"         # −1, 0, 1
    assert cols["coef"] == {"table": "ops", "name": "coef", "length": 303, "const": 0.0}
    assert cols["weight"]["const"] == 1 / 3 and cols["staleness"]["const"] == 0
    # 303 ops: kind u1, node i2, version i1, src_node i1, src_version i1, sample_start i8, batch_size i1,
    # batch_index i2, t_start/t_end/epoch f8, in_start i1, in_count i2; 300 inputs: grad_op i2
    assert len(data) == 16 + hlen + 303 * (1 + 2 + 1 + 1 + 1 + 8 + 1 + 2 + 24 + 1 + 2) + 300 * 2 + 32
    back = T.read(tmp_path / "t.ddlt")
    for k, d in T.OP_COLUMNS.items():
        assert back.ops[k].dtype == np.dtype(d) and np.array_equal(back.ops[k], tr.ops[k]), k
    for k, d in T.INPUT_COLUMNS.items():
        assert back.inputs[k].dtype == np.dtype(d) and np.array_equal(back.inputs[k], tr.inputs[k]), k


def test_a_file_of_the_first_format_still_reads() -> None:
    tr = toy().build(header())
    back = T.decode(wide_file(tr))
    for k in T.OP_COLUMNS:
        assert np.array_equal(back.ops[k], tr.ops[k]), k
    assert len(wide_file(tr)) > len(T.encode(tr))


@pytest.mark.parametrize("entry", [{"const": 0.5}, {"const": True}, {"const": "0"}, {"const": 0, "dtype": "i1"},
                                   {"dtype": "f4"}, {}, {"dtype": "i8"}, {"dtype": "f8"}, {"dtype": "u1"},
                                   {"const": 2**40}, {"const": 10**400}, {"dtype": ["i1"]}])
def test_a_column_stored_in_a_way_its_type_cannot_take_is_refused(entry: dict) -> None:
    import hashlib
    import json
    import struct

    data = T.encode(toy().build(header()))
    (hlen,) = struct.unpack_from("<Q", data, 8)
    head = json.loads(data[16:16 + hlen])
    col = next(c for c in head["columns"] if c["name"] == "node")
    col.pop("dtype", None), col.pop("const", None)
    col.update(entry)
    hb = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
    body = data[:8] + struct.pack("<Q", len(hb)) + hb + data[16 + hlen:-32]
    with pytest.raises(T.TraceError, match="corrupt trace header|truncated"):
        T.decode(body + hashlib.sha256(body).digest())


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


def _with_header(edit) -> bytes:
    """The toy trace's file with its header changed by ``edit(header)`` (checksum redone)."""
    import hashlib
    import json
    import struct

    data = T.encode(toy().build(header()))
    (hlen,) = struct.unpack_from("<Q", data, 8)
    head = json.loads(data[16:16 + hlen])
    head = edit(head) or head
    hb = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
    body = data[:8] + struct.pack("<Q", len(hb)) + hb + data[16 + hlen:-32]
    return body + hashlib.sha256(body).digest()


def _col(head: dict, name: str) -> dict:
    return next(c for c in head["columns"] if c["name"] == name)


def _inputs_as_constants(head: dict, length: int) -> None:
    for c in head["columns"]:
        if c["table"] == "inputs":
            c.pop("dtype", None)
            c.update(const=1.0 if c["name"] == "weight" else 0, length=length)


@pytest.mark.parametrize("edit", [
    lambda h: _col(h, "coef").update(length=10**15),         # a constant longer than its table
    lambda h: _col(h, "coef").update(length=2**63),
    lambda h: _col(h, "coef").update(const=10**400),         # a float column's constant beyond floats
    lambda h: _col(h, "node").update(table=["ops"]),         # not a name
    lambda h: _col(h, "node").update(name="nodes"),          # not a column of ours
    lambda h: h["columns"].append(dict(_col(h, "coef"))),    # a column twice
    lambda h: _inputs_as_constants(h, 10**12),               # a table of constants only: no bytes bound it
])
def test_a_header_that_would_allocate_or_mislead_is_refused_in_one_line(edit) -> None:
    with pytest.raises(T.TraceError, match="corrupt trace header|truncated"):
        T.decode(_with_header(edit))


def test_a_header_nested_beyond_the_parser_is_refused() -> None:
    import hashlib
    import struct

    hb = b"[" * 100_000 + b"]" * 100_000
    body = b"DDLTRACE" + struct.pack("<Q", len(hb)) + hb
    with pytest.raises(T.TraceError, match="corrupt trace header"):
        T.decode(body + hashlib.sha256(body).digest())


def test_the_sign_of_zero_survives_a_round_trip() -> None:
    b = T.TraceBuilder()
    b.eval(0, 0, 0.0, 0.0)
    b.eval(0, 0, 0.0, -0.0)
    tr = b.build(header())
    back = T.decode(T.encode(tr))
    assert np.signbit(back.ops["epoch"]).tolist() == [False, True]


def test_single_and_multi_gradient_applies_interleave_into_one_inputs_table() -> None:
    # Truth: the inputs table written out by hand; apply1 (its input in its own row) and apply
    # (inputs in the shared buffer) alternate, so each apply's in_start is the sum before it.
    b = T.TraceBuilder()
    g = [b.grad(n % 2, 0, 0, 4 * n, 4, n // 2, 0.0, 1.0, 0.0) for n in range(6)]
    b.apply1(0, 0, g[0], 0, 1.0, 0.1)
    assert b.last_apply() == ([g[0]], [1.0], [0], 0.1) and b.last_kind == T.APPLY
    b.apply(0, 1, [g[1], g[2]], [0.5, 0.5], [1, 1], 1.1, 0.2)
    assert b.last_apply() == ([g[1], g[2]], [0.5, 0.5], [1, 1], 0.2)
    b.apply1(0, 2, g[3], 2, 1.2, 0.3)
    b.apply1(0, 3, g[4], 3, 1.3, 0.4)
    b.apply(0, 4, [g[5]], [0.25], [4], 1.4, 0.5)
    assert b.last_apply() == ([g[5]], [0.25], [4], 0.5)
    b.eval(0, 5, 1.4, 0.5)
    tr = b.build(header())
    apply_rows = tr.ops["kind"] == T.APPLY
    assert tr.ops["kind"].tolist() == [T.GRAD] * 6 + [T.APPLY] * 5 + [T.EVAL]
    assert tr.ops["in_start"][apply_rows].tolist() == [0, 1, 3, 4, 5]
    assert tr.ops["in_count"][apply_rows].tolist() == [1, 2, 1, 1, 1]
    assert tr.ops["version"][apply_rows].tolist() == [0, 1, 2, 3, 4]
    assert tr.ops["t_end"][apply_rows].tolist() == [1.0, 1.1, 1.2, 1.3, 1.4]
    assert tr.inputs["grad_op"].tolist() == g
    assert tr.inputs["weight"].tolist() == [1.0, 0.5, 0.5, 1.0, 1.0, 0.25]
    assert tr.inputs["staleness"].tolist() == [0, 1, 1, 2, 3, 4]
    assert tr.inputs["staleness"].dtype == np.int32
    T.check(tr)


def test_a_refused_op_records_nothing() -> None:
    # Truth: the builder before the refused calls (lists of different lengths; a value that is
    # no integer) builds the same trace as after them
    b = T.TraceBuilder()
    g = b.grad(0, 0, 0, 0, 4, 0, 0.0, 1.0, 0.0)
    before = b.build(header())
    with pytest.raises(ValueError, match="differ in length"):
        b.apply(0, 0, [g], [1.0, 0.5], [0], 1.0, 0.1)
    for bad in (lambda: b.grad(0, 0, "v", 0, 4, 0, 0.0, 1.0, 0.0), lambda: b.apply1(0, 0, g, 1.5, 1.0, 0.1),
                lambda: b.eval(0, None, 0.0, 0.0), lambda: b.mix(0, 0, 1, 0, "c", 0.5, 0.0, 1.0, 0.0)):
        with pytest.raises((struct.error, TypeError, ValueError)):
            bad()
    after = b.build(header())
    assert len(b) == 1 and T.encode(after) == T.encode(before)
    with pytest.raises(IndexError, match="no apply"):
        b.last_apply()
