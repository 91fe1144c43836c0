"""Small vision models: ``mlp``, ``cnn`` (FedSparse "LeNet-5"), ``mnist_cnn`` (FedAvg CNN) and
``feddst_cnn`` (FedDST's MNIST / CIFAR nets).

Layers are registered in forward order with flat names (``fc1``, ``conv1``, ...) and the
classifier last, which is what ``fedcomm.models.groups`` relies on to mark the output layer.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from fedcomm.models.progressive import Unit, even_cuts
from fedcomm.models.registry import invalid_option, positive_int, positive_ints, register


class MLP(nn.Module):
    """Flatten, then Linear layers ``fc1 … fcL`` with ReLU between them (none after the last).

    Staged (``fedcomm.models.progressive``): unit ``i`` is ``fc{i}`` + ReLU for each hidden
    layer, the classifier is ``fc{L}``; ``default_stages = len(hidden) + 1`` (the last stage
    adds only the classifier), 1 for a linear model; any S splits the units with ``even_cuts``.
    """

    def __init__(self, in_features: int, hidden: Sequence[int], num_classes: int) -> None:
        super().__init__()
        widths = [in_features, *hidden, num_classes]
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths), 1):
            self.add_module(f"fc{i}", nn.Linear(fan_in, fan_out))
        self.hidden = tuple(hidden)
        self.default_stages = len(hidden) + 1
        self.classifier_prefixes: tuple[str, ...] = (f"fc{len(hidden) + 1}.",)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = list(self.children())
        x = x.flatten(1)  # (B, d)
        for layer in layers[:-1]:
            x = F.relu(layer(x))  # (B, hidden_i)
        return layers[-1](x)  # (B, num_classes)

    def units(self) -> list[Unit]:
        """One unit per hidden layer: flatten + ``fc{i}`` + ReLU."""
        return [
            Unit(f"fc{i}", (f"fc{i}.",), width, partial(_linear_relu, getattr(self, f"fc{i}")))
            for i, width in enumerate(self.hidden, 1)
        ]

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """The last linear layer (on the flattened input for a linear model)."""
        out: torch.Tensor = getattr(self, f"fc{len(self.hidden) + 1}")(h.flatten(1))
        return out

    def stage_cuts(self, stages: int) -> list[int]:
        """``even_cuts`` over the hidden layers; S in ``1 … len(hidden) + 1``."""
        return even_cuts(len(self.hidden), stages)


class ConvNet(nn.Module):
    """conv5x5-ReLU-maxpool2-conv5x5-ReLU-maxpool2-flatten-fc-ReLU-fc, the shared shape of ``cnn``
    and ``mnist_cnn`` (they differ only in the convolutions' padding).

    Staged (``fedcomm.models.progressive``): units ``conv1`` (conv + ReLU + pool), ``conv2``
    (likewise) and ``fc1`` (flatten + fc1 + ReLU); classifier ``fc2``; ``default_stages = 3``
    (one unit each, as ProgFed's MNIST ConvNet); any S in 1..4 via ``even_cuts``.
    """

    default_stages = 3
    classifier_prefixes = ("fc2.",)

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        *,
        padding: int,
        channels: tuple[int, int],
        hidden: int,
    ) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, channels[0], 5, padding=padding)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5, padding=padding)
        h_out, w_out = (_after_blocks(s, padding) for s in (h, w))
        self.fc1 = nn.Linear(channels[1] * h_out * w_out, hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Shapes for cnn on (3, 32, 32); mnist_cnn on (1, 28, 28) keeps 28 -> 14 -> 7.
        x = _conv_pool(self.conv1, x)  # (B, 32, 14, 14)
        x = _conv_pool(self.conv2, x)  # (B, 64, 5, 5)
        x = F.relu(self.fc1(x.flatten(1)))  # (B, 512)
        return self.fc2(x)  # (B, num_classes)

    def units(self) -> list[Unit]:
        """``conv1`` block, ``conv2`` block, ``fc1`` (flatten + fc1 + ReLU)."""
        return [
            Unit("conv1", ("conv1.",), self.conv1.out_channels, partial(_conv_pool, self.conv1)),
            Unit("conv2", ("conv2.",), self.conv2.out_channels, partial(_conv_pool, self.conv2)),
            Unit("fc1", ("fc1.",), self.fc1.out_features, partial(_linear_relu, self.fc1)),
        ]

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """``fc2``."""
        out: torch.Tensor = self.fc2(h)
        return out

    def stage_cuts(self, stages: int) -> list[int]:
        """``even_cuts`` over the 3 units; S in 1..4."""
        return even_cuts(3, stages)


def _linear_relu(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Flatten (a no-op on 2-D input), ``layer``, ReLU."""
    return F.relu(layer(x.flatten(1)))  # (B, out_features)


def _conv_pool(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv``, ReLU, maxpool2: one ``ConvNet`` block, on the channels-last input, computed as
    ``relu(maxpool(conv))``: the same function with the same gradients to the bit (ReLU is
    monotone, so the max of the rectified window is the rectified max, and the pooled position
    is the same) on a quarter of the elements."""
    return F.relu(F.max_pool2d(conv(channels_last(x)), 2))  # (B, C_out, H', W')


def channels_last(x: torch.Tensor) -> torch.Tensor:
    """``x (B, C, H, W)`` in the channels-last memory layout, where the CPU's oneDNN convolutions
    and, above all, max pooling are faster (``docs/speed.md``: the W3 round); unchanged under
    ``torch.func.vmap`` (which has no channels-last layout; the vectorized backend's batched
    convolutions stay NCHW) and for other ranks. The function is the same; the convolutions'
    kernels sum in another order (float rounding, ~1e-6 relative)."""
    if x.dim() != 4 or torch._C._functorch.is_functorch_wrapped_tensor(x):
        return x
    return x.contiguous(memory_format=torch.channels_last)


def _after_blocks(size: int, padding: int) -> int:
    """Spatial size after two (conv5x5 with ``padding``, maxpool2) blocks."""
    for _ in range(2):
        size = (size + 2 * padding - 4) // 2
    return size


@register("mlp")
def mlp(
    *, input_shape: tuple[int, ...], num_classes: int, hidden: Sequence[int] = (200, 200)
) -> MLP:
    """Multilayer perceptron on the flattened input.

    The default ``hidden=(200, 200)`` is the "2NN" of McMahan et al., "Communication-Efficient
    Learning of Deep Networks from Decentralized Data", AISTATS 2017. FedBIAD (Xue et al., IPDPS
    2023) uses ``hidden=[128]`` on MNIST (784-128-10, 101,770 parameters) and ``hidden=[256]``
    on Fashion-MNIST (203,530 parameters).

    Args:
        input_shape: any shape; it is flattened to ``prod(input_shape)`` features.
        num_classes: output width.
        hidden: widths of the hidden layers (may be empty: a linear model).

    Returns:
        The model; layers are named ``fc1 … fc{len(hidden)+1}``.
    """
    widths = positive_ints("mlp", "hidden", hidden, allow_empty=True)
    return MLP(math.prod(input_shape), widths, num_classes)


@register("cnn")
def cnn(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: Sequence[int] = (32, 64),
    hidden: int = 512,
) -> ConvNet:
    """The FedSparse "LeNet-5": two unpadded conv5x5 + maxpool2 blocks, fc512, classifier.

    Louizos et al., "An Expectation-Maximization Perspective on Federated Learning" (FedSparse),
    Section 5 / Appendix A, CIFAR-10 and FEMNIST. The paper names the model only; the widths are
    the ones that reproduce its reported communication (the GB column of Tables 1 and 3):
    878,538 parameters on ``(3, 32, 32)`` with 10 classes, 608,702 on ``(1, 28, 28)`` with 62.

    Args:
        input_shape: ``(C, H, W)``; H and W at least 16.
        num_classes: output width.
        channels: output channels of the two convolutions.
        hidden: width of the hidden fully connected layer.

    Returns:
        The model, with layers ``conv1, conv2, fc1, fc2``.
    """
    return _convnet("cnn", input_shape, num_classes, 0, channels, hidden)


@register("mnist_cnn")
def mnist_cnn(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: Sequence[int] = (32, 64),
    hidden: int = 512,
) -> ConvNet:
    """The FedAvg "CNN": two padded (same-size) conv5x5 + maxpool2 blocks, fc512, classifier.

    McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
    AISTATS 2017, Section 3. On ``(1, 28, 28)`` with 10 classes it has 1,663,370 parameters
    (the LEAF FEMNIST CNN is the same with ``hidden=2048`` and 62 classes).

    Args:
        input_shape: ``(C, H, W)``; H and W at least 4.
        num_classes: output width.
        channels: output channels of the two convolutions.
        hidden: width of the hidden fully connected layer.

    Returns:
        The model, with layers ``conv1, conv2, fc1, fc2``.
    """
    return _convnet("mnist_cnn", input_shape, num_classes, 2, channels, hidden)


def _convnet(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    padding: int,
    channels: Sequence[int],
    hidden: int,
) -> ConvNet:
    if len(input_shape) != 3:
        raise invalid_option(name, "input_shape", f"must be (C, H, W), got {input_shape}")
    if min(_after_blocks(s, padding) for s in input_shape[1:]) < 1:
        raise invalid_option(name, "input_shape", f"{input_shape} is too small for two blocks")
    c1, c2 = positive_ints(name, "channels", channels, length=2)
    width = positive_int(name, "hidden", hidden)
    c, h, w = input_shape
    return ConvNet((c, h, w), num_classes, padding=padding, channels=(c1, c2), hidden=width)


class FeddstCNN(nn.Module):
    """Two (conv5x5, no padding; maxpool 3x3 stride 1; ReLU) blocks, then ReLU-separated Linear
    layers ``fc1 … fcL`` with none after the last (the logits; ``softmax_output``: their softmax,
    as the official nets)."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        *,
        channels: tuple[int, int],
        hidden: Sequence[int],
        softmax_output: bool = False,
    ) -> None:
        super().__init__()
        self.softmax_output = softmax_output
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, channels[0], 5)
        self.conv2 = nn.Conv2d(channels[0], channels[1], 5)
        widths = [channels[1] * (h - 12) * (w - 12), *hidden, num_classes]
        for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths), 1):
            self.add_module(f"fc{i}", nn.Linear(fan_in, fan_out))
        self.num_fc = len(widths) - 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Shapes for the MNIST net on (1, 28, 28); CIFAR-10's gives 28, 26, 22, 20 and 6400.
        x = F.relu(F.max_pool2d(self.conv1(channels_last(x)), 3, stride=1))  # (B, 10, 22, 22)
        x = F.relu(F.max_pool2d(self.conv2(x), 3, stride=1))  # (B, 20, 16, 16)
        x = x.flatten(1)  # (B, 5120)
        for i in range(1, self.num_fc):
            x = F.relu(getattr(self, f"fc{i}")(x))  # (B, hidden_i)
        out: torch.Tensor = getattr(self, f"fc{self.num_fc}")(x)  # (B, num_classes)
        return F.softmax(out, dim=1) if self.softmax_output else out


# FedDST's nets (bibikar/feddst models.py): (channels, hidden) of ``MNISTNet``, ``CIFAR10Net``
# and ``CIFAR100Net``; ``feddst_widths`` picks one from the input.
FEDDST_MNIST = ((10, 20), (50,))
FEDDST_CIFAR10 = ((6, 16), (120, 84))
FEDDST_CIFAR100 = ((6, 16), (120,))


def feddst_widths(
    input_shape: tuple[int, ...], num_classes: int
) -> tuple[tuple[int, int], tuple[int, ...]]:
    """The ``(channels, hidden)`` of the FedDST net for this input, the ``feddst_cnn`` defaults.

    - 1 input channel (MNIST, and Fashion-MNIST/FEMNIST, which the paper did not use):
      ``MNISTNet``'s ``(10, 20), (50,)``.
    - any other channel count (CIFAR): ``CIFAR100Net``'s ``(6, 16), (120,)`` with 100 classes,
      else ``CIFAR10Net``'s ``(6, 16), (120, 84)`` (so CIFAR-100 coarse, 20 classes, gets the
      CIFAR-10 net with 20 outputs).
    """
    if input_shape[0] == 1:
        return FEDDST_MNIST
    return FEDDST_CIFAR100 if num_classes == 100 else FEDDST_CIFAR10


@register("feddst_cnn")
def feddst_cnn(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    channels: Sequence[int] | None = None,
    hidden: Sequence[int] | None = None,
    softmax_output: bool = False,
) -> FeddstCNN:
    """FedDST's CNNs: conv5x5 (no padding), maxpool 3x3 stride 1, ReLU, twice; then MLP layers.

    Bibikar et al., "Federated Dynamic Sparse Training: Computing Less, Communicating Less, Yet
    Learning Better", AAAI 2022; ``models.py`` of bibikar/feddst (``MNISTNet``,
    ``CIFAR10Net``, ``CIFAR100Net``). ``channels``/``hidden`` left as ``None`` give the paper's
    net for the input (``feddst_widths``); a value given is used as is, for either option alone:

    - MNIST, ``(1, 28, 28)`` with 10 classes: conv 1→10, conv 10→20, fc 5120→50, fc 50→10;
      261,840 parameters (``channels=[10, 20], hidden=[50]``).
    - CIFAR-10, ``(3, 32, 32)`` with 10 classes: conv 3→6, conv 6→16, fc 6400→120, fc 120→84,
      fc 84→10; 782,006 parameters (``channels=[6, 16], hidden=[120, 84]``).
    - CIFAR-100, ``(3, 32, 32)`` with 100 classes: conv 3→6, conv 6→16, fc 6400→120,
      fc 120→100; 783,092 parameters (``channels=[6, 16], hidden=[120]``).

    The original ends in ``softmax`` and then trains with ``cross_entropy``, which applies
    log-softmax again (a double softmax, which flattens the gradients); by default this model
    returns logits, like every model here, and ``softmax_output=True`` ends it in the softmax
    as the original (the losses then see the double softmax; argmax, so accuracy, is the same).

    Args:
        input_shape: ``(C, H, W)``; H and W at least 13.
        num_classes: output width.
        channels: output channels of the two convolutions; ``None``: by the input, as above.
        hidden: widths of the hidden fully connected layers (may be empty); ``None``: by the
            input, as above.
        softmax_output: end in softmax (the official code's nets).

    Returns:
        The model, with layers ``conv1, conv2, fc1 … fc{len(hidden)+1}``.
    """
    name = "feddst_cnn"
    if len(input_shape) != 3:
        raise invalid_option(name, "input_shape", f"must be (C, H, W), got {input_shape}")
    if min(input_shape[1:]) < 13:
        raise invalid_option(name, "input_shape", f"{input_shape} is too small for two blocks")
    default_channels, default_hidden = feddst_widths(input_shape, num_classes)
    channels = default_channels if channels is None else channels
    hidden = default_hidden if hidden is None else hidden
    c1, c2 = positive_ints(name, "channels", channels, length=2)
    widths = positive_ints(name, "hidden", hidden, allow_empty=True)
    c, h, w = input_shape
    return FeddstCNN(
        (c, h, w), num_classes, channels=(c1, c2), hidden=widths, softmax_output=softmax_output
    )
