"""Trade-off functions as objects (MATH.md §7, first bullet; Dong, Roth & Su 2022).

A trade-off function f(α) is the smallest type-II error β of any test of D against D' whose
type-I error is at most α. Every class here describes a *symmetric* f (all mechanisms of
MATH.md §7 are), so the privacy profile is δ(ε) = 1 + f*(−e^ε) with f* the convex conjugate, and
conversely f = sup_ε f_{ε, δ(ε)} (Dong et al., Prop. 2.12). Both directions are implemented:

* :class:`GaussianTradeOff` — G_μ(α) = Φ(Φ⁻¹(1−α) − μ); G_a ⊗ G_b = G_√(a²+b²).
* :class:`EpsilonDeltaTradeOff` — f_{ε,δ}(α) = max(0, 1−δ−e^ε α, e^{−ε}(1−δ−α)).
* :class:`RevealedGaussianMixture` — the adversary learns which Gaussian component ran:
  δ(ε) = Σ_s p_s δ_G(ε; √s). The PN-f-DP guarantee of a random walk is of this kind.
* :class:`PLDTradeOff` — wraps a ``dp_accounting`` privacy-loss distribution.
* :class:`TabulatedTradeOff` — a convex piecewise-linear f given by points (the "back"
  conversion: δ(ε) = 1 + max_v(−e^ε α_v − β_v)).

Composition (⊗) is :func:`compose` / ``f.compose(g)`` / ``f.self_compose(k)``; closed forms
are used where they exist, otherwise both sides go through a pessimistic ``dp_accounting``
PLD. ``f(alpha)`` of a class without a closed form is the envelope sup over a finite ε grid
of f_{ε,δ(ε)}: every line of that envelope is a valid lower bound, so the result never
overstates privacy.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike
from scipy.fft import irfft, next_fast_len, rfft
from scipy.optimize import brentq
from scipy.special import ndtr, ndtri

from dpdl.accounting.gdp import gaussian_delta, gaussian_log_delta
from dpdl.errors import DPDLError, require

__all__ = [
    "gaussian_delta",
    "gaussian_log_delta",
    "TradeOff",
    "GaussianTradeOff",
    "EpsilonDeltaTradeOff",
    "RevealedGaussianMixture",
    "PLDTradeOff",
    "TabulatedTradeOff",
    "compose",
    "plot_tradeoff",
]

_EPSILON_GRID = np.concatenate([np.linspace(0.0, 2.0, 201)[:-1], np.geomspace(2.0, 200.0, 400)])


def _finite_positive(value: float, name: str, *, allow_zero: bool = False) -> float:
    ok = isinstance(value, int | float | np.integer | np.floating) and math.isfinite(value)
    ok = ok and (value >= 0 if allow_zero else value > 0)
    bound = ">= 0" if allow_zero else "> 0"
    require(ok, f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


def _check_delta(delta: float) -> float:
    require(
        isinstance(delta, int | float | np.integer | np.floating) and 0 < delta < 1,
        f"delta must lie in (0, 1), got {delta!r}",
    )
    return float(delta)


def _check_alpha(alpha: ArrayLike) -> np.ndarray:
    alpha = np.asarray(alpha, dtype=float)
    require(
        bool(np.all((alpha >= 0) & (alpha <= 1))),
        f"alpha (type-I error) must lie in [0, 1], got {alpha.min()!r}..{alpha.max()!r}",
    )
    return alpha


class TradeOff(ABC):
    """A symmetric trade-off function f: [0, 1] → [0, 1] (MATH.md §7)."""

    @abstractmethod
    def delta(self, epsilon: ArrayLike) -> np.ndarray | float:
        """The privacy profile δ(ε) = 1 + f*(−e^ε) (vectorized in ε ≥ 0)."""

    def epsilon(self, delta: float) -> float:
        """The smallest ε ≥ 0 with δ(ε) ≤ delta (a certified upper bound: the root is
        returned from the side where δ(ε) ≤ delta holds)."""
        delta = _check_delta(delta)
        if float(self.delta(0.0)) <= delta:
            return 0.0
        high = 1.0
        while float(self.delta(high)) > delta:
            high *= 2
            require(high < 1e6, f"epsilon for delta={delta!r} is not finite (δ(ε) stays above)")
        root = brentq(lambda e: math.log(max(float(self.delta(e)), 1e-300)) - math.log(delta),
                      0.0, high, xtol=1e-12, rtol=1e-12)
        # report from the side of the root where the guarantee δ(ε) <= delta holds
        step = 1e-12 * max(1.0, root)
        while float(self.delta(root)) > delta:
            root, step = root + step, 2 * step
        return float(root)

    def __call__(self, alpha: ArrayLike) -> np.ndarray:
        """f(α) as the envelope sup_ε f_{ε,δ(ε)} over a finite ε grid (a lower bound on f)."""
        alpha = _check_alpha(alpha)
        eps = _EPSILON_GRID
        deltas = np.asarray(self.delta(eps), dtype=float)
        a = alpha[..., None]
        lines = np.maximum(1 - deltas - np.exp(eps) * a, np.exp(-eps) * (1 - deltas - a))
        return np.clip(lines.max(axis=-1), 0.0, 1.0)

    def to_pld(self, value_discretization: float = 1e-4):
        """A pessimistic ``dp_accounting`` PrivacyLossDistribution dominating this f."""
        raise DPDLError(f"{type(self).__name__} has no privacy-loss distribution form")

    def compose(self, other: TradeOff) -> TradeOff:
        """f ⊗ g: closed form where one exists, else through pessimistic PLDs."""
        return PLDTradeOff(self.to_pld().compose(other.to_pld()))

    def self_compose(self, times: int) -> TradeOff:
        require(isinstance(times, int | np.integer) and times >= 1,
                f"times must be a positive integer, got {times!r}")
        return PLDTradeOff(self.to_pld().self_compose(int(times)))

    def curve(self, num: int = 201) -> tuple[np.ndarray, np.ndarray]:
        """(α, f(α)) on a uniform grid, for plotting."""
        alpha = np.linspace(0.0, 1.0, num)
        return alpha, np.asarray(self(alpha), dtype=float)


class GaussianTradeOff(TradeOff):
    """G_μ (MATH.md §7): the Gaussian mechanism with sensitivity/σ = μ."""

    def __init__(self, mu: float):
        self.mu = _finite_positive(mu, "mu", allow_zero=True)

    def __repr__(self) -> str:
        return f"GaussianTradeOff(mu={self.mu!r})"

    def __call__(self, alpha: ArrayLike) -> np.ndarray:
        alpha = _check_alpha(alpha)
        return ndtr(ndtri(1 - alpha) - self.mu)

    def delta(self, epsilon: ArrayLike):
        out = gaussian_delta(epsilon, self.mu)
        return float(out) if out.ndim == 0 else out

    def epsilon(self, delta: float) -> float:
        if self.mu == 0:
            _check_delta(delta)
            return 0.0
        from dpdl.accounting.gdp import epsilon_from_delta

        return epsilon_from_delta(_check_delta(delta), self.mu)

    def compose(self, other: TradeOff) -> TradeOff:
        if isinstance(other, GaussianTradeOff):
            return GaussianTradeOff(math.hypot(self.mu, other.mu))
        if isinstance(other, RevealedGaussianMixture):
            return other.compose(self)
        return super().compose(other)

    def self_compose(self, times: int) -> TradeOff:
        require(isinstance(times, int | np.integer) and times >= 1,
                f"times must be a positive integer, got {times!r}")
        return GaussianTradeOff(self.mu * math.sqrt(int(times)))

    def to_pld(self, value_discretization: float = 1e-4):
        from dp_accounting.pld import privacy_loss_distribution as pld

        require(self.mu > 0, "G_0 (perfect privacy) has no Gaussian PLD; use identity")
        return pld.from_gaussian_mechanism(
            standard_deviation=1.0 / self.mu,
            sensitivity=1.0,
            value_discretization_interval=value_discretization,
            pessimistic_estimate=True,
        )


class EpsilonDeltaTradeOff(TradeOff):
    """f_{ε,δ}(α) = max(0, 1−δ−e^ε α, e^{−ε}(1−δ−α)) (MATH.md §7)."""

    def __init__(self, epsilon: float, delta: float):
        self.eps = _finite_positive(epsilon, "epsilon", allow_zero=True)
        require(
            isinstance(delta, int | float | np.integer | np.floating) and 0 <= delta < 1,
            f"delta must lie in [0, 1), got {delta!r}",
        )
        self.dlt = float(delta)

    def __repr__(self) -> str:
        return f"EpsilonDeltaTradeOff(epsilon={self.eps!r}, delta={self.dlt!r})"

    def __call__(self, alpha: ArrayLike) -> np.ndarray:
        alpha = _check_alpha(alpha)
        return np.maximum.reduce([
            np.zeros_like(alpha),
            1 - self.dlt - math.exp(self.eps) * alpha,
            math.exp(-self.eps) * (1 - self.dlt - alpha),
        ])

    def delta(self, epsilon: ArrayLike):
        # f is piecewise linear with vertices (0, 1−δ), (α*, e^{−ε}(1−δ−α*)), (1−δ, 0), (1, 0)
        # and α* = (1−δ)/(1+e^ε), so 1 + f*(−e^{ε'}) is a max over those vertices.
        e = np.asarray(epsilon, dtype=float)
        corner = (1 - self.dlt) / (1 + math.exp(self.eps))
        vertices_alpha = np.array([0.0, corner, 1 - self.dlt, 1.0])
        vertices_beta = np.array([1 - self.dlt, math.exp(-self.eps) * (1 - self.dlt - corner),
                                  0.0, 0.0])
        out = 1 + np.max(-np.exp(e)[..., None] * vertices_alpha - vertices_beta, axis=-1)
        out = np.clip(out, 0.0, 1.0)
        return float(out) if out.ndim == 0 else out

    def epsilon(self, delta: float) -> float:
        delta = _check_delta(delta)
        if delta >= self.dlt:
            # δ(ε') = 1 − (1−δ)(1+e^{ε'})/(1+e^ε) for ε' ≤ ε; solve for ε'.
            ratio = (1 - delta) / (1 - self.dlt) * (1 + math.exp(self.eps)) - 1
            return max(0.0, math.log(ratio)) if ratio > 0 else 0.0
        raise DPDLError(
            f"an ({self.eps}, {self.dlt})-DP guarantee says nothing at delta={delta!r} "
            f"< {self.dlt}: epsilon is infinite"
        )

    def to_pld(self, value_discretization: float = 1e-4):
        from dp_accounting.pld import common
        from dp_accounting.pld import privacy_loss_distribution as pld

        return pld.from_privacy_parameters(
            common.DifferentialPrivacyParameters(self.eps, self.dlt),
            value_discretization_interval=value_discretization,
        )


class RevealedGaussianMixture(TradeOff):
    """Gaussian mechanisms whose index is revealed: μ² = s with probability p_s.

    δ(ε) = Σ_s p_s δ_G(ε; √s), the hockey-stick divergence of the joint view (index,
    output) whose index has the same law under D and D'. Composition adds independent μ²
    values (conditionally on the indices the outputs compose to G_√(Σμ²)), so a k-fold
    composition is the k-fold convolution of the law of μ². δ grows with every s, which is
    why rounding the support of μ² *up* (``rounding="up"``) certifies an upper bound and
    rounding it down gives the matching optimistic value.
    """

    def __init__(self, mu_squared: ArrayLike, probabilities: ArrayLike):
        s = np.asarray(mu_squared, dtype=float).ravel()
        p = np.asarray(probabilities, dtype=float).ravel()
        require(s.shape == p.shape and s.size > 0,
                f"mu_squared and probabilities must be equal-length, got {s.shape} and {p.shape}")
        require(bool(np.all(np.isfinite(s) & (s >= 0))), "mu_squared values must be finite >= 0")
        require(bool(np.all(p >= 0)), "probabilities must be >= 0")
        total = float(p.sum())
        require(total <= 1 + 1e-9, f"probabilities sum to {total!r} > 1")
        keep = p > 0
        self.mu_squared, self.probabilities = s[keep], p[keep]
        # Missing mass (if any) is perfect privacy, the μ = 0 atom.

    def __repr__(self) -> str:
        return f"RevealedGaussianMixture(<{self.mu_squared.size} atoms>)"

    @classmethod
    def from_mus(cls, mus: ArrayLike, weights: ArrayLike) -> RevealedGaussianMixture:
        return cls(np.asarray(mus, dtype=float) ** 2, weights)

    def delta(self, epsilon: ArrayLike):
        e = np.asarray(epsilon, dtype=float)
        log_d = gaussian_log_delta(e[..., None], np.sqrt(self.mu_squared))
        with np.errstate(under="ignore"):
            out = np.einsum("...i,i->...", np.exp(log_d), self.probabilities)  # no BLAS threads
        out = np.asarray(out)
        return float(out) if out.ndim == 0 else out

    def compose(self, other: TradeOff) -> TradeOff:
        if isinstance(other, GaussianTradeOff):
            return RevealedGaussianMixture(self.mu_squared + other.mu**2, self.probabilities)
        if isinstance(other, RevealedGaussianMixture):
            s = (self.mu_squared[:, None] + other.mu_squared[None, :]).ravel()
            p = (self.probabilities[:, None] * other.probabilities[None, :]).ravel()
            values, inverse = np.unique(s, return_inverse=True)
            return RevealedGaussianMixture(values, np.bincount(inverse, weights=p))
        return super().compose(other)

    def self_compose(self, times: int, *, grid: float | None = None,
                     rounding: str = "up") -> RevealedGaussianMixture:
        """k-fold ⊗ by FFT convolution of the law of μ² on a grid of step ``grid``.

        ``grid`` defaults to 1e-4 · max μ² (the total pessimistic slack in Σμ² is then
        ≤ k · grid). ``rounding="up"`` certifies; ``"down"`` gives the optimistic twin.
        """
        require(isinstance(times, int | np.integer) and times >= 1,
                f"times must be a positive integer, got {times!r}")
        require(rounding in ("up", "down"), f"rounding must be 'up' or 'down', got {rounding!r}")
        s_max = float(self.mu_squared.max()) if self.mu_squared.size else 0.0
        if s_max == 0:
            return RevealedGaussianMixture([0.0], [1.0])
        grid = 1e-4 * s_max if grid is None else _finite_positive(grid, "grid")
        pmf = bin_mu_squared(self.mu_squared[None, :], self.probabilities[None, :], grid,
                             rounding)
        composed = self_convolve(pmf, int(times))[0]
        support = np.arange(composed.size) * grid
        return RevealedGaussianMixture(support, composed)

    def to_pld(self, value_discretization: float = 1e-4):
        from dp_accounting.pld import privacy_loss_distribution as pld

        parts = [(p, pld.from_gaussian_mechanism(
            standard_deviation=1 / math.sqrt(s), value_discretization_interval=value_discretization,
            pessimistic_estimate=True) if s > 0 else pld.identity(value_discretization))
            for s, p in zip(self.mu_squared, self.probabilities, strict=True)]
        missing = 1.0 - float(self.probabilities.sum())
        if missing > 0:
            parts.append((missing, pld.identity(value_discretization)))
        weight, mixture = parts[0]
        for p, component in parts[1:]:
            mixture = mixture.compute_mixture(component, weight / (weight + p))
            weight += p
        return mixture


class PLDTradeOff(TradeOff):
    """The f of a ``dp_accounting`` PrivacyLossDistribution (privacy profile from the PLD)."""

    def __init__(self, pld):
        require(hasattr(pld, "get_delta_for_epsilon"),
                f"expected a dp_accounting PrivacyLossDistribution, got {type(pld).__name__}")
        self.pld = pld

    def delta(self, epsilon: ArrayLike):
        e = np.asarray(epsilon, dtype=float)
        if e.ndim == 0:
            return float(self.pld.get_delta_for_epsilon(float(e)))
        return np.asarray(self.pld.get_delta_for_epsilon(list(e.ravel())),
                          dtype=float).reshape(e.shape)

    def epsilon(self, delta: float) -> float:
        return float(self.pld.get_epsilon_for_delta(_check_delta(delta)))

    def to_pld(self, value_discretization: float = 1e-4):
        return self.pld


class TabulatedTradeOff(TradeOff):
    """A convex piecewise-linear f through the points (α_v, β_v) (e.g. an audited curve).

    Conversion back to (ε, δ): δ(ε) = 1 + f*(−e^ε) = 1 + max_v(−e^ε α_v − β_v), exact for the
    polyline (MATH.md §7).
    """

    def __init__(self, alpha: ArrayLike, beta: ArrayLike):
        a = _check_alpha(alpha).ravel()
        b = np.asarray(beta, dtype=float).ravel()
        require(a.shape == b.shape and a.size >= 2, "alpha and beta need equal length >= 2")
        require(bool(np.all((b >= 0) & (b <= 1))), "beta values must lie in [0, 1]")
        order = np.argsort(a)
        self.alpha, self.beta = a[order], b[order]
        require(bool(np.all(np.diff(self.beta) <= 1e-12)),
                "a trade-off function must be non-increasing in alpha")

    def __call__(self, alpha: ArrayLike) -> np.ndarray:
        return np.interp(_check_alpha(alpha), self.alpha, self.beta)

    def delta(self, epsilon: ArrayLike):
        e = np.asarray(epsilon, dtype=float)
        out = 1 + np.max(-np.exp(e)[..., None] * self.alpha - self.beta, axis=-1)
        out = np.clip(out, 0.0, 1.0)
        return float(out) if out.ndim == 0 else out


def compose(*tradeoffs: TradeOff) -> TradeOff:
    """f_1 ⊗ f_2 ⊗ … (MATH.md §7)."""
    require(len(tradeoffs) >= 1, "compose needs at least one trade-off function")
    result = tradeoffs[0]
    for f in tradeoffs[1:]:
        result = result.compose(f)
    return result


def bin_mu_squared(mu_squared: np.ndarray, probabilities: np.ndarray, grid: float,
                   rounding: str = "up") -> np.ndarray:
    """Laws of μ² on the grid {0, h, 2h, …}: rows of ``probabilities`` (shape (R, M)) over the
    shared support ``mu_squared`` (shape (1, M) or (M,)); mass missing from a row goes to 0.

    ``rounding="up"`` moves every atom to the grid point above it (δ can only grow).
    """
    s = np.asarray(mu_squared, dtype=float).ravel()
    p = np.atleast_2d(np.asarray(probabilities, dtype=float))
    scaled = s / grid
    # ceil: rounding noise can only push an atom one grid step further up, never down
    index = np.ceil(scaled) if rounding == "up" else np.floor(scaled)
    index = np.maximum(index, 0).astype(np.int64)
    out = np.zeros((p.shape[0], int(index.max()) + 1))
    np.add.at(out.T, index, p.T)  # out[:, index[m]] += p[:, m]
    missing = 1.0 - out.sum(axis=1)
    out[:, 0] += np.clip(missing, 0.0, None)
    return out


def self_convolve(pmf: np.ndarray, times: int) -> np.ndarray:
    """Row-wise k-fold convolution of probability vectors by one real FFT (clipped at 0)."""
    pmf = np.atleast_2d(pmf)
    length = times * (pmf.shape[1] - 1) + 1
    size = next_fast_len(length, real=True)
    spectrum = rfft(pmf, n=size, axis=1)
    out = irfft(spectrum**times, n=size, axis=1)[:, :length]
    return np.clip(out, 0.0, None)


def plot_tradeoff(curves: dict[str, TradeOff] | Sequence[TradeOff], path: str | Path | None = None,
                  *, ax=None, num: int = 201, title: str | None = None):
    """Plot trade-off curves (type-I error α vs type-II error β) and the no-privacy diagonal.

    Returns the matplotlib Axes; saves a PNG when ``path`` is given.
    """
    import matplotlib

    if ax is None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    if not isinstance(curves, dict):
        curves = {repr(f): f for f in curves}
    require(len(curves) > 0, "plot_tradeoff needs at least one curve")
    own_figure = ax is None
    if own_figure:
        fig, ax = plt.subplots(figsize=(4.5, 4.5))
    for label, f in curves.items():
        alpha, beta = f.curve(num)
        ax.plot(alpha, beta, label=label)
    ax.plot([0, 1], [1, 0], color="grey", linestyle=":", label="perfect privacy")
    ax.set_xlabel("type I error α")
    ax.set_ylabel("type II error β = f(α)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_aspect("equal")
    if title:
        ax.set_title(title)
    ax.legend(fontsize="small")
    if path is not None:
        ax.figure.tight_layout()
        ax.figure.savefig(path, dpi=120)
        if own_figure:
            plt.close(ax.figure)
    return ax
