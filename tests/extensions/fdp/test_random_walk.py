"""PN-f-DP of random-walk DP-SGD (MATH.md §7) and the RDP baseline."""

import math

import networkx as nx
import numpy as np
import pytest
from scipy.linalg import logm

from dpdl.errors import DPDLError
from dpdl.extensions.fdp.accounting import (
    BoundSettings,
    GaussianTradeOff,
    calibrate_sigma_pnfdp,
    calibrate_sigma_rdp_baseline,
    composition_count,
    first_hitting_weights,
    markov_slack_delta,
    per_hop_mu,
    pnfdp_epsilon,
    pnfdp_epsilon_matrix,
    rdp_baseline_epsilon,
    rdp_baseline_rho,
    rdp_epsilon_from_rho,
    single_visit_tradeoff,
)

ORACLE = dict(steps=275, sigma=1.0, delta=1e-5)  # MATH.md §7: ⌊275/32⌋ = 8 compositions
SLACK_1E3 = BoundSettings(relative_slack=1e-3)


@pytest.fixture(scope="module")
def hypercube():
    """n = 32 hypercube, Metropolis–Hastings weights 1/6 (degree 5, self-loop 1/6)."""
    graph = nx.convert_node_labels_to_integers(nx.hypercube_graph(5), ordering="sorted")
    W = nx.to_numpy_array(graph, nodelist=range(32)) / 6
    W += np.diag(1 - W.sum(axis=1))
    return W


def directed_cycle(n):
    return np.roll(np.eye(n), 1, axis=1)  # W[a, a+1] = 1


def test_spec_oracle_neighbouring_pair(hypercube):
    upper, lower = pnfdp_epsilon(hypercube, 0, 1, **ORACLE)
    # MATH.md §7: 6.155 ± 0.002; discretisations bracket [6.1540, 6.1556]; report the upper one
    assert upper == pytest.approx(6.155, abs=2e-3)
    assert 6.1540 <= upper
    assert lower <= upper
    assert upper - lower < 1e-3


def test_first_hitting_weights_are_geometric_on_the_complete_graph():
    n, T = 6, 40
    W = (np.ones((n, n)) - np.eye(n)) / (n - 1)
    weights = first_hitting_weights(W, T)
    q = 1 / (n - 1)
    t = np.arange(1, T + 1)
    geometric = q * (1 - q) ** (t - 1)
    np.testing.assert_allclose(weights[:T, 2, 4], geometric, rtol=1e-12)
    assert weights[T, 2, 4] == pytest.approx((1 - q) ** T, rel=1e-10)
    # the single-target recurrence agrees with the all-pairs one
    np.testing.assert_allclose(first_hitting_weights(W, T, target=4), weights[:, :, 4])


def test_first_hitting_weights_on_a_path_by_enumeration():
    # symmetric random walk on a path 0-1-2 with lazy ends: count paths by hand
    W = np.array([[0.5, 0.5, 0.0], [0.5, 0.0, 0.5], [0.0, 0.5, 0.5]])
    w = first_hitting_weights(W, 4)[:, 0, 2]
    # 0→2 first at t=2: 0→1→2 = 1/4; t=3: 0→0→1→2 = 1/8;
    # t=4: 0→0→0→1→2 + 0→1→0→1→2 = 1/16 + 1/16
    np.testing.assert_allclose(w[:4], [0.0, 0.25, 0.125, 0.125])
    assert w[4] == pytest.approx(0.5)


def test_mixture_reduces_to_a_gaussian_on_a_deterministic_walk():
    n, T, sigma, delta = 8, 80, 2.0, 1e-5  # k = 10
    W = directed_cycle(n)
    for hops in (1, 3):
        single = single_visit_tradeoff(W, 0, hops, T, sigma)
        mu = 1 / (sigma * math.sqrt(hops + 1))
        assert single.delta(1.0) == pytest.approx(GaussianTradeOff(mu).delta(1.0), rel=1e-12)
        exact = GaussianTradeOff(mu * math.sqrt(10)).epsilon(delta)
        upper, lower = pnfdp_epsilon(W, 0, hops, steps=T, sigma=sigma, delta=delta)
        assert lower - 1e-9 <= exact <= upper + 1e-9
        assert upper - exact < 1e-3


def test_pairwise_matrix_matches_single_pairs_and_beats_rdp(hypercube):
    report = pnfdp_epsilon_matrix(hypercube, **ORACLE, bound=SLACK_1E3, bracket=True)
    eps = report.epsilon
    assert eps.shape == (32, 32) and np.all(np.isnan(np.diag(eps)))
    # hypercube symmetry: ε depends on the Hamming distance only, neighbours are the worst
    hamming = np.array([[bin(i ^ j).count("1") for j in range(32)] for i in range(32)])
    for d in range(1, 6):
        values = eps[hamming == d]
        assert np.ptp(values) < 1e-9
    assert np.nanmax(eps) == pytest.approx(eps[0, 1])
    assert eps[0, 1] == pytest.approx(6.155, abs=3e-3)
    assert np.all(report.epsilon_optimistic[~np.isnan(eps)] <= eps[~np.isnan(eps)])
    # far pairs leak less
    assert eps[0, 31] < eps[0, 3] < eps[0, 1]
    # a pair computed alone agrees
    upper, _ = pnfdp_epsilon(hypercube, 5, 6, **ORACLE, bound=SLACK_1E3)
    assert eps[5, 6] == pytest.approx(upper, abs=1e-6)
    baseline = rdp_baseline_epsilon(hypercube, **ORACLE).epsilon
    off = ~np.isnan(eps)
    assert np.all(eps[off] < baseline[off])


def test_rdp_baseline_rho_against_matrix_logarithm(hypercube):
    n, T, sigma = 32, 275, 1.0
    log_w = -np.real(logm(np.eye(n) - hypercube + np.ones((n, n)) / n))
    harmonic = sum(1 / t for t in range(1, T + 1))
    expected = T * harmonic / (sigma**2 * n**2) + T * log_w / (sigma**2 * n)
    rho = rdp_baseline_rho(hypercube, steps=T, sigma=sigma)
    off = ~np.eye(n, dtype=bool)
    np.testing.assert_allclose(rho[off], expected[off], rtol=1e-8)


def test_rdp_conversion_sits_between_gdp_and_the_classical_bound():
    for rho in (0.01, 0.3, 2.0):
        eps = rdp_epsilon_from_rho(np.array([rho]), 1e-5)[0]
        assert eps <= rho + 2 * math.sqrt(rho * math.log(1e5)) + 1e-9
        assert eps >= GaussianTradeOff(math.sqrt(2 * rho)).epsilon(1e-5) - 1e-9


def test_per_hop_mu_forms():
    t = np.arange(1, 6)
    # MATH.md §7 lemma form: √K·Δ/(σ√(tK+1)); table form: √K·Δ/(σ√t)
    mu = per_hop_mu(5, 2.0, sensitivity=3.0, local_steps=4)
    np.testing.assert_allclose(mu, 2 * 3 / (2 * np.sqrt(4 * t + 1)))
    table = per_hop_mu(5, 2.0, sensitivity=3.0, local_steps=4, hop_form="table")
    np.testing.assert_allclose(table, 2 * 3 / (2 * np.sqrt(t)))
    assert np.all(table > mu)
    with pytest.raises(DPDLError, match="hop_form"):
        per_hop_mu(5, 1.0, hop_form="paper")
    with pytest.raises(DPDLError, match="contraction"):
        per_hop_mu(5, 1.0, contraction=0.5, hop_form="table")
    c = 0.9
    strong = per_hop_mu(5, 1.0, contraction=c)
    assert strong[0] == pytest.approx(math.sqrt(c**2 / (1 + c**2)))  # t = 1 closed form
    assert np.all(strong < per_hop_mu(5, 1.0))
    np.testing.assert_allclose(per_hop_mu(50, 1.0, contraction=1 - 1e-9), per_hop_mu(50, 1.0),
                               rtol=1e-6)
    assert np.all(np.isfinite(per_hop_mu(100000, 1.0, contraction=0.5)))


def test_zeta_slack(hypercube):
    # hypercube MH matrix (A + I)/6: eigenvalues (6 - 2m)/6, so λ₂ = 2/3
    T, zeta, n = 2750, 1.0, 32
    expected = math.exp(-(1 / 3) / (5 / 3) * 2 * zeta**2 * T / n**2)
    assert markov_slack_delta(hypercube, T, zeta) == pytest.approx(expected, rel=1e-10)
    assert composition_count(n, T, zeta=zeta) == math.ceil(2 * T / n)
    assert composition_count(n, T) == T // n
    with pytest.raises(DPDLError, match="slack"):
        pnfdp_epsilon(hypercube, 0, 1, steps=275, sigma=1.0, delta=1e-5,
                      bound=BoundSettings(zeta=0.5))
    # complete graph W = J/n: λ₂ = 0, δ' = exp(-2ζ²T/n²) = exp(-12.5) for n=8, T=400, ζ=1
    complete = np.full((8, 8), 1 / 8)
    assert markov_slack_delta(complete, 400, 1.0) == pytest.approx(math.exp(-12.5), rel=1e-9)
    capped, _ = pnfdp_epsilon(complete, 0, 1, steps=400, sigma=4.0, delta=1e-3,
                              bound=SLACK_1E3)
    slack, _ = pnfdp_epsilon(complete, 0, 1, steps=400, sigma=4.0, delta=1e-3,
                             bound=BoundSettings(zeta=1.0, relative_slack=1e-3))
    assert slack > capped  # 100 compositions instead of 50


def test_calibration_recovers_the_oracle_sigma(hypercube):
    sigma = calibrate_sigma_pnfdp(hypercube, steps=275, target_epsilon=6.155, delta=1e-5,
                                  pair=(0, 1))
    assert sigma == pytest.approx(1.0, abs=2e-3)  # MATH.md §7: σ = 1 gives 6.155
    upper, _ = pnfdp_epsilon(hypercube, 0, 1, steps=275, sigma=sigma, delta=1e-5)
    assert upper <= 6.155 + 1e-9
    sigma_rdp = calibrate_sigma_rdp_baseline(hypercube, steps=275, target_epsilon=6.155,
                                             delta=1e-5)
    worst = np.nanmax(rdp_baseline_epsilon(hypercube, steps=275, sigma=sigma_rdp,
                                           delta=1e-5).epsilon)
    assert worst <= 6.155 and worst == pytest.approx(6.155, abs=1e-3)
    assert sigma_rdp > sigma  # the RDP baseline needs more noise


def test_bad_inputs_fail_closed(hypercube):
    with pytest.raises(DPDLError, match="row-stochastic"):
        first_hitting_weights(hypercube * 1.1, 10)
    with pytest.raises(DPDLError, match="cap"):
        pnfdp_epsilon(hypercube, 0, 1, steps=20, sigma=1.0, delta=1e-5)
    with pytest.raises(DPDLError, match="differ"):
        pnfdp_epsilon(hypercube, 3, 3, **ORACLE)
    with pytest.raises(DPDLError, match="sigma"):
        per_hop_mu(10, 0.0)
    with pytest.raises(DPDLError, match="symmetric"):
        rdp_baseline_rho(directed_cycle(5), steps=10, sigma=1.0)


def test_worst_pair_calibration_on_an_asymmetric_graph():
    # a random row-stochastic walk: 56 distinct pairs, more than the calibration candidates
    rng = np.random.default_rng(3)
    W = rng.random((8, 8)) * (rng.random((8, 8)) < 0.5) + np.eye(8) * 0.1
    W /= W.sum(axis=1, keepdims=True)
    sigma = calibrate_sigma_pnfdp(W, steps=40, target_epsilon=2.0, delta=1e-5,
                                  bound=BoundSettings(relative_slack=2e-3))
    eps = pnfdp_epsilon_matrix(W, steps=40, sigma=sigma, delta=1e-5,
                               bound=BoundSettings(relative_slack=2e-3)).epsilon
    assert np.nanmax(eps) <= 2.0
    assert np.nanmax(eps) > 1.99


def test_contraction_only_tightens_the_pair_bound(hypercube):
    plain, _ = pnfdp_epsilon(hypercube, 0, 3, **ORACLE, bound=SLACK_1E3)
    strong, _ = pnfdp_epsilon(hypercube, 0, 3, **ORACLE,
                              bound=BoundSettings(relative_slack=1e-3, contraction=0.8))
    assert strong < plain
    # doubling K_loc under the table form √K·Δ/(σ√t) is the same as dividing σ by √2
    table = {"steps": 275, "delta": 1e-5}
    twice, _ = pnfdp_epsilon(hypercube, 0, 3, sigma=1.0, **table, bound=BoundSettings(
        local_steps=2, relative_slack=1e-3, hop_form="table"))
    scaled, _ = pnfdp_epsilon(hypercube, 0, 3, sigma=1 / math.sqrt(2), **table,
                              bound=BoundSettings(relative_slack=1e-3, hop_form="table"))
    assert twice == pytest.approx(scaled, rel=1e-9)
    # the lemma form √K·Δ/(σ√(tK+1)) grows with K but stays below the table form
    lemma_twice, _ = pnfdp_epsilon(hypercube, 0, 3, sigma=1.0, **table, bound=BoundSettings(
        local_steps=2, relative_slack=1e-3, hop_form="lemma"))
    assert plain < lemma_twice < twice


def test_rdp_baseline_never_reports_zero_epsilon_for_a_negative_rho():
    from dpdl.extensions.fdp.random_walk import rdp_epsilon_from_rho

    eps = rdp_epsilon_from_rho(np.array([-0.02, 0.0, 0.5, np.inf, np.nan]), 1e-5)
    assert np.isnan(eps[0]) and np.isnan(eps[4])
    assert eps[1] == 0.0 or eps[1] < 1e-6  # rho = 0 is a real (perfect) guarantee
    assert 0 < eps[2] < np.inf and eps[3] == np.inf


# ------------------------------------------------------------- scale (issue 15)
def hypercube_walk(n):
    from dpdl.extensions.fdp.experiment import walk_matrix_of
    from dpdl.topology import make_topology

    return walk_matrix_of(make_topology("hypercube", n))


def test_column_and_chunks_match_the_full_matrix(hypercube):
    full = pnfdp_epsilon_matrix(hypercube, **ORACLE, bound=SLACK_1E3, chunk=7)
    column = pnfdp_epsilon_matrix(hypercube, **ORACLE, bound=SLACK_1E3, targets=[5])
    np.testing.assert_allclose(column.epsilon[:, 5], full.epsilon[:, 5], rtol=1e-12)
    assert np.all(np.isnan(np.delete(column.epsilon, 5, axis=1)))
    assert column.summary()["pairs"] == 31
    # the RDP (HT) baseline rides along, per pair
    assert np.all(column.epsilon_rdp_ht[:, 5][np.arange(32) != 5] > 0)
    np.testing.assert_allclose(column.epsilon_rdp_ht[:, 5], full.epsilon_rdp_ht[:, 5])


def test_truncated_hitting_weights_stay_an_upper_bound():
    # complete graph: w_t = q(1−q)^{t−1}, q = 1/(n−1); the unreached mass after t hops is
    # (1−q)^t, so a tolerance of 1e-6 stops long before T and moves that mass to hop t+1
    n, T = 6, 600
    W = (np.ones((n, n)) - np.eye(n)) / (n - 1)
    common = {"steps": T, "sigma": 3.0, "delta": 1e-5}
    exact, _ = pnfdp_epsilon(W, 0, 1, bound=BoundSettings(relative_slack=1e-3, tolerance=0.0),
                             **common)
    loose, _ = pnfdp_epsilon(W, 0, 1, bound=BoundSettings(relative_slack=1e-3, tolerance=1e-6),
                             **common)
    default, _ = pnfdp_epsilon(W, 0, 1, bound=SLACK_1E3, **common)
    assert exact < loose < exact + 1e-3  # the moved mass only ever raises ε
    assert default == pytest.approx(exact, abs=1e-9)  # 1e-12 of mass: round-off level
    report = pnfdp_epsilon_matrix(W, bound=BoundSettings(relative_slack=1e-3, tolerance=1e-6),
                                  **common)
    assert report.extra["hops"] < T


def test_rdp_ht_on_the_complete_graph_by_hand():
    from dpdl.extensions.fdp.accounting import rdp_ht_epsilon

    n, T, sigma, delta, sensitivity, local_steps = 6, 300, 2.0, 1e-5, 0.5, 3
    W = (np.ones((n, n)) - np.eye(n)) / (n - 1)
    q = 1 / (n - 1)
    t = np.arange(1, T + 1)
    hand = np.sum(q * (1 - q) ** (t - 1) / t)  # Σ_t w_t / t
    rho = local_steps * sensitivity**2 * T / n * hand / sigma**2
    expected = rdp_epsilon_from_rho(np.array([rho]), delta)[0]
    got = rdp_ht_epsilon(W, 2, 4, steps=T, sigma=sigma, delta=delta, sensitivity=sensitivity,
                         local_steps=local_steps, tolerance=0.0)
    assert got == pytest.approx(expected, rel=1e-10)


def test_pnfdp_beats_rdp_ht_which_beats_cyffers_on_the_oracle_hypercube(hypercube):
    from dpdl.extensions.fdp.accounting import rdp_ht_epsilon

    upper, _ = pnfdp_epsilon(hypercube, 0, 1, **ORACLE)
    ht = rdp_ht_epsilon(hypercube, 0, 1, **ORACLE)
    cyffers = rdp_baseline_epsilon(hypercube, **ORACLE).epsilon[0, 1]
    assert upper < ht < cyffers


@pytest.mark.slow
@pytest.mark.parametrize(("n", "sigma", "expected"),
                         [(256, 0.7446875, 9.997), (2048, 0.3246875, 10.008)])
def test_spec_table_form_oracles(n, sigma, expected):
    # MATH.md §7: hypercube (Metropolis), T = 20000, Δ = 0.4, δ = 1e-5, pair 0 → 1, table form
    upper, lower = pnfdp_epsilon(hypercube_walk(n), 0, 1, steps=20000, sigma=sigma,
                                 delta=1e-5, bound=BoundSettings(sensitivity=0.4,
                                                                 hop_form="table"))
    assert lower <= upper
    assert upper == pytest.approx(expected, abs=2e-3)


@pytest.mark.slow
def test_table_form_calibration_reproduces_the_papers_sigma():
    sigma = calibrate_sigma_pnfdp(hypercube_walk(256), steps=20000, target_epsilon=10.0,
                                  delta=1e-5, pair=(0, 1),
                                  bound=BoundSettings(sensitivity=0.4, hop_form="table"))
    assert sigma == pytest.approx(0.7446875, rel=1e-3)  # the paper's Table 3


def test_large_n_pair_uses_the_sparse_walk():
    # n = 256 pair at T = 2000: T sparse products, no (T+1)·n² table (which would be 1.3e8)
    walk = hypercube_walk(256)
    bound = BoundSettings(sensitivity=0.4, hop_form="table", relative_slack=1e-3)
    upper, lower = pnfdp_epsilon(walk, 0, 1, steps=2000, sigma=0.5, delta=1e-5, bound=bound)
    assert 0 < lower <= upper
    column = pnfdp_epsilon_matrix(walk, steps=2000, sigma=0.5, delta=1e-5, bound=bound,
                                  targets=[1])
    assert column.epsilon[0, 1] == pytest.approx(upper, rel=1e-9)
    # vertex-transitive: sources at equal Hamming distance from the observer share a class
    assert "8 distinct pair classes" in column.method  # Hamming distances 1..8


# --------------------------------------------------------------------------- node symmetry
@pytest.mark.parametrize("name, n, expected", [
    ("hypercube", 8, "xor"), ("undirected-ring", 7, "cyclic"), ("complete", 6, "cyclic"),
    ("star", 6, None),
])
def test_node_transitive_symmetry_is_found_only_where_it_holds(name, n, expected):
    from dpdl.extensions.fdp.random_walk import node_transitive_symmetry
    from dpdl.topology import make_topology

    W = make_topology(name, n).mixing_matrix(0).T
    assert node_transitive_symmetry(W) == expected
    if expected is not None:  # a W that is only nearly symmetric gets no shortcut
        bent = W.copy()
        bent[0, 1] += 1e-13
        bent[0, 0] -= 1e-13
        assert node_transitive_symmetry(bent) is None


@pytest.mark.parametrize("name, n", [("hypercube", 8), ("undirected-ring", 7)])
def test_the_symmetric_shortcut_gives_every_pair_of_the_full_computation(name, n):
    from dpdl.extensions.fdp.random_walk import (
        BoundSettings,
        calibrate_sigma_pnfdp,
        pnfdp_epsilon_matrix,
    )
    from dpdl.topology import make_topology

    W = make_topology(name, n).mixing_matrix(0).T
    common = dict(steps=60, sigma=0.8, delta=1e-5, bound=BoundSettings(relative_slack=2e-3))
    shortcut = pnfdp_epsilon_matrix(W, **common)
    every_column = pnfdp_epsilon_matrix(W, **common, targets=list(range(n)))
    np.testing.assert_allclose(shortcut.epsilon, every_column.epsilon, rtol=1e-9, equal_nan=True)
    np.testing.assert_allclose(shortcut.epsilon_rdp_ht, every_column.epsilon_rdp_ht,
                               rtol=1e-9, equal_nan=True)
    assert "symmetry" in shortcut.method
    calib = dict(steps=60, target_epsilon=3.0, delta=1e-5,
                 bound=BoundSettings(relative_slack=2e-3))
    assert calibrate_sigma_pnfdp(W, **calib) == pytest.approx(
        calibrate_sigma_pnfdp(W, **calib, targets=list(range(n))), rel=1e-9)
