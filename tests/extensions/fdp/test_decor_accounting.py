"""DECOR's Sec-LDP (RDP) and Sec-f-LDP accounting (MATH.md §7)."""

import math

import networkx as nx
import numpy as np
import pytest

from dpdl.errors import DPDLError
from dpdl.extensions.fdp.accounting import (
    GaussianTradeOff,
    calibrate_sigma_decor,
    decor_epsilon,
    decor_privacy,
    decor_rho,
    honest_laplacian,
)

COMMON = dict(steps=3500, delta=1e-5, clip=1.0)


def test_spec_oracles_eavesdropper_only():
    ring = decor_privacy(nx.cycle_graph(16), sigma=189.33600, sigma_cor=501, **COMMON)
    assert ring.rho_step == pytest.approx(1.04097418e-5, rel=1e-7)
    assert ring.epsilon_rdp_simple == pytest.approx(1.3317534, abs=1e-6)
    complete = decor_privacy(nx.complete_graph(16), sigma=153.83550, sigma_cor=251, **COMMON)
    assert complete.epsilon_rdp_simple == pytest.approx(1.0945622, abs=1e-6)


def test_spec_oracle_one_curious_node():
    curious = decor_privacy(nx.cycle_graph(16), sigma=189.33600, sigma_cor=501, curious=[0],
                            **COMMON)
    assert curious.rho_step == pytest.approx(1.74739e-5, rel=1e-5)
    assert curious.epsilon_rdp_simple == pytest.approx(1.73939, abs=1e-5)
    # the honest graph is the path on the other 15 nodes
    path = nx.laplacian_matrix(nx.path_graph(15)).toarray()
    np.testing.assert_array_equal(honest_laplacian(nx.cycle_graph(16), [0]), path)


def test_no_correlated_noise_is_the_plain_gaussian_mechanism():
    rho = decor_rho(nx.cycle_graph(6), sigma=3.0, sigma_cor=0.0, clip=2.0)
    assert rho == pytest.approx(2 * 2.0**2 / 3.0**2)  # (2C)²/(2σ²)
    # and correlated noise only helps
    assert decor_rho(nx.cycle_graph(6), sigma=3.0, sigma_cor=5.0, clip=2.0) < rho


def test_sec_f_ldp_is_never_looser_than_rdp():
    for graph, sigma, sigma_cor in [(nx.cycle_graph(16), 189.336, 501),
                                    (nx.complete_graph(16), 153.8355, 251),
                                    (nx.cycle_graph(8), 20.0, 10.0)]:
        p = decor_privacy(graph, sigma=sigma, sigma_cor=sigma_cor, **COMMON)
        assert p.epsilon_fdp <= p.epsilon_rdp + 1e-12 <= p.epsilon_rdp_simple + 1e-12
        assert p.mu_total == pytest.approx(math.sqrt(2 * p.rho_step * 3500))
        assert p.epsilon_fdp == pytest.approx(GaussianTradeOff(p.mu_total).epsilon(1e-5))


def test_eigen_form_matches_a_direct_inverse():
    graph = nx.random_regular_graph(3, 10, seed=4)
    L = nx.laplacian_matrix(graph, nodelist=range(10)).toarray()
    direct = np.linalg.inv(4.0 * np.eye(10) + 9.0 * L)
    assert decor_rho(graph, sigma=2.0, sigma_cor=3.0) == pytest.approx(
        2 * np.max(np.diag(direct)), rel=1e-12)
    # a symmetric mixing matrix gives the same graph
    W = np.eye(10) * 0.5 + nx.to_numpy_array(graph, nodelist=range(10)) / 6
    assert decor_rho(W, sigma=2.0, sigma_cor=3.0) == pytest.approx(
        decor_rho(graph, sigma=2.0, sigma_cor=3.0))


def test_calibration_recovers_the_oracle_sigma():
    sigma = calibrate_sigma_decor(nx.cycle_graph(16), sigma_cor=501, target_epsilon=1.3317534,
                                  accountant="rdp-simple", **COMMON)
    assert sigma == pytest.approx(189.336, abs=1e-2)
    sigma_f = calibrate_sigma_decor(nx.cycle_graph(16), sigma_cor=501, target_epsilon=1.3317534,
                                    accountant="fdp", **COMMON)
    assert sigma_f < sigma  # the tighter accountant needs less noise
    assert decor_epsilon(nx.cycle_graph(16), sigma=sigma_f, sigma_cor=501, accountant="fdp",
                         **COMMON) <= 1.3317534


def test_bad_inputs():
    with pytest.raises(DPDLError, match="accountant"):
        decor_epsilon(nx.cycle_graph(4), sigma=1.0, sigma_cor=1.0, accountant="x", **COMMON)
    with pytest.raises(DPDLError, match="sigma"):
        decor_rho(nx.cycle_graph(4), sigma=0.0, sigma_cor=1.0)
    with pytest.raises(DPDLError, match="undirected"):
        decor_rho(nx.DiGraph([(0, 1), (1, 2)]), sigma=1.0, sigma_cor=1.0)
    with pytest.raises(DPDLError, match="honest"):
        honest_laplacian(nx.cycle_graph(3), [0, 1, 2])
