"""Pairwise privacy: an (n, n) matrix whose entry [u, v] is the ε of u's data in v's view,
NaN where it is undefined (the diagonal). Network DP (per walk), PN-f-DP and its RDP baseline
(per graph) all report one; the summary statistics are computed here once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["PairwiseEpsilon"]


@dataclass(frozen=True)
class PairwiseEpsilon:
    """The matrix and its δ; ``mean`` / ``best`` / ``worst`` over the defined pairs."""

    epsilon: np.ndarray
    delta: float

    def defined(self) -> np.ndarray:
        """The defined entries (off the diagonal, not NaN), flattened."""
        values = np.asarray(self.epsilon, dtype=float)
        return values[~np.isnan(values)]

    @property
    def mean(self) -> float:
        return float(self.defined().mean())

    @property
    def best(self) -> float:
        return float(self.defined().min())

    @property
    def worst(self) -> float:
        return float(self.defined().max())

    @property
    def worst_pair(self) -> tuple[int, int]:
        """(u, v) of the worst pair: u's data, v's view."""
        flat = int(np.nanargmax(self.epsilon))
        return flat // self.epsilon.shape[1], flat % self.epsilon.shape[1]
