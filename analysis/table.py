"""A tiny columnar table of result rows, and short labels for run configurations.

``Table`` is a list of row dicts with typed CSV reading and atomic CSV writing; it is
all the analysis needs from a data-frame library (pandas is not required).

Typing rule of :meth:`Table.read_csv`, applied per column: an empty cell is ``None``;
a column whose other cells are all ``True``/``False`` holds ``bool``; a column whose
other cells all parse as numbers holds ``int`` (integer literals) or ``float``; any
other column keeps its strings unchanged (so an id such as ``"1e5"`` next to
``"abc"`` stays a string). A cell that cannot be a usable number (beyond a float's range;
text in a column the caller names numeric) is read as missing, and said in ``notes``.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from ..simulator.files import atomic_write, read_bounded

CSV_MAX_BYTES = 256 << 20
CSV_FIELD_MAX = 1 << 20
csv.field_size_limit(CSV_FIELD_MAX)

Row = dict[str, Any]

# Dotted sweep keys that repeat a column every label already shows.
_SHOWN_KEYS = {"cluster.learners", "cluster.minibatch", "protocol.n", "protocol.name"}
# Columns describing *what* ran (the configuration), as opposed to what was measured.
CONFIG_COLUMNS = ("protocol", "softsync_n", "learners", "minibatch")
_BOOL = {"True": True, "False": False, "true": True, "false": False}


class Table:
    """An ordered list of row dicts; a missing column or empty cell reads as ``None``."""

    def __init__(self, rows: Iterable[Mapping[str, Any]] = (), columns: Sequence[str] | None = None):
        self.rows: list[Row] = [dict(r) for r in rows]
        seen: dict[str, None] = dict.fromkeys(columns or ())
        for r in self.rows:
            seen.update(dict.fromkeys(r))
        self.columns: list[str] = list(seen)
        self.notes: list[str] = []  # what reading the table had to leave out, one line each

    # -- access -------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[Row]:
        return iter(self.rows)

    def __bool__(self) -> bool:
        return bool(self.rows)

    def __repr__(self) -> str:
        return f"Table({len(self.rows)} rows, columns={self.columns})"

    def column(self, name: str) -> list[Any]:
        """The values of column ``name``, one per row (``None`` where absent)."""
        return [r.get(name) for r in self.rows]

    def has(self, *names: str) -> bool:
        """True when every named column holds at least one usable value (not None/NaN)."""
        return all(any(is_value(r.get(n)) for r in self.rows) for n in names)

    def filter(self, predicate: Callable[[Row], bool] | None = None, **eq: Any) -> Table:
        """Rows whose columns equal every ``eq`` value and satisfy ``predicate``."""
        keep = [r for r in self.rows
                if all(r.get(k) == v for k, v in eq.items()) and (predicate is None or predicate(r))]
        return Table(keep, self.columns)

    def group_by(self, *keys: str) -> dict[tuple[Any, ...], Table]:
        """Sub-tables keyed by the tuple of ``keys`` values, in order of first appearance."""
        groups: dict[tuple[Any, ...], list[Row]] = {}
        for r in self.rows:
            groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
        return {k: Table(v, self.columns) for k, v in groups.items()}

    def sort_by(self, *keys: str) -> Table:
        """Rows sorted by ``keys``; ``None`` sorts last, mixed types by their text."""
        return Table(sorted(self.rows, key=lambda r: tuple(sort_key(r.get(k)) for k in keys)),
                     self.columns)

    # -- CSV ----------------------------------------------------------------------
    @classmethod
    def read_csv(cls, path: str | os.PathLike[str], numeric: Iterable[str] = ()) -> Table:
        """Read a CSV with a header line, typing each column (see the module rule). A BOM is
        accepted; a file that is not a regular file of at most ``CSV_MAX_BYTES``, or a field of
        more than ``CSV_FIELD_MAX`` characters, is a one-line ``ValueError``.

        A cell that cannot be a usable number is read as missing (``None``), with a line in
        :attr:`notes` naming the file, the column and the row: a number beyond a float's range
        anywhere, or a cell that is not a number in one of the ``numeric`` columns (which
        would otherwise turn the whole column into text)."""
        text = read_bounded(path, CSV_MAX_BYTES, "results table").decode("utf-8-sig")
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            columns = [c for c in (reader.fieldnames or []) if c is not None]
            raw = [{k: v for k, v in r.items() if k is not None} for r in reader]
        except csv.Error as e:
            raise ValueError(f"{path}: not a readable CSV table ({e})") from None
        notes: list[str] = []
        numeric = set(numeric)
        for c in columns:
            for i, r in enumerate(raw, 2):  # line 1 is the header
                cell = r.get(c)
                why = _unusable(cell, c in numeric)
                if why:
                    notes.append(f"{path}: column {c!r}, line {i}: {_clip(cell)} {why}; read as missing")
                    r[c] = None
        convert = {c: _column_converter([r.get(c) for r in raw]) for c in columns}
        rows = [{c: convert[c](r.get(c)) for c in columns} for r in raw]
        table = cls(rows, columns)
        table.notes = notes
        return table

    def write_csv(self, path: str | os.PathLike[str]) -> Path:
        """Write all columns atomically (temporary file in the same folder, then replace)."""
        buf = io.StringIO(newline="")
        w = csv.writer(buf)
        w.writerow(self.columns)
        for r in self.rows:
            w.writerow([csv_safe(v) if isinstance(v := r.get(c), str) else format_cell(v) for c in self.columns])
        return atomic_write(path, buf.getvalue())


# -- cells ------------------------------------------------------------------------
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_safe(text: str) -> str:
    """A text cell a spreadsheet will not run as a formula: prefixed with ``'`` when it starts
    with ``= + - @``, a tab or a carriage return (OWASP's CSV-injection rule). Numbers are
    written as numbers and never prefixed."""
    return "'" + text if text.startswith(FORMULA_STARTS) else text
def _parse_number(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def _unusable(cell: str | None, numeric: bool) -> str | None:
    """Why a cell cannot be read as a usable number (``None`` when it can, or need not):
    a number too large for a float, or text in a ``numeric`` column."""
    if cell is None or cell.strip() == "":
        return None
    text = cell.strip()
    try:
        v = _parse_number(text)
    except ValueError:
        return "is not a number" if numeric else None
    if isinstance(v, int) and not _fits_float(v):
        return "is too large for a number"
    return None


def _fits_float(v: int) -> bool:
    try:
        float(v)
    except OverflowError:
        return False
    return True


def _clip(text: str | None, width: int = 24) -> str:
    text = "" if text is None else text.strip()
    return repr(text if len(text) <= width else text[:width] + "…")


def _column_converter(cells: list[str | None]) -> Callable[[str | None], Any]:
    present = [c.strip() for c in cells if c is not None and c.strip() != ""]

    def none_or(f: Callable[[str], Any]) -> Callable[[str | None], Any]:
        return lambda c: None if c is None or c.strip() == "" else f(c.strip())

    if present and all(c in _BOOL for c in present):
        return none_or(_BOOL.__getitem__)
    try:
        for c in present:
            _parse_number(c)
    except ValueError:
        return lambda c: None if c is None or c == "" else c
    return none_or(_parse_number)


def format_cell(value: Any) -> str:
    """CSV text of a value: ``None`` → empty, floats in round-trip ``repr``."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def is_value(v: Any) -> bool:
    """True for a usable cell: not ``None`` and not a float NaN."""
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def is_number(v: Any) -> TypeGuard[float]:
    """True for a finite int/float (bools excluded) that a float can hold: an integer beyond
    a float's range (a hand-edited cell, a JSON literal) is no usable number."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def mean(values: Sequence[float]) -> float:
    """Arithmetic mean (NaN when empty)."""
    return math.fsum(values) / len(values) if len(values) else math.nan


def sort_key(v: Any) -> tuple[int, Any]:
    """Total order for cells: numbers, then strings, then ``None``."""
    if is_number(v):
        return (0, v)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return (2, "")
    return (1, str(v))


# -- configurations and labels ----------------------------------------------------
def swept_keys(row: Mapping[str, Any]) -> list[str]:
    """Dotted (swept) columns of a row that labels show, in column order."""
    return [k for k in row if "." in k and k not in _SHOWN_KEYS]


def varying_keys(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Dotted columns that take more than one distinct value across ``rows``."""
    rows = list(rows)
    keys: dict[str, None] = {}
    for r in rows:
        keys.update(dict.fromkeys(swept_keys(r)))
    return [k for k in keys if len({format_cell(r.get(k)) for r in rows}) > 1]


def protocol_name(row: Mapping[str, Any]) -> str:
    """``"4-softsync"`` for softsync with n = 4 (Rudra's notation; any protocol with its own n),
    else the protocol (async's n = λ is implied)."""
    proto = str(row.get("protocol") or "?")
    n = row.get("softsync_n")
    if proto != "async" and is_number(n):
        return f"{n:g}-{proto}"
    return proto


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ",".join(_short(v) for v in value)
    return str(value)


def label(row: Mapping[str, Any], keys: Iterable[str] | None = None,
          omit: Iterable[str] = ()) -> str:
    """Short label of a configuration, e.g. ``"async λ=30 μ=4 per_gradient"``.

    Shows the protocol (``n-softsync`` for softsync), ``λ`` and ``μ`` (unless named in
    ``omit`` as ``"learners"``/``"minibatch"``; the ``run_id`` stands in for a missing
    protocol), then each swept key of ``keys``
    (default: every dotted column of the row): a text value alone, a number or bool as
    ``name=value`` with the key's last segment as name. Empty values are skipped.
    """
    omit = set(omit)
    if "protocol" in omit:
        parts = []
    else:
        parts = [protocol_name(row) if is_value(row.get("protocol")) else str(row.get("run_id", "?"))]
    if "learners" not in omit and is_value(row.get("learners")):
        parts.append(f"λ={_short(row['learners'])}")
    if "minibatch" not in omit and is_value(row.get("minibatch")):
        parts.append(f"μ={_short(row['minibatch'])}")
    for k in (swept_keys(row) if keys is None else keys):
        v = row.get(k)
        if not is_value(v) or k in omit or k in _SHOWN_KEYS:
            continue
        parts.append(v if isinstance(v, str) else f"{k.rsplit('.', 1)[-1]}={_short(v)}")
    return " ".join(parts)


def labels(rows: Iterable[Mapping[str, Any]], omit: Iterable[str] = ()) -> dict[str, str]:
    """``run_id`` → label showing only the swept keys that differ across ``rows``.

    Labels are unique: the replicates of one configuration (the same configuration, each its
    own ``seed``) get ``seed=N`` appended; other runs that would share a label (repeated runs
    without a seed column, or columns the label leaves out) get their ``run_id`` appended.
    """
    rows = list(rows)
    keys = varying_keys(rows)
    out = {str(r.get("run_id")): label(r, keys, omit) for r in rows}
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(out[str(r.get("run_id"))], []).append(r)
    seeded = {text for text, rs in groups.items() if len(rs) > 1 and len({config_key(r) for r in rs}) == 1
              and all(is_number(r.get("seed")) for r in rs) and len({r["seed"] for r in rs}) == len(rs)}
    by_id = {str(r.get("run_id")): r for r in rows}
    return {rid: (f"{text} seed={_short(by_id[rid]['seed'])}" if text in seeded
                  else f"{text} [{rid}]" if len(groups[text]) > 1 else text) for rid, text in out.items()}


def config_labels(rows: Iterable[Mapping[str, Any]], omit: Iterable[str] = ()) -> dict[str, str]:
    """``run_id`` → label of the run's configuration (:func:`label` with the swept keys that
    differ across ``rows``): the replicates of a configuration share it; distinct configurations
    that would share one get their first run's ``run_id`` appended."""
    rows = list(rows)
    keys = varying_keys(rows)
    first: dict[tuple, str] = {}
    text: dict[tuple, str] = {}
    for r in rows:
        k = config_key(r)
        first.setdefault(k, str(r.get("run_id")))
        text.setdefault(k, label(r, keys, omit))
    counts: dict[str, int] = {}
    for t in text.values():
        counts[t] = counts.get(t, 0) + 1
    return {str(r.get("run_id")): (text[config_key(r)] if counts[text[config_key(r)]] == 1
                                   else f"{text[config_key(r)]} [{first[config_key(r)]}]") for r in rows}


def config_key(row: Mapping[str, Any], omit: Iterable[str] = ()) -> tuple[tuple[str, str], ...]:
    """Hashable identity of a configuration: protocol, n, λ, μ and the swept keys,
    without ``omit``. Runs that differ only in seed or in measurements share it;
    ``softsync_n`` counts except for async (its n = λ is implied)."""
    omit = set(omit)
    names = [c for c in CONFIG_COLUMNS if c not in omit]
    names += sorted(k for k in swept_keys(row) if k not in omit)
    return tuple((n, "" if n == "softsync_n" and row.get("protocol") == "async"
                  else format_cell(row.get(n))) for n in names)


__all__ = ["Table", "Row", "label", "labels", "config_labels", "varying_keys", "swept_keys", "protocol_name",
           "config_key", "is_value", "is_number", "format_cell", "sort_key", "mean", "CONFIG_COLUMNS"]
