"""The ways the engine runs a model, for :func:`dpdl.models.validation.refuse_stateful` to run
a throw-away copy of it the same ways, and the process-wide random generators a forward could
draw from.

A probe that runs the model only as a plain batched forward misses state that a forward
changes only the engine's ways: each record a batch of one under ``vmap``, parameters swapped
in by ``functional_call`` (plain tensors, not ``nn.Parameter``), the per-chunk vmap over units
of :mod:`dpdl.algorithms.per_sample`, the evaluation's vmap over the nodes' models.  Each way
here runs those transforms as the engine does (it cannot import the engine: the layers below
it must not know it), on synthetic records, with the loss where the engine applies one.

Random generators: torch's global one (dropout masks, ``torch.rand`` in a forward; CPU, and
the CUDA device's where the model runs on one, or CUDA is in use already), numpy's legacy
global one and Python's ``random``.  Every hosted node's forwards draw from the one generator
of their process, so how far it moves follows their secret batch sizes; a draw is refused.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Callable, Iterator

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

__all__ = ["ENGINE_WAYS", "drawing_module", "generator_states", "kept_generators",
           "moved_generators"]  # fmt: skip

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None


def _cuda_devices(device: torch.device) -> list[int]:
    """The CUDA devices whose generator a forward on ``device`` could draw from, never
    initialising CUDA for a CPU model (a context per device costs memory and seconds)."""
    if device.type == "cuda":
        return [torch.cuda.current_device() if device.index is None else device.index]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return [torch.cuda.current_device()]
    return []


def generator_states(device: torch.device) -> dict[str, object]:
    """{generator: a comparable copy of its state} of every generator a forward may draw from."""
    legacy = np.random.get_state()  # noqa: NPY002 (the legacy global one is what is read)
    states: dict[str, object] = {
        "torch's global random generator": bytes(torch.random.get_rng_state().tolist()),
        "numpy's global random generator": (legacy[1].tobytes(), *legacy[2:]),
        "Python's random module": random.getstate(),
    }
    for index in _cuda_devices(device):
        state = torch.cuda.get_rng_state(index)
        states[f"torch's CUDA random generator (cuda:{index})"] = bytes(state.tolist())
    return states


def moved_generators(before: dict[str, object], after: dict[str, object]) -> list[str]:
    return [name for name, state in before.items() if after.get(name) != state]


@contextlib.contextmanager
def kept_generators(device: torch.device) -> Iterator[None]:
    """Every generator of :func:`generator_states` back where it was at the end: a probe draws
    nothing that the caller's code would otherwise have drawn."""
    legacy, python = np.random.get_state(), random.getstate()  # noqa: NPY002 (the global one)
    with torch.random.fork_rng(devices=_cuda_devices(device), device_type="cuda"):
        try:
            yield
        finally:
            np.random.set_state(legacy)  # noqa: NPY002 (the global one, put back)
            random.setstate(python)


# ------------------------------------------------------------------ the engine's ways
def _total(out: torch.Tensor, y: torch.Tensor | None, loss: Loss) -> torch.Tensor:
    return out.sum() if loss is None or y is None else loss(out, y).sum()


def _backward(total: torch.Tensor, params: list[torch.Tensor]) -> None:
    """Gradients as a training step takes them (``autograd.grad``: nothing accumulates in
    ``.grad``), so that backward hooks run too."""
    wanted = [p for p in params if p.requires_grad]
    if total.requires_grad and wanted:
        torch.autograd.grad(total, wanted, allow_unused=True)


def _plain_tensors(model: nn.Module, copies: int | None = None) -> dict[str, torch.Tensor]:
    """The parameters as the engine passes them: plain tensors (one row per node or record
    when ``copies``), leaves that require gradients."""
    out = {}
    for name, p in model.named_parameters():
        t = p.detach() if copies is None else p.detach().unsqueeze(0).expand(copies, *p.shape)
        out[name] = t.clone().requires_grad_(p.requires_grad)
    return out


def _plain_forward(model, x, y, loss) -> None:
    _backward(_total(model(x), y, loss), list(model.parameters()))


def _functional_forward(model, x, y, loss) -> None:
    params = _plain_tensors(model)
    out = functional_call(model, (params, dict(model.named_buffers())), (x,))
    _backward(_total(out, y, loss), list(params.values()))


def _per_record_grads(model, x, y, loss) -> None:
    """:func:`dpdl.algorithms.dyn_d2p.per_record_grads`: ``grad`` of a one-record
    ``functional_call``, ``vmap``-ed over the records, each with its own parameter rows."""
    buffers = dict(model.named_buffers())

    def record_loss(p, xr, yr):
        out = functional_call(model, (p, buffers), (xr.unsqueeze(0),))
        return _total(out, None if yr is None else yr.unsqueeze(0), loss)

    params = {k: v.detach() for k, v in _plain_tensors(model, len(x)).items()}
    vmap(grad(record_loss), in_dims=(0, 0, None if y is None else 0),
         randomness="different")(params, x, y)  # fmt: skip


def _unit_records(model, x, y, loss) -> None:
    """:mod:`dpdl.algorithms.per_sample`'s chunk: a vmap over units (a node's parameters
    each) of a vmap over the unit's records, each a batch of one, then one backward."""
    buffers = dict(model.named_buffers())

    def record_loss(p, xr, yr):
        out = functional_call(model, (p, buffers), (xr.unsqueeze(0),))
        return _total(out, None if yr is None else yr.unsqueeze(0), loss)

    ydim = None if y is None else 0
    unit = vmap(record_loss, in_dims=(None, 0, ydim), randomness="different")
    params = _plain_tensors(model, 1)
    losses = vmap(unit, in_dims=(0, 0, ydim), randomness="different")(
        params, x.unsqueeze(0), None if y is None else y.unsqueeze(0))
    _backward(losses.sum(), list(params.values()))


@torch.no_grad()
def _node_evaluation(model, x, y, loss) -> None:
    """The evaluation's forward: a vmap over two nodes' models of one batch of records."""
    buffers = dict(model.named_buffers())

    def forward(p, xs):
        return functional_call(model, (p, buffers), (xs,))

    out = vmap(forward, in_dims=(0, None), randomness="different")(_plain_tensors(model, 2), x)
    _total(out[0], y, loss)


# (how the error names it, the way, whether evaluations run the model so): every way the
# engine runs a model's forward (an evaluation's are batched forwards, in eval mode)
ENGINE_WAYS: list[tuple[str, Callable, bool]] = [
    ("a forward", _plain_forward, True),
    ("a forward under torch.func.functional_call", _functional_forward, True),
    ("per-record gradients (vmap over records, each a batch of one)", _per_record_grads, False),
    ("a chunk of per-record sums (vmap over units of a vmap over records)", _unit_records,
     False),
    ("an evaluation (vmap over the nodes' models)", _node_evaluation, True),
]  # fmt: skip


def drawing_module(model: nn.Module, way: Callable, x, y, loss: Loss,
                   device: torch.device) -> str | None:  # fmt: skip
    """Run ``way`` on ``model`` (a throw-away copy) with a hook at the entry and exit of every
    submodule's forward, and return the name of the first module whose own code (not a child's)
    drew from a generator: ``""`` for the root, None for a draw outside the model (the loss's)."""
    names = {id(m): name for name, m in model.named_modules()}
    inside: list[str] = []
    seen = [generator_states(device)]
    found: list[str | None] = []

    def check():
        now = generator_states(device)
        if moved_generators(seen[0], now) and not found:
            found.append(inside[-1] if inside else None)
        seen[0] = now

    def enter(module, args):
        check()
        inside.append(names[id(module)])

    def leave(module, args, out):
        check()
        inside.pop()

    for module in model.modules():
        module.register_forward_pre_hook(enter)
        module.register_forward_hook(leave)
    with contextlib.suppress(Exception):  # the way ran before: only its draws matter here
        way(model, x, y, loss)
    check()
    return found[0] if found else ""  # not drawn again: the model is named
