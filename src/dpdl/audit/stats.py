"""Statistics of privacy auditing (MATH.md §8): from attack scores to lower bounds on ε.

Pure numpy/scipy.  Three bounds, each sound only under the assumptions it states:

* :func:`epsilon_lower_bound` -- over *independent* trials (one Bernoulli trial per training
  run): Clopper–Pearson bounds on the attack's TPR and FPR at every threshold, Bonferroni over
  the thresholds, ε_lb = max over thresholds of max(ln((TPR_lb − δ)/FPR_ub),
  ln((TNR_lb − δ)/FNR_ub)).  Sound for any mechanism at the stated confidence, provided the
  thresholds do not depend on the trials being tested (``dpdl.audit`` picks them on a
  separate split).
* :func:`gdp_mu_lower_bound` -- the same confidence bounds read as μ-GDP (Nasr et al. 2023,
  "Tight auditing"): μ_lb = Φ⁻¹(TPR_lb) − Φ⁻¹(FPR_ub); valid only for a mechanism that *is*
  μ-GDP for some μ (an exactly Gaussian mechanism: no subsampling).
* :func:`one_run_epsilon_lower_bound` -- m canaries in *one* training run, each included with
  probability ½, r guesses of which v are right: the bound of Steinke, Nasr & Jagielski 2023
  ("Privacy auditing with one (1) training run", Theorem 5.2 / Corollary 5.4, the p-value of
  their Appendix D).  Clopper–Pearson over the canaries of one run is *not* valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq
from scipy.stats import beta, binom, norm

from dpdl.accounting.gdp import epsilon_from_delta
from dpdl.errors import require

__all__ = [
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "ThresholdBounds",
    "threshold_bounds",
    "epsilon_lower_bound",
    "gdp_mu_lower_bound",
    "gdp_epsilon_lower_bound",
    "one_run_p_value",
    "one_run_epsilon_lower_bound",
]


def _check_alpha(alpha: float) -> float:
    require(0 < alpha < 1, f"the error probability alpha must lie in (0, 1), got {alpha!r}")
    return float(alpha)


def _check_counts(successes: ArrayLike, trials: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    k = np.asarray(successes, dtype=np.int64)
    n = np.broadcast_to(np.asarray(trials, dtype=np.int64), k.shape)
    require(bool(np.all(n >= 1)), "Clopper-Pearson needs at least one trial")
    require(bool(np.all((0 <= k) & (k <= n))), "successes must lie in [0, trials]")
    return k, n


def clopper_pearson_lower(successes: ArrayLike, trials: ArrayLike, alpha: float) -> np.ndarray:
    """One-sided (1 − α) Clopper–Pearson lower bound on a binomial rate: Beta(α; k, n−k+1)."""
    k, n = _check_counts(successes, trials)
    alpha = _check_alpha(alpha)
    with np.errstate(invalid="ignore"):
        bound = beta.ppf(alpha, k, n - k + 1)
    return np.where(k == 0, 0.0, bound)


def clopper_pearson_upper(successes: ArrayLike, trials: ArrayLike, alpha: float) -> np.ndarray:
    """One-sided (1 − α) Clopper–Pearson upper bound on a binomial rate: Beta(1−α; k+1, n−k)."""
    k, n = _check_counts(successes, trials)
    alpha = _check_alpha(alpha)
    with np.errstate(invalid="ignore"):
        bound = beta.ppf(1 - alpha, k + 1, n - k)
    return np.where(k == n, 1.0, bound)


@dataclass(frozen=True)
class ThresholdBounds:
    """Per-threshold confidence bounds, all holding together with probability ≥ confidence."""

    thresholds: np.ndarray
    tpr_lower: np.ndarray
    fpr_upper: np.ndarray
    positives: int
    negatives: int
    confidence: float

    @property
    def tnr_lower(self) -> np.ndarray:
        return 1.0 - self.fpr_upper

    @property
    def fnr_upper(self) -> np.ndarray:
        return 1.0 - self.tpr_lower


def threshold_bounds(
    scores: ArrayLike, members: ArrayLike, thresholds: ArrayLike, confidence: float = 0.95
) -> ThresholdBounds:
    """Clopper–Pearson bounds on TPR and FPR of the test "score ≥ t ⇒ member" at every t.

    Bonferroni: 2G one-sided bounds (G thresholds) each at level α/(2G), so that all of them
    hold at once with probability ≥ 1 − α.  TNR_lb = 1 − FPR_ub and FNR_ub = 1 − TPR_lb are
    the same events, so the reversed test costs nothing extra.
    """
    scores = np.asarray(scores, dtype=np.float64).ravel()
    members = np.asarray(members, dtype=bool).ravel()
    thresholds = np.asarray(thresholds, dtype=np.float64).ravel()
    require(scores.shape == members.shape, "scores and membership labels differ in length")
    require(thresholds.size >= 1, "at least one threshold is needed")
    require(0 < confidence < 1, f"confidence must lie in (0, 1), got {confidence!r}")
    positives, negatives = int(members.sum()), int((~members).sum())
    require(positives >= 1 and negatives >= 1, "need trials both with and without the canary")
    alpha = (1 - confidence) / (2 * thresholds.size)
    guessed = scores[None, :] >= thresholds[:, None]
    tp = (guessed & members[None, :]).sum(axis=1)
    fp = (guessed & ~members[None, :]).sum(axis=1)
    return ThresholdBounds(
        thresholds=thresholds,
        tpr_lower=clopper_pearson_lower(tp, positives, alpha),
        fpr_upper=clopper_pearson_upper(fp, negatives, alpha),
        positives=positives,
        negatives=negatives,
        confidence=float(confidence),
    )


def epsilon_lower_bound(bounds: ThresholdBounds, delta: float) -> float:
    """ε_lb = max over thresholds of max(ln((TPR_lb−δ)/FPR_ub), ln((TNR_lb−δ)/FNR_ub)), ≥ 0.

    (ε, δ)-DP forces TPR ≤ e^ε FPR + δ for every test, and the same with the roles of the two
    neighbouring data sets swapped (MATH.md §8).
    """
    require(0 <= delta < 1, f"delta must lie in [0, 1), got {delta!r}")
    with np.errstate(divide="ignore", invalid="ignore"):
        forward = np.log((bounds.tpr_lower - delta) / bounds.fpr_upper)
        reverse = np.log((bounds.tnr_lower - delta) / bounds.fnr_upper)
    values = np.concatenate([forward, reverse])
    values = values[np.isfinite(values)]
    return float(max(0.0, values.max())) if values.size else 0.0


def gdp_mu_lower_bound(bounds: ThresholdBounds) -> float:
    """μ_lb = max over thresholds of Φ⁻¹(TPR_lb) − Φ⁻¹(FPR_ub), ≥ 0 (Nasr et al. 2023).

    A μ-GDP mechanism has TPR ≤ Φ(Φ⁻¹(FPR) + μ) for every test; valid only where the audited
    mechanism is μ-GDP for some μ (exactly Gaussian, no subsampling).
    """
    with np.errstate(divide="ignore"):
        gaps = norm.ppf(bounds.tpr_lower) - norm.ppf(bounds.fpr_upper)
    gaps = gaps[np.isfinite(gaps)]
    return float(max(0.0, gaps.max())) if gaps.size else 0.0


def gdp_epsilon_lower_bound(bounds: ThresholdBounds, delta: float) -> tuple[float, float]:
    """(μ_lb, ε(δ; μ_lb)) by MATH.md §1.2; (0, 0) when no threshold separates the two classes."""
    mu = gdp_mu_lower_bound(bounds)
    return mu, (epsilon_from_delta(delta, mu) if mu > 0 else 0.0)


# --------------------------------------------------------------------------- one run
def _check_one_run(m: int, r: int, v: int, delta: float) -> None:
    for name, value in (("m", m), ("r", r), ("v", v)):
        require(
            isinstance(value, int | np.integer) and not isinstance(value, bool),
            f"{name} must be an integer, got {value!r}",
        )
    require(m >= 1 and 0 <= v <= r <= m, f"need 0 <= v <= r <= m and m >= 1, got {m}, {r}, {v}")
    require(0 <= delta < 1, f"delta must lie in [0, 1), got {delta!r}")


def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """P[≥ v of r guesses right] under (ε, δ)-DP, m canaries each in with probability ½.

    Steinke, Nasr & Jagielski 2023, Corollary 5.4: with q = e^ε/(1+e^ε) the accuracy of
    ε-randomised response, p = P[Binom(r, q) ≥ v] + 2mδ · max_{1≤i≤v} P[v−i ≤ Binom(r, q) < v]/i.
    """
    _check_one_run(m, r, v, delta)
    require(math.isfinite(epsilon) and epsilon >= 0, f"epsilon must be >= 0, got {epsilon!r}")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    # P[v−i ≤ B < v] = P[B ≥ v−i] − P[B ≥ v]
    window = binom.sf(v - i - 1, r, q) - tail
    return min(tail + 2 * m * delta * float(np.max(window / i)), 1.0)


def one_run_epsilon_lower_bound(
    m: int, r: int, v: int, delta: float, confidence: float = 0.95
) -> float:
    """The largest ε whose null "the mechanism is (ε, δ)-DP" is rejected at 1 − confidence.

    The p-value grows with ε; returns 0 when even ε = 0 is not rejected.  Bisection to 1e-10
    (then the low end, the safe side).
    """
    _check_one_run(m, r, v, delta)
    require(0 < confidence < 1, f"confidence must lie in (0, 1), got {confidence!r}")
    level = 1 - confidence

    def gap(eps: float) -> float:
        return one_run_p_value(m, r, v, eps, delta) - level

    if gap(0.0) >= 0:
        return 0.0
    high = 1.0
    while gap(high) < 0:
        high *= 2
        if high > 1e3:  # every guess right and tiny δ: no finite ε explains it
            return math.inf
    low = brentq(gap, 0.0, high, xtol=1e-10)
    while low > 0 and gap(low) >= 0:  # brentq may land a hair above the root
        low = max(0.0, low - 1e-10)
    return float(low)
