"""MATH.md §6 accounting: oracle values, closed forms, the pairwise accountant vs brute force."""

import math

import numpy as np
import pytest
from dp_accounting import GaussianDpEvent
from dp_accounting.rdp import RdpAccountant

from dpdl.accounting import gdp
from dpdl.errors import DPDLError
from dpdl.extensions.netdp import accounting as nd

# MATH.md §6 oracle: eps0 = 0.1, delta = 1e-7, T = 100 n
ORACLES = {10: (11.762, 13.512), 20: (13.519, 9.759), 100: (20.034, 5.112)}


@pytest.mark.parametrize("n", sorted(ORACLES))
def test_random_walk_heuristic_matches_spec_oracles(n):
    g = nd.random_walk_summation_guarantees(n, 100 * n, 0.1, 1e-7)
    local, network = ORACLES[n]
    assert g["local"].epsilon == pytest.approx(local, abs=1e-3)
    assert g["network"].epsilon == pytest.approx(network, abs=1e-3)
    assert not g["network"].certified


def test_network_beats_local_for_large_n_and_loses_for_small_n():
    for n in (20, 50, 400, 2000):
        g = nd.random_walk_summation_guarantees(n, 100 * n, 0.1, 1e-7)
        assert g["network"].epsilon < g["local"].epsilon, n
    for n in (3, 5, 10):
        g = nd.random_walk_summation_guarantees(n, 100 * n, 0.1, 1e-7)
        assert g["network"].epsilon > g["local"].epsilon, n


def test_epsilon0_calibration_inverts_the_heuristic():
    eps0 = nd.random_walk_epsilon0_for_target(100, 10_000, 5.112, 1e-7)
    assert eps0 == pytest.approx(0.1, rel=1e-3)


def test_advanced_composition_closed_form():
    # k = 4, eps = 0.5, delta' = e^-2: sqrt(2*4*2)*0.5 + 4*0.5*(e^0.5 - 1)
    expected = 4 * 0.5 + 2 * (math.e**0.5 - 1)
    assert nd.advanced_composition(0.5, 4, math.exp(-2)) == pytest.approx(expected, rel=1e-12)
    same = nd.heterogeneous_advanced_composition(np.full(4, 0.5), math.exp(-2))
    assert same == pytest.approx(expected, rel=1e-12)


def test_gaussian_ldp_sigma_is_exactly_calibrated():
    sigma = nd.gaussian_sigma_for_ldp(0.7, 1e-5, sensitivity=2.0)
    # the Gaussian mechanism of sensitivity 2 with noise sigma is (2/sigma)-GDP (MATH.md §1)
    assert gdp.delta_from_epsilon(0.7, 2.0 / sigma) == pytest.approx(1e-5, rel=1e-6)
    assert nd.gaussian_epsilon(sigma, 1e-5, 2.0) == pytest.approx(0.7, rel=1e-6)


def test_vectorized_gdp_epsilon_matches_scalar_reference():
    mus = np.array([0.05, 0.3, 1.0, 2.5, 7.0])
    got = nd.gdp_epsilon(mus, 1e-6)
    want = [gdp.epsilon_from_delta(1e-6, m) for m in mus]
    np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("z", [0.8, 2.0, 10.0])
def test_rdp_conversion_agrees_with_dp_accounting(z):
    acc = RdpAccountant()
    acc.compose(GaussianDpEvent(z), 5)
    reference = acc.get_epsilon(1e-6)
    ours = nd.rdp_epsilon(5 / (2 * z**2), 1e-6)
    # our order grid is finer, so never worse than dp_accounting's, and close to it
    assert ours <= reference + 1e-9
    assert ours == pytest.approx(reference, rel=0.02)


def test_randomized_response_epsilon_and_gamma():
    L, gamma = 5, 0.3
    ratio = (1 - gamma + gamma / L) / (gamma / L)
    assert nd.randomized_response_epsilon(gamma, L) == pytest.approx(math.log(ratio))
    assert nd.randomized_response_gamma(math.log(ratio), L) == pytest.approx(gamma)
    assert nd.randomized_response_epsilon(1.0, L) == 0.0


def test_shuffle_bound_fmt21_theorem_3_1():
    eps0, n, delta = 1.0, 10_000, 1e-6
    e0 = math.e
    expected = math.log(1 + (e0 - 1) / (e0 + 1) * (8 * math.sqrt(e0 * math.log(4 / delta))
                                                   / math.sqrt(n) + 8 * e0 / n))
    assert nd.shuffle_amplification_epsilon(eps0, n, delta) == pytest.approx(expected)
    assert expected < eps0
    # outside eps0 <= ln(n / (16 ln(2/delta))) the bound is not established: no amplification
    assert nd.shuffle_amplification_epsilon(8.0, 1000, delta) == 8.0
    assert nd.shuffle_amplification_epsilon(1.0, 100, delta) == 1.0


def test_ring_summation_guarantees():
    n, K = 50, 10
    g = nd.ring_summation_guarantees(n, K, 0.5, 1e-6, 1e-6)
    sigma = nd.gaussian_sigma_for_ldp(0.5, 1e-6)
    assert g["network"].error == pytest.approx(math.sqrt(math.ceil(K * n / (n - 1))) * sigma)
    assert g["local"].error == pytest.approx(math.sqrt(K * n) * sigma)
    assert g["network"].epsilon == pytest.approx(float(nd.advanced_composition(0.5, K, 1e-6)))
    assert g["network"].delta == pytest.approx(K * 1e-6 + 1e-6)
    # at A1's error, local DP pays a much larger epsilon
    assert g["local-same-error"].epsilon > 3 * g["network"].epsilon


def test_ring_summation_calibration_reaches_the_target():
    eps0, sigma = nd.ring_summation_sigma_for_target(30, 8, 2.0, 1e-7, 1e-6)
    g = nd.ring_summation_guarantees(30, 8, eps0, 1e-7, 1e-6)
    assert g["network"].epsilon == pytest.approx(2.0, rel=1e-9)
    assert g["network"].error == pytest.approx(math.sqrt(math.ceil(8 * 30 / 29)) * sigma)


def test_ring_histogram_network_amplifies_for_large_n():
    g = nd.ring_histogram_guarantees(20_000, 5, 10, 0.5, 1e-7, 1e-7)
    assert g["network"].epsilon < g["local"].epsilon / 3
    gamma = nd.ring_histogram_gamma_for_target(20_000, 5, 10, 1.0, 1e-7, 1e-7)
    eps = nd.ring_histogram_guarantees(20_000, 5, 10, gamma, 1e-7, 1e-7)["network"].epsilon
    assert eps == pytest.approx(1.0, rel=1e-6)


# --------------------------------------------------------------------------- pairwise accountant
def even_spread_allocation(contributions, view):
    """The shift each step absorbs when every contribution at t spreads its unit shift evenly
    over the steps t .. view − 1, and the cost Σ a_τ² of that allocation (by a plain loop)."""
    shift = {}
    for t in contributions:
        for tau in range(t, view):
            shift[tau] = shift.get(tau, 0.0) + 1.0 / (view - t)
    return shift, sum(a * a for a in shift.values())


def brute_force_costs(walk, n, mechanism, contributes, final_view, combine=sum):
    """Direct loop over pairs, viewers' visits and steps (independent of the vectorized code);
    ``combine`` turns the list of per-view costs of a pair into its total."""
    T = len(walk)
    cost = np.full((n, n), np.nan)
    for v in range(n):
        visits = [t for t in range(T) if walk[t] == v]
        ends = visits + ([T] if final_view else [])
        for u in range(n):
            if u == v:
                continue
            views, start = [], 0
            for end in ends:
                steps = [t for t in range(start, end) if walk[t] != v]
                mine = [t for t in steps if walk[t] == u and contributes[t]]
                if mine:
                    if mechanism == "summation":
                        views.append(len(mine) ** 2 / len(steps))
                    else:
                        views.append(even_spread_allocation(mine, end)[1])
                start = end + 1
            cost[u, v] = combine(views)
    return cost


@pytest.mark.parametrize("mechanism", nd.MECHANISMS)
@pytest.mark.parametrize("final_view", [True, False])
def test_pairwise_costs_match_brute_force(mechanism, final_view):
    n, T = 6, 90
    walk = np.random.default_rng(3).integers(0, n, size=T)  # self-loops allowed here
    contributes = nd.contribution_mask(walk, n, cap=12)
    got = nd.pairwise_costs(walk, n, mechanism=mechanism, contributes=contributes,
                            final_view=final_view, chunk=4)
    want = brute_force_costs(walk, n, mechanism, contributes, final_view)
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_the_even_spread_is_an_admissible_shift_allocation_below_cauchy_schwarz():
    # Feldman et al. 2018, Theorem 22: the shifts absorbed never run ahead of the
    # perturbations, and all are absorbed by the view
    rng = np.random.default_rng(11)
    for _ in range(200):
        view = int(rng.integers(2, 60))
        mine = sorted(rng.choice(view, size=int(rng.integers(1, min(view, 8) + 1)),
                                 replace=False).tolist())
        shift, cost = even_spread_allocation(mine, view)
        absorbed = 0.0
        for tau in range(view):
            absorbed += shift.get(tau, 0.0)
            assert absorbed <= sum(1 for t in mine if t <= tau) + 1e-12
        assert absorbed == pytest.approx(len(mine))
        cauchy_schwarz = len(mine) * sum(1.0 / (view - t) for t in mine)
        assert cost <= cauchy_schwarz + 1e-12
        if len(mine) == 1:
            assert cost == pytest.approx(1.0 / (view - mine[0]))


def test_a_handoff_after_an_early_contribution_costs_little_more_than_the_handoff():
    # u contributes 51 steps before v's visit and then hands the token to v: the even
    # spread costs 1 + 3/51 (Σ (2m + 1)/r), where Cauchy–Schwarz charged 2 (1 + 1/51)
    walk = np.array([0] + [2] * 49 + [0, 1])
    cost = nd.pairwise_costs(walk, 3, mechanism="sgd", final_view=False)
    assert cost[0, 1] == pytest.approx(1 + 3 / 51)


def test_advanced_composition_recipe_matches_brute_force():
    n, T, eps0, delta = 5, 70, 0.3, 1e-6
    walk = np.random.default_rng(7).integers(0, n, size=T)

    def advanced(views):  # per view eps0 * sqrt(cost), heterogeneous advanced composition
        e = eps0 * np.sqrt(np.array(views))
        return math.sqrt(2 * math.log(1 / delta) * np.sum(e**2)) + np.sum(e * np.expm1(e))

    want = brute_force_costs(walk, n, "summation", np.ones(T, bool), True, combine=advanced)
    rep = nd.pairwise_privacy(walk, n, epsilon0=eps0, delta=delta, composition="advanced")
    np.testing.assert_allclose(rep.epsilon, want, rtol=1e-12)


def test_pairwise_epsilon_of_a_hand_walk():
    # u = 0 hands the token straight to v = 1 twice: two exact Gaussian releases
    walk = np.array([0, 1, 0, 1])
    z = 3.0
    rep = nd.pairwise_privacy(walk, 2, noise_multiplier=z, delta=1e-5)
    assert rep.epsilon[0, 1] == pytest.approx(gdp.epsilon_from_delta(1e-5, math.sqrt(2) / z))
    # v = 0 sees u = 1's first contribution at t = 2 and the last one in the final token
    assert rep.epsilon[1, 0] == pytest.approx(gdp.epsilon_from_delta(1e-5, math.sqrt(2) / z))


def test_network_pairwise_losses_beat_local_on_a_long_walk():
    n, T = 60, 6000
    walk = np.random.default_rng(0).permutation(np.tile(np.arange(n), T // n))
    z = nd.gaussian_sigma_for_ldp(0.1, 1e-7)
    rep = nd.pairwise_privacy(walk, n, noise_multiplier=z, delta=1e-7)
    assert rep.best <= rep.mean <= rep.worst
    assert rep.worst < rep.local_worst / 2
    adv = nd.pairwise_privacy(walk, n, epsilon0=0.1, delta=1e-7, composition="advanced")
    assert adv.worst < adv.local_worst


def test_noise_multiplier_calibration_hits_the_target_at_the_worst_pair():
    n, T = 20, 800
    walk = np.random.default_rng(1).integers(0, n, size=T)
    mask = nd.contribution_mask(walk, n, nd.contribution_cap(1.2, T, n))
    for mechanism in nd.MECHANISMS:
        z = nd.noise_multiplier_for_target(walk, n, 2.0, 1e-6, mechanism=mechanism,
                                           contributes=mask)
        rep = nd.pairwise_privacy(walk, n, noise_multiplier=z, delta=1e-6,
                                  mechanism=mechanism, contributes=mask)
        assert rep.worst == pytest.approx(2.0, rel=1e-4)
    zl = nd.local_noise_multiplier_for_target(40, 2.0, 1e-6)
    assert gdp.epsilon_from_delta(1e-6, math.sqrt(40) / zl) == pytest.approx(2.0, rel=1e-6)


def test_contribution_cap_and_visit_ranks():
    assert nd.contribution_cap(1.5, 1000, 100) == 15
    assert nd.contribution_cap(0.01, 10, 100) == 1
    walk = np.array([2, 0, 2, 2, 1, 0])
    np.testing.assert_array_equal(nd.visit_ranks(walk, 3), [0, 0, 1, 2, 0, 1])
    np.testing.assert_array_equal(nd.contribution_mask(walk, 3, 2),
                                  [True, True, True, False, True, True])


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: nd.random_walk_summation_guarantees(1, 100, 0.1, 1e-7),
         r"n \(number of users\) must be an integer >= 2, got 1"),
        (lambda: nd.random_walk_summation_guarantees(10, 0, 0.1, 1e-7),
         r"T \(number of steps\) must be an integer >= 1, got 0"),
        (lambda: nd.random_walk_summation_guarantees(10, 100, 0.0, 1e-7), "epsilon0"),
        (lambda: nd.random_walk_summation_guarantees(10, 100, -1.0, 1e-7), "epsilon0"),
        (lambda: nd.ring_summation_guarantees(10, 5, 0.1, 0.0, 1e-6), "delta0"),
        (lambda: nd.pairwise_privacy(np.array([0, 5]), 3, noise_multiplier=1.0, delta=1e-5),
         "outside"),
        (lambda: nd.pairwise_privacy(np.array([0, 1]), 2, noise_multiplier=1.0, delta=1e-5,
                                     mechanism="bogus"), "mechanism"),
    ],
)
def test_bad_input_raises_clear_errors(call, fragment):
    with pytest.raises(DPDLError, match=fragment):
        call()


@pytest.mark.parametrize("target", [0.3, 0.77, 1.0, 2.5, 5.0, 9.9])
@pytest.mark.parametrize("rounds", [3, 17, 100])
def test_ring_summation_calibration_never_lands_above_the_target(target, rounds):
    eps0, _ = nd.ring_summation_sigma_for_target(20, rounds, target, 1e-7, 1e-6)
    assert float(nd.advanced_composition(eps0, rounds, 1e-6)) <= target
    assert float(nd.advanced_composition(eps0 * (1 + 1e-6), rounds, 1e-6)) > target  # tight
