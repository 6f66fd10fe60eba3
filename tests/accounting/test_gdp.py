"""GDP toolkit (MATH.md §1): oracles, large-ε stability, monotonicity, CLT composition."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dpdl.accounting.gdp import (
    clt_mu_total,
    delta_from_epsilon,
    epsilon_from_delta,
    gaussian_sigma,
    log_delta_from_epsilon,
    mu_from_epsilon_delta,
)
from dpdl.errors import DPDLError


def test_delta_oracle_mu1_eps1():
    assert delta_from_epsilon(1.0, 1.0) == pytest.approx(0.1269367, abs=5e-8)


def test_delta_matches_scipy_closed_form_at_moderate_values():
    for eps, mu in [(0.5, 0.3), (2.0, 1.5), (0.0, 2.0), (4.0, 3.0)]:
        expected = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
        assert delta_from_epsilon(eps, mu) == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("epsilon", "mu"), [(0.3, 0.107716), (1.0, 0.313902), (3.0, 0.817556)])
def test_mu_oracles_at_delta_1e4(epsilon, mu):
    assert mu_from_epsilon_delta(epsilon, 1e-4) == pytest.approx(mu, abs=1e-6)


def test_dp_accounting_gaussian_composition_oracle():
    # Gaussian z = sqrt(3) composed 3 times is 1-GDP: delta(eps=1) = 0.126936 (MATH.md §2).
    mu = math.sqrt(3 * (1 / math.sqrt(3)) ** 2)  # GDP composition: sqrt(sum mu_k^2)
    assert delta_from_epsilon(1.0, mu) == pytest.approx(0.126936, abs=2e-6)


def test_epsilon_inverts_delta():
    for mu in [0.05, 0.3, 1.0, 4.0]:
        for delta in [1e-2, 1e-5, 1e-10]:
            eps = epsilon_from_delta(delta, mu)
            assert delta_from_epsilon(eps, mu) == pytest.approx(delta, rel=1e-8)


def test_epsilon_is_zero_when_delta_exceeds_delta_at_zero():
    mu = 0.1
    delta0 = 2 * norm.cdf(mu / 2) - 1  # δ(0; μ)
    assert epsilon_from_delta(delta0 * 1.01, mu) == 0.0
    assert epsilon_from_delta(delta0 * 0.99, mu) > 0


@pytest.mark.parametrize("epsilon", [50.0, 200.0])
def test_large_epsilon_is_stable(epsilon):
    mu = mu_from_epsilon_delta(epsilon, 1e-4)
    assert math.isfinite(mu)
    assert epsilon_from_delta(1e-4, mu) == pytest.approx(epsilon, rel=1e-10)
    # Upper bound Φ(−ε/μ + μ/2) ≥ δ and the leading-order Mills-ratio behaviour:
    log_delta = log_delta_from_epsilon(epsilon, mu)
    assert log_delta == pytest.approx(math.log(1e-4), abs=1e-9)
    assert log_delta <= norm.logcdf(-epsilon / mu + mu / 2)
    # δ far below the float range stays finite in log space and monotone.
    deep = [log_delta_from_epsilon(epsilon, m) for m in (1.0, 2.0, 3.0)]
    assert all(math.isfinite(v) for v in deep) and deep[0] < deep[1] < deep[2]


def test_large_epsilon_delta_never_nan_or_negative():
    for eps in [50.0, 200.0, 1000.0]:
        for mu in [0.5, 5.0, 30.0]:
            value = delta_from_epsilon(eps, mu)
            assert 0.0 <= value <= 1.0 and not math.isnan(value)


@settings(max_examples=60, deadline=None)
@given(
    eps=st.floats(0.0, 30.0),
    mu=st.floats(0.05, 10.0),
    factor=st.floats(1.01, 3.0),
)
def test_delta_increases_in_mu_and_decreases_in_epsilon(eps, mu, factor):
    base = log_delta_from_epsilon(eps, mu)
    assert log_delta_from_epsilon(eps, mu * factor) > base
    assert log_delta_from_epsilon(eps * factor + 0.01, mu) < base


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.05, 40.0), log10_delta=st.floats(-12.0, -2.0))
def test_mu_and_epsilon_round_trip(eps, log10_delta):
    delta = 10.0**log10_delta
    mu = mu_from_epsilon_delta(eps, delta)
    assert epsilon_from_delta(delta, mu) == pytest.approx(eps, rel=1e-7, abs=1e-9)


def test_gaussian_sigma():
    assert gaussian_sigma(2.0, 0.5) == 4.0
    with pytest.raises(DPDLError, match="mu"):
        gaussian_sigma(1.0, 0.0)
    with pytest.raises(DPDLError, match="sensitivity"):
        gaussian_sigma(-1.0, 1.0)


def test_clt_mu_total_closed_form_and_stability():
    mus = np.array([0.5, 1.0, 2.0])
    expected = 0.01 * math.sqrt(sum(math.exp(m * m) - 1 for m in mus))
    assert clt_mu_total(0.01, mus) == pytest.approx(expected, rel=1e-12)
    # Tiny μ_k: expm1 keeps precision where exp(μ²) − 1 would cancel to 0.
    assert clt_mu_total(1.0, np.full(4, 1e-9)) == pytest.approx(2e-9, rel=1e-9)
    # Huge μ_k: no overflow in log space (exp(900) overflows float64).
    assert clt_mu_total(1e-200, [30.0]) == pytest.approx(math.exp(450 - 200 * math.log(10)))


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: delta_from_epsilon(-1.0, 1.0), "epsilon"),
        (lambda: delta_from_epsilon(1.0, -1.0), "mu"),
        (lambda: epsilon_from_delta(0.0, 1.0), "delta"),
        (lambda: epsilon_from_delta(1.0, 1.0), "delta"),
        (lambda: mu_from_epsilon_delta(float("nan"), 1e-5), "epsilon"),
        (lambda: clt_mu_total(0.0, [1.0]), "sample_rate"),
        (lambda: clt_mu_total(1.5, [1.0]), "sample_rate"),
        (lambda: clt_mu_total(0.1, []), "empty"),
    ],
)
def test_bad_input_raises(call, needle):
    with pytest.raises(DPDLError, match=needle):
        call()
