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
LAYERED_MODELS = ("resnet50", "resnet101", "resnet152", "vgg16", "inception_v3", "alexnet")
SHAPED_MODELS = ("mlp", "logistic", "mnist1d_mlp", "mnist1d_cnn", "lenet", "rudra_cifar", "resnet18") + LAYERED_MODELS
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
    :data:`SHAPED_MODELS`). Their sizes sum to :func:`param_count`, except where that count is the
    Keras table's (resnet101, resnet152, inception_v3: Keras counts every batch norm's four vectors, and
    ResNet's convolution biases, where torchvision's modules hold two vectors and no bias)."""
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
    layers = model_layers(model, data)
    if layers is None:
        return None
    return [s for layer in layers for s in layer.shapes()]


# -- layers of the simulation-only image models: shapes and forward multiply-adds ----------------

@dataclass(frozen=True)
class Layer:
    """A convolution or linear layer: its weight's shape ``(out, in, kh, kw)`` or ``(out, in)``, whether
    it has a bias, whether a batch norm (weight and bias vectors) follows it, and its output's spatial
    positions (1 for a linear layer). Its forward multiply-adds are one per weight per position."""

    weight: Shape
    bias: bool
    norm: bool
    positions: int

    def shapes(self) -> list[Shape]:
        """Its tensors in torch's ``parameters()`` order: weight, bias, then the batch norm's two."""
        out = self.weight[0]
        return [self.weight] + [(out,)] * (int(self.bias) + 2 * int(self.norm))

    @property
    def params(self) -> int:
        return sum(_flat(s) for s in self.shapes())

    @property
    def macs(self) -> int:
        return _flat(self.weight) * self.positions


# The input sizes the architectures are defined at: 224 × 224 (He et al. 2016, Simonyan & Zisserman
# 2015, torchvision's AlexNet), 299 × 299 for Inception v3 (Szegedy et al. 2016, §6)
INPUT_SIZE = {"resnet50": 224, "resnet101": 224, "resnet152": 224, "vgg16": 224, "alexnet": 224,
              "inception_v3": 299}
RESNET_BLOCKS = {"resnet50": (3, 4, 6, 3), "resnet101": (3, 4, 23, 3), "resnet152": (3, 8, 36, 3)}


def conv_out(size: int, k: int, stride: int = 1, pad: int = 0) -> int:
    """A convolution's or pooling's output size along one axis: ``⌊(n + 2p − k) / s⌋ + 1``."""
    return (size + 2 * pad - k) // stride + 1


def _conv_layer(cin: int, cout: int, k: tuple[int, int], size: tuple[int, int], stride: int = 1,
                pad: tuple[int, int] = (0, 0), *, bias: bool = False,
                norm: bool = True) -> tuple[Layer, tuple[int, int]]:
    """A convolution on a ``size`` (h, w) input: the layer and its output size."""
    h, w = conv_out(size[0], k[0], stride, pad[0]), conv_out(size[1], k[1], stride, pad[1])
    return Layer((cout, cin, *k), bias, norm, h * w), (h, w)


def _resnet_layers(blocks: tuple[int, ...], size: int, classes: int) -> list[Layer]:
    """Bottleneck ResNet (He et al. 2016, Table 1) in torchvision's ``parameters()`` order: the 7×7
    stride-2 stem and its batch norm, a 3×3 stride-2 max-pool, four stages of bottleneck blocks
    (1×1, 3×3, 1×1 convolutions without bias, each with a batch norm; a stage's first block adds a
    1×1 projection after them), then the classifier. The stride of a stage's first block is on its
    first 1×1 convolution, as He et al. define it (and tf_cnn_benchmarks' ResNet v1 builds it);
    torchvision's v1.5 puts it on the 3×3, which moves no parameter but raises the multiply-adds."""
    out: list[Layer] = []
    stem, hw = _conv_layer(3, 64, (7, 7), (size, size), 2, (3, 3))
    out.append(stem)
    hw = (conv_out(hw[0], 3, 2, 1), conv_out(hw[1], 3, 2, 1))
    width = 64
    for stage, (planes, count) in enumerate(zip((64, 128, 256, 512), blocks)):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            a, mid = _conv_layer(width, planes, (1, 1), hw, stride)
            b, _ = _conv_layer(planes, planes, (3, 3), mid, 1, (1, 1))
            c, _ = _conv_layer(planes, 4 * planes, (1, 1), mid)
            out += [a, b, c]
            if block == 0:
                out.append(_conv_layer(width, 4 * planes, (1, 1), hw, stride)[0])
            width, hw = 4 * planes, mid
    return out + [Layer((classes, width), True, False, 1)]


def _vgg16_layers(size: int, classes: int) -> list[Layer]:
    """VGG-16 (Simonyan & Zisserman 2015, Table 1 column D; torchvision's ``vgg16``): thirteen 3×3
    pad-1 convolutions with bias in five blocks each ended by a 2×2 max-pool, then three linear
    layers on the 7×7 × 512 features."""
    out: list[Layer] = []
    hw, width = (size, size), 3
    for depth, count in ((64, 2), (128, 2), (256, 3), (512, 3), (512, 3)):
        for _ in range(count):
            layer, hw = _conv_layer(width, depth, (3, 3), hw, 1, (1, 1), bias=True, norm=False)
            out.append(layer)
            width = depth
        hw = (hw[0] // 2, hw[1] // 2)
    return out + [Layer((4096, 512 * 7 * 7), True, False, 1), Layer((4096, 4096), True, False, 1),
                  Layer((classes, 4096), True, False, 1)]


def _alexnet_layers(size: int, classes: int) -> list[Layer]:
    """torchvision's ``alexnet`` (the one-GPU variant of Krizhevsky et al. 2012): five convolutions
    with bias (11×11 stride 4 pad 2, 5×5 pad 2, three 3×3 pad 1; a 3×3 stride-2 max-pool after the
    first, second and fifth), an adaptive pool to 6×6, then three linear layers."""
    out: list[Layer] = []
    hw = (size, size)
    for cin, cout, k, stride, pad, pool in ((3, 64, 11, 4, 2, True), (64, 192, 5, 1, 2, True),
                                            (192, 384, 3, 1, 1, False), (384, 256, 3, 1, 1, False),
                                            (256, 256, 3, 1, 1, True)):
        layer, hw = _conv_layer(cin, cout, (k, k), hw, stride, (pad, pad), bias=True, norm=False)
        out.append(layer)
        if pool:
            hw = (conv_out(hw[0], 3, 2), conv_out(hw[1], 3, 2))
    return out + [Layer((4096, 256 * 6 * 6), True, False, 1), Layer((4096, 4096), True, False, 1),
                  Layer((classes, 4096), True, False, 1)]


class _Inception:
    """Inception v3's convolutions in order (Szegedy et al. 2016, Table 1 and Figures 5-7, as torchvision's
    ``inception_v3`` lays them out: each a convolution without bias and a batch norm)."""

    def __init__(self, size: int) -> None:
        self.layers: list[Layer] = []
        self.hw = (size, size)

    def conv(self, cin: int, cout: int, k: tuple[int, int], hw: tuple[int, int], stride: int = 1,
             pad: tuple[int, int] = (0, 0)) -> tuple[int, int]:
        layer, out = _conv_layer(cin, cout, k, hw, stride, pad)
        self.layers.append(layer)
        return out

    def chain(self, cin: int, steps: list[tuple[int, tuple[int, int], tuple[int, int], int]],
              hw: tuple[int, int]) -> tuple[int, int]:
        """Convolutions one after another from ``cin`` channels: (out, kernel, pad, stride) each."""
        for cout, k, pad, stride in steps:
            hw = self.conv(cin, cout, k, hw, stride, pad)
            cin = cout
        return hw

    def block_a(self, cin: int, pool: int) -> int:
        hw = self.hw
        self.conv(cin, 64, (1, 1), hw)
        self.chain(cin, [(48, (1, 1), (0, 0), 1), (64, (5, 5), (2, 2), 1)], hw)
        self.chain(cin, [(64, (1, 1), (0, 0), 1), (96, (3, 3), (1, 1), 1), (96, (3, 3), (1, 1), 1)], hw)
        self.conv(cin, pool, (1, 1), hw)
        return 64 + 64 + 96 + pool

    def block_b(self, cin: int) -> int:
        hw = self.hw
        out = self.conv(cin, 384, (3, 3), hw, 2)
        self.chain(cin, [(64, (1, 1), (0, 0), 1), (96, (3, 3), (1, 1), 1), (96, (3, 3), (0, 0), 2)], hw)
        self.hw = out
        return 384 + 96 + cin

    def block_c(self, cin: int, c7: int) -> int:
        hw, row, col = self.hw, ((1, 7), (0, 3)), ((7, 1), (3, 0))
        self.conv(cin, 192, (1, 1), hw)
        self.chain(cin, [(c7, (1, 1), (0, 0), 1), (c7, *row, 1), (192, *col, 1)], hw)
        self.chain(cin, [(c7, (1, 1), (0, 0), 1), (c7, *col, 1), (c7, *row, 1), (c7, *col, 1), (192, *row, 1)], hw)
        self.conv(cin, 192, (1, 1), hw)
        return 4 * 192

    def block_d(self, cin: int) -> int:
        hw = self.hw
        out = self.chain(cin, [(192, (1, 1), (0, 0), 1), (320, (3, 3), (0, 0), 2)], hw)
        self.chain(cin, [(192, (1, 1), (0, 0), 1), (192, (1, 7), (0, 3), 1), (192, (7, 1), (3, 0), 1),
                         (192, (3, 3), (0, 0), 2)], hw)
        self.hw = out
        return 320 + 192 + cin

    def block_e(self, cin: int) -> int:
        hw = self.hw
        self.conv(cin, 320, (1, 1), hw)
        self.conv(cin, 384, (1, 1), hw)
        self.conv(384, 384, (1, 3), hw, 1, (0, 1))
        self.conv(384, 384, (3, 1), hw, 1, (1, 0))
        self.chain(cin, [(448, (1, 1), (0, 0), 1), (384, (3, 3), (1, 1), 1)], hw)
        self.conv(384, 384, (1, 3), hw, 1, (0, 1))
        self.conv(384, 384, (3, 1), hw, 1, (1, 0))
        self.conv(cin, 192, (1, 1), hw)
        return 320 + 2 * 384 + 2 * 384 + 192


def _inception_v3_layers(size: int, classes: int) -> list[Layer]:
    """Inception v3 without the auxiliary classifier (tf_cnn_benchmarks' model, and Keras' count):
    the stem (3×3 stride 2, 3×3, 3×3 pad 1, max-pool, 1×1, 3×3, max-pool), three A blocks, B, four C
    blocks, D, two E blocks, then the classifier on 2048 features."""
    net = _Inception(size)
    hw = net.chain(3, [(32, (3, 3), (0, 0), 2), (32, (3, 3), (0, 0), 1), (64, (3, 3), (1, 1), 1)], net.hw)
    hw = (conv_out(hw[0], 3, 2), conv_out(hw[1], 3, 2))
    hw = net.chain(64, [(80, (1, 1), (0, 0), 1), (192, (3, 3), (0, 0), 1)], hw)
    net.hw = (conv_out(hw[0], 3, 2), conv_out(hw[1], 3, 2))
    width = net.block_a(192, 32)
    width = net.block_a(width, 64)
    width = net.block_a(width, 64)
    width = net.block_b(width)
    for c7 in (128, 160, 160, 192):
        width = net.block_c(width, c7)
    width = net.block_d(width)
    width = net.block_e(width)
    width = net.block_e(width)
    return net.layers + [Layer((classes, width), True, False, 1)]


def model_layers(model: str, data: DatasetInfo) -> list[Layer] | None:
    """The convolution and linear layers of a simulation-only image model (:data:`LAYERED_MODELS`) at
    the input size its architecture is defined at (:data:`INPUT_SIZE`), in ``parameters()`` order, for
    ``data``'s classes where :func:`param_count` follows them (resnet50, alexnet), else 1000; None for
    another model."""
    if model not in LAYERED_MODELS:
        return None
    classes = data.classes if model in ("resnet50", "alexnet") else 1000
    size = INPUT_SIZE[model]
    if model in RESNET_BLOCKS:
        return _resnet_layers(RESNET_BLOCKS[model], size, classes)
    if model == "vgg16":
        return _vgg16_layers(size, classes)
    if model == "alexnet":
        return _alexnet_layers(size, classes)
    return _inception_v3_layers(size, classes)


def forward_macs(model: str, data: DatasetInfo) -> list[int] | None:
    """Each layer's forward multiply-adds for one sample (:func:`model_layers`' order); None where the
    layers are unknown."""
    layers = model_layers(model, data)
    return None if layers is None else [layer.macs for layer in layers]
