"""Rényi DP of one Poisson(q)-subsampled Gaussian step under replace-one (MATH.md §2).

Private helper of ``dpdl.accounting.certified``: dp_accounting's ``RdpAccountant`` refuses
``REPLACE_ONE`` for Poisson sampling, so dpdl integrates the Rényi divergence itself.

One record's clipped contribution (norm ≤ 1 in units of C) is replaced by another: the pair
of output laws of one coordinate-aligned worst case is dp_accounting's REPLACE pair (the one
its PLD composes, ``_pld_gaussian``)

    P = (1 − q)·N(0, σ²) + q·N(−1, σ²),    Q = (1 − q)·N(0, σ²) + q·N(+1, σ²),

symmetric under x → −x, so D_α(P‖Q) = D_α(Q‖P): one direction is the RDP at order α,

    ε(α) = ln A_α / (α − 1),    A_α = ∫ p(x)^α q(x)^{1−α} dx.

A_α has no closed form (q is a mixture raised to a negative power). It is integrated
adaptively (scipy's ``quad_vec``, Gauss–Kronrod 21 points, every order at once, its error
estimate added: an upper estimate) in log space:
each order's integrand is exp(g_α(x) − m_α) with m_α its largest value on a pilot grid, on a
window that holds every place its mass can sit (around 0, where the unsampled branches
dominate, and around −α, where P's sampled branch does), with the breakpoints where either
mixture changes branch (a kink of width σ² in g_α) given to the integrator. The window's two
ends are checked to lie 60 nats below the peak (else it is widened), so the mass left out is
below e^{−60} of the total. The test suite checks the result against mpmath at 50 digits.
At q = 1 the pair is N(−1, σ²) against N(1, σ²): ε(α) = 2α/σ² exactly.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.integrate import quad_vec

from dpdl.errors import DPDLError

# Orders from 1.1 to 256, about 15 % apart above 2: fewer orders than the add/remove
# accountant's 156 only loosen the conversion's minimum (by well under 1 % of ε where the
# minimum is flat), and orders beyond 256 cost long windows and matter only for ε far below
# any target in use.
ORDERS = np.array(
    [1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7, 1.8, 1.9, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0, 4.5, 5.0,
     6.0, 7.0, 8.0, 9.0, 10.0, 12.0, 14.0, 16.0, 18.0, 20.0, 24.0, 28.0, 32.0, 40.0, 48.0, 56.0,
     64.0, 80.0, 96.0, 112.0, 128.0, 160.0, 192.0, 224.0, 256.0]
)
_SPAN_SIGMAS = 14.0  # the window reaches this many σ beyond the outermost bump
_TAIL_NATS = 60.0  # required drop of every order's log-integrand at the window's ends
# quad_vec's tolerance on the scaled integrands (each peaks at 1); its error estimate is
# added to the integral, so A_α is an upper estimate (1e-11 costs 100× the time for nothing)
_RELATIVE_ERROR = 1e-8


def _log_densities(x: np.ndarray, sigma: float, q: float) -> tuple[np.ndarray, np.ndarray]:
    """ln p(x) and ln q(x) of the REPLACE pair (both with the common ln φ_σ(x))."""
    log_phi = -0.5 * (x / sigma) ** 2 - math.log(sigma * math.sqrt(2 * math.pi))
    unsampled, log_q = math.log1p(-q), math.log(q)
    log_p = log_phi + np.logaddexp(unsampled, log_q + (-2.0 * x - 1.0) / (2 * sigma**2))
    log_r = log_phi + np.logaddexp(unsampled, log_q + (2.0 * x - 1.0) / (2 * sigma**2))
    return log_p, log_r


def _log_integrands(x, orders: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """g_α(x) = α ln p(x) + (1 − α) ln q(x), shape (orders, points)."""
    log_p, log_r = _log_densities(np.atleast_1d(np.asarray(x, dtype=np.float64)), sigma, q)
    return orders[:, None] * log_p[None, :] + (1.0 - orders[:, None]) * log_r[None, :]


def _window(orders: np.ndarray, sigma: float) -> tuple[float, float]:
    """Where the mass of every order's integrand lies: P's sampled branch centres its bump at
    −α (ln φ_{−1}^α φ^{1−α} is a Gaussian at −α), the unsampled branches near 0."""
    reach = _SPAN_SIGMAS * sigma + 2.0
    return -float(orders.max()) - reach, reach


@functools.lru_cache(maxsize=4096)
def rdp_replace_one(noise_multiplier: float, sample_rate: float) -> tuple[float, ...]:
    """ε(α) at every order of :data:`ORDERS` of one replace-one step (module docstring)."""
    sigma, q = float(noise_multiplier), float(sample_rate)
    if q == 1.0:
        return tuple(2.0 * ORDERS / sigma**2)
    low, high = _window(ORDERS, sigma)
    for _ in range(4):
        pilot = np.linspace(low, high, 4097)
        values = _log_integrands(pilot, ORDERS, sigma, q)
        peaks = values.max(axis=1)
        ends = np.maximum(values[:, 0], values[:, -1])
        if np.all(ends <= peaks - _TAIL_NATS):
            break
        low, high = low - (high - low) / 2, high + (high - low) / 2
    else:
        raise DPDLError(f"replace-one RDP: no integration window found for noise multiplier "
                        f"{sigma!r} at sample rate {q!r}")  # fmt: skip
    # the branch changes of p and q: the sampled term equals the unsampled one there
    shift = sigma**2 * math.log((1 - q) / q)
    kinks = sorted(x for x in (-0.5 - shift, 0.5 + shift) if low < x < high)
    integral, error = quad_vec(
        lambda x: np.exp(_log_integrands(x, ORDERS, sigma, q)[:, 0] - peaks),
        low, high, epsrel=_RELATIVE_ERROR, epsabs=0.0, norm="max", points=kinks or None,
        limit=2_000,
    )  # fmt: skip
    log_a = np.log(np.maximum(integral + error, np.finfo(float).tiny)) + peaks
    # A_α ≥ 1 for α > 1 (a Rényi divergence is ≥ 0): round-off below it is clipped to 0
    return tuple(np.maximum(log_a, 0.0) / (ORDERS - 1.0))
