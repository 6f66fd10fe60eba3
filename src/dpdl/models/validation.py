"""Refuse models whose layers mix the records of a batch (per-record clipping, MATH.md §4).

Dyn-D2P clips each record's gradient alone, so a record's loss may depend on that record
and the parameters only. Batch normalisation (and instance normalisation with running
statistics) couples the records of a batch and updates buffers outside the gradient step:
such a model is refused, naming the layer and the fix (GroupNorm / LayerNorm), as Opacus's
``ModuleValidator`` does.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm

from dpdl.errors import DPDLError

__all__ = ["validate_model"]


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
