"""Mixing weights from a graph's adjacency (MATH.md §3, "Weights").

Adjacency convention, shared by the whole package: ``A[i, j]`` is true iff node ``i``
receives from node ``j`` (the edge ``j -> i``), exactly like ``P[i, j] > 0`` for a mixing
matrix. Self-loops are implicit: the diagonal of ``A`` is ignored and every node keeps part
of its own mass (Assumption 1).
"""

from __future__ import annotations

import numpy as np

from dpdl.errors import DPDLError


def _as_adjacency(adjacency: np.ndarray) -> np.ndarray:
    A = np.asarray(adjacency)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise DPDLError(f"an adjacency matrix must be square, got shape {A.shape}")
    if A.dtype != bool and np.any(A < 0):
        raise DPDLError("an adjacency matrix must not have negative entries")
    A = A.astype(bool)
    np.fill_diagonal(A, False)
    return A


def uniform_sender_weights(adjacency: np.ndarray) -> np.ndarray:
    """Column-stochastic weights of a directed graph (MATH.md §3).

    Sender ``j`` splits its mass uniformly over itself and its out-neighbours:
    ``P[i, j] = 1 / (outdeg_j + 1)`` for ``i = j`` or ``j -> i``, else 0.
    """
    A = _as_adjacency(adjacency)
    n = A.shape[0]
    receives = A | np.eye(n, dtype=bool)
    out_degree_plus_self = receives.sum(axis=0)
    return receives / out_degree_plus_self[None, :].astype(np.float64)


def metropolis_hastings_weights(adjacency: np.ndarray) -> np.ndarray:
    """Metropolis–Hastings weights of an undirected graph (MATH.md §3).

    ``W_ij = 1 / (1 + max(d_i, d_j))`` on edges, ``W_ii = 1 - sum_j W_ij``; the result is
    symmetric and doubly stochastic with a positive diagonal.
    """
    A = _as_adjacency(adjacency)
    if not np.array_equal(A, A.T):
        raise DPDLError(
            "Metropolis-Hastings weights need an undirected (symmetric) adjacency matrix"
        )
    degree = A.sum(axis=1)
    W = np.where(A, 1.0 / (1.0 + np.maximum(degree[:, None], degree[None, :])), 0.0)
    np.fill_diagonal(W, 1.0 - W.sum(axis=1))
    return W
