"""Known data sets and models: sizes and parameter counts, without importing torch.

The simulator needs only the gradient size (``param_count``) and the epoch size
(``samples_per_epoch``); the backends build the same models and a test checks that
their parameter counts equal :func:`param_count`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DatasetInfo:
    """Shape and size of a data set: ``shape`` is one sample's (C, H, W) or (F,)."""

    name: str
    train_size: int
    test_size: int
    shape: tuple[int, ...]
    classes: int


DATASETS = ("digits", "teacher", "mnist1d", "cifar10", "mnist", "fashion_mnist", "imagenet")
EMBEDDED_DATASETS = ("digits", "teacher", "mnist1d")   # built in-process: no files, no download
FILE_DATASETS = ("cifar10", "mnist", "fashion_mnist")   # torchvision's, read from a data directory
SIMULATION_ONLY_DATASETS = ("imagenet",)
MODELS = ("mlp", "logistic", "mnist1d_mlp", "mnist1d_cnn", "lenet", "rudra_cifar", "resnet18", "resnet50",
          "resnet101", "resnet152", "vgg16", "inception_v3", "alexnet", "transformer", "bert_base", "bert_large")
IMAGE_MODELS = ("lenet", "rudra_cifar", "resnet18")     # need (C, H, W) inputs
SEQUENCE_MODELS = ("mnist1d_cnn",)                      # need (L,) inputs: one channel of length L
SIMULATION_ONLY_MODELS = ("resnet50", "resnet101", "resnet152", "vgg16", "inception_v3", "alexnet", "transformer",
                          "bert_base", "bert_large")
TRAINABLE_MODELS = tuple(m for m in MODELS if m not in SIMULATION_ONLY_MODELS)

DIGITS_TEST_SIZE = 360  # scikit-learn digits: 1797 samples, fixed 1437/360 split
# MNIST-1D (Greydanus 2020) with the mnist1d package's default arguments: 5,000 samples of
# length 40, the first 80 % for training
MNIST1D_TRAIN, MNIST1D_TEST, MNIST1D_LENGTH = 4000, 1000, 40


def dataset_info(name: str, teacher_samples: int = 4096, teacher_features: int = 32) -> DatasetInfo:
    """Return the facts of data set ``name`` (teacher's size comes from its keys)."""
    if name == "digits":
        return DatasetInfo("digits", 1797 - DIGITS_TEST_SIZE, DIGITS_TEST_SIZE, (1, 8, 8), 10)
    if name == "teacher":
        return DatasetInfo("teacher", teacher_samples, max(256, teacher_samples // 4),
                           (teacher_features,), 10)
    if name == "mnist1d":
        return DatasetInfo("mnist1d", MNIST1D_TRAIN, MNIST1D_TEST, (MNIST1D_LENGTH,), 10)
    if name == "cifar10":
        return DatasetInfo("cifar10", 50_000, 10_000, (3, 32, 32), 10)
    if name in ("mnist", "fashion_mnist"):
        return DatasetInfo(name, 60_000, 10_000, (1, 28, 28), 10)
    if name == "imagenet":
        return DatasetInfo("imagenet", 1_281_167, 50_000, (3, 224, 224), 1000)
    raise KeyError(name)


MLP_HIDDEN = 128
# The MNIST-1D paper's models (github.com/greydanus/mnist1d, notebooks/models.py): MLPBase's
# hidden width (its default, as the paper's benchmark builds it) and ConvBase's channels
MNIST1D_MLP_HIDDEN = 100
MNIST1D_CNN_CHANNELS = 25
# ConvBase's three Conv1d layers: (kernel, stride, padding)
MNIST1D_CNN_LAYERS = ((5, 2, 1), (3, 2, 1), (3, 2, 1))
# Parameter counts of the simulation-only models: torchvision's builds with 1000 classes
# (ResNet-50, AlexNet), the Keras Applications table (ResNet-101/152, VGG-16, Inception V3:
# keras.io/api/applications) and the BERT README (google-research/bert: 110M and 340M,
# rounded); docs/hardware.md.
FIXED_COUNTS_1000 = {
    "resnet50": 25_557_032,
    "resnet101": 44_707_176,
    "resnet152": 60_419_944,
    "vgg16": 138_357_544,
    "inception_v3": 23_851_784,
    "alexnet": 61_100_840,
    "transformer": 61_000_000,  # Transformer-base (Vaswani et al. 2017), about 61M; approximate
    "bert_base": 110_000_000,
    "bert_large": 340_000_000,
}


def _flat(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _linear(i: int, o: int) -> int:
    return i * o + o


def _conv(i: int, o: int, k: int) -> int:
    return i * o * k * k + o


def conv1d_lengths(length: int) -> list[int]:
    """Output lengths of ConvBase's three Conv1d layers on an input of ``length``
    (``⌊(L + 2p − k) / s⌋ + 1`` each); ValueError when a layer would have no output."""
    out = []
    for k, s, p in MNIST1D_CNN_LAYERS:
        if length + 2 * p < k:
            raise ValueError(f"model 'mnist1d_cnn' needs sequences of length ≥ 3; this data set's are {length}")
        length = (length + 2 * p - k) // s + 1
        out.append(length)
    return out


def param_count(model: str, data: DatasetInfo) -> int:
    """Parameter count of ``model`` built for ``data`` (the backends' definitions)."""
    c = data.classes
    if model == "mlp":  # flatten → 128 → ReLU → classes
        return _linear(_flat(data.shape), MLP_HIDDEN) + _linear(MLP_HIDDEN, c)
    if model == "logistic":  # flatten → classes
        return _linear(_flat(data.shape), c)
    if model == "mnist1d_mlp":  # flatten → h → ReLU, h + ReLU(linear(h)), → classes (MLPBase)
        h = MNIST1D_MLP_HIDDEN
        return _linear(_flat(data.shape), h) + _linear(h, h) + _linear(h, c)
    if model == "mnist1d_cnn":  # 3 × (Conv1d, ReLU), flatten, linear (ConvBase)
        if len(data.shape) != 1:
            raise ValueError(f"model 'mnist1d_cnn' needs sequence data (one sample of shape (L,)); data set "
                             f"{data.name!r} is not")
        ch = MNIST1D_CNN_CHANNELS
        (k1, _, _), (k2, _, _), (k3, _, _) = MNIST1D_CNN_LAYERS
        last = conv1d_lengths(data.shape[0])[-1]
        return (1 * ch * k1 + ch) + (ch * ch * k2 + ch) + (ch * ch * k3 + ch) + _linear(ch * last, c)
    if len(data.shape) != 3 and model in IMAGE_MODELS:
        raise ValueError(f"model {model!r} needs image data; data set {data.name!r} is not")
    if model == "lenet":  # conv5(6,pad2) pool2 conv5(16,pad2) pool2 fc120 fc84 fc
        ch, h, w = data.shape
        return (_conv(ch, 6, 5) + _conv(6, 16, 5) + _linear(16 * (h // 4) * (w // 4), 120)
                + _linear(120, 84) + _linear(84, c))
    if model == "rudra_cifar":  # Caffe cifar10_full: 3 × (conv5 pad2, pool3/2 pad1), fc
        ch, h, w = data.shape
        for _ in range(3):
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        return _conv(ch, 32, 5) + _conv(32, 32, 5) + _conv(32, 64, 5) + _linear(64 * h * w, c)
    if model == "resnet18":  # torchvision resnet18(num_classes=c); grey images are repeated to RGB
        return 11_176_512 + _linear(512, c)
    if model == "resnet50":
        return 25_557_032 - _linear(2048, 1000) + _linear(2048, c)
    if model == "alexnet":
        return 61_100_840 - _linear(4096, 1000) + _linear(4096, c)
    if model in FIXED_COUNTS_1000:  # the published count whatever the data set (simulation only)
        return FIXED_COUNTS_1000[model]
    raise KeyError(model)


Shape = tuple[int, ...]
SHAPED_MODELS = ("mlp", "logistic", "mnist1d_mlp", "mnist1d_cnn", "lenet", "rudra_cifar", "resnet18")
# WikiText-2's vocabulary (Merity et al. 2016, "Pointer Sentinel Mixture Models", Table 1)
WIKITEXT2_VOCAB = 33_278


def _resnet18_shapes(stem: Shape, classes: int) -> list[Shape]:
    """ResNet-18's tensors in ``parameters()`` order: the stem convolution ``stem`` and its batch
    norm, four stages of two basic blocks (3×3 convolutions without bias, each followed by a
    batch norm's weight and bias; a stage's first block downsamples by a 1×1 convolution and its
    batch norm after the block's own), then the classifier (He et al. 2016, Table 1)."""
    out: list[Shape] = [stem, (64,), (64,)]
    width = 64
    for planes in (64, 128, 256, 512):
        for block in range(2):
            cin = width if block == 0 else planes
            out += [(planes, cin, 3, 3), (planes,), (planes,), (planes, planes, 3, 3), (planes,), (planes,)]
            if block == 0 and cin != planes:
                out += [(planes, cin, 1, 1), (planes,), (planes,)]
        width = planes
    return out + [(classes, 512), (classes,)]


def cifar_resnet18_shapes(classes: int = 10) -> list[Shape]:
    """The CIFAR ResNet-18 the PowerSGD paper trains (the authors' code, epfml: a 3×3 stride-1
    stem without max-pool, else torchvision's layout): 11,173,962 parameters for 10 classes."""
    return _resnet18_shapes((64, 3, 3, 3), classes)


def lstm_lm_shapes(vocab: int = WIKITEXT2_VOCAB, embedding: int = 650, hidden: int = 650, layers: int = 3,
                   tied: bool = True) -> list[Shape]:
    """PyTorch's word-language-model ``RNNModel`` (LSTM), which the PowerSGD paper's code builds:
    the embedding (vocab × embedding), per layer ``weight_ih`` (4h × input), ``weight_hh``
    (4h × h), ``bias_ih`` and ``bias_hh`` (4h), then the decoder's weight (vocab × h; absent when
    tied to the embedding, as ``parameters()`` lists a shared tensor once) and bias (vocab)."""
    out: list[Shape] = [(vocab, embedding)]
    for layer in range(layers):
        out += [(4 * hidden, embedding if layer == 0 else hidden), (4 * hidden, hidden), (4 * hidden,), (4 * hidden,)]
    if not tied:
        out.append((vocab, hidden))
    return out + [(vocab,)]


def param_shapes(model: str, data: DatasetInfo) -> list[Shape] | None:
    """The shapes of ``model``'s parameter tensors built for ``data``, in the order the backends'
    ``model.parameters()`` yields them (weight before bias per layer; a test checks them against
    the torch models); None for a model whose shapes ddlsim does not know (not in
    :data:`SHAPED_MODELS`). Their sizes sum to :func:`param_count`."""
    c = data.classes

    def linear(i: int, o: int) -> list[Shape]:
        return [(o, i), (o,)]

    if model == "mlp":
        return linear(_flat(data.shape), MLP_HIDDEN) + linear(MLP_HIDDEN, c)
    if model == "logistic":
        return linear(_flat(data.shape), c)
    if model == "mnist1d_mlp":
        h = MNIST1D_MLP_HIDDEN
        return linear(_flat(data.shape), h) + linear(h, h) + linear(h, c)
    if model == "mnist1d_cnn":
        if len(data.shape) != 1:
            return None
        ch = MNIST1D_CNN_CHANNELS
        (k1, _, _), (k2, _, _), (k3, _, _) = MNIST1D_CNN_LAYERS
        last = conv1d_lengths(data.shape[0])[-1]
        return [(ch, 1, k1), (ch,), (ch, ch, k2), (ch,), (ch, ch, k3), (ch,)] + linear(ch * last, c)
    if model in IMAGE_MODELS and len(data.shape) != 3:
        return None
    if model == "lenet":
        ch, h, w = data.shape
        return ([(6, ch, 5, 5), (6,), (16, 6, 5, 5), (16,)] + linear(16 * (h // 4) * (w // 4), 120)
                + linear(120, 84) + linear(84, c))
    if model == "rudra_cifar":
        ch, h, w = data.shape
        for _ in range(3):
            h, w = (h - 1) // 2 + 1, (w - 1) // 2 + 1
        return [(32, ch, 5, 5), (32,), (32, 32, 5, 5), (32,), (64, 32, 5, 5), (64,)] + linear(64 * h * w, c)
    if model == "resnet18":  # torchvision resnet18(num_classes=c): 7×7 stride-2 stem (grey images repeated to RGB)
        return _resnet18_shapes((64, 3, 7, 7), c)
    return None
