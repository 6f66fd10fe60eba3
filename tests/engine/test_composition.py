"""The step as a composition (issue 40): the fused paths are taken exactly when the update
transforms are the plain step size, and agree with the stages one after the other; a step
is given one frozen StepArguments (or its fields as keywords); the engine keeps and
checkpoints any transforms' state generically, and reads checkpoints of the older layout."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest
import torch

import dpdl.algorithms.dyn_d2p as dyn
from dpdl.algorithms.step import LocalStep, NodeRecords, StepArguments
from dpdl.algorithms.transforms import PLAIN, StepSize, WeightDecay, chain, sgd
from dpdl.engine import NodeData, Simulator, stack_params
from dpdl.errors import DPDLError


def _inputs(h, n=5, counts=(6, 8, 7, 6, 9)):
    x, y, mask = h.tiny_data(n, list(counts), seed=2)
    model = h.tiny_model(seed=2)
    return model, NodeData.from_arrays(x, y, mask), stack_params(model, n, torch.device("cpu"))


def _spy(monkeypatch, name):
    calls = []
    real = getattr(dyn, name)

    def spy(*args, **kwargs):
        calls.append(name)
        return real(*args, **kwargs)

    monkeypatch.setattr(dyn, name, spy)
    return calls


@pytest.mark.parametrize("private", [True, False])
def test_the_plain_chain_is_fused_and_equals_the_stages(h, private, monkeypatch):
    """PLAIN takes the fused path (one pass: gradients, noise and step together); a chain
    that is not plain (a decay of 0: the same arithmetic, u + 0 z = u) takes the stages, and
    lands on the same models to rounding, with the same draws."""
    model, data, params = _inputs(h)
    weights = torch.linspace(0.8, 1.2, 5, dtype=torch.float64)
    fused_calls = _spy(monkeypatch, "_noisy_local_step" if private else "_sgp_local_step")
    staged_calls = _spy(monkeypatch, "_node_updates")
    args = StepArguments(private=private, clip=0.4, sigma=0.8, lr=0.3)
    out, states = {}, {}
    for name, transforms in (("plain", PLAIN), ("staged", chain(WeightDecay(0.0), StepSize()))):
        gens = dyn.make_node_generators(5, 23)
        records = NodeRecords(data.inputs, data.targets, data.mask, gens, 0.4)
        spec = LocalStep(model, expected_batch_size=2.0, transforms=transforms)
        out[name] = dyn.local_update(spec, params, weights, records, args, step=0)
        states[name] = torch.stack([g.get_state() for g in gens])
    assert fused_calls == [fused_calls[0]] and staged_calls == ["_node_updates"]
    assert torch.equal(states["plain"], states["staged"])
    assert torch.equal(out["plain"].batch_sizes, out["staged"].batch_sizes)
    for name in params:
        torch.testing.assert_close(out["plain"].params[name], out["staged"].params[name],
                                   rtol=1e-6, atol=1e-7)  # fmt: skip
        assert not torch.equal(out["plain"].params[name], params[name])


def test_a_step_takes_step_arguments_or_the_same_keywords(h):
    from dpdl.accounting.schedules import make_schedule
    from dpdl.training.plan import RunPlan
    from dpdl.training.settings import TrainingSection

    _, data, _ = _inputs(h)
    sims = [Simulator(h.tiny_model(seed=2), data, h.ExpGraph(5), lr=0.3, seed=4,
                      transforms=sgd(momentum=0.5)) for _ in range(2)]  # fmt: skip
    given = StepArguments(private=True, clip=0.4, sigma=0.8, lr=0.2, mix=False)
    sims[0].step(given)
    sims[1].step(private=True, clip=0.4, sigma=0.8, lr=0.2, mix=False)
    for name in sims[0].params:
        assert torch.equal(sims[0].params[name], sims[1].params[name])
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.sigma = 0.0
    with pytest.raises(DPDLError, match="one StepArguments or its fields"):
        sims[0].step(given, mix=True)
    with pytest.raises(DPDLError, match="one StepArguments or its fields"):
        sims[0].step({"private": True})
    with pytest.raises(DPDLError, match="bad step arguments"):
        sims[0].step(private=True, noise=0.8)
    schedule = make_schedule("const-d2p", epsilon=2.0, delta=1e-4, steps=4,
                             sample_rate=sims[0].sample_rate, calibrate="clt")  # fmt: skip
    plan = RunPlan.of(schedule, TrainingSection(steps=4, lr=0.3, local_steps=2))
    first = plan.step_arguments(0)
    assert isinstance(first, StepArguments)
    assert (first.private, first.clip, first.sigma, first.mix, first.mixing_round) == (
        True, float(schedule.clip[0]), float(schedule.sigma[0]), False, 0)  # fmt: skip
    assert not plan.step_arguments(3).unsafe_zero_noise


@dataclass(frozen=True)
class _Average:
    """A stateful transform of a shape the engine has never seen: a step counter per node and
    a running mean of the updates (nested), then the update unchanged."""

    name: str = "average"

    def init(self, params):
        first = next(iter(params.values()))
        return {"count": torch.zeros(first.shape[0], dtype=torch.float64),
                "mean": {k: torch.zeros_like(v) for k, v in params.items()}}  # fmt: skip

    def update(self, update, state, params, *, step, lr):
        count = state["count"] + 1
        mean = {k: m + (update[k] - m) / float(count[0]) for k, m in state["mean"].items()}
        return update, {"count": count, "mean": mean}


def _with_average(h, data):
    sim = Simulator(h.tiny_model(seed=2), data, h.RandomColumnStochastic(5, seed=1), lr=0.3,
                    seed=4)  # fmt: skip
    sim.use_transforms(chain(_Average(), WeightDecay(0.01), StepSize()))
    return sim


def test_any_transforms_state_is_kept_and_checkpointed_generically(h):
    _, data, _ = _inputs(h)
    args = [StepArguments(private=True, clip=0.4, sigma=0.8, mix=k % 2 == 1) for k in range(5)]
    full = _with_average(h, data)
    for a in args:
        full.step(a)
    cut = _with_average(h, data)
    for a in args[:2]:
        cut.step(a)
    state = cut.state_dict()
    assert set(state["transforms"]) == {"average"}  # only the transforms that keep state
    assert bool((state["transforms"]["average"]["count"] == 2).all())
    resumed = _with_average(h, data)
    resumed.load_state_dict(state)
    for a in args[2:]:
        resumed.step(a)
    for name in full.params:
        assert torch.equal(resumed.params[name], full.params[name])
        assert torch.equal(resumed.transform_state["average"]["mean"][name],
                           full.transform_state["average"]["mean"][name])  # fmt: skip
    plain = Simulator(h.tiny_model(seed=2), data, h.ExpGraph(5), lr=0.3, seed=4)
    with pytest.raises(DPDLError, match="'average', which this run does not keep"):
        plain.load_state_dict(state)


def test_a_checkpoint_of_the_older_layout_resumes_its_momentum(h):
    """Before the transforms were generic, a checkpoint held the heavy ball's buffers as its
    top-level "momentum" entry: such a checkpoint still resumes, bit for bit."""
    _, data, _ = _inputs(h)

    def fresh():
        return Simulator(h.tiny_model(seed=2), data, h.RandomColumnStochastic(5, seed=1),
                         lr=0.3, seed=4,
                         transforms=sgd(momentum=0.9, weight_decay=0.01))  # fmt: skip

    args = StepArguments(private=True, clip=0.4, sigma=0.8)
    full, cut = fresh(), fresh()
    for _ in range(4):
        full.step(args)
    for _ in range(2):
        cut.step(args)
    state = cut.state_dict()
    older = {k: v for k, v in state.items() if k != "transforms"}
    older["momentum"] = state["transforms"]["momentum"]
    resumed = fresh()
    resumed.load_state_dict(older)
    for _ in range(2):
        resumed.step(args)
    for name in full.params:
        assert torch.equal(resumed.params[name], full.params[name])
        assert torch.equal(resumed.momentum_buffer[name], full.momentum_buffer[name])


def test_the_engine_builds_the_sgd_chain_from_its_settings(h):
    _, data, _ = _inputs(h)
    sim = Simulator(h.tiny_model(seed=2), data, h.ExpGraph(5), lr=0.3,
                    transforms=sgd(momentum=0.5, weight_decay=0.1))  # fmt: skip
    assert sim.transforms == sgd(momentum=0.5, weight_decay=0.1)
    assert Simulator(h.tiny_model(seed=2), data, h.ExpGraph(5), lr=0.3).transforms == PLAIN
    assert Simulator(h.tiny_model(seed=2), data, h.ExpGraph(5), lr=0.3).momentum_buffer is None
