"""Refuse models whose layers mix the records of a batch (per-record clipping, MATH.md §4),
and models whose state changes across a forward.

Dyn-D2P clips each record's gradient alone, so a record's loss may depend on that record
and the parameters only. Batch normalisation (and instance normalisation with running
statistics) couples the records of a batch and updates buffers outside the gradient step:
such a model is refused, naming the layer and the fix (GroupNorm / LayerNorm), as Opacus's
``ModuleValidator`` does.

A model whose buffers or attributes change across a forward (a running statistic reassigned
in train mode, a counter of calls) is refused too (:func:`refuse_stateful`): that state is a
noise-free function of the records the model saw, which a released model would carry, and
the engine's chunking of the hosted nodes' records would couple their updates through it.
The check runs on a throw-away copy with synthetic records, never on the user's module.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from dpdl.errors import DPDLError
from dpdl.models.state import module_state, state_changes

__all__ = ["refuse_state_changes", "refuse_stateful", "synthetic_records", "throwaway_copy",
           "validate_model"]  # fmt: skip

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
    engine trains every parameter), and no layer that mixes records (see the module docstring).
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
    return model


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
                      device: torch.device | str = "cpu") -> torch.Tensor:  # fmt: skip
    """``count`` float32 records of ``record_shape``, uniform on [0, 1) from a fixed public
    seed: an input of the right shape that is no one's data (distinct records, so a statistic
    over the batch shows; values a float, an index or a pixel can all take)."""
    generator = torch.Generator().manual_seed(SYNTHETIC_SEED)
    return torch.rand((count, *record_shape), generator=generator).to(device)


def refuse_state_changes(before: dict, model: nn.Module, when: str = "a forward") -> None:
    """Refuse ``model`` when its :func:`~dpdl.models.state.module_state` is no longer
    ``before`` (one line naming what changed ``when``)."""
    changed = state_changes(before, module_state(model))
    if changed:
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4
                                          else "")  # fmt: skip
        raise DPDLError(
            f"the model's state changes across {when} ({shown}): a buffer or attribute "
            "updated from the records it sees is a noise-free statistic of them (a released "
            "model would carry it, and it couples the nodes one process hosts); keep "
            "statistics and counters out of the model (make a learned value a parameter)"
        )


def refuse_stateful(model: nn.Module, record_shape: tuple[int, ...],
                    device: torch.device | str | None = None) -> None:  # fmt: skip
    """Run a throw-away copy of ``model`` on synthetic records in train mode (gradients on,
    as a training step) and in eval mode, and refuse it if any parameter, buffer or
    attribute of any submodule changed (:func:`refuse_state_changes`)."""
    probe = throwaway_copy(model, device)
    x = synthetic_records(record_shape, 3, device or "cpu")
    where = torch.device(device or "cpu")
    # torch's global generator (dropout masks) is left where it was: a check draws nothing
    # that training would otherwise have drawn
    with torch.random.fork_rng(devices=[where] if where.type == "cuda" else [],
                               device_type="cuda"):  # fmt: skip
        for training in (True, False):
            probe.train(training)
            before = module_state(probe)
            try:
                probe(x)
            except Exception as err:  # the user's code: where it failed, in one line
                text = str(err).strip().splitlines()
                raise DPDLError(f"the model cannot take records of shape "
                                f"{tuple(record_shape)}: {type(err).__name__}: "
                                f"{text[0] if text else ''}") from None  # fmt: skip
            refuse_state_changes(before, probe, f"a forward in "
                                 f"{'train' if training else 'eval'} mode")  # fmt: skip
