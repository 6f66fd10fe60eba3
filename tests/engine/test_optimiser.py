"""Momentum, weight decay and local steps (MATH.md §4): the engine against a per-node loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tests.engine.noise_reference import assert_close_up_to_a_grid_step, reference_noisy_sum

from dpdl.algorithms.dyn_d2p import apply_weight_decay, heavy_ball, make_node_generators
from dpdl.algorithms.transforms import sgd
from dpdl.engine import NodeData, Simulator, stack_params
from dpdl.errors import DPDLError


def _linear(seed: int = 3) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(5, 3)


def _reference(model, data, topology, mixes, *, lr, b, p, clip, sigma, private, seed,
               momentum=0.0, weight_decay=0.0):  # fmt: skip
    """The step of MATH.md §4 node by node with plain autograd, in float64: each node reads
    its own stream (J_i inclusion words < floor(p 2^64), then d normals), u = (clipped sum +
    noise) / b or the mean gradient, u += lambda z, m = beta m + u, x -= lr m; then mixing
    with P^r, r the gossip round, only where ``mixes[k]``."""
    x, y, mask = data
    n = x.shape[0]
    names = [name for name, _ in model.named_parameters()]
    x0 = stack_params(model, n, torch.device("cpu"))
    xs = [{k: v[i].double() for k, v in x0.items()} for i in range(n)]
    ms = [{k: torch.zeros_like(v) for k, v in xs[i].items()} for i in range(n)]
    ws = [1.0] * n
    gens = make_node_generators(n, seed, salts=NodeData.from_arrays(*data).fingerprints())
    threshold = np.uint64(math.floor(p * 2.0**64))
    rounds = 0
    for mix in mixes:
        for i in range(n):
            chosen = np.flatnonzero(gens[i].words(int(mask[i].sum())) < threshold)
            z = {name: xs[i][name] / ws[i] for name in names}
            grads = []
            for j in chosen:
                zf = {name: v.float().requires_grad_(True) for name, v in z.items()}
                out = torch.func.functional_call(model, zf, (torch.as_tensor(x[i, j : j + 1]),))
                loss = torch.nn.functional.cross_entropy(out, torch.as_tensor(y[i, j : j + 1]))
                grads.append([g.double() for g in torch.autograd.grad(loss, list(zf.values()))])
            u = [torch.zeros_like(xs[i][name]) for name in names]
            if private:
                for gs in grads:
                    norm = float(torch.sqrt(sum((g**2).sum() for g in gs)))
                    factor = min(1.0, clip * (1 - 2.0**-12) / norm)  # the sensitivity margin
                    u = [t + factor * g for t, g in zip(u, gs, strict=True)]
                u = [t / b for t in reference_noisy_sum(gens[i], u, sigma)]
            elif grads:
                u = [sum(gs[q] for gs in grads) / len(grads) for q in range(len(names))]
            for q, name in enumerate(names):
                ms[i][name] = momentum * ms[i][name] + u[q] + weight_decay * z[name]
                xs[i][name] = xs[i][name] - lr * ms[i][name]
        if mix:
            P = topology.mixing_matrix(rounds)
            xs = [{name: sum(P[i, j] * xs[j][name] for j in range(n)) for name in names}
                  for i in range(n)]  # fmt: skip
            ws = [sum(P[i, j] * ws[j] for j in range(n)) for i in range(n)]
            rounds += 1
    return xs, ws


def _simulator(h, topology, data, *, momentum=0.0, weight_decay=0.0, b=2.0, lr=0.3):
    return Simulator(_linear(), NodeData.from_arrays(*data), topology, lr=lr,
                     expected_batch_size=b, seed=11,
                     transforms=sgd(momentum=momentum, weight_decay=weight_decay))  # fmt: skip


def _assert_equal_to(sim, ref_x, ref_w, n, steps: int = 3):
    np.testing.assert_allclose(sim.weights.numpy(), ref_w, atol=1e-12)
    # a released noisy sum one grid step off (float32 against float64 sums on the two sides of
    # a cell boundary) moves a model by lr / b g, momentum carrying it at most 1 / (1 - beta)
    step = steps * 0.3 / 2.0 * 2.0 ** (math.frexp(0.7)[1] - 11) * 10
    for name, stacked in sim.params.items():
        expected = torch.stack([ref_x[i][name] for i in range(n)])
        assert_close_up_to_a_grid_step(stacked, expected, atol=2e-6, step=step)


@pytest.mark.parametrize(
    ("private", "momentum", "weight_decay"),
    [(True, 0.9, 0.0), (True, 0.0, 0.1), (True, 0.8, 0.05), (False, 0.9, 0.1)],
)
def test_momentum_and_weight_decay_equal_a_per_node_reference(h, private, momentum,
                                                              weight_decay):  # fmt: skip
    """Three seeded noisy steps on a random (non-doubly-stochastic: w_i != 1, so z != x)
    graph: m <- beta m + u + lambda z, x -= lr m, per node."""
    n, counts = 5, [7, 9, 8, 7, 10]
    data = h.tiny_data(n, counts, seed=1)
    topology = h.RandomColumnStochastic(n, seed=2)
    sim = _simulator(h, topology, data, momentum=momentum, weight_decay=weight_decay)
    for _ in range(3):
        sim.step(private=private, clip=0.5, sigma=0.7)
    ref_x, ref_w = _reference(
        _linear(), data, topology, [True] * 3, lr=0.3, b=2.0, p=2.0 / min(counts), clip=0.5,
        sigma=0.7, private=private, seed=11, momentum=momentum, weight_decay=weight_decay,
    )  # fmt: skip
    assert not np.allclose(ref_w, 1.0)  # the decay acts at z = x / w, not at x
    _assert_equal_to(sim, ref_x, ref_w, n)
    # the options matter: the plain step lands elsewhere
    plain, _ = _reference(
        _linear(), data, topology, [True] * 3, lr=0.3, b=2.0, p=2.0 / min(counts), clip=0.5,
        sigma=0.7, private=private, seed=11,
    )  # fmt: skip
    assert not np.allclose(plain[0]["weight"].numpy(), ref_x[0]["weight"].numpy(), atol=1e-4)


def test_the_transforms_are_u_plus_lambda_z_and_heavy_ball():
    u = {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}
    z = {"a": torch.tensor([[10.0, 20.0], [30.0, 40.0]])}
    torch.testing.assert_close(apply_weight_decay({"a": u["a"].clone()}, z, 0.5)["a"],
                               u["a"] + 0.5 * z["a"])  # fmt: skip
    m = {"a": torch.ones(2, 2)}
    out = heavy_ball(m, u, 0.9)
    assert out["a"] is m["a"]  # the buffer itself, updated in place
    torch.testing.assert_close(m["a"], 0.9 + u["a"])
    with pytest.raises(DPDLError, match="momentum"):
        heavy_ball(m, u, 1.0)
    with pytest.raises(DPDLError, match="weight_decay"):
        apply_weight_decay(u, z, -1.0)


def test_local_steps_do_not_mix_and_the_gossip_rounds_walk_the_graphs(h):
    """H = 3 for K = 5 steps: steps 0 and 1 are local (the nodes' models are those of pure
    local updates, the weights stay 1), step 2 mixes with P^0, steps 3, 4 local and the last
    one mixes with P^1; the plan's arguments drive the engine."""
    from dpdl.accounting.schedules import make_schedule
    from dpdl.training.plan import RunPlan
    from dpdl.training.settings import TrainingSection

    n, counts = 5, [7, 9, 8, 7, 10]
    data = h.tiny_data(n, counts, seed=1)
    topology = h.ExpGraph(n)
    sim = _simulator(h, topology, data, momentum=0.5)
    schedule = make_schedule("const-d2p", epsilon=2.0, delta=1e-4, steps=5,
                             sample_rate=sim.sample_rate, calibrate="clt")  # fmt: skip
    plan = RunPlan.of(schedule, TrainingSection(steps=5, lr=0.3, local_steps=3))
    args = [plan.step_arguments(k) for k in range(5)]
    assert [a.mix for a in args] == [False, False, True, False, True]
    assert [a.mixing_round for a in args if a.mix] == [0, 1]
    kw = dict(lr=0.3, b=2.0, p=sim.sample_rate, clip=args[0].clip, sigma=args[0].sigma,
              private=True, seed=11, momentum=0.5)  # fmt: skip
    for k in range(5):
        sim.step(args[k])
        mixes = [a.mix for a in args[: k + 1]]
        ref_x, ref_w = _reference(_linear(), data, topology, mixes, **kw)
        _assert_equal_to(sim, ref_x, ref_w, n)
        if k < 2:  # local so far: every weight still 1, the models apart (no averaging)
            assert torch.equal(sim.weights, torch.ones(n, dtype=torch.float64))
            assert not torch.allclose(sim.params["weight"][0], sim.params["weight"][1])


def test_a_local_step_never_overwrites_a_model_in_place(h):
    """The models a local step leaves are its work buffer's tensors: the next step must not
    write into them (it takes a fresh buffer)."""
    n = 4
    data = h.tiny_data(n, [6] * n, seed=2)
    sim = _simulator(h, h.ExpGraph(n), data)
    sim.step(private=True, clip=0.5, sigma=0.7, mix=False)
    kept = {k: v for k, v in sim.params.items()}
    copy = {k: v.clone() for k, v in kept.items()}
    sim.step(private=True, clip=0.5, sigma=0.7, mix=False)
    assert all(torch.equal(kept[k], copy[k]) for k in kept)


def test_a_checkpoint_with_momentum_resumes_bit_identically(h):
    n = 4
    data = h.tiny_data(n, [6, 7, 8, 6], seed=2)
    topology = h.RandomColumnStochastic(n, seed=1)

    def fresh():
        return _simulator(h, topology, data, momentum=0.9, weight_decay=0.01)

    args = [dict(private=True, clip=0.5, sigma=0.7, mix=k % 2 == 1, mixing_round=k // 2)
            for k in range(6)]  # fmt: skip
    full = fresh()
    for a in args:
        full.step(**a)
    cut = fresh()
    for a in args[:3]:
        cut.step(**a)
    state = cut.state_dict()
    cut.step(**args[3])  # the saved state is a copy: later steps do not change it
    resumed = fresh()
    resumed.load_state_dict(state)
    for a in args[3:]:
        resumed.step(**a)
    for name in full.params:
        assert torch.equal(resumed.params[name], full.params[name])
        assert torch.equal(resumed.momentum_buffer[name], full.momentum_buffer[name])
    assert torch.equal(resumed.weights, full.weights)
    # a checkpoint without the buffers (momentum 0) cannot continue a run with momentum
    plain = _simulator(h, topology, data)
    assert not {"momentum", "transforms"} & set(plain.state_dict())
    with pytest.raises(DPDLError, match="no state of the update transform 'momentum'"):
        fresh().load_state_dict(plain.state_dict())
    with pytest.raises(DPDLError, match="'momentum', which this run does not keep"):
        plain.load_state_dict(state)


@pytest.mark.parametrize(("option", "value"), [("momentum", 1.0), ("momentum", -0.1),
                                               ("weight_decay", -1.0)])  # fmt: skip
def test_the_engine_refuses_bad_optimiser_settings(h, option, value):
    data = h.tiny_data(3, [5] * 3)
    with pytest.raises(DPDLError, match=option):
        Simulator(_linear(), NodeData.from_arrays(*data), h.ExpGraph(3), lr=0.1,
                  transforms=sgd(**{option: value}))  # fmt: skip


# ---------------------------------------------------------------- the distributed runtime
class _Exp:
    """MATH.md §3's time-varying exponential graph, as a matrix (picklable for spawn)."""

    def __init__(self, n):
        self.n, self.period, self.name, self.directed = n, (n - 1).bit_length(), "exp", True

    def circulant(self, k):
        return None

    def mixing_matrix(self, k):
        s = 2 ** (k % self.period) % self.n
        P = 0.5 * np.eye(self.n)
        P[(np.arange(self.n) + s) % self.n, np.arange(self.n)] += 0.5
        return P


_ARGS = [dict(private=True, clip=0.5, sigma=0.7, mix=k % 3 == 2 or k == 4, mixing_round=k // 3)
         for k in range(5)]  # fmt: skip


def _five_nodes():
    rng = np.random.default_rng(4)
    counts = np.array([6, 8, 7, 6, 9])
    x = rng.normal(size=(5, 9, 5)).astype(np.float32)
    return x, rng.integers(0, 3, size=(5, 9)), np.arange(9)[None, :] < counts[:, None]


def _optimised(engine, data, topology, **kw):
    return engine(_linear(), data, topology, lr=0.3, expected_batch_size=2.0, seed=11,
                  transforms=sgd(momentum=0.9, weight_decay=0.05), **kw)  # fmt: skip


def _distributed_worker(rank, world, port, out_dir):
    import os

    import torch.distributed as dist

    from dpdl.engine.comm import block_bounds
    from dpdl.engine.distributed import DistributedSimulator

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    lo, hi = block_bounds(5, world, rank)
    x, y, mask = _five_nodes()
    data = NodeData.from_arrays(x[lo:hi], y[lo:hi], mask[lo:hi], first_node=lo)
    sim = _optimised(DistributedSimulator, data, _Exp(5))
    for a in _ARGS:
        sim.step(**a)
    torch.save({"params": sim.params, "m": sim.momentum_buffer, "w": sim.weights},
               os.path.join(out_dir, f"{rank}.pt"))  # fmt: skip
    dist.destroy_process_group()


def test_the_distributed_runtime_with_momentum_and_local_steps_equals_the_simulator(tmp_path):
    """Two gloo processes (blocks of 3 and 2 nodes), each with its block's momentum rows."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_distributed_worker, args=(2, port, str(tmp_path)), nprocs=2,
                       start_method="spawn")  # fmt: skip
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(2)]
    sim = _optimised(Simulator, NodeData.from_arrays(*_five_nodes()), _Exp(5))
    for a in _ARGS:
        sim.step(**a)
    torch.testing.assert_close(torch.cat([p["w"] for p in parts]), sim.weights, rtol=0,
                               atol=1e-12)  # fmt: skip
    for name in sim.params:
        for key, want in (("params", sim.params), ("m", sim.momentum_buffer)):
            got = torch.cat([p[key][name] for p in parts])
            torch.testing.assert_close(got, want[name], rtol=0, atol=1e-6)
