"""Book-keeping clipping (dpdl.algorithms.per_sample) against per-record autograd in float64:
clipped per-node sums for every supported layer kind, chunking and padding, a layer type
registered by the user, and the fallback to the per-record path for models it cannot read."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import dpdl.algorithms.per_sample as per_sample
from dpdl.algorithms.dyn_d2p import LOSSES, NodeBatch, clipped_record_sums, mean_batch_grads
from dpdl.algorithms.per_sample_layers import LayerTerms, LinearTerms, register_layer
from dpdl.engine import stack_params
from dpdl.errors import DPDLError
from dpdl.models import make_model


def reference_clipped_sums(model, params, batch, clip, loss="cross_entropy"):
    """sum_r g_r min(1, C/||g_r||) per node: one record at a time, plain autograd, float64."""
    out = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in params.items()}
    for r in range(batch.size):
        i = int(batch.node[r])
        z = {name: p[i].double().requires_grad_(True) for name, p in params.items()}
        pred = torch.func.functional_call(model, z, (batch.inputs[r : r + 1].double(),))
        target = batch.targets[r : r + 1]
        value = LOSSES[loss](pred, target if target.is_floating_point() is False
                             else target.double()).sum()  # fmt: skip
        grads = torch.autograd.grad(value, list(z.values()))
        norm = float(torch.sqrt(sum(g.pow(2).sum() for g in grads)))
        factor = min(1.0, clip * (1 - 2.0**-12) / norm)  # the sensitivity margin
        for name, g in zip(z, grads, strict=True):
            out[name][i] += factor * g
    return out


class ConvZoo(nn.Module):
    """Every conv variant book-keeping handles, GroupNorm, a max-pool, two linear layers."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(2, 4, 3, padding="same")
        self.norm = nn.GroupNorm(2, 4)
        self.b = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=False)
        self.c = nn.Conv2d(6, 5, (3, 2), dilation=(2, 1), padding=(2, 0))
        self.fc1 = nn.Linear(5 * 4 * 2, 7)
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x):
        x = torch.tanh(self.norm(self.a(x)))
        x = nn.functional.max_pool2d(torch.relu(self.b(x)), 1)
        x = torch.tanh(self.c(x))
        return self.fc2(torch.tanh(self.fc1(x.flatten(1))))


class Sequence(nn.Module):
    """Linear layers on (T, features) records, LayerNorm, mean over positions: one layer with
    T(in + out) < in x out (ghost norm) and one without."""

    def __init__(self):
        super().__init__()
        self.wide = nn.Linear(12, 16)  # T = 3: 3 * 28 < 192, ghost
        self.norm = nn.LayerNorm(16)
        self.narrow = nn.Linear(16, 2)  # 3 * 18 > 32, per-record gradient
        self.head = nn.Linear(2, 3)

    def forward(self, x):
        h = self.narrow(torch.tanh(self.norm(self.wide(x))))
        return self.head(h.mean(dim=1))


def _batch(n, counts, record_shape, classes=3, seed=0, float_targets=False):
    rng = np.random.default_rng(seed)
    node = torch.as_tensor(np.repeat(np.arange(n), counts))
    R = int(sum(counts))
    inputs = torch.as_tensor(rng.normal(size=(R, *record_shape)).astype(np.float32) * 2)
    if float_targets:
        targets = torch.as_tensor(rng.normal(size=R).astype(np.float32))
    else:
        targets = torch.as_tensor(rng.integers(0, classes, size=R))
    return NodeBatch(inputs, targets, node, n)


def _nodes_params(model, n, seed=0):
    """Each node's parameters: the model's, moved differently per node."""
    g = torch.Generator().manual_seed(seed)
    return {
        name: p + 0.2 * torch.randn(p.shape, generator=g) * p.abs().mean()
        for name, p in stack_params(model, n, torch.device("cpu")).items()
    }


def _median_norm_clip(model, params, batch, loss="cross_entropy"):
    """A clip bound between the records' norms: some are clipped, some are not."""
    norms = []
    for r in range(batch.size):
        i = int(batch.node[r])
        z = {name: p[i].double().requires_grad_(True) for name, p in params.items()}
        pred = torch.func.functional_call(model, z, (batch.inputs[r : r + 1].double(),))
        target = batch.targets[r : r + 1]
        value = LOSSES[loss](pred, target.double() if target.is_floating_point() else target)
        grads = torch.autograd.grad(value.sum(), list(z.values()))
        norms.append(float(torch.sqrt(sum(gr.pow(2).sum() for gr in grads))))
    return float(np.median(norms))


CASES = {
    "conv-zoo": (lambda: ConvZoo(), (2, 8, 6), "cross_entropy"),
    "sequence": (lambda: Sequence(), (3, 12), "cross_entropy"),
    "cnn": (lambda: make_model("cnn", (1, 8, 8), 4, seed=0, channels=(3, 4), hidden=6),
            (1, 8, 8), "cross_entropy"),
    "mlp-regression": (lambda: make_model("mlp", (5,), None, seed=0, hidden=6), (5,),
                       "squared_error"),
    "resnet18-gn": (lambda: make_model("resnet18-gn", (3, 8, 8), 3, seed=0, width=4, groups=2),
                    (3, 8, 8), "cross_entropy"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_book_keeping_equals_per_record_autograd(case):
    build, shape, loss = CASES[case]
    model = build()
    n, counts = 4, [3, 0, 5, 1]  # uneven batches and a node that sampled nothing
    batch = _batch(n, counts, shape, float_targets=loss == "squared_error", seed=1)
    params = _nodes_params(model, n)
    plan = per_sample.book_keeping_plan(model, shape, params)
    assert plan.problems == []
    clip = _median_norm_clip(model, params, batch, loss)
    want = reference_clipped_sums(model, params, batch, clip, loss)
    got = clipped_record_sums(model, params, batch, clip, loss=loss, method="book-keeping")
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-5, rtol=1e-4)
        assert torch.equal(got[name][1], torch.zeros_like(got[name][1]))
    assert any(float(t.abs().max()) > 0 for t in got.values())


def reference_mean_grads(model, params, batch, loss):
    """SGP's update by definition: node i's autograd gradient of its batch's mean loss, in
    float64 (zero for an empty batch)."""
    out = {name: torch.zeros(p.shape, dtype=torch.float64) for name, p in params.items()}
    for i in range(batch.n_nodes):
        mine = batch.node == i
        if not bool(mine.any()):
            continue
        z = {name: p[i].double().requires_grad_(True) for name, p in params.items()}
        pred = torch.func.functional_call(model, z, (batch.inputs[mine].double(),))
        target = batch.targets[mine]
        value = LOSSES[loss](pred, target.double() if target.is_floating_point() else target)
        for name, g in zip(z, torch.autograd.grad(value.mean(), list(z.values())), strict=True):
            out[name][i] = g
    return out


@pytest.mark.parametrize("case", list(CASES))
def test_sgp_weight_shared_gradients_equal_each_nodes_mean_loss_gradient(case):
    """The non-private step's one-backward path (no per-record gradient) gives every node the
    gradient of its own batch's mean loss, for every layer type book-keeping reads."""
    build, shape, loss = CASES[case]
    model = build()
    n, counts = 4, [3, 0, 5, 1]
    batch = _batch(n, counts, shape, float_targets=loss == "squared_error", seed=2)
    params = _nodes_params(model, n, seed=3)
    want = reference_mean_grads(model, params, batch, loss)
    got = mean_batch_grads(model, params, batch, loss=loss)
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-5, rtol=1e-4)
        assert torch.equal(got[name][1], torch.zeros_like(got[name][1]))


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("shuffled", [False, True])
def test_sgp_node_by_node_path_is_each_nodes_mean_loss_gradient(case, shuffled, monkeypatch):
    """With batches large enough (>= 4 records per sampled node), SGP takes plain autograd
    node by node: the same gradients as the definition, records in any order; the batched
    path is not used."""
    import dpdl.algorithms.dyn_d2p as dyn

    build, shape, loss = CASES[case]
    model = build()
    n, counts = 4, [6, 0, 5, 4]
    batch = _batch(n, counts, shape, float_targets=loss == "squared_error", seed=6)
    if shuffled:
        order = torch.randperm(batch.size, generator=torch.Generator().manual_seed(0))
        batch = NodeBatch(batch.inputs[order], batch.targets[order], batch.node[order], n)
    params = _nodes_params(model, n, seed=7)
    monkeypatch.setattr(per_sample, "clipped_sums_by_node", None)  # would raise if called
    monkeypatch.setattr(dyn, "clipped_sums_by_node", None)
    want = reference_mean_grads(model, params, batch, loss)
    got = mean_batch_grads(model, params, batch, loss=loss)
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-5, rtol=1e-4)
        assert torch.equal(got[name][1], torch.zeros_like(got[name][1]))


def test_sgp_keeps_records_apart_for_a_model_whose_layers_couple_them():
    """A batch-norm layer makes a record's output depend on its batch: SGP then takes the
    batched path (each record a batch of one) whatever the batch size, so its gradient does
    not change with how many records a node sampled."""
    import dpdl.algorithms.dyn_d2p as dyn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4, affine=False,
                                                             track_running_stats=False),
                          nn.Flatten(), nn.Linear(4 * 4 * 3, 3))  # fmt: skip
    assert dyn._couples_records(model) and not dyn._couples_records(ConvZoo())
    n, counts = 3, [6, 5, 4]
    batch = _batch(n, counts, (2, 6, 5), seed=8)
    params = _nodes_params(model, n, seed=9)
    got = mean_batch_grads(model, params, batch)
    for i in range(n):  # each record alone through the model, then the mean
        mine = (batch.node == i).nonzero().squeeze(1)
        z = {name: p[i].double().requires_grad_(True) for name, p in params.items()}
        total = sum(LOSSES["cross_entropy"](
            torch.func.functional_call(model.double(), z, (batch.inputs[r:r + 1].double(),)),
            batch.targets[r:r + 1]).sum() for r in mine.tolist())  # fmt: skip
        wanted = torch.autograd.grad(total / len(mine), list(z.values()), allow_unused=True)
        for name, w in zip(z, wanted, strict=True):
            expect = torch.zeros_like(z[name]) if w is None else w
            torch.testing.assert_close(got[name][i].double(), expect, atol=1e-5, rtol=1e-4)
    model.float()


@pytest.mark.parametrize("records_per_chunk", [2, 7, 1000])
def test_sgp_chunks_change_no_number(records_per_chunk, monkeypatch):
    """Chunks of one unit or less (a node's records split over units, each unit's sum added
    to its node) give the same gradients as one chunk."""
    model = ConvZoo()
    n, counts = 6, [4, 1, 7, 2, 2, 6]
    batch = _batch(n, counts, (2, 8, 6), seed=4)
    params = _nodes_params(model, n, seed=5)
    plan = per_sample.book_keeping_plan(model, (2, 8, 6), params)
    monkeypatch.setattr(per_sample, "CHUNK_BYTES", records_per_chunk * plan.bytes_per_record)
    want = reference_mean_grads(model, params, batch, "cross_entropy")
    got = mean_batch_grads(model, params, batch)
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize(
    ("records_per_chunk", "overhead", "copy_cost"),
    [(2, 0.0, 16.0), (2, 0.0, 0.0), (40, 1e12, 0.0), (7, 1e12, 0.0)],
)
def test_chunks_and_padding_change_no_number(records_per_chunk, overhead, copy_cost, monkeypatch):
    """Tiny chunks (one node or less each, records padded within each), or one record per
    unit with many units of a node in one chunk (summed per node) == one big chunk."""
    model = ConvZoo()
    n, counts = 6, [4, 1, 7, 2, 2, 6]
    batch = _batch(n, counts, (2, 8, 6), seed=3)
    params = _nodes_params(model, n, seed=1)
    one = clipped_record_sums(model, params, batch, 0.05, method="book-keeping")
    plan = per_sample.book_keeping_plan(model, (2, 8, 6), params)
    monkeypatch.setattr(per_sample, "CHUNK_BYTES", records_per_chunk * plan.bytes_per_record)
    monkeypatch.setattr(per_sample, "CHUNK_OVERHEAD_MACS", overhead)
    monkeypatch.setattr(per_sample, "COPY_MACS_PER_PARAMETER", copy_cost)
    regrouped = []
    real_regroup = per_sample._regroup
    monkeypatch.setattr(per_sample, "_regroup",
                        lambda *a: regrouped.append(1) or real_regroup(*a))  # fmt: skip
    many = clipped_record_sums(model, params, batch, 0.05, method="book-keeping")
    # a private step never merges two units of one node in float32 (the Accumulator adds
    # them; MATH.md §10.3), whatever the plan
    assert not regrouped
    want = reference_clipped_sums(model, params, batch, 0.05)
    for name in want:
        torch.testing.assert_close(many[name], one[name], atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(many[name].double(), want[name], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("overhead", [0.0, 1e9])
@pytest.mark.parametrize("copy_cost", [0.0, 1e9])
def test_plan_chunks_covers_every_sampled_record_once(overhead, copy_cost, monkeypatch):
    monkeypatch.setattr(per_sample, "CHUNK_OVERHEAD_MACS", overhead)
    monkeypatch.setattr(per_sample, "COPY_MACS_PER_PARAMETER", copy_cost)
    counts = [0, 3, 1, 1, 9, 0, 2, 4, 4, 1, 7]
    first_row = np.concatenate([[0], np.cumsum(counts)])
    chunks = per_sample.plan_chunks(counts, 1e6, records_per_chunk=10, params_per_node=100)
    rows = []
    for chunk in chunks:
        assert max(chunk.lengths) <= chunk.batch
        assert len(chunk.nodes) * chunk.batch <= 10 or len(chunk.nodes) == 1
        if chunk.view is not None:
            assert chunk.nodes == list(range(*chunk.view))
        for node, start, length in zip(chunk.nodes, chunk.starts, chunk.lengths, strict=True):
            assert first_row[node] <= start and start + length <= first_row[node + 1]
            rows += range(start, start + length)
    assert sorted(rows) == list(range(sum(counts)))  # every record exactly once
    if copy_cost and not overhead:  # copies cost, chunks do not: slices of the nodes in order
        assert all(chunk.view is not None for chunk in chunks)
    if overhead and not copy_cost:  # few chunks: records no padding (one record per unit)
        assert len(chunks) == math.ceil(sum(counts) / 10)


class Scale(nn.Module):
    """x * weight + bias along the last dimension: a layer type only this file registers."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, width))
        self.bias = nn.Parameter(torch.linspace(-0.2, 0.2, width))

    def forward(self, x):
        return x * self.weight + self.bias


@register_layer(Scale)
class ScaleTerms(LayerTerms):
    def cost(self):
        return 2.0 * math.prod(self.out_shape), 0.0

    def terms(self, a, g):
        # (N, positions, width): the positions, if any, share the parameters
        a, g = a.reshape(a.shape[0], -1, a.shape[-1]), g.reshape(g.shape[0], -1, g.shape[-1])
        terms = {"weight": (g * a).sum(1), "bias": g.sum(1)}
        return sum(t.flatten(1).square().sum(1) for t in terms.values()), terms


class Unregistered(Scale):
    """Its parent's handler does not cover it: a subclass may compute something else."""


class Scaled(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.fc, self.scale, self.out = nn.Linear(5, 4), scale, nn.Linear(4, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.scale(self.fc(x))))


def test_a_registered_layer_type_is_read_by_its_handler():
    n = 3
    batch = _batch(n, [2, 3, 1], (5,), seed=6)
    model = Scaled(Scale(4))
    params = _nodes_params(model, n)
    plan = per_sample.book_keeping_plan(model, (5,), params)
    assert plan.problems == []
    assert [type(layer) for layer in plan.layers] == [LinearTerms, ScaleTerms, LinearTerms]
    clip = _median_norm_clip(model, params, batch)
    got = clipped_record_sums(model, params, batch, clip, method="book-keeping")
    want = reference_clipped_sums(model, params, batch, clip)
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-5, rtol=1e-4)
    other = Scaled(Unregistered(4))
    assert per_sample.book_keeping_plan(other, (5,), _nodes_params(other, n)).problems == [
        "scale (Unregistered)", "parameters outside the supported layers"]  # fmt: skip


class BareParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 3)
        self.scale = nn.Parameter(torch.tensor(1.5))  # not in a supported layer

    def forward(self, x):
        return self.fc(x) * self.scale


class CalledTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(torch.tanh(self.fc(x)))))


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 5)
        self.b = nn.Linear(5, 5)
        self.b.weight = self.a.weight
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.b(torch.tanh(self.a(x)))))


class WeightAlsoUsedOutside(nn.Module):
    """Reads fc.weight outside fc's forward: the layer hooks cannot see it, the check can."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 5)
        self.out = nn.Linear(5, 3)

    def forward(self, x):
        return self.out(torch.tanh(self.fc(x)) + x @ self.fc.weight)


@pytest.mark.parametrize("cls", [BareParameter, CalledTwice, Tied, WeightAlsoUsedOutside])
def test_models_book_keeping_cannot_read_fall_back(cls):
    torch.manual_seed(0)
    model = cls()
    n = 3
    batch = _batch(n, [2, 3, 1], (5,), seed=2)
    params = _nodes_params(model, n)
    clip = _median_norm_clip(model, params, batch)
    got = clipped_record_sums(model, params, batch, clip)  # auto: checked, then per-record
    want = reference_clipped_sums(model, params, batch, clip)
    for name in want:
        torch.testing.assert_close(got[name].double(), want[name], atol=1e-5, rtol=1e-4)
    assert per_sample.book_keeping_plan(model, (5,), params).problems
    with pytest.raises(DPDLError, match="book-keeping clipping cannot handle this model"):
        clipped_record_sums(model, params, batch, clip, method="book-keeping")
    with pytest.raises(DPDLError, match="unknown clipping method 'ghost'"):
        clipped_record_sums(model, params, batch, clip, method="ghost")


class WithDropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.drop, self.fc2 = nn.Linear(6, 16), nn.Dropout(0.5), nn.Linear(16, 3)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


@pytest.mark.parametrize("method", ["per-record", "book-keeping"])
def test_dropout_draws_a_mask_per_record_and_each_record_stays_clipped(method):
    torch.manual_seed(0)
    model = WithDropout().train()
    n = 6
    batch = _batch(n, [1] * n, (6,), seed=2)  # one record per node: a node's sum is its record
    params = _nodes_params(model, n)
    clip = 0.5 * _median_norm_clip(model.eval(), params, batch)  # every record clipped
    model.train()
    got = clipped_record_sums(model, params, batch, clip, method=method)
    norms = torch.sqrt(sum(g.double().pow(2).flatten(1).sum(1) for g in got.values()))
    assert bool(torch.all(norms <= clip * (1 + 1e-5))), norms
    without = clipped_record_sums(model.eval(), params, batch, clip, method=method)
    differs = [not torch.allclose(got[k], without[k]) for k in got]
    assert any(differs)  # the masks were drawn: dropout was on while training


@pytest.mark.parametrize("batch", [1, 2, 4, 6])
@pytest.mark.parametrize("conv", [nn.Conv2d(2, 4, 3, padding="same"),
                                  nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, bias=False),
                                  nn.Conv2d(6, 5, (3, 2), dilation=(2, 1), padding=(2, 0))])
def test_a_convolutions_unit_sums_are_its_records_gradients_summed(conv, batch):
    """SGP's per-unit sums (one convolution per unit from B = 4, one grouped convolution
    below) equal the sum of the records' own gradients, float64, every padding kind."""
    from dpdl.algorithms.per_sample_layers import Conv2dTerms

    torch.manual_seed(batch)
    m = 3
    a = torch.randn(m, batch, conv.in_channels, 7, 6, dtype=torch.float64)
    out_shape = conv.double()(a[0]).shape[1:]
    g = torch.randn(m, batch, *out_shape, dtype=torch.float64)
    layer = Conv2dTerms(conv, "w", "b" if conv.bias is not None else None)
    got = layer.unit_sums(a, g)
    for u in range(m):
        w = conv.weight.detach().clone().requires_grad_(True)
        bias = None if conv.bias is None else conv.bias.detach().clone().requires_grad_(True)
        y = torch.nn.functional.conv2d(a[u], w, bias, conv.stride, conv.padding, conv.dilation,
                                       conv.groups)  # fmt: skip
        wanted = torch.autograd.grad((y * g[u]).sum(), [w] + ([bias] if bias is not None else []))
        torch.testing.assert_close(got["w"][u], wanted[0], rtol=1e-10, atol=1e-12)
        if bias is not None:
            torch.testing.assert_close(got["b"][u], wanted[1], rtol=1e-10, atol=1e-12)
