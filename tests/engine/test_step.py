"""The Dyn-D2P step (MATH.md §4): transforms, invariants, and equality with a per-node loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from tests.engine.noise_reference import reference_noisy_sum

from dpdl.algorithms.dyn_d2p import (
    LocalStep,
    NodeBatch,
    NodeRecords,
    NonFiniteUpdate,
    StepArguments,
    add_gaussian_noise,
    clip_per_record,
    dyn_d2p_step,
    local_update,
    make_node_generators,
    per_record_grads,
    poisson_sample,
    push_sum_mix,
)
from dpdl.engine import NodeData, Simulator, stack_params
from dpdl.errors import DPDLError


def _reference_run(model, x0, data, topology, steps, *, lr, b, p, clip, sigma, private, seed):
    """Algorithm 1 written out node by node with plain autograd (no vmap, no batching); each
    node reads its own stream: J_i inclusion words < floor(p 2^64), then d normals."""
    x, y, mask = data
    n = x.shape[0]
    names = [name for name, _ in model.named_parameters()]
    xs = [{k: v[i].clone().double() for k, v in x0.items()} for i in range(n)]
    ws = [1.0] * n
    salts = NodeData.from_arrays(*data).fingerprints()  # seeded streams are keyed with the data
    gens = make_node_generators(n, seed, salts=salts)
    threshold = np.uint64(math.floor(p * 2.0**64))
    loss_fn = torch.nn.functional.cross_entropy
    for k in range(steps):
        halves = []
        for i in range(n):
            j_i = int(mask[i].sum())
            chosen = np.flatnonzero(gens[i].words(j_i) < threshold)
            z = {name: (xs[i][name] / ws[i]).float().requires_grad_(True) for name in names}
            per_record = []
            for j in chosen:
                out = torch.func.functional_call(model, z, (torch.as_tensor(x[i, j : j + 1]),))
                loss = loss_fn(out, torch.as_tensor(y[i, j : j + 1]))
                gs = torch.autograd.grad(loss, [z[name] for name in names])
                per_record.append([g.double() for g in gs])
            total = [torch.zeros_like(xs[i][name]) for name in names]
            if private:
                for gs in per_record:
                    norm = torch.sqrt(sum((g**2).sum() for g in gs))
                    factor = min(1.0, clip * (1 - 2.0**-12) / float(norm))  # the margin
                    total = [t + factor * g for t, g in zip(total, gs, strict=True)]
                total = [t / b for t in reference_noisy_sum(gens[i], total, sigma)]
            elif per_record:
                total = [
                    sum(gs[q] for gs in per_record) / len(per_record) for q in range(len(names))
                ]
            halves.append(
                {name: xs[i][name] - lr * t for name, t in zip(names, total, strict=True)}
            )
        P = topology.mixing_matrix(k)
        xs = [
            {name: sum(P[i, j] * halves[j][name] for j in range(n)) for name in names}
            for i in range(n)
        ]
        ws = [sum(P[i, j] * ws[j] for j in range(n)) for i in range(n)]
    return xs, ws


@pytest.mark.parametrize("private", [True, False])
@pytest.mark.parametrize("graph", ["exp", "random"])
def test_simulator_equals_per_node_reference_loop(h, private, graph):
    n, counts = 6, [7, 9, 8, 7, 10, 7]
    data = h.tiny_data(n, counts, seed=1)
    topology = h.ExpGraph(n) if graph == "exp" else h.RandomColumnStochastic(n, seed=2)
    model = h.tiny_model(seed=3)
    x0 = stack_params(model, n, torch.device("cpu"))
    b, lr, clip, sigma, steps = 2.0, 0.3, 0.5, 0.7, 6
    sim = Simulator(
        model, NodeData.from_arrays(*data), topology, lr=lr, expected_batch_size=b, seed=11
    )
    for _ in range(steps):
        sim.step(private=private, clip=clip, sigma=sigma)
    ref_x, ref_w = _reference_run(
        model, x0, data, topology, steps, lr=lr, b=b, p=b / min(counts),
        clip=clip, sigma=sigma, private=private, seed=11,
    )  # fmt: skip
    np.testing.assert_allclose(sim.weights.numpy(), ref_w, atol=1e-12)
    # a released noisy sum one grid step off moves a model by at most lr/b g (mixing averages)
    step = lr / b * 2.0 ** (math.frexp(sigma)[1] - 11) if private else 0.0
    for name, stacked in sim.params.items():
        expected = torch.stack([ref_x[i][name] for i in range(n)])
        h.assert_close_up_to_a_grid_step(stacked, expected, atol=1e-6, step=steps * step)
    # the run moved the models away from x0 (the comparison is not vacuous)
    assert any(not torch.allclose(sim.params[k], x0[k]) for k in x0)


def test_sigma_zero_without_clipping_equals_sgp(h):
    """With p = 1 (b = J, every record sampled), the private sum / b is SGP's mean gradient."""
    n, J = 5, 6
    data = h.tiny_data(n, [J] * n, seed=4)
    runs = {}
    for private in (True, False):
        sim = Simulator(
            h.tiny_model(seed=5), NodeData.from_arrays(*data), h.ExpGraph(n),
            lr=0.2, expected_batch_size=J, seed=0,
        )  # fmt: skip
        assert sim.sample_rate == 1.0
        for _ in range(5):
            sim.step(private=private, clip=1e30, sigma=0.0, unsafe_zero_noise=True)
        runs[private] = sim.params
    for name in runs[True]:
        torch.testing.assert_close(runs[True][name], runs[False][name], atol=1e-6, rtol=1e-5)


def test_clip_bound_holds_per_record(h):
    n, B = 4, 5
    model = h.tiny_model(seed=0)
    params = stack_params(model, n, torch.device("cpu"))
    x, y, _ = h.tiny_data(n, [B] * n, seed=7)
    node = torch.arange(n).repeat_interleave(B)
    batch = NodeBatch(torch.as_tensor(x).flatten(0, 1), torch.as_tensor(y).flatten(), node, n)
    grads = per_record_grads(model, params, batch)
    norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in grads.values()))
    C = float(norms.median())
    clipped = clip_per_record(grads, C)
    clipped_norms = torch.sqrt(sum(g.flatten(1).pow(2).sum(1) for g in clipped.values()))
    inner = C * (1 - 2.0**-12)  # the bound is applied with the sensitivity margin
    assert bool((clipped_norms <= C).all())
    small = norms <= inner
    assert small.any() and (~small).any()
    # records already inside the ball are untouched; the others land on its boundary
    torch.testing.assert_close(clipped_norms[small], norms[small])
    torch.testing.assert_close(clipped_norms[~small], torch.full_like(norms[~small], inner))
    # clipping rescales, never rotates
    for name in grads:
        cos = torch.nn.functional.cosine_similarity(
            grads[name].flatten(1), clipped[name].flatten(1), dim=1
        )
        nonzero = grads[name].flatten(1).norm(dim=1) > 0
        assert bool((cos[nonzero] > 1 - 1e-5).all())
    with pytest.raises(DPDLError, match="clip"):
        clip_per_record(grads, 0.0)


def test_empirical_noise_std_matches_sigma():
    n, d, sigma = 4, 20_000, 2.5
    zeros = {"a": torch.zeros(n, 100, 50), "b": torch.zeros(n, 15_000)}
    noisy = add_gaussian_noise(zeros, sigma, make_node_generators(n, 123))
    flat = torch.cat([noisy["a"].flatten(1), noisy["b"]], dim=1).double().numpy()
    assert flat.shape == (n, d)
    # chi-square interval for the sample variance of each node (99.9 %, Bonferroni over nodes)
    lo, hi = stats.chi2.ppf([0.0005 / n, 1 - 0.0005 / n], df=d) / d
    for row in flat:
        assert lo * sigma**2 <= row.var(ddof=0) <= hi * sigma**2
        assert abs(row.mean()) < 4 * sigma / np.sqrt(d)
        assert stats.normaltest(row).pvalue > 1e-4
    # fresh per node: the nodes' draws are uncorrelated
    corr = np.corrcoef(flat)[np.triu_indices(n, 1)]
    assert np.all(np.abs(corr) < 4 / np.sqrt(d))
    # and fresh per step
    again = add_gaussian_noise(zeros, sigma, make_node_generators(n, 123)[:n])
    torch.testing.assert_close(again["b"], noisy["b"])  # same seed -> same draw
    gens = make_node_generators(n, 123)
    first = add_gaussian_noise(zeros, sigma, gens)["b"]
    second = add_gaussian_noise(zeros, sigma, gens)["b"]
    assert abs(np.corrcoef(first[0].numpy(), second[0].numpy())[0, 1]) < 4 / np.sqrt(15_000)


def test_poisson_sampling_rate_and_empty_batches():
    n, J, p = 3, 40, 0.025
    x = torch.arange(n * J, dtype=torch.float32).reshape(n, J, 1)
    y = torch.zeros(n, J, dtype=torch.long)
    mask = torch.ones(n, J, dtype=torch.bool)
    mask[2, 30:] = False  # node 2 holds only 30 records
    gens = make_node_generators(n, 0)
    sizes, empty, seen_padding = [], 0, False
    for _ in range(2000):
        batch = poisson_sample(x, y, mask, p, gens)
        sizes.append(batch.counts.numpy())
        empty += int((batch.counts == 0).sum())
        values = batch.inputs[:, 0]
        seen_padding |= bool(((batch.node == 2) & (values >= 2 * J + 30)).any())
        # a sampled record belongs to its own node, and is drawn at most once
        assert torch.equal(values // J, batch.node.to(values.dtype))
        assert values.unique().numel() == batch.size
    sizes = np.array(sizes)
    assert not seen_padding
    for i, j_i in enumerate([J, J, 30]):
        # batch size is Binomial(J_i, p): mean within 5 standard errors
        se = np.sqrt(j_i * p * (1 - p) / len(sizes))
        assert abs(sizes[:, i].mean() - j_i * p) < 5 * se
    expected_empty = 2000 * (2 * (1 - p) ** J + (1 - p) ** 30)
    assert abs(empty - expected_empty) < 5 * np.sqrt(expected_empty)


def test_generators_of_a_block_equal_those_of_the_full_network():
    full = make_node_generators(8, 42)
    block = make_node_generators(8, 42, first_node=3, count=4)
    for g_full, g_block in zip(full[3:7], block, strict=True):
        assert np.array_equal(g_full.words(10), g_block.words(10))
    assert not np.array_equal(full[0].words(4), full[1].words(4))
    os_a = make_node_generators(2, None)
    os_b = make_node_generators(2, None)
    assert not np.array_equal(os_a[0].words(5), os_b[0].words(5))


@pytest.mark.parametrize("graph", ["exp", "random"])
def test_push_sum_invariants(h, graph):
    n = 9
    topology = h.ExpGraph(n) if graph == "exp" else h.RandomColumnStochastic(n, seed=1)
    rng = np.random.default_rng(0)
    x = {
        "a": torch.as_tensor(rng.normal(size=(n, 3, 2))),
        "b": torch.as_tensor(rng.normal(size=(n,))),
    }
    w = torch.ones(n, dtype=torch.float64)
    start_sum = {k: v.sum(0) for k, v in x.items()}
    start_mean = {k: v.mean(0) for k, v in x.items()}
    errors = []
    for k in range(60):
        circ = topology.circulant(k)
        x, w = push_sum_mix(x, w, None if circ else topology.mixing_matrix(k), circulant=circ)
        assert abs(float(w.sum()) - n) < 1e-10
        for name in x:
            torch.testing.assert_close(x[name].sum(0), start_sum[name])
        z = {name: x[name] / w.reshape(-1, *[1] * (x[name].dim() - 1)) for name in x}
        errors.append(max(float((z[name] - start_mean[name]).abs().max()) for name in z))
    # z_i -> mean of the initial x_i at a geometric rate
    assert errors[-1] < 1e-8
    assert errors[-1] < errors[19] * 1e-2 < errors[0]


def test_roll_and_matrix_mixing_agree(h):
    n = 7
    topology = h.ExpGraph(n)
    x = {"p": torch.randn(n, 4, dtype=torch.float64)}
    w = torch.rand(n, dtype=torch.float64) + 0.5
    for k in range(topology.period):
        a, wa = push_sum_mix(x, w, circulant=topology.circulant(k))
        b, wb = push_sum_mix(x, w, topology.mixing_matrix(k))
        torch.testing.assert_close(a["p"], b["p"])
        torch.testing.assert_close(wa, wb)


def test_non_finite_data_is_refused_and_a_non_finite_model_names_node_and_step(h):
    n = 4
    x, y, mask = h.tiny_data(n, [5] * n, seed=0)
    bad = x.copy()
    bad[2, 1, 0] = np.inf
    with pytest.raises(DPDLError, match="node 2's inputs contain NaN or infinite values"):
        NodeData.from_arrays(bad, y, mask)
    real = y.astype(np.float32)
    real[3, 4] = np.nan
    with pytest.raises(DPDLError, match="node 3's targets contain NaN or infinite values"):
        NodeData.from_arrays(x, real, mask)
    sim = Simulator(
        h.tiny_model(), NodeData.from_arrays(x, y, mask), h.ExpGraph(n),
        lr=0.1, expected_batch_size=5, seed=0,
    )  # fmt: skip
    for p in sim.params.values():
        p[2] = math.inf
    with pytest.raises(NonFiniteUpdate, match="node 2 after step 0") as info:
        sim.step(private=False)
    assert (info.value.node, info.value.step) == (2, 0)


@pytest.mark.parametrize("graph", ["exp", "random"])
def test_step_function_equals_per_node_reference_loop(h, graph):
    """dyn_d2p_step (the pure function, mixing by circulant roll or by matrix) performs the
    iteration of the node-by-node autograd reference: same x^k and w^k after several steps."""
    n, counts, steps = 5, [6, 8, 7, 6, 9], 4
    b, lr, clip, sigma, seed = 2.0, 0.3, 0.5, 0.7, 3
    data = h.tiny_data(n, counts, seed=9)
    topology = h.ExpGraph(n) if graph == "exp" else h.RandomColumnStochastic(n, seed=4)
    model = h.tiny_model(seed=1)
    nd = NodeData.from_arrays(*data)
    x0 = stack_params(model, n, torch.device("cpu"))
    params, weights = x0, torch.ones(n, dtype=torch.float64)
    gens = make_node_generators(n, seed, salts=nd.fingerprints())
    p = b / min(counts)
    for k in range(steps):
        mixing = (
            {"mixing": topology.mixing_matrix(k)}
            if graph == "random"
            else {"circulant": topology.circulant(k)}
        )
        params, weights, sizes = dyn_d2p_step(
            LocalStep(model, expected_batch_size=b), params, weights,
            NodeRecords(nd.inputs, nd.targets, nd.mask, gens, p),
            StepArguments(private=True, clip=clip, sigma=sigma, lr=lr), step=k, **mixing,
        )  # fmt: skip
        assert sizes.shape == (n,) and bool((sizes <= torch.as_tensor(counts)).all())
    ref_x, ref_w = _reference_run(
        model, x0, data, topology, steps, lr=lr, b=b, p=p,
        clip=clip, sigma=sigma, private=True, seed=seed,
    )  # fmt: skip
    np.testing.assert_allclose(weights.numpy(), ref_w, atol=1e-12)
    for name, stacked in params.items():
        expected = torch.stack([ref_x[i][name] for i in range(n)]).numpy()
        np.testing.assert_allclose(stacked.double().numpy(), expected, atol=1e-6, rtol=0)
    assert any(not torch.allclose(params[k], x0[k]) for k in x0)


def test_simulator_rejects_bad_input(h):
    n = 3
    data = NodeData.from_arrays(*h.tiny_data(n, [4] * n))
    with pytest.raises(DPDLError, match="topology has 5 nodes"):
        Simulator(h.tiny_model(), data, h.ExpGraph(5), lr=0.1)
    with pytest.raises(DPDLError, match="J_min = 4"):
        Simulator(h.tiny_model(), data, h.ExpGraph(n), lr=0.1, expected_batch_size=8)
    with pytest.raises(DPDLError, match="learning rate"):
        Simulator(h.tiny_model(), data, h.ExpGraph(n), lr=-1.0)
    if not torch.cuda.is_available():
        with pytest.raises(DPDLError, match="CUDA is not available"):
            Simulator(h.tiny_model(), data, h.ExpGraph(n), lr=0.1, device="cuda")


def test_device_auto_resolves():
    from dpdl.engine import resolve_device

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(DPDLError, match="unknown device"):
        resolve_device("tpu:banana")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_matches_cpu(h):
    """Without randomness in play (p = 1, sigma = 0) CUDA and CPU compute the same iteration."""
    n, J = 5, 6
    data = h.tiny_data(n, [J] * n, seed=4)
    out = {}
    for device in ("cpu", "cuda"):
        sim = Simulator(
            h.tiny_model(seed=5), NodeData.from_arrays(*data), h.RandomColumnStochastic(n),
            lr=0.2, expected_batch_size=J, seed=0, device=device,
        )  # fmt: skip
        for _ in range(3):
            sim.step(private=True, clip=0.5, sigma=0.0, unsafe_zero_noise=True)
        out[device] = {k: v.cpu() for k, v in sim.params.items()}
    for k in out["cpu"]:
        torch.testing.assert_close(out["cuda"][k], out["cpu"][k], atol=1e-5, rtol=1e-4)


def test_node_data_with_a_gap_in_the_mask_is_refused():
    import numpy as np

    from dpdl.engine.simulator import NodeData
    from dpdl.errors import DPDLError

    x, y = np.zeros((2, 3, 4), np.float32), np.zeros((2, 3), np.int64)
    NodeData.from_arrays(x, y, np.array([[1, 1, 0], [1, 0, 0]], bool))
    with pytest.raises(DPDLError, match="real records first"):
        NodeData.from_arrays(x, y, np.array([[1, 0, 1], [1, 1, 1]], bool))


def test_local_update_methods_agree_and_draw_the_same_numbers(h):
    """Book-keeping and per-record clipping: same parameters to 1e-5, same generator states."""
    n, counts = 5, [9, 6, 8, 7, 10]
    x, y, mask = h.tiny_data(n, counts, seed=4)
    data = NodeData.from_arrays(x, y, mask)
    model = h.tiny_model(seed=2)
    params = stack_params(model, n, torch.device("cpu"))
    weights = torch.linspace(0.7, 1.3, n, dtype=torch.float64)
    out, states = {}, {}
    for method in ("per-record", "book-keeping"):
        gens = make_node_generators(n, 8)
        out[method] = local_update(
            LocalStep(model, expected_batch_size=3.0, clip_method=method), params, weights,
            NodeRecords(data.inputs, data.targets, data.mask, gens, 0.5),
            StepArguments(private=True, clip=0.2, sigma=0.6, lr=0.3), step=0,
        )  # fmt: skip
        states[method] = torch.stack([g.get_state() for g in gens])
    assert torch.equal(states["per-record"], states["book-keeping"])
    assert torch.equal(out["per-record"].batch_sizes, out["book-keeping"].batch_sizes)
    for name in params:
        torch.testing.assert_close(
            out["book-keeping"].params[name], out["per-record"].params[name], atol=1e-5, rtol=0
        )
