"""CIFAR ResNet-20 with GroupNorm (``resnet20``).

He et al., "Deep Residual Learning for Image Recognition", CVPR 2016, Section 4.2: a 3x3 stem
with 16 channels, then 3 stages of n = 3 basic blocks with 16 / 32 / 64 channels (the first block
of stages 2 and 3 has stride 2), global average pooling and a linear classifier (6n + 2 = 20
layers). BatchNorm is replaced by GroupNorm, as in Reddi et al., "Adaptive Federated
Optimization", ICLR 2021 (and Hsieh et al., ICML 2020): BatchNorm's running statistics are
buffers that FedAvg does not average well, and fedcomm models hold no buffers at all.

Module names follow the torchvision convention (``conv1, norm1, layer1 … layer3, fc``; inside
a block ``conv1, norm1, conv2, norm2, shortcut``) so that ProgFed's stage splits can address
``layer1``, ``layer2``, ``layer3`` directly.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from fedcomm.models.registry import invalid_option, positive_int, register

Shortcut = Literal["A", "B"]

STAGE_WIDTHS = (16, 32, 64)


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
    """CIFAR ResNet of depth 6n + 2 (``blocks_per_stage`` = n) with GroupNorm."""

    def __init__(
        self,
        in_channels: int,
        num_classes: int,
        *,
        blocks_per_stage: int,
        groups: int,
        shortcut: Shortcut,
    ) -> None:
        super().__init__()
        w1, w2, w3 = STAGE_WIDTHS
        n = blocks_per_stage
        self.conv1 = nn.Conv2d(in_channels, w1, 3, 1, padding=1, bias=False)
        self.norm1 = nn.GroupNorm(groups, w1)
        self.layer1 = self._stage(w1, w1, 1, n, groups, shortcut)
        self.layer2 = self._stage(w1, w2, 2, n, groups, shortcut)
        self.layer3 = self._stage(w2, w3, 2, n, groups, shortcut)
        self.fc = nn.Linear(w3, num_classes)
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
        # Shapes for (3, 32, 32) inputs.
        x = F.relu(self.norm1(self.conv1(x)))  # (B, 16, 32, 32)
        x = self.layer1(x)  # (B, 16, 32, 32)
        x = self.layer2(x)  # (B, 32, 16, 16)
        x = self.layer3(x)  # (B, 64, 8, 8)
        x = x.mean(dim=(2, 3))  # (B, 64)
        return self.fc(x)  # (B, num_classes)


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
    BatchNorm; ``groups=2`` follows Reddi et al., ICLR 2021, as recommended for FedSparse's
    CIFAR-100 runs (specs/fedsparse-fedbiad.md §1.9). Convolutions have no bias (each is
    followed by a norm) and use He-normal (fan-out) init.

    Shortcuts where the shape changes (first block of stages 2 and 3):

    - ``"B"`` (default): 1x1 strided convolution + GroupNorm projection. 272,474 parameters
      for 10 classes, 278,324 for 100.
    - ``"A"``: parameter-free subsampling + zero channel padding, He et al.'s CIFAR choice.
      269,722 parameters for 10 classes, 275,572 for 100: the "~275.6k" FedSparse reports
      for CIFAR-100, so use ``"A"`` to match that paper's communication numbers.

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
    return ResNet(input_shape[0], num_classes, blocks_per_stage=3, groups=groups, shortcut=shortcut)
