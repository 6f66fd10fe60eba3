"""Mixing metrics and matrix stacks (MATH.md §3, "Metrics").

* :func:`spectral_gap` — ``1 − |λ₂|`` of one (static) matrix, ``|λ₂|`` the second-largest
  eigenvalue modulus (SLEM). For a symmetric doubly-stochastic ``W`` this is the usual gap
  ``1 − max(|λ₂|, |λ_n|)``; for a column-stochastic non-symmetric ``P`` it is the same
  formula on the complex spectrum (an asymptotic rate: ``‖P^k (I − J)‖^(1/k) → |λ₂|``).
* :func:`period_contraction` — the paper's q: with ``M = P^{k0+T−1} ⋯ P^{k0}`` (one period
  ``T``, applied in time order) and ``J = 11ᵀ/n``, ``q = ‖M (I − J)‖₂``. Column-stochastic
  matrices map the zero-sum subspace ``{v : 1ᵀv = 0}`` into itself, so q is the operator
  norm of one period restricted to the disagreement directions: after one period the
  deviation of any zero-sum vector shrinks by at least the factor q. Smaller is faster mixing.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass
from functools import reduce

import numpy as np

from dpdl.errors import DPDLError
from dpdl.topology.base import Topology, circulant_spectrum
from dpdl.topology.validation import validate_mixing_matrix


def mixing_matrices(topology: Topology, k0: int, k1: int) -> np.ndarray:
    """``P^k`` for ``k0 <= k < k1`` stacked as a float64 ``(k1 − k0, n, n)`` array."""
    try:
        k0, k1 = operator.index(k0), operator.index(k1)
    except TypeError:
        raise DPDLError(f"a step window needs integer bounds, got k0={k0!r}, k1={k1!r}") from None
    if not 0 <= k0 <= k1:
        raise DPDLError(f"a step window needs 0 <= k0 <= k1, got k0={k0}, k1={k1}")
    per_phase = np.stack([topology.mixing_matrix(phase) for phase in range(topology.period)])
    return per_phase[np.arange(k0, k1) % topology.period]


def _circulant_mode_moduli(topology: Topology) -> np.ndarray | None:
    """``|eigenvalue|`` of one period's product per Fourier mode, or None if not circulant.

    Circulant matrices share the Fourier eigenvectors, so the product's eigenvalue for mode
    ``f`` is the product of the per-step eigenvalues; the product is normal, so on the
    zero-sum subspace (modes ``f != 0``) its spectral norm equals its spectral radius.
    """
    forms = [topology.circulant(phase) for phase in range(topology.period)]
    if any(form is None for form in forms):
        return None
    spectra = np.stack([circulant_spectrum(form, topology.n) for form in forms])
    return np.abs(np.prod(spectra, axis=0))


def spectral_gap(matrix_or_topology) -> float:
    """``1 − SLEM`` of a static mixing matrix or a static topology (module docstring)."""
    if isinstance(matrix_or_topology, Topology):
        if matrix_or_topology.time_varying:
            raise DPDLError(
                f"spectral_gap needs a static topology; {matrix_or_topology.name!r} has period "
                f"{matrix_or_topology.period} (use period_contraction)"
            )
        moduli = _circulant_mode_moduli(matrix_or_topology)
        if moduli is not None:
            return float(max(0.0, 1.0 - moduli[1:].max()))
        P = matrix_or_topology.mixing_matrix(0)
    else:
        P = validate_mixing_matrix(matrix_or_topology)
    if P.shape[0] < 2:
        raise DPDLError("spectral_gap needs at least 2 nodes")
    if np.allclose(P, P.T, rtol=0.0, atol=1e-12):
        moduli = np.abs(np.linalg.eigvalsh(P))
    else:
        moduli = np.abs(np.linalg.eigvals(P))
    second = np.sort(moduli)[-2]
    return float(max(0.0, 1.0 - second))


def period_product(topology: Topology, k0: int = 0) -> np.ndarray:
    """``P^{k0+T−1} ⋯ P^{k0+1} P^{k0}`` for one period ``T`` (the first step acts first)."""
    window = mixing_matrices(topology, k0, k0 + topology.period)
    return reduce(lambda product, P: P @ product, window[1:], window[0])


def _disagreement_part(M: np.ndarray) -> np.ndarray:
    return M - M.mean(axis=1, keepdims=True)  # == M (I − 11ᵀ/n)


def _contraction(topology: Topology, k0: int = 0) -> tuple[float, float]:
    """(spectral norm, spectral radius) of ``(Π P^k)(I − 11ᵀ/n)`` over one period."""
    moduli = _circulant_mode_moduli(topology)
    if moduli is not None:  # products of circulants commute: k0 does not matter
        q = float(moduli[1:].max())
        return q, q
    restricted = _disagreement_part(period_product(topology, k0))
    if np.allclose(restricted, restricted.T, rtol=0.0, atol=1e-12):
        radius = float(np.abs(np.linalg.eigvalsh(restricted)).max())
        return radius, radius  # symmetric: norm == spectral radius
    norm = float(np.linalg.norm(restricted, 2))
    return norm, float(np.abs(np.linalg.eigvals(restricted)).max())


def period_contraction(topology: Topology, k0: int = 0) -> float:
    """The paper's q for one period: ``‖(Π P^k)(I − 11ᵀ/n)‖₂`` (module docstring).

    Circulant schedules use their Fourier spectra (exact, O(n · period)); others the dense
    product.
    """
    return _contraction(topology, k0)[0]


@dataclass(frozen=True)
class MixingReport:
    """Mixing metrics of a topology.

    ``q``: per-period contraction (spectral norm, :func:`period_contraction`);
    ``q_spectral_radius``: spectral radius of the same restricted product (the asymptotic
    per-period rate, ``<= q``); ``per_step_rate``: ``q ** (1 / period)``, comparable across
    periods; ``spectral_gap``: only for static topologies, else None.
    """

    period: int
    q: float
    q_spectral_radius: float
    per_step_rate: float
    spectral_gap: float | None

    def to_dict(self) -> dict:
        return asdict(self)


def mixing_report(topology: Topology) -> MixingReport:
    """All mixing metrics of ``topology`` at once."""
    q, radius = _contraction(topology)
    return MixingReport(
        period=topology.period,
        q=q,
        q_spectral_radius=radius,
        per_step_rate=q ** (1.0 / topology.period),
        spectral_gap=None if topology.time_varying else spectral_gap(topology),
    )
