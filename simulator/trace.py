"""The protocol trace: a versioned, columnar record of what a run did (docs/trace.md).

A trace has a JSON header and two tables of equal-length NumPy columns:

* ``ops``: one row per op (``grad``, ``apply``, ``mix``, ``eval``) in execution order;
* ``inputs``: the gradients each ``apply`` consumes (a slice per apply).

State model: every node ``n`` holds a state ``(x, w)`` with versions 0, 1, 2, …; ``apply``
and ``mix`` each turn version ``v`` of their node into ``v + 1``. The parameter server is
node 0. A gradient is computed at ``x / w`` of the state it reads.

The file is ``MAGIC``, the header length and header, the columns' raw little-endian
bytes in header order, and a SHA-256 of everything before it. Each column is stored as
narrow as its values allow (the smallest integer type holding its range, or one constant
in the header when all its values are equal); reading restores the canonical types. Writing is deterministic
(same content → same bytes) and atomic; reading checks the digest and the op graph and
refuses a bad file with :class:`TraceError`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .files import FileRefused, atomic_write, read_bounded

SCHEMA_VERSION = 1   # what a trace that uses nothing of version 2 is written as (every earlier protocol)
LOCAL_SCHEMA = 2     # outer ops, fragment mixes and the ``averaging`` header field (docs/trace.md)
SCHEMA_VERSIONS = (SCHEMA_VERSION, LOCAL_SCHEMA)  # what this ddlsim reads
TRACE_MAX_BYTES = 64 << 30  # a trace file is read whole: at most this much
MAGIC = b"DDLTRACE"

# What a read trace and a replay rely on (check, check_replayable), each bound with its reason.
MAX_NODES = 100_000            # cluster.learners' maximum: a replay holds one weights state per node
MAX_BATCH = 10_000_000         # cluster.minibatch's maximum: a minibatch's samples are gathered at once
MAX_SAMPLES_PER_EPOCH = 10**8  # workload.teacher_samples' maximum, the largest training set a replay
#                                loads; a replay holds each epoch's permutation (8 bytes a sample)
MAX_SEED = 2**63 - 1           # seed's maximum
MAX_POSITION = 2**62           # a stream position plus a minibatch stays an int64
MAX_EVAL_READS = 10**8         # evals × nodes: an eval reads every node's latest state, and a replay
#                                plans 8 bytes for each such read

GRAD, APPLY, MIX, EVAL, OUTER = 0, 1, 2, 3, 4
KIND_NAMES = ("grad", "apply", "mix", "eval", "outer")
AVERAGE_NODE = -1  # eval of the average of all nodes' latest states

OP_COLUMNS: dict[str, str] = {
    "kind": "u1",          # GRAD | APPLY | MIX | EVAL
    "node": "i4",          # grad: the learner/node computing; others: the state's node
    "version": "i4",       # apply/mix: version before (becomes +1); eval: version read; grad: -1
    "src_node": "i4",      # grad: node of the state read; mix: the sender; else -1
    "src_version": "i4",   # grad: version read; mix: sender's version at send; else -1
    "sample_start": "i8",  # grad: position of the minibatch in the data stream; else -1
    "batch_size": "i4",    # grad: samples in the minibatch; else 0
    "batch_index": "i8",   # grad: the learner's k-th minibatch; else -1
    "t_start": "f8",       # simulated seconds
    "t_end": "f8",
    "epoch": "f8",         # samples applied so far / samples per epoch (progress at the op)
    "coef": "f8",          # mix: factor on the sender's state; else 0
    "self_coef": "f8",     # mix: factor on the node's own state; else 1
    "in_start": "i8",      # apply: first row in ``inputs``; else -1
    "in_count": "i4",      # apply: number of gradients; else 0
}
INPUT_COLUMNS: dict[str, str] = {
    "grad_op": "i8",       # row in ``ops`` of the grad op
    "weight": "f8",        # averaging weight (e.g. 1/c)
    "staleness": "i4",     # σ = version applied to − version read
}


NONE_IS_MINUS_ONE = ("version", "src_node", "src_version", "sample_start", "batch_index", "in_start")


def blank_columns(n_ops: int, n_inputs: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """Columns of ``n_ops`` ops and ``n_inputs`` inputs holding the fields' defaults: −1 where a
    kind has no such field (:data:`NONE_IS_MINUS_ONE`), ``self_coef`` 1, every other 0."""
    ops = {name: np.zeros(n_ops, dt) for name, dt in OP_COLUMNS.items()}
    for name in NONE_IS_MINUS_ONE:
        ops[name][:] = -1
    ops["self_coef"][:] = 1.0
    return ops, {name: np.zeros(n_inputs, dt) for name, dt in INPUT_COLUMNS.items()}


class TraceError(ValueError):
    """A trace file that is missing, truncated, corrupt or inconsistent."""


@dataclass
class Trace:
    """A trace in memory: ``header`` (JSON-able dict), ``ops`` and ``inputs`` columns."""

    header: dict[str, Any]
    ops: dict[str, np.ndarray]
    inputs: dict[str, np.ndarray]

    @property
    def n_ops(self) -> int:
        return len(self.ops["kind"])

    def kind_mask(self, kind: int) -> np.ndarray:
        return self.ops["kind"] == kind


ROWS: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {  # kind → (its int fields, its float fields)
    GRAD: (("node", "src_node", "src_version", "sample_start", "batch_size", "batch_index"),
           ("t_start", "t_end", "epoch")),
    APPLY: (("node", "version", "in_count"), ("t_start", "epoch")),
    MIX: (("node", "version", "src_node", "src_version"), ("t_start", "t_end", "epoch", "coef", "self_coef")),
    EVAL: (("node", "version"), ("t_start", "epoch")),
    OUTER: (("node", "version", "src_node", "src_version", "batch_index"),
            ("t_start", "t_end", "epoch", "coef", "self_coef")),
}
APPLY_ONE = 255  # builder-only kind: an apply of one gradient with weight 1, its input in its row
ROWS[APPLY_ONE] = (("node", "version", "grad_op", "staleness"), ("t_start", "epoch"))
INPUT_ROW = (("grad_op", "staleness"), ("weight",))


def _row(fields: tuple[tuple[str, ...], tuple[str, ...]]) -> tuple[struct.Struct, np.dtype]:
    """The layout of one row (int64s then float64s, little-endian) as a ``struct`` and a dtype."""
    ints, flts = fields
    layout = struct.Struct("<" + "q" * len(ints) + "d" * len(flts))
    return layout, np.dtype([(n, "<i8") for n in ints] + [(n, "<f8") for n in flts])


class TraceBuilder:
    """Append-only recorder used by the simulators.

    Cheap per op: each op is packed in one C call as a fixed-layout row (:data:`ROWS`) onto
    its kind's byte buffer, and its kind code onto ``kinds``. An apply of one gradient
    (:meth:`apply1`, the async hot path) is one row holding its input too (kind
    :data:`APPLY_ONE`); an apply of several appends its inputs to ``inputs``. :meth:`build`
    views each buffer as a structured array and scatters its fields into the full columns,
    filling the fields a kind does not use with their defaults; an apply's inputs start where
    the previous apply's end. (Packing a row costs about a third of extending typed arrays
    with the same values, measured.)
    """

    _pack = {k: _row(f) for k, f in ROWS.items()}
    _pack_in = _row(INPUT_ROW)

    def __init__(self) -> None:
        self.kinds = bytearray()
        self.rows = {k: bytearray() for k in ROWS}
        self.inputs = bytearray()
        self._g, self._a, self._a1, self._m, self._e = (self.rows[k] for k in (GRAD, APPLY, APPLY_ONE, MIX, EVAL))
        self._pg, self._pa, self._pa1, self._pm, self._pe = (
            self._pack[k][0].pack for k in (GRAD, APPLY, APPLY_ONE, MIX, EVAL))
        self._pin = self._pack_in[0].pack
        self.fragments: list[tuple[int, int]] = []  # (mix row, fragment) of fragment mixes

    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def last_kind(self) -> int:
        """Kind of the last op recorded (−1 when none)."""
        if not self.kinds:
            return -1
        k = self.kinds[-1]
        return APPLY if k == APPLY_ONE else k

    def grad(self, node: int, src_node: int, src_version: int, sample_start: int, batch_size: int,
             batch_index: int, t_start: float, t_end: float, epoch: float) -> int:
        """Record a gradient computed by ``node`` on state (src_node, src_version); return its row."""
        row = self._pg(node, src_node, src_version, sample_start, batch_size, batch_index, t_start, t_end, epoch)
        kinds = self.kinds  # (packed first: a value that cannot be packed records nothing)
        kinds.append(GRAD)
        self._g += row
        return len(kinds) - 1

    def apply(self, node: int, version: int, grad_ops: Sequence[int], weights: Sequence[float],
              staleness: Sequence[int], t: float, epoch: float) -> int:
        """Record that (node, version) becomes version + 1 from ``grad_ops``."""
        if not len(grad_ops) == len(weights) == len(staleness):
            raise ValueError("apply: grad_ops, weights and staleness differ in length")
        row = self._pa(node, version, len(grad_ops), t, epoch)
        rows = b"".join(map(self._pin, grad_ops, staleness, weights))
        kinds = self.kinds
        kinds.append(APPLY)
        self._a += row
        self.inputs += rows
        return len(kinds) - 1

    def apply1(self, node: int, version: int, grad_op: int, staleness: int, t: float, epoch: float) -> int:
        """``apply`` of a single gradient with weight 1 (the async hot path)."""
        row = self._pa1(node, version, grad_op, staleness, t, epoch)
        kinds = self.kinds
        kinds.append(APPLY_ONE)
        self._a1 += row
        return len(kinds) - 1

    def last_apply(self) -> tuple[list[int], list[float], list[int], float]:
        """``(grad ops, weights, staleness, epoch)`` of the last apply recorded."""
        one, many = self.kinds.rfind(APPLY_ONE), self.kinds.rfind(APPLY)
        if one == many == -1:
            raise IndexError("last_apply: no apply recorded")
        if one > many:
            layout = self._pack[APPLY_ONE][0]
            _, _, gop, stale, _, epoch = layout.unpack_from(self._a1, len(self._a1) - layout.size)
            return [gop], [1.0], [stale], epoch
        layout, row = self._pack[APPLY][0], self._pack_in[0]
        _, _, count, _, epoch = layout.unpack_from(self._a, len(self._a) - layout.size)
        end = len(self.inputs) // row.size
        rows = [row.unpack_from(self.inputs, n * row.size) for n in range(end - count, end)]
        return [r[0] for r in rows], [r[2] for r in rows], [r[1] for r in rows], epoch

    def mix(self, node: int, version: int, src_node: int, src_version: int, coef: float,
            self_coef: float, t_start: float, t_end: float, epoch: float) -> int:
        """Record x_node ← self_coef·x_node + coef·x_src(src_version) (w likewise)."""
        row = self._pm(node, version, src_node, src_version, t_start, t_end, epoch, coef, self_coef)
        kinds = self.kinds
        kinds.append(MIX)
        self._m += row
        return len(kinds) - 1

    def fragment_mix(self, node: int, version: int, src_node: int, src_version: int, fragment: int,
                     t_start: float, t_end: float, epoch: float) -> int:
        """Record a copy of fragment ``fragment`` of x_src(src_version) into x_node (schema 2:
        a mix with ``batch_index`` = the fragment, coef 1, self_coef 0; the rest of x_node stays)."""
        row = self._pm(node, version, src_node, src_version, t_start, t_end, epoch, 1.0, 0.0)
        kinds = self.kinds
        kinds.append(MIX)
        self._m += row
        self.fragments.append((len(kinds) - 1, fragment))
        return len(kinds) - 1

    def outer(self, node: int, version: int, anchor_version: int, lr: float, momentum: float, fragment: int,
              t_start: float, t_end: float, epoch: float) -> int:
        """Record an outer step (schema 2): (node, version) becomes version + 1 from the mean of the
        nodes' pseudo-gradients against the anchor (node, ``anchor_version``) (docs/trace.md)."""
        row = self._pack[OUTER][0].pack(node, version, node, anchor_version, fragment, t_start, t_end, epoch, lr,
                                        momentum)
        kinds = self.kinds
        kinds.append(OUTER)
        self.rows[OUTER] += row
        return len(kinds) - 1

    def eval(self, node: int, version: int, t: float, epoch: float) -> int:
        """Record an evaluation of (node, version), or of the nodes' average (node = -1)."""
        row = self._pe(node, version, t, epoch)
        kinds = self.kinds
        kinds.append(EVAL)
        self._e += row
        return len(kinds) - 1

    def build(self, header: dict[str, Any]) -> Trace:
        """Freeze into a :class:`Trace` with NumPy columns."""
        code = np.frombuffer(bytes(self.kinds), dtype=np.uint8)
        ops, _ = blank_columns(len(code), 0)
        tables = {k: np.frombuffer(buf, self._pack[k][1]) for k, buf in self.rows.items()}
        for k, table in tables.items():
            if not len(table):
                continue
            rows = np.flatnonzero(code == k)
            for name in table.dtype.names or ():
                if name in ops:
                    ops[name][rows] = np.ascontiguousarray(table[name])
        for row, fragment in self.fragments:
            ops["batch_index"][row] = fragment
        one = code == APPLY_ONE
        ops["in_count"][one] = 1
        kind = np.where(one, APPLY, code).astype(np.uint8)
        ops["kind"] = kind
        np.copyto(ops["t_end"], ops["t_start"], where=(kind == APPLY) | (kind == EVAL))  # point ops
        # inputs in apply order: each apply's start is the sum of the counts before it
        applies = np.flatnonzero(kind == APPLY)
        counts = ops["in_count"][applies].astype(np.int64)
        starts = np.cumsum(counts) - counts
        ops["in_start"][applies] = starts
        n_in = int(counts.sum())
        inputs: dict[str, np.ndarray] = {"grad_op": np.zeros(n_in, np.int64), "weight": np.ones(n_in),
                                         "staleness": np.zeros(n_in, np.int32)}
        single = one[applies]
        at1 = starts[single]
        inputs["grad_op"][at1] = tables[APPLY_ONE]["grad_op"]
        inputs["staleness"][at1] = tables[APPLY_ONE]["staleness"]
        many = np.frombuffer(self.inputs, self._pack_in[1])
        if len(many):
            c = counts[~single]
            at = np.repeat(starts[~single] - (np.cumsum(c) - c), c) + np.arange(len(many))
            inputs["grad_op"][at] = many["grad_op"]
            inputs["weight"][at] = many["weight"]
            inputs["staleness"][at] = many["staleness"]
        h = dict(header)
        h.setdefault("schema_version", SCHEMA_VERSION)
        return Trace(h, ops, inputs)


STORED_DTYPES = ("u1", "i1", "i2", "i4", "i8", "f8")  # how a column may be stored in a file
CHUNK_ROWS = 1 << 20  # rows converted at a time when writing (bounds the memory a write adds)


def eval_schedule(ops: dict[str, np.ndarray], n: int | None = None) -> list[tuple[float, float]]:
    """(simulated time, epoch) of every eval op among the first ``n`` ops (all by default)."""
    kind, t_end, epoch = ops["kind"][:n], ops["t_end"][:n], ops["epoch"][:n]
    ev = kind == EVAL
    return list(zip(t_end[ev].tolist(), epoch[ev].tolist()))


ANCHORS = ("kind", "grad_op")  # always stored as bytes: they bound each table's length


def stored_dtype(values: np.ndarray, dtype: str, name: str = "") -> dict[str, Any]:
    """How column ``name`` of canonical ``dtype`` is stored: ``{"const": v}`` when it holds one
    finite value throughout (one sign of zero; never an :data:`ANCHORS` column), else
    ``{"dtype": d}`` with ``d`` the narrowest signed integer type holding its range (integer
    columns) or the canonical type (``kind`` and floats). Reading restores the column exactly."""
    if len(values) and dtype != "u1":
        lo, hi = values.min(), values.max()
        if lo == hi and np.isfinite(lo) and name not in ANCHORS:
            if dtype.startswith("f") and (lo != 0 or np.signbit(values).all() or not np.signbit(values).any()):
                return {"const": float(lo)}
            info = np.iinfo(dtype) if dtype.startswith("i") else None
            if info is not None and info.min <= lo <= info.max:
                return {"const": int(lo)}
        if dtype.startswith("i"):
            for d in ("i1", "i2", "i4"):
                info = np.iinfo(d)
                if info.min <= lo and hi <= info.max:
                    return {"dtype": d}
    return {"dtype": dtype}


def chunks(trace: Trace) -> Iterator[bytes]:
    """The file's bytes, a piece at a time (deterministic): magic, header, each column
    converted ``CHUNK_ROWS`` rows at a time, then the SHA-256 of all of it."""
    header = dict(trace.header)
    header["schema_version"] = schema_needed(trace)
    cols = []
    for table, spec in (("ops", OP_COLUMNS), ("inputs", INPUT_COLUMNS)):
        data = trace.ops if table == "ops" else trace.inputs
        for name, dt in spec.items():
            arr = np.asarray(data[name])
            cols.append(({"table": table, "name": name, "length": int(len(arr)), **stored_dtype(arr, dt, name)},
                         arr))
    header["columns"] = [c for c, _ in cols]
    hbytes = json.dumps(_finite(header), sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
    h = hashlib.sha256()
    for piece in itertools.chain([MAGIC, struct.pack("<Q", len(hbytes)), hbytes], _column_bytes(cols)):
        h.update(piece)
        yield piece
    yield h.digest()


def schema_needed(trace: Trace) -> int:
    """The schema version ``trace`` is written as: :data:`LOCAL_SCHEMA` when it has outer ops or an
    ``averaging`` header field (a compressed or local run), else :data:`SCHEMA_VERSION`."""
    if "averaging" in trace.header or (trace.n_ops and bool((trace.ops["kind"] == OUTER).any())):
        return LOCAL_SCHEMA
    return SCHEMA_VERSION


def _column_bytes(cols: list[tuple[dict[str, Any], np.ndarray]]) -> Iterator[bytes]:
    for c, arr in cols:
        if "dtype" in c:
            dt = np.dtype(c["dtype"]).newbyteorder("<")
            for lo in range(0, len(arr), CHUNK_ROWS):
                yield arr[lo:lo + CHUNK_ROWS].astype(dt).tobytes()


def encode(trace: Trace) -> bytes:
    """Serialise ``trace`` to bytes (deterministic; the bytes :func:`write` writes)."""
    return b"".join(chunks(trace))


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as the string "inf", "-inf" or "nan" (strict JSON
    has no such numbers; e.g. a point's ``bandwidth_Bps = inf``, "free transfers")."""
    if isinstance(value, float) and not np.isfinite(value):
        return "nan" if value != value else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def write(trace: Trace, path: str | Path) -> None:
    """Write ``trace`` to ``path`` atomically (temporary file, then rename), in pieces: no
    copy of the whole trace is made."""
    atomic_write(path, chunks(trace))


def decode(data: bytes, name: str = "<trace>") -> Trace:
    """Parse and validate trace bytes; raise :class:`TraceError` naming ``name``. A column
    stored as a constant reads as a read-only view of that one value (no memory per row), so
    reading costs the stored columns, widened to their canonical types, and no more."""
    if len(data) < len(MAGIC) + 8 + 32 or not data.startswith(MAGIC):
        raise TraceError(f"{name}: not a ddlsim trace (bad magic or too short)")
    body, digest = memoryview(data)[:-32], data[-32:]  # a view: no second copy of the file
    (hlen,) = struct.unpack_from("<Q", data, len(MAGIC))
    hstart = len(MAGIC) + 8
    if hstart + hlen > len(body):
        raise TraceError(f"{name}: truncated trace (header runs past the end of the file)")
    try:
        header = json.loads(bytes(body[hstart:hstart + hlen]))
    except (ValueError, RecursionError):
        raise TraceError(f"{name}: corrupt trace header") from None
    if hashlib.sha256(body).digest() != digest:
        raise TraceError(f"{name}: corrupt trace (checksum mismatch)")
    if not isinstance(header, dict) or not _columns_ok(header.get("columns")):
        raise TraceError(f"{name}: corrupt trace header (no valid column list)")
    version = header.get("schema_version")
    if isinstance(version, bool) or version not in SCHEMA_VERSIONS:
        raise TraceError(f"{name}: trace schema version {version!r} is not supported "
                         f"(this ddlsim reads versions {', '.join(map(str, SCHEMA_VERSIONS))})")
    expected = sum(np.dtype(c["dtype"]).itemsize * c["length"] for c in header["columns"] if "dtype" in c)
    if hstart + hlen + expected != len(body):
        raise TraceError(f"{name}: truncated trace ({len(body) - hstart - hlen} column bytes, "
                         f"header announces {expected})")
    tables: dict[str, dict[str, np.ndarray]] = {"ops": {}, "inputs": {}}
    pos = hstart + hlen
    for c in header["columns"]:
        spec = OP_COLUMNS if c["table"] == "ops" else INPUT_COLUMNS
        canonical = spec.get(c["name"], c.get("dtype", "f8"))
        if "const" in c:  # a read-only view of one value: no memory per row
            tables[c["table"]][c["name"]] = np.broadcast_to(np.array(c["const"], dtype=canonical), (c["length"],))
            continue
        dt = np.dtype(c["dtype"]).newbyteorder("<")
        tables[c["table"]][c["name"]] = np.frombuffer(body, dtype=dt, count=c["length"], offset=pos).astype(
            canonical)
        pos += dt.itemsize * c["length"]
    del header["columns"]
    trace = Trace(header, tables["ops"], tables["inputs"])
    check(trace, name)
    return trace


def _columns_ok(cols: Any) -> bool:
    """The header's column list is well formed: known tables and column names, each at most
    once; each column stored as one of :data:`STORED_DTYPES` its canonical type can take back
    (no wider, no other kind) or as one constant of its kind; within a table one length, and
    a table with no stored bytes empty (so a constant column never outgrows the file)."""
    known = {"ops": OP_COLUMNS, "inputs": INPUT_COLUMNS}
    if not isinstance(cols, list) or not all(isinstance(c, dict) for c in cols):
        return False
    seen: set[tuple[str, str]] = set()
    lengths: dict[str, set[int]] = {"ops": set(), "inputs": set()}
    stored: dict[str, bool] = {"ops": False, "inputs": False}
    for c in cols:
        table, name, length = c.get("table"), c.get("name"), c.get("length")
        if not (isinstance(table, str) and table in known and isinstance(name, str) and name in known[table]
                and (table, name) not in seen and isinstance(length, int) and not isinstance(length, bool)
                and length >= 0 and _stored_ok(c, known[table][name])):
            return False
        seen.add((table, name))
        lengths[table].add(length)
        stored[table] = stored[table] or "dtype" in c
    return all(len(v) <= 1 and (stored[t] or v <= {0}) for t, v in lengths.items())


def _stored_ok(c: dict[str, Any], canonical: str) -> bool:
    """One column entry says how it is stored, in a way its canonical type takes back exactly."""
    if ("const" in c) == ("dtype" in c):
        return False
    if "dtype" in c:
        d = c["dtype"]
        if not isinstance(d, str) or d not in STORED_DTYPES:
            return False
        if canonical.startswith("i"):
            return d.startswith("i") and np.dtype(d).itemsize <= np.dtype(canonical).itemsize
        return d == canonical
    v = c["const"]
    if canonical.startswith("f"):
        return isinstance(v, float) and math.isfinite(v)
    info = np.iinfo(canonical)
    return isinstance(v, int) and not isinstance(v, bool) and info.min <= v <= info.max


def read(path: str | Path) -> Trace:
    """Read and validate the trace at ``path``."""
    p = Path(path)
    try:
        data = read_bounded(p, TRACE_MAX_BYTES, "trace")
    except FileRefused as e:
        raise TraceError(str(e)) from None
    except FileNotFoundError:
        raise TraceError(f"{p}: no such trace file") from None
    except OSError as e:
        raise TraceError(f"{p}: cannot read trace: {e.strerror}") from None
    return decode(data, str(p))


def file_digest(path: str | Path) -> str:
    """The SHA-256 a trace file ends with (hex): what its content is, read without the rest of it."""
    with open(path, "rb") as f:
        f.seek(-32, os.SEEK_END)
        return f.read(32).hex()


def check(trace: Trace, name: str = "<trace>") -> None:
    """Refuse an inconsistent op graph: every rule a backend relies on holds after this.

    Rules: all columns present with equal lengths; apply input slices lie inside
    ``inputs``, follow each other in apply order and name earlier grad ops, each consumed
    once; ``nodes`` is an integer in 1 .. :data:`MAX_NODES` and every node an op names lies
    below it; each node's versions advance by one per apply/mix, in order; every read (grad,
    mix sender, eval) names a version that exists when it is read; times are finite and
    ``t_start ≤ t_end``. Memory: a few bytes per op besides the columns (the reads are
    checked :data:`CHUNK_ROWS` ops at a time), whatever the columns hold.
    """
    def bad(msg: str) -> TraceError:
        return TraceError(f"{name}: inconsistent trace: {msg}")

    for table, spec, data in (("ops", OP_COLUMNS, trace.ops), ("inputs", INPUT_COLUMNS, trace.inputs)):
        missing = set(spec) - set(data)
        if missing:
            raise bad(f"{table} table lacks columns {sorted(missing)}")
        lengths = {len(data[k]) for k in spec}
        if len(lengths) > 1:
            raise bad(f"{table} columns have different lengths {sorted(lengths)}")
    ops, inp = trace.ops, trace.inputs
    n = len(ops["kind"])
    kind = ops["kind"]
    top = OUTER if trace.header.get("schema_version") == LOCAL_SCHEMA else EVAL
    if n and kind.max() > top:
        raise bad(f"unknown op kind {int(kind.max())}" + (" (outer ops need schema version 2)"
                                                          if kind.max() == OUTER else ""))
    if not (np.isfinite(ops["t_start"]).all() and np.isfinite(ops["t_end"]).all()):
        raise bad("non-finite op time")
    late = ops["t_start"] > ops["t_end"]
    if late.any():
        raise bad(f"op {int(np.argmax(late))} ends before it starts")
    del late
    applies = np.flatnonzero(kind == APPLY)
    starts, counts = ops["in_start"][applies], ops["in_count"][applies].astype(np.int64)
    n_inp = len(inp["grad_op"])
    outside = (starts < 0) | (counts < 0) | (starts > n_inp - counts)
    if outside.any():
        j = int(np.argmax(outside))
        raise bad(f"op {int(applies[j])} (apply): columns 'in_start' = {int(starts[j])}, 'in_count' = "
                  f"{int(counts[j])}: its input slice lies outside the inputs table ({n_inp:,} rows)")
    if len(applies) and (int(counts.sum()) != n_inp or (starts != np.cumsum(counts) - counts).any()):
        raise bad("columns 'in_start', 'in_count': the applies' input slices do not follow each other through "
                  "the inputs table (apply order)")
    if n_inp:
        g = inp["grad_op"]
        wrong = (g < 0) | (g >= n)
        if n:
            wrong |= kind[np.where(wrong, 0, g)] != GRAD
        if wrong.any():
            j = int(np.argmax(wrong))
            raise bad(f"input {j}: column 'grad_op' = {int(g[j])}: an apply input does not name a grad op")
        if (g >= np.repeat(applies, counts)).any():
            raise bad("an apply consumes a gradient computed after it, or inputs are not in apply order")
        seen = np.zeros(n, bool)
        seen[g] = True
        if int(seen.sum()) != n_inp:
            raise bad("a gradient is applied more than once")
    _check_versions(trace, bad)


def _header_nodes(header: dict[str, Any]) -> int | None:
    """The header's ``nodes`` when it is an integer in 1 .. :data:`MAX_NODES`, else None."""
    nodes = header.get("nodes")
    if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
        return None
    return nodes


def _check_versions(trace: Trace, bad: Any) -> None:
    ops = trace.ops
    kind, node, version = ops["kind"], ops["node"], ops["version"]
    n = len(kind)
    nodes = _header_nodes(trace.header)
    if nodes is None:
        raise bad(f"header 'nodes' = {_shown(trace.header.get('nodes'))}: expected an integer in 1 .. {MAX_NODES:,} "
                  f"(cluster.learners' maximum)")
    mut = np.concatenate([lo + np.flatnonzero((k == APPLY) | (k == MIX) | (k == OUTER))
                          for lo in range(0, n, CHUNK_ROWS) for k in [kind[lo:lo + CHUNK_ROWS]]]
                         or [np.zeros(0, np.int64)])
    mnode = node[mut].astype(np.int64)
    for lo in range(0, n, CHUNK_ROWS):  # every node an op names: 0 .. nodes-1 (an eval's -1: the average)
        k, nd, src = kind[lo:lo + CHUNK_ROWS], node[lo:lo + CHUNK_ROWS], ops["src_node"][lo:lo + CHUNK_ROWS]
        for col, values, names in (("node", nd, (k == APPLY) | (k == MIX) | (k == OUTER)
                                    | ((k == EVAL) & (nd != AVERAGE_NODE))),
                                   ("src_node", src, (k == GRAD) | (k == MIX) | (k == OUTER))):
            wrong = names & ((values < 0) | (values >= nodes))
            if wrong.any():
                i = lo + int(np.argmax(wrong))
                raise bad(f"op {i} ({KIND_NAMES[kind[i]]}): column '{col}' = {int(values[i - lo])} names a node "
                          f"outside 0..nodes-1 (nodes = {nodes:,})")
    # versions must advance by one per mutation, per node, in op order
    order = np.argsort(mnode, kind="stable")  # by node, then op (mut is ascending)
    m_sorted, n_sorted = mut[order], mnode[order]
    del order
    first = np.r_[True, n_sorted[1:] != n_sorted[:-1]] if len(mut) else np.zeros(0, bool)
    rank = np.arange(len(mut)) - np.maximum.accumulate(np.where(first, np.arange(len(mut)), 0))
    if len(mut) and (version[m_sorted] != rank).any():
        i = int(m_sorted[np.argmax(version[m_sorted] != rank)])
        raise bad(f"op {i} ({KIND_NAMES[kind[i]]}) on node {int(node[i])} mutates version "
                  f"{int(version[i])} out of sequence")
    del first, rank
    # reads: version r of node k exists at op i iff r ≤ number of mutations of k before i;
    # (node, op) as one sorted key, node·(n+1) + op (< 2⁶³: nodes ≤ MAX_NODES, n < 2⁴⁰)
    keys = n_sorted * (n + 1) + m_sorted
    del m_sorted, n_sorted
    for lo in range(0, n, CHUNK_ROWS):
        hi = min(n, lo + CHUNK_ROWS)
        k = kind[lo:hi]
        is_eval = k == EVAL
        rnode = np.where(is_eval, node[lo:hi], ops["src_node"][lo:hi]).astype(np.int64)
        rver = np.where(is_eval, version[lo:hi], ops["src_version"][lo:hi])
        sel = np.flatnonzero((k != APPLY) & ~(is_eval & (rnode == AVERAGE_NODE)))
        if not len(sel):
            continue
        rnode, rver = rnode[sel], rver[sel]
        if (rver < 0).any():
            raise bad(f"op {lo + int(sel[np.argmax(rver < 0)])} reads a negative version")
        base = rnode * (n + 1)
        available = np.searchsorted(keys, base + lo + sel) - np.searchsorted(keys, base)  # mutations before
        over = rver > available
        if over.any():
            j = int(np.argmax(over))
            i = lo + int(sel[j])
            raise bad(f"op {i} ({KIND_NAMES[kind[i]]}) reads node {int(rnode[j])} version "
                      f"{int(rver[j])} before it exists")


def _shown(value: Any) -> str:
    """A header value for a message: JSON, cut to 60 characters."""
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def check_replayable(trace: Trace, name: str = "<trace>") -> None:
    """Refuse, in one line naming the file and the header field or column, a trace (already
    consistent: :func:`check`) that a replay could not execute in memory and time bounded by
    its stored columns.

    Header: ``data_seed`` an integer in 0 .. :data:`MAX_SEED`; ``samples_per_epoch`` an
    integer in 1 .. :data:`MAX_SAMPLES_PER_EPOCH`; ``nodes`` no more than the nodes the ops
    name (at least 1); ``mean_staleness`` and ``wall_s``, when present, finite numbers ≥ 0;
    ``measured`` a boolean, ``run_id`` and ``protocol`` strings. Columns: a grad's
    ``batch_size`` in 1 .. :data:`MAX_BATCH`, its ``node`` (the learner) in
    0 .. :data:`MAX_NODES`−1, its ``batch_index`` k in 0 .. the op count and its
    ``sample_start`` ≥ 0 with the minibatch's end within (k+1)·max(samples_per_epoch,
    :data:`MAX_NODES`·batch_size) (where every data layout puts a learner's k-th minibatch)
    and :data:`MAX_POSITION`; ``epoch`` finite and ≥ 0; a mix's ``coef`` and ``self_coef``
    and an input's ``weight`` finite and ≥ 0; ``staleness`` ≥ 0. Counts: at most one
    gradient per learner that no apply consumes (in flight when the run ended), and at most
    two evals more than applies (every writer evaluates at the start, after an update that
    crosses an evaluation mark, and at the end), and evals × nodes at most
    :data:`MAX_EVAL_READS`.
    """
    h, ops, inp = trace.header, trace.ops, trace.inputs

    def field(key: str, value: Any, rule: str) -> TraceError:
        return TraceError(f"{name}: header '{key}' = {_shown(value)}: {rule}")

    def column(table: str, col: str, values: np.ndarray, where: np.ndarray, rule: str,
               rows: np.ndarray | None = None, offset: int = 0) -> None:
        """Refuse the first row of ``values`` (rows ``rows``, or ``offset`` + position) where ``where``."""
        if where.any():
            j = int(np.argmax(where))
            row = offset + (int(rows[j]) if rows is not None else j)
            what = f"op {row} ({KIND_NAMES[int(ops['kind'][row])]})" if table == "ops" else f"input {row}"
            v = values[j]
            shown = repr(float(v)) if values.dtype.kind == "f" else str(int(v))
            raise TraceError(f"{name}: {what}: column '{col}' = {shown}: {rule}")

    def integer(key: str, lo: int, hi: int, reason: str) -> int:
        v = h.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise field(key, v, f"expected an integer in {lo:,} .. {hi:,} ({reason})")
        return v

    for key in ("data_seed", "samples_per_epoch"):
        if key not in h:
            raise TraceError(f"{name}: trace header lacks {key!r}: cannot replay it")
    integer("data_seed", 0, MAX_SEED, "a seed's range")
    spe = integer("samples_per_epoch", 1, MAX_SAMPLES_PER_EPOCH, "workload.teacher_samples' maximum, the largest "
                  "training set a replay loads; a replay holds each epoch's permutation of it")
    for key in ("mean_staleness", "wall_s"):
        v = h.get(key, 0.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
            raise field(key, v, "expected a finite number ≥ 0")
    if not isinstance(h.get("measured", False), bool):
        raise field("measured", h["measured"], "expected true or false")
    for key in ("run_id", "protocol"):
        if not isinstance(h.get(key, ""), str):
            raise field(key, h[key], "expected a string")

    n, kind = trace.n_ops, ops["kind"]
    n_applies, n_evals = int(np.count_nonzero(kind == APPLY)), int(np.count_nonzero(kind == EVAL))
    if n_evals > n_applies + 2:
        raise TraceError(f"{name}: {n_evals:,} eval ops for {n_applies:,} applies: a run evaluates only at its "
                         "start, after an update and at its end")
    nodes = _header_nodes(h)
    if nodes is not None and n_evals * nodes > MAX_EVAL_READS:
        raise TraceError(f"{name}: {n_evals:,} eval ops × {nodes:,} nodes is more than {MAX_EVAL_READS:.0e} reads: "
                         "each eval reads every node's latest state (a replay plans 8 bytes for each)")
    consumed = np.zeros(n, bool)
    consumed[inp["grad_op"]] = True
    left = np.zeros(MAX_NODES, np.int64)  # gradients no apply consumes, per learner
    named = -1                            # the highest state node an op names
    for lo in range(0, n, CHUNK_ROWS):
        hi = min(n, lo + CHUNK_ROWS)
        kk, nd = kind[lo:hi], ops["node"][lo:hi]
        g = np.flatnonzero(kk == GRAD)
        learner = nd[g]
        column("ops", "node", learner, (learner < 0) | (learner >= MAX_NODES),
               f"a learner is in 0 .. {MAX_NODES - 1:,} (cluster.learners' maximum)", g, lo)
        left += np.bincount(learner[~consumed[lo:hi][g]], minlength=MAX_NODES)
        if left.max() > 1:
            raise TraceError(f"{name}: learner {int(np.argmax(left))} has {int(left.max()):,} or more gradients no "
                             "apply consumes: a learner has at most one in flight when a run ends")
        size = ops["batch_size"][lo:hi][g].astype(np.int64)
        column("ops", "batch_size", size, (size < 1) | (size > MAX_BATCH),
               f"a minibatch holds 1 .. {MAX_BATCH:,} samples (cluster.minibatch's range)", g, lo)
        k = ops["batch_index"][lo:hi][g]
        column("ops", "batch_index", k, (k < 0) | (k > n), f"a learner's k-th minibatch: 0 ≤ k ≤ the {n:,} ops",
               g, lo)
        start = ops["sample_start"][lo:hi][g]
        column("ops", "sample_start", start, start < 0, "a stream position is ≥ 0", g, lo)
        column("ops", "sample_start", start, start > MAX_POSITION - size,
               "a stream position plus its minibatch stays below 2^62", g, lo)
        reach = (k + 1.0) * np.maximum(float(spe), float(MAX_NODES) * size)
        column("ops", "sample_start", start, start + size > reach,
               f"beyond where any data layout puts a learner's k-th minibatch ((k+1)·max(samples_per_epoch = "
               f"{spe:,}, {MAX_NODES:,}·batch_size), k = its batch_index)", g, lo)
        e = ops["epoch"][lo:hi]
        column("ops", "epoch", e, ~(np.isfinite(e) & (e >= 0)), "training progress is a finite number ≥ 0", None, lo)
        m = np.flatnonzero((kk == MIX) | (kk == OUTER))
        for col in ("coef", "self_coef"):
            v = ops[col][lo:hi][m]
            column("ops", col, v, ~(np.isfinite(v) & (v >= 0)), "a mixing factor is a finite number ≥ 0", m, lo)
        for a in (nd[(kk == APPLY) | (kk == MIX) | (kk == EVAL) | (kk == OUTER)],
                  ops["src_node"][lo:hi][(kk == GRAD) | (kk == MIX) | (kk == OUTER)]):
            if len(a):
                named = max(named, int(a.max()))
    del consumed
    w, s = inp["weight"], inp["staleness"]
    column("inputs", "weight", w, ~(np.isfinite(w) & (w >= 0)), "an averaging weight is a finite number ≥ 0")
    column("inputs", "staleness", s, s < 0, "staleness counts versions: ≥ 0")
    if nodes is None or nodes > max(1, named + 1):
        raise field("nodes", h.get("nodes"), f"expected an integer in 1 .. {max(1, named + 1):,}, the nodes the ops "
                    "name (a replay holds a state per node)")
    _check_averaging(trace, name, field, column)


AVERAGING_COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")  # compression_bytes.COMPRESSIONS


def _check_averaging(trace: Trace, name: str, field: Any, column: Any) -> None:
    """Schema 2's header ``averaging`` and outer / fragment ops: a compression ddlsim knows, its
    integers in range, ``tensors`` the fragments of contiguous tensors in 0 .. F−1; an outer
    op's learning rate finite and > 0 and its momentum in [0, 1); every fragment an op names
    below F (−1: the whole model)."""
    h, ops = trace.header, trace.ops
    avg = h.get("averaging")
    fragments = 1
    if avg is not None:
        if not isinstance(avg, dict):
            raise field("averaging", avg, "expected a table")

        def integer(key: str, lo: int, default: int) -> int:
            v = avg.get(key, default)
            if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= 10**9:
                raise field(f"averaging.{key}", v, f"expected an integer in {lo} .. 10^9")
            return v

        if avg.get("compression", "none") not in AVERAGING_COMPRESSIONS:
            raise field("averaging.compression", avg.get("compression"),
                        f"expected one of {', '.join(AVERAGING_COMPRESSIONS)}")
        integer("powersgd_rank", 1, 1)
        integer("powersgd_warmup", 0, 0)
        integer("local_steps", 1, 1)
        fragments = integer("fragments", 1, 1)
        tensors = avg.get("tensors")
        if (tensors is None and fragments > 1) or tensors is not None and not (
                isinstance(tensors, list) and tensors and all(isinstance(t, int) and not isinstance(t, bool)
                                                               for t in tensors)
                and tensors[0] == 0 and tensors[-1] == fragments - 1
                and all(b - a in (0, 1) for a, b in zip(tensors, tensors[1:]))):
            raise field("averaging.tensors", tensors, f"expected the fragment of each tensor: from 0 up to "
                        f"{fragments - 1} (averaging.fragments − 1), ascending by at most one")
    kind = ops["kind"]
    outer = np.flatnonzero(kind == OUTER)
    # a mix's batch_index is a fragment only in schema 2 (schema 1 ignores it)
    two = h.get("schema_version") == LOCAL_SCHEMA
    frag_rows = np.flatnonzero((kind == OUTER) | ((kind == MIX) & two))
    f = ops["batch_index"][frag_rows]
    column("ops", "batch_index", f, (f < -1) | (f >= fragments),
           f"a fragment of the model: −1 (all of it) or 0 .. {fragments - 1} (header averaging.fragments)", frag_rows)
    lr, mom = ops["coef"][outer], ops["self_coef"][outer]
    column("ops", "coef", lr, ~(np.isfinite(lr) & (lr > 0)), "an outer learning rate is a finite number > 0", outer)
    column("ops", "self_coef", mom, ~((mom >= 0) & (mom < 1)), "an outer momentum is ≥ 0 and < 1", outer)
