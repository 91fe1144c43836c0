"""ProgFed's ConvNets: ``progfed_emnist_cnn`` and ``progfed_cifar_cnn``.

Wang et al., "ProgFed: Effective, Communication, and Computation Efficient Federated Learning
by Progressive Training", ICML 2022, App. B; code a514514772/ProgFed ``models/convnet.py``
(``ConvNet``, datasets ``emnist`` and ``cifar10``; stages as App. B's "Architectures"). All
convolutions are 3x3 without padding, all pools are max-pool 2, every init is PyTorch's default
(as the official code).

Both are staged (``fedcomm.models.progressive``) with one unit per official ``module_splits``
entry, so ``default_stages`` is the paper's S. Layers are registered in forward order with flat
names and the classifier ``fc2`` last (``fedcomm.models.groups`` relies on that). Dropout is a
child module (``nn.Dropout``), never ``F.dropout(..., self.training)``: ProgFed's stage views
share the child modules but not the model's own ``training`` flag.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from fedcomm.models.progressive import Unit, even_cuts
from fedcomm.models.registry import invalid_option, register


class ProgfedEmnistCNN(nn.Module):
    """conv3x3-ReLU, conv3x3-ReLU-maxpool2-Dropout(0.25), flatten-fc-ReLU-Dropout(0.5), fc.

    Staged: units ``conv1``, ``conv2`` (with its pool and dropout), ``fc1`` (flatten + fc1 +
    ReLU + dropout); classifier ``fc2``; ``default_stages = 3``.
    """

    default_stages = 3
    classifier_prefixes = ("fc2.",)

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int, dropout: bool) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.dropout1: nn.Module = nn.Dropout(0.25) if dropout else nn.Identity()
        self.fc1 = nn.Linear(64 * ((h - 4) // 2) * ((w - 4) // 2), 128)
        self.dropout2: nn.Module = nn.Dropout(0.5) if dropout else nn.Identity()
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Shapes on (1, 28, 28).
        x = F.relu(self.conv1(x))  # (B, 32, 26, 26)
        x = self.dropout1(F.max_pool2d(F.relu(self.conv2(x)), 2))  # (B, 64, 12, 12)
        x = self.dropout2(F.relu(self.fc1(x.flatten(1))))  # (B, 128)
        out: torch.Tensor = self.fc2(x)  # (B, num_classes)
        return out

    def _conv1(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.conv1(x))

    def _conv2(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout1(F.max_pool2d(F.relu(self.conv2(x)), 2))
        return out

    def _fc1(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.dropout2(F.relu(self.fc1(x.flatten(1))))
        return out

    def units(self) -> list[Unit]:
        """``conv1`` (+ReLU), ``conv2`` (+ReLU, pool, dropout), ``fc1`` (+ReLU, dropout)."""
        return [
            Unit("conv1", ("conv1.",), 32, self._conv1),
            Unit("conv2", ("conv2.",), 64, self._conv2),
            Unit("fc1", ("fc1.",), 128, self._fc1),
        ]

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """``fc2``."""
        out: torch.Tensor = self.fc2(h)
        return out

    def stage_cuts(self, stages: int) -> list[int]:
        """``even_cuts`` over the 3 units; S in 1..4 (the paper: 3)."""
        return even_cuts(3, stages)


class ProgfedCifarCNN(nn.Module):
    """conv3x3-ReLU-maxpool2, conv3x3-ReLU-maxpool2, conv3x3-ReLU, flatten-fc-ReLU, fc.

    Staged: units ``conv1``, ``conv2``, ``conv3``, ``fc1``; classifier ``fc2``;
    ``default_stages = 4``.
    """

    default_stages = 4
    classifier_prefixes = ("fc2.",)

    def __init__(self, input_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        c, h, w = input_shape
        self.conv1 = nn.Conv2d(c, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.conv3 = nn.Conv2d(64, 64, 3)
        h_out, w_out = (_cifar_spatial(s) for s in (h, w))
        self.fc1 = nn.Linear(64 * h_out * w_out, 64)
        self.fc2 = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Shapes on (3, 32, 32).
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # (B, 32, 15, 15)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # (B, 64, 6, 6)
        x = F.relu(self.conv3(x))  # (B, 64, 4, 4)
        x = F.relu(self.fc1(x.flatten(1)))  # (B, 64)
        out: torch.Tensor = self.fc2(x)  # (B, num_classes)
        return out

    def units(self) -> list[Unit]:
        """``conv1`` (+ReLU, pool), ``conv2`` (+ReLU, pool), ``conv3`` (+ReLU), ``fc1``."""
        return [
            Unit("conv1", ("conv1.",), 32, partial(_conv_relu, self.conv1, True)),
            Unit("conv2", ("conv2.",), 64, partial(_conv_relu, self.conv2, True)),
            Unit("conv3", ("conv3.",), 64, partial(_conv_relu, self.conv3, False)),
            Unit("fc1", ("fc1.",), 64, self._fc1),
        ]

    def _fc1(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.fc1(x.flatten(1)))

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """``fc2``."""
        out: torch.Tensor = self.fc2(h)
        return out

    def stage_cuts(self, stages: int) -> list[int]:
        """``even_cuts`` over the 4 units; S in 1..5 (the paper: 4, one unit each)."""
        return even_cuts(4, stages)


def _conv_relu(conv: nn.Conv2d, pool: bool, x: torch.Tensor) -> torch.Tensor:
    x = F.relu(conv(x))
    return F.max_pool2d(x, 2) if pool else x


def _cifar_spatial(size: int) -> int:
    """Spatial size after conv3-pool2-conv3-pool2-conv3 (no padding)."""
    return ((size - 2) // 2 - 2) // 2 - 2


@register("progfed_emnist_cnn")
def progfed_emnist_cnn(
    *, input_shape: tuple[int, ...], num_classes: int, dropout: bool = True
) -> ProgfedEmnistCNN:
    """ProgFed's EMNIST ConvNet (S = 3).

    Wang et al., ICML 2022, App. B; a514514772/ProgFed ``models/convnet.py`` (``emnist``):
    conv3x3 1→32 + ReLU; conv3x3 32→64 + ReLU + maxpool2 + Dropout(0.25); flatten (9216) +
    fc 9216→128 + ReLU + Dropout(0.5); fc 128→C. No padding.

    On ``(1, 28, 28)`` with 62 classes (EMNIST byclass): 1,206,590 parameters; ProgFed's
    sub-models with the temporary heads GAP + fc(32 / 64 → 62) have 2,366 / 22,846 /
    1,206,590. Shapes: (32, 26, 26), (64, 12, 12), (128,), (num_classes,).

    Args:
        input_shape: ``(C, H, W)``; H and W at least 6.
        num_classes: output width.
        dropout: keep the two dropout layers (``False`` replaces them with identities).

    Returns:
        The model, with layers ``conv1, conv2, dropout1, fc1, dropout2, fc2``.
    """
    name = "progfed_emnist_cnn"
    if len(input_shape) != 3:
        raise invalid_option(name, "input_shape", f"must be (C, H, W), got {input_shape}")
    if min(input_shape[1:]) < 6:
        raise invalid_option(name, "input_shape", f"{input_shape} is too small (H, W >= 6)")
    if not isinstance(dropout, bool):
        raise invalid_option(name, "dropout", f"must be a bool, got {dropout!r}")
    c, h, w = input_shape
    return ProgfedEmnistCNN((c, h, w), num_classes, dropout)


@register("progfed_cifar_cnn")
def progfed_cifar_cnn(*, input_shape: tuple[int, ...], num_classes: int) -> ProgfedCifarCNN:
    """ProgFed's CIFAR-10 ConvNet (S = 4).

    Wang et al., ICML 2022, App. B; a514514772/ProgFed ``models/convnet.py`` (``cifar10``):
    conv3x3 3→32 + ReLU + maxpool2; conv3x3 32→64 + ReLU + maxpool2; conv3x3 64→64 + ReLU;
    flatten (1024) + fc 1024→64 + ReLU; fc 64→C. No padding.

    On ``(3, 32, 32)`` with 10 classes: 122,570 parameters, the paper's count. The official
    code's classifier has 16 outputs (``nn.Linear(64, 16)``, 122,960 parameters) although the
    data have 10 classes; this model uses ``num_classes`` outputs. ProgFed's sub-models with
    the temporary heads GAP + fc(32 / 64 / 64 → 10) have 1,226 / 20,042 / 56,970 / 122,570.
    Shapes: (32, 15, 15), (64, 6, 6), (64, 4, 4), (64,), (num_classes,).

    Args:
        input_shape: ``(C, H, W)``; H and W at least 18.
        num_classes: output width.

    Returns:
        The model, with layers ``conv1, conv2, conv3, fc1, fc2``.
    """
    name = "progfed_cifar_cnn"
    if len(input_shape) != 3:
        raise invalid_option(name, "input_shape", f"must be (C, H, W), got {input_shape}")
    if min(_cifar_spatial(s) for s in input_shape[1:]) < 1:
        raise invalid_option(name, "input_shape", f"{input_shape} is too small (H, W >= 18)")
    c, h, w = input_shape
    return ProgfedCifarCNN((c, h, w), num_classes)
