"""Tests for backends/workloads.py: data sets and models."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ddlsim.backends.base import BackendError
from ddlsim.backends.workloads import build_model, digits_split, load_data, make_model
from ddlsim.simulator.catalog import SIMULATION_ONLY_MODELS, dataset_info, param_count
from tests.conftest import make_point

torch.set_num_threads(1)

DATASETS = ("digits", "teacher", "cifar10", "mnist", "fashion_mnist")
BUILDABLE = ("mlp", "lenet", "rudra_cifar", "resnet18")


def _count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("dataset", DATASETS)
@pytest.mark.parametrize("model", BUILDABLE)
def test_param_counts_equal_catalog(dataset, model):
    # truth: simulator/catalog.py, the counts the simulator sizes its messages with
    info = dataset_info(dataset)
    try:
        expected = param_count(model, info)
    except ValueError:  # the catalog refuses the pair: so must the builder
        with pytest.raises(BackendError):
            make_model(model, info)
        return
    assert _count(make_model(model, info)) == expected


def test_rudra_cifar_is_about_90k():
    # truth: docs/design.md, Rudra's CIFAR10 network has about 90k parameters
    assert 85_000 < _count(make_model("rudra_cifar", dataset_info("cifar10"))) < 95_000


def test_models_run_forward():
    # truth: catalog shapes; every model maps a batch to (batch, classes)
    for dataset, model in (("digits", "lenet"), ("cifar10", "rudra_cifar"), ("mnist", "resnet18"),
                           ("teacher", "mlp")):
        info = dataset_info(dataset)
        out = make_model(model, info).eval()(torch.zeros(2, *info.shape))
        assert out.shape == (2, info.classes)


@pytest.mark.parametrize("model", SIMULATION_ONLY_MODELS)
def test_simulation_only_models_refused(model):
    # truth: the brief — simulation-only models are refused with one clear line
    with pytest.raises(BackendError, match="simulation-only") as e:
        make_model(model, dataset_info("imagenet"))
    assert "\n" not in str(e.value)


def test_digits_split_fixed_and_disjoint():
    # truth: catalog.dataset_info("digits"): 1437 train / 360 test of sklearn's 1797
    tr, te = digits_split()
    assert len(tr) == 1437 and len(te) == 360
    assert len(np.intersect1d(tr, te)) == 0
    assert np.array_equal(np.union1d(tr, te), np.arange(1797))
    tr2, te2 = digits_split()
    assert np.array_equal(te, te2) and np.array_equal(tr, tr2)


def test_digits_independent_of_scenario_seed():
    # rule: the split is fixed by its own seed, not the scenario's
    a = load_data(make_point(seed=0))
    b = load_data(make_point(seed=7))
    assert torch.equal(a.test_x, b.test_x) and torch.equal(a.train_y, b.train_y)
    assert a.train_x.shape == (1437, 1, 8, 8) and a.test_x.shape == (360, 1, 8, 8)
    assert float(a.train_x.min()) >= 0.0 and float(a.train_x.max()) <= 1.0
    assert a.train_x.dtype == torch.float32 and a.train_y.dtype == torch.int64


def test_teacher_sizes_and_determinism():
    # truth: catalog.dataset_info("teacher", samples, features)
    p = make_point(workload__dataset="teacher", workload__teacher_samples=300, workload__teacher_features=5)
    d = load_data(p)
    info = dataset_info("teacher", 300, 5)
    assert d.train_x.shape == (info.train_size, 5) and d.test_x.shape == (info.test_size, 5)
    assert len(torch.unique(d.train_y)) >= 5  # labels spread over the classes
    assert torch.equal(load_data(make_point(workload__dataset="teacher", workload__teacher_samples=300,
                                            workload__teacher_features=5, seed=9)).train_y, d.train_y)


@pytest.mark.parametrize("dataset", ["cifar10", "mnist", "fashion_mnist"])
def test_torchvision_missing_files_is_one_line(tmp_path, dataset):
    # truth: the brief — a missing directory or missing files name --data-dir / --download
    p = make_point(workload__dataset=dataset)
    for data_dir in (None, str(tmp_path / "absent"), str(tmp_path)):
        with pytest.raises(BackendError, match="--data-dir DIR") as e:
            load_data(p, data_dir=data_dir)
        assert "\n" not in str(e.value) and "--download" in str(e.value)


def test_imagenet_refused():
    p = make_point(workload__dataset="imagenet", workload__model="resnet50")
    with pytest.raises(BackendError, match="simulation-only"):
        load_data(p)


def test_build_model_seeded_by_point():
    # rule: the same point seed gives the same initial weights; another seed differs
    def vec(seed: int) -> torch.Tensor:
        return torch.nn.utils.parameters_to_vector(build_model(make_point(seed=seed)).parameters())

    assert torch.equal(vec(3), vec(3))
    assert not torch.equal(vec(3), vec(4))
