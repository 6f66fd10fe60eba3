"""Update transforms (issue 40): pure init/update pairs composed by chain, the SGD chain of
MATH.md §4 against its formula, their state saved and restored whatever the transforms."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from dpdl.algorithms.transforms import (
    PLAIN,
    HeavyBall,
    StepSize,
    WeightDecay,
    apply_chain,
    chain,
    keeps_state,
    sgd,
    state_to_load,
    state_to_save,
)
from dpdl.errors import DPDLError

SRC = Path(__file__).resolve().parents[2] / "src" / "dpdl"


def _tensors(seed: int):
    g = torch.Generator().manual_seed(seed)
    return {"w": torch.randn(3, 4, 2, generator=g, dtype=torch.float64),
            "b": torch.randn(3, 2, generator=g, dtype=torch.float64)}  # fmt: skip


def test_the_sgd_chain_is_decay_then_heavy_ball_then_the_step_size():
    """Two steps of sgd(β, λ) from m = 0: m <- β m + u + λ z, x <- x - γ_k m (MATH.md §4),
    against the formula written out, and the chain's own update (x + Δ) to rounding."""
    beta, lam, gammas = 0.9, 0.05, (0.3, 0.2)
    transforms = sgd(momentum=beta, weight_decay=lam)
    assert [t.name for t in transforms.transforms] == ["weight_decay", "momentum", "step_size"]
    x = _tensors(0)
    state = transforms.init(x)
    m = {k: torch.zeros_like(v) for k, v in x.items()}
    for k, gamma in enumerate(gammas):
        u, z = _tensors(10 + k), {name: v / 1.5 for name, v in x.items()}
        want_m = {name: beta * m[name] + u[name] + lam * z[name] for name in x}
        want_x = {name: x[name] - gamma * want_m[name] for name in x}
        generic, _ = transforms.update({n: v.clone() for n, v in u.items()},
                                       transforms.init(x) | {"momentum": {n: v.clone() for n, v
                                                                          in m.items()}},
                                       z, step=k, lr=gamma)  # fmt: skip
        x, state = apply_chain(transforms, x, {n: v.clone() for n, v in u.items()}, state, z,
                               step=k, lr=gamma)  # fmt: skip
        m = want_m
        for name in x:
            torch.testing.assert_close(state["momentum"][name], want_m[name], rtol=0, atol=1e-15)
            torch.testing.assert_close(x[name], want_x[name], rtol=0, atol=1e-15)
            torch.testing.assert_close(x[name] - generic[name], want_x[name] - generic[name])


@dataclass(frozen=True)
class _Double:
    """A stateless transform that writes into the update it is given (allowed: it owns it)."""

    name: str = "double"

    def init(self, params):
        return {}

    def update(self, update, state, params, *, step, lr):
        return {name: u.mul_(2.0) for name, u in update.items()}, state


def test_a_transform_after_the_heavy_ball_never_writes_into_its_state():
    u = _tensors(1)
    transforms = chain(HeavyBall(0.5), _Double(), StepSize())
    state = transforms.init(u)
    x, state = apply_chain(transforms, _tensors(2), {n: v.clone() for n, v in u.items()}, state,
                           _tensors(3), step=0, lr=0.1)  # fmt: skip
    for name in u:
        assert torch.equal(state["momentum"][name], u[name])  # m = 0.5 * 0 + u, not 2u
        torch.testing.assert_close(x[name], _tensors(2)[name] - 0.1 * 2.0 * u[name])


def test_only_a_step_size_alone_is_the_plain_step():
    assert PLAIN.plain_step_size(3, 0.1) == 0.1
    assert chain(StepSize(lambda k: 0.5**k)).plain_step_size(3, 0.1) == 0.125
    assert sgd(momentum=0.5).plain_step_size(0, 0.1) is None
    assert sgd(weight_decay=0.1).plain_step_size(0, 0.1) is None
    assert sgd() == PLAIN and not keeps_state(PLAIN.init(_tensors(0)))
    assert keeps_state(sgd(momentum=0.5).init(_tensors(0)))


def test_bad_transforms_are_one_line_errors():
    with pytest.raises(DPDLError, match="distinct names"):
        chain(StepSize(), StepSize())
    with pytest.raises(DPDLError, match="not an update transform"):
        chain(lambda u: u)
    with pytest.raises(DPDLError, match="momentum must lie in"):
        HeavyBall(1.0)
    with pytest.raises(DPDLError, match="weight_decay must be >= 0"):
        WeightDecay(-0.1)
    with pytest.raises(DPDLError, match="step size"):
        StepSize(lambda k: float("nan")).rate(0, 0.1)


def test_the_state_is_saved_as_copies_and_restored_only_onto_the_same_transforms():
    params = _tensors(0)
    state = sgd(momentum=0.5, weight_decay=0.1).init(params)
    state["momentum"]["w"].fill_(3.0)
    saved = state_to_save(state)
    assert set(saved) == {"momentum"}  # only the transforms that keep state
    state["momentum"]["w"].fill_(4.0)
    assert bool((saved["momentum"]["w"] == 3.0).all())  # a copy
    loaded = state_to_load(state, saved, "cpu")
    assert bool((loaded["momentum"]["w"] == 3.0).all())
    assert loaded["momentum"]["w"].data_ptr() != saved["momentum"]["w"].data_ptr()
    assert state_to_save(PLAIN.init(params)) == {}
    with pytest.raises(DPDLError, match="no state of the update transform 'momentum'"):
        state_to_load(state, {}, "cpu")
    with pytest.raises(DPDLError, match="'momentum', which this run does not keep"):
        state_to_load(PLAIN.init(params), saved, "cpu")
    other = sgd(momentum=0.5).init({"w": torch.zeros(3, 4, 3), "b": params["b"]})
    with pytest.raises(DPDLError, match="does not match the model"):
        state_to_load(other, saved, "cpu")


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args]
    count = len(names) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    return count - (1 if names and names[0] in ("self", "cls") else 0)


def test_no_function_of_the_algorithms_takes_more_than_twelve_parameters():
    """Issue 40: a step's many inputs travel in small dataclasses (LocalStep, NodeRecords,
    StepArguments, StepBuffers), not in one long signature (*args, **kwargs count one each)."""
    over = [f"{path.relative_to(SRC)}:{node.lineno} {node.name} ({_parameters(node)})"
            for path in sorted((SRC / "algorithms").rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and _parameters(node) > 12]  # fmt: skip
    assert over == []
