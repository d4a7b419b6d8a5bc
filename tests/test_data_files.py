"""Data sets the user brings (CIFAR-10, MNIST, Fashion-MNIST in --data-dir): ddlsim's own
readers, their refusals, and an epoch that follows the files found.

Every folder here is built in tmp_path in the real file formats (CIFAR-10's pickled and
binary batches, idx files, torchvision's legacy .pt), a few hundred samples each."""

from __future__ import annotations

import csv
import gzip
import math
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from ddlsim.backends import data_files as data_files_module
from ddlsim.backends.base import BackendError
from ddlsim.backends.data_files import data_files
from ddlsim.backends.workloads import load_data
from ddlsim.scenarios.cli import main
from tests.conftest import make_point

TINY = """
name = "tiny-files"
[workload]
dataset = "{dataset}"
model = "mlp"
epochs = 1
[cluster]
learners = 2
minibatch = 16
[protocol]
name = "async"
"""


def py2_batch(data: np.ndarray, labels: list[int]) -> bytes:
    """A CIFAR-10 python batch as the official files are: a Python 2 cPickle (protocol 2) of
    {'data': uint8 array (N, 3072), 'labels': [...]}, written opcode by opcode."""
    raw = data.tobytes()
    out = b"\x80\x02}(U\x04data"
    out += b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85U\x01b\x87R"
    out += b"(K\x01J" + struct.pack("<i", data.shape[0]) + b"J" + struct.pack("<i", data.shape[1]) + b"\x86"
    out += b"cnumpy\ndtype\nU\x02u1K\x00K\x01\x87R(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
    out += b"\x89T" + struct.pack("<I", len(raw)) + raw + b"tb"
    out += b"U\x06labels](" + b"".join(b"K" + bytes([v]) for v in labels) + b"eu."
    return out


def cifar_folder(root: Path, sizes: dict[str, int], seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """cifar-10-batches-py/ with the given batches: the first in the official (Python 2)
    format, the others re-exported by Python 3 (bytes keys, protocols 4 and 5)."""
    rng = np.random.default_rng(seed)
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    written = {}
    for k, (name, n) in enumerate(sizes.items()):
        x = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, n)
        if k == 0:
            blob = py2_batch(x, y.tolist())
        else:
            blob = pickle.dumps({b"batch_label": b"re-exported", b"labels": y.tolist(), b"data": x,
                                 b"filenames": [f"{i}.png".encode() for i in range(n)]}, protocol=3 + k)
        (folder / name).write_bytes(blob)
        written[name] = (x, y)
    return written


def write_idx(path: Path, a: np.ndarray) -> None:
    blob = bytes([0, 0, 8, a.ndim]) + struct.pack(f">{a.ndim}I", *a.shape) + a.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(blob) if path.suffix == ".gz" else blob)


def mnist_folder(root: Path, sub: str = "MNIST", n_train: int = 240, n_test: int = 40) -> dict[str, np.ndarray]:
    """SUB/raw/ with the four idx files (the test labels gzipped, as torchvision downloads them)."""
    rng = np.random.default_rng(1)
    raw = root / sub / "raw"
    raw.mkdir(parents=True)
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, 28, 28)),
              "train-labels-idx1-ubyte": rng.integers(0, 10, n_train),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 28, 28)),
              "t10k-labels-idx1-ubyte.gz": rng.integers(0, 10, n_test)}
    for name, a in arrays.items():
        write_idx(raw / name, a)
    return arrays


def run(tmp_path: Path, capsys: pytest.CaptureFixture, dataset: str, data: Path, *extra: str) -> tuple[int, str, Path]:
    (tmp_path / "s.toml").write_text(TINY.format(dataset=dataset))
    out = tmp_path / "out"
    rc = main(["run", str(tmp_path / "s.toml"), "--out", str(out), "--data-dir", str(data), "--quiet",
               "--no-report", "--device", "cpu", *extra])
    return rc, capsys.readouterr().err, out


def summary_row(out: Path) -> dict[str, str]:
    with open(out / "summary.csv", newline="") as f:
        (row,) = csv.DictReader(f)
    return row


def one_line(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ddlsim: error: "), err
    assert "Traceback" not in err and "download=True" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_a_cifar10_subset_is_read_with_a_warning_and_its_epoch_is_the_files(tmp_path, capsys):
    # truth: the arrays written; async gradients = ⌈epochs · 300 / μ⌉ = ⌈300 / 16⌉ = 19 (not 50,000 / 16)
    written = cifar_folder(tmp_path / "data", {"data_batch_1": 200, "data_batch_2": 100, "test_batch": 60})
    rc, err, out = run(tmp_path, capsys, "cifar10", tmp_path / "data")
    assert rc == 0, err
    warning = [ln for ln in err.splitlines() if ln.startswith("ddlsim: warning:")]
    assert len(warning) == 1 and all(n in warning[0] for n in ("data_batch_1", "data_batch_2", "test_batch", "MD5"))
    assert any("300 training and 60 test images" in ln and "50,000" in ln for ln in err.splitlines())
    assert "Traceback" not in err and "download=True" not in err
    row = summary_row(out)
    assert int(row["gradients"]) == math.ceil(300 / 16) and row["error"] == ""

    d = data_files("cifar10", str(tmp_path / "data"))
    x = np.concatenate([written["data_batch_1"][0], written["data_batch_2"][0]]).reshape(-1, 3, 32, 32)
    assert np.array_equal(d.train_x, x) and np.array_equal(d.test_x, written["test_batch"][0].reshape(-1, 3, 32, 32))
    assert d.train_y.tolist() == written["data_batch_1"][1].tolist() + written["data_batch_2"][1].tolist()
    data = load_data(make_point(workload__dataset="cifar10"), str(tmp_path / "data"))
    assert data.train_x.shape == (300, 3, 32, 32) and data.info.train_size == 300 and data.info.test_size == 60
    # channel 0 of pixel 0 standardised with CIFAR-10's mean and std
    assert data.train_x[0, 0, 0, 0].item() == pytest.approx((x[0, 0, 0, 0] / 255 - 0.4914) / 0.2470, abs=1e-5)


def test_cifar10_binary_batches_are_read(tmp_path):
    # truth: the records written (label byte, then 3072 pixel bytes)
    rng = np.random.default_rng(3)
    folder = tmp_path / "cifar-10-batches-bin"
    folder.mkdir()
    recs = {}
    for name, n in (("data_batch_1.bin", 50), ("test_batch.bin", 20)):
        r = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        r[:, 0] %= 10
        (folder / name).write_bytes(r.tobytes())
        recs[name] = r
    d = data_files("cifar10", str(tmp_path))
    assert np.array_equal(d.train_x.reshape(50, -1), recs["data_batch_1.bin"][:, 1:])
    assert d.train_y.tolist() == recs["data_batch_1.bin"][:, 0].tolist() and len(d.test_y) == 20
    assert d.warnings == []  # no official checksum is known per binary file


def test_a_pickle_that_calls_code_is_refused_and_never_run(tmp_path, capsys):
    # rule: a CIFAR-10 batch is never unpickled unsafely: the payload would create `marker`
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    cifar_folder(tmp_path / "data", {"data_batch_1": 20, "test_batch": 10})
    bad = tmp_path / "data" / "cifar-10-batches-py" / "data_batch_1"
    bad.write_bytes(pickle.dumps({"data": Payload(), "labels": [0]}))
    rc, err, out = run(tmp_path, capsys, "cifar10", tmp_path / "data")
    assert rc == 2
    one_line(err, str(bad), "refused", "system")
    assert not marker.exists() and not out.exists()


ARRAY = np.zeros((4, 3072), np.uint8)


@pytest.mark.parametrize("blob, what", [
    (b"", "not a CIFAR-10 python batch"),
    (os.urandom(3000), "not a CIFAR-10 python batch"),
    (pickle.dumps({b"data": ARRAY, b"labels": [0, 1, 2, 3]})[:-200], "not a CIFAR-10 python batch"),
    (pickle.dumps([1, 2, 3]), "holds a list"),
    (pickle.dumps({b"data": ARRAY}), "no 'data' array and 'labels'"),
    (pickle.dumps({b"data": ARRAY, b"labels": [0, 1, 2, 10]}), "label 10 of sample 3 is outside 0–9"),
    (pickle.dumps({b"data": ARRAY.astype(np.float32), b"labels": [0] * 4}), "float32"),
    (pickle.dumps({b"data": ARRAY, b"labels": [0, 1]}), "4 images but 'labels' of shape (2,)"),
    (pickle.dumps({b"data": np.zeros(3, object), b"labels": []}), "refused: the pickle asks for an array of type"),
], ids=["empty", "random", "truncated", "a list", "no labels", "label 10", "float pixels", "short labels",
        "object array"])
def test_a_broken_cifar10_batch_is_one_line_naming_it(tmp_path, blob, what):
    # rule: anything but a CIFAR-10 batch is one BackendError line naming the file and what is wrong
    cifar_folder(tmp_path, {"data_batch_1": 20, "test_batch": 10})
    bad = tmp_path / "cifar-10-batches-py" / "test_batch"
    bad.write_bytes(blob)
    with pytest.raises(BackendError) as e:
        data_files("cifar10", str(tmp_path))
    assert str(bad) in str(e.value) and what in str(e.value) and "\n" not in str(e.value)


def test_a_cifar10_folder_without_its_test_batch_says_so(tmp_path):
    cifar_folder(tmp_path, {"data_batch_1": 20})
    with pytest.raises(BackendError, match="no test_batch"):
        data_files("cifar10", str(tmp_path))


def test_mnist_idx_files_run_end_to_end(tmp_path, capsys):
    # truth: the arrays written; async gradients = ⌈240 / 16⌉ = 15
    arrays = mnist_folder(tmp_path / "data")
    rc, err, out = run(tmp_path, capsys, "mnist", tmp_path / "data")
    assert rc == 0, err
    assert int(summary_row(out)["gradients"]) == math.ceil(240 / 16)
    assert "t10k-labels-idx1-ubyte.gz" in err and "MD5" in err  # a .gz's official checksum is known
    d = data_files("mnist", str(tmp_path / "data"))
    assert np.array_equal(d.train_x[:, 0], arrays["train-images-idx3-ubyte"])
    assert d.test_y.tolist() == arrays["t10k-labels-idx1-ubyte.gz"].tolist()


@pytest.mark.parametrize("blob, what", [
    (b"", "is empty"),
    (bytes([0x5e, 0x11, 0xa0, 0x3c]) + bytes(500),
     "not an idx file of training images (it starts with bytes 5e 11 a0 3c"),
    (bytes([0, 0, 8, 1]) + struct.pack(">I", 240) + bytes(240), "an idx file of 1 dimensions; training images have 3"),
    (bytes([0, 0, 0x0d, 3]) + struct.pack(">3I", 240, 28, 28), "type 0x0d"),
    (bytes([0, 0, 8, 3]) + struct.pack(">3I", 240, 28, 28) + bytes(1000), "the file holds 1,000"),
    (bytes([0, 0, 8, 3]) + struct.pack(">3I", 2, 32, 32) + bytes(2048), "32 × 32 pixels"),
    (bytes([0, 0, 8, 3]) + struct.pack(">3I", 200, 28, 28) + bytes(200 * 784), "holds 200 images but"),
], ids=["empty", "random", "labels as images", "int32 values", "truncated", "32 x 32", "200 of 240"])
def test_a_broken_mnist_file_is_one_line_naming_it(tmp_path, capsys, blob, what):
    # rule: random bytes or an empty file as MNIST's raw files: one line naming the file and the fault
    mnist_folder(tmp_path / "data")
    bad = tmp_path / "data" / "MNIST" / "raw" / "train-images-idx3-ubyte"
    bad.write_bytes(blob)
    rc, err, out = run(tmp_path, capsys, "mnist", tmp_path / "data")
    assert rc == 2 and not out.exists()
    one_line(err, "train-images-idx3-ubyte", what)


def test_fashion_mnist_legacy_pt_is_read_with_weights_only(tmp_path):
    # truth: the tensors saved; a .pt that pickles anything but tensors is refused, unrun
    proc = tmp_path / "FashionMNIST" / "processed"
    proc.mkdir(parents=True)
    x = torch.randint(0, 256, (30, 28, 28), dtype=torch.uint8)
    y = torch.randint(0, 10, (30,))
    torch.save((x, y), proc / "training.pt")
    torch.save((x[:10], y[:10]), proc / "test.pt")
    d = data_files("fashion_mnist", str(tmp_path))
    assert np.array_equal(d.train_x[:, 0], x.numpy()) and d.test_y.tolist() == y[:10].tolist()

    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save((Payload(), y), proc / "test.pt")
    with pytest.raises(BackendError) as e:
        data_files("fashion_mnist", str(tmp_path))
    assert str(proc / "test.pt") in str(e.value) and "\n" not in str(e.value) and not marker.exists()


def test_samples_per_epoch_above_the_files_is_refused_below_is_kept(tmp_path, capsys):
    # rule: the scenario may not ask for more samples per epoch than the files hold (both numbers
    # named, nothing written); fewer is the user's choice: gradients = ⌈200 / 16⌉ = 13
    cifar_folder(tmp_path / "data", {"data_batch_1": 250, "test_batch": 30})
    rc, err, out = run(tmp_path, capsys, "cifar10", tmp_path / "data", "--set", "workload.samples_per_epoch=1000")
    assert rc == 2 and not out.exists()
    one_line(err, "workload.samples_per_epoch", "1000", "250")
    rc, err, out = run(tmp_path, capsys, "cifar10", tmp_path / "data", "--set", "workload.samples_per_epoch=200")
    assert rc == 0, err
    assert int(summary_row(out)["gradients"]) == math.ceil(200 / 16)


def test_download_is_not_attempted_when_files_are_there(tmp_path, monkeypatch):
    # rule: --download fetches only when there are no files; the user's are read, not replaced
    cifar_folder(tmp_path, {"data_batch_1": 20, "test_batch": 10})

    def no_network(name, root):
        raise AssertionError("downloaded although files were there")

    monkeypatch.setattr(data_files_module, "_download", no_network)
    assert len(data_files("cifar10", str(tmp_path), download=True).train_y) == 20


def test_data_files_are_read_only_if_regular_and_bounded(tmp_path, monkeypatch):
    # rule: read_bounded's bound and file kind hold for data files too
    cifar_folder(tmp_path, {"data_batch_1": 20, "test_batch": 10})
    monkeypatch.setattr(data_files_module, "DATA_FILE_MAX_BYTES", 1000)
    with pytest.raises(BackendError, match="data_batch_1: .* bytes is more than the 1,000"):
        data_files("cifar10", str(tmp_path))
    monkeypatch.undo()
    fifo = tmp_path / "cifar-10-batches-py" / "test_batch"
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(BackendError, match="test_batch: not a regular file"):
        data_files("cifar10", str(tmp_path))


def test_replaying_a_trace_against_fewer_files_than_its_epoch_is_refused(tmp_path, capsys):
    # rule: `ddlsim replay TRACE --data-dir` with fewer training samples than the trace's epoch
    # would wrap around them silently: refused, both numbers named, nothing written
    cifar_folder(tmp_path / "data", {"data_batch_1": 250, "test_batch": 30})
    rc, err, out = run(tmp_path, capsys, "cifar10", tmp_path / "data", "--traces")
    assert rc == 0, err
    (trace,) = (out / "runs").glob("*/trace.ddlt")
    cifar_folder(tmp_path / "few", {"data_batch_1": 100, "test_batch": 30})
    rc = main(["replay", str(trace), "--scenario", str(tmp_path / "s.toml"), "--data-dir", str(tmp_path / "few"),
               "--out", str(tmp_path / "r"), "--device", "cpu", "--no-report"])
    one_line(capsys.readouterr().err, "samples_per_epoch = 250", "100")
    assert rc == 2 and not (tmp_path / "r" / "summary.csv").exists()


def test_an_empty_data_dir_is_refused_without_importing_torch(tmp_path):
    # rule: argument and data checks come before heavy imports (a refusal is quick)
    import subprocess
    import sys

    code = ("import sys; from ddlsim.scenarios.cli import main; "
            f"rc = main(['run', 'rudra-cifar10', '--data-dir', {str(tmp_path)!r}, '--out', {str(tmp_path / 'o')!r}]); "
            "print(rc, 'torch' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["2", "False"], (proc.stdout, proc.stderr)
    assert "no CIFAR-10 files" in proc.stderr and not (tmp_path / "o").exists()
