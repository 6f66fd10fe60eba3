"""The simulator's speed paths (noise drawn on a worker thread into reused buffers, in-place
clipping/noise, index_add sums) draw and compute exactly what the plain definitions do."""

from __future__ import annotations

from concurrent.futures import Future

import numpy as np
import pytest
import torch

import dpdl.algorithms.dyn_d2p as dyn
from dpdl.algorithms import noise
from dpdl.algorithms.dyn_d2p import (
    LocalStep,
    NodeBatch,
    NodeRecords,
    StepArguments,
    StepBuffers,
    add_gaussian_noise,
    local_update,
    make_node_generators,
    mean_batch_grads,
    sum_records,
)
from dpdl.algorithms.transforms import sgd
from dpdl.engine import NodeData, Simulator, stack_params
from dpdl.errors import DPDLError


class _RunNow:
    """Stands in for the noise worker: runs the draw on the calling thread, at submit time."""

    def submit(self, fn):
        done = Future()
        done.set_result(fn())
        return done


def _step(model, params, weights, data, gens, *, rate, b, args, method="auto", work=None,
          noise_buffer=None):  # fmt: skip
    """local_update of step 0 with the plain transforms."""
    return local_update(LocalStep(model, expected_batch_size=b, clip_method=method), params,
                        weights, NodeRecords(data.inputs, data.targets, data.mask, gens, rate),
                        args, step=0, scratch=StepBuffers(work, noise_buffer))  # fmt: skip


def _local_update_args(h, n=5, counts=(6, 8, 7, 6, 9), seed=2):
    x, y, mask = h.tiny_data(n, list(counts), seed=seed)
    model = h.tiny_model(seed=seed)
    data = NodeData.from_arrays(x, y, mask)
    params = stack_params(model, n, torch.device("cpu"))
    weights = torch.ones(n, dtype=torch.float64)
    return model, params, weights, data


def test_each_nodes_noise_is_its_own_streams_draw():
    """Row i of one batched release is what node i's stream gives alone: a node's noise does
    not depend on which other nodes share the call (or the process); a reused draw's buffers
    are refilled, not reallocated, and give the same numbers."""
    n = 3
    sums = {"w": torch.randn(n, 40, 25), "b": torch.randn(n, 1)}
    drawn = add_gaussian_noise(sums, 0.8, make_node_generators(n, 5))
    for i, g in enumerate(make_node_generators(n, 5)):
        alone = add_gaussian_noise({k: v[i : i + 1] for k, v in sums.items()}, 0.8, [g])
        for name in sums:
            assert torch.equal(drawn[name][i], alone[name][0])
    assert not torch.equal(drawn["w"][0] - sums["w"][0], drawn["w"][1] - sums["w"][1])
    d = 1001
    first = noise.draw(make_node_generators(n, 5), d, 0.8)
    buffers = [first.whole.data_ptr(), first.frac.data_ptr(), first.words.data_ptr()]
    want = first.frac.clone()
    again = noise.draw(make_node_generators(n, 5), d, 0.8, reuse=first)
    assert again is first
    assert [again.whole.data_ptr(), again.frac.data_ptr(), again.words.data_ptr()] == buffers
    assert torch.equal(again.frac, want)
    other = noise.draw(make_node_generators(n, 5), d - 1, 0.8, reuse=first)  # another shape
    assert other is not first and other.shape == (n, d - 1)


@pytest.mark.parametrize("private", [True, False])
def test_worker_thread_and_buffer_change_no_number(h, private, monkeypatch):
    """Overlapped draw + reused buffer == drawing on the caller's thread into a fresh tensor,
    for the parameters and for where every generator's stream stands afterwards."""
    model, params, weights, data = _local_update_args(h)
    args = StepArguments(private=private, clip=0.4, sigma=0.8, lr=0.3)
    d = sum(p[0].numel() for p in params.values())
    results, states = [], []
    for worker, buffer in ((None, noise.NoiseDraw.empty(5, d)), (_RunNow(), None)):
        if worker is not None:
            monkeypatch.setattr(dyn, "_noise_worker", lambda w=worker: w)
        gens = make_node_generators(5, 17)
        out = _step(model, params, weights, data, gens, rate=2.0 / 6, b=2.0, args=args,
                    noise_buffer=buffer)  # fmt: skip
        results.append(out)
        states.append(torch.stack([g.get_state() for g in gens]))
    for name in params:
        torch.testing.assert_close(results[0].params[name], results[1].params[name], rtol=0, atol=0)
        assert not torch.equal(results[0].params[name], params[name])
    assert torch.equal(results[0].batch_sizes, results[1].batch_sizes)
    assert torch.equal(states[0], states[1])


def test_failed_gradient_leaves_no_draw_in_flight(h, monkeypatch):
    """If the gradients raise, local_update returns only after the noise draw has finished:
    every generator stands after its uniforms and its d noise words, never mid-draw."""
    model, params, weights, data = _local_update_args(h)

    def broken(*args, **kwargs):
        raise RuntimeError("gradient failed")

    monkeypatch.setattr(dyn, "clipped_record_sums", broken)
    gens = make_node_generators(5, 3)
    with pytest.raises(RuntimeError, match="gradient failed"):
        _step(model, params, weights, data, gens, rate=0.2, b=1.0,
              args=StepArguments(private=True, clip=1.0, sigma=1.0, lr=0.1))  # fmt: skip
    d = sum(p[0].numel() for p in params.values())
    for g, ref, j_i in zip(gens, make_node_generators(5, 3), data.counts.tolist(), strict=True):
        ref.words(j_i)
        ref.words(d)
        assert torch.equal(g.get_state(), ref.get_state())


def test_sum_records_in_place_and_out_of_place_agree_with_a_loop():
    rng = np.random.default_rng(0)
    node = torch.tensor([0, 2, 2, 3, 0, 2])
    grads = {
        "w": torch.as_tensor(rng.normal(size=(6, 3, 2))),
        "b": torch.as_tensor(rng.normal(size=(6, 4))),
    }
    factors = torch.as_tensor(rng.uniform(0.1, 1.0, size=6))
    batch = NodeBatch(torch.zeros(6, 1), torch.zeros(6), node, 4)
    expected = {
        name: torch.stack(
            [
                sum((factors[r] * g[r] for r in range(6) if node[r] == i), torch.zeros_like(g[0]))
                for i in range(4)
            ]
        )
        for name, g in grads.items()
    }
    before = {name: g.clone() for name, g in grads.items()}
    out = sum_records(grads, batch, factors)
    for name in grads:
        torch.testing.assert_close(out[name], expected[name])
        assert torch.equal(grads[name], before[name])  # not touched
    out_in_place = sum_records(grads, batch, factors, in_place=True)
    for name in grads:
        torch.testing.assert_close(out_in_place[name], expected[name])
        torch.testing.assert_close(
            grads[name], before[name] * factors.reshape(-1, *[1] * (grads[name].dim() - 1))
        )


def test_mean_batch_grads_is_the_autograd_gradient_of_each_nodes_mean_loss(h):
    n = 3
    model = h.tiny_model(seed=4)
    params = {
        k: v + 0.1 * torch.randn_like(v)
        for k, v in stack_params(model, n, torch.device("cpu")).items()
    }
    x, y, _ = h.tiny_data(n, [4] * n, seed=9)
    node = torch.tensor([0, 0, 0, 2])  # node 1 sampled nothing: its gradient is zero
    records = torch.tensor([0, 1, 3, 2])
    inputs, targets = torch.as_tensor(x)[node, records], torch.as_tensor(y)[node, records]
    got = mean_batch_grads(model, params, NodeBatch(inputs, targets, node, n))
    for i in range(n):
        mine = node == i
        if not bool(mine.any()):
            for name in params:
                assert torch.equal(got[name][i], torch.zeros_like(params[name][i]))
            continue
        z = {name: p[i].clone().requires_grad_(True) for name, p in params.items()}
        out = torch.func.functional_call(model, z, (inputs[mine],))
        loss = torch.nn.functional.cross_entropy(out, targets[mine])  # the mean over the batch
        expected = torch.autograd.grad(loss, list(z.values()))
        for name, e in zip(z, expected, strict=True):
            torch.testing.assert_close(got[name][i], e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("momentum", [0.0, 0.5])
def test_both_private_paths_refill_one_noise_buffer_across_steps(h, momentum):
    """The plain and the optimiser's path draw into the simulator's one set of noise buffers,
    allocated at the first private step and refilled after (no fresh (n, d) blocks a step)."""
    n = 4
    x, y, mask = h.tiny_data(n, [5] * n, seed=1)
    data = NodeData.from_arrays(x, y, mask)
    sim = Simulator(h.tiny_model(), data, h.ExpGraph(n), lr=0.1, seed=0,
                    transforms=sgd(momentum=momentum))
    sim.step(private=False)
    assert sim._noise_buffer is None
    sim.step(private=True, clip=1.0, sigma=1.0)
    buffer = sim._noise_buffer
    d = sum(p[0].numel() for p in sim.params.values())
    assert buffer is not None and buffer.shape == (n, d)
    pointer = buffer.whole.data_ptr()
    sim.step(private=True, clip=1.0, sigma=1.0)
    assert sim._noise_buffer is buffer and buffer.whole.data_ptr() == pointer
    assert all(bool(p.isfinite().all()) for p in sim.params.values())


def test_a_release_by_parameter_blocks_is_the_release_of_the_flat_vector():
    """The mechanism releases each parameter's (m, size) block against its columns of the
    node's one draw: the same cells, bit for bit, as releasing the flat (m, d) sums at once,
    and every stream ends where the one release leaves it."""
    n = 3
    sums = {"w": torch.randn(n, 380, 3) * 4, "b": torch.randn(n, 2)}
    d = sum(p[0].numel() for p in sums.values())
    gens, ref = make_node_generators(n, 11), make_node_generators(n, 11)
    got = add_gaussian_noise(sums, 0.37, gens)
    flat = torch.cat([sums["w"].reshape(n, -1), sums["b"]], dim=1)
    drawn = noise.draw(ref, d, 0.37)
    want = (noise.release(drawn, flat) * drawn.grid).float()
    assert torch.equal(torch.cat([got["w"].reshape(n, -1), got["b"]], dim=1), want)
    assert torch.equal(torch.stack([g.get_state() for g in gens]),
                       torch.stack([g.get_state() for g in ref]))  # fmt: skip


@pytest.mark.parametrize("method", ["book-keeping", "per-record"])
@pytest.mark.parametrize("rate", [0.4, 0.0])
def test_fused_private_step_is_steps_three_to_five_one_after_the_other(h, method, rate):
    """x - (lr/b)(sum of clipped gradients + sigma xi), as one pass over the models, equals
    the composition of the step's transforms (clipped sums, the node's draw, the SGD step) up
    to rounding, with the same draws (an empty batch too: rate 0 sends noise only)."""
    model, params, weights, data = _local_update_args(h)
    weights = torch.linspace(0.8, 1.2, 5, dtype=torch.float64)
    lr, b, clip, sigma = 0.3, 2.0, 0.4, 0.8
    gens = make_node_generators(5, 23)
    fused = _step(model, params, weights, data, gens, rate=rate, b=b, method=method,
                  args=StepArguments(private=True, clip=clip, sigma=sigma, lr=lr))  # fmt: skip
    ref = make_node_generators(5, 23)
    batch = dyn.poisson_sample(data.inputs, data.targets, data.mask, rate, ref)
    at = dyn.debias(params, weights)
    sums = dyn.clipped_record_sums(model, at, batch, clip, method=method)
    noisy = dyn.add_gaussian_noise(sums, sigma, ref)
    want = dyn.local_sgd_step(params, noisy, lr, b)
    for name in params:
        torch.testing.assert_close(fused.params[name], want[name], rtol=1e-6, atol=1e-7)
    assert torch.equal(fused.batch_sizes, batch.counts)
    assert torch.equal(torch.stack([g.get_state() for g in gens]),
                       torch.stack([g.get_state() for g in ref]))  # fmt: skip


def test_fused_sgp_step_is_the_mean_gradient_step(h):
    model, params, weights, data = _local_update_args(h)
    gens, ref = make_node_generators(5, 4), make_node_generators(5, 4)
    fused = _step(model, params, weights, data, gens, rate=0.5, b=2.0,
                  args=StepArguments(private=False, lr=0.2))  # fmt: skip
    batch = dyn.poisson_sample(data.inputs, data.targets, data.mask, 0.5, ref)
    want = dyn.local_sgd_step(params, mean_batch_grads(model, params, batch), 0.2)
    for name in params:
        torch.testing.assert_close(fused.params[name], want[name], rtol=1e-6, atol=1e-7)
        assert not torch.equal(fused.params[name], params[name])


def test_a_forked_child_gets_its_own_noise_worker(monkeypatch):
    """fork() copies the parent's executor but not its thread: a new process id must get a
    fresh worker (the old one would never run the draw)."""
    parent = dyn._noise_worker()
    assert dyn._noise_worker() is parent
    monkeypatch.setattr(dyn.os, "getpid", lambda: -12345)
    child = dyn._noise_worker()
    assert child is not parent
    assert child.submit(lambda: 7).result(timeout=10) == 7


def test_evaluation_builds_no_autograd_graph_and_any_chunk_gives_the_same_scores(h):
    n = 3
    x, y, mask = h.tiny_data(n, [6] * n, seed=2)
    sim = Simulator(h.tiny_model(), NodeData.from_arrays(x, y, mask), h.ExpGraph(n), lr=0.1, seed=0)
    sim.step(private=True, clip=1.0, sigma=1.0)
    x = torch.as_tensor(x).requires_grad_()  # even inputs that ask for a graph get none
    for predict, inputs in ((sim.predict_average, x[0]), (sim.predict_nodes, x[0]),
                            (sim.predict_own_inputs, x)):
        default = predict(inputs)
        assert not default.requires_grad and default.grad_fn is None
        torch.testing.assert_close(predict(inputs, chunk=1), default)


def test_accumulator_holds_parts_until_the_noisy_start_is_written_and_keeps_their_order():
    """Parts that arrive while the worker still writes the target are held, then added in
    arrival order (the same bits as adding them at once); the worker's error is raised."""
    from dpdl.algorithms.per_sample import Accumulator

    parts = [(slice(0, 2), {"w": torch.full((2, 3), 0.1)}),
             (torch.tensor([1, 1, 0]), {"w": torch.tensor([[1e8] * 3, [-1e8] * 3, [0.3] * 3])})]
    want = Accumulator({"w": torch.ones(2, 3)}, alpha=-0.7)
    for where, sums in parts:
        (want.add_rows(where.start, where.stop, sums) if isinstance(where, slice)
         else want.add_at(where, sums))  # fmt: skip
    pending = Future()
    target = {"w": torch.zeros(2, 3)}
    held = Accumulator(target, alpha=-0.7, pending=pending)
    held.add_rows(0, 2, parts[0][1])
    held.add_at(parts[1][0], parts[1][1])
    assert torch.equal(target["w"], torch.zeros(2, 3))  # nothing written before the start
    target["w"].fill_(1.0)  # the worker writes its start, then finishes
    pending.set_result(None)
    assert torch.equal(held.finish()["w"], want.finish()["w"])
    failed = Future()
    failed.set_exception(RuntimeError("noise draw failed"))
    with pytest.raises(RuntimeError, match="noise draw failed"):
        Accumulator({"w": torch.zeros(1)}, pending=failed).finish()


def test_a_node_without_its_own_stream_or_data_is_refused_before_anything_is_released(h):
    """More model rows than streams or data rows: refused, never a row sent without noise."""
    model, params, weights, data = _local_update_args(h)
    extra = {k: torch.cat([v, v[:1]]) for k, v in params.items()}
    args = StepArguments(private=True, clip=0.4, sigma=0.8, lr=0.3)
    with pytest.raises(DPDLError, match="must hold the data's 5 nodes"):
        _step(model, extra, torch.ones(6, dtype=torch.float64), data,
              make_node_generators(5, 1), rate=0.5, b=2.0, args=args)  # fmt: skip
    with pytest.raises(DPDLError, match="one generator per node: 5 for 6"):
        add_gaussian_noise(extra, 0.1, make_node_generators(5, 1))


class _SlowWorker:
    """Stands in for the step's worker thread: starts each job only after a delay, so the
    gradients are done long before the noisy start (or SGP's copy of x) is written."""

    def __init__(self, delay: float = 0.3):
        from concurrent.futures import ThreadPoolExecutor

        self.pool, self.delay = ThreadPoolExecutor(max_workers=1), delay

    def submit(self, fn):
        import time

        return self.pool.submit(lambda: (time.sleep(self.delay), fn())[1])


@pytest.mark.parametrize("private", [True, False])
def test_nothing_is_returned_before_the_workers_part_is_written(private, monkeypatch):
    """End to end, at a model size where the groups of rows take real time: a worker that
    starts late changes no bit of x^{k+1/2} (the chunks wait for it), against the step's
    transforms one after the other."""
    n, counts = 6, [10, 9, 10, 8, 10, 10]
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 10))  # d = 101,770: several row groups
    rng = np.random.default_rng(3)
    x = rng.normal(size=(n, 10, 784)).astype(np.float32)
    y = rng.integers(0, 10, size=(n, 10))
    data = NodeData.from_arrays(x, y, np.arange(10)[None, :] < np.asarray(counts)[:, None])
    params = stack_params(model, n, torch.device("cpu"))
    weights = torch.ones(n, dtype=torch.float64)
    args = StepArguments(private=private, clip=0.5, sigma=0.9, lr=0.2)
    results = []
    for worker in (_SlowWorker(), _RunNow()):
        monkeypatch.setattr(dyn, "_noise_worker", lambda w=worker: w)
        work = {k: torch.full_like(v, 7.0) for k, v in params.items()}  # stale contents
        results.append(_step(model, params, weights, data, make_node_generators(n, 9),
                             rate=0.3, b=3.0, args=args, work=work))  # fmt: skip
    ref = make_node_generators(n, 9)
    batch = dyn.poisson_sample(data.inputs, data.targets, data.mask, 0.3, ref)
    if private:
        sums = dyn.clipped_record_sums(model, params, batch, 0.5)
        want = dyn.local_sgd_step(params, dyn.add_gaussian_noise(sums, 0.9, ref), 0.2, 3.0)
    else:
        want = dyn.local_sgd_step(params, mean_batch_grads(model, params, batch), 0.2)
    for name in params:
        assert torch.equal(results[0].params[name], results[1].params[name])
        torch.testing.assert_close(results[0].params[name], want[name], rtol=1e-5, atol=1e-6)
    with pytest.raises(DPDLError, match="must not share memory"):
        _step(model, params, weights, data, make_node_generators(n, 9), rate=0.3, b=3.0,
              args=args, work=params)  # fmt: skip
