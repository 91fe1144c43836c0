"""CIFAR ResNets with GroupNorm: ``resnet20`` and ``resnet18``.

``resnet20``: He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, Section 4.2:
a 3x3 stem with 16 channels, then 3 stages of n = 3 basic blocks with 16 / 32 / 64 channels (the
first block of stages 2 and 3 has stride 2), global average pooling and a linear classifier
(6n + 2 = 20 layers). BatchNorm is replaced by GroupNorm, as in Reddi et al., "Adaptive Federated
Optimization", ICLR 2021 (and Hsieh et al., ICML 2020): BatchNorm's running statistics are
buffers that FedAvg does not average well, and fedcomm models hold no buffers at all.

``resnet18``: the CIFAR ResNet-18 of ProgFed (Wang et al., ICML 2022; code
a514514772/ProgFed ``models/resnet.py``, after weiaicunzai/pytorch-cifar100): a 3x3 stem to 64
channels without max-pool, 4 stages of 2 basic blocks with 64 / 128 / 256 / 512 channels, 1x1
projection shortcuts, GroupNorm(2, C) instead of BatchNorm.

Module names follow the torchvision convention (``conv1, norm1, layer1 … layerK, fc``; inside
a block ``conv1, norm1, conv2, norm2, shortcut``) so that ProgFed's stage splits can address the
layers directly. Both are staged (``fedcomm.models.progressive``): the units are the stem
(``conv1`` + ``norm1`` + ReLU) and then every block ``layer{i}.{j}``; the classifier is global
average pooling + ``fc``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedcomm.models.progressive import Unit, table_cuts
from fedcomm.models.registry import invalid_option, positive_int, register

Shortcut = Literal["A", "B"]

STAGE_WIDTHS = (16, 32, 64)
RESNET18_WIDTHS = (64, 128, 256, 512)

# ProgFed's stage splits as cumulative unit counts (unit 1 = stem, then one unit per block).
RESNET20_STAGES: dict[int, tuple[int, ...]] = {
    1: (10,),
    2: (7, 10),  # [stem + layer1 + layer2 | layer3]
    3: (4, 7, 10),  # [stem + layer1 | layer2 | layer3]
}
RESNET18_STAGES: dict[int, tuple[int, ...]] = {
    1: (9,),
    2: (7, 9),  # [stem + conv2_x .. conv4_x | conv5_x]
    3: (3, 7, 9),  # [stem + conv2_x | conv3_x + conv4_x | conv5_x]
    4: (3, 5, 7, 9),  # the paper's: [stem + conv2_x | conv3_x | conv4_x | conv5_x]
    8: (2, 3, 4, 5, 6, 7, 8, 9),  # half-layer splits (stem rides with layer1.0)
}


class PadShortcut(nn.Module):
    """He et al.'s option A: subsample by ``stride`` and zero-pad the new channels (no params)."""

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        extra = out_channels - in_channels
        self.pad = (extra // 2, extra - extra // 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, :, :: self.stride, :: self.stride]  # (B, C_in, H/s, W/s)
        return F.pad(x, (0, 0, 0, 0, *self.pad))  # (B, C_out, H/s, W/s)


class BasicBlock(nn.Module):
    """conv3x3-GN-ReLU-conv3x3-GN, plus the shortcut, then ReLU."""

    def __init__(
        self, in_channels: int, out_channels: int, stride: int, groups: int, shortcut: Shortcut
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = (
                PadShortcut(in_channels, out_channels, stride)
                if shortcut == "A"
                else nn.Sequential(
                    nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                    nn.GroupNorm(groups, out_channels),
                )
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(self.conv1(x)))  # (B, C_out, H/s, W/s)
        out = self.norm2(self.conv2(out))  # (B, C_out, H/s, W/s)
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """CIFAR ResNet with GroupNorm: stem, ``len(widths)`` stages of basic blocks, GAP + fc.

    Args:
        in_channels: input channels.
        num_classes: output width.
        widths: channels of each stage (the stem has ``widths[0]``).
        blocks: basic blocks per stage.
        groups: GroupNorm groups.
        shortcut: ``"A"`` (zero-pad) or ``"B"`` (1x1 conv + GN) where the shape changes.
        he_init: He-normal (fan-out) init of the convolutions; PyTorch's default otherwise.
        stage_table: the named stage splits (cumulative unit counts) by S.
        default_stages: S when none is given.
    """

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        *,
        widths: Sequence[int],
        blocks: Sequence[int],
        groups: int,
        shortcut: Shortcut,
        he_init: bool,
        stage_table: Mapping[int, tuple[int, ...]],
        default_stages: int,
    ) -> None:
        super().__init__()
        self.widths = tuple(widths)
        self.blocks = tuple(blocks)
        self.stage_table = dict(stage_table)
        self.default_stages = default_stages
        self.classifier_prefixes: tuple[str, ...] = ("fc.",)
        self.conv1 = nn.Conv2d(in_channels, widths[0], 3, 1, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, widths[0])
        c_in = widths[0]
        for i, (c_out, n) in enumerate(zip(widths, blocks, strict=True), 1):
            stride = 1 if i == 1 else 2
            self.add_module(f"layer{i}", self._stage(c_in, c_out, stride, n, groups, shortcut))
            c_in = c_out
        self.fc = nn.Linear(widths[-1], num_classes)
        if he_init:
            for m in self.modules():
                if isinstance(m, nn.Conv2d):  # He init, as in torchvision's ResNet
                    nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    @staticmethod
    def _stage(
        c_in: int, c_out: int, stride: int, n: int, groups: int, shortcut: Shortcut
    ) -> nn.Sequential:
        blocks = [BasicBlock(c_in, c_out, stride, groups, shortcut)]
        blocks += [BasicBlock(c_out, c_out, 1, groups, shortcut) for _ in range(n - 1)]
        return nn.Sequential(*blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Shapes for resnet20 on (3, 32, 32); resnet18 has 64 / 128 / 256 / 512 channels.
        x = self._stem(x)  # (B, 16, 32, 32)
        for i in range(1, len(self.widths) + 1):
            x = getattr(self, f"layer{i}")(x)  # (B, 16, 32, 32), (B, 32, 16, 16), (B, 64, 8, 8)
        return self.classify(x)  # (B, num_classes)

    def _stem(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm1(self.conv1(x)))  # (B, widths[0], H, W)

    def units(self) -> list[Unit]:
        """The stem, then every basic block ``layer{i}.{j}`` in forward order."""
        out = [Unit("stem", ("conv1.", "norm1."), self.widths[0], self._stem)]
        for i, (width, n) in enumerate(zip(self.widths, self.blocks, strict=True), 1):
            layer = getattr(self, f"layer{i}")
            out += [Unit(f"layer{i}.{j}", (f"layer{i}.{j}.",), width, layer[j]) for j in range(n)]
        return out

    def classify(self, h: torch.Tensor) -> torch.Tensor:
        """Global average pooling, then ``fc``."""
        out: torch.Tensor = self.fc(h.mean(dim=(2, 3)))  # (B, num_classes)
        return out

    def stage_cuts(self, stages: int) -> list[int]:
        """The table's split for S if listed, else ``even_cuts`` over the units."""
        return table_cuts(self.stage_table, 1 + sum(self.blocks), stages)


@register("resnet20")
def resnet20(
    *,
    input_shape: tuple[int, ...],
    num_classes: int,
    groups: int = 2,
    shortcut: Shortcut = "B",
) -> ResNet:
    """ResNet-20 for CIFAR with GroupNorm(``groups``) after every convolution.

    He et al., CVPR 2016 (Section 4.2), with GroupNorm (Wu & He, ECCV 2018) in place of
    BatchNorm; ``groups=2`` follows Reddi et al., ICLR 2021, whose CIFAR-100 benchmark FedSparse
    uses (Louizos et al., Section 5; the norm is not named). Convolutions have no bias (each is
    followed by a norm) and use He-normal (fan-out) init.

    Shortcuts where the shape changes (first block of stages 2 and 3):

    - ``"B"`` (default): 1x1 strided convolution + GroupNorm projection. 272,474 parameters
      for 10 classes, 278,324 for 100.
    - ``"A"``: parameter-free subsampling + zero channel padding, He et al.'s CIFAR choice.
      269,722 parameters for 10 classes, 275,572 for 100: the "~275.6k" FedSparse reports
      for CIFAR-100, so use ``"A"`` to match that paper's communication numbers.

    Staged: 10 units (stem, ``layer1.0`` … ``layer3.2``); ``default_stages=3`` with
    [stem + layer1 | layer2 | layer3]; S = 2 is [stem + layer1 + layer2 | layer3]; other S
    ``even_cuts``.

    Args:
        input_shape: ``(C, H, W)``; any H, W >= 1 (global pooling), CIFAR is ``(3, 32, 32)``.
        num_classes: output width.
        groups: GroupNorm groups; must divide 16 (so also 32 and 64).
        shortcut: ``"A"`` or ``"B"``, see above.

    Returns:
        The model.
    """
    if len(input_shape) != 3:
        raise invalid_option("resnet20", "input_shape", f"must be (C, H, W), got {input_shape}")
    if STAGE_WIDTHS[0] % positive_int("resnet20", "groups", groups) != 0:
        raise invalid_option("resnet20", "groups", f"must divide {STAGE_WIDTHS[0]}, got {groups}")
    if shortcut not in ("A", "B"):
        raise invalid_option("resnet20", "shortcut", f"must be 'A' or 'B', got {shortcut!r}")
    return ResNet(
        input_shape[0],
        num_classes,
        widths=STAGE_WIDTHS,
        blocks=(3, 3, 3),
        groups=groups,
        shortcut=shortcut,
        he_init=True,
        stage_table=RESNET20_STAGES,
        default_stages=3,
    )


@register("resnet18")
def resnet18(*, input_shape: tuple[int, ...], num_classes: int, groups: int = 2) -> ResNet:
    """CIFAR ResNet-18 with GroupNorm(``groups``), ProgFed's CIFAR-100 model.

    Wang et al., "ProgFed: Effective, Communication, and Computation Efficient Federated
    Learning by Progressive Training", ICML 2022, App. B; code a514514772/ProgFed
    ``models/resnet.py`` (``resnet18``, CIFAR stem) with GroupNorm(2, C) in place of BatchNorm
    (App. B: "batch norm are replaced with group norm"). A 3x3 stem to 64 channels (no
    max-pool), layers 1–4 of two basic blocks with 64 / 128 / 256 / 512 channels (stride 2 in
    the first block of layers 2–4, with a 1x1 conv + GN projection shortcut), global average
    pooling and ``fc``.
    11,220,132 parameters for 100 classes (11,173,962 for 10). Convolutions have no bias and
    PyTorch's default init (as the official code).

    Staged: 9 units (stem, ``layer1.0``, ``layer1.1``, …, ``layer4.1``); ``default_stages=4``:
    E1 = stem + conv2_x (layer1), E2 = layer2, E3 = layer3, E4 = layer4; sub-model sizes with
    C = 100 are 156,324 / 688,292 / 2,800,804 / 11,220,132. S = 2, 3 and 8 use the paper's
    splits (``RESNET18_STAGES``), other S ``even_cuts``.

    Shapes on ``(3, 32, 32)``: (64, 32, 32) after the stem and layer1, (128, 16, 16),
    (256, 8, 8), (512, 4, 4), then (num_classes,). ProgFed trains CIFAR-100 on 24x24 crops.

    Args:
        input_shape: ``(C, H, W)``; any H, W >= 1 (global pooling).
        num_classes: output width.
        groups: GroupNorm groups; must divide 64.

    Returns:
        The model.
    """
    name = "resnet18"
    if len(input_shape) != 3:
        raise invalid_option(name, "input_shape", f"must be (C, H, W), got {input_shape}")
    if RESNET18_WIDTHS[0] % positive_int(name, "groups", groups) != 0:
        raise invalid_option(name, "groups", f"must divide {RESNET18_WIDTHS[0]}, got {groups}")
    return ResNet(
        input_shape[0],
        num_classes,
        widths=RESNET18_WIDTHS,
        blocks=(2, 2, 2, 2),
        groups=groups,
        shortcut="B",
        he_init=False,
        stage_table=RESNET18_STAGES,
        default_stages=4,
    )
