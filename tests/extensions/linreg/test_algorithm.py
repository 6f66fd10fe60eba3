"""MATH.md §5 algorithm: projection, noise scale v(t), convergence without noise, fail-closed
checks. References: scipy optimizers, scipy.stats.laplace, numpy lstsq, networkx graphs."""

import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from scipy import optimize, stats

from dpdl.errors import DPDLError
from dpdl.extensions.linreg.accounting import PowerDecay
from dpdl.extensions.linreg.algorithm import (
    Ball,
    Box,
    LocalProblems,
    clip_labels,
    clip_rows,
    enforce_data_bounds,
    fit_private_linreg,
    omega_bound,
    pooled_least_squares,
    run_linreg,
    run_linreg_replicas,
    spectral_norm_bound_holds,
    validate_symmetric_mixing,
)
from dpdl.topology import make_topology


def metropolis(graph: nx.Graph) -> np.ndarray:
    """Metropolis-Hastings weights built here, independently of dpdl.topology."""
    n = graph.number_of_nodes()
    w = np.zeros((n, n))
    for i, j in graph.edges():
        w[i, j] = w[j, i] = 1.0 / (1 + max(graph.degree[i], graph.degree[j]))
    w[np.diag_indices(n)] = 1.0 - w.sum(axis=1)
    return w


def synthetic_parts(rng, nodes=8, records=30, features=3, noise=0.1):
    beta_true = rng.normal(size=features)
    xs = [rng.normal(size=(records, features)) / np.sqrt(features) for _ in range(nodes)]
    ys = [x @ beta_true + noise * rng.normal(size=records) for x in xs]
    return xs, ys


# ---------------------------------------------------------------------------- projection
def test_ball_projection_matches_a_constrained_optimizer(rng):
    ball = Ball(1.5, center=np.array([0.5, -1.0, 2.0]))
    points = rng.normal(scale=3.0, size=(6, 3))
    projected = ball.project(points)
    for point, proj in zip(points, projected, strict=True):
        reference = optimize.minimize(
            lambda b, p=point: np.sum((b - p) ** 2), ball.center, method="SLSQP",
            constraints=[{"type": "ineq", "fun": lambda b: 1.5**2 - np.sum((b - ball.center)**2)}],
            options={"ftol": 1e-14, "maxiter": 500},
        ).x
        np.testing.assert_allclose(proj, reference, atol=1e-5)
    inside = ball.center + np.array([[0.1, 0.2, -0.3]])
    np.testing.assert_array_equal(ball.project(inside), inside)
    assert ball.bound == pytest.approx(1.5 + np.linalg.norm([0.5, -1.0, 2.0]))
    assert np.all(ball.contains(projected))


def test_box_projection_matches_bounded_least_squares(rng):
    lower, upper = np.array([-1.0, 0.0, -0.5]), np.array([1.0, 2.0, 0.5])
    box = Box(lower, upper)
    points = rng.normal(scale=2.0, size=(5, 3))
    for point, proj in zip(points, box.project(points), strict=True):
        reference = optimize.lsq_linear(np.eye(3), point, bounds=(lower, upper)).x
        np.testing.assert_allclose(proj, reference, atol=1e-9)
    assert box.bound == pytest.approx(np.linalg.norm([1.0, 2.0, 0.5]))
    assert Box(-2.0, 1.0).bound_for(4) == pytest.approx(4.0)


def test_domains_reject_bad_parameters():
    with pytest.raises(DPDLError, match="radius"):
        Ball(0.0)
    with pytest.raises(DPDLError, match="lower <= upper"):
        Box(1.0, -1.0)


# ------------------------------------------------------------------------------ clipping
def test_row_and_label_clipping_enforce_the_data_norm_bounds(rng):
    x = rng.normal(scale=2.0, size=(40, 5))
    clipped, count = clip_rows(x, 1.0)
    norms = np.linalg.norm(x, axis=1)
    assert count == np.count_nonzero(norms > 1.0)
    assert np.all(np.linalg.norm(clipped, axis=1) <= 1.0 + 1e-12)
    np.testing.assert_array_equal(clipped[norms <= 1.0], x[norms <= 1.0])
    y, label_count = clip_labels(rng.normal(scale=3.0, size=40), 2.0)
    assert np.all(np.abs(y) <= 2.0) and label_count > 0
    # MATH.md §5: delta_X = r sqrt(n_i) bounds the spectral norm of the clipped block.
    assert spectral_norm_bound_holds([clipped], [y], 1.0 * np.sqrt(40), 2.0 * np.sqrt(40))
    assert not spectral_norm_bound_holds([x], [y], 1.0 * np.sqrt(40), 2.0 * np.sqrt(40))


# -------------------------------------------------------------------------- noise scale
def test_shared_noise_is_laplace_with_scale_v_of_t():
    # One node (W = [[1]]), zero data and a huge ball: beta(t+1) - beta(t) = omega(t).
    features, steps = 400, 30
    problems = LocalProblems.from_parts([np.zeros((2, features))], [np.zeros(2)])
    noise = PowerDecay(c=3.0, d=2.0, e=0.7)
    result = run_linreg(
        problems, np.ones((1, 1)), steps=steps, alpha=PowerDecay(0.1, 1.0, 1.0), noise=noise,
        domain=Ball(1e12), seed=7, beta_star=np.zeros(features), keep_trajectory=True,
    )
    increments = np.diff(result.trajectory[:, 0, :], axis=0)  # (steps, features)
    scales = noise(np.arange(steps))
    np.testing.assert_allclose(result.noise_scale, scales)
    standardized = (increments / scales[:, None]).ravel()
    assert stats.kstest(standardized, stats.laplace().cdf).pvalue > 1e-3
    # The std-vs-scale confusion (std = sqrt2 * v) would be detected.
    assert stats.kstest(standardized, stats.laplace(scale=np.sqrt(2)).cdf).pvalue < 1e-6
    # Per step, the maximum-likelihood scale (mean |omega|) is within 5 standard errors.
    mle = np.abs(increments).mean(axis=1)
    assert np.all(np.abs(mle / scales - 1.0) < 5.0 / np.sqrt(features))


def test_runs_are_seeded(rng):
    xs, ys = synthetic_parts(rng, nodes=5)
    problems = LocalProblems.from_parts(xs, ys)
    w = metropolis(nx.cycle_graph(5))
    kwargs = dict(steps=50, alpha=PowerDecay(0.05, 10.0, 0.5), noise=PowerDecay(0.5, 9.0, 0.5),
                  domain=Ball(5.0))
    a = run_linreg(problems, w, seed=3, **kwargs)
    b = run_linreg(problems, w, seed=3, **kwargs)
    c = run_linreg(problems, w, seed=4, **kwargs)
    np.testing.assert_array_equal(a.beta, b.beta)
    np.testing.assert_array_equal(a.released, b.released)
    assert not np.allclose(a.beta, c.beta)


# --------------------------------------------------------------------------- convergence
@pytest.mark.parametrize("graph", ["networkx-ring", "random-regular"])
def test_without_noise_nodes_reach_consensus_at_the_pooled_solution(rng, graph):
    xs, ys = synthetic_parts(rng, nodes=10, records=25, features=4)
    if graph == "networkx-ring":
        w = metropolis(nx.cycle_graph(10))
    else:
        w = make_topology("random-regular", 10, seed=2, degree=3).mixing_matrix(0)
    beta_star = np.linalg.lstsq(np.concatenate(xs), np.concatenate(ys), rcond=None)[0]
    problems = LocalProblems.from_parts(xs, ys)
    np.testing.assert_allclose(problems.pooled_solution(), beta_star, rtol=1e-10)
    np.testing.assert_allclose(pooled_least_squares(xs, ys), beta_star, rtol=1e-10)
    result = run_linreg(problems, w, steps=4000, alpha=PowerDecay(0.2, 5.0, 0.6), noise=None,
                        domain=None, seed=0, record_every=100)
    scale = np.linalg.norm(beta_star)
    assert result.errors[0].max() == pytest.approx(scale)  # beta(0) = 0
    assert result.errors[-1].max() < 1e-2 * scale
    assert result.consensus[-1] < 1e-2 * scale
    # The error shrinks along the run (compare far-apart checkpoints, not every step).
    assert result.errors[-1].max() < 0.3 * result.errors[1].max()
    np.testing.assert_array_equal(result.released, result.beta)


def test_projection_onto_a_ball_containing_beta_star_keeps_convergence(rng):
    xs, ys = synthetic_parts(rng, nodes=6, records=25, features=3)
    problems = LocalProblems.from_parts(xs, ys)
    beta_star = problems.pooled_solution()
    domain = Ball(1.2 * np.linalg.norm(beta_star))
    result = run_linreg(problems, metropolis(nx.cycle_graph(6)), steps=3000,
                        alpha=PowerDecay(0.2, 5.0, 0.6), noise=None, domain=domain, seed=0,
                        beta0=3 * beta_star)
    assert result.errors[-1].max() < 1e-2 * np.linalg.norm(beta_star)


def test_small_noise_degrades_gracefully_and_large_noise_stays_in_the_ball(rng):
    xs, ys = synthetic_parts(rng, nodes=6, records=25, features=3)
    problems = LocalProblems.from_parts(xs, ys)
    w = metropolis(nx.cycle_graph(6))
    scale = np.linalg.norm(problems.pooled_solution())
    alpha = PowerDecay(0.2, 5.0, 0.6)
    small = run_linreg(problems, w, steps=3000, alpha=alpha, noise=PowerDecay(1e-3, 4.0, 0.6),
                       domain=Ball(3 * scale), seed=1)
    assert small.errors[-1].max() < 0.05 * scale
    huge = run_linreg(problems, w, steps=200, alpha=alpha, noise=PowerDecay(1e6, 4.0, 0.6),
                      domain=Ball(3 * scale), seed=1)
    assert np.all(Ball(3 * scale).contains(huge.released))
    assert huge.released_errors.min() > small.released_errors.max()


# ---------------------------------------------------------------------- fail-closed checks
def test_noise_without_a_domain_is_refused(rng):
    xs, ys = synthetic_parts(rng, nodes=3)
    with pytest.raises(DPDLError, match="projection domain"):
        run_linreg(LocalProblems.from_parts(xs, ys), metropolis(nx.cycle_graph(3)), steps=5,
                   alpha=PowerDecay(0.1, 1, 1), noise=PowerDecay(1, 1, 1), domain=None, seed=0)


@pytest.mark.parametrize(
    ("matrix", "fragment"),
    [
        (np.array([[0.5, 0.5, 0.0], [0.25, 0.5, 0.25], [0.25, 0.0, 0.75]]), "symmetric"),
        (np.array([[0.6, 0.5], [0.5, 0.6]]), "doubly stochastic"),
        (np.eye(3), "connected"),
        (np.array([[0.0, 1.0], [1.0, 0.0]]), "W_ii > 0"),
        (np.ones((2, 3)) / 3, "square"),
    ],
)
def test_bad_mixing_matrices_are_refused(matrix, fragment):
    with pytest.raises(DPDLError, match=fragment):
        validate_symmetric_mixing(matrix)


def test_dpdl_topology_mixing_matrices_are_accepted():
    for name, kwargs in (("undirected-ring", {}), ("random-regular", {"degree": 4})):
        w = make_topology(name, 12, seed=1, **kwargs).mixing_matrix(0)
        validate_symmetric_mixing(w)
    np.testing.assert_allclose(make_topology("undirected-ring", 12).mixing_matrix(0),
                               metropolis(nx.cycle_graph(12)), atol=1e-15)


def test_divergence_and_shape_errors_are_reported(rng):
    xs, ys = synthetic_parts(rng, nodes=3)
    problems = LocalProblems.from_parts(xs, ys)
    w = metropolis(nx.cycle_graph(3))
    with pytest.raises(DPDLError, match="diverged"):
        run_linreg(problems, w, steps=5000, alpha=PowerDecay(1e3, 1.0, 0.0), noise=None,
                   domain=None, seed=0)
    with pytest.raises(DPDLError, match="4 nodes|3 nodes"):
        run_linreg(problems, metropolis(nx.cycle_graph(4)), steps=5,
                   alpha=PowerDecay(0.1, 1, 1), noise=None, domain=None, seed=0)
    with pytest.raises(DPDLError, match="labels"):
        LocalProblems.from_parts([np.ones((3, 2))], [np.ones(4)])
    with pytest.raises(DPDLError, match="rank"):
        LocalProblems.from_parts([np.ones((3, 2))], [np.ones(3)]).pooled_solution()


def test_replicas_match_individual_runs(rng):
    xs, ys = synthetic_parts(rng, nodes=5)
    problems = LocalProblems.from_parts(xs, ys)
    w = make_topology("undirected-ring", 5).mixing_matrix(0)
    alpha = PowerDecay(0.05, 10.0, 0.5)
    noises = [PowerDecay(0.5, 9.0, 0.5), None, PowerDecay(2.0, 9.0, 0.5)]
    seeds = [11, 12, 13]
    batch = run_linreg_replicas(problems, w, steps=300, alpha=alpha, noises=noises,
                                domain=Ball(5.0), seeds=seeds, record_every=7)
    for noise, seed, replica in zip(noises, seeds, batch, strict=True):
        single = run_linreg(problems, w, steps=300, alpha=alpha, noise=noise,
                            domain=Ball(5.0) if noise else None, seed=seed, record_every=7)
        np.testing.assert_allclose(replica.beta, single.beta, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(replica.errors, single.errors, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(replica.released, single.released, rtol=1e-12, atol=1e-14)
    np.testing.assert_array_equal(batch[0].steps, np.append(np.arange(0, 300, 7), 300))


def test_enforce_data_bounds_clips_and_reports(rng):
    xs = [rng.normal(scale=2.0, size=(n, 4)) for n in (10, 16, 12)]
    ys = [rng.normal(scale=3.0, size=n) for n in (10, 16, 12)]
    bounded = enforce_data_bounds(xs, ys, row_clip=1.5, label_clip=2.0)
    assert bounded.max_local_records == 16
    assert bounded.delta_x == pytest.approx(1.5 * 4.0)
    assert bounded.delta_y == pytest.approx(2.0 * 4.0)
    assert bounded.rows_clipped == sum(int(np.sum(np.linalg.norm(x, axis=1) > 1.5)) for x in xs)
    assert bounded.labels_clipped == sum(int(np.sum(np.abs(y) > 2.0)) for y in ys)
    for x, y in zip(bounded.x_parts, bounded.y_parts, strict=True):
        assert np.linalg.norm(x, ord=2) <= bounded.delta_x
        assert np.linalg.norm(y) <= bounded.delta_y
    assert f"{bounded.rows_clipped} of 38 feature rows" in bounded.describe()


def test_fit_private_linreg_spends_exactly_the_target(rng):
    xs, ys = synthetic_parts(rng, nodes=6, records=20, features=3)
    w = make_topology("undirected-ring", 6).mixing_matrix(0)
    alpha = PowerDecay(0.1, 20.0, 0.6)
    fit = fit_private_linreg(xs, ys, w, epsilon=1e7, steps=300, alpha=alpha,
                             domain=Ball(4.0), row_clip=1.0, label_clip=2.0, seed=0)
    assert fit.privacy.epsilon <= 1e7 and fit.privacy.epsilon == pytest.approx(1e7, rel=1e-12)
    # Default noise shape (d_v, e_v) = (d_alpha - 1, e_alpha): the closed form is exact.
    assert (fit.noise.d, fit.noise.e) == (19.0, 0.6)
    assert fit.privacy.epsilon_closed_form == pytest.approx(1e7, rel=1e-12)
    # Recompute the epsilon by hand from MATH.md §5 with the enforced bounds (m=3, k=6, n_M=20).
    dx, dy = np.sqrt(20) * 1.0, np.sqrt(20) * 2.0
    coefficient = 4 * dx * np.sqrt(3 * 20) * (dx * 4.0 * np.sqrt(6 * 3) + dy)
    assert fit.privacy.epsilon == pytest.approx(coefficient * 0.1 / fit.noise.c * 300, rel=1e-12)
    np.testing.assert_allclose(fit.result.noise_scale, fit.noise(np.arange(300)))
    clipped_star = pooled_least_squares(fit.data.x_parts, fit.data.y_parts)
    np.testing.assert_allclose(fit.result.beta_star, clipped_star, rtol=1e-9)


@settings(max_examples=50, deadline=None)
@given(
    # Magnitudes >= 1e-3 or exactly 0: squaring subnormals would only test float underflow.
    points=arrays(np.float64, (2, 4), elements=st.one_of(
        st.just(0.0), st.floats(1e-3, 50.0), st.floats(-50.0, -1e-3))),
    radius=st.floats(0.1, 10.0),
    half_width=st.floats(0.1, 10.0),
)
def test_projections_are_idempotent_nonexpansive_and_land_inside(points, radius, half_width):
    for domain in (Ball(radius), Box(-half_width, half_width)):
        projected = domain.project(points)
        assert np.all(domain.contains(projected))
        np.testing.assert_allclose(domain.project(projected), projected, rtol=1e-12, atol=1e-12)
        # Euclidean projections onto convex sets are 1-Lipschitz.
        gap = np.linalg.norm(projected[0] - projected[1])
        assert gap <= np.linalg.norm(points[0] - points[1]) * (1 + 1e-12) + 1e-12
        assert np.all(np.linalg.norm(projected, axis=1) <= omega_bound(domain, 4) * (1 + 1e-12))
