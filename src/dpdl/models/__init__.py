"""Models (ARCHITECTURE.md, ``dpdl.models``): ``make_model(name, input_shape, num_classes)``.

Every model is a plain ``torch.nn.Module`` without BatchNorm or buffers that depend on the
batch, so ``torch.func.functional_call`` + ``vmap`` over single records gives exact
per-record gradients (needed for per-record clipping, MATH.md §4).
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from dpdl.errors import DPDLError
from dpdl.models.cnn import ShallowCNN
from dpdl.models.resnet import ResNet18GN
from dpdl.models.simple import MLP, LogisticRegression
from dpdl.models.validation import validate_model

_REGISTRY: dict[str, type[nn.Module]] = {
    "cnn": ShallowCNN,
    "resnet18-gn": ResNet18GN,
    "logreg": LogisticRegression,
    "mlp": MLP,
}
MODELS = tuple(_REGISTRY)


def make_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int | None,
    seed: int | None = None,
    **options,
) -> nn.Module:
    """Build a model by name ("cnn", "resnet18-gn", "logreg", "mlp").

    ``input_shape`` is the shape of one record (e.g. (1, 28, 28)); ``num_classes`` is the
    number of output logits, or None for regression (one output). ``seed`` makes the
    initialisation reproducible without touching the global torch RNG. ``options`` are passed
    to the model (cnn: channels, hidden; mlp: hidden; resnet18-gn: groups, width).
    """
    key = str(name).strip().lower()
    if key not in _REGISTRY:
        raise DPDLError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    cls = _REGISTRY[key]
    try:
        shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError) as exc:
        raise DPDLError(
            f"input_shape must be a tuple of positive ints, got {input_shape!r}"
        ) from exc
    if not shape or min(shape) < 1:
        raise DPDLError(f"input_shape must be a tuple of positive ints, got {input_shape!r}")
    num_outputs = 1 if num_classes is None else num_classes
    if isinstance(num_outputs, bool) or not isinstance(num_outputs, int) or num_outputs < 1:
        raise DPDLError(f"num_classes must be a positive int or None, got {num_classes!r}")
    accepted = set(inspect.signature(cls.__init__).parameters) - {
        "self", "input_shape", "num_outputs"
    }
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise DPDLError(
            f"model {key!r} does not take option(s) {unknown}; it accepts {sorted(accepted)}"
        )
    if seed is None:
        return cls(shape, num_outputs, **options)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        return cls(shape, num_outputs, **options)


def num_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) scalar parameters, the dimension d of the noise in MATH.md §4."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


__all__ = ["MLP", "MODELS", "LogisticRegression", "ResNet18GN", "ShallowCNN", "make_model",
           "num_params", "validate_model"]
