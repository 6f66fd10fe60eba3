"""ResNet-18 with GroupNorm instead of BatchNorm (He et al. 2016; GroupNorm: Wu & He 2018),
the standard choice for DP-SGD because BatchNorm mixes records and breaks per-record clipping
(MATH.md §4). CIFAR-style stem: one 3×3 convolution, stride 1, no max-pool."""

from __future__ import annotations

from torch import nn

from dpdl.errors import DPDLError


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(groups, channels), channels)


class BasicBlock(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, stride: int, groups: int):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.norm1 = _norm(out_channels, groups)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.norm2 = _norm(out_channels, groups)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                _norm(out_channels, groups),
            )

    def forward(self, x):
        out = self.norm1(self.conv1(x)).relu()
        out = self.norm2(self.conv2(out))
        return (out + self.shortcut(x)).relu()


class ResNet18GN(nn.Module):
    """ResNet-18 (BasicBlock ×[2, 2, 2, 2], widths 64·[1, 2, 4, 8]) with GroupNorm(32)."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_outputs: int,
        groups: int = 32,
        width: int = 64,
    ):
        super().__init__()
        if len(input_shape) != 3:
            raise DPDLError(
                f"resnet18-gn needs image inputs (C, H, W), got input_shape {input_shape}"
            )
        if groups < 1 or width % min(groups, width) != 0:
            raise DPDLError(f"resnet18-gn: width {width} must be divisible by groups {groups}")
        self.stem = nn.Sequential(
            nn.Conv2d(input_shape[0], width, 3, 1, 1, bias=False), _norm(width, groups), nn.ReLU()
        )
        blocks, in_channels = [], width
        for stage, stride in enumerate((1, 2, 2, 2)):
            out_channels = width * 2**stage
            blocks += [BasicBlock(in_channels, out_channels, stride, groups),
                       BasicBlock(out_channels, out_channels, 1, groups)]
            in_channels = out_channels
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_channels, num_outputs)

    def forward(self, x):
        return self.fc(self.pool(self.blocks(self.stem(x))).flatten(1))
