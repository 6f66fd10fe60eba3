"""Network DP accounting for the token algorithms of Cyffers & Bellet (MATH.md §6, seed 002).

Network DP: for every pair u ≠ v, everything v receives is (ε, δ)-DP with respect to u's data.
This module holds the pure mathematics (numpy/scipy/dp_accounting, never torch):

* composition rules: advanced composition, its heterogeneous form, RDP → (ε, δ);
* the local randomizers: the Gaussian mechanism calibrated exactly (analytic Gaussian,
  Balle & Wang 2018, via ``dp_accounting``) and L-ary randomized response;
* amplification by shuffling, Feldman, McMillan & Talwar 2021 ("Hiding among the clones"),
  Theorem 3.1;
* the guarantees of A1 (ring summation), A2 (ring histogram), A3 (random-walk summation, the
  reference-figure heuristic of MATH.md §6) under local, network and central DP, and the
  calibrations that reach a target ε;
* the empirical pairwise accountant over an actual walk (A3 and A4), vectorized over pairs.

Adjacency: one user's data is replaced (user-level replace-one), so a bounded contribution
x ∈ [a, b] has sensitivity b − a and a clipped gradient of norm ≤ L has sensitivity 2L.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import ndtri

from dpdl.accounting import validators as check
from dpdl.accounting.calibration import calibrate_safe
from dpdl.accounting.gdp import gaussian_log_delta
from dpdl.accounting.pairwise import PairwiseEpsilon
from dpdl.accounting.rdp import rdp_epsilon
from dpdl.errors import DPDLError, require

__all__ = [
    "NetDPGuarantee",
    "PairwiseReport",
    "MECHANISMS",
    "advanced_composition",
    "heterogeneous_advanced_composition",
    "gaussian_sigma_for_ldp",
    "gaussian_epsilon",
    "gdp_epsilon",
    "randomized_response_epsilon",
    "randomized_response_gamma",
    "shuffle_amplification_epsilon",
    "ring_summation_guarantees",
    "ring_summation_sigma_for_target",
    "ring_histogram_guarantees",
    "ring_histogram_gamma_for_target",
    "random_walk_contribution_bound",
    "random_walk_summation_guarantees",
    "random_walk_epsilon0_for_target",
    "contribution_cap",
    "visit_ranks",
    "contribution_mask",
    "pairwise_costs",
    "pairwise_privacy",
    "noise_multiplier_for_target",
    "local_noise_multiplier_for_target",
]

MECHANISMS = ("summation", "sgd")
COMPOSITIONS = ("exact", "advanced")


# ---------------------------------------------------------------------------------------------
# input checks

def _users(n) -> int:
    return check.count("n (number of users)", n, 2)


# ---------------------------------------------------------------------------------------------
# composition
def advanced_composition(epsilon: ArrayLike, k: ArrayLike, delta_prime: float) -> np.ndarray:
    """ε of the k-fold adaptive composition of ε-DP mechanisms (Dwork, Rothblum & Vadhan 2010):
    ε' = √(2k ln(1/δ')) ε + k ε (e^ε − 1); the δ's add up to k δ₀ + δ' (MATH.md §6, A1).

    Vectorized over ``epsilon`` and ``k`` (k may be fractional, as in MATH.md §6's heuristic).
    """
    delta_prime = check.probability("delta_prime", delta_prime)
    epsilon, k = np.asarray(epsilon, dtype=float), np.asarray(k, dtype=float)
    if np.any(epsilon < 0) or np.any(k < 0):
        raise DPDLError(f"epsilon and k must be >= 0, got epsilon={epsilon}, k={k}")
    out = np.sqrt(2 * k * math.log(1 / delta_prime)) * epsilon + k * epsilon * np.expm1(epsilon)
    return out if out.ndim else out[()]


def heterogeneous_advanced_composition(
    epsilons: ArrayLike, delta_prime: float, axis: int = -1
) -> np.ndarray:
    """Advanced composition of mechanisms with different ε_i (Kairouz, Oh & Viswanath 2015,
    Thm 3.5 simplified): ε' = √(2 ln(1/δ') Σ ε_i²) + Σ ε_i (e^{ε_i} − 1)."""
    delta_prime = check.probability("delta_prime", delta_prime)
    eps = np.asarray(epsilons, dtype=float)
    if np.any(eps < 0):
        raise DPDLError("per-mechanism epsilons must be >= 0")
    return np.sqrt(2 * math.log(1 / delta_prime) * np.sum(eps**2, axis=axis)) + np.sum(
        eps * np.expm1(eps), axis=axis
    )


def gaussian_sigma_for_ldp(epsilon: float, delta: float, sensitivity: float = 1.0) -> float:
    """Smallest σ for which x ↦ x + N(0, σ²) is (ε, δ)-DP at the given l2 sensitivity.

    Exact (analytic Gaussian mechanism, Balle & Wang 2018) through ``dp_accounting``; this is
    σ_loc of MATH.md §6 (Perturb(·; σ_loc) is (ε, δ)-LDP).
    """
    from dp_accounting import get_sigma_gaussian

    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)
    sensitivity = check.positive("sensitivity", sensitivity)
    sigma = float(get_sigma_gaussian(epsilon, delta)) * sensitivity
    # dp_accounting's σ can sit a round-off above its target: keep the σ evaluated safe
    return calibrate_safe(lambda s: gaussian_epsilon(s, delta, sensitivity), epsilon,
                          (sigma * (1 - 1e-9), sigma * (1 + 1e-6)), xtol=1e-15)


def gaussian_epsilon(sigma: float, delta: float, sensitivity: float = 1.0) -> float:
    """ε at δ of one Gaussian release with noise σ and l2 sensitivity Δ (analytic, exact)."""
    from dp_accounting import get_epsilon_gaussian

    sigma = check.positive("sigma", sigma)
    return float(
        get_epsilon_gaussian(sigma / check.positive("sensitivity", sensitivity),
                             check.probability("delta", delta))
    )


def gdp_epsilon(mu: ArrayLike, delta: float, *, iterations: int = 80) -> np.ndarray:
    """ε(δ; μ) of μ-GDP (MATH.md §1.2, eq. 4) for an array of μ at once.

    ``dpdl.accounting.gdp.epsilon_from_delta`` is the scalar reference; the pairwise accountant
    needs it for n² pairs, so this bisects on log δ(ε; μ) for all μ together (monotone in ε).
    """
    delta = check.probability("delta", delta)
    mu = np.asarray(mu, dtype=float)
    require(np.all(mu >= 0), "mu must be >= 0")
    log_target = math.log(delta)
    safe_mu = np.where(mu > 0, mu, 1.0)

    def log_delta(eps):
        return gaussian_log_delta(eps, safe_mu)

    low = np.zeros_like(safe_mu)
    high = np.maximum(safe_mu * (safe_mu / 2 - ndtri(delta)), 1e-12)
    for _ in range(iterations):
        mid = (low + high) / 2
        above = log_delta(mid) > log_target
        low = np.where(above, mid, low)
        high = np.where(above, high, mid)
    eps = np.where(log_delta(np.zeros_like(safe_mu)) <= log_target, 0.0, high)
    eps = np.where(mu > 0, eps, 0.0)
    return eps if eps.ndim else eps[()]


# ---------------------------------------------------------------------------------------------
# randomized response and shuffling
def randomized_response_epsilon(gamma: float, num_values: int) -> float:
    """ε₀ of L-ary randomized response RR_γ (true value w.p. 1 − γ, else uniform on [L]):
    the likelihood ratio is (1 − γ + γ/L)/(γ/L), so ε₀ = ln(1 + L(1 − γ)/γ)."""
    L = check.count("L (number of values)", num_values, 2)
    require(
        isinstance(gamma, int | float | np.floating) and 0 < gamma <= 1,
        f"gamma must lie in (0, 1], got {gamma!r}",
    )
    return float(math.log1p(L * (1 - gamma) / gamma))


def randomized_response_gamma(epsilon: float, num_values: int) -> float:
    """The γ at which RR_γ on L values is exactly ε-LDP: γ = L / (e^ε − 1 + L)."""
    L = check.count("L (number of values)", num_values, 2)
    epsilon = check.positive("epsilon", epsilon)
    return float(L / (math.expm1(epsilon) + L))


def shuffle_amplification_epsilon(epsilon0: float, n_reports: int, delta: float) -> float:
    """ε of n shuffled ε₀-LDP reports at δ: Feldman, McMillan & Talwar 2021, "Hiding among the
    clones", Theorem 3.1:

        ε ≤ ln(1 + (e^{ε₀} − 1)/(e^{ε₀} + 1) · (8 √(e^{ε₀} ln(4/δ)) / √n + 8 e^{ε₀} / n)),

    valid when ε₀ ≤ ln(n / (16 ln(2/δ))). Outside that range the bound is not established, so
    this fails closed: it returns ε₀ (the shuffled view is post-processing of the user's
    ε₀-LDP report). The result never exceeds ε₀.
    """
    epsilon0 = check.positive("epsilon0", epsilon0)
    n = check.count("number of shuffled reports", n_reports, 1)
    delta = check.probability("delta", delta)
    if 16 * math.log(2 / delta) >= n or epsilon0 > math.log(n / (16 * math.log(2 / delta))):
        return epsilon0
    e0 = math.exp(epsilon0)
    inner = (e0 - 1) / (e0 + 1) * (
        8 * math.sqrt(e0 * math.log(4 / delta)) / math.sqrt(n) + 8 * e0 / n
    )
    return float(min(math.log1p(inner), epsilon0))


# ---------------------------------------------------------------------------------------------
# closed-form guarantees of A1-A3
@dataclass(frozen=True)
class NetDPGuarantee:
    """One privacy guarantee of one token algorithm under one trust model.

    ``error`` is the utility cost that goes with it: the std of the sum estimate (A1, A3) or
    the expected L1 error of the histogram estimate (A2); ``certified`` is False for
    heuristics (MATH.md §6's reference-figure curve), True for proved bounds.
    """

    algorithm: str
    model: str  # "local" | "network" | "central"
    epsilon: float
    delta: float
    contributions: float  # contributions per user that were composed
    error: float | None
    error_kind: str | None  # "std" | "expected-l1" | None
    method: str
    certified: bool

    def to_dict(self) -> dict:
        return asdict(self)


def ring_summation_guarantees(
    n: int,
    rounds: int,
    epsilon0: float,
    delta0: float,
    delta_prime: float,
    *,
    sensitivity: float = 1.0,
) -> dict[str, NetDPGuarantee]:
    """A1 (MATH.md §6; seed 002 Th. 1): Perturb = Gaussian with σ_loc calibrated to (ε₀, δ₀)-LDP.

    * network: noise once every n − 1 hops, so each of v's K views adds ≤ one contribution of
      u and one σ_loc draw; K-fold advanced composition → (ε', K δ₀ + δ'); the estimate's std
      is √⌈Kn/(n − 1)⌉ σ_loc.
    * local, same ε: σ_loc on each of the Kn contributions, std √(Kn) σ_loc.
    * local, same utility ("local-same-error"): per-contribution noise σ_loc·√(draws/(Kn)), each
      release then has a larger ε (exact Gaussian) composed K times.
    * central: a trusted aggregator adds σ_loc to each round's sum: same ε, std √K σ_loc.
    """
    n, K = _users(n), check.count("rounds (K)", rounds, 1)
    eps0, d0 = check.positive("epsilon0", epsilon0), check.probability("delta0", delta0)
    dp = check.probability("delta_prime", delta_prime)
    sigma = gaussian_sigma_for_ldp(eps0, d0, sensitivity)
    composed = float(advanced_composition(eps0, K, dp))
    delta_total = K * d0 + dp
    draws = math.ceil(K * n / (n - 1))
    local_same_error_sigma = sigma * math.sqrt(draws / (K * n))
    eps_same_error = gaussian_epsilon(local_same_error_sigma, d0, sensitivity)
    common = dict(algorithm="ring-summation", delta=delta_total, contributions=float(K),
                  error_kind="std", certified=True)
    return {
        "network": NetDPGuarantee(model="network", epsilon=composed,
                                  error=math.sqrt(draws) * sigma,
                                  method="advanced composition of K Gaussian views (Th. 1)",
                                  **common),
        "local": NetDPGuarantee(model="local", epsilon=composed,
                                error=math.sqrt(K * n) * sigma,
                                method="advanced composition of K LDP releases", **common),
        "local-same-error": NetDPGuarantee(
            model="local", epsilon=float(advanced_composition(eps_same_error, K, dp)),
            error=math.sqrt(draws) * sigma,
            method="LDP noise scaled to A1's error, advanced composition", **common),
        "central": NetDPGuarantee(model="central", epsilon=composed,
                                  error=math.sqrt(K) * sigma,
                                  method="trusted aggregator, one noise per round", **common),
    }


def ring_summation_sigma_for_target(
    n: int, rounds: int, epsilon: float, delta0: float, delta_prime: float, *,
    sensitivity: float = 1.0, model: str = "network",
) -> tuple[float, float]:
    """A1's noise calibration: the (ε₀, σ_loc) with K-fold advanced composition of ε₀ equal to
    the target ε (δ = K δ₀ + δ'). Under "network" σ_loc is drawn once every n − 1 hops, under
    "local" on every contribution; both reach the same ε, the error differs by ≈ √n."""
    n, K = _users(n), check.count("rounds (K)", rounds, 1)
    target = check.positive("epsilon", epsilon)
    require(model in ("network", "local"), f"model must be 'network' or 'local', got {model!r}")
    dp = check.probability("delta_prime", delta_prime)
    eps0 = calibrate_safe(lambda e: float(advanced_composition(e, K, dp)), target, (1e-12, 50.0),
                      xtol=1e-14)
    return float(eps0), gaussian_sigma_for_ldp(eps0, delta0, sensitivity)


def _histogram_expected_l1(n_reports: int, gamma: float, num_values: int, init: int) -> float:
    """Normal-approximation E‖ĥ − h‖₁ of A2's debiased histogram, at the worst case for the
    variance (true values spread evenly), Σ_l √(2/π) std_l."""
    L = num_values
    p_true = 1 - gamma + gamma / L  # report of a value equal to l
    p_other = gamma / L
    per_bin_var = (n_reports / L) * p_true * (1 - p_true) + n_reports * (1 - 1 / L) * p_other * (
        1 - p_other
    ) + init * (1 / L) * (1 - 1 / L)
    return float(L * math.sqrt(2 / math.pi) * math.sqrt(per_bin_var) / (1 - gamma))


def ring_histogram_guarantees(
    n: int,
    rounds: int,
    num_values: int,
    gamma: float,
    delta_shuffle: float,
    delta_prime: float,
) -> dict[str, NetDPGuarantee]:
    """A2 (MATH.md §6; seed 002 Th. 2): each contribution passes RR_γ (ε₀-LDP, ε₀ =
    ln(1 + L(1 − γ)/γ)) and is added to a count-vector token started with n − 1 uniform
    elements.

    * network: between two visits of v the token gains one report from each of the n − 1
      other users (or, before v's first visit, initial uniform elements in their place), i.e. v
      sees a shuffle of n − 1 ε₀-LDP reports of which one is u's. FMT21 Th. 3.1 makes each view
      (ε_s, δ_s)-DP; K views compose (advanced composition, or basic if smaller) →
      (ε', K δ_s + δ').
    * local: K releases of ε₀-LDP, min(advanced, basic composition).
    """
    n, K = _users(n), check.count("rounds (K)", rounds, 1)
    L = check.count("L (number of values)", num_values, 2)
    ds = check.probability("delta_shuffle", delta_shuffle)
    dp = check.probability("delta_prime", delta_prime)
    eps0 = randomized_response_epsilon(gamma, L)
    eps_view = shuffle_amplification_epsilon(eps0, n - 1, ds)
    error = _histogram_expected_l1(K * n, gamma, L, n - 1)
    common = dict(algorithm="ring-histogram", contributions=float(K), error=error,
                  error_kind="expected-l1", certified=True)
    network = min(float(advanced_composition(eps_view, K, dp)), K * eps_view)
    local = min(float(advanced_composition(eps0, K, dp)), K * eps0)
    return {
        "network": NetDPGuarantee(model="network", epsilon=network, delta=K * ds + dp,
                                  method="FMT21 Th. 3.1 per view + composition", **common),
        "local": NetDPGuarantee(model="local", epsilon=local, delta=dp,
                                method="RR_gamma composed K times", **common),
    }


def ring_histogram_gamma_for_target(
    n: int, rounds: int, num_values: int, epsilon: float, delta_shuffle: float,
    delta_prime: float, *, model: str = "network",
) -> float:
    """Smallest γ (fewest random responses, best utility) meeting a target ε for A2."""
    target = check.positive("epsilon", epsilon)
    require(model in ("network", "local"), f"model must be 'network' or 'local', got {model!r}")

    def eps_of(gamma: float) -> float:
        return ring_histogram_guarantees(n, rounds, num_values, gamma, delta_shuffle,
                                         delta_prime)[model].epsilon

    high = 1.0 - 1e-12
    if eps_of(high) > target:
        raise DPDLError(f"epsilon={target} is out of reach for A2 even with gamma -> 1")
    low = 1e-12
    if eps_of(low) <= target:
        return low
    return calibrate_safe(eps_of, target, (low, high), log_scale=False, xtol=1e-12)


def random_walk_contribution_bound(n: int, steps: int, delta: float) -> float:
    """Per-user contributions assumed by MATH.md §6's reference heuristic:
    N = T/n + √(3T/2 · ln(1/δ)) (a Chernoff-style high-probability bound on the visit count)."""
    n, T = _users(n), check.count("T (number of steps)", steps, 1)
    delta = check.probability("delta", delta)
    return T / n + math.sqrt(1.5 * T * math.log(1 / delta))


def random_walk_summation_guarantees(
    n: int, steps: int, epsilon0: float, delta: float
) -> dict[str, NetDPGuarantee]:
    """A3 on the complete graph, MATH.md §6's code-faithful reference heuristic (the curve of the
    paper's Figure 1(a), not a Chernoff-certified bound):

    * local DP = min(advanced composition over N, N ε₀) with δ' = δ;
    * network DP: per-cycle loss ε_c = 3ε₀/√n composed (advanced, δ' = δ) over N + T/n steps,

    where N = ``random_walk_contribution_bound``. Oracles in MATH.md §6 (ε₀ = 0.1, δ = 1e-7,
    T = 100n).
    """
    n, T = _users(n), check.count("T (number of steps)", steps, 1)
    eps0, delta = check.positive("epsilon0", epsilon0), check.probability("delta", delta)
    N = random_walk_contribution_bound(n, T, delta)
    local = min(float(advanced_composition(eps0, N, delta)), N * eps0)
    eps_cycle = 3 * eps0 / math.sqrt(n)
    network = float(advanced_composition(eps_cycle, N + T / n, delta))
    common = dict(algorithm="random-walk-summation", delta=delta, error=None, error_kind=None,
                  certified=False)
    return {
        "local": NetDPGuarantee(model="local", epsilon=local, contributions=N,
                                method="heuristic: min(advanced, basic) over N", **common),
        "network": NetDPGuarantee(model="network", epsilon=network, contributions=N + T / n,
                                  method="heuristic: eps_c = 3 eps0/sqrt(n) over N + T/n",
                                  **common),
    }


def random_walk_epsilon0_for_target(
    n: int, steps: int, epsilon: float, delta: float, *, model: str = "network"
) -> float:
    """The per-contribution ε₀ at which A3's heuristic guarantee (``model``) equals ``epsilon``."""
    target = check.positive("epsilon", epsilon)
    require(model in ("network", "local"), f"model must be 'network' or 'local', got {model!r}")

    def epsilon_of(eps0: float) -> float:
        return random_walk_summation_guarantees(n, steps, eps0, delta)[model].epsilon

    require(epsilon_of(50.0) > target, f"epsilon={target} is larger than the heuristic can express")
    return calibrate_safe(epsilon_of, target, (1e-9, 50.0), xtol=1e-13)


# ---------------------------------------------------------------------------------------------
# walks, caps, and the empirical pairwise accountant
def contribution_cap(c: float, steps: int, n: int) -> int:
    """A4's per-user contribution cap ⌈c·T/n⌉ (MATH.md §6)."""
    c = check.positive("c (cap factor)", c)
    T, n = check.count("T (number of steps)", steps, 1), _users(n)
    return max(1, math.ceil(c * T / n - 1e-12))


def _check_walk(walk, n: int) -> np.ndarray:
    walk = np.asarray(walk)
    require(walk.ndim == 1 and walk.size >= 1, "walk must be a non-empty 1-D array of user ids")
    require(np.issubdtype(walk.dtype, np.integer), f"walk must hold integers, got {walk.dtype}")
    require(
        walk.min() >= 0 and walk.max() < n,
        f"walk holds user ids outside [0, {n}): min {walk.min()}, max {walk.max()}",
    )
    return walk.astype(np.int64)


def visit_ranks(walk: ArrayLike, n: int) -> np.ndarray:
    """For each step t, how many times walk[t]'s user held the token before t (0-based)."""
    n = _users(n)
    walk = _check_walk(walk, n)
    order = np.argsort(walk, kind="stable")
    counts = np.bincount(walk, minlength=n)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    ranks = np.empty_like(walk)
    ranks[order] = np.arange(walk.size) - np.repeat(starts, counts)
    return ranks


def contribution_mask(walk: ArrayLike, n: int, cap: int | None) -> np.ndarray:
    """True where the holder still contributes data (its visit rank is below the cap)."""
    if cap is None:
        return np.ones(np.asarray(walk).shape, dtype=bool)
    cap = check.count("cap", cap, 1)
    return visit_ranks(walk, n) < cap


def pairwise_costs(
    walk: ArrayLike,
    n: int,
    *,
    mechanism: str = "summation",
    contributes: ArrayLike | None = None,
    final_view: bool = True,
    chunk: int = 32,
    reduce=None,
) -> np.ndarray:
    """Privacy cost c[u, v] of u's data in v's view of an actual walk, in units of one Gaussian
    release of noise multiplier 1: v's view is then μ-GDP (summation) or ρ-zCDP-like (SGD)
    with μ² = 2ρ = c / z², z = σ / sensitivity.

    v's view is the token at each of its visits (plus the final token if ``final_view``).
    Between two visits of v (a segment s) the token gains m_s noisy steps, k_{u,s} of them
    carrying u's data (steps where ``contributes`` is False add noise only).

    * "summation" (A3): the view difference is Σ contributions + N(0, m_s σ²), exactly a
      Gaussian mechanism of sensitivity k Δ: c = Σ_s k_{u,s}² / m_s.
    * "sgd" (A4, W convex, η ≤ 2/β and clipping inactive, so every step is a contraction —
      the caller's duty): privacy amplification by iteration (Feldman et al. 2018, Theorem
      22: shifted Rényi divergence, any shift allocation that never runs ahead of the
      perturbations and has absorbed them all at the view). A contribution at step t is
      followed by r = V − t noisy steps before v's visit V; spreading its unit shift evenly,
      1/r on each of those steps, is such an allocation, and its cost is exactly
      Σ_steps (Σ_{i active} 1/r_i)² = Σ_{i,j} 1/max(r_i, r_j) = Σ_i (2 m_i + 1)/r_i, where
      m_i counts u's contributions of the segment that come later (have smaller r). Exact
      when k = 1 (r = 1 when u hands the token to v); at most the Cauchy–Schwarz bound
      k Σ_i 1/r_i of the first version, and up to k times below it.

    Vectorized over viewers in chunks (memory O(T·chunk + chunk·S·n)). Returns (n, n) with
    NaN on the diagonal. ``reduce`` maps the per-segment costs of a chunk, shape
    (viewers, segments, n), to (viewers, n); the default sums them (exact composition).
    """
    n = _users(n)
    walk = _check_walk(walk, n)
    require(mechanism in MECHANISMS, f"mechanism must be one of {MECHANISMS}, got {mechanism!r}")
    T = walk.size
    contributes = (
        np.ones(T, dtype=bool) if contributes is None else np.asarray(contributes, dtype=bool)
    )
    require(contributes.shape == (T,), "contributes must have the walk's shape")
    chunk = check.count("chunk", chunk, 1)
    times = np.arange(T)
    cost = np.full((n, n), np.nan)
    for first in range(0, n, chunk):
        viewers = np.arange(first, min(first + chunk, n))
        B = viewers.size
        visit = walk[:, None] == viewers[None, :]  # (T, B)
        seg = np.cumsum(visit, axis=0)  # segment id of step t for viewer b
        n_visits = seg[-1]
        # end of each step's segment: v's next visit strictly after t (T = the final token)
        marks = np.where(visit, times[:, None], T)
        next_visit = np.minimum.accumulate(marks[::-1], axis=0)[::-1]
        next_visit = np.vstack([next_visit[1:], np.full((1, B), T)])
        seen = (next_visit < T) | final_view
        others = ~visit & seen  # the steps that land in one of v's views
        S = int(n_visits.max()) + 1
        col = np.broadcast_to(np.arange(B), (T, B))
        carry = others & contributes[:, None]
        key = ((col * S + seg) * n + walk[:, None])[carry]
        if mechanism == "summation":
            # noisy steps per (viewer, segment), and u's contributions among them
            m = np.bincount((col * S + seg)[others], minlength=B * S).reshape(B, S).astype(float)
            k = np.bincount(key, minlength=B * S * n).reshape(B, S, n).astype(float)
            with np.errstate(divide="ignore", invalid="ignore"):
                seg_cost = np.where(k > 0, k**2 / m[:, :, None], 0.0)
        else:
            remaining = (next_visit - times[:, None])[carry].astype(float)
            later = _later_in_group(key, np.broadcast_to(times[:, None], (T, B))[carry])
            seg_cost = np.bincount(key, weights=(2 * later + 1) / remaining,
                                   minlength=B * S * n).reshape(B, S, n)
        cost[:, viewers] = (seg_cost.sum(axis=1) if reduce is None else reduce(seg_cost)).T
    cost[np.arange(n), np.arange(n)] = np.nan
    return cost


def _later_in_group(key: np.ndarray, time: np.ndarray) -> np.ndarray:
    """For each entry, how many entries of the same key have a later time."""
    order = np.lexsort((-time, key))  # by key, then latest first
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    run_start = np.repeat(starts, np.diff(np.r_[starts, key.size]))
    later = np.empty(key.size, dtype=float)
    later[order] = np.arange(key.size) - run_start
    return later


@dataclass(frozen=True)
class PairwiseReport(PairwiseEpsilon):
    """Empirical pairwise network-DP losses of one walk (MATH.md §6): ε[u, v] is the loss of u's
    data in v's view; mean/best/worst over the n(n − 1) ordered pairs."""

    mechanism: str
    composition: str
    local_worst: float  # the same walk under local DP (every contribution seen)
    local_mean: float

    def summary(self) -> dict:
        return {"delta": self.delta, "mechanism": self.mechanism,
                "composition": self.composition, "mean": self.mean, "best": self.best,
                "worst": self.worst, "worst_pair": self.worst_pair,
                "local_worst": self.local_worst, "local_mean": self.local_mean}


def _cost_to_epsilon(cost: np.ndarray, z: float, delta: float, mechanism: str) -> np.ndarray:
    if mechanism == "summation":  # exactly Gaussian: μ-GDP, exact conversion
        return gdp_epsilon(np.sqrt(cost) / z, delta)
    return rdp_epsilon(cost / (2 * z**2), delta)


def pairwise_privacy(
    walk: ArrayLike,
    n: int,
    *,
    noise_multiplier: float | None = None,
    delta: float,
    mechanism: str = "summation",
    composition: str = "exact",
    epsilon0: float | None = None,
    contributes: ArrayLike | None = None,
    final_view: bool = True,
) -> PairwiseReport:
    """The empirical pairwise accountant of MATH.md §6 over an actual walk.

    ``composition="exact"`` composes the per-view Gaussian losses exactly (GDP for summation,
    RDP via amplification by iteration for SGD), with noise multiplier z = σ/sensitivity.
    ``composition="advanced"`` is the paper's Figure 1(b) recipe: a view aggregating u's data
    with cost c_s has loss ε₀ √c_s ("privacy grows with √m"), and the losses compose by
    heterogeneous advanced composition at δ' = δ (the per-view δ₀ are not added: as in the
    paper's figure, a heuristic). Under local DP each contribution is seen alone.
    """
    n = _users(n)
    delta = check.probability("delta", delta)
    require(composition in COMPOSITIONS,
            f"composition must be one of {COMPOSITIONS}, got {composition!r}")
    walk = _check_walk(walk, n)
    mask = (np.ones(walk.size, dtype=bool) if contributes is None
            else np.asarray(contributes, dtype=bool))
    local_counts = np.bincount(walk[mask], minlength=n).astype(float)
    if composition == "exact":
        z = check.positive("noise_multiplier", noise_multiplier)
        cost = pairwise_costs(walk, n, mechanism=mechanism, contributes=mask,
                              final_view=final_view)
        eps = np.full((n, n), np.nan)
        off = ~np.eye(n, dtype=bool)
        eps[off] = _cost_to_epsilon(cost[off], z, delta, mechanism)
        local = gdp_epsilon(np.sqrt(local_counts) / z, delta)
    else:
        eps0 = check.positive("epsilon0", epsilon0)
        eps = pairwise_costs(
            walk, n, mechanism=mechanism, contributes=mask, final_view=final_view,
            reduce=lambda seg_cost: heterogeneous_advanced_composition(
                eps0 * np.sqrt(seg_cost), delta, axis=1))
        local = np.minimum(advanced_composition(eps0, local_counts, delta),
                           eps0 * local_counts)
    return PairwiseReport(
        epsilon=eps, delta=delta, mechanism=mechanism, composition=composition,
        local_worst=float(np.max(local)), local_mean=float(np.mean(local)),
    )


def noise_multiplier_for_target(
    walk: ArrayLike,
    n: int,
    epsilon: float,
    delta: float,
    *,
    mechanism: str = "sgd",
    contributes: ArrayLike | None = None,
    final_view: bool = True,
) -> float:
    """Smallest z = σ/sensitivity making every pair of the given walk (ε, δ)-network DP
    (exact composition). The walk is data independent, so calibrating on it is sound; ε is
    monotone in the worst cost, so only the worst pair matters."""
    epsilon = check.positive("epsilon", epsilon)
    delta = check.probability("delta", delta)
    cost = pairwise_costs(walk, n, mechanism=mechanism, contributes=contributes,
                          final_view=final_view)
    worst = float(np.nanmax(cost))
    if worst == 0:
        return 0.0
    if mechanism == "summation":
        from dpdl.accounting.gdp import mu_from_epsilon_delta

        z = math.sqrt(worst) / mu_from_epsilon_delta(epsilon, delta)
    else:
        z = math.sqrt(worst / (2 * _rho_for_epsilon(epsilon, delta)))

    def worst_epsilon(z: float) -> float:  # what pairwise_privacy will report at z
        return float(np.max(_cost_to_epsilon(np.array([worst]), z, delta, mechanism)))

    # z from the inverse is right up to round-off: settle the last bits where ε is evaluated
    return calibrate_safe(worst_epsilon, epsilon, (z * (1 - 1e-9), z * (1 + 1e-6)), xtol=1e-15)


def _rho_for_epsilon(epsilon: float, delta: float) -> float:
    def epsilon_of(rho: float) -> float:
        return float(rdp_epsilon(rho, delta))

    require(epsilon_of(1e4) > epsilon, f"epsilon={epsilon} is too large to calibrate")
    return calibrate_safe(epsilon_of, epsilon, (1e-12, 1e4), xtol=1e-12)


def local_noise_multiplier_for_target(contributions: int, epsilon: float, delta: float) -> float:
    """z = σ/sensitivity so that a user releasing ``contributions`` Gaussian-noised values (all
    seen under local DP) is (ε, δ)-DP: the releases compose to μ = √N / z GDP exactly."""
    from dpdl.accounting.gdp import mu_from_epsilon_delta

    N = check.count("contributions", contributions, 1)
    return math.sqrt(N) / mu_from_epsilon_delta(check.positive("epsilon", epsilon),
                                                check.probability("delta", delta))
