"""PN-f-DP of random-walk DP-SGD on any graph (SPEC §7; seed 003, Lemmas 4.1–4.3).

A token walks on the graph with row-stochastic W (W_ab = Pr(token moves a → b)); the node
holding it takes K_loc noisy local steps and passes it on. Node j sees the token whenever the
walk reaches it, so one contribution of node i reaches j after a random number t of hops
(the first hitting time of j from i) and is then μ_t-GDP, or never within T steps.

* First-hitting weights for *all* pairs at once: with H_1 = W and
  H_{t+1} = W H_t − W · diag(H_t) (column j of W H_t minus the paths through j, i.e. the
  product with W̃_j = W whose column j is zeroed), w_t(i, j) = H_t[i, j]; one n×n matrix
  product per hop, w_{T+1} = 1 − Σ_t w_t.
* Per-hop μ_t = √K_loc·Δ/σ · g_t, g_t = 1/√(t+1) (non-convex, Lemma 4.3 in the conservative
  reading of SPEC §7), or for a c-contractive hop map (strongly convex, Lemma 4.2, by the
  shifted-interpolation argument: the optimal split of the shift over the t+1 noise draws)
  g_t² = c^{2t}(1 − c²)/(1 − c^{2(t+1)}), which tends to 1/(t+1) as c → 1.
* The single-visit view reveals the hop count, so its f is the revealed mixture
  Σ_t w_t·G_{μ_t} + w_{T+1}·Id (CDF of the privacy loss F(y) = Σ_t w_t Φ(y/μ_t − μ_t/2) +
  w_{T+1}·1{y ≥ 0}); k of them compose to δ(ε) = E[δ_G(ε; √S)], S the sum of k independent
  copies of μ². The law of S is computed on a grid by one FFT per pair, with μ² rounded *up*
  (certified upper bound) and, on request, *down* (the optimistic twin, for the bracket).
  The grid step is ``relative_slack · μ_1²``, so the total rounding of S is at most
  ``relative_slack · k · μ_1²``: sized by the number of compositions k, not by T.
* k = ⌊T/n⌋ under a contribution cap, or k = ⌈(1+ζ)T/n⌉ with the Markov-chain (Hoeffding
  for reversible chains) slack δ' = exp(−(1−λ)/(1+λ) · 2ζ²T/n²), λ = max(λ₂(W), 0).
* The k-fold law is one real FFT per pair; its negative round-off is clipped to 0. FFT
  round-off (≈1e-16 per point) is not bounded rigorously; it is many orders of magnitude
  below the δ of interest.
* Pairs whose weights agree to 1e-12 share one computation: their representative takes the
  element-wise *largest* cumulative weights Σ_{s≤t} w_s (more mass on short, leakier hops),
  which dominates every member, so the shared answer is an upper bound for each of them.

The RDP baseline (Cyffers et al. 2024, SPEC §7) is ρ_ij = Δ²(T·H_T/(σ²n²) +
T·[log W]_ij/(σ²n)), (α, αρ_ij)-RDP for all α > 1, converted with dp_accounting's RDP
conversion.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq
from scipy.special import ndtr

from dpdl.accounting.fdp_tradeoff import (
    RevealedGaussianMixture,
    bin_mu_squared,
    gaussian_log_delta,
    self_convolve,
)
from dpdl.errors import DPDLError, require

__all__ = [
    "walk_matrix",
    "first_hitting_weights",
    "per_hop_mu",
    "composition_count",
    "markov_slack_delta",
    "single_visit_tradeoff",
    "PairwiseReport",
    "pnfdp_epsilon",
    "pnfdp_epsilon_matrix",
    "rdp_baseline_rho",
    "rdp_baseline_epsilon",
    "rdp_epsilon_from_rho",
    "calibrate_sigma_pnfdp",
    "calibrate_sigma_rdp_baseline",
    "RDP_ORDERS",
]

RDP_ORDERS = np.concatenate([np.linspace(1.01, 10.0, 300), np.geomspace(10.0, 1e5, 300)[1:]])
_MAX_WEIGHT_ENTRIES = 2e8
_CALIBRATION_CANDIDATES = 32
_TINY = 1e-280


def walk_matrix(matrix: ArrayLike) -> np.ndarray:
    """Validate a row-stochastic walk matrix (W_ab = Pr(a → b)); for undirected graphs the
    symmetric mixing matrix of ``dpdl.topology`` is already one (for a directed graph pass
    the transpose of its column-stochastic P)."""
    W = np.asarray(matrix, dtype=float)
    require(W.ndim == 2 and W.shape[0] == W.shape[1] and W.shape[0] >= 2,
            f"walk matrix must be square n×n with n >= 2, got shape {W.shape}")
    require(bool(np.all(np.isfinite(W)) and np.all(W >= 0)),
            "walk matrix entries must be finite and >= 0")
    rows = W.sum(axis=1)
    bad = int(np.argmax(np.abs(rows - 1)))
    require(abs(rows[bad] - 1) < 1e-9,
            f"walk matrix must be row-stochastic; row {bad} sums to {rows[bad]!r}")
    return W


def _check_steps(steps: int) -> int:
    require(isinstance(steps, int | np.integer) and steps >= 1,
            f"steps (T) must be a positive integer, got {steps!r}")
    return int(steps)


def first_hitting_weights(walk: ArrayLike, steps: int, *, target: int | None = None) -> np.ndarray:
    """First-hitting weights of SPEC §7 (the reference's w_t), vectorized over pairs.

    Returns shape (T+1, n, n) with ``out[t-1, i, j]`` = Pr(the walk from i first reaches j
    at hop t) for t = 1..T and ``out[T, i, j]`` = Pr(it does not within T hops); with
    ``target=j`` only that column, shape (T+1, n). Diagonal entries are meaningless (i = j).
    """
    W = walk_matrix(walk)
    T = _check_steps(steps)
    n = W.shape[0]
    if target is not None:
        require(isinstance(target, int | np.integer) and 0 <= target < n,
                f"target node must be in [0, {n}), got {target!r}")
        masked = W.copy()
        masked[:, target] = 0.0
        out = np.empty((T + 1, n))
        h = W[:, target].copy()
        for t in range(T):  # a recurrence over hops: each step one matrix-vector product
            out[t] = h
            h = masked @ h
        out[T] = 1.0 - out[:T].sum(axis=0)
        np.clip(out[T], 0.0, None, out=out[T])
        return out
    require((T + 1) * n * n <= _MAX_WEIGHT_ENTRIES,
            f"(T+1)·n² = {(T + 1) * n * n:.3g} weights exceed {_MAX_WEIGHT_ENTRIES:.0e}; "
            "use fewer steps or pass target=")
    out = np.empty((T + 1, n, n))
    H = W.copy()
    for t in range(T):  # one n×n product per hop covers all n² pairs
        out[t] = H
        H = W @ H - W * np.diag(H)[None, :]
    out[T] = 1.0 - out[:T].sum(axis=0)
    np.clip(out[T], 0.0, None, out=out[T])
    return out


def per_hop_mu(steps: int, sigma: float, *, sensitivity: float = 1.0, local_steps: int = 1,
               contraction: float = 1.0) -> np.ndarray:
    """μ_t for t = 1..T (SPEC §7): √K_loc·Δ/(σ√(t+1)), or the contractive (strongly convex)
    form √K_loc·Δ/σ · c^t √((1−c²)/(1−c^{2(t+1)})) when ``contraction`` c < 1.

    c is the Lipschitz constant of one hop's noiseless update map (for an m-strongly convex,
    L-smooth loss and η ≤ 2/(m+L), c = (1 − ηm)^{K_loc}); the intermediate noise draws of a
    hop are given no shift, which only loosens the bound.
    """
    T = _check_steps(steps)
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    require(math.isfinite(sensitivity) and sensitivity > 0,
            f"sensitivity must be > 0, got {sensitivity!r}")
    require(isinstance(local_steps, int | np.integer) and local_steps >= 1,
            f"local_steps must be a positive integer, got {local_steps!r}")
    require(0 < contraction <= 1, f"contraction must lie in (0, 1], got {contraction!r}")
    t = np.arange(1, T + 1, dtype=float)
    if contraction == 1.0:
        shape = 1.0 / np.sqrt(t + 1)
    else:
        c2 = contraction**2
        # c^{2t}(1−c²)/(1−c^{2(t+1)}) in log space (c^{2t} underflows for long walks)
        log_g2 = t * math.log(c2) + math.log1p(-c2) - np.log(-np.expm1((t + 1) * math.log(c2)))
        with np.errstate(under="ignore"):
            shape = np.exp(log_g2 / 2)
    return math.sqrt(local_steps) * sensitivity / sigma * shape


def markov_slack_delta(walk: ArrayLike, steps: int, zeta: float) -> float:
    """δ' = exp(−(1−λ)/(1+λ) · 2ζ²T/n²), λ = max(λ₂, 0) (SPEC §7).

    The Hoeffding bound for Markov chains needs a reversible chain started at its uniform
    stationary law, so W must be symmetric (fails closed otherwise).
    """
    W = walk_matrix(walk)
    T = _check_steps(steps)
    require(math.isfinite(zeta) and zeta > 0, f"zeta must be > 0, got {zeta!r}")
    require(np.allclose(W, W.T, atol=1e-12),
            "the zeta slack needs a symmetric (reversible, uniform-stationary) walk matrix")
    n = W.shape[0]
    eigenvalues = np.linalg.eigvalsh((W + W.T) / 2)
    lam = max(float(eigenvalues[-2]), 0.0)
    require(lam < 1 - 1e-12, "the walk matrix is not connected (λ₂ = 1): no concentration")
    return math.exp(-(1 - lam) / (1 + lam) * 2 * zeta**2 * T / n**2)


def composition_count(n: int, steps: int, *, zeta: float | None = None) -> int:
    """k = ⌊T/n⌋ (contribution cap) or ⌈(1+ζ)T/n⌉ (ζ slack) (SPEC §7)."""
    T = _check_steps(steps)
    if zeta is None:
        k = T // n
        require(k >= 1, f"steps T={T} < n={n}: the cap ⌊T/n⌋ allows no contribution")
        return k
    require(math.isfinite(zeta) and zeta > 0, f"zeta must be > 0, got {zeta!r}")
    return math.ceil((1 + zeta) * T / n - 1e-12)


def single_visit_tradeoff(walk: ArrayLike, source: int, target: int, steps: int, sigma: float,
                          **mu_kwargs) -> RevealedGaussianMixture:
    """f_ij^single: Σ_t w_t G_{μ_t} + w_{T+1} Id with the hop count revealed (Lemma 4.1)."""
    W = walk_matrix(walk)
    require(source != target, f"source and target must differ, got {source} twice")
    require(0 <= source < W.shape[0], f"source node must be in [0, {W.shape[0]}), got {source}")
    weights = first_hitting_weights(W, steps, target=target)[:, source]
    mus = np.append(per_hop_mu(steps, sigma, **mu_kwargs), 0.0)
    return RevealedGaussianMixture.from_mus(mus, weights)


@dataclass(frozen=True)
class PairwiseReport:
    """Pairwise ε of PN-f-DP (or the RDP baseline) for a graph; entry [i, j] is the leakage of
    i's data to j; the diagonal is NaN."""

    accountant: str                 # "pn-fdp" | "rdp-baseline"
    epsilon: np.ndarray             # certified upper bound, (n, n)
    delta: float
    steps: int
    sigma: float
    compositions: int | None = None
    delta_slack: float = 0.0        # δ' of the ζ slack, included in delta
    epsilon_optimistic: np.ndarray | None = None
    method: str = ""
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        off = self.epsilon[~np.isnan(self.epsilon)]
        return {"accountant": self.accountant, "delta": self.delta, "steps": self.steps,
                "sigma": self.sigma, "compositions": self.compositions,
                "delta_slack": self.delta_slack, "method": self.method,
                "epsilon_max": float(off.max()), "epsilon_mean": float(off.mean()),
                "epsilon_min": float(off.min()), **self.extra}


def _dominating_groups(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Group rows (pairs) of ``weights`` (P, T+1) that agree to 1e-12 and give each group the
    element-wise maximum of the cumulative weights, which dominates every member."""
    cumulative = np.cumsum(weights, axis=1)
    cumulative[:, -1] = 1.0
    keys = np.round(cumulative, 12)
    _, first, inverse = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    inverse = inverse.ravel()
    representative = np.zeros((first.size, weights.shape[1]))
    np.maximum.at(representative, inverse, cumulative)
    representative = np.minimum(np.maximum.accumulate(representative, axis=1), 1.0)
    rep_weights = np.diff(representative, axis=1, prepend=0.0)
    return np.clip(rep_weights, 0.0, None), inverse


@dataclass(frozen=True)
class _ComposedLaws:
    """Laws of S = Σ_k μ² (rows) on the grid {0, h, 2h, …} for σ = 1; for another σ the
    support scales by 1/σ² (a rounding that dominated at σ = 1 still dominates), so σ
    calibration reuses one FFT."""

    laws: list[np.ndarray]       # per row: the masses at the support points kept
    support: list[np.ndarray]    # per row: S values at σ = 1 (grid multiples)

    def epsilons(self, sigma: float, delta: float) -> np.ndarray:
        return np.array([_epsilon_of_law(p, np.sqrt(s) / sigma, delta)
                         for p, s in zip(self.laws, self.support, strict=True)])


def _compose_laws(weights: np.ndarray, mu_squared: np.ndarray, compositions: int,
                  relative_slack: float, rounding: str, chunk: int = 64) -> _ComposedLaws:
    """k-fold laws of Σμ² per row of ``weights`` (P, T+1) over the single-visit support
    ``mu_squared`` (at σ = 1), grid step ``relative_slack · max μ²`` (SPEC §7 sizing)."""
    grid = relative_slack * float(mu_squared.max())
    laws, support = [], []
    for start in range(0, weights.shape[0], chunk):
        block = self_convolve(bin_mu_squared(mu_squared, weights[start:start + chunk], grid,
                                             rounding), compositions)
        for row in block:
            kept = np.flatnonzero(row > 0)
            laws.append(np.maximum(row[kept], _TINY))  # no subnormals; only adds mass
            support.append(kept * grid)
    return _ComposedLaws(laws, support)


def _epsilon_of_law(masses: np.ndarray, mus: np.ndarray, delta: float) -> float:
    """Smallest ε with Σ_s p_s δ_G(ε; μ_s) ≤ δ, returned from the certified side."""
    log_target = math.log(delta)
    with np.errstate(divide="ignore"):
        log_masses = np.log(masses)

    positive = mus > 0
    mus_pos, masses_pos = mus[positive], masses[positive]

    def log_delta(eps: float) -> float:
        if eps < 500:  # direct form: ~3x faster; its round-off (~1e-16) is far below δ
            with np.errstate(under="ignore"):
                # arguments below -37 would give subnormals (slow); raising the first one
                # and dropping the second term there only increases δ
                upper_arg = -eps / mus_pos - mus_pos / 2
                second = np.where(upper_arg < -37.0, 0.0, ndtr(np.maximum(upper_arg, -37.0)))
                terms = ndtr(np.maximum(-eps / mus_pos + mus_pos / 2, -37.0)) \
                    - math.exp(eps) * second
                # einsum, not np.dot: a BLAS dot under thread contention is ~1000x slower
                total = float(np.einsum("i,i->", masses_pos, np.maximum(terms, 0.0)))
            return math.log(total) if total > 0 else -math.inf
        with np.errstate(under="ignore"):
            terms = gaussian_log_delta(eps, mus) + log_masses
            peak = float(np.max(terms))
            if not math.isfinite(peak):
                return -math.inf
            return peak + math.log(float(np.sum(np.exp(terms - peak))))

    if log_delta(0.0) <= log_target:
        return 0.0
    # the mixture is dominated by its largest μ, whose ε is a valid upper end
    high = _gaussian_epsilon(float(mus.max()), delta) + 1e-9
    while log_delta(high) > log_target:  # guards the bracket against rounding
        high = 2 * high + 1e-6
    root = brentq(lambda e: log_delta(e) - log_target, 0.0, high, xtol=1e-10, rtol=1e-12)
    step = 1e-10
    while log_delta(root) > log_target:
        root, step = root + step, 2 * step
    return float(root)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    from dpdl.accounting.gdp import epsilon_from_delta

    return epsilon_from_delta(delta, mu) if mu > 0 else 0.0


def _epsilon_from_weights(weights: np.ndarray, mu_squared: np.ndarray, compositions: int,
                          delta: float, relative_slack: float, rounding: str) -> np.ndarray:
    """ε per row of ``weights`` (P, T+1) over the single-visit μ² support ``mu_squared``;
    rows are composed chunk by chunk so that memory stays bounded for large graphs."""
    chunk = 64
    return np.concatenate([
        _compose_laws(weights[start:start + chunk], mu_squared, compositions, relative_slack,
                      rounding).epsilons(1.0, delta)
        for start in range(0, weights.shape[0], chunk)])


def _mechanism_delta(delta: float, walk: np.ndarray, steps: int, zeta: float | None):
    require(isinstance(delta, int | float | np.floating) and 0 < delta < 1,
            f"delta must lie in (0, 1), got {delta!r}")
    slack = 0.0 if zeta is None else markov_slack_delta(walk, steps, zeta)
    require(slack < delta,
            f"the Markov-chain slack δ'={slack:.3g} (zeta={zeta}) is not below delta={delta}; "
            "raise zeta or steps")
    return delta - slack, slack


def pnfdp_epsilon(walk: ArrayLike, source: int, target: int, *, steps: int, sigma: float,
                  delta: float, sensitivity: float = 1.0, local_steps: int = 1,
                  contraction: float = 1.0, zeta: float | None = None,
                  relative_slack: float = 1e-4) -> tuple[float, float]:
    """(certified upper bound, optimistic value) of ε for the pair source → target (SPEC §7)."""
    W = walk_matrix(walk)
    n = W.shape[0]
    require(source != target, f"source and target must differ, got {source} twice")
    require(0 <= source < n, f"source node must be in [0, {n}), got {source!r}")
    require(0 < relative_slack < 1, f"relative_slack must be in (0, 1), got {relative_slack!r}")
    k = composition_count(n, steps, zeta=zeta)
    mech_delta, _ = _mechanism_delta(delta, W, steps, zeta)
    weights = first_hitting_weights(W, steps, target=target)[:, source][None, :]
    mu2 = np.append(per_hop_mu(steps, sigma, sensitivity=sensitivity, local_steps=local_steps,
                               contraction=contraction), 0.0) ** 2
    upper = _epsilon_from_weights(weights, mu2, k, mech_delta, relative_slack, "up")[0]
    lower = _epsilon_from_weights(weights, mu2, k, mech_delta, relative_slack, "down")[0]
    return float(upper), float(lower)


def _pair_weights(W: np.ndarray, steps: int):
    n = W.shape[0]
    weights = first_hitting_weights(W, steps)  # (T+1, n, n)
    off_diagonal = ~np.eye(n, dtype=bool)
    return weights[:, off_diagonal].T, off_diagonal  # (P, T+1)


def pnfdp_epsilon_matrix(walk: ArrayLike, *, steps: int, sigma: float, delta: float,
                         sensitivity: float = 1.0, local_steps: int = 1,
                         contraction: float = 1.0, zeta: float | None = None,
                         relative_slack: float = 1e-4, bracket: bool = False) -> PairwiseReport:
    """The PN-f-DP ε of every ordered pair (i → j), certified upper bounds (SPEC §7)."""
    W = walk_matrix(walk)
    n = W.shape[0]
    require(0 < relative_slack < 1, f"relative_slack must be in (0, 1), got {relative_slack!r}")
    k = composition_count(n, steps, zeta=zeta)
    mech_delta, slack = _mechanism_delta(delta, W, steps, zeta)
    pair_weights, off_diagonal = _pair_weights(W, steps)
    rep_weights, inverse = _dominating_groups(pair_weights)
    mu2 = np.append(per_hop_mu(steps, sigma, sensitivity=sensitivity, local_steps=local_steps,
                               contraction=contraction), 0.0) ** 2

    def matrix(rounding: str, weights: np.ndarray) -> np.ndarray:
        eps = _epsilon_from_weights(weights, mu2, k, mech_delta, relative_slack, rounding)
        out = np.full((n, n), np.nan)
        out[off_diagonal] = eps[inverse]
        return out

    upper = matrix("up", rep_weights)
    optimistic = None
    if bracket:  # the optimistic twin must not use dominated representatives
        groups_exact = np.zeros_like(rep_weights)
        np.add.at(groups_exact, inverse, pair_weights)
        counts = np.bincount(inverse)[:, None]
        optimistic = matrix("down", groups_exact / counts)
    return PairwiseReport(
        accountant="pn-fdp", epsilon=upper, delta=float(delta), steps=int(steps),
        sigma=float(sigma), compositions=k, delta_slack=slack, epsilon_optimistic=optimistic,
        method=f"revealed-mixture FFT (relative_slack={relative_slack:g}, "
               f"{rep_weights.shape[0]} distinct pair classes)",
        extra={"zeta": zeta, "local_steps": local_steps, "contraction": contraction,
               "sensitivity": sensitivity},
    )


def rdp_baseline_rho(walk: ArrayLike, *, steps: int, sigma: float,
                     sensitivity: float = 1.0) -> np.ndarray:
    """ρ_ij = Δ²(T·H_T/(σ²n²) + T·[log W]_ij/(σ²n)), log W = Σ_{λ_k<1} −ln(1−λ_k) u_k u_kᵀ
    (Cyffers et al. 2024 as stated in SPEC §7); needs a symmetric W. Diagonal NaN."""
    W = walk_matrix(walk)
    T = _check_steps(steps)
    require(np.allclose(W, W.T, atol=1e-12), "the RDP baseline needs a symmetric walk matrix")
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    n = W.shape[0]
    eigenvalues, vectors = np.linalg.eigh((W + W.T) / 2)
    below_one = eigenvalues < 1 - 1e-10
    log_w = (vectors[:, below_one] * -np.log1p(-eigenvalues[below_one])) @ vectors[:, below_one].T
    harmonic = float(np.sum(1.0 / np.arange(1, T + 1)))
    rho = sensitivity**2 * (T * harmonic / (sigma**2 * n**2) + T * log_w / (sigma**2 * n))
    np.fill_diagonal(rho, np.nan)
    return rho


def rdp_epsilon_from_rho(rho: ArrayLike, delta: float) -> np.ndarray:
    """ε of an (α, αρ)-RDP guarantee (all α > 1) via dp_accounting's RDP → (ε, δ) conversion.

    ρ = ∞ gives ε = ∞. A negative ρ (the baseline's formula can go below zero for some pairs
    of a small graph) is no guarantee at all, never "ε = 0": it gives NaN, as does the
    diagonal.
    """
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rho = np.asarray(rho, dtype=float)
    require(0 < delta < 1, f"delta must lie in (0, 1), got {delta!r}")
    out = np.full(rho.shape, np.nan)
    out[rho == np.inf] = np.inf
    valid = np.isfinite(rho) & (rho >= 0)
    values, inverse = np.unique(rho[valid], return_inverse=True)
    eps = np.array([compute_epsilon(RDP_ORDERS, RDP_ORDERS * v, delta)[0] for v in values])
    out[valid] = eps[inverse.ravel()]
    return out


def rdp_baseline_epsilon(walk: ArrayLike, *, steps: int, sigma: float, delta: float,
                         sensitivity: float = 1.0) -> PairwiseReport:
    rho = rdp_baseline_rho(walk, steps=steps, sigma=sigma, sensitivity=sensitivity)
    return PairwiseReport(accountant="rdp-baseline", epsilon=rdp_epsilon_from_rho(rho, delta),
                          delta=float(delta), steps=int(steps), sigma=float(sigma),
                          method="rdp (Cyffers et al. 2024), dp_accounting conversion")


def _check_target(target_epsilon: float) -> float:
    require(math.isfinite(target_epsilon) and target_epsilon > 0,
            f"target epsilon must be > 0, got {target_epsilon!r}")
    return float(target_epsilon)


def calibrate_sigma_pnfdp(walk: ArrayLike, *, steps: int, target_epsilon: float, delta: float,
                          sensitivity: float = 1.0, local_steps: int = 1,
                          contraction: float = 1.0, zeta: float | None = None,
                          pair: tuple[int, int] | None = None,
                          relative_slack: float = 1e-4) -> float:
    """The smallest σ (to 1e-4 relative) whose certified PN-f-DP ε ≤ target for the worst
    ordered pair (or for ``pair``). The returned σ is checked against the target."""
    W = walk_matrix(walk)
    target_epsilon = _check_target(target_epsilon)
    n = W.shape[0]
    k = composition_count(n, steps, zeta=zeta)
    mech_delta, _ = _mechanism_delta(delta, W, steps, zeta)
    if pair is None:
        weights, _ = _dominating_groups(_pair_weights(W, steps)[0])
    else:
        i, j = pair
        require(i != j and 0 <= i < n and 0 <= j < n, f"invalid pair {pair!r} for n={n}")
        weights = first_hitting_weights(W, steps, target=j)[:, i][None, :]
    shape = np.append(per_hop_mu(steps, 1.0, sensitivity=sensitivity, local_steps=local_steps,
                                 contraction=contraction), 0.0) ** 2
    # Calibrate on a few candidate pairs (most mass on short hops, largest mean μ²), then
    # check every pair at the σ found and add any pair that still exceeds the target.
    candidates = np.arange(weights.shape[0])
    if weights.shape[0] > _CALIBRATION_CANDIDATES:
        half = _CALIBRATION_CANDIDATES // 2
        candidates = np.union1d(np.argsort(weights @ shape)[-half:],
                                np.argsort(weights[:, 0])[-half:])
    while True:
        laws = _compose_laws(weights[candidates], shape, k, relative_slack, "up")
        sigma = _calibrate_decreasing(
            lambda s, laws=laws: float(laws.epsilons(s, mech_delta).max()), target_epsilon)
        if candidates.size == weights.shape[0]:
            return sigma
        everyone = _epsilon_from_weights(weights, shape / sigma**2, k, mech_delta,
                                         relative_slack, "up")
        violators = np.flatnonzero(everyone > target_epsilon)
        if violators.size == 0:
            return sigma
        candidates = np.union1d(candidates, violators)


def _calibrate_decreasing(epsilon_of_sigma, target: float) -> float:
    """Root of ε(σ) = target for a decreasing ε(σ), returned on the safe side (ε ≤ target)."""
    lo, hi = 0.1, 1.0
    while epsilon_of_sigma(hi) > target:
        lo, hi = hi, hi * 4
        require(hi < 1e8, f"no sigma below 1e8 reaches epsilon {target}")
    while epsilon_of_sigma(lo) <= target:
        lo /= 4
        require(lo > 1e-8, f"epsilon {target} is met even with sigma -> 0")
    root = brentq(lambda log_s: epsilon_of_sigma(math.exp(log_s)) - target,
                  math.log(lo), math.log(hi), xtol=1e-5)
    sigma = math.exp(root)
    while epsilon_of_sigma(sigma) > target:
        sigma *= 1 + 1e-5
    return sigma


def calibrate_sigma_rdp_baseline(walk: ArrayLike, *, steps: int, target_epsilon: float,
                                 delta: float, sensitivity: float = 1.0) -> float:
    """σ with max_ij ε_RDP-baseline = target; ρ ∝ 1/σ², so one 1-D root find in ρ."""
    target_epsilon = _check_target(target_epsilon)
    rho_at_one = float(np.nanmax(rdp_baseline_rho(walk, steps=steps, sigma=1.0,
                                                  sensitivity=sensitivity)))
    if rho_at_one <= 0:
        raise DPDLError("the RDP baseline's ρ is not positive for this graph")

    def worst(sigma: float) -> float:
        return float(rdp_epsilon_from_rho(np.array([rho_at_one / sigma**2]), delta)[0])

    return _calibrate_decreasing(worst, target_epsilon)
