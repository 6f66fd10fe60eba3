import pytest
import torch
from torch.func import functional_call, grad, vmap

from dpdl.errors import DPDLError
from dpdl.models import MODELS, make_model, num_params


def _conv_params(c_in, c_out, k, bias=True):
    return c_in * c_out * k * k + (c_out if bias else 0)


def _linear_params(d_in, d_out):
    return d_in * d_out + d_out


def test_cnn_parameter_count_closed_form_28_and_8():
    # conv 5x5 same padding, two 2x2 poolings: 28 -> 7 and 8 -> 2 spatially.
    for side, pooled in ((28, 7), (8, 2)):
        expected = (_conv_params(1, 16, 5) + _conv_params(16, 32, 5)
                    + _linear_params(32 * pooled * pooled, 64) + _linear_params(64, 10))
        assert num_params(make_model("cnn", (1, side, side), 10)) == expected


def test_resnet18_gn_parameter_count_and_no_batchnorm():
    model = make_model("resnet18-gn", (3, 32, 32), 10, seed=0)
    # The CIFAR ResNet-18 (3x3 stem) has 11,173,962 parameters; GroupNorm has the same
    # affine parameters per channel as BatchNorm.
    assert num_params(model) == 11_173_962
    for name in MODELS:
        shape = (3, 8, 8) if name in ("cnn", "resnet18-gn") else (5,)
        modules = make_model(name, shape, 3).modules()
        assert not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in modules)
    assert any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())


def test_simple_models_parameter_counts():
    assert num_params(make_model("logreg", (30,), 2)) == _linear_params(30, 2)
    assert num_params(make_model("logreg", (10,), None)) == _linear_params(10, 1)
    assert num_params(make_model("mlp", (1, 8, 8), 10, hidden=32)) == (
        _linear_params(64, 32) + _linear_params(32, 10)
    )


@pytest.mark.parametrize(
    "name, shape, classes",
    [("cnn", (1, 28, 28), 10), ("cnn", (1, 8, 8), 10), ("cnn", (3, 32, 32), 10),
     ("logreg", (1, 8, 8), 10), ("logreg", (30,), 2), ("mlp", (30,), 2), ("mlp", (10,), None),
     ("resnet18-gn", (1, 8, 8), 10)],
)
def test_output_shapes(name, shape, classes):
    # The full-width 32x32 ResNet is covered by the per-sample-gradient test below.
    options = {"width": 8, "groups": 4} if name == "resnet18-gn" else {}
    model = make_model(name, shape, classes, seed=0, **options)
    with torch.no_grad():
        out = model(torch.randn(3, *shape))
    assert out.shape == (3, 1 if classes is None else classes)


def test_seed_reproducible_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a = make_model("cnn", (1, 8, 8), 10, seed=4)
    assert torch.equal(torch.rand(1), expected_next)
    b = make_model("cnn", (1, 8, 8), 10, seed=4)
    c = make_model("cnn", (1, 8, 8), 10, seed=5)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(pa, pb)
    assert not all(torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(),
                                                         strict=True))


def _per_sample_grads_vmap(model, x, y, loss_fn):
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss_of_one(p, xi, yi):
        out = functional_call(model, p, (xi.unsqueeze(0),))
        return loss_fn(out, yi.unsqueeze(0))

    return vmap(grad(loss_of_one), in_dims=(None, 0, 0))(params, x, y)


def _per_sample_grads_loop(model, x, y, loss_fn):
    grads = {k: [] for k, _ in model.named_parameters()}
    for i in range(len(x)):
        model.zero_grad()
        loss_fn(model(x[i : i + 1]), y[i : i + 1]).backward()
        for k, p in model.named_parameters():
            grads[k].append(p.grad.detach().clone())
    return {k: torch.stack(v) for k, v in grads.items()}


@pytest.mark.parametrize(
    "name, shape, classes, n_records",
    [("cnn", (1, 8, 8), 10, 3), ("cnn", (1, 28, 28), 10, 2), ("logreg", (30,), 2, 4),
     ("mlp", (1, 8, 8), 10, 3), ("mlp", (10,), None, 3), ("resnet18-gn", (3, 32, 32), 10, 1),
     ("resnet18-gn", (3, 8, 8), 10, 2)],
)
def test_per_sample_grads_vmap_equal_loop(name, shape, classes, n_records):
    torch.manual_seed(0)
    options = {"width": 8, "groups": 4} if (name == "resnet18-gn" and shape[1] == 8) else {}
    model = make_model(name, shape, classes, seed=1, **options)
    # float64 makes the comparison tight; the full ResNet-18 stays float32 to keep it quick.
    dtype = torch.float32 if shape == (3, 32, 32) and name == "resnet18-gn" else torch.float64
    model = model.to(dtype)
    x = torch.randn(n_records, *shape, dtype=dtype)
    if classes is None:
        y = torch.randn(n_records, 1, dtype=dtype)
        loss_fn = torch.nn.functional.mse_loss
    else:
        y = torch.randint(0, classes, (n_records,))
        loss_fn = torch.nn.functional.cross_entropy
    with torch.no_grad():
        assert model(x).shape == (n_records, 1 if classes is None else classes)
    vmapped = _per_sample_grads_vmap(model, x, y, loss_fn)
    looped = _per_sample_grads_loop(model, x, y, loss_fn)
    assert vmapped.keys() == looped.keys()
    for key in looped:
        assert vmapped[key].shape == (n_records, *dict(model.named_parameters())[key].shape)
        scale = float(looped[key].abs().max()) + 1e-30
        tolerance = 1e-4 if dtype == torch.float32 else 1e-10
        assert float((vmapped[key] - looped[key]).abs().max()) <= tolerance * scale, key
    # Records differ, so the per-record gradients must too (vmap did not broadcast one).
    if n_records > 1:
        first = next(iter(looped))
        assert not torch.allclose(looped[first][0], looped[first][1])


@pytest.mark.parametrize("name, options", [("cnn", {}), ("resnet18-gn", {"width": 8, "groups": 4})])
def test_nested_vmap_over_nodes_and_records(name, options):
    """The simulator vmaps over nodes (stacked parameters) and then over records."""
    model = make_model(name, (1, 8, 8), 10, seed=0, **options).double()
    n_nodes, n_records = 3, 2
    base = {k: v.detach() for k, v in model.named_parameters()}
    stacked = {k: torch.stack([v + 0.01 * i for i in range(n_nodes)]) for k, v in base.items()}
    x = torch.randn(n_nodes, n_records, 1, 8, 8, dtype=torch.float64)
    y = torch.randint(0, 10, (n_nodes, n_records))

    def loss_of_one(p, xi, yi):
        return torch.nn.functional.cross_entropy(
            functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    per_record = vmap(grad(loss_of_one), in_dims=(None, 0, 0))
    grads = vmap(per_record, in_dims=(0, 0, 0))(stacked, x, y)
    node, record = 2, 1
    node_params = {k: v[node] for k, v in stacked.items()}
    direct = grad(loss_of_one)(node_params, x[node, record], y[node, record])
    for key in direct:
        torch.testing.assert_close(grads[key][node, record], direct[key], rtol=1e-9, atol=1e-12)


def test_make_model_errors_name_the_value():
    with pytest.raises(DPDLError, match="'vgg'"):
        make_model("vgg", (1, 8, 8), 10)
    with pytest.raises(DPDLError, match=r"\(30,\)"):
        make_model("cnn", (30,), 2)
    with pytest.raises(DPDLError, match="num_classes"):
        make_model("logreg", (30,), 0)
    with pytest.raises(DPDLError, match="depth"):
        make_model("mlp", (30,), 2, depth=3)
    with pytest.raises(DPDLError, match="2x2"):
        make_model("cnn", (1, 2, 2), 2)
