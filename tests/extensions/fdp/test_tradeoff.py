"""Trade-off function objects (MATH.md §7, first bullet)."""

import math

import numpy as np
import pytest
from dp_accounting.pld import common
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dpdl.errors import DPDLError
from dpdl.extensions.fdp.accounting import (
    EpsilonDeltaTradeOff,
    GaussianTradeOff,
    PLDTradeOff,
    RevealedGaussianMixture,
    TabulatedTradeOff,
    TradeOff,
    compose,
    gaussian_delta,
    gaussian_log_delta,
    plot_tradeoff,
)


def test_gaussian_delta_matches_spec_oracles():
    # MATH.md §1.2: μ = 1, ε = 1 → δ = 0.1269367; at δ = 1e-4, μ(0.3)=0.107716, μ(1)=0.313902
    assert gaussian_delta(1.0, 1.0) == pytest.approx(0.1269367, abs=1e-7)
    assert GaussianTradeOff(0.313902).epsilon(1e-4) == pytest.approx(1.0, abs=1e-5)
    assert GaussianTradeOff(0.107716).epsilon(1e-4) == pytest.approx(0.3, abs=1e-5)
    # large ε stays finite in log space and agrees with the scalar GDP toolkit
    from dpdl.accounting.gdp import log_delta_from_epsilon

    assert np.isfinite(gaussian_log_delta(200.0, 20.0))
    assert gaussian_log_delta(200.0, 20.0) == pytest.approx(log_delta_from_epsilon(200.0, 20.0))


def test_gaussian_curve_is_the_neyman_pearson_error_of_two_normals():
    mu = 1.3
    alpha = np.array([1e-4, 0.01, 0.2, 0.5, 0.9])
    threshold = norm.isf(alpha)  # reject N(0,1) when x > threshold
    beta = norm.cdf(threshold, loc=mu)  # miss rate under N(mu, 1)
    np.testing.assert_allclose(GaussianTradeOff(mu)(alpha), beta, rtol=1e-10)


def test_gaussian_composition_identity_and_pld_agreement():
    a, b = 0.8, 1.5
    composed = GaussianTradeOff(a).compose(GaussianTradeOff(b))
    assert composed.mu == pytest.approx(math.hypot(a, b), rel=1e-14)
    assert GaussianTradeOff(a).self_compose(9).mu == pytest.approx(3 * a)
    # dp_accounting's PLD composition of the two Gaussians agrees with G_sqrt(a²+b²)
    pld = pld_lib.from_gaussian_mechanism(1 / a, value_discretization_interval=1e-4).compose(
        pld_lib.from_gaussian_mechanism(1 / b, value_discretization_interval=1e-4))
    assert pld.get_epsilon_for_delta(1e-5) == pytest.approx(composed.epsilon(1e-5), abs=2e-3)
    # and f values agree along the curve
    alpha = np.linspace(0.001, 0.999, 50)
    np.testing.assert_allclose(composed(alpha), GaussianTradeOff(math.hypot(a, b))(alpha))


def test_epsilon_delta_round_trip_and_dp_accounting_profile():
    eps, delta = 1.2, 1e-3
    f = EpsilonDeltaTradeOff(eps, delta)
    assert f.delta(eps) == pytest.approx(delta, abs=1e-14)
    assert f.epsilon(delta) == pytest.approx(eps, abs=1e-12)
    # f(0) = 1 - δ, f(1 - δ) = 0, f(α*) on both lines
    assert f(0.0) == pytest.approx(1 - delta)
    assert f(1 - delta) == pytest.approx(0.0, abs=1e-15)
    # the whole profile δ(ε') agrees with dp_accounting's (ε, δ) PLD
    pld = pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(eps, delta))
    for e in [0.0, 0.3, 0.8, 1.2, 2.0]:
        assert f.delta(e) == pytest.approx(pld.get_delta_for_epsilon(e), abs=1e-9)
    with pytest.raises(DPDLError, match="delta"):
        f.epsilon(1e-5)


def test_tabulated_gaussian_converts_back_to_the_gaussian_profile():
    mu = 1.0
    alpha = np.concatenate([[0.0], np.geomspace(1e-9, 1.0, 4000)])
    table = TabulatedTradeOff(alpha, GaussianTradeOff(mu)(alpha))
    for eps in [0.0, 0.5, 1.0, 2.0]:
        assert table.delta(eps) == pytest.approx(gaussian_delta(eps, mu), abs=2e-4)
        # a polyline through points of a convex f lies above it: δ never overstated upward
        assert table.delta(eps) <= gaussian_delta(eps, mu) + 1e-12
    with pytest.raises(DPDLError, match="non-increasing"):
        TabulatedTradeOff([0, 0.5, 1], [0.2, 0.5, 0])


def test_generic_envelope_is_a_lower_bound_of_f():
    mu = 1.0
    pld_f = PLDTradeOff(pld_lib.from_gaussian_mechanism(1 / mu,
                                                        value_discretization_interval=1e-4))
    alpha = np.linspace(0.0, 1.0, 101)
    exact = GaussianTradeOff(mu)(alpha)
    envelope = pld_f(alpha)
    assert np.all(envelope <= exact + 1e-4)
    assert np.max(exact - envelope) < 5e-3
    # the base-class envelope of a closed-form object never exceeds the closed form
    eps_delta = EpsilonDeltaTradeOff(0.7, 1e-3)
    np.testing.assert_array_less(TradeOff.__call__(eps_delta, alpha), eps_delta(alpha) + 1e-9)


def test_heterogeneous_composition_goes_through_dp_accounting():
    f = compose(GaussianTradeOff(1.0), EpsilonDeltaTradeOff(0.5, 1e-6))
    assert isinstance(f, PLDTradeOff)
    reference = pld_lib.from_gaussian_mechanism(1.0, value_discretization_interval=1e-4).compose(
        pld_lib.from_privacy_parameters(common.DifferentialPrivacyParameters(0.5, 1e-6),
                                        value_discretization_interval=1e-4))
    assert f.epsilon(1e-5) == pytest.approx(reference.get_epsilon_for_delta(1e-5), abs=1e-9)
    # more composition, more loss than either part
    assert f.epsilon(1e-5) > GaussianTradeOff(1.0).epsilon(1e-5)


def test_mixture_with_all_mass_on_one_component_is_that_gaussian():
    mu = 0.9
    single = RevealedGaussianMixture.from_mus([mu, 0.3], [1.0, 0.0])
    for eps in [0.0, 0.5, 2.0]:
        assert single.delta(eps) == pytest.approx(gaussian_delta(eps, mu), rel=1e-12)
    composed = single.self_compose(8)
    exact = GaussianTradeOff(mu * math.sqrt(8)).epsilon(1e-5)
    up = composed.epsilon(1e-5)
    down = single.self_compose(8, rounding="down").epsilon(1e-5)
    assert down - 1e-9 <= exact <= up + 1e-9
    assert up - down < 2e-3


def test_revealed_mixture_matches_dp_accounting_mixture():
    mus, weights = np.array([1.0, 0.5, 0.25]), np.array([0.3, 0.2, 0.4])  # 0.1 never leaks
    ours = RevealedGaussianMixture.from_mus(mus, weights)
    parts = [pld_lib.from_gaussian_mechanism(1 / m, value_discretization_interval=1e-4)
             for m in mus] + [pld_lib.identity(1e-4)]
    probs = np.append(weights, 0.1)
    reference, total = parts[0], probs[0]
    for p, part in zip(probs[1:], parts[1:], strict=True):
        reference = reference.compute_mixture(part, total / (total + p))
        total += p
    for eps in [0.2, 1.0]:
        assert ours.delta(eps) == pytest.approx(reference.get_delta_for_epsilon(eps), abs=1e-4)
    k = 5
    assert ours.self_compose(k).epsilon(1e-5) == pytest.approx(
        reference.self_compose(k).get_epsilon_for_delta(1e-5), abs=3e-3)


def test_bad_inputs_raise(tmp_path):
    with pytest.raises(DPDLError, match="mu"):
        GaussianTradeOff(-1.0)
    with pytest.raises(DPDLError, match="alpha"):
        GaussianTradeOff(1.0)(1.5)
    with pytest.raises(DPDLError, match="delta"):
        GaussianTradeOff(1.0).epsilon(0.0)
    with pytest.raises(DPDLError, match="sum"):
        RevealedGaussianMixture([1.0, 2.0], [0.7, 0.7])
    with pytest.raises(DPDLError, match="times"):
        GaussianTradeOff(1.0).self_compose(0)


def test_plot_tradeoff_writes_png(tmp_path):
    path = tmp_path / "f.png"
    plot_tradeoff({"G_1": GaussianTradeOff(1.0), "(1, 1e-5)": EpsilonDeltaTradeOff(1.0, 1e-5)},
                  path, num=51)
    assert path.stat().st_size > 1000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@settings(max_examples=25, deadline=None)
@given(mu=st.floats(0.05, 8.0), delta=st.floats(1e-9, 0.1))
def test_gaussian_epsilon_delta_round_trip(mu, delta):
    from dpdl.accounting.gdp import mu_from_epsilon_delta

    eps = GaussianTradeOff(mu).epsilon(delta)
    if eps > 0:
        assert GaussianTradeOff(mu).delta(eps) == pytest.approx(delta, rel=1e-6)
        assert mu_from_epsilon_delta(eps, delta) == pytest.approx(mu, rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(a=st.floats(0.0, 5.0), b=st.floats(0.0, 5.0), alpha=st.floats(0.0, 1.0))
def test_composition_never_helps_privacy(a, b, alpha):
    composed = GaussianTradeOff(a).compose(GaussianTradeOff(b))
    assert composed(alpha) <= GaussianTradeOff(max(a, b))(alpha) + 1e-12
