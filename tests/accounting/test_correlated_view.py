"""The exact view of correlated noise (dpdl.accounting.correlated) against a brute-force
Mahalanobis distance of the joint Gaussian view, built forwards by simulating the gossip and
conditioning on what the coalition knows by the Schur complement; closed forms where they exist."""

import math

import numpy as np
import pytest

from dpdl.accounting.correlated import (
    NeighbourhoodZeroSumNoise,
    PairwiseNoise,
    correlated_view_mu,
    make_noise_model,
)
from dpdl.accounting.gossip import view_mu
from dpdl.topology import make_topology


def _random_mixing(rng, n, rounds, density=0.5):
    """Time-varying column-stochastic matrices with random supports (self-loops kept)."""
    Ps = []
    for _ in range(rounds):
        support = (rng.random((n, n)) < density) | np.eye(n, dtype=bool)
        W = support * rng.random((n, n))
        Ps.append(W / W.sum(axis=0, keepdims=True))
    return Ps


def _brute_force_mu(Ps, observers, target, model, sigma=1.0, delta=1.0):
    """Simulate m^t = x^t + inputs^t, x^{t+1} = P^t m^t as affine maps of (θ, every source);
    keep what the coalition receives (or every message: observers = ()); condition the joint
    Gaussian on the functionals the coalition knows; μ² = cᵀ Σ⁺ c."""
    n = Ps[0].shape[0]
    sources = [model.sources(P) for P in Ps]
    widths = [s.matrix.shape[1] for s in sources]
    total = sum(widths)
    x = np.zeros((n, 1 + total))
    seen, known, offset = [], [], 0
    for t, (P, src) in enumerate(zip(Ps, sources, strict=True)):
        message = x.copy()
        message[target, 0] += delta
        message[:, 1 + offset : 1 + offset + widths[t]] += sigma * src.matrix
        for j in range(n):
            if not observers or (j not in observers and any(P[v, j] > 0 for v in observers)):
                seen.append(message[j])
        for v in observers:
            rows = np.zeros((src.knowledge[v].shape[0], total))
            rows[:, offset : offset + widths[t]] = src.knowledge[v]
            known.append(rows)
        x = P @ message
        offset += widths[t]
    A = np.array(seen)
    c, G = A[:, 0], A[:, 1:]
    cov = G @ G.T
    if known:
        K = np.vstack(known)
        cov = cov - (G @ K.T) @ np.linalg.pinv(K @ K.T) @ (K @ G.T)
    w = np.linalg.pinv(cov, rcond=1e-10, hermitian=True) @ c
    if np.linalg.norm(cov @ w - c) > 1e-6 * np.linalg.norm(c):
        return math.inf
    return math.sqrt(float(c @ w))


MODELS = [make_noise_model("independent"), PairwiseNoise(0.7), PairwiseNoise(3.0),
          NeighbourhoodZeroSumNoise(1.5)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.name}")
@pytest.mark.parametrize("case", range(6))
def test_the_view_equals_a_brute_force_mahalanobis_on_random_small_graphs(model, case):
    rng = np.random.default_rng(case)
    n, T = 5, 3
    Ps = _random_mixing(rng, n, T)
    target = int(rng.integers(n))
    others = [v for v in range(n) if v != target]
    observers = tuple(sorted(rng.choice(others, size=int(rng.integers(1, 3)), replace=False)))
    if case == 5:
        observers = ()  # the eavesdropper: every message, no secret
    expected = _brute_force_mu(Ps, list(observers), target, model, sigma=0.8, delta=1.3)
    got = correlated_view_mu(lambda t: Ps[t], rounds=T, target=target, observers=observers,
                             sigma=0.8, sensitivity=1.3, model=model)
    if math.isinf(expected):
        assert math.isinf(got)
    else:
        assert got == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("case", range(4))
def test_without_correlation_it_is_todays_view(case):
    rng = np.random.default_rng(100 + case)
    Ps = _random_mixing(rng, 6, 4, density=0.4)
    got = correlated_view_mu(lambda t: Ps[t], rounds=4, target=0, observers=(2, 5), sigma=1.7,
                             model=make_noise_model("independent"))
    assert got == pytest.approx(view_mu(lambda t: Ps[t], rounds=4, target=0, observers=(2, 5),
                                        sigma=1.7), rel=1e-9)  # fmt: skip


def test_a_coalition_holding_both_ends_of_every_edge_of_the_target_cancels_its_pairwise_noise():
    P = make_topology("complete", 4).mixing_matrix(0)
    independent = correlated_view_mu(P, rounds=3, target=0, observers=(1, 2, 3), sigma=1.0,
                                     model=make_noise_model("independent"))
    for factor in (0.5, 5.0, 50.0):
        held = correlated_view_mu(P, rounds=3, target=0, observers=(1, 2, 3), sigma=1.0,
                                  model=PairwiseNoise(factor))
        assert held == pytest.approx(independent, rel=1e-9)
        # one neighbour alone does not know the target's other edges' noise: they protect
        alone = correlated_view_mu(P, rounds=3, target=0, observers=(1,), sigma=1.0,
                                   model=PairwiseNoise(factor))
        assert alone < correlated_view_mu(P, rounds=3, target=0, observers=(1,), sigma=1.0,
                                          model=make_noise_model("independent")) * 0.99


@pytest.mark.parametrize("n,factor", [(3, 1.0), (5, 0.3), (6, 4.0)])
def test_the_eavesdropper_of_decor_on_the_complete_graph_matches_the_closed_form(n, factor):
    """One round's messages have covariance σ²(I + f² L), L = nI − J the complete graph's
    Laplacian: on 1 the eigenvalue σ², on 1⊥ σ²(1 + f² n); x^t is known from the previous
    messages, so T rounds add up: μ² = T (Δ/σ)² (1/n + (1 − 1/n)/(1 + f² n))."""
    P = make_topology("complete", n).mixing_matrix(0)
    T, sigma, delta = 3, 2.0, 1.5
    mu = correlated_view_mu(P, rounds=T, target=1, observers=(), sigma=sigma, sensitivity=delta,
                            model=PairwiseNoise(factor))
    closed = math.sqrt(T * (delta / sigma) ** 2 * (1 / n + (1 - 1 / n) / (1 + factor**2 * n)))
    assert mu == pytest.approx(closed, rel=1e-9)
    # without correlation the eavesdropper gets local DP's √T Δ/σ
    local = correlated_view_mu(P, rounds=T, target=1, observers=(), sigma=sigma,
                               sensitivity=delta, model=make_noise_model("independent"))
    assert local == pytest.approx(math.sqrt(T) * delta / sigma, rel=1e-9)


def test_bad_models_are_refused_in_one_line():
    from dpdl.errors import DPDLError

    with pytest.raises(DPDLError, match="unknown noise model 'decorr'"):
        make_noise_model("decorr", 1.0)
    with pytest.raises(DPDLError, match="factor must be a finite number > 0, got -1"):
        make_noise_model("pairwise", -1)


@pytest.mark.parametrize("topology,n,factor,curious", [("ring", 6, 2.0, ()),
                                                        ("complete", 5, 0.5, (3,)),
                                                        ("exp", 8, 3.0, ())])
def test_the_sec_ldp_factor_is_decors_own_accountant_per_step(topology, n, factor, curious):
    """seed 003's ρ = 2C² max_i [(σ² I + σ_cor² L_H)⁻¹]_ii (replace-one: 2C) as dpdl's fdp
    extension computes it, against 1/√q from the correlated view's module; and one step of the
    eavesdropper's exact view on the same graph."""
    from dpdl.accounting.correlated import sec_ldp_noise_factor
    from dpdl.extensions.fdp.decor_accounting import decor_rho

    P = make_topology(topology, n)
    sigma, clip = 1.7, 0.9
    rounds = 3 if topology == "exp" else 1
    factor_of = sec_ldp_noise_factor(P.mixing_matrix, rounds=rounds, factor=factor,
                                     curious=curious)
    worst = 0.0
    for t in range(rounds):
        W = P.mixing_matrix(t)
        worst = max(worst, decor_rho(W + W.T, sigma=sigma, sigma_cor=factor * sigma, clip=clip,
                                     curious=curious))  # fmt: skip
    q = worst * sigma**2 / (2 * clip**2)
    assert factor_of == pytest.approx(1 / math.sqrt(q), rel=1e-9)
    if not curious and topology != "exp":  # regular graph: every node alike, one round
        mu = correlated_view_mu(P.mixing_matrix(0), rounds=1, target=0, observers=(),
                                sigma=sigma, sensitivity=clip, model=PairwiseNoise(factor))
        assert mu == pytest.approx(clip / sigma / factor_of, rel=1e-9)


def test_the_schedule_view_is_the_constant_view_at_constant_noise_and_todays_without_correlation():
    from dpdl.accounting.correlated import correlated_schedule_view_mu
    from dpdl.accounting.gossip import schedule_view_mu

    P = make_topology("ring", 6).mixing_matrix
    model = PairwiseNoise(2.0)
    constant = correlated_view_mu(P, rounds=4, target=0, observers=(2,), sigma=1.5,
                                  sensitivity=0.5, model=model)
    assert correlated_schedule_view_mu(P, target=0, observers=(2,), model=model,
                                       sigmas=[1.5] * 4, sensitivities=[0.5] * 4) == \
        pytest.approx(constant, rel=1e-9)  # fmt: skip
    sigmas, deltas = [1.0, 1.5, 2.0], [1.0, 0.8, 0.6]
    assert correlated_schedule_view_mu(
        P, target=0, observers=(3,), model=make_noise_model("independent"), sigmas=sigmas,
        sensitivities=deltas, period=2) == pytest.approx(schedule_view_mu(
            P, target=0, observers=(3,), sigmas=sigmas, sensitivities=deltas, period=2),
        rel=1e-9)  # fmt: skip
