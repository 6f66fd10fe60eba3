"""The shallow CNN of the Dyn-D2P experiments (MATH.md §4): two conv + two fully connected
layers, no normalisation layer (per-record clipping needs none)."""

from __future__ import annotations

import torch
from torch import nn

from dpdl.errors import DPDLError


class ShallowCNN(nn.Module):
    """conv(C→c1, 5, pad 2)+ReLU+maxpool2 → conv(c1→c2, 5, pad 2)+ReLU+maxpool2 → fc(hidden)
    +ReLU → fc(outputs). "Same" padding keeps it valid for 8×8 digits as well as 28×28
    Fashion-MNIST; the flatten size is found with a dummy forward pass."""

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_outputs: int,
        channels: tuple[int, int] = (16, 32),
        hidden: int = 64,
    ):
        super().__init__()
        if len(input_shape) != 3:
            raise DPDLError(f"cnn needs image inputs (C, H, W), got input_shape {input_shape}")
        in_channels, height, width = input_shape
        if min(height, width) < 4:
            raise DPDLError(
                f"cnn needs images at least 4x4 (two 2x2 poolings), got {height}x{width}"
            )
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, channels[0], kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(channels[0], channels[1], kernel_size=5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        with torch.no_grad():
            flat = self.features(torch.zeros(1, *input_shape)).flatten(1).shape[1]
        self.fc1 = nn.Linear(flat, hidden)
        self.fc2 = nn.Linear(hidden, num_outputs)

    def forward(self, x):
        return self.fc2(self.fc1(self.features(x).flatten(1)).relu())
