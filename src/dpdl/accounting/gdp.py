"""Gaussian differential privacy toolkit (MATH.md §1, seed 000 Propositions 1-3).

All conversions work in log space so that they stay finite for large ε (ε = 200 and beyond):
``e^ε Φ(·)`` in eq. 4 is evaluated as ``exp(ε + log Φ(·))`` and the difference of the two
terms as ``exp(log a) · (−expm1(log b − log a))``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq
from scipy.special import log_ndtr, logsumexp, ndtri

from dpdl.accounting import validators as check
from dpdl.errors import require

__all__ = [
    "gaussian_delta",
    "gaussian_log_delta",
    "log_delta_from_epsilon",
    "delta_from_epsilon",
    "epsilon_from_delta",
    "mu_from_epsilon_delta",
    "gaussian_sigma",
    "clt_mu_total",
    "log_clt_sum",
    "mu_bar_from_mu_total",
    "clt_noise_scale",
    "mu0_from_mu_total",
    "sigma_scale_from_mu_total",
]


def gaussian_log_delta(epsilon: ArrayLike, mu: ArrayLike) -> np.ndarray:
    """log δ(ε; μ) of G_μ (eq. 4), vectorized and broadcasting; −inf where μ = 0 or where δ
    underflows even in log space.

    Log space keeps e^ε Φ(·) finite for large ε: δ = e^{a}(1 − e^{b−a}) with
    a = log Φ(−ε/μ + μ/2) and b = ε + log Φ(−ε/μ − μ/2) ≤ a.
    """
    epsilon = np.asarray(epsilon, dtype=float)
    mu = np.asarray(mu, dtype=float)
    positive = mu > 0
    safe_mu = np.where(positive, mu, 1.0)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_first = log_ndtr(-epsilon / safe_mu + safe_mu / 2)
        log_second = epsilon + log_ndtr(-epsilon / safe_mu - safe_mu / 2)
        gap = np.minimum(log_second - log_first, 0.0)  # < 0 but for rounding at underflow
        log_delta = log_first + np.log(-np.expm1(gap))
    return np.where(positive, log_delta, -np.inf)


def gaussian_delta(epsilon: ArrayLike, mu: ArrayLike) -> np.ndarray:
    """δ(ε; μ) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2), vectorized; 0 where μ = 0."""
    return np.exp(gaussian_log_delta(epsilon, mu))


def log_delta_from_epsilon(epsilon: float, mu: float) -> float:
    """log δ(ε; μ) of eq. 4 for one (ε, μ), checked: :func:`gaussian_log_delta`."""
    return float(gaussian_log_delta(check.epsilon(epsilon), check.mu(mu)))


def delta_from_epsilon(epsilon: float, mu: float) -> float:
    """δ(ε; μ) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (MATH.md §1.2, eq. 4)."""
    return math.exp(log_delta_from_epsilon(epsilon, mu))


def epsilon_from_delta(delta: float, mu: float) -> float:
    """The smallest ε ≥ 0 with δ(ε; μ) ≤ δ (MATH.md §1.2); a root find in log δ.

    δ(ε; μ) ≤ Φ(−ε/μ + μ/2) gives the upper bracket ε ≤ μ(μ/2 − Φ⁻¹(δ)).
    """
    delta, mu = check.delta(delta), check.mu(mu)
    log_target = math.log(delta)
    if log_delta_from_epsilon(0.0, mu) <= log_target:
        return 0.0
    upper = max(mu * (mu / 2 - float(ndtri(delta))), 1e-12)
    while log_delta_from_epsilon(upper, mu) > log_target:  # guards the bound against rounding
        upper *= 2
    return float(
        brentq(
            lambda eps: log_delta_from_epsilon(eps, mu) - log_target,
            0.0,
            upper,
            xtol=1e-14,
            rtol=1e-13,
        )
    )


def mu_from_epsilon_delta(epsilon: float, delta: float) -> float:
    """The μ with δ(ε; μ) = δ (MATH.md §1.2): δ grows with μ, so a 1-D root find in log μ."""
    epsilon, delta = check.epsilon(epsilon), check.delta(delta)
    log_target = math.log(delta)

    def gap(log_mu: float) -> float:
        return log_delta_from_epsilon(epsilon, math.exp(log_mu)) - log_target

    # At ε = 0, δ = 2Φ(μ/2) − 1 exactly.
    if epsilon == 0:
        return float(2 * ndtri((1 + delta) / 2))
    low, high = math.log(1e-3), math.log(max(1.0, epsilon))
    while gap(low) > 0:
        low -= 2.0
    while gap(high) < 0:
        high += 1.0
    return math.exp(brentq(gap, low, high, xtol=1e-14, rtol=1e-13))


def gaussian_sigma(sensitivity: float, mu: float) -> float:
    """σ = S/μ: the Gaussian mechanism of l2-sensitivity S is then μ-GDP (MATH.md §1.1, Prop. 1)."""
    require(
        math.isfinite(sensitivity) and sensitivity > 0,
        f"sensitivity must be a finite positive number, got {sensitivity!r}",
    )
    return float(sensitivity) / check.mu(mu)


# The CLT's per-step term χ²/p² of each neighbouring relation, in log space (MATH.md §1.3):
# add/remove expm1(μ²) = χ²((1−p)N(0,1) + pN(μ,1) ‖ N(0,1)) / p²; replace-one
# 2(e^{μ²} − e^{−μ²}), the χ² of (1−p)N(0,1) + pN(−μ,1) against (1−p)N(0,1) + pN(μ,1) to
# leading order in p (≈ (2μ)² for small μ: sensitivity 2C).  log expm1(x) = x + log(−expm1(−x)).
_CLT_LOG_TERMS = {
    "add-remove": lambda squares: squares + np.log(-np.expm1(-squares)),
    "replace-one": lambda squares: squares + np.log(-np.expm1(-2.0 * squares)) + math.log(2.0),
}


def _log_clt_sum_of_squares(squares: np.ndarray, counts: ArrayLike | None = None,
                            neighboring: str = "add-remove") -> float:  # fmt: skip
    """log Σ_k c_k expm1(μ_k²) (add/remove; replace-one: ``_CLT_LOG_TERMS``) from the μ_k²,
    without overflow for large μ_k."""
    require(squares.size > 0, "the per-step budgets mus must not be empty")
    require(
        bool(np.all(np.isfinite(squares))) and bool(np.all(squares >= 0)),
        "per-step budgets mus must be finite",
    )
    terms = _CLT_LOG_TERMS[check.neighboring(neighboring)]
    # Underflow of negligible terms to 0 is harmless; log(0) = -inf only for μ_k = 0.
    with np.errstate(divide="ignore", under="ignore"):
        log_terms = terms(squares)
        return float(logsumexp(log_terms) if counts is None else logsumexp(log_terms, b=counts))


def log_clt_sum(mus: ArrayLike, neighboring: str = "add-remove") -> float:
    """log Σ_k expm1(μ_k²) (replace-one: Σ_k 2(e^{μ_k²} − e^{−μ_k²})), without overflow."""
    squares = np.square(np.asarray(mus, dtype=np.float64)).ravel()
    return _log_clt_sum_of_squares(squares, neighboring=neighboring)


def clt_mu_total(
    sample_rate: float,
    mus: ArrayLike | None = None,
    *,
    noise_multipliers: ArrayLike | None = None,
    counts: ArrayLike | None = None,
    neighboring: str = "add-remove",
) -> float:
    """μ_tot = p · sqrt(Σ_k c_k expm1(μ_k²)) (MATH.md §1.3, eq. 6), the step budgets given as
    ``mus`` or as ``noise_multipliers`` z_k (μ_k = 1/z_k), each step ``counts[k]`` times (1);
    under ``neighboring="replace-one"`` p · sqrt(Σ_k c_k 2(e^{μ_k²} − e^{−μ_k²})).

    A central-limit *approximation* for K Poisson(p)-subsampled μ_k-GDP steps; it can
    understate the true ε badly at small p (MATH.md §2); certified numbers come from
    ``dpdl.accounting.certified``.
    """
    p = check.sample_rate(sample_rate)
    require((mus is None) != (noise_multipliers is None), "give one of mus, noise_multipliers")
    if mus is not None:
        squares = np.square(np.asarray(mus, dtype=np.float64)).ravel()
    else:
        squares = 1.0 / np.square(np.asarray(noise_multipliers, dtype=np.float64)).ravel()
    return p * math.exp(0.5 * _log_clt_sum_of_squares(squares, counts, neighboring))


# --------------------------------------------------------------------------- CLT solves
# μ̄² from c = μ_tot² / (K p²), the inverse of each relation's per-step term (_CLT_LOG_TERMS):
# expm1(μ²) = c gives ln(1 + c); 2(e^{μ²} − e^{−μ²}) = c gives asinh(c / 4).
_CLT_INVERSE = {"add-remove": math.log1p, "replace-one": lambda c: math.asinh(c / 4.0)}


def mu_bar_from_mu_total(mu_tot: float, steps: int, sample_rate: float,
                         neighboring: str = "add-remove") -> float:  # fmt: skip
    """μ̄ = sqrt(ln(μ_tot² / (K p²) + 1)) (MATH.md §2, eq. 9); under replace-one
    sqrt(asinh(μ_tot² / (4 K p²)))."""
    mu_tot, steps, p = (
        check.positive("mu_tot", mu_tot),
        check.steps(steps),
        check.sample_rate(sample_rate),
    )
    inverse = _CLT_INVERSE[check.neighboring(neighboring)]
    return math.sqrt(inverse(mu_tot**2 / (steps * p * p)))


def clt_noise_scale(mu_tot: float, sample_rate: float, shape: ArrayLike,
                    neighboring: str = "add-remove") -> float:  # fmt: skip
    """The scale t with p · sqrt(Σ_k expm1(1/(t s_k)²)) = μ_tot (eq. 8 and eq. 10 in one form;
    under replace-one with that relation's term, :func:`clt_mu_total`).

    The left side falls monotonically in t. Every μ_k = 1/(t s_k) equal to μ̄ would solve it,
    so t lies between min_k and max_k of 1/(μ̄ s_k): a bracket that is always valid.
    """
    mu_tot, p = check.positive("mu_tot", mu_tot), check.sample_rate(sample_rate)
    shape = check.per_step("noise-multiplier shape", shape)
    mu_bar = mu_bar_from_mu_total(mu_tot, shape.size, p, neighboring)
    low, high = 1.0 / (mu_bar * float(shape.max())), 1.0 / (mu_bar * float(shape.min()))
    if high / low - 1 < 1e-12:  # constant shape: the closed form is exact
        return math.sqrt(low * high)
    log_target = 2 * math.log(mu_tot / p)

    def gap(log_t: float) -> float:
        return log_clt_sum(1.0 / (math.exp(log_t) * shape), neighboring) - log_target

    return math.exp(brentq(gap, math.log(low), math.log(high), xtol=1e-13, rtol=1e-13))


def mu0_from_mu_total(mu_tot: float, steps: int, sample_rate: float, rho_mu: float) -> float:
    """μ0, the root of p · sqrt(Σ_k expm1(μ0² ρ_μ^(2k/K))) = μ_tot (MATH.md §2, eq. 8)."""
    rho_mu = check.ratio("rho_mu", rho_mu)
    steps = check.steps(steps)
    shape = rho_mu ** (-(np.arange(steps, dtype=np.float64) / steps))  # k / K, k = 0 … K−1
    return 1.0 / clt_noise_scale(mu_tot, sample_rate, shape)


def sigma_scale_from_mu_total(
    mu_tot: float, sample_rate: float, clip: ArrayLike, noise_shape: ArrayLike
) -> float:
    """σ̃ with p · sqrt(Σ_k expm1((C_k / (σ̃ σ̃_k))²)) = μ_tot (MATH.md §2, Prop. 4, eq. 10)."""
    clip = check.per_step("clip_shape", clip)
    noise_shape = check.per_step("noise_shape", noise_shape, clip.size)
    return clt_noise_scale(mu_tot, sample_rate, noise_shape / clip)
