"""Push-sum invariants with the mixing matrices alone, pure numpy (MATH.md §3).

x^{k+1} = P^k x^k, w^{k+1} = P^k w^k, z = x / w; without gradients
Σ w = n, Σ x is preserved, and z -> mean of x^0 at a geometric rate.
"""

import numpy as np
import pytest

from dpdl.topology import make_topology, mixing_matrices, period_contraction

CASES = [
    ("exp", 20, {}),
    ("exp", 33, {}),
    ("ring", 12, {}),
    ("complete", 10, {}),
    ("undirected-ring", 12, {}),
    ("static-exp", 20, {}),
    ("hypercube", 16, {}),
    ("torus", 16, {}),
    ("star", 10, {}),
    ("random-regular", 16, {"degree": 3}),
    ("erdos-renyi", 16, {"probability": 0.25, "directed": True}),
]


def push_sum(topology, x0, steps):
    """Run push-sum without gradients; return per-step Σw, Σx and the worst |z − mean|."""
    n = topology.n
    stack = mixing_matrices(topology, 0, steps)
    x, w = x0.copy(), np.ones(n)
    total_w, total_x, error = [], [], []
    mean = x0.mean(axis=0)
    for P in stack:
        x, w = P @ x, P @ w
        total_w.append(w.sum())
        total_x.append(x.sum(axis=0))
        error.append(np.abs(x / w[:, None] - mean).max())
    return np.array(total_w), np.array(total_x), np.array(error)


@pytest.mark.parametrize(("name", "n", "params"), CASES, ids=lambda c: str(c))
def test_push_sum_invariants_and_geometric_consensus(name, n, params, rng):
    topology = make_topology(name, n, seed=2, **params)
    x0 = rng.standard_normal((n, 3))
    steps = max(60 * topology.period, 1500)
    total_w, total_x, error = push_sum(topology, x0, steps)
    np.testing.assert_allclose(total_w, n, rtol=1e-12)
    np.testing.assert_allclose(total_x, np.broadcast_to(x0.sum(axis=0), total_x.shape), atol=1e-10)
    initial = np.abs(x0 - x0.mean(axis=0)).max()
    assert error[-1] < 1e-7 * initial
    # geometric: every block of steps/30 steps at least halves the error (until round-off)
    block = steps // 30
    checkpoints = error[block - 1 :: block]
    above_roundoff = checkpoints[:-1] > 1e-11
    assert np.all(checkpoints[1:][above_roundoff] <= 0.5 * checkpoints[:-1][above_roundoff])


@pytest.mark.parametrize("name", ["exp", "ring", "static-exp", "undirected-ring", "torus"])
def test_doubly_stochastic_disagreement_shrinks_by_q_each_period(name, rng):
    """With w ≡ 1 (doubly stochastic), z = x and ‖x − x̄‖ contracts by at least q per period."""
    topology = make_topology(name, 20)
    q = period_contraction(topology)
    x = rng.standard_normal(20)
    mean = x.mean()
    stack = mixing_matrices(topology, 0, 6 * topology.period)
    for period_start in range(0, len(stack), topology.period):
        before = np.linalg.norm(x - mean)
        for P in stack[period_start : period_start + topology.period]:
            x = P @ x
        assert np.linalg.norm(x - mean) <= q * before + 1e-12


def test_directed_graph_weights_really_vary():
    """Off doubly-stochastic graphs the push-sum weights leave 1 (so de-biasing matters)."""
    topology = make_topology("erdos-renyi", 16, seed=2, probability=0.25, directed=True)
    w = mixing_matrices(topology, 0, 50)[::-1]
    weights = np.linalg.multi_dot(list(w)) @ np.ones(16)
    assert np.ptp(weights) > 0.1
    assert weights.sum() == pytest.approx(16)


def test_exact_consensus_of_exponential_graph_at_power_of_two(rng):
    x0 = rng.standard_normal((16, 4))
    _, _, error = push_sum(make_topology("exp", 16), x0, 4)
    assert error[-1] < 1e-13
