"""Private selection's accounting (Papernot & Steinke, ICLR 2022): every number here is
computed from the paper's definitions in the test itself (by hand, a closed form or brute
force), or by dp_accounting's independent implementation, never by the code under test."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from dpdl.accounting.selection import (
    SELECTION_ORDERS,
    best_of_rdp,
    check_distribution,
    draw_repetitions,
    expected_repetitions,
    gamma_for_mean,
    rdp_epsilon_at,
    schedule_rdp,
)
from dpdl.errors import DPDLError


def paper_pmf(eta: float, gamma: float, k_max: int) -> np.ndarray:
    """P[K = k] for k = 1..k_max, the paper's definition of D_{eta,gamma}."""
    if eta == 0:
        k = np.arange(1, k_max + 1)
        return (1 - gamma) ** k / (k * math.log(1 / gamma))
    k = np.arange(1, k_max + 1)
    product = np.cumprod((k - 1 + eta) / k)  # prod over l < k of (l + eta) / (l + 1)
    return (1 - gamma) ** k / (gamma**-eta - 1) * product


@pytest.mark.parametrize("eta, gamma", [(1.0, 0.1), (0.0, 0.2), (0.5, 0.05), (2.0, 0.3)])
def test_the_distribution_and_its_mean_are_the_papers(eta, gamma):
    pmf = paper_pmf(eta, gamma, 3000)
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    mean = float(np.sum(np.arange(1, pmf.size + 1) * pmf))
    assert expected_repetitions(eta, gamma) == pytest.approx(mean, rel=1e-10)
    assert gamma_for_mean(eta, mean) == pytest.approx(gamma, rel=1e-8)
    # K by inversion of the CDF: the smallest k whose CDF exceeds u
    cdf = np.cumsum(pmf)
    for u in np.linspace(0.0, 0.999, 211):
        assert draw_repetitions(eta, gamma, float(u)) == int(np.searchsorted(cdf, u, "right")) + 1


def test_geometric_draws_by_hand():
    """eta = 1: P[K <= k] = 1 - (1-gamma)^k, so K = floor(log(1-u) / log(1-gamma)) + 1."""
    gamma = 0.1
    assert expected_repetitions(1.0, gamma) == pytest.approx(10.0, rel=1e-12)
    for u in (0.0, 0.05, 0.0999, 0.1001, 0.5, 0.65132, 0.9, 0.99, 0.999999):  # off the steps
        hand = math.floor(math.log(1 - u) / math.log(1 - gamma)) + 1
        assert draw_repetitions(1.0, gamma, u) == hand
    assert draw_repetitions(1.0, gamma, 1 - 2**-53) >= 300  # the far tail ends, finitely


def test_theorem_2_by_hand_for_a_zcdp_run_and_the_geometric_distribution():
    """rho-zCDP run (eps(a) = rho a), eta = 1, gamma = 0.1: the best lambda-hat is
    sqrt(log(1/gamma)/rho), where the lambda-hat terms are 4 sqrt(rho log 10) - 2 rho."""
    rho, gamma = 0.01, 0.1
    hat = math.sqrt(math.log(10) / rho)  # 15.174
    orders = np.array([hat, 32.0])
    bound = best_of_rdp(orders, rho * orders, 1.0, gamma)
    c = 4 * math.sqrt(rho * math.log(10)) - 2 * rho  # 0.58697
    assert bound[1] == pytest.approx(rho * 32 + c + math.log(10) / 31, rel=1e-12)
    assert bound[1] == pytest.approx(0.981248, abs=1e-6)  # by hand: 0.32 + 0.586971 + 0.074277
    assert bound[0] == pytest.approx(rho * hat + c + math.log(10) / (hat - 1), rel=1e-12)


def test_a_pure_dp_run_gives_liu_and_talwars_three_epsilon():
    """A pure eps-DP run (eps(a) = eps at every order) and the geometric distribution: 3 eps
    as the order grows (Liu & Talwar 2019; the paper's corollary (2 + eta) eps)."""
    eps, orders = 0.5, np.array([1e3, 1e5, 1e7])
    bound = best_of_rdp(orders, np.full(3, eps), 1.0, 0.01)
    assert bound[-1] == pytest.approx(3 * eps, abs=1e-4)
    assert np.all(bound >= 3 * eps - 1e-12)


def rényi(p: np.ndarray, q: np.ndarray, order: float) -> float:
    return float(np.log(np.sum(p**order * q ** (1 - order))) / (order - 1))


def best_of_random_k(p: np.ndarray, eta: float, gamma: float) -> np.ndarray:
    """The exact law of the best of K ~ D_{eta,gamma} runs of an ordered output with law p:
    P[best <= y] = E[F(y)^K] = sum_k P[K = k] F(y)^k."""
    pmf = paper_pmf(eta, gamma, 4000)
    cdf = np.cumsum(p)
    best_cdf = np.array([np.sum(pmf * f ** np.arange(1, pmf.size + 1)) for f in cdf])
    return np.diff(np.concatenate([[0.0], best_cdf]))


@pytest.mark.parametrize("eta, gamma", [(1.0, 0.2), (0.0, 0.1), (3.0, 0.5)])
def test_the_bound_holds_for_the_exact_best_of_k_of_a_discrete_mechanism(eta, gamma):
    """Brute force: a run whose score is 0, 1 or 2 (larger is better) on two neighbouring
    data sets; the exact Renyi divergences of the best of K never exceed the bound."""
    p, q = np.array([0.5, 0.3, 0.2]), np.array([0.6, 0.3, 0.1])
    orders = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0, 64.0])
    run = np.array([max(rényi(p, q, a), rényi(q, p, a)) for a in orders])
    bound = best_of_rdp(orders, run, eta, gamma)
    best_p, best_q = best_of_random_k(p, eta, gamma), best_of_random_k(q, eta, gamma)
    exact = np.array([max(rényi(best_p, best_q, a), rényi(best_q, best_p, a)) for a in orders])
    assert np.all(exact <= bound)
    assert np.any(exact > run)  # the selection does leak more than one run: not a vacuous test


@pytest.mark.parametrize("eta, mean", [(1.0, 10.0), (0.0, 5.0), (0.5, 20.0)])
def test_it_agrees_with_dp_accountings_repeat_and_select(eta, mean):
    """dp_accounting's RepeatAndSelectDpEvent (an independent implementation of Theorem 2)
    on a DP-SGD-like run: 1000 steps of a Poisson(0.01)-subsampled Gaussian, z = 1.1."""
    run = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(0.01, dp_event.GaussianDpEvent(1.1)), 1000)
    theirs = rdp.RdpAccountant(list(SELECTION_ORDERS))
    theirs.compose(dp_event.RepeatAndSelectDpEvent(run, mean, eta))
    ours = best_of_rdp(SELECTION_ORDERS, schedule_rdp(np.full(1000, 1.1), 0.01), eta,
                       gamma_for_mean(eta, mean))  # fmt: skip
    eps, _ = rdp_epsilon_at(SELECTION_ORDERS, ours, 1e-5)
    assert eps == pytest.approx(theirs.get_epsilon(1e-5), rel=1e-9)


def test_a_schedules_curve_is_dp_accountings_composition():
    z = np.array([1.0] * 30 + [2.0] * 20)
    theirs = rdp.RdpAccountant(list(SELECTION_ORDERS))
    for value, count in ((1.0, 30), (2.0, 20)):
        theirs.compose(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(value)),
                       count)  # fmt: skip
    curve = schedule_rdp(z, 0.05)
    assert rdp_epsilon_at(SELECTION_ORDERS, curve, 1e-5)[0] == pytest.approx(
        theirs.get_epsilon(1e-5), rel=1e-12)
    # more distinct multipliers than exact composition takes: blocked, never smaller
    many, orders = np.linspace(1.0, 2.0, 201), [2.0, 4.0, 8.0, 16.0, 32.0]
    exact = rdp.RdpAccountant(orders)
    for value in many:
        exact.compose(dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(value)))
    blocked = rdp_epsilon_at(orders, schedule_rdp(many, 0.05, orders), 1e-5)[0]
    assert exact.get_epsilon(1e-5) <= blocked <= 1.05 * exact.get_epsilon(1e-5)


@pytest.mark.parametrize("call, message", [
    (lambda: check_distribution(-0.5, 0.5), "eta .* >= 0, got -0.5"),
    (lambda: check_distribution(1.0, 1.0), "gamma must lie in \\(0, 1\\), got 1.0"),
    (lambda: gamma_for_mean(1.0, 0.5), "mean .* > 1, got 0.5"),
    (lambda: draw_repetitions(1.0, 0.5, 1.0), "uniform must lie in \\[0, 1\\), got 1.0"),
    (lambda: best_of_rdp([1.0, 2.0], [0.1, 0.2], 1.0, 0.5), "every order must be > 1"),
    (lambda: best_of_rdp([2.0], [math.nan], 1.0, 0.5), "rdp must be >= 0"),
])  # fmt: skip
def test_bad_input_is_one_line_naming_the_value(call, message):
    with pytest.raises(DPDLError, match=message) as error:
        call()
    assert "\n" not in str(error.value)


def test_a_replace_one_schedules_curve_bounds_each_order_by_the_next_computed_one():
    """Under replace-one the curve is the replace-one RDP (exact at q = 1: 2 alpha / z^2 per
    step, sensitivity 2C), at each selection order the value of the next order computed, and
    never below the add/remove curve of the same schedule."""
    from dpdl.accounting._rdp_replace import ORDERS
    from dpdl.accounting.selection import SELECTION_ORDERS, schedule_rdp

    full = schedule_rdp([2.0] * 3, 1.0, orders=ORDERS, neighboring="replace-one")
    np.testing.assert_allclose(full, 3 * 2 * ORDERS / 4.0, rtol=1e-12)
    replace = schedule_rdp([1.5] * 10, 0.05, neighboring="replace-one")
    add = schedule_rdp([1.5] * 10, 0.05)
    finite = np.isfinite(replace)
    assert finite.sum() > 20 and np.all(SELECTION_ORDERS[~finite] > ORDERS[-1])
    assert np.all(replace[finite] >= add[finite])
