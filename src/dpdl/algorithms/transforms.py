"""Update transforms: what a node does with its update u_i^k before it moves its model
(MATH.md §4, "Momentum, weight decay, local steps"), as pure ``init``/``update`` pairs
composed by :func:`chain` (optax's ``GradientTransformation`` and ``chain``).

Every tensor carries the leading node dimension of the models (:mod:`dpdl.algorithms.
dyn_d2p`): a transform acts on all the hosted nodes at once, and its state holds one row per
node.  A transform's state is the node's own (never sent, never mixed: only x^{k+1/2} and
w are), a dict of tensors; :class:`Chain` keeps one per transform under the transform's
``name``, and the engine stores and checkpoints that dict as it is, whatever the transforms
(:func:`state_to_save`, :func:`state_to_load`).

A chain maps the node's update u (the noisy clipped sum / b, or SGP's mean gradient) to the
*displacement* Δ with x^{k+1/2} = x^k + Δ, so it ends with a step size (:class:`StepSize`:
Δ = -γ_k u).  The built-in chain (:func:`sgd`) is PyTorch's ``SGD(momentum=β,
weight_decay=λ)`` at the de-biased model z: u + λ z (:class:`WeightDecay`), m <- β m + u
(:class:`HeavyBall`), -γ_k m (:class:`StepSize`).  :func:`apply_chain` takes the final step
size in the same rounding as the move, x - γ_k m (one ``torch.add``), and
:meth:`Chain.plain_step_size` tells the step when the chain is a step size alone, so that it
can take its fused private path (:func:`dpdl.algorithms.dyn_d2p.local_update`).

Privacy is unchanged: every transform is a function of the node's released messages and
public values (post-processing, MATH.md §4).

Ownership (in place of optax's functional copies, which cost an n x d block a step): a
transform's ``update`` may overwrite the ``update`` tensors and the ``state`` tensors it is
given (the caller hands them over and reads only what is returned); the update it returns
may be its new state's tensors (:class:`HeavyBall` returns m itself), so :class:`Chain`
hands a later transform a copy of such an update, never the state itself.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from dpdl.errors import DPDLError, require

Params = dict[str, torch.Tensor]
#: One transform's state: named tensors (or dicts of them), a row per hosted node.
State = dict[str, Any]

__all__ = [
    "State",
    "UpdateTransform",
    "map_tensors",
    "tree_structure",
    "WeightDecay",
    "HeavyBall",
    "StepSize",
    "Chain",
    "chain",
    "sgd",
    "PLAIN",
    "apply_weight_decay",
    "heavy_ball",
    "apply_chain",
    "keeps_state",
    "state_to_save",
    "state_to_load",
    "LEGACY_STATE_KEYS",
]


@runtime_checkable
class UpdateTransform(Protocol):
    """A pure ``init``/``update`` pair (optax's ``GradientTransformation``) over the hosted
    nodes' stacked tensors.

    ``name`` is the key of its state in a :class:`Chain` (and in a checkpoint).  ``init``
    gives the state before the first step (the models x^0 given for shapes).  ``update``
    gets the nodes' update, the state, the de-biased models z^k the gradients were taken at,
    the step's index k and its step size γ_k (the run's schedule, ``StepArguments.lr``), and
    returns (the transformed update, the new state); see the module's ownership rules."""

    name: str

    def init(self, params: Params) -> State: ...

    def update(self, update: Params, state: State, params: Params, *, step: int,
               lr: float) -> tuple[Params, State]: ...  # fmt: skip


def apply_weight_decay(update: Params, at: Params, weight_decay: float) -> Params:
    """u_i + lambda z_i for every node, in place on ``update`` (a temporary the caller owns).

    ``at`` is the de-biased model z_i the gradients were taken at: a function of the node's
    past released messages only, so the decay adds nothing to what the data reveal (it is the
    gradient of (lambda/2) ||z_i||^2, PyTorch SGD's ``weight_decay`` at the node's model).
    """
    require(math.isfinite(weight_decay) and weight_decay >= 0,
            f"weight_decay must be >= 0, got {weight_decay}")  # fmt: skip
    return {name: u.add_(at[name], alpha=weight_decay) for name, u in update.items()}


def heavy_ball(buffer: Params, update: Params, momentum: float) -> Params:
    """m_i <- beta m_i + u_i for every node, in place on ``buffer`` (the node's own state,
    kept across steps and never sent); returns it.  Starting from m = 0 this is PyTorch SGD's
    momentum (no dampening, not Nesterov)."""
    require(0 <= momentum < 1, f"momentum must lie in [0, 1), got {momentum}")
    return {name: m.mul_(momentum).add_(update[name]) for name, m in buffer.items()}


@dataclass(frozen=True)
class WeightDecay:
    """u <- u + λ z (:func:`apply_weight_decay`); no state."""

    weight_decay: float
    name: str = "weight_decay"

    def __post_init__(self):
        require(math.isfinite(self.weight_decay) and self.weight_decay >= 0,
                f"weight_decay must be >= 0, got {self.weight_decay}")  # fmt: skip

    def init(self, params: Params) -> State:
        return {}

    def update(self, update, state, params, *, step, lr):
        return apply_weight_decay(update, params, self.weight_decay), state


@dataclass(frozen=True)
class HeavyBall:
    """m <- β m + u, the update becomes m (:func:`heavy_ball`); state ``{param name: m}``,
    m^0 = 0, in x-space like the update it accumulates."""

    momentum: float
    name: str = "momentum"  # the checkpoints' key (LEGACY_STATE_KEYS reads the older one)

    def __post_init__(self):
        require(0 <= self.momentum < 1, f"momentum must lie in [0, 1), got {self.momentum}")

    def init(self, params: Params) -> State:
        return {name: torch.zeros_like(p) for name, p in params.items()}

    def update(self, update, state, params, *, step, lr):
        buffer = heavy_ball(state, update, self.momentum)
        return buffer, buffer


@dataclass(frozen=True)
class StepSize:
    """Δ = -γ_k u: γ_k is ``schedule(k)``, or, without a schedule, the step's own γ_k (the
    run plan's ``step_sizes``, handed to the step as ``StepArguments.lr``); no state."""

    schedule: Callable[[int], float] | None = None
    name: str = "step_size"

    def rate(self, step: int, lr: float) -> float:
        gamma = float(lr if self.schedule is None else self.schedule(step))
        require(math.isfinite(gamma), f"step size γ_{step} must be finite, got {gamma}")
        return gamma

    def init(self, params: Params) -> State:
        return {}

    def update(self, update, state, params, *, step, lr):
        gamma = self.rate(step, lr)
        return {name: u.mul_(-gamma) for name, u in update.items()}, state


@dataclass(frozen=True)
class Chain:
    """Transforms applied one after the other (optax's ``chain``); itself an
    :class:`UpdateTransform` whose state is ``{transform name: its state}``."""

    transforms: tuple[UpdateTransform, ...]
    name: str = "chain"

    def __post_init__(self):
        names = [t.name for t in self.transforms]
        require(len(set(names)) == len(names),
                f"the transforms of a chain need distinct names, got {names}")  # fmt: skip

    def init(self, params: Params) -> State:
        return {t.name: t.init(params) for t in self.transforms}

    def update(self, update, state, params, *, step, lr):
        return self._run(self.transforms, update, state, params, step=step, lr=lr)

    def _run(self, transforms, update, state, params, *, step, lr):
        new_state = dict(state)
        for i, t in enumerate(transforms):
            update, new_state[t.name] = t.update(update, state[t.name], params, step=step, lr=lr)
            if i + 1 < len(transforms) and _shares_memory(update, new_state[t.name]):
                update = {name: u.clone() for name, u in update.items()}  # never the state
        return update, new_state

    def plain_step_size(self, step: int, lr: float) -> float | None:
        """γ_k when the chain is a step size alone (the plain step: x - γ_k u, which the step
        fuses with its gradients and noise), else None."""
        if len(self.transforms) == 1 and isinstance(self.transforms[0], StepSize):
            return self.transforms[0].rate(step, lr)
        return None


def chain(*transforms: UpdateTransform) -> Chain:
    """The transforms one after the other (each an :class:`UpdateTransform`)."""
    for t in transforms:
        if not isinstance(t, UpdateTransform):
            raise DPDLError(f"not an update transform (name, init, update): {t!r}")
    return Chain(tuple(transforms))


def sgd(momentum: float = 0.0, weight_decay: float = 0.0) -> Chain:
    """PyTorch's ``SGD(momentum=β, weight_decay=λ)`` at z (MATH.md §4): the decay and the
    heavy ball only where they are on, then the step size γ_k; ``sgd()`` is :data:`PLAIN`."""
    decay = [WeightDecay(float(weight_decay))] if weight_decay else []
    ball = [HeavyBall(float(momentum))] if momentum else []
    return chain(*decay, *ball, StepSize())


#: The plain step of Algorithm 1: x^{k+1/2} = x^k - γ_k u.
PLAIN = sgd()


def apply_chain(transforms: Chain, params: Params, update: Params, state: State, at: Params,
                *, step: int, lr: float,
                out: Params | None = None) -> tuple[Params, State]:  # fmt: skip
    """(x^{k+1/2}, the chain's new state): the chain's displacement added to ``params`` x^k,
    into ``out`` (may be ``update`` itself) or fresh tensors; ``at`` the de-biased models z^k
    the transforms see.

    A final :class:`StepSize` is taken in the move itself, x - γ_k u' in one rounding
    (``torch.add``'s ``alpha``, as the step without transforms), u' the update the transforms
    before it leave; otherwise x + Δ."""
    body, last = transforms.transforms, None
    if body and isinstance(body[-1], StepSize):
        body, last = body[:-1], body[-1]
    moved, new_state = transforms._run(body, update, state, at, step=step, lr=lr)
    alpha = 1.0 if last is None else -last.rate(step, lr)
    if out is None:
        half = {name: torch.add(x, moved[name], alpha=alpha) for name, x in params.items()}
    else:
        half = {name: torch.add(x, moved[name], alpha=alpha, out=out[name])
                for name, x in params.items()}  # fmt: skip
    return half, new_state


def keeps_state(state: State) -> bool:
    """Whether a (chain's) state holds any tensor: a step that forgets it would differ."""
    return bool(_tensors(state))


def _shares_memory(update: Params, state: State) -> bool:
    held = {t.untyped_storage().data_ptr() for t in _tensors(state)}
    return any(u.untyped_storage().data_ptr() in held for u in update.values())


def _tensors(tree) -> list[torch.Tensor]:
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, Mapping):
        return [t for value in tree.values() for t in _tensors(value)]
    return []


def map_tensors(fn, tree):
    """``fn`` applied to every tensor of a state (nested mappings of tensors)."""
    if isinstance(tree, torch.Tensor):
        return fn(tree)
    if isinstance(tree, Mapping):
        return {key: map_tensors(fn, value) for key, value in tree.items()}
    return tree


def tree_structure(tree):
    """The structure of a state: its keys and every tensor's shape and dtype."""
    if isinstance(tree, torch.Tensor):
        return tuple(tree.shape), tree.dtype
    if isinstance(tree, Mapping):
        return {key: tree_structure(value) for key, value in tree.items()}
    return tree


#: Checkpoint keys that held a transform's state before the transforms were generic: the
#: heavy ball's buffers were the top-level "momentum" entry (``{param name: m}``).
LEGACY_STATE_KEYS = {"momentum": "momentum"}


def state_to_save(state: State) -> State:
    """The transforms' state for a checkpoint: a CPU copy of every transform's non-empty
    state (they change in place every step); {} when none keeps any."""
    return {name: map_tensors(lambda t: t.detach().to("cpu", copy=True), s)
            for name, s in state.items() if _tensors(s)}  # fmt: skip


def state_to_load(current: State, saved: State | None, device) -> State:
    """A checkpoint's transform state (:func:`state_to_save`) in place of ``current`` (the
    run's chain's), copied to ``device``; refused (one line naming the transform) unless every
    transform that keeps state has it, of the same structure and shapes, and nothing else."""
    saved = saved or {}
    stateful = {name for name, s in current.items() if _tensors(s)}
    for name in sorted(set(saved) - stateful):
        raise DPDLError(f"checkpoint holds the state of the update transform {name!r}, which "
                        "this run does not keep (another optimiser setting)")  # fmt: skip
    for name in sorted(stateful):
        require(name in saved, f"checkpoint holds no state of the update transform {name!r} "
                "that this run keeps (another optimiser setting)")  # fmt: skip
        require(tree_structure(saved[name]) == tree_structure(current[name]),
                f"checkpoint's state of the update transform {name!r} does not match the "
                "model")  # fmt: skip
    return {name: map_tensors(lambda t: t.to(device, copy=True), saved[name]) if name in stateful
            else s for name, s in current.items()}  # fmt: skip
