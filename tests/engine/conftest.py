"""Tiny models, data and topologies for engine tests (independent of dpdl.topology)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from tests.engine.noise_reference import assert_close_up_to_a_grid_step, reference_noisy_sum


class TinyNet(torch.nn.Module):
    def __init__(self, d_in: int = 5, hidden: int = 4, classes: int = 3):
        super().__init__()
        self.fc1 = torch.nn.Linear(d_in, hidden)
        self.fc2 = torch.nn.Linear(hidden, classes)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def tiny_model(seed: int = 0, **kw) -> TinyNet:
    torch.manual_seed(seed)
    return TinyNet(**kw)


def tiny_data(n: int, counts, d_in: int = 5, classes: int = 3, seed: int = 0):
    """Padded (n, J_max, d_in) inputs, (n, J_max) labels, mask with counts[i] real records."""
    rng = np.random.default_rng(seed)
    j_max = max(counts)
    x = rng.normal(size=(n, j_max, d_in)).astype(np.float32) * 3
    y = rng.integers(0, classes, size=(n, j_max))
    mask = np.arange(j_max)[None, :] < np.asarray(counts)[:, None]
    return x, y, mask


class ExpGraph:
    """MATH.md §3 time-varying directed exponential graph: P^k = I/2 + Shift_{2^(k mod m)}/2."""

    def __init__(self, n: int):
        self.n, self.name, self.directed = n, "exp", True
        self.period = (n - 1).bit_length()

    def offset(self, k: int) -> int:
        return 2 ** (k % self.period) % self.n

    def circulant(self, k: int):
        return [(0, 0.5), (self.offset(k), 0.5)]

    def mixing_matrix(self, k: int) -> np.ndarray:
        P = 0.5 * np.eye(self.n)
        s = self.offset(k)
        for i in range(self.n):
            P[(i + s) % self.n, i] += 0.5
        return P


class RandomColumnStochastic:
    """A fixed random column-stochastic matrix with self-loops (not circulant)."""

    def __init__(self, n: int, seed: int = 0):
        rng = np.random.default_rng(seed)
        A = rng.uniform(0.1, 1.0, size=(n, n)) * (rng.uniform(size=(n, n)) < 0.5)
        A += np.eye(n)
        self.P = A / A.sum(axis=0, keepdims=True)
        self.n, self.period, self.name, self.directed = n, 1, "random", True

    def circulant(self, k: int):
        return None

    def mixing_matrix(self, k: int) -> np.ndarray:
        return self.P


@pytest.fixture
def h():
    """The helpers above, for tests (importlib import mode: conftest is not importable)."""
    return SimpleNamespace(
        TinyNet=TinyNet,
        tiny_model=tiny_model,
        tiny_data=tiny_data,
        ExpGraph=ExpGraph,
        RandomColumnStochastic=RandomColumnStochastic,
        reference_noisy_sum=reference_noisy_sum,
        assert_close_up_to_a_grid_step=assert_close_up_to_a_grid_step,
    )
