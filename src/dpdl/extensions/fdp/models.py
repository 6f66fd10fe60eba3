"""The token's model in random-walk DP-SGD (MATH.md §7): softmax regression or a one-hidden-
layer ReLU network, numpy, with per-record gradients in closed form.

Why the model matters to privacy here. The PN-f-DP bound (Lemma 4.3 of seed 003) and the RDP
baseline of Cyffers et al. 2024 are *amplification by iteration*: node i's record is hidden
by the noise of the t hops between i and the observer j only if each hop's noiseless update
θ ↦ θ − η·ḡ(θ) is non-expansive (1-Lipschitz). ``hop_map_gap`` says, for the settings of a
run, why that is not proven (None when it is):

* softmax regression with records of L2 norm ≤ R (bias feature 1 added) is convex and
  L-smooth with L = ½(R² + 1) (the softmax cross-entropy's Hessian in the logits is
  diag(p) − ppᵀ ⪯ ½ I), and its per-record gradient x̃ ⊗ (p − e_y) has norm ≤ √(2(R² + 1)).
  With C at least that, clipping never acts, so the step is a gradient step of a convex
  L-smooth function: non-expansive for η ≤ 2/L. A clip below it is *not* enough: clipping
  the softmax gradient makes the step expansive (found at η L = 0.17, expansion 1.0012), so
  the proof needs the clip to be idle.
* a neural network is not convex: its hop map is not non-expansive, and only the local-DP
  accountant (each contribution seen as is) holds for it.

The initial model is public (zeros, or a seeded initialisation anyone can redo).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dpdl.errors import require

__all__ = ["SoftmaxRegression", "MLP", "make_model", "MODELS", "MODEL_CLASSES"]

MODELS = ("softmax", "mlp")


@dataclass(frozen=True)
class SoftmaxRegression:
    """θ of shape (D + 1, K), bias row last (the layout DECOR shares)."""

    features: int
    classes: int

    def initial(self) -> np.ndarray:
        return np.zeros((self.features + 1, self.classes))

    def clipped_mean_gradient(self, theta, x, y, clip: float) -> np.ndarray:
        from dpdl.extensions.fdp.decor import clipped_mean_gradient, softmax_per_record_gradients

        grads = softmax_per_record_gradients(theta[None], x[None], y[None])
        return clipped_mean_gradient(grads, clip)[0]

    def loss_accuracy(self, theta, x, y) -> tuple[float, float]:
        from dpdl.extensions.fdp.decor import softmax_loss_accuracy

        return softmax_loss_accuracy(theta, x, y)

    @staticmethod
    def hop_map_gap(*, lr: float, clip: float, row_norm: float | None) -> str | None:
        """Why θ ↦ θ − η·ḡ(θ) is not proven non-expansive (None: it is), R = ``row_norm``."""
        if row_norm is None:
            return ("the records have no public norm bound (set data.normalize_rows = true), "
                    "so no smoothness constant is known")
        lipschitz = math.sqrt(2 * (row_norm**2 + 1))
        smoothness = (row_norm**2 + 1) / 2
        if clip < lipschitz:  # gradients are strictly below the bound: a clip at it never acts
            return (f"privacy.clip = {clip:g} is below the gradient bound "
                    f"sqrt(2(R^2+1)) = {lipschitz:.4g}: clipping the softmax gradient makes "
                    "the step expansive")
        if lr > 2 / smoothness:
            return (f"train.lr = {lr:g} exceeds 2/L = {2 / smoothness:.4g} "
                    f"(L = (R^2+1)/2 = {smoothness:.4g}): the step is expansive")
        return None


@dataclass(frozen=True)
class MLP:
    """One hidden ReLU layer: logits = relu(x W1 + b1) W2 + b2, θ a flat vector
    [W1 (D×H), b1 (H), W2 (H×K), b2 (K)]. He-initialised from ``init_seed`` (public)."""

    features: int
    classes: int
    hidden: int = 64
    init_seed: int = 0

    @property
    def size(self) -> int:
        D, H, K = self.features, self.hidden, self.classes
        return D * H + H + H * K + K

    def _split(self, theta: np.ndarray):
        D, H, K = self.features, self.hidden, self.classes
        w1, b1, w2, b2 = np.split(theta, np.cumsum([D * H, H, H * K]))
        return w1.reshape(D, H), b1, w2.reshape(H, K), b2

    def initial(self) -> np.ndarray:
        rng = np.random.default_rng(self.init_seed)  # public: the initial model is public
        D, H, K = self.features, self.hidden, self.classes
        w1 = rng.standard_normal((D, H)) * math.sqrt(2 / D)
        w2 = rng.standard_normal((H, K)) * math.sqrt(1 / H)
        return np.concatenate([w1.ravel(), np.zeros(H), w2.ravel(), np.zeros(K)])

    def _forward(self, theta, x):
        w1, b1, w2, b2 = self._split(theta)
        pre = x @ w1 + b1
        hidden = np.maximum(pre, 0.0)
        return pre, hidden, hidden @ w2 + b2

    def per_record_gradients(self, theta, x, y) -> np.ndarray:
        """(b, P): the cross-entropy's gradient of every record, by backpropagation."""
        w2 = self._split(theta)[2]
        pre, hidden, logits = self._forward(theta, x)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        probs[np.arange(len(y)), y] -= 1.0                  # dℓ/dlogits
        back = (probs @ w2.T) * (pre > 0)                   # dℓ/dpre
        b = len(y)
        return np.concatenate([
            (x[:, :, None] * back[:, None, :]).reshape(b, -1), back,
            (hidden[:, :, None] * probs[:, None, :]).reshape(b, -1), probs], axis=1)

    def clipped_mean_gradient(self, theta, x, y, clip: float) -> np.ndarray:
        require(math.isfinite(clip) and clip > 0, f"clip must be > 0, got {clip!r}")
        grads = self.per_record_gradients(theta, x, y)
        norms = np.sqrt(np.sum(grads**2, axis=1, keepdims=True))
        return np.mean(grads * np.minimum(1.0, clip / np.maximum(norms, 1e-300)), axis=0)

    def loss_accuracy(self, theta, x, y) -> tuple[float, float]:
        logits = self._forward(theta, x.reshape(len(x), -1))[2]
        logits = logits - logits.max(axis=1, keepdims=True)
        log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        loss = float(-np.mean(log_probs[np.arange(len(y)), y]))
        return loss, float(np.mean(np.argmax(logits, axis=1) == y))

    @staticmethod
    def hop_map_gap(*, lr: float, clip: float, row_norm: float | None) -> str | None:
        return ("a neural network's loss is not convex, so its step is not non-expansive "
                "(only the local accountant holds for it)")


MODEL_CLASSES = {"softmax": SoftmaxRegression, "mlp": MLP}


def make_model(name: str, *, features: int, classes: int, hidden: int = 64,
               init_seed: int = 0):
    require(name in MODELS, f"train.model must be one of {MODELS}, got {name!r}")
    if name == "softmax":
        return SoftmaxRegression(features, classes)
    return MLP(features, classes, hidden=hidden, init_seed=init_seed)
