"""The simulation-only image models' layers in the catalogue: tensor shapes in torchvision's
``parameters()`` order, totals against the published parameter counts, and each layer's forward
multiply-adds against the architecture papers' totals and a count by torch forward hooks."""

from __future__ import annotations

import math

import pytest

from ddlsim.simulator.catalog import (LAYERED_MODELS, SHAPED_MODELS, dataset_info, forward_macs, model_layers,
                                      param_count, param_shapes)

IMAGENET = dataset_info("imagenet")


def _torchvision(model: str, v1_strides: bool = False):  # type: ignore[no-untyped-def]
    tv = pytest.importorskip("torchvision")
    extra = {"aux_logits": False, "init_weights": False} if model == "inception_v3" else {}
    net = getattr(tv.models, model)(weights=None, **extra).eval()
    if v1_strides and model.startswith("resnet"):  # He et al.'s stride on a stage's first 1×1
        for stage in (net.layer2, net.layer3, net.layer4):
            stage[0].conv1.stride, stage[0].conv2.stride = (2, 2), (1, 1)
    return net


@pytest.mark.parametrize("model", LAYERED_MODELS)
def test_shapes_are_torchvision_s_in_order(model: str) -> None:
    torch_shapes = [tuple(p.shape) for p in _torchvision(model).parameters()]
    assert param_shapes(model, IMAGENET) == torch_shapes
    assert model in SHAPED_MODELS


@pytest.mark.parametrize("model,extra_per_channel", [("resnet50", 0), ("vgg16", 0), ("alexnet", 0),
                                                     ("resnet101", 3), ("resnet152", 3), ("inception_v3", 1)])
def test_totals_are_the_published_counts(model: str, extra_per_channel: int) -> None:
    """resnet50, vgg16 and alexnet: torchvision's counts, exactly. resnet101/152 and inception_v3 carry
    the Keras table's counts: Keras' ResNet convolutions have a bias and its batch norms four vectors
    (3 more per normalised channel than torchvision's two and no bias); its Inception v3 batch norms
    have no scale, so three vectors (1 more per channel)."""
    layers = model_layers(model, IMAGENET)
    assert layers is not None
    channels = sum(layer.weight[0] for layer in layers if layer.norm)
    shapes = param_shapes(model, IMAGENET)
    assert shapes is not None
    total = sum(layer.params for layer in layers)
    assert total == sum(math.prod(s) for s in shapes)
    assert total + extra_per_channel * channels == param_count(model, IMAGENET)


@pytest.mark.parametrize("model,published,rel", [
    ("resnet50", 3.8e9, 0.02), ("resnet101", 7.6e9, 0.01), ("resnet152", 11.3e9, 0.01),  # He et al. 2016, Table 1
    ("inception_v3", 5e9, 0.15),  # Szegedy et al. 2016, abstract: "5 billion multiply-adds"
])
def test_forward_multiply_adds_are_the_papers(model: str, published: float, rel: float) -> None:
    macs = forward_macs(model, IMAGENET)
    assert macs is not None
    assert sum(macs) == pytest.approx(published, rel=rel)


def test_vgg16_convolutions_are_he_et_al_s_figure() -> None:
    # He et al. 2016, §4.1: VGG-16 "15.3 billion FLOPs" (multiply-adds of its convolutions)
    layers = model_layers("vgg16", IMAGENET)
    assert layers is not None
    assert sum(layer.macs for layer in layers if len(layer.weight) == 4) == pytest.approx(15.3e9, rel=0.01)


@pytest.mark.parametrize("model", LAYERED_MODELS)
def test_forward_multiply_adds_are_torch_s_count(model: str) -> None:
    """Truth: forward hooks on torchvision's model (ResNets with He et al.'s stride placement) count
    each convolution's output elements × (in channels / groups × kernel area) and each linear
    layer's in × out features, for one sample at the architecture's input size."""
    torch = pytest.importorskip("torch")
    net = _torchvision(model, v1_strides=True)
    counted: dict[int, int] = {}

    def hook(module, _inputs, output) -> None:  # type: ignore[no-untyped-def]
        if isinstance(module, torch.nn.Conv2d):
            kh, kw = module.kernel_size
            counted[id(module)] = output.numel() * module.in_channels // module.groups * kh * kw
        else:
            counted[id(module)] = module.in_features * module.out_features

    layers = [m for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    for m in layers:
        m.register_forward_hook(hook)
    size = 299 if model == "inception_v3" else 224
    with torch.no_grad():
        net(torch.zeros(1, 3, size, size))
    assert forward_macs(model, IMAGENET) == [counted[id(m)] for m in layers]


def test_other_models_have_no_layers() -> None:
    assert model_layers("resnet18", IMAGENET) is None and forward_macs("bert_base", IMAGENET) is None
