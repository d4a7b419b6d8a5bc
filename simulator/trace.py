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
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .files import FileRefused, atomic_write, read_bounded

SCHEMA_VERSION = 1
TRACE_MAX_BYTES = 64 << 30  # a trace file is read whole: at most this much
MAGIC = b"DDLTRACE"
GRAD, APPLY, MIX, EVAL = 0, 1, 2, 3
KIND_NAMES = ("grad", "apply", "mix", "eval")
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
}
APPLY_ONE = 4  # builder-only kind: an apply of one gradient with weight 1, its input in its row
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

    def apply(self, node: int, version: int, grad_ops: list[int], weights: list[float],
              staleness: list[int], t: float, epoch: float) -> int:
        """Record that (node, version) becomes version + 1 from ``grad_ops``."""
        if not len(grad_ops) == len(weights) == len(staleness):
            raise ValueError("apply: grad_ops, weights and staleness differ in length")
        row, rows = self._pa(node, version, len(grad_ops), t, epoch), b"".join(map(self._pin, grad_ops, staleness, weights))
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
            for name in table.dtype.names:
                if name in ops:
                    ops[name][rows] = np.ascontiguousarray(table[name])
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
        inputs = {"grad_op": np.zeros(n_in, np.int64), "weight": np.ones(n_in), "staleness": np.zeros(n_in, np.int32)}
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
    header["schema_version"] = SCHEMA_VERSION
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
    """Parse and validate trace bytes; raise :class:`TraceError` naming ``name``."""
    if len(data) < len(MAGIC) + 8 + 32 or not data.startswith(MAGIC):
        raise TraceError(f"{name}: not a ddlsim trace (bad magic or too short)")
    body, digest = data[:-32], data[-32:]
    (hlen,) = struct.unpack_from("<Q", data, len(MAGIC))
    hstart = len(MAGIC) + 8
    if hstart + hlen > len(body):
        raise TraceError(f"{name}: truncated trace (header runs past the end of the file)")
    try:
        header = json.loads(body[hstart:hstart + hlen])
    except (ValueError, RecursionError):
        raise TraceError(f"{name}: corrupt trace header") from None
    if hashlib.sha256(body).digest() != digest:
        raise TraceError(f"{name}: corrupt trace (checksum mismatch)")
    if not isinstance(header, dict) or not _columns_ok(header.get("columns")):
        raise TraceError(f"{name}: corrupt trace header (no valid column list)")
    version = header.get("schema_version")
    if version != SCHEMA_VERSION:
        raise TraceError(f"{name}: trace schema version {version!r} is not supported "
                         f"(this ddlsim reads version {SCHEMA_VERSION})")
    expected = sum(np.dtype(c["dtype"]).itemsize * c["length"] for c in header["columns"] if "dtype" in c)
    if hstart + hlen + expected != len(body):
        raise TraceError(f"{name}: truncated trace ({len(body) - hstart - hlen} column bytes, "
                         f"header announces {expected})")
    tables: dict[str, dict[str, np.ndarray]] = {"ops": {}, "inputs": {}}
    pos = hstart + hlen
    for c in header["columns"]:
        spec = OP_COLUMNS if c["table"] == "ops" else INPUT_COLUMNS
        canonical = spec.get(c["name"], c.get("dtype", "f8"))
        if "const" in c:
            tables[c["table"]][c["name"]] = np.full(c["length"], c["const"], dtype=canonical)
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


def check(trace: Trace, name: str = "<trace>") -> None:
    """Refuse an inconsistent op graph: every rule a backend relies on holds after this.

    Rules: all columns present with equal lengths; apply input slices lie inside
    ``inputs`` and name earlier grad ops, each consumed once; each node's versions
    advance by one per apply/mix, in order; every read (grad, mix sender, eval) names a
    version that exists when it is read; times are finite and ``t_start ≤ t_end``.
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
    if n and kind.max() > EVAL:
        raise bad(f"unknown op kind {int(kind.max())}")
    if not (np.isfinite(ops["t_start"]).all() and np.isfinite(ops["t_end"]).all()):
        raise bad("non-finite op time")
    if (ops["t_start"] > ops["t_end"]).any():
        raise bad(f"op {int(np.argmax(ops['t_start'] > ops['t_end']))} ends before it starts")
    applies = np.flatnonzero(kind == APPLY)
    starts, counts = ops["in_start"][applies], ops["in_count"][applies]
    n_inp = len(inp["grad_op"])
    if len(applies) and ((starts < 0).any() or (starts + counts > n_inp).any() or (counts < 0).any()):
        raise bad("an apply's input slice lies outside the inputs table")
    if n_inp:
        g = inp["grad_op"]
        if (g < 0).any() or (g >= n).any() or (kind[np.clip(g, 0, max(n - 1, 0))] != GRAD).any():
            raise bad("an apply input does not name a grad op")
        owner = np.repeat(applies, counts)
        if len(owner) != n_inp or (g >= owner).any():
            raise bad("an apply consumes a gradient computed after it, or inputs are not in apply order")
        if len(np.unique(g)) != n_inp:
            raise bad("a gradient is applied more than once")
    _check_versions(trace, bad)


def _check_versions(trace: Trace, bad: Any) -> None:
    ops = trace.ops
    kind, node, version = ops["kind"], ops["node"], ops["version"]
    mut = np.flatnonzero((kind == APPLY) | (kind == MIX))
    nodes = trace.header.get("nodes")
    if not isinstance(nodes, int) or nodes < 1:
        raise bad("header lacks a positive 'nodes' count")
    touched = np.concatenate([node[mut], ops["src_node"][kind == GRAD], ops["src_node"][kind == MIX]])
    if len(touched) and (touched.min() < 0 or touched.max() >= nodes):
        raise bad("an op names a node outside 0..nodes-1")
    # versions must advance by one per mutation, per node, in op order
    order = np.lexsort((mut, node[mut]))
    m_sorted, n_sorted = mut[order], node[mut][order]
    first = np.r_[True, n_sorted[1:] != n_sorted[:-1]] if len(mut) else np.zeros(0, bool)
    rank = np.arange(len(mut)) - np.maximum.accumulate(np.where(first, np.arange(len(mut)), 0))
    if len(mut) and (version[m_sorted] != rank).any():
        i = int(m_sorted[np.argmax(version[m_sorted] != rank)])
        raise bad(f"op {i} ({KIND_NAMES[kind[i]]}) on node {int(node[i])} mutates version "
                  f"{int(version[i])} out of sequence")
    # reads: version r of node k exists at op i iff r ≤ number of mutations of k before i
    reads = np.flatnonzero(kind != APPLY)
    rnode = np.where(kind[reads] == EVAL, node[reads], ops["src_node"][reads])
    rver = np.where(kind[reads] == EVAL, version[reads], ops["src_version"][reads])
    keep = ~((kind[reads] == EVAL) & (rnode == AVERAGE_NODE))
    reads, rnode, rver = reads[keep], rnode[keep], rver[keep]
    if len(reads):
        if (rver < 0).any():
            raise bad(f"op {int(reads[np.argmax(rver < 0)])} reads a negative version")
        for k in np.unique(rnode):
            sel = rnode == k
            muts_k = mut[node[mut] == k]
            available = np.searchsorted(muts_k, reads[sel])  # mutations strictly before the read
            over = rver[sel] > available
            if over.any():
                i = int(reads[sel][np.argmax(over)])
                raise bad(f"op {i} ({KIND_NAMES[kind[i]]}) reads node {int(k)} version "
                          f"{int(rver[sel][np.argmax(over)])} before it exists")
