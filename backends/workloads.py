"""Data sets and models for the backends (docs/design.md, "Workloads").

Rules kept here:

* every data set is held whole as tensors (``Data``), so a minibatch is one gather;
* ``digits`` is scikit-learn's bundled set, pixels scaled to [0, 1], shape (1, 8, 8), with
  a FIXED split: the 360 test samples are drawn by ``DIGITS_SPLIT_SEED``, independent of
  the scenario seed;
* ``teacher`` is synthetic and fixed by its size keys alone: Gaussian inputs, labels the
  argmax of a random teacher MLP (seed ``TEACHER_SEED``); sizes equal
  :func:`ddlsim.simulator.catalog.dataset_info`;
* ``mnist1d`` is MNIST-1D (Greydanus 2020) as the ``mnist1d`` package generates it with its
  default arguments (its own seed, 42): 4,000 training and 1,000 test sequences of length 40,
  shape (40,), float32; generated once per process, and the global NumPy and ``random``
  states are the same after as before;
* ``cifar10``/``mnist``/``fashion_mnist`` are read from ``data_dir`` by ddlsim's own
  readers (:func:`.data_files.data_files`, torch-free: no pickle but a restricted one, shapes, types, counts and
  labels checked; files that are not the official ones are read, with a warning), and
  downloaded (torchvision) only when asked and there are none; anything unreadable is a
  one-line :class:`BackendError` naming the file; the sizes are the files', not the catalog's;
* :func:`build_model` gives the same initial weights for the same ``point["seed"]``, and
  its parameter count equals :func:`ddlsim.simulator.catalog.param_count`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..simulator.catalog import (IMAGE_MODELS, MLP_HIDDEN, MNIST1D_CNN_CHANNELS,
                                 MNIST1D_CNN_LAYERS, MNIST1D_MLP_HIDDEN, SEQUENCE_MODELS,
                                 SIMULATION_ONLY_MODELS, TRAINABLE_MODELS, DatasetInfo, conv1d_lengths,
                                 dataset_info)
from .base import BackendError
from .data_files import DataFiles, check_data, check_mnist1d_package, data_files

DIGITS_SPLIT_SEED = 1797
TEACHER_SEED = 0x7EAC
TEACHER_HIDDEN = 64
# per-channel mean and std used to standardise the torchvision image sets
_NORMALIZE = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "mnist": ((0.1307,), (0.3081,)),
    "fashion_mnist": ((0.2860,), (0.3530,)),
}


@dataclass
class Data:
    """A whole data set as tensors: inputs (N, *shape) float32, labels (N,) int64."""

    train_x: Tensor
    train_y: Tensor
    test_x: Tensor
    test_y: Tensor
    info: DatasetInfo

    def to(self, device: str | torch.device) -> Data:
        """The same data on ``device``."""
        return Data(self.train_x.to(device), self.train_y.to(device), self.test_x.to(device),
                    self.test_y.to(device), self.info)


def point_dataset_info(point: dict[str, Any]) -> DatasetInfo:
    """The catalog's facts for the point's data set."""
    wl = point["workload"]
    return dataset_info(wl["dataset"], wl["teacher_samples"], wl["teacher_features"])


def load_data(point: dict[str, Any], data_dir: str | None = None, download: bool = False,
              device: str | torch.device = "cpu") -> Data:
    """Load the point's data set whole onto ``device``."""
    wl = point["workload"]
    name = wl["dataset"]
    if name == "digits":
        data = _digits()
    elif name == "teacher":
        data = _teacher(wl["teacher_samples"], wl["teacher_features"])
    elif name == "mnist1d":
        data = _mnist1d()
    else:
        check_data(point, data_dir, download)
        data = _from_files(data_files(name, data_dir, download, verify=False))
    return data.to(device)


def digits_split() -> tuple[np.ndarray, np.ndarray]:
    """Sorted (train, test) row indices of scikit-learn's digits: the fixed 1437/360 split."""
    info = dataset_info("digits")
    perm = np.random.default_rng(DIGITS_SPLIT_SEED).permutation(info.train_size + info.test_size)
    return np.sort(perm[info.test_size:]), np.sort(perm[:info.test_size])


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = (d.data.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
    return x, d.target.astype(np.int64)


def _digits() -> Data:
    x, y = _digits_arrays()
    tr, te = digits_split()
    return Data(torch.from_numpy(x[tr]), torch.from_numpy(y[tr]), torch.from_numpy(x[te]),
                torch.from_numpy(y[te]), dataset_info("digits"))


def _teacher(samples: int, features: int) -> Data:
    """Gaussian inputs; label = argmax of a fixed random tanh MLP (logits centred per class)."""
    info = dataset_info("teacher", samples, features)
    rng = np.random.default_rng([TEACHER_SEED, samples, features])
    n = info.train_size + info.test_size
    x = rng.standard_normal((n, features)).astype(np.float32)
    w1 = rng.standard_normal((features, TEACHER_HIDDEN)) / np.sqrt(features)
    w2 = rng.standard_normal((TEACHER_HIDDEN, info.classes))
    logits = np.tanh(x.astype(np.float64) @ w1) @ w2
    y = np.argmax(logits - logits.mean(axis=0), axis=1).astype(np.int64)
    k = info.train_size
    return Data(torch.from_numpy(x[:k]), torch.from_numpy(y[:k]), torch.from_numpy(x[k:]),
                torch.from_numpy(y[k:]), info)


def _mnist1d_package() -> Any:
    """The ``mnist1d`` package's ``data`` module (a dependency of ddlsim); one line if absent."""
    check_mnist1d_package()
    import mnist1d.data

    return mnist1d.data


@functools.lru_cache(maxsize=1)
def mnist1d_arrays() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, x_test, y_test) of MNIST-1D: ``make_dataset`` with the package's default arguments
    (read-only arrays: x float32 (N, 40), y int64). The package seeds the global NumPy and
    ``random`` generators; both states are saved before and restored after, whatever happens."""
    import random

    pkg = _mnist1d_package()
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = pkg.make_dataset(pkg.get_dataset_args())
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    out = (np.ascontiguousarray(d["x"], dtype=np.float32), np.ascontiguousarray(d["y"], dtype=np.int64),
           np.ascontiguousarray(d["x_test"], dtype=np.float32), np.ascontiguousarray(d["y_test"], dtype=np.int64))
    info = dataset_info("mnist1d")
    want = ((info.train_size, *info.shape), (info.train_size,), (info.test_size, *info.shape), (info.test_size,))
    if tuple(a.shape for a in out) != want:
        raise BackendError(f"data set 'mnist1d': the mnist1d package made arrays of shapes "
                           f"{[a.shape for a in out]}, not {list(want)} (an incompatible mnist1d version?)")
    for a in out:
        a.flags.writeable = False
    return out


def _mnist1d() -> Data:
    x, y, xt, yt = mnist1d_arrays()
    return Data(torch.tensor(x), torch.tensor(y), torch.tensor(xt), torch.tensor(yt), dataset_info("mnist1d"))


def _from_files(d: DataFiles) -> Data:
    mean, std = _NORMALIZE[d.name]
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)

    def pixels(x: np.ndarray) -> Tensor:
        t = torch.from_numpy(x.astype(np.float32))  # a copy: the file's bytes stay read-only
        return t.div_(255.0).sub_(m).div_(s).contiguous()

    info = replace(dataset_info(d.name), train_size=len(d.train_y), test_size=len(d.test_y))
    return Data(pixels(d.train_x), torch.from_numpy(d.train_y.copy()), pixels(d.test_x),
                torch.from_numpy(d.test_y.copy()), info)


class Mnist1dMLP(nn.Module):
    """The MNIST-1D paper's MLP (MLPBase): ``h = ReLU(W1 x)``, ``h ← h + ReLU(W2 h)``,
    logits ``W3 h``, hidden width ``MNIST1D_MLP_HIDDEN``; weights drawn in that layer order."""

    def __init__(self, n_in: int, classes: int, hidden: int = MNIST1D_MLP_HIDDEN) -> None:
        super().__init__()
        self.linear1 = nn.Linear(n_in, hidden)
        self.linear2 = nn.Linear(hidden, hidden)
        self.linear3 = nn.Linear(hidden, classes)

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear1(x.flatten(1)).relu()
        h = h + self.linear2(h).relu()
        return self.linear3(h)


class _GreyToRGB(nn.Module):
    """Repeat a single grey channel to three (for torchvision's RGB models)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.expand(-1, 3, -1, -1) if x.shape[1] == 1 else x


def make_model(name: str, info: DatasetInfo) -> nn.Module:
    """Build model ``name`` for data set ``info`` (current torch RNG draws the weights)."""
    if name in SIMULATION_ONLY_MODELS:
        raise BackendError(f"model {name!r} is simulation-only: it cannot be replayed "
                           f"(use {', '.join(TRAINABLE_MODELS)})")
    c = info.classes
    n_in = int(np.prod(info.shape))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(n_in, MLP_HIDDEN), nn.ReLU(), nn.Linear(MLP_HIDDEN, c))
    if name == "logistic":
        return nn.Sequential(nn.Flatten(), nn.Linear(n_in, c))
    if name == "mnist1d_mlp":
        return Mnist1dMLP(n_in, c)
    if name in SEQUENCE_MODELS:
        if len(info.shape) != 1:
            raise BackendError(f"model {name!r} needs sequence data (one sample of shape (L,)); data set "
                               f"{info.name!r} is not")
        try:
            lengths = conv1d_lengths(info.shape[0])
        except ValueError as e:
            raise BackendError(str(e)) from None
        ch, layers = MNIST1D_CNN_CHANNELS, []
        for i, (k, s, p) in enumerate(MNIST1D_CNN_LAYERS):
            layers += [nn.Conv1d(1 if i == 0 else ch, ch, k, stride=s, padding=p), nn.ReLU()]
        return nn.Sequential(nn.Unflatten(1, (1, info.shape[0])), *layers, nn.Flatten(),
                             nn.Linear(ch * lengths[-1], c))
    if name not in IMAGE_MODELS:
        raise BackendError(f"unknown model {name!r}")
    if len(info.shape) != 3:
        raise BackendError(f"model {name!r} needs image data; data set {info.name!r} is not")
    ch, h, w = info.shape
    if name == "lenet":
        return nn.Sequential(
            nn.Conv2d(ch, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(16 * (h // 4) * (w // 4), 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, c))
    if name == "rudra_cifar":
        layers = []
        for cin, cout in ((ch, 32), (32, 32), (32, 64)):
            layers += [nn.Conv2d(cin, cout, 5, padding=2), nn.ReLU(), nn.MaxPool2d(3, 2, padding=1)]
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(64 * h * w, c))
    from torchvision.models import resnet18

    return nn.Sequential(_GreyToRGB(), resnet18(num_classes=c))


def build_model(point: dict[str, Any]) -> nn.Module:
    """The point's model, with initial weights drawn from ``point["seed"]`` only."""
    info = point_dataset_info(point)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(point["seed"]))
        return make_model(point["workload"]["model"], info)
