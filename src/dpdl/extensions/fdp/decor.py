"""DECOR: decentralized SGD with pairwise-cancelling correlated noise (MATH.md §7).

Each step every node i
  1. draws a mini-batch, computes per-record gradients of a softmax (multinomial logistic)
     regression, clips each to norm C and averages them, so ‖g_i‖ ≤ C;
  2. shares x_i − η(g_i + z_i + Σ_{j∈N(i)} v_ij) with z_i ~ N(0, σ²I) and pairwise secrets
     v_ij = −v_ji ~ N(0, σ_cor² I), one per edge and step;
  3. replaces its model by the W-weighted average of what its neighbours shared.

The secrets cancel in the network sum (Σ_i Σ_j v_ij = 0 exactly, as every edge contributes
+v and −v), so the network average moves as if only the independent noise z were present,
while every single share carries σ² + deg(i)·σ_cor² of noise. The privacy of this is
:mod:`dpdl.extensions.fdp.decor_accounting` (Sec-LDP / Sec-f-LDP); the simulation here is vectorized
over nodes (numpy), and each step is a handful of batched array operations.

The model is kept as stacked parameters θ of shape (n, D+1, K) (bias row last).

The mini-batches, the noise z and the secrets v are secret randomness: they come from
``seed`` (None, the default: OS entropy; a Generator or SeedSequence: an experiment's
cell stream; an int: reproducible, for tests and research only).  In a deployment the two
ends of an edge would agree on v_ij by a key exchange; here one secret stream draws them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from dpdl.algorithms.noise import release_numpy, secret_normals
from dpdl.algorithms.randomness import Randomness, check_noise_std, secret_rng
from dpdl.errors import require

__all__ = [
    "edge_list",
    "pairwise_secrets",
    "softmax_per_record_gradients",
    "clipped_mean_gradient",
    "softmax_loss_accuracy",
    "sample_batches",
    "DecorResult",
    "RunOptions",
    "run_decor",
]


def edge_list(mixing: ArrayLike) -> np.ndarray:
    """Undirected edges (i < j) of a symmetric mixing/adjacency matrix, shape (E, 2)."""
    M = np.asarray(mixing, dtype=float)
    require(M.ndim == 2 and M.shape[0] == M.shape[1], f"matrix must be square, got {M.shape}")
    require(np.allclose(M, M.T, atol=1e-12), "DECOR needs an undirected graph (symmetric W)")
    i, j = np.nonzero(np.triu(M != 0, k=1))
    return np.stack([i, j], axis=1)


def pairwise_secrets(edges: np.ndarray, n: int, dim: int, sigma_cor: float,
                     rng: np.random.Generator) -> np.ndarray:
    """Σ_{j∈N(i)} v_ij for every node, shape (n, dim): v ~ N(0, σ_cor² I) drawn per edge,
    added with + at its first end and − at its second, so the columns sum to 0 (to the
    rounding of float64 sums).  The secrets are never released on their own: they enter each
    node's exact release as part of its centre (:func:`run_decor`, MATH.md §10)."""
    require(sigma_cor >= 0, f"sigma_cor must be >= 0, got {sigma_cor!r}")
    out = np.zeros((n, dim))
    if sigma_cor == 0 or len(edges) == 0:
        return out
    secrets = secret_normals(rng, (len(edges), dim), sigma_cor)
    np.add.at(out, edges[:, 0], secrets)
    np.add.at(out, edges[:, 1], -secrets)
    return out


def _with_bias(x: np.ndarray) -> np.ndarray:
    return np.concatenate([x, np.ones((*x.shape[:-1], 1), dtype=x.dtype)], axis=-1)


def softmax_per_record_gradients(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-record gradients of the cross-entropy of a softmax regression, in closed form.

    theta (n, D+1, K), x (n, b, D), y (n, b) integer labels → (n, b, D+1, K):
    ∇_θ ℓ = x̃ ⊗ (softmax(x̃θ) − onehot(y)) with x̃ = [x, 1].
    """
    xb = _with_bias(x)
    logits = np.einsum("nbd,ndk->nbk", xb, theta)
    logits -= logits.max(axis=-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=-1, keepdims=True)
    probs[np.arange(y.shape[0])[:, None], np.arange(y.shape[1])[None, :], y] -= 1.0
    return xb[..., :, None] * probs[..., None, :]


def clipped_mean_gradient(per_record: np.ndarray, clip: float) -> np.ndarray:
    """Clip every record's gradient to norm ``clip`` and average over the batch: (n, D+1, K).
    The result has norm ≤ clip, the bound DECOR's accounting relies on."""
    require(math.isfinite(clip) and clip > 0, f"clip must be > 0, got {clip!r}")
    norms = np.sqrt(np.sum(per_record**2, axis=(-2, -1), keepdims=True))
    scale = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return np.mean(per_record * scale, axis=1)


def softmax_loss_accuracy(theta: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of one model θ (D+1, K) on (x, y)."""
    logits = _with_bias(x.reshape(len(x), -1)) @ theta
    logits -= logits.max(axis=1, keepdims=True)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    loss = float(-np.mean(log_probs[np.arange(len(y)), y]))
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y))
    return loss, accuracy


def sample_batches(mask: np.ndarray, batch_size: int, rng: np.random.Generator) -> np.ndarray:
    """Per node, ``batch_size`` distinct valid record slots drawn uniformly: (n, b) indices."""
    n, J = mask.shape
    sizes = mask.sum(axis=1)
    require(int(sizes.min()) >= batch_size >= 1,
            f"batch_size {batch_size} must be in [1, smallest node size {int(sizes.min())}]")
    keys = rng.random((n, J))
    keys[~mask] = np.inf
    return np.argpartition(keys, batch_size - 1, axis=1)[:, :batch_size]


@dataclass
class DecorResult:
    theta: np.ndarray                    # final stacked parameters (n, D+1, K)
    history: list[dict] = field(default_factory=list)  # step, loss, accuracy of the average
    secret_sum_max: float = 0.0          # max over steps of |Σ_i secrets_i| (≈ 0)

    @property
    def average(self) -> np.ndarray:
        return self.theta.mean(axis=0)


@dataclass(frozen=True)
class RunOptions:
    """How a training run is driven, not what it computes (shared by :func:`run_decor` and
    :func:`dpdl.extensions.fdp.experiment.random_walk_dp_sgd`): the secret ``seed`` (a
    Generator/SeedSequence, None for OS entropy, or an int), an evaluation on ``eval_data``
    every ``eval_every`` steps (0: none), a tqdm ``progress`` bar, and ``unsafe_zero_noise``,
    which allows σ = 0 (not private)."""

    seed: Randomness = None
    eval_every: int = 0
    eval_data: tuple | None = None
    progress: bool = False
    unsafe_zero_noise: bool = False


def run_decor(mixing: ArrayLike, x_nodes: np.ndarray, y_nodes: np.ndarray, *,
              num_classes: int, steps: int, lr: float, clip: float, sigma: float,
              sigma_cor: float, batch_size: int = 1, mask: np.ndarray | None = None,
              options: RunOptions = RunOptions()) -> DecorResult:
    """Run DECOR (MATH.md §7) for ``steps`` steps on stacked node data.

    ``mixing`` is the symmetric doubly stochastic W (undirected graph); x_nodes (n, J, ...),
    y_nodes (n, J) integer labels, ``mask`` (n, J) marks real records (all by default).
    ``sigma`` > 0 is required: σ = 0 (with sigma_cor = 0, the non-private baseline, still
    clipped) needs ``unsafe_zero_noise=True``, and is not private.  sigma_cor = 0 alone is
    plain DP decentralized SGD.  ``options`` carries the seed, evaluation, progress bar and
    ``unsafe_zero_noise`` (:class:`RunOptions`).
    """
    seed, eval_every, eval_data = options.seed, options.eval_every, options.eval_data
    progress, unsafe_zero_noise = options.progress, options.unsafe_zero_noise
    W = np.asarray(mixing, dtype=float)
    n = W.shape[0]
    edges = edge_list(W)
    require(np.allclose(W.sum(axis=0), 1.0) and np.allclose(W.sum(axis=1), 1.0),
            "DECOR's W must be doubly stochastic")
    x_nodes = np.asarray(x_nodes, dtype=np.float64).reshape(n, x_nodes.shape[1], -1)
    y_nodes = np.asarray(y_nodes, dtype=np.int64)
    require(x_nodes.shape[0] == n and y_nodes.shape == x_nodes.shape[:2],
            f"node data shapes {x_nodes.shape}, {y_nodes.shape} do not match n={n}")
    mask = np.ones(y_nodes.shape, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    require(isinstance(steps, int) and steps >= 1,
            f"steps must be a positive integer, got {steps!r}")
    require(math.isfinite(lr) and lr > 0, f"lr must be > 0, got {lr!r}")
    sigma = check_noise_std(sigma, unsafe_zero_noise)
    require(math.isfinite(sigma_cor) and sigma_cor >= 0,
            f"sigma_cor must be a finite number >= 0, got {sigma_cor!r}")
    rng = secret_rng(seed)
    dim_in = x_nodes.shape[2]
    theta = np.zeros((n, dim_in + 1, num_classes))
    flat = theta[0].size
    result = DecorResult(theta=theta)
    node_index = np.arange(n)[:, None]
    iterator = range(steps)
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, desc="decor", leave=False, disable=None)  # off outside a tty
    for step in iterator:
        batch = sample_batches(mask, batch_size, rng)
        grads = softmax_per_record_gradients(theta, x_nodes[node_index, batch],
                                             y_nodes[node_index, batch])
        g = clipped_mean_gradient(grads, clip).reshape(n, flat)
        secrets = pairwise_secrets(edges, n, flat, sigma_cor, rng)
        result.secret_sum_max = max(result.secret_sum_max, float(np.abs(secrets.sum(0)).max()))
        # each node's noisy update released exactly: round_g(g + secrets + σN) (MATH.md §10)
        shared = theta.reshape(n, flat) - lr * release_numpy(g + secrets, sigma, rng)
        theta = (W @ shared).reshape(theta.shape)
        if eval_data is not None and eval_every and ((step + 1) % eval_every == 0
                                                     or step + 1 == steps):
            loss, acc = softmax_loss_accuracy(theta.mean(axis=0), *eval_data)
            result.history.append({"step": step + 1, "loss": loss, "accuracy": acc})
    result.theta = theta
    return result
