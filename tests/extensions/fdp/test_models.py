"""The token's models of random-walk DP-SGD and the non-expansive hop map their accounting
needs (dpdl.extensions.fdp.models)."""

import numpy as np
import pytest
import torch

from dpdl.extensions.fdp.models import MLP, SoftmaxRegression, make_model


def _torch_mlp_gradient(model: MLP, theta, x, y):
    D, H, K = model.features, model.hidden, model.classes
    t = torch.tensor(theta, requires_grad=True)
    w1, b1, w2, b2 = torch.split(t, [D * H, H, H * K, K])
    logits = torch.relu(torch.tensor(x)[None] @ w1.view(D, H) + b1) @ w2.view(H, K) + b2
    torch.nn.functional.cross_entropy(logits, torch.tensor([y])).backward()
    return t.grad.numpy()


def test_mlp_per_record_gradients_are_autograd_s():
    model = MLP(features=7, classes=3, hidden=5, init_seed=1)
    rng = np.random.default_rng(0)
    theta = model.initial() + 0.3 * rng.standard_normal(model.size)
    x, y = rng.standard_normal((4, 7)), np.array([0, 2, 1, 2])
    grads = model.per_record_gradients(theta, x, y)
    assert grads.shape == (4, model.size)
    for r in range(4):
        np.testing.assert_allclose(grads[r], _torch_mlp_gradient(model, theta, x[r], y[r]),
                                   atol=1e-12)


def test_mlp_clipped_mean_has_norm_at_most_the_clip_and_is_the_mean_below_it():
    model = MLP(features=6, classes=4, hidden=8)
    rng = np.random.default_rng(2)
    theta = model.initial()
    x, y = 10 * rng.standard_normal((5, 6)), rng.integers(0, 4, 5)
    assert np.linalg.norm(model.clipped_mean_gradient(theta, x, y, 0.1)) <= 0.1 + 1e-12
    big = model.clipped_mean_gradient(theta, x, y, 1e9)
    np.testing.assert_allclose(big, model.per_record_gradients(theta, x, y).mean(axis=0))


def test_the_initial_mlp_is_public_and_seeded():
    a, b = MLP(4, 2, init_seed=3).initial(), MLP(4, 2, init_seed=3).initial()
    assert np.array_equal(a, b) and not np.array_equal(a, MLP(4, 2, init_seed=4).initial())


def _step(model, theta, x, y, lr, clip):
    return theta - lr * model.clipped_mean_gradient(theta, x, y, clip)


def _largest_expansion(clip: float, lr: float, trials: int = 4000) -> float:
    """Brute force: the largest ||T(a) - T(b)|| / ||a - b|| of one clipped softmax step over
    random records of norm 1, labels and parameter pairs."""
    rng = np.random.default_rng(0)
    model = SoftmaxRegression(features=2, classes=3)
    worst = 0.0
    for _ in range(trials):
        x = rng.standard_normal((1, 2))
        x /= np.linalg.norm(x)
        y = rng.integers(0, 3, 1)
        a = rng.standard_normal((3, 3)) * rng.uniform(0.1, 5)
        b = a + rng.standard_normal((3, 3)) * rng.uniform(1e-3, 2)
        ratio = (np.linalg.norm(_step(model, a, x, y, lr, clip) - _step(model, b, x, y, lr, clip))
                 / np.linalg.norm(a - b))
        worst = max(worst, ratio)
    return worst


def test_softmax_step_is_non_expansive_where_the_gate_says_proven():
    # R = 1: the gradient bound sqrt(2(R^2+1)) = 2 and 2/L = 2 (L = (R^2+1)/2 = 1)
    assert SoftmaxRegression.hop_map_gap(lr=2.0, clip=2.0, row_norm=1.0) is None
    assert _largest_expansion(clip=2.0, lr=2.0) <= 1 + 1e-12


def test_an_acting_clip_or_a_long_step_expands_and_the_gate_refuses_both():
    # the reason the gate asks for an idle clip: clipped softmax steps do expand
    assert _largest_expansion(clip=1.0, lr=1.0) > 1.001
    assert "clip" in SoftmaxRegression.hop_map_gap(lr=1.0, clip=1.0, row_norm=1.0)
    assert _largest_expansion(clip=2.0, lr=3.0) > 1.01
    assert "2/L" in SoftmaxRegression.hop_map_gap(lr=3.0, clip=2.0, row_norm=1.0)
    assert "norm bound" in SoftmaxRegression.hop_map_gap(lr=1.0, clip=2.0, row_norm=None)
    assert "not convex" in MLP.hop_map_gap(lr=1e-6, clip=100.0, row_norm=1.0)


def test_make_model_names_a_bad_model():
    with pytest.raises(Exception, match="train.model must be one of"):
        make_model("resnet", features=2, classes=2)
