"""Data sets and models for the backends (DESIGN.md, "Workloads").

Rules kept here:

* every data set is held whole as tensors (``Data``), so a minibatch is one gather;
* ``digits`` is scikit-learn's bundled set, pixels scaled to [0, 1], shape (1, 8, 8), with
  a FIXED split: the 360 test samples are drawn by ``DIGITS_SPLIT_SEED``, independent of
  the scenario seed;
* ``teacher`` is synthetic and fixed by its size keys alone: Gaussian inputs, labels the
  argmax of a random teacher MLP (seed ``TEACHER_SEED``); sizes equal
  :func:`ddlsim.simulator.catalog.dataset_info`;
* torchvision's ``cifar10``/``mnist``/``fashion_mnist`` are read from ``data_dir`` and
  downloaded only when asked; missing files are a one-line :class:`BackendError`;
* :func:`build_model` gives the same initial weights for the same ``point["seed"]``, and
  its parameter count equals :func:`ddlsim.simulator.catalog.param_count`.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..simulator.catalog import (IMAGE_MODELS, MLP_HIDDEN, SIMULATION_ONLY_MODELS,
                                 TRAINABLE_MODELS, DatasetInfo, dataset_info)
from .base import BackendError

DIGITS_SPLIT_SEED = 1797
TEACHER_SEED = 0x7EAC
TEACHER_HIDDEN = 64
DEFAULT_DOWNLOAD_DIR = os.path.join("~", ".cache", "ddlsim", "data")
_HINT = "pass --data-dir DIR with the files or --download"
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


def check_data(point: dict[str, Any], data_dir: str | None = None, download: bool = False) -> None:
    """Raise the :class:`BackendError` that :func:`load_data` would raise for a data set that
    cannot be replayed or whose directory is missing (cheap: reads no files), so that a sweep
    can refuse before any work."""
    name = point["workload"]["dataset"]
    if name in ("digits", "teacher"):
        return
    if name not in _NORMALIZE:
        raise BackendError(f"data set {name!r} is simulation-only: it cannot be replayed "
                           f"(use digits, teacher, cifar10, mnist or fashion_mnist)")
    if data_dir is None and not download:
        raise BackendError(f"data set {name!r} needs its files: {_HINT}")
    root = os.path.expanduser(data_dir or DEFAULT_DOWNLOAD_DIR)
    if not download and not os.path.isdir(root):
        raise BackendError(f"data set {name!r}: no directory {root!r}: {_HINT}")


def load_data(point: dict[str, Any], data_dir: str | None = None, download: bool = False,
              device: str | torch.device = "cpu") -> Data:
    """Load the point's data set whole onto ``device``."""
    wl = point["workload"]
    name = wl["dataset"]
    if name == "digits":
        data = _digits()
    elif name == "teacher":
        data = _teacher(wl["teacher_samples"], wl["teacher_features"])
    else:
        check_data(point, data_dir, download)
        data = _torchvision(name, data_dir, download)
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


def _torchvision(name: str, data_dir: str | None, download: bool) -> Data:
    from torchvision import datasets

    root = os.path.expanduser(data_dir or DEFAULT_DOWNLOAD_DIR)
    cls = {"cifar10": datasets.CIFAR10, "mnist": datasets.MNIST,
           "fashion_mnist": datasets.FashionMNIST}[name]
    try:
        train, test = (cls(root, train=t, download=download) for t in (True, False))
    except (RuntimeError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BackendError(f"data set {name!r} not readable in {root!r} ({msg}): {_HINT}") from None
    mean, std = _NORMALIZE[name]
    info = dataset_info(name)

    def tensors(ds: Any) -> tuple[Tensor, Tensor]:
        x = torch.as_tensor(np.asarray(ds.data))
        x = x.permute(0, 3, 1, 2) if x.ndim == 4 else x.unsqueeze(1)  # (N,H,W,C) or (N,H,W)
        x = x.float().div_(255.0)
        x = (x - torch.tensor(mean).view(1, -1, 1, 1)) / torch.tensor(std).view(1, -1, 1, 1)
        return x.contiguous(), torch.as_tensor(np.asarray(ds.targets), dtype=torch.int64)

    (trx, try_), (tex, tey) = tensors(train), tensors(test)
    return Data(trx, try_, tex, tey, info)


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
    if name == "mlp":
        n_in = int(np.prod(info.shape))
        return nn.Sequential(nn.Flatten(), nn.Linear(n_in, MLP_HIDDEN), nn.ReLU(), nn.Linear(MLP_HIDDEN, c))
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
        layers: list[nn.Module] = []
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
