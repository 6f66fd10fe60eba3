"""DECOR's privacy: Sec-LDP (RDP form) and Sec-f-LDP (MATH.md §7; seed 003 Theorem 4.2).

Every step node i shares its clipped gradient (‖g‖ ≤ C) plus N(0, σ²I) + Σ_{j∈N(i)} v_ij with
pairwise secrets v_ij = −v_ji ~ N(0, σ_cor² I). Stacking the nodes, the shared noise is
Gaussian with covariance Σ = σ² I + σ_cor² L (L the graph Laplacian), independently per
coordinate. A curious node knows the secrets it shares, so for the honest set H the noise
that still hides them has covariance Σ_H = σ² I + σ_cor² L_H, L_H the Laplacian of the graph
induced on H (H = V: an eavesdropper only).

Replace-one adjacency moves node i's share by at most 2C (MATH.md §7), so one step is a
Gaussian mechanism with μ_step² = 4C² [Σ_H⁻¹]_ii ≤ 4C² max_i [Σ_H⁻¹]_ii; equivalently
ρ = μ_step²/2 = 2C² max_i [Σ_H⁻¹]_ii (DECOR's ρ-zCDP/RDP). Over T steps:

* ``"rdp-simple"``: ε = Tρ + 2√(Tρ ln(1/δ)) (DECOR's conversion),
* ``"rdp"``: the optimal RDP → (ε, δ) conversion of (α, αTρ)-RDP (dp_accounting),
* ``"fdp"``: Sec-f-LDP, μ = μ_step √T-GDP and the exact GDP conversion (never looser than
  either RDP conversion, since the GDP profile is the exact one of the Gaussian).

[Σ_H⁻¹]_ii = Σ_k u_k(i)² / (σ² + σ_cor² λ_k) from the eigen-decomposition L_H = U Λ Uᵀ, which
is computed once and reused across σ (calibration is then a scalar root find).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

import networkx as nx
import numpy as np
from numpy.typing import ArrayLike

from dpdl.errors import require
from dpdl.extensions.fdp.random_walk import _calibrate_decreasing, rdp_epsilon_from_rho
from dpdl.extensions.fdp.tradeoff import GaussianTradeOff

__all__ = [
    "DECOR_ACCOUNTANTS",
    "DecorPrivacy",
    "honest_laplacian",
    "decor_rho",
    "decor_privacy",
    "decor_epsilon",
    "calibrate_sigma_decor",
]

DECOR_ACCOUNTANTS = ("rdp-simple", "rdp", "fdp")


def _adjacency(graph: nx.Graph | ArrayLike) -> np.ndarray:
    if isinstance(graph, nx.Graph):
        require(not graph.is_directed(), "DECOR needs an undirected graph")
        adjacency = nx.to_numpy_array(graph, nodelist=sorted(graph.nodes))
    else:
        adjacency = np.asarray(graph, dtype=float)
    require(adjacency.ndim == 2 and adjacency.shape[0] == adjacency.shape[1],
            f"adjacency must be square, got shape {adjacency.shape}")
    require(np.allclose(adjacency, adjacency.T), "DECOR needs an undirected (symmetric) graph")
    adjacency = (adjacency != 0).astype(float)
    np.fill_diagonal(adjacency, 0.0)
    return adjacency


def honest_laplacian(graph: nx.Graph | ArrayLike, curious: Iterable[int] = ()) -> np.ndarray:
    """L_H: the Laplacian of the graph induced on the honest nodes V minus ``curious``.

    ``graph`` is a networkx graph (nodes 0..n-1) or an adjacency/mixing matrix (any
    nonzero off-diagonal entry is an edge, so the symmetric mixing matrix W works).
    """
    adjacency = _adjacency(graph)
    n = adjacency.shape[0]
    curious = sorted(set(int(c) for c in curious))
    require(all(0 <= c < n for c in curious), f"curious nodes must be in [0, {n}), got {curious}")
    require(len(curious) < n, "at least one node must be honest")
    honest = np.setdiff1d(np.arange(n), curious)
    sub = adjacency[np.ix_(honest, honest)]
    return np.diag(sub.sum(axis=1)) - sub


@dataclass(frozen=True)
class DecorPrivacy:
    """Per-step and total privacy of DECOR for one (σ, σ_cor, C, T, δ, H)."""

    rho_step: float           # 2C² max_i [Σ_H⁻¹]_ii
    mu_step: float            # √(2ρ) = 2C √(max_i [Σ_H⁻¹]_ii)
    mu_total: float           # μ_step √T
    epsilon_rdp_simple: float  # Tρ + 2√(Tρ ln 1/δ)
    epsilon_rdp: float        # optimal RDP conversion
    epsilon_fdp: float        # Sec-f-LDP, exact GDP conversion
    delta: float
    steps: int

    def epsilon(self, accountant: str) -> float:
        require(accountant in DECOR_ACCOUNTANTS,
                f"accountant must be one of {DECOR_ACCOUNTANTS}, got {accountant!r}")
        return {"rdp-simple": self.epsilon_rdp_simple, "rdp": self.epsilon_rdp,
                "fdp": self.epsilon_fdp}[accountant]

    def tradeoff(self) -> GaussianTradeOff:
        """The Sec-f-LDP trade-off function G_{μ√T}."""
        return GaussianTradeOff(self.mu_total)

    def to_dict(self) -> dict:
        return asdict(self)


class _InverseDiagonal:
    """max_i [(σ² I + σ_cor² L_H)⁻¹]_ii for any σ, from one eigen-decomposition of L_H."""

    def __init__(self, laplacian: np.ndarray):
        self.eigenvalues, vectors = np.linalg.eigh(laplacian)
        self.eigenvalues = np.clip(self.eigenvalues, 0.0, None)
        self.squares = vectors**2

    def __call__(self, sigma: float, sigma_cor: float) -> float:
        return float(np.max(self.squares @ (1.0 / (sigma**2 + sigma_cor**2 * self.eigenvalues))))


def _check_noise(sigma: float, sigma_cor: float, clip: float) -> None:
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    require(math.isfinite(sigma_cor) and sigma_cor >= 0,
            f"sigma_cor must be >= 0, got {sigma_cor!r}")
    require(math.isfinite(clip) and clip > 0, f"clip C must be > 0, got {clip!r}")


def decor_rho(graph, *, sigma: float, sigma_cor: float, clip: float = 1.0,
              curious: Iterable[int] = ()) -> float:
    """Per-step ρ = 2C² max_{i∈H} [(σ² I + σ_cor² L_H)⁻¹]_ii (MATH.md §7)."""
    _check_noise(sigma, sigma_cor, clip)
    return 2 * clip**2 * _InverseDiagonal(honest_laplacian(graph, curious))(sigma, sigma_cor)


def _privacy_from_rho(rho: float, steps: int, delta: float) -> DecorPrivacy:
    require(isinstance(steps, int | np.integer) and steps >= 1,
            f"steps T must be a positive integer, got {steps!r}")
    require(0 < delta < 1, f"delta must lie in (0, 1), got {delta!r}")
    total = steps * rho
    mu_step = math.sqrt(2 * rho)
    mu_total = mu_step * math.sqrt(steps)
    return DecorPrivacy(
        rho_step=rho, mu_step=mu_step, mu_total=mu_total,
        epsilon_rdp_simple=total + 2 * math.sqrt(total * math.log(1 / delta)),
        epsilon_rdp=float(rdp_epsilon_from_rho(np.array([total]), delta)[0]),
        epsilon_fdp=GaussianTradeOff(mu_total).epsilon(delta),
        delta=float(delta), steps=int(steps),
    )


def decor_privacy(graph, *, sigma: float, sigma_cor: float, steps: int, delta: float,
                  clip: float = 1.0, curious: Iterable[int] = ()) -> DecorPrivacy:
    """All three DECOR guarantees for T steps (MATH.md §7)."""
    return _privacy_from_rho(decor_rho(graph, sigma=sigma, sigma_cor=sigma_cor, clip=clip,
                                       curious=curious), steps, delta)


def decor_epsilon(graph, *, sigma: float, sigma_cor: float, steps: int, delta: float,
                  clip: float = 1.0, curious: Iterable[int] = (),
                  accountant: str = "fdp") -> float:
    return decor_privacy(graph, sigma=sigma, sigma_cor=sigma_cor, steps=steps, delta=delta,
                         clip=clip, curious=curious).epsilon(accountant)


def calibrate_sigma_decor(graph, *, sigma_cor: float, target_epsilon: float, steps: int,
                          delta: float, clip: float = 1.0, curious: Iterable[int] = (),
                          accountant: str = "fdp") -> float:
    """The σ (for a given σ_cor) at which DECOR's ε under ``accountant`` equals the target,
    returned on the safe side (ε(σ) ≤ target)."""
    require(accountant in DECOR_ACCOUNTANTS,
            f"accountant must be one of {DECOR_ACCOUNTANTS}, got {accountant!r}")
    require(math.isfinite(target_epsilon) and target_epsilon > 0,
            f"target epsilon must be > 0, got {target_epsilon!r}")
    _check_noise(1.0, sigma_cor, clip)
    inverse_diagonal = _InverseDiagonal(honest_laplacian(graph, curious))

    def epsilon_of(sigma: float) -> float:
        rho = 2 * clip**2 * inverse_diagonal(sigma, sigma_cor)
        return _privacy_from_rho(rho, steps, delta).epsilon(accountant)

    return _calibrate_decreasing(epsilon_of, float(target_epsilon))
