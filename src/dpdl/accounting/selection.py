"""Private selection: the best of a random number of private runs (Papernot & Steinke, ICLR
2022, "Hyperparameter Tuning with Renyi Differential Privacy"; MATH.md has no section of its
own: the statements are the paper's, quoted here).

The tuner draws K from the truncated negative binomial distribution D_{η,γ} (η ≥ 0 here; the
paper allows η > −1; 0 < γ < 1) on {1, 2, ...},

    P[K = k] = (1−γ)^k / (γ^{−η} − 1) · Π_{ℓ=0}^{k−1} (ℓ+η)/(ℓ+1)      (η ≠ 0),
    P[K = k] = (1−γ)^k / (k · log(1/γ))                                 (η = 0),

(η = 1 is the geometric distribution P[K = k] = γ(1−γ)^{k−1}, η = 0 the logarithmic one),
with mean E[K] = η(1−γ) / (γ(1 − γ^η)) (η ≠ 0) and (1/γ − 1) / log(1/γ) (η = 0).  It runs K
independent copies of a mechanism Q (each one a candidate drawn at random with its own fresh
noise, and its score) and releases only the copy with the best score; nothing of the others,
not even K.  If Q is (λ, ε(λ))-RDP for every order λ, the tuner is (λ, ε'(λ))-RDP with
(Theorem 2 of the paper, any λ > 1 and any λ̂ ≥ 1)

    ε'(λ) = ε(λ) + (1+η)(1 − 1/λ̂) ε(λ̂) + (1+η) log(1/γ) / λ̂ + log(E[K]) / (λ − 1).

:func:`best_of_rdp` takes the best λ̂ among the orders, then uses that Rényi divergences grow
with the order (ε'(λ) ≤ ε'(λ') for λ ≤ λ').  For a pure ε-DP Q this is the (2+η)ε-DP of the
paper's Corollary (3ε for the geometric distribution, Liu & Talwar's bound).  Q's curve comes
from :func:`schedule_rdp`: a dpdl run is a schedule of Poisson-subsampled Gaussian steps, under
add/remove adjacency like the rest of this package; a Q that draws one of several schedules at
random (data-independently) is bounded by their pointwise maximum.  ε at δ is dp_accounting's
conversion (``compute_epsilon``: Canonne, Kamath & Steinke 2020, Prop. 12).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from dpdl.accounting import validators as check
from dpdl.accounting.certified import (
    DEFAULT_BLOCKS,
    EXACT_MAX_DISTINCT,
    _quiet_rdp_orders,
    blocked_run_length,
    run_length,
)
from dpdl.errors import require

__all__ = [
    "SELECTION_ORDERS",
    "best_of_rdp",
    "check_distribution",
    "draw_repetitions",
    "expected_repetitions",
    "gamma_for_mean",
    "rdp_epsilon_at",
    "schedule_rdp",
]

#: dp_accounting's default orders and a few more above 64: the best λ̂ is about
#: sqrt(log(1/γ)/ρ) for a ρ-zCDP-like run, in the hundreds for a run of small ε.
SELECTION_ORDERS = np.unique(
    np.concatenate([np.asarray(_rdp.DEFAULT_RDP_ORDERS, dtype=float),
                    [72.0, 80.0, 96.0, 112.0, 160.0, 192.0, 384.0, 768.0, 2048.0]])
)  # fmt: skip


def check_distribution(eta: float, gamma: float) -> tuple[float, float]:
    """(η, γ) of a truncated negative binomial: η ≥ 0 finite, γ in (0, 1)."""
    # The paper allows η > −1; η ≥ 0 (logarithmic, geometric, the rest of the family) is
    # what dp_accounting's independent RepeatAndSelect implements, and all a user needs.
    require(_finite(eta) and eta >= 0,
            f"eta (the shape of the number of runs) must be a finite number >= 0, got {eta!r}")
    return float(eta), check.probability("gamma", gamma)


def _finite(value) -> bool:
    numeric = isinstance(value, int | float | np.integer | np.floating)
    return numeric and not isinstance(value, bool) and math.isfinite(value)


def expected_repetitions(eta: float, gamma: float) -> float:
    """E[K] of D_{η,γ} (the module doc's closed form)."""
    eta, gamma = check_distribution(eta, gamma)
    if eta == 0:
        return (1 / gamma - 1) / math.log(1 / gamma)
    # 1 − γ^η as −expm1(η log γ): exact also for η near 0 and γ near 1
    return eta * (1 - gamma) / (gamma * -math.expm1(eta * math.log(gamma)))


def gamma_for_mean(eta: float, mean: float) -> float:
    """The γ with E[K] = ``mean`` (> 1): E[K] falls from ∞ to 1 as γ goes from 0 to 1."""
    check_distribution(eta, 0.5)
    require(_finite(mean) and mean > 1,
            f"mean (the expected number of runs) must be a finite number > 1, got {mean!r}")
    low, high = 1e-12, 1 - 1e-12
    require(expected_repetitions(eta, low) > mean,
            f"mean = {mean!r} runs needs a gamma below 1e-12: too many runs")  # fmt: skip
    if expected_repetitions(eta, high) >= mean:
        return high
    return float(brentq(lambda g: expected_repetitions(eta, g) - mean, low, high, xtol=1e-15))


def draw_repetitions(eta: float, gamma: float, uniform: float) -> int:
    """K ~ D_{η,γ} by inversion of its CDF at ``uniform`` in [0, 1) (the caller's secret
    randomness); P[K=k+1] / P[K=k] = (1−γ)(k+η)/(k+1)."""
    eta, gamma = check_distribution(eta, gamma)
    require(0 <= uniform < 1, f"uniform must lie in [0, 1), got {uniform!r}")
    if eta == 0:
        p = (1 - gamma) / math.log(1 / gamma)
    else:
        p = eta * (1 - gamma) / math.expm1(-eta * math.log(gamma))
    k, cdf = 1, p
    # the float CDF may stop short of 1 by rounding: the walk then ends where P[K=k]
    # underflows, moving less than 1e-15 of probability to that k
    while uniform >= cdf and p > 0:
        p *= (1 - gamma) * (k + eta) / (k + 1)
        k += 1
        cdf += p
    return k


def schedule_rdp(noise_multipliers: ArrayLike, sample_rate: float,
                 orders: ArrayLike = SELECTION_ORDERS,
                 neighboring: str = "add-remove") -> np.ndarray:  # fmt: skip
    """The RDP curve (one ε per order) of Poisson(``sample_rate``)-subsampled Gaussian steps
    with multipliers z_k: a sum over steps (RDP composes additively).  A schedule with more
    than ``EXACT_MAX_DISTINCT["rdp"]`` distinct multipliers is composed blocked, each block
    at its smallest multiplier (a larger ε: certified.py's ``blocked_run_length``).
    ``neighboring="replace-one"`` takes the replace-one RDP of each step (computed at its own
    orders), each order bounded by the next one computed (RDP grows with the order): above
    the last, infinite."""
    multipliers, counts = run_length(noise_multipliers)
    if multipliers.size > EXACT_MAX_DISTINCT["rdp"]:
        multipliers, counts = blocked_run_length(multipliers, counts, DEFAULT_BLOCKS)
    q, orders = check.sample_rate(sample_rate), np.asarray(orders, dtype=float)
    total = np.zeros(orders.size)
    with _quiet_rdp_orders():
        for z, count in zip(multipliers, counts, strict=True):
            step = _step_rdp(q, float(z), orders, neighboring)
            total += int(count) * np.asarray(step, dtype=float)
    return total


def _step_rdp(q: float, z: float, orders: np.ndarray, neighboring: str) -> np.ndarray:
    require(neighboring in ("add-remove", "replace-one"),
            f"unknown neighbouring relation {neighboring!r}")  # fmt: skip
    if neighboring == "add-remove":
        return np.asarray(_rdp._compute_rdp_poisson_subsampled_gaussian(q, z, orders))
    from dpdl.accounting._rdp_replace import ORDERS, rdp_replace_one

    computed = np.asarray(rdp_replace_one(z, q))
    above = np.searchsorted(ORDERS, orders, side="left")  # the first computed order >= each
    return np.where(above < ORDERS.size, computed[np.minimum(above, ORDERS.size - 1)], np.inf)


def best_of_rdp(orders: ArrayLike, rdp: ArrayLike, eta: float, gamma: float) -> np.ndarray:
    """The RDP curve of the best of K ~ D_{η,γ} runs of a mechanism with curve ``rdp`` at
    ``orders`` (all > 1): Theorem 2 with the best λ̂ of the orders, then monotonicity."""
    eta, gamma = check_distribution(eta, gamma)
    orders, rdp = np.asarray(orders, dtype=float), np.asarray(rdp, dtype=float)
    require(orders.shape == rdp.shape and orders.ndim == 1 and orders.size > 0,
            "orders and rdp must be 1-D arrays of one length")  # fmt: skip
    require(bool(np.all(orders > 1)), f"every order must be > 1, got {orders.min()!r}")
    require(not np.any(np.isnan(rdp) | (rdp < 0)), "rdp must be >= 0 everywhere (no NaN)")
    with np.errstate(invalid="ignore"):  # an infinite ε(λ̂) just loses that λ̂
        c = (1 + eta) * np.min((1 - 1 / orders) * rdp + math.log(1 / gamma) / orders)
    bound = rdp + c + math.log(expected_repetitions(eta, gamma)) / (orders - 1)
    ascending = np.argsort(orders)
    running = np.minimum.accumulate(bound[ascending][::-1])[::-1]  # min over orders ≥ λ
    out = np.empty_like(bound)
    out[ascending] = running
    return out


def rdp_epsilon_at(orders: ArrayLike, rdp: ArrayLike, delta: float) -> tuple[float, float]:
    """(ε, the order that gives it) of an RDP curve at δ (dp_accounting's conversion)."""
    delta = check.delta(delta)
    eps, order = _rdp.compute_epsilon(list(np.asarray(orders, dtype=float)),
                                      list(np.asarray(rdp, dtype=float)), delta)  # fmt: skip
    return float(eps), float(order)
