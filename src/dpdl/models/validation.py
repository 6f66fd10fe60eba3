"""Refuse models whose layers mix the records of a batch (per-record clipping, MATH.md §4),
and models whose state changes across a forward.

Dyn-D2P clips each record's gradient alone, so a record's loss may depend on that record
and the parameters only. Batch normalisation (and instance normalisation with running
statistics) couples the records of a batch and updates buffers outside the gradient step:
such a model is refused, naming the layer and the fix (GroupNorm / LayerNorm), as Opacus's
``ModuleValidator`` does.

A model whose buffers, attributes or class data attributes change across a forward (a
running statistic reassigned in train mode, a counter of calls), or whose loss's do, is
refused too (:func:`refuse_stateful`): that state is a noise-free function of the records the
model saw, which a released model would carry, and the engine's chunking of the hosted nodes'
records would couple their updates through it.  So is one whose forward draws from a
process-wide random generator (dropout's masks come from torch's global one): the number of
draws follows every hosted node's secret batch size, so a node's later masks, and its clipped
sums, would depend on the other nodes' records and its own earlier batches.  The checks run a
throw-away copy, every way the engine runs a model (:mod:`dpdl.models.probes`), on synthetic
records, never the user's module.
"""

from __future__ import annotations

import copy
import types
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from dpdl.errors import DPDLError
from dpdl.models.probes import (
    ENGINE_WAYS,
    drawing_module,
    generator_states,
    kept_generators,
    moved_generators,
)
from dpdl.models.state import (
    class_data,
    describe_value,
    module_state,
    state_changes,
    undescribed,
)

__all__ = ["loss_state", "refuse_state_changes", "refuse_stateful", "refuse_undescribed",
           "synthetic_records", "throwaway_copy", "validate_model"]  # fmt: skip

# The synthetic records of the checks: public, the same in every process and every run.
SYNTHETIC_SEED = 20261203


def _cross_record_reason(module: nn.Module) -> str | None:
    if isinstance(module, _BatchNorm):  # BatchNorm1d/2d/3d, their lazy forms, SyncBatchNorm
        return "normalises over the records of a batch"
    if isinstance(module, _InstanceNorm) and module.track_running_stats:
        return "keeps running statistics updated from every batch"
    return None


def validate_model(model: nn.Module) -> nn.Module:
    """Return ``model`` when private per-record training can use it, else raise DPDLError.

    Checks: a ``torch.nn.Module`` with at least one parameter, none of them frozen (the
    engine trains every parameter), no layer that mixes records (see the module docstring),
    and no embedding with ``max_norm`` (a forward that changes the weight), ``sparse=True``
    or ``scale_grad_by_freq=True`` (gradients scaled by the whole batch's token counts).
    """
    if not isinstance(model, nn.Module):
        raise DPDLError(f"the model must be a torch.nn.Module, got {type(model).__name__}")
    for name, module in model.named_modules():
        reason = _cross_record_reason(module)
        if reason is not None:
            raise DPDLError(
                f"model layer {name or '<root>'!r} ({type(module).__name__}) {reason}, which "
                "per-record gradient clipping cannot allow; replace it with nn.GroupNorm "
                "(or nn.LayerNorm, or InstanceNorm without track_running_stats)"
            )
    frozen = [name for name, p in model.named_parameters() if not p.requires_grad]
    if frozen:
        # The engine trains (and adds noise to) every parameter: a frozen one would move.
        raise DPDLError(
            f"model parameter {frozen[0]!r} is frozen (requires_grad=False) but every parameter "
            "is trained; register fixed tensors as buffers (module.register_buffer) instead"
        )
    if not any(True for _ in model.parameters()):
        raise DPDLError(f"model {type(model).__name__} has no parameters to train")
    for name, module in model.named_modules():
        reason = _embedding_option_reason(module)
        if reason is not None:
            raise DPDLError(f"model layer {name or '<root>'!r} ({type(module).__name__}) "
                            f"{reason}")  # fmt: skip
    return model


def _embedding_option_reason(module: nn.Module) -> str | None:
    """What an embedding's options do that private training cannot allow (padding_idx is
    allowed: its row's gradient is zero, exactly what autograd gives)."""
    if not isinstance(module, nn.Embedding | nn.EmbeddingBag):
        return None
    if module.max_norm is not None:
        return ("has max_norm, which renormalises its weight in place in every forward (state "
                "a forward changes, outside the gradient step): drop max_norm (clip the "
                "gradients, not the rows)")
    if module.sparse:
        return "has sparse=True: the engine sums dense gradients; use sparse=False"
    if module.scale_grad_by_freq:
        return ("has scale_grad_by_freq=True, which scales each gradient by the token counts of "
                "the whole batch (it couples the records' gradients): use the default False")
    return None


def throwaway_copy(model: nn.Module, device: torch.device | str | None = None) -> nn.Module:
    """A deep copy of ``model`` (on ``device``) to probe: what a probe's forward does to it
    never reaches the user's module, the engine's or a released one."""
    try:
        clone = copy.deepcopy(model)
    except Exception as err:  # the user's module: say which and why, in one line
        text = str(err).strip().splitlines()
        raise DPDLError(f"the model {type(model).__name__} cannot be copied (copy.deepcopy): "
                        f"{type(err).__name__}: {text[0] if text else ''}") from None
    return clone if device is None else clone.to(device)


def synthetic_records(record_shape: tuple[int, ...], count: int,
                      device: torch.device | str = "cpu",
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:  # fmt: skip
    """``count`` records of ``record_shape`` and ``dtype`` from a fixed public seed: an input
    of the right shape that is no one's data (distinct records, so a statistic over the batch
    shows).  Real-valued records are uniform on [0, 1) (values a float or a pixel can take);
    integer ones (token ids) are 0 or 1, indices every embedding table of two or more rows
    holds."""
    generator = torch.Generator().manual_seed(SYNTHETIC_SEED)
    if dtype.is_floating_point:
        x = torch.rand((count, *record_shape), generator=generator)
        return x.to(device) if dtype == torch.float32 else x.to(device, dtype)
    return torch.randint(0, 2, (count, *record_shape), generator=generator).to(device, dtype)


def refuse_state_changes(before: dict, model: nn.Module, when: str = "a forward") -> None:
    """Refuse ``model`` when its :func:`~dpdl.models.state.module_state` is no longer
    ``before`` (one line naming what changed ``when``)."""
    _refuse_changes(before, module_state(model), "the model's", when)


def _refuse_changes(before: dict, after: dict, whose: str, when: str) -> None:
    changed = state_changes(before, after)
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4
                                          else "")  # fmt: skip
        raise DPDLError(
            f"{whose} state changes across {when} ({shown}): a buffer or attribute "
            "updated from the records it sees is a noise-free statistic of them (a released "
            "model would carry it, and it couples the nodes one process hosts); keep "
            "statistics and counters out of the model and the loss (make a learned value a "
            "parameter)"
        )


def loss_state(loss) -> dict:
    """{what: description} of a loss callable's state: the callable described whole (a
    function: code, defaults, closure; a partial: its function and arguments; an object: its
    attributes and class data) and, to name what changed, a module's
    :func:`~dpdl.models.state.module_state` or an object's attributes one by one."""
    state = {"loss": describe_value(loss)}
    if isinstance(loss, nn.Module):
        state.update((f"loss {key}", value) for key, value in module_state(loss).items())
    elif not isinstance(loss, types.FunctionType) and hasattr(loss, "__dict__"):
        state.update((f"loss attribute {key}", describe_value(value))
                     for key, value in vars(loss).items())  # fmt: skip
        for cls, key, value in class_data(type(loss)):
            state[f"loss class attribute {key} ({cls.__qualname__})"] = describe_value(value)
    return state


def refuse_undescribed(state: dict, what: str = "model") -> None:
    """Refuse a model (or loss) holding a value that its state description cannot read
    (:func:`~dpdl.models.state.undescribed`): a forward could change it unseen, and two
    models holding different ones would describe alike (a seeded run's keys with them)."""
    for key, description in state.items():
        kinds = undescribed(description)
        if kinds:
            raise DPDLError(
                f"the {what}'s {key} holds a value of type {kinds[0]}, whose state dpdl "
                "cannot read (a forward could change it unseen): keep such objects out of the "
                f"{what} (numbers, tensors, containers and plain objects are checked)"
            )


@dataclass
class _Probe:
    """What every probing run shares: the user's model (copied again to name a culprit),
    the throw-away copy, the loss's copy, synthetic records and targets, the device."""

    model: nn.Module
    copy: nn.Module
    loss: Callable | None
    x: torch.Tensor
    y: torch.Tensor | None
    where: torch.device


def refuse_stateful(model: nn.Module, record_shape: tuple[int, ...],
                    device: torch.device | str | None = None, *, loss: Callable | None = None,
                    target_like: torch.Tensor | None = None,
                    dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
    """Run a throw-away copy of ``model`` (and of the per-record ``loss``, when given) on
    synthetic records every way the engine runs it (:data:`~dpdl.models.probes.ENGINE_WAYS`:
    a plain forward, under ``functional_call``, each record a batch of one under ``vmap``,
    the chunks' and the evaluation's vmaps), with gradients, in the modes the model was given,
    in train and in eval mode; refuse it, in one line, if it holds a value its state
    description cannot read, if any parameter, buffer, attribute or class data attribute of
    any submodule (or of the loss) changed, or if a forward drew from a process-wide random
    generator in the modes the engine runs it (given, and eval for evaluations).
    ``target_like``: one record's target (only its shape and dtype are read) for the loss;
    ``dtype`` the records' (:func:`synthetic_records`: token ids for int64).
    The generators are left as they were, the user's module and loss untouched."""
    where = torch.device(device or "cpu")
    probe_loss = _loss_copy(loss)
    probe = _Probe(model, throwaway_copy(model, device), probe_loss,
                   synthetic_records(record_shape, 3, where, dtype), None, where)  # fmt: skip
    refuse_undescribed(module_state(probe.copy))
    if probe_loss is not None:
        refuse_undescribed(loss_state(probe_loss), "loss")
        if target_like is not None:
            probe.y = torch.zeros((3, *target_like.shape), dtype=target_like.dtype,
                                  device=where)  # fmt: skip
    with kept_generators(where):
        for mode, flags, trains in _modes(probe.copy):
            _set_modes(probe.copy, flags)
            evaluates = mode == "eval mode"
            for way_name, way, in_evaluation in ENGINE_WAYS:
                _probe_way(probe, _Run(way, f"{way_name} in {mode}", flags, trains or evaluates,
                                       trains or (evaluates and in_evaluation)))  # fmt: skip


def _modes(model: nn.Module) -> list[tuple[str, list[bool], bool]]:
    """(name, every module's training flag, whether the engine trains the model so): the
    modes the model was given when they mix (the engine never switches a module's mode to
    train it), train mode and eval mode (in which evaluations run it)."""
    given = [m.training for m in model.modules()]
    count = len(given)
    modes = [("train mode", [True] * count, all(given)),
             ("eval mode", [False] * count, not any(given))]  # fmt: skip
    if any(given) and not all(given):
        modes.insert(0, ("the modes it was given", given, True))
    return modes


def _set_modes(model: nn.Module, flags: list[bool]) -> None:
    for module, flag in zip(model.modules(), flags, strict=True):
        module.training = flag


@dataclass
class _Run:
    """One way in one mode: ``when`` names both; ``flags`` the mode; a draw is refused
    where the engine runs the model in that mode (``draws_refused``), a failure where it
    runs it so (``required``: elsewhere the way need not work, e.g. gradients of an
    eval-mode transformer's fused kernel), and state changes everywhere."""

    way: Callable
    when: str
    flags: list[bool]
    draws_refused: bool
    required: bool


def _probe_way(probe: _Probe, run: _Run) -> None:
    before, loss_before = module_state(probe.copy), _loss_description(probe.loss)
    generators = generator_states(probe.where)
    try:
        with torch.enable_grad():  # as a training step, whatever the caller's context
            run.way(probe.copy, probe.x, probe.y, None if probe.loss is None else
                    _checked_loss(probe.loss))  # fmt: skip
    except _LossFailed as err:
        if run.required:
            cause = err.__cause__
            raise DPDLError(f"loss {_name(probe.loss)} fails on the model's outputs and "
                            f"targets of shape {tuple(probe.y.shape)} ({run.when}): "
                            f"{type(cause).__name__}: {_first_line(cause)}") from None
    except Exception as err:  # the user's code: where it failed, in one line
        if run.required:
            what = ("cannot take records of shape " + str(tuple(probe.x.shape[1:]))
                    if run.when.startswith("a forward in") else f"fails when run as {run.when}")
            hint = ("" if probe.x.is_floating_point() else
                    " (the records are integers, kept as int64 token ids: give real-valued "
                    "inputs as floats)")  # fmt: skip
            raise DPDLError(f"the model {what}{hint}: {type(err).__name__}: "
                            f"{_first_line(err)}") from None  # fmt: skip
    moved = moved_generators(generators, generator_states(probe.where))
    if moved and run.draws_refused:
        _refuse_draws(probe, run, moved[0])
    refuse_state_changes(before, probe.copy, run.when)  # even after a failure: what it did
    _refuse_changes(loss_before, _loss_description(probe.loss), "the loss's", run.when)


def _refuse_draws(probe: _Probe, run: _Run, drawn: str) -> None:
    """Refuse a model (or loss) whose forward drew from ``drawn``, naming the module whose own
    code drew (found by running the way again on another copy, hooks on every module)."""
    again = throwaway_copy(probe.model, probe.where)
    _set_modes(again, run.flags)
    name = drawing_module(again, run.way, probe.x, probe.y, probe.loss, probe.where)
    if name is None:
        who, fix = f"the loss {_name(probe.loss)}", "remove the random draws from the loss"
    elif name == "":
        who = f"the model ({type(probe.model).__name__})"
        fix = ("remove the random draws from its forward (dropout and other random layers), "
               "or give the model in eval mode")
    else:
        who = f"model layer {name!r} ({type(again.get_submodule(name)).__name__})"
        fix = ("remove dropout and other random layers (RReLU, noise drawn in a forward), or "
               f"keep them in eval mode ({_attribute_path(name)}.eval(): the engine trains "
               "each layer in the mode it is given)")
    raise DPDLError(
        f"{who} draws from {drawn} in {run.when}: how many draws a step makes follows the secret "
        "batch sizes of all the nodes one process hosts, so their updates would depend on "
        f"each other, and the draws are not secret; {fix}"
    )


def _attribute_path(name: str) -> str:
    """``features.2.drop`` as Python reaches it: ``model.features[2].drop``."""
    return "model" + "".join(f"[{part}]" if part.isdigit() else f".{part}"
                             for part in name.split("."))  # fmt: skip


class _LossFailed(Exception):
    """The loss (not the model) failed in a probing way."""


def _checked_loss(loss: Callable) -> Callable:
    def call(out, y):
        try:
            return loss(out, y)
        except Exception as err:
            raise _LossFailed from err

    return call


def _loss_copy(loss: Callable | None) -> Callable | None:
    """A deep copy of the loss to probe (a function is its own copy: its closure's state, if
    it changes, is refused all the same)."""
    if loss is None:
        return None
    try:
        return copy.deepcopy(loss)
    except Exception as err:
        raise DPDLError(f"the loss {_name(loss)} cannot be copied (copy.deepcopy): "
                        f"{type(err).__name__}: {_first_line(err)}") from None  # fmt: skip


def _loss_description(loss: Callable | None) -> dict:
    return {} if loss is None else loss_state(loss)


def _name(loss) -> str:
    return getattr(loss, "__qualname__", type(loss).__qualname__)


def _first_line(err: BaseException | None) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else ""
