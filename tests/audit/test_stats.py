"""Audit statistics against closed forms, scipy's beta quantiles and the one-run paper's numbers."""

import math

import numpy as np
import pytest
from scipy.stats import beta, norm

from dpdl.accounting.gdp import delta_from_epsilon
from dpdl.audit.stats import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
    gdp_epsilon_lower_bound,
    gdp_mu_lower_bound,
    one_run_epsilon_lower_bound,
    one_run_p_value,
    threshold_bounds,
)
from dpdl.errors import DPDLError


def test_clopper_pearson_matches_beta_quantiles_and_closed_forms():
    k, n, a = np.array([0, 3, 17, 50]), 50, 0.01
    lower = clopper_pearson_lower(k, n, a)
    upper = clopper_pearson_upper(k, n, a)
    assert lower[0] == 0.0 and upper[-1] == 1.0
    for i in (1, 2):
        assert lower[i] == pytest.approx(beta(k[i], n - k[i] + 1).ppf(a), rel=1e-12)
        assert upper[i] == pytest.approx(beta(k[i] + 1, n - k[i]).ppf(1 - a), rel=1e-12)
    # k = 0: upper = 1 − a^(1/n); k = n: lower = a^(1/n) (both solve a binomial tail = a).
    assert upper[0] == pytest.approx(1 - a ** (1 / n), rel=1e-10)
    assert lower[-1] == pytest.approx(a ** (1 / n), rel=1e-10)
    with pytest.raises(DPDLError):
        clopper_pearson_lower(5, 4, 0.05)


def _bounds(tp, positives, fp, negatives, thresholds=1, confidence=0.95):
    """Scores that give exactly tp/fp above a single threshold 0.5 (plus dummy thresholds)."""
    scores = np.concatenate(
        [np.ones(tp), np.zeros(positives - tp), np.ones(fp), np.zeros(negatives - fp)]
    )
    members = np.concatenate([np.ones(positives, bool), np.zeros(negatives, bool)])
    grid = [0.5] + [2.0 + i for i in range(thresholds - 1)]  # extra thresholds above all scores
    return threshold_bounds(scores, members, grid, confidence)


def test_epsilon_lower_is_the_spec_formula_with_bonferroni():
    tp, fp, n, delta = 180, 20, 200, 1e-5
    bounds = _bounds(tp, n, fp, n, thresholds=3)
    a = 0.05 / 6  # 3 thresholds x 2 one-sided bounds
    tpr_lb = beta(tp, n - tp + 1).ppf(a)
    fpr_ub = beta(fp + 1, n - fp).ppf(1 - a)
    forward = math.log((tpr_lb - delta) / fpr_ub)
    reverse = math.log((1 - fpr_ub - delta) / (1 - tpr_lb))
    assert bounds.tpr_lower[0] == pytest.approx(tpr_lb, rel=1e-12)
    assert epsilon_lower_bound(bounds, delta) == pytest.approx(max(forward, reverse), rel=1e-12)
    # more thresholds, wider intervals: never a larger bound
    assert epsilon_lower_bound(_bounds(tp, n, fp, n, thresholds=30), delta) < max(forward, reverse)


def test_no_separation_gives_zero():
    bounds = _bounds(100, 200, 100, 200)
    assert epsilon_lower_bound(bounds, 1e-5) == 0.0
    assert gdp_mu_lower_bound(bounds) == 0.0
    assert gdp_epsilon_lower_bound(bounds, 1e-5) == (0.0, 0.0)


def test_gdp_bound_is_probit_gap_and_converts_with_spec_oracle():
    bounds = _bounds(180, 200, 20, 200)
    mu = norm.ppf(bounds.tpr_lower[0]) - norm.ppf(bounds.fpr_upper[0])
    assert gdp_mu_lower_bound(bounds) == pytest.approx(mu, rel=1e-12)
    mu_lb, eps = gdp_epsilon_lower_bound(bounds, 1e-5)
    assert delta_from_epsilon(eps, mu_lb) == pytest.approx(1e-5, rel=1e-6)


def test_one_run_bound_reproduces_the_papers_worked_numbers():
    # Steinke, Nasr & Jagielski 2023 (arXiv:2305.08846v1): App. D, p. 46 prints 0.673 for
    # (m, r, v, delta) = (1000, 100, 75, 1e-4); §7 (Fig. 11) prints 2.675 for
    # (100000, 1510, 1439, 1e-5); both at 95 % confidence.
    assert one_run_epsilon_lower_bound(1000, 100, 75, 1e-4) == pytest.approx(0.673, abs=1e-3)
    assert one_run_epsilon_lower_bound(100000, 1510, 1439, 1e-5) == pytest.approx(2.675, abs=1e-3)


def test_one_run_bound_pure_dp_closed_form():
    # delta = 0, all r guesses right: p-value q^r with q = e^eps / (1 + e^eps).
    r = 200
    q = 0.05 ** (1 / r)
    assert one_run_epsilon_lower_bound(1000, r, r, 0.0) == pytest.approx(
        math.log(q / (1 - q)), abs=1e-8
    )
    assert one_run_p_value(1000, r, r, math.log(q / (1 - q)), 0.0) == pytest.approx(0.05)


def test_one_run_bound_zero_for_chance_guesses_and_bad_input():
    assert one_run_epsilon_lower_bound(1000, 100, 50, 1e-5) == 0.0
    with pytest.raises(DPDLError):
        one_run_epsilon_lower_bound(10, 20, 5, 1e-5)
