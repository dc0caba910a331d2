"""The ResNet pieces :mod:`gssgd.train.models` and :mod:`gssgd.train.models_wide` share.

A residual block with GroupNorm in place of BatchNorm (no running statistics: see
:mod:`gssgd.train.models`) and the convolutional trunk built from it. Both model modules
import from here, so neither imports the other's internals (``models`` imports
``models_wide``, never the reverse).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["BasicBlock", "resnet_trunk"]


def _group_norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, channels), channels)


class BasicBlock(nn.Module):
    """He et al.'s two-conv residual block, GroupNorm in place of BatchNorm.

    ``out = relu(norm(conv(relu(norm(conv(x))))) + shortcut(x))``; the shortcut is a
    strided 1x1 conv + norm when the stride or the width changes, else identity.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride=stride, padding=1, bias=False)
        self.norm1 = _group_norm(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1, bias=False)
        self.norm2 = _group_norm(out_channels)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride=stride, bias=False),
                _group_norm(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C_in, H, W) -> (B, C_out, H / stride, W / stride)``."""
        out = torch.relu(self.norm1(self.conv1(x)))
        out = self.norm2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def resnet_trunk(in_channels: int, widths: tuple[int, ...]) -> tuple[nn.Sequential, nn.Sequential, int]:
    """The convolutional trunk the ResNets here share.

    A stem (3x3 conv, GroupNorm, ReLU) to ``widths[0]`` channels, then one BasicBlock per
    width, the first at stride 1 and the others at stride 2.

    Returns:
        ``(stem, blocks, channels out)``.
    """
    stem = nn.Sequential(
        nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
        _group_norm(widths[0]),
        nn.ReLU(),
    )
    blocks = []
    width = widths[0]
    for i, w in enumerate(widths):
        blocks.append(BasicBlock(width, w, stride=1 if i == 0 else 2))
        width = w
    return stem, nn.Sequential(*blocks), width
