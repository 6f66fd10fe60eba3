"""RDP → (ε, δ), vectorized: the one conversion of every Rényi-DP guarantee dpdl states
(network DP's pairwise accountant, the PN-f-DP paper's RDP baseline, DECOR's RDP view).

A mechanism with D_α ≤ α ρ for every order α > 1 (ρ-zCDP-like; a Gaussian of sensitivity Δ
and std σ has ρ = Δ²/(2σ²)) is (ε, δ)-DP with ε = min_α [αρ + ln(1 − 1/α) − ln(δα)/(α − 1)]
(Canonne, Kamath & Steinke 2020, Prop. 12; Asoodeh et al. 2020), the conversion of
``dp_accounting.rdp.compute_epsilon``, on a grid of orders that contains dp_accounting's.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as _rdp
from numpy.typing import ArrayLike

from dpdl.accounting import validators as check

__all__ = ["RDP_ORDERS", "rdp_epsilon"]

#: dp_accounting's default orders plus dense grids near 1 (for large ρ) and up to 1e5
#: (very small ρ): every order is a valid bound, so more orders only tighten the minimum.
RDP_ORDERS = np.unique(
    np.concatenate(
        [
            np.asarray(_rdp.DEFAULT_RDP_ORDERS, dtype=float),
            1.0 + np.geomspace(1e-3, 1.0, 60)[:-1],
            np.linspace(1.01, 10.0, 300),
            np.geomspace(2.0, 4096.0, 200),
            np.geomspace(10.0, 1e5, 300),
        ]
    )
)
_BLOCK = 4096  # ρ values per block: keeps the (block, orders) table in cache


def rdp_epsilon(rho: ArrayLike, delta: float) -> np.ndarray:
    """ε at δ for every ρ of an array (a scalar for a scalar): ∞ for ρ = ∞, and NaN for a
    negative or NaN ρ (no guarantee at all, never "ε = 0")."""
    delta = check.delta(delta)
    rho = np.asarray(rho, dtype=float)
    a = RDP_ORDERS
    offset = np.log1p(-1 / a) - (math.log(delta) + np.log(a)) / (a - 1)  # independent of ρ
    flat = rho.ravel()
    eps = np.empty_like(flat)
    for start in range(0, flat.size, _BLOCK):
        block = flat[start : start + _BLOCK]
        with np.errstate(invalid="ignore"):
            eps[start : start + block.size] = (block[:, None] * a + offset).min(axis=1)
    eps = np.where(np.isnan(flat) | (flat < 0), np.nan, np.maximum(eps, 0.0))
    eps = eps.reshape(rho.shape)
    return eps if eps.ndim else eps[()]
