"""nn.GroupNorm and nn.LayerNorm: the per-record gradients of the affine weight and bias,
from the normalised input, summed over the dimensions the affine parameters are shared by."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dpdl.algorithms.per_sample_layers.registry import LayerTerms, register_layer


class _NormTerms(LayerTerms):
    def normalised(self, a: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        """The normalised input and the dimensions its affine parameters are shared by."""
        raise NotImplementedError

    def cost(self) -> tuple[float, float]:
        n_out = math.prod(self.out_shape)
        return 4.0 * n_out, 8.0 * n_out

    def terms(self, a: torch.Tensor, g: torch.Tensor):
        xhat, dims = self.normalised(a)
        terms = {}
        if self.weight is not None:
            terms["weight"] = (g * xhat).sum(dims) if dims else g * xhat
        if self.bias is not None:
            terms["bias"] = g.sum(dims) if dims else g
        sq = sum(t.flatten(1).square().sum(1) for t in terms.values())
        return sq, terms


@register_layer(nn.GroupNorm)
class GroupNormTerms(_NormTerms):
    def normalised(self, a):
        mod = self.module
        return F.group_norm(a, mod.num_groups, eps=mod.eps), tuple(range(2, a.dim()))


@register_layer(nn.LayerNorm)
class LayerNormTerms(_NormTerms):
    def normalised(self, a):
        mod = self.module
        xhat = F.layer_norm(a, mod.normalized_shape, eps=mod.eps)
        return xhat, tuple(range(1, a.dim() - len(mod.normalized_shape)))
