"""Data sets the user brings, read by ddlsim's own readers, without torch (a refusal of a
data folder is quick): CIFAR-10 python batches through a restricted unpickler, CIFAR-10
binary batches, MNIST/Fashion-MNIST idx files (raw or ``.gz``), torchvision's legacy ``.pt``
(``weights_only``; torch imported only for that file). Shapes, types, counts and labels
are checked; a file that is not the official one (MD5) is read, with a warning; anything
unreadable is one :class:`BackendError` line naming the file. Turning the arrays into a
model's tensors is :mod:`.workloads`' job.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import pickle
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..simulator.catalog import EMBEDDED_DATASETS, FILE_DATASETS, dataset_info
from ..simulator.files import read_bounded
from .base import BackendError

DEFAULT_DOWNLOAD_DIR = os.path.join("~", ".cache", "ddlsim", "data")
_HINT = "pass --data-dir DIR with the files or --download"


def check_mnist1d_package() -> None:
    """One :class:`BackendError` line when the ``mnist1d`` package is not installed (imports nothing)."""
    import importlib.util

    if importlib.util.find_spec("mnist1d") is None:
        raise BackendError("data set 'mnist1d' needs the mnist1d package (a dependency of ddlsim): "
                           "pip install 'mnist1d>=0.0.2,<0.1'")


def check_data(point: dict[str, Any], data_dir: str | None = None, download: bool = False) -> None:
    """Raise the :class:`BackendError` that :func:`load_data` would raise for a data set that
    cannot be replayed or whose directory is missing (cheap: reads no files), so that a sweep
    can refuse before any work."""
    name = point["workload"]["dataset"]
    if name == "mnist1d":
        check_mnist1d_package()
        return
    if name in EMBEDDED_DATASETS:
        return
    if name not in FILE_DATASETS:
        raise BackendError(f"data set {name!r} is simulation-only: it cannot be replayed "
                           f"(use digits, teacher, mnist1d, cifar10, mnist or fashion_mnist)")
    if data_dir is None and not download:
        raise BackendError(f"data set {name!r} needs its files: {_HINT}")
    root = os.path.expanduser(data_dir or DEFAULT_DOWNLOAD_DIR)
    if not download and not os.path.isdir(root):
        raise BackendError(f"data set {name!r}: no directory {root!r}: {_HINT}")


# -- data sets the user brings: ddlsim's own readers --------------------------------------

DATA_FILE_MAX_BYTES = 1 << 30  # one data file, compressed or not (the official ones are ≤ 47 MB)
CLASSES = 10
_TITLE = {"cifar10": "CIFAR-10", "mnist": "MNIST", "fashion_mnist": "Fashion-MNIST"}
_FOLDER = {"mnist": "MNIST", "fashion_mnist": "FashionMNIST"}  # torchvision's layout: ROOT/MNIST/raw/…
CIFAR_TRAIN = tuple(f"data_batch_{k}" for k in range(1, 6))
CIFAR_TEST = "test_batch"
# the MD5 of the official files (torchvision's CIFAR10.train_list/test_list, MNIST.resources)
CIFAR_MD5 = {
    "data_batch_1": "c99cafc152244af753f735de768cd75f", "data_batch_2": "d4bba439e000b95fd0a9bffe97cbabec",
    "data_batch_3": "54ebc095f3ab1f0389bbae665268c751", "data_batch_4": "634d18415352ddfa80567beed471001a",
    "data_batch_5": "482c414d41f54cd18b22e5b47cb7c3cb", "test_batch": "40351d587109b95175f43aff81a1287e",
}
IDX_FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
             "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
GZ_MD5 = {
    "mnist": {"train_x": "f68b3c2dcbeaaa9fbdd348bbdeb94873", "train_y": "d53e105ee54ea40749a09fcbcd1e9432",
              "test_x": "9fb629c4189551a2d022fa330f9573f3", "test_y": "ec29112dd5afa0611ce80d1b7f02629c"},
    "fashion_mnist": {"train_x": "8d4fb7e6c68d591d4c3dfef9ec88bf0d", "train_y": "25c81989df183df01b3e8a0aad5dffbe",
                      "test_x": "bef4ecab320f06d8554ea6380940ec79", "test_y": "bb300cfdad3c16e7a12a480ee83cd310"},
}


@dataclass
class DataFiles:
    """A data set read from files: pixels uint8 (N, C, H, W), labels int64 (N,) in 0–9;
    ``where`` the folder read; ``warnings`` (files that are not the official ones) and
    ``notes`` (sizes that differ from the official set), one line each."""

    name: str
    where: str
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def data_files(name: str, data_dir: str | None, download: bool = False, verify: bool = True) -> DataFiles:
    """Read data set ``name`` (cifar10, mnist, fashion_mnist) from ``data_dir`` with ddlsim's
    own readers: CIFAR-10's python batches (through a restricted unpickler) or binary batches,
    MNIST's idx files (raw or ``.gz``) or torchvision's legacy ``processed/*.pt`` (tensors
    only). Every file is a regular file of at most ``DATA_FILE_MAX_BYTES``; shapes, types,
    counts and labels are checked and anything else is one :class:`BackendError` line naming
    the file. Files that are not the official ones (``verify``: their MD5, where known) are
    read anyway, with a warning. ``download`` fetches the official files (torchvision) only
    when there are none. The last set read is kept (a sweep reads it once per process)."""
    root = Path(os.path.expanduser(data_dir or DEFAULT_DOWNLOAD_DIR))
    found = _locate(name, root)
    if found is None and download:
        _download(name, root)
        found = _locate(name, root)
    if found is None:
        raise BackendError(f"data set {name!r}: no {_TITLE[name]} files in {str(root)!r} ({_expected(name)}): {_HINT}")
    kind, folder, files = found
    key = (name, kind, str(folder), tuple((role, str(p), _stamp(p)) for role, p in files))
    cached = _FILES_CACHE.get("last")
    if cached is not None and cached[0] == key and (cached[1] or not verify):
        return cached[2]
    _FILES_CACHE.clear()
    read = _READERS[kind](name, folder, files, verify)
    _check_counts(read)
    _FILES_CACHE["last"] = (key, verify, read)
    return read


_FILES_CACHE: dict[str, tuple[Any, bool, DataFiles]] = {}  # the last set read: (files, verified, set)


def _stamp(path: Path) -> tuple[int, int]:
    try:
        st = path.stat()
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def _expected(name: str) -> str:
    if name == "cifar10":
        return ("expected cifar-10-batches-py/ with data_batch_1 … data_batch_5 and test_batch, or "
                "cifar-10-batches-bin/ with data_batch_1.bin … and test_batch.bin")
    return f"expected {_FOLDER[name]}/raw/ with {', '.join(IDX_FILES.values())} (or .gz)"


def _locate(name: str, root: Path) -> tuple[str, Path, list[tuple[str, Path]]] | None:
    """(reader, folder, [(role, file)]) of the first layout found under ``root``; None if none.
    A layout with some of its files missing is one line naming them."""
    if name == "cifar10":
        for sub, ext, kind in (("cifar-10-batches-py", "", "cifar_py"), ("cifar-10-batches-bin", ".bin", "cifar_bin")):
            for folder in (root / sub, root):
                train = [folder / f"{b}{ext}" for b in CIFAR_TRAIN if os.path.lexists(folder / f"{b}{ext}")]
                test = folder / f"{CIFAR_TEST}{ext}"
                if not train and not os.path.lexists(test):
                    continue
                if not train:
                    raise BackendError(f"data set 'cifar10': {folder} has {test.name} but no training batch "
                                       f"(data_batch_1{ext} … data_batch_5{ext})")
                if not os.path.lexists(test):
                    raise BackendError(f"data set 'cifar10': {folder} has training batches but no {test.name} "
                                       "(the test set)")
                return kind, folder, [("train", p) for p in train] + [("test", test)]
        return None
    sub = _FOLDER[name]
    for folder in (root / sub / "raw", root / sub, root / "raw", root):
        files = []
        for role, base in IDX_FILES.items():
            p = next((q for q in (folder / base, folder / f"{base}.gz") if os.path.lexists(q)), None)
            if p is not None:
                files.append((role, p))
        if not files:
            continue
        if len(files) < len(IDX_FILES):
            have = {r for r, _ in files}
            missing = ", ".join(IDX_FILES[r] for r in IDX_FILES if r not in have)
            raise BackendError(f"data set {name!r}: {folder} lacks {missing} (or .gz)")
        return "idx", folder, files
    legacy = root / sub / "processed"
    if os.path.lexists(legacy / "training.pt") or os.path.lexists(legacy / "test.pt"):
        return "legacy", legacy, [("train", legacy / "training.pt"), ("test", legacy / "test.pt")]
    return None


def _download(name: str, root: Path) -> None:
    """Fetch the official files with torchvision (which checks their MD5)."""
    from torchvision import datasets

    cls = {"cifar10": datasets.CIFAR10, "mnist": datasets.MNIST, "fashion_mnist": datasets.FashionMNIST}[name]
    try:
        cls(str(root), train=True, download=True)
    except Exception as e:  # network, disk, a corrupt download: one line
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BackendError(f"data set {name!r}: download into {str(root)!r} failed ({msg})") from None


def _read(name: str, path: Path) -> tuple[bytes, bytes]:
    """(the file's bytes, its content) of one data file: a regular file of bounded size; a
    ``.gz`` is decompressed, to a bounded size too."""
    try:
        data = read_bounded(path, DATA_FILE_MAX_BYTES, "data file")
    except FileNotFoundError:
        raise BackendError(f"data set {name!r}: {path}: no such file") from None
    except OSError as e:
        raise BackendError(f"data set {name!r}: {e}") from None
    if path.suffix != ".gz":
        return data, data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as g:
            out = g.read(DATA_FILE_MAX_BYTES + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise BackendError(f"data set {name!r}: {path}: not a readable gzip file ({e})") from None
    if len(out) > DATA_FILE_MAX_BYTES:
        raise BackendError(f"data set {name!r}: {path}: decompresses to more than {DATA_FILE_MAX_BYTES:,} bytes")
    return data, out


def _check_labels(name: str, path: Path, y: np.ndarray) -> np.ndarray:
    y = y.astype(np.int64)
    bad = np.flatnonzero((y < 0) | (y >= CLASSES))
    if len(bad):
        raise BackendError(f"data set {name!r}: {path}: label {int(y[bad[0]])} of sample {int(bad[0])} is outside "
                           f"0–{CLASSES - 1}")
    return y


def _md5_warning(name: str, folder: Path, differ: list[str]) -> list[str]:
    if not differ:
        return []
    return [f"data set {name!r}: in {folder}: {', '.join(differ)} "
            f"{'is not the official file' if len(differ) == 1 else 'are not the official files'} (MD5 differs); "
            "read anyway: shapes, types, counts and labels checked"]


# CIFAR-10, python version: pickled dicts. Only the few numpy reconstructors such a batch
# needs are allowed; anything else a pickle names (os.system, …) is refused unread.
_SIMPLE_DTYPES = frozenset("u1 i1 u2 i2 u4 i4 u8 i8 b1 f4 f8".split())
_NP_RECONSTRUCT: Any = np.zeros(1).__reduce__()[0]  # the stubs type a reduce value as str | tuple
_NP_SCALAR: Any = np.int64(0).__reduce__()[0]
_NP_FROMBUFFER: Any = np.zeros(1).__reduce_ex__(5)[0]


class _NDArrayMark:
    """Stands for ``numpy.ndarray`` inside a pickle: only :func:`_reconstruct` takes it."""


def _simple(dt: Any) -> bool:
    return isinstance(dt, np.dtype) and not dt.hasobject and dt.fields is None and dt.subdtype is None \
        and dt.str[1:] in _SIMPLE_DTYPES


def _reconstruct(subtype: Any, shape: Any, code: Any) -> np.ndarray:
    if subtype is not _NDArrayMark or tuple(shape) != (0,):
        raise pickle.UnpicklingError("an array reconstructed in an unusual way")
    return _NP_RECONSTRUCT(np.ndarray, (0,), b"b")


def _dtype(obj: Any, align: Any = False, copy: Any = False) -> np.dtype:
    if not isinstance(obj, str) or obj not in _SIMPLE_DTYPES:
        raise _Refused(f"an array of type {obj!r}")
    return np.dtype(obj, align=False, copy=True)


def _scalar(dt: Any, raw: Any) -> Any:
    if not _simple(dt) or not isinstance(raw, (bytes, str)):
        raise pickle.UnpicklingError("an unusual numpy scalar")
    return _NP_SCALAR(dt, raw)


def _frombuffer(buf: Any, dt: Any, shape: Any, order: Any) -> np.ndarray:
    if not _simple(dt) or not isinstance(buf, (bytes, bytearray, memoryview)):
        raise pickle.UnpicklingError("an unusual array buffer")
    return _NP_FROMBUFFER(buf, dt, shape, order)


def _encode(text: Any, encoding: Any = "utf-8") -> bytes:
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("an unusual byte string")
    return text.encode("latin1")


_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct, ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): _NDArrayMark, ("numpy", "dtype"): _dtype,
    ("numpy.core.multiarray", "scalar"): _scalar, ("numpy._core.multiarray", "scalar"): _scalar,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer, ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("_codecs", "encode"): _encode,
}


class _Refused(pickle.UnpicklingError):
    """The pickle names something a CIFAR-10 batch never holds."""


class _BatchUnpickler(pickle._Unpickler):  # the Python implementation: its BUILD can be checked
    """Loads dicts, lists, strings, numbers and plain numeric numpy arrays; nothing else."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise _Refused("a persistent id")

    def _load_build(self) -> None:
        state, inst = self.stack[-1], self.stack[-2]  # type: ignore[attr-defined]  # the Python unpickler's stack
        if isinstance(inst, np.dtype):
            ok = isinstance(state, tuple) and len(state) == 8 and state[1] in "<>|=" and state[2:5] == (None,) * 3
        elif isinstance(inst, np.ndarray):
            ok = (isinstance(state, tuple) and len(state) == 5 and _simple(state[2])
                  and isinstance(state[4], (bytes, str)))
        else:
            ok = False
        if not ok:
            raise pickle.UnpicklingError(f"an unusual state for a {type(inst).__name__}")
        pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]  # not in the stubs

    dispatch[pickle.BUILD[0]] = _load_build  # type: ignore[assignment]  # a method of this subclass


def _unpickle_batch(name: str, path: Path, data: bytes) -> Any:
    try:
        return _BatchUnpickler(io.BytesIO(data), encoding="latin1").load()
    except _Refused as e:
        raise BackendError(f"data set {name!r}: {path}: refused: the pickle asks for {e}, which a CIFAR-10 batch "
                           "never does (ddlsim loads only dicts, lists, strings, numbers and numeric arrays)") from None
    except Exception as e:  # a truncated or garbled pickle: any of pickle's and numpy's errors
        raise BackendError(f"data set {name!r}: {path}: not a CIFAR-10 python batch ({_short(e)})") from None


def _short(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


def _cifar_batch(name: str, path: Path, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(pixels (N, 3, 32, 32) uint8, labels) of one python batch: a dict with 'data' and 'labels'."""
    obj = _unpickle_batch(name, path, data)
    if not isinstance(obj, dict):
        raise BackendError(f"data set {name!r}: {path}: holds a {type(obj).__name__}, not a CIFAR-10 batch (a dict "
                           "of 'data' and 'labels')")
    entries = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    get = entries.get
    x, y = get("data"), get("labels")
    if not isinstance(x, np.ndarray) or y is None:
        raise BackendError(f"data set {name!r}: {path}: no 'data' array and 'labels' list (keys: "
                           f"{', '.join(sorted(map(str, entries)))[:120]})")
    if x.dtype != np.uint8 or x.ndim not in (2, 4) or x.shape[1:] not in ((3072,), (3, 32, 32)):
        raise BackendError(f"data set {name!r}: {path}: 'data' is {x.dtype} of shape {x.shape}; CIFAR-10's is uint8 "
                           "(N, 3072): 3 × 32 × 32 pixels, channel first")
    if isinstance(y, np.ndarray):
        labels = y
    elif isinstance(y, list) and all(type(v) is int or isinstance(v, np.integer) for v in y):
        labels = np.array(y, dtype=np.int64)
    else:
        raise BackendError(f"data set {name!r}: {path}: 'labels' is not a list of integers")
    if labels.ndim != 1 or len(labels) != len(x) or labels.dtype.kind not in "iu":
        raise BackendError(f"data set {name!r}: {path}: {len(x):,} images but 'labels' of shape {labels.shape} "
                           f"({labels.dtype})")
    return x.reshape(-1, 3, 32, 32), _check_labels(name, path, labels)


def _cifar_bin(name: str, path: Path, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(pixels, labels) of one binary batch: records of 1 label byte + 3072 pixel bytes."""
    rec = 1 + 3072
    if not data or len(data) % rec:
        raise BackendError(f"data set {name!r}: {path}: {len(data):,} bytes is not a whole number of CIFAR-10 binary "
                           f"records ({rec:,} bytes each: a label byte and 3 × 32 × 32 pixels)")
    a = np.frombuffer(data, np.uint8).reshape(-1, rec)
    return a[:, 1:].reshape(-1, 3, 32, 32), _check_labels(name, path, a[:, 0])


def _read_cifar(name: str, folder: Path, files: list[tuple[str, Path]], verify: bool) -> DataFiles:
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {"train": [], "test": []}
    differ = []
    binary = files[0][1].suffix == ".bin"
    for role, path in files:
        _, data = _read(name, path)
        if verify and not binary and hashlib.md5(data).hexdigest() != CIFAR_MD5[path.name]:
            differ.append(path.name)
        parts[role].append((_cifar_bin if binary else _cifar_batch)(name, path, data))
    tx, ty = (np.concatenate(a) for a in zip(*parts["train"]))
    (ex, ey), = parts["test"]
    return DataFiles(name, str(folder), tx, ty, ex, ey, _md5_warning(name, folder, differ))


def _idx(name: str, path: Path, data: bytes, ndim: int, what: str) -> np.ndarray:
    """The array of an idx file: magic 00 00 08 ``ndim``, ``ndim`` big-endian uint32 sizes, bytes."""
    if not data:
        raise BackendError(f"data set {name!r}: {path}: is empty (expected an idx file of {what})")
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise BackendError(f"data set {name!r}: {path}: not an idx file of {what} (it starts with bytes "
                           f"{data[:4].hex(' ')}; an idx file starts 00 00 08 0{ndim})")
    if data[2] != 8:
        raise BackendError(f"data set {name!r}: {path}: idx values of type 0x{data[2]:02x}; {what} are unsigned "
                           "bytes (0x08)")
    if data[3] != ndim:
        raise BackendError(f"data set {name!r}: {path}: an idx file of {data[3]} dimensions; {what} have {ndim}")
    head = 4 + 4 * ndim
    if len(data) < head:
        raise BackendError(f"data set {name!r}: {path}: truncated in its header ({len(data)} bytes)")
    dims = struct.unpack(f">{ndim}I", data[4:head])
    need = int(np.prod(dims, dtype=object))
    if len(data) - head != need:
        raise BackendError(f"data set {name!r}: {path}: its header says {' × '.join(f'{d:,}' for d in dims)} = "
                           f"{need:,} bytes of values, the file holds {len(data) - head:,}")
    return np.frombuffer(data, np.uint8, offset=head).reshape(dims)


def _read_idx(name: str, folder: Path, files: list[tuple[str, Path]], verify: bool) -> DataFiles:
    out: dict[str, np.ndarray] = {}
    differ = []
    for role, path in files:
        raw, data = _read(name, path)
        if verify and path.suffix == ".gz" and hashlib.md5(raw).hexdigest() != GZ_MD5[name][role]:
            differ.append(path.name)
        images = role.endswith("_x")
        a = _idx(name, path, data, 3 if images else 1,
                 ("training" if role.startswith("train") else "test") + (" images" if images else " labels"))
        if images and a.shape[1:] != (28, 28):
            raise BackendError(f"data set {name!r}: {path}: images of {a.shape[1]} × {a.shape[2]} pixels; "
                               f"{_TITLE[name]}'s are 28 × 28")
        out[role] = a[:, None] if images else _check_labels(name, path, a)
    for part in ("train", "test"):
        if len(out[f"{part}_x"]) != len(out[f"{part}_y"]):
            x, y = dict(files)[f"{part}_x"], dict(files)[f"{part}_y"]
            raise BackendError(f"data set {name!r}: {x.name} holds {len(out[f'{part}_x']):,} images but {y.name} "
                               f"{len(out[f'{part}_y']):,} labels (in {folder})")
    return DataFiles(name, str(folder), out["train_x"], out["train_y"], out["test_x"], out["test_y"],
                     _md5_warning(name, folder, differ))


def _read_legacy(name: str, folder: Path, files: list[tuple[str, Path]], verify: bool) -> DataFiles:
    """torchvision's old ``processed/training.pt`` / ``test.pt``: a (uint8 images, labels)
    pair of tensors, loaded with ``torch.load(weights_only=True)`` (tensors, no code)."""
    import torch
    from torch import Tensor

    out = []
    for _, path in files:
        _, data = _read(name, path)
        try:
            obj = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        except Exception as e:  # torch's unpickler refuses anything but tensors and containers
            raise BackendError(f"data set {name!r}: {path}: not a torchvision tensor file ({_short(e)})") from None
        if not (isinstance(obj, (tuple, list)) and len(obj) == 2 and all(isinstance(t, Tensor) for t in obj)):
            raise BackendError(f"data set {name!r}: {path}: expected a pair (images, labels) of tensors")
        x, y = obj
        if x.dtype != torch.uint8 or tuple(x.shape[1:]) != (28, 28) or y.ndim != 1 or len(y) != len(x) \
                or y.dtype not in (torch.int64, torch.int32, torch.uint8):
            raise BackendError(f"data set {name!r}: {path}: images {x.dtype} {tuple(x.shape)} and labels {y.dtype} "
                               f"{tuple(y.shape)}; expected uint8 (N, 28, 28) and N integer labels")
        out.append((x.numpy()[:, None], _check_labels(name, path, y.numpy())))
    (tx, ty), (ex, ey) = out
    return DataFiles(name, str(folder), tx, ty, ex, ey)


_READERS = {"cifar_py": _read_cifar, "cifar_bin": _read_cifar, "idx": _read_idx, "legacy": _read_legacy}


def _check_counts(d: DataFiles) -> None:
    """Refuse an empty set; note sizes that are not the official set's."""
    if len(d.train_y) == 0 or len(d.test_y) == 0:
        raise BackendError(f"data set {d.name!r}: {d.where} holds {len(d.train_y):,} training and "
                           f"{len(d.test_y):,} test samples; both must be at least 1")
    info = dataset_info(d.name)
    if (len(d.train_y), len(d.test_y)) != (info.train_size, info.test_size):
        d.notes.append(f"data set {d.name!r}: {len(d.train_y):,} training and {len(d.test_y):,} test images in "
                       f"{d.where} (the official set has {info.train_size:,} and {info.test_size:,}); an epoch "
                       f"is the {len(d.train_y):,} found unless workload.samples_per_epoch is set")
