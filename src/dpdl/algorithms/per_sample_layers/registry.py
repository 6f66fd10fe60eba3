"""The registry of layer types book-keeping clipping can read, and what a handler provides."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn


class RankOne(NamedTuple):
    """Record r's weight gradient as the product g_r^T a_r (g: (N, 1, out), a: (N, 1, in)),
    never formed per record: the clipped sum is one batched product of the factor-weighted
    g with a.  ``bias`` (N, out) is the per-record bias gradient."""

    g: torch.Tensor
    a: torch.Tensor
    bias: torch.Tensor


class SparseRows(NamedTuple):
    """Record r's weight gradient as a few rows of the weight (an embedding's: the rows of the
    tokens it holds), never formed densely: ``rows[r, k]`` (K, *row shape) is its gradient
    at row ``index[r, k]`` (N, K) of the weight.  The rows a record names are distinct (a
    repeated token's gradients summed into one slot), so the record's gradient norm is that
    of its ``rows``; a slot it does not use holds zeros (at any index)."""

    index: torch.Tensor
    rows: torch.Tensor


@dataclass
class LayerTerms:
    """One layer of a model as book-keeping sees it; a subclass per layer type says what
    varies: whether the layer can be read at all, what it costs, and its per-record terms.

    ``weight`` / ``bias`` are the names of its parameters in the stacked params dict (None
    when it has none); the shapes are one record's input and output, set by the planning
    forward."""

    module: nn.Module
    weight: str | None
    bias: str | None
    in_shape: tuple[int, ...] = ()
    out_shape: tuple[int, ...] = ()

    @property
    def params(self) -> list[str]:
        return [name for name in (self.weight, self.bias) if name is not None]

    def problem(self) -> str | None:
        """Why this particular layer cannot be read (e.g. a padding F.unfold cannot copy)."""
        return None

    def cost(self) -> tuple[float, float]:
        """(multiply-adds, bytes) of one record's terms, beyond the input, output and probe
        that every layer keeps; for the chunk planner."""
        raise NotImplementedError

    def unit_sums(self, a: torch.Tensor, g: torch.Tensor):
        """For an unclipped sum (SGP): {parameter name: (m, *parameter shape)}, each unit's
        records' gradients summed, from ``a`` (m, B, *in_shape) and ``g`` (m, B, *out_shape)
        (a padding record's g is zero); or None, and the sum is made from :meth:`terms` (what a
        type whose per-record terms cost little does)."""
        return None

    def terms(self, a: torch.Tensor, g: torch.Tensor):
        """From the layer inputs ``a`` (N, *in_shape) and output gradients ``g`` (N,
        *out_shape) of N records: their squared gradient norms (N,), and what the clipped sum
        needs: a :class:`RankOne`, a :class:`SparseRows` (of the weight) or {"weight" /
        "bias": per-record gradients (N, *parameter shape)}.  The norm must be that of exactly
        what is summed: privacy rests on it, not on the terms being the true gradient."""
        raise NotImplementedError


# exact module type -> its handler; a subclass of a registered type is not covered (its
# forward may differ), so it must be registered itself
LAYERS: dict[type[nn.Module], type[LayerTerms]] = {}


def register_layer(*module_types: type[nn.Module]):
    """Class decorator: book-keeping reads layers of these exact types with this handler."""

    def register(handler: type[LayerTerms]) -> type[LayerTerms]:
        for module_type in module_types:
            LAYERS[module_type] = handler
        return handler

    return register
