"""MATH.md §6 token algorithms: unbiasedness and predicted error, caps, walks, bad input."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpdl.algorithms.randomness import secret_rng
from dpdl.errors import DPDLError
from dpdl.extensions.netdp import algorithm as tk

REPEATS = 1500


def _check_unbiased_with_predicted_std(results):
    errors = np.array([r.estimate - r.truth for r in results])
    std = results[0].std
    # mean error within 4 standard errors; sample std within 8 % (chi-square, R = 1500)
    assert abs(errors.mean()) < 4 * std / math.sqrt(len(errors))
    assert errors.std(ddof=1) == pytest.approx(std, rel=0.08)


def test_ring_summation_is_unbiased_with_the_predicted_std():
    rng = np.random.default_rng(0)
    K, n, sigma = 3, 7, 2.0
    values = rng.uniform(-1, 1, size=(K, n))
    results = [tk.ring_summation(values, sigma, seed=s) for s in range(REPEATS)]
    assert results[0].noise_draws == math.ceil(K * n / (n - 1))
    assert results[0].std == pytest.approx(math.sqrt(4) * sigma)
    _check_unbiased_with_predicted_std(results)


def test_local_summation_has_sqrt_kn_error():
    values = np.ones((4, 5))
    results = [tk.local_summation(values, 1.5, seed=s) for s in range(REPEATS)]
    assert results[0].std == pytest.approx(math.sqrt(20) * 1.5)
    _check_unbiased_with_predicted_std(results)


def test_ring_histogram_is_unbiased_with_the_predicted_std():
    rng = np.random.default_rng(1)
    K, n, L, gamma = 2, 30, 4, 0.4
    values = rng.choice(L, size=(K, n), p=[0.5, 0.3, 0.2, 0.0])
    runs = [tk.ring_histogram(values, L, gamma, seed=s) for s in range(REPEATS)]
    est = np.array([r.estimate for r in runs])
    truth, std = runs[0].truth, runs[0].std
    assert int(runs[0].counts.sum()) == K * n + (n - 1)  # reports + initial elements
    assert np.all(np.abs(est.mean(axis=0) - truth) < 4 * std / math.sqrt(REPEATS))
    np.testing.assert_allclose(est.std(axis=0, ddof=1), std, rtol=0.08)
    l1 = np.abs(est - truth).sum(axis=1).mean()
    assert l1 == pytest.approx(runs[0].expected_l1, rel=0.1)


def test_randomized_response_keeps_each_value_with_probability_one_minus_gamma_plus():
    x = np.zeros(200_000, dtype=int)
    out = tk.randomized_response(x, 5, 0.5, seed=0)
    # P(report = true) = 1 - gamma + gamma / L = 0.6
    assert np.mean(out == 0) == pytest.approx(0.6, abs=0.005)


def test_random_walk_summation_enforces_the_cap_and_noise_rule():
    n, T, cap = 10, 500, 30
    values = np.ones(n)
    net = tk.random_walk_summation(values, T, 1.0, cap=cap, model="network", seed=4)
    loc = tk.random_walk_summation(values, T, 1.0, cap=cap, model="local", seed=4,
                                   walk=net.walk)
    assert net.contributions.max() <= cap and net.contributions.sum() < T  # the cap bites
    assert net.truth == net.contributions.sum()
    assert net.noise_draws == T  # network DP: capped users still add noise
    assert loc.noise_draws == int(loc.contributions.sum())  # local DP: they add nothing
    assert loc.std < net.std


def test_random_walk_summation_is_unbiased():
    values = np.linspace(0, 1, 8)
    walk = tk.sample_random_walk(8, 200, seed=0)
    results = [tk.random_walk_summation(values, 200, 0.5, seed=s, walk=walk)
               for s in range(REPEATS)]
    _check_unbiased_with_predicted_std(results)


def test_complete_graph_walk_is_uniform_over_other_users():
    n, T = 5, 60_000
    walk = tk.sample_random_walk(n, T, seed=2)
    assert np.all(walk[1:] != walk[:-1])
    pairs = np.bincount(walk[:-1] * n + walk[1:], minlength=n * n).reshape(n, n)
    off = pairs[~np.eye(n, dtype=bool)].reshape(n, n - 1)
    for row in off:
        assert stats.chisquare(row).pvalue > 1e-4


def test_walk_on_a_transition_matrix_follows_it():
    P = np.array([[0.0, 0.7, 0.3], [0.5, 0.0, 0.5], [0.2, 0.2, 0.6]])
    walk = tk.sample_random_walk(3, 50_000, transition=P, seed=5)
    counts = np.bincount(walk[:-1] * 3 + walk[1:], minlength=9).reshape(3, 3)
    freq = counts / counts.sum(axis=1, keepdims=True)
    np.testing.assert_allclose(freq, P, atol=0.015)


def test_random_walk_sgd_cap_clipping_and_noise_only_steps():
    n, T, d = 4, 40, 3
    walk = tk.sample_random_walk(n, T, seed=0)
    cap = 5
    from dpdl.extensions.netdp.accounting import contribution_mask

    mask = contribution_mask(walk, n, cap)

    def huge_gradient(w, u):
        return np.full(d, 1e6)

    res = tk.random_walk_sgd(huge_gradient, np.zeros(d), walk, lr=0.1, sigma=0.0, clip=1.0,
                             n=n, cap=tk.CapPolicy(contributes=mask, model="local"),
                             unsafe_zero_noise=True)
    assert res.contributions.max() <= cap
    # each data step moves by exactly lr * clip (clipped before noise), capped steps not at all
    assert np.linalg.norm(res.weights) == pytest.approx(0.1 * mask.sum())
    net = tk.random_walk_sgd(lambda w, u: np.zeros(d), np.zeros(d), walk, lr=1.0, sigma=1.0,
                             clip=1.0, n=n, cap=tk.CapPolicy(contributes=mask, model="network"),
                             seed=3)
    # noise on every step: the stream an int seed names, d words a step, each released as
    # round_g(0 + X) (X from first principles in mpmath)
    from tests.engine.noise_reference import reference_noisy_sum

    from dpdl.algorithms.noise import GeneratorBits

    bits = GeneratorBits(secret_rng(3))
    zeros = [torch.zeros(d, dtype=torch.float64)]
    noise = sum(reference_noisy_sum(bits, zeros, 1.0)[0] for _ in range(T))
    np.testing.assert_allclose(net.weights, -noise.numpy(), rtol=0, atol=1e-12)


def test_random_walk_sgd_converges_without_noise_and_projects():
    target = np.array([0.5, -0.25])
    walk = tk.sample_random_walk(3, 300, seed=1)
    res = tk.random_walk_sgd(lambda w, u: w - target, np.zeros(2), walk, lr=0.1, sigma=0.0,
                             clip=10.0, n=3, evaluation=tk.Evaluation(lambda w: {"dist": float(
                                 np.linalg.norm(w - target))}, every=100),
                             unsafe_zero_noise=True)
    assert res.history[-1]["dist"] < 1e-6 and len(res.history) == 4
    proj = tk.random_walk_sgd(lambda w, u: w - 10 * target, np.zeros(2), walk, lr=0.1,
                              sigma=0.0, clip=10.0, n=3, radius=1.0, unsafe_zero_noise=True)
    assert np.linalg.norm(proj.weights) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "call, fragment",
    [
        (lambda: tk.sample_random_walk(1, 10), "n \\(number of users\\)"),
        (lambda: tk.sample_random_walk(5, 0), "T \\(number of steps\\)"),
        (lambda: tk.sample_random_walk(2, 5, transition=[[0.5, 0.4], [0.5, 0.5]]),
         "not stochastic: row 0 sums to 0.9"),
        (lambda: tk.sample_random_walk(2, 5, transition=[[1.5, -0.5], [0.5, 0.5]]), "negative"),
        (lambda: tk.sample_random_walk(3, 5, transition=np.eye(2)), "expected n=3"),
        (lambda: tk.ring_summation(np.ones((2, 1)), 1.0), "users n >= 2"),
        (lambda: tk.ring_histogram(np.full((2, 3), 7), 4, 0.5), r"\[0, 4\)"),
        (lambda: tk.random_walk_summation(np.ones(4), 10, 1.0, model="central"), "model"),
    ],
)
def test_bad_input_raises_clear_errors(call, fragment):
    with pytest.raises(DPDLError, match=fragment):
        call()
