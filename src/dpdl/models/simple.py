"""Logistic regression and a one-hidden-layer MLP on flattened inputs."""

from __future__ import annotations

import math

from torch import nn


def _flat_size(input_shape: tuple[int, ...]) -> int:
    return int(math.prod(input_shape))


class LogisticRegression(nn.Module):
    """A single linear layer on the flattened record: logits = W x + b (softmax / sigmoid is in
    the loss). With 2 classes this is the multinomial form of binary logistic regression."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int):
        super().__init__()
        self.linear = nn.Linear(_flat_size(input_shape), num_outputs)

    def forward(self, x):
        return self.linear(x.flatten(1))


class MLP(nn.Module):
    """Flatten -> Linear(hidden) -> ReLU -> Linear(outputs)."""

    def __init__(self, input_shape: tuple[int, ...], num_outputs: int, hidden: int = 128):
        super().__init__()
        self.hidden = nn.Linear(_flat_size(input_shape), hidden)
        self.output = nn.Linear(hidden, num_outputs)

    def forward(self, x):
        return self.output(self.hidden(x.flatten(1)).relu())
