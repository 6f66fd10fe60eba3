"""The accounting's argument checks, in one place: each raises DPDLError with one line naming
the argument and the value it got (accounting inputs reach here from configs and the CLI)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from dpdl.errors import require

__all__ = [
    "ADD_REMOVE", "DEFAULT_NEIGHBORING", "NEIGHBORING_RELATIONS", "REPLACE_ONE", "count",
    "delta", "epsilon", "mu", "neighboring", "per_step", "positive", "probability", "ratio",
    "sample_rate", "steps",
]  # fmt: skip

# The neighbouring relations a privacy statement can be made under (MATH.md Conventions;
# JAX-Privacy's ``neighboring_relation``, dp_accounting's ``NeighboringRelation``):
# replace-one keeps every node's size J_i fixed (J_i public), add-remove changes it (J_i
# secret, never released).  The default of a run is replace-one: a run releases J_i.
REPLACE_ONE, ADD_REMOVE = "replace-one", "add-remove"
NEIGHBORING_RELATIONS = (REPLACE_ONE, ADD_REMOVE)
DEFAULT_NEIGHBORING = REPLACE_ONE

_NUMBER = (int, float, np.floating, np.integer)


def _is_number(value) -> bool:
    return isinstance(value, _NUMBER) and not isinstance(value, bool)


def positive(name: str, value: float) -> float:
    """A finite number > 0."""
    require(
        _is_number(value) and math.isfinite(value) and value > 0,
        f"{name} must be a finite positive number, got {value!r}",
    )
    return float(value)


def mu(value: float) -> float:
    """A GDP parameter μ: finite and > 0."""
    return positive("mu", value)


def epsilon(value: float) -> float:
    """A privacy-loss level ε: finite and >= 0."""
    require(
        _is_number(value) and math.isfinite(value) and value >= 0,
        f"epsilon must be a finite number >= 0, got {value!r}",
    )
    return float(value)


def probability(name: str, value: float) -> float:
    """A number in the open interval (0, 1)."""
    require(_is_number(value) and 0 < value < 1, f"{name} must lie in (0, 1), got {value!r}")
    return float(value)


def delta(value: float) -> float:
    """A δ in (0, 1)."""
    return probability("delta", value)


def count(name: str, value: int, minimum: int = 1) -> int:
    """An integer >= ``minimum``."""
    require(
        isinstance(value, int | np.integer) and not isinstance(value, bool) and value >= minimum,
        f"{name} must be an integer >= {minimum}, got {value!r}",
    )
    return int(value)


def sample_rate(value: float) -> float:
    """A Poisson sampling rate in (0, 1]."""
    require(
        _is_number(value) and 0 < value <= 1, f"sample_rate must lie in (0, 1], got {value!r}"
    )
    return float(value)


def neighboring(value: str) -> str:
    """A neighbouring relation: one of :data:`NEIGHBORING_RELATIONS`."""
    require(
        isinstance(value, str) and value in NEIGHBORING_RELATIONS,
        f"unknown neighbouring relation {value!r}; use one of {', '.join(NEIGHBORING_RELATIONS)}",
    )
    return value


def steps(value: int) -> int:
    """A number of steps: an integer >= 1."""
    return count("steps", value)


def ratio(name: str, value: float) -> float:
    """A decay ratio ρ: finite and >= 1 (1 is the constant schedule)."""
    require(
        _is_number(value) and math.isfinite(value) and value >= 1,
        f"{name} must be a finite number >= 1, got {value!r}",
    )
    return float(value)


def per_step(name: str, values: ArrayLike, count: int | None = None) -> np.ndarray:
    """A user-given per-step sequence: finite, positive, 1-D, of length ``count`` if given."""
    array = np.asarray(values, dtype=np.float64)
    require(array.ndim == 1 and array.size > 0, f"{name} must be a non-empty 1-D array")
    require(
        bool(np.all(np.isfinite(array))) and bool(np.all(array > 0)),
        f"{name} must be finite and positive everywhere (min {np.min(array)!r})",
    )
    if count is not None:
        require(array.size == count, f"{name} has length {array.size}, expected steps = {count}")
    return array
