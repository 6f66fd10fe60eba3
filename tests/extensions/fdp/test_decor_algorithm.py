"""The DECOR simulation (MATH.md §7): pairwise secrets, gradients, training."""

import networkx as nx
import numpy as np
import pytest
import torch

from dpdl.errors import DPDLError
from dpdl.extensions.fdp.decor import (
    RunOptions,
    clipped_mean_gradient,
    edge_list,
    pairwise_secrets,
    run_decor,
    softmax_loss_accuracy,
    softmax_per_record_gradients,
)


def metropolis(graph):
    A = nx.to_numpy_array(graph, nodelist=range(graph.number_of_nodes()))
    deg = A.sum(axis=1)
    W = A / (1 + np.maximum(deg[:, None], deg[None, :]))
    return W + np.diag(1 - W.sum(axis=1))


def test_correlated_noise_sums_to_zero_over_the_network():
    graph = nx.random_regular_graph(4, 12, seed=1)
    edges = edge_list(nx.to_numpy_array(graph, nodelist=range(12)))
    assert len(edges) == graph.number_of_edges()
    secrets = pairwise_secrets(edges, 12, 5000, 3.0, np.random.default_rng(0))
    assert np.abs(secrets.sum(axis=0)).max() < 1e-9
    # its covariance across nodes is σ_cor² L (columns are independent draws)
    laplacian = nx.laplacian_matrix(graph, nodelist=range(12)).toarray()
    empirical = secrets @ secrets.T / secrets.shape[1]
    np.testing.assert_allclose(empirical, 9.0 * laplacian, atol=9.0 * 4 * 0.08)


def test_per_record_gradients_match_torch_autograd(rng):
    n, b, d, k = 3, 4, 5, 3
    theta = rng.normal(size=(n, d + 1, k))
    x = rng.normal(size=(n, b, d))
    y = rng.integers(0, k, size=(n, b))
    ours = softmax_per_record_gradients(theta, x, y)
    for node in range(n):
        for r in range(b):
            t = torch.tensor(theta[node], requires_grad=True)
            xb = torch.cat([torch.tensor(x[node, r]), torch.ones(1, dtype=torch.float64)])
            loss = torch.nn.functional.cross_entropy((xb @ t)[None], torch.tensor([y[node, r]]))
            loss.backward()
            np.testing.assert_allclose(ours[node, r], t.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_clipped_mean_gradient_is_bounded(rng):
    grads = rng.normal(scale=10.0, size=(4, 7, 6, 3))
    out = clipped_mean_gradient(grads, 0.5)
    assert np.all(np.linalg.norm(out.reshape(4, -1), axis=1) <= 0.5 + 1e-12)
    small = grads * 1e-3  # already inside the ball: plain mean
    np.testing.assert_allclose(clipped_mean_gradient(small, 0.5), small.mean(axis=1))


def _toy_data(rng, n=8, per_node=30, d=4):
    w = rng.normal(size=d)
    x = rng.normal(size=(n, per_node, d))
    y = (x @ w > 0).astype(np.int64)
    return x, y


def test_secrets_leave_the_network_average_unchanged(rng):
    x, y = _toy_data(rng)
    W = metropolis(nx.cycle_graph(8))
    kwargs = dict(num_classes=2, steps=1, lr=0.5, clip=1.0, sigma=0.0, batch_size=4,
                  options=RunOptions(seed=3, unsafe_zero_noise=True))
    plain = run_decor(W, x, y, sigma_cor=0.0, **kwargs)
    correlated = run_decor(W, x, y, sigma_cor=50.0, **kwargs)
    np.testing.assert_allclose(correlated.average, plain.average, atol=1e-10)
    # while every single node is far off
    assert np.abs(correlated.theta - plain.theta).max() > 1.0
    assert correlated.secret_sum_max < 1e-9


def test_decor_learns_without_noise_and_is_seeded(rng):
    x, y = _toy_data(rng)
    W = metropolis(nx.cycle_graph(8))
    xt, yt = x.reshape(-1, 4), y.reshape(-1)
    out = run_decor(W, x, y, num_classes=2, steps=150, lr=0.5, clip=1.0, sigma=0.0,
                    sigma_cor=0.0, batch_size=8,
                    options=RunOptions(eval_every=50, eval_data=(xt, yt), unsafe_zero_noise=True))
    assert out.history[-1]["accuracy"] > 0.9
    _, acc = softmax_loss_accuracy(out.average, xt, yt)
    assert acc == out.history[-1]["accuracy"]
    a = run_decor(W, x, y, num_classes=2, steps=5, lr=0.1, clip=1.0, sigma=1.0, sigma_cor=2.0,
                  options=RunOptions(seed=7))
    b = run_decor(W, x, y, num_classes=2, steps=5, lr=0.1, clip=1.0, sigma=1.0, sigma_cor=2.0,
                  options=RunOptions(seed=7))
    np.testing.assert_array_equal(a.theta, b.theta)


def test_decor_rejects_directed_graphs(rng):
    x, y = _toy_data(rng, n=4)
    directed = np.roll(np.eye(4), 1, axis=1) * 0.5 + np.eye(4) * 0.5
    with pytest.raises(DPDLError, match="undirected"):
        run_decor(directed, x, y, num_classes=2, steps=1, lr=0.1, clip=1.0, sigma=1.0,
                  sigma_cor=1.0)
    with pytest.raises(DPDLError, match="batch_size"):
        run_decor(metropolis(nx.cycle_graph(4)), x, y, num_classes=2, steps=1, lr=0.1,
                  clip=1.0, sigma=1.0, sigma_cor=1.0, batch_size=100)
