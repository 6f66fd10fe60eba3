"""Models (ARCHITECTURE.md, ``dpdl.models``): ``make_model(name, input_shape, num_classes)``.

Every model is a plain ``torch.nn.Module`` without BatchNorm or buffers that depend on the
batch, so ``torch.func.functional_call`` + ``vmap`` over single records gives exact
per-record gradients (needed for per-record clipping, MATH.md §4).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

import torch
from torch import nn

from dpdl.errors import DPDLError
from dpdl.models.cnn import ShallowCNN
from dpdl.models.resnet import ResNet18GN
from dpdl.models.simple import MLP, LogisticRegression
from dpdl.models.validation import validate_model

_REGISTRY: dict[str, Callable[..., nn.Module]] = {
    "cnn": ShallowCNN,
    "resnet18-gn": ResNet18GN,
    "logreg": LogisticRegression,
    "mlp": MLP,
}
MODELS = tuple(_REGISTRY)


def register_model(name: str, factory: Callable[..., nn.Module]) -> None:
    """Make ``factory(input_shape, num_outputs, **options) -> nn.Module`` available by
    ``name`` to ``make_model`` and configs (``[model] name = ...``), like ``register_loader``.

    A config may also name a factory by its import path, ``"package.module:function"``,
    without registering it; a sweep's worker processes import it the same way (the module
    must be importable there: on ``PYTHONPATH``).
    """
    key = str(name).strip().lower()
    if key in MODELS:
        raise DPDLError(f"model {name!r} is shipped with dpdl: register yours under another name")
    if not callable(factory):
        raise DPDLError(f"the model factory for {name!r} must be callable, got {factory!r}")
    _REGISTRY[key] = factory


def _factory(name: str) -> Callable[..., nn.Module]:
    key = str(name).strip().lower()
    if key in _REGISTRY:
        return _REGISTRY[key]
    if ":" in str(name):
        module_name, _, attribute = str(name).strip().partition(":")
        try:
            factory = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as err:
            raise DPDLError(f"model {name!r} cannot be loaded: {err}") from None
        if not callable(factory):
            raise DPDLError(f"model {name!r} is not callable")
        return factory
    raise DPDLError(f"unknown model {name!r}; choose one of {', '.join(_REGISTRY)} or give "
                    "'package.module:function'")


def _check_options(name: str, factory, options: dict) -> None:
    parameters = inspect.signature(factory).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return
    accepted = set(parameters) - {"self", "input_shape", "num_outputs"}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise DPDLError(
            f"model {name!r} does not take option(s) {unknown}; it accepts {sorted(accepted)}"
        )


def make_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int | None,
    seed: int | None = None,
    **options,
) -> nn.Module:
    """Build a model by name ("cnn", "resnet18-gn", "logreg", "mlp", a registered one, or
    ``"package.module:function"``).

    ``input_shape`` is the shape of one record (e.g. (1, 28, 28)); ``num_classes`` is the
    number of output logits, or None for regression (one output). ``seed`` makes the
    initialisation reproducible without touching the global torch RNG. ``options`` are passed
    to the model (cnn: channels, hidden; mlp: hidden; resnet18-gn: groups, width).
    """
    factory = _factory(name)
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
    _check_options(name, factory, options)
    if seed is None:
        model = factory(shape, num_outputs, **options)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = factory(shape, num_outputs, **options)
    if not isinstance(model, nn.Module):
        raise DPDLError(f"model {name!r} returned {type(model).__name__}, not a torch.nn.Module")
    return model


def num_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of (trainable) scalar parameters, the dimension d of the noise in MATH.md §4."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


__all__ = ["MLP", "MODELS", "LogisticRegression", "ResNet18GN", "ShallowCNN", "make_model",
           "num_params", "register_model", "validate_model"]
