"""nn.Linear: on one position, a rank-one gradient whose norm is ||g|| ||a||; on several
(a sequence), the per-record gradient P_r = sum_t g_rt a_rt^T itself."""

from __future__ import annotations

import math

import torch
from torch import nn

from dpdl.algorithms.per_sample_layers.registry import LayerTerms, RankOne, register_layer


@register_layer(nn.Linear)
class LinearTerms(LayerTerms):
    def cost(self) -> tuple[float, float]:
        width_in = self.in_shape[-1] if self.in_shape else 1
        width_out = self.out_shape[-1]
        positions = math.prod(self.in_shape) // max(width_in, 1)
        macs = 3.0 * positions * width_in * width_out
        # only on several positions is the per-record gradient formed
        return macs, 4.0 * width_in * width_out if positions > 1 else 0.0

    def terms(self, a: torch.Tensor, g: torch.Tensor):
        N = a.shape[0]
        a2, g2 = a.reshape(N, -1, a.shape[-1]), g.reshape(N, -1, g.shape[-1])
        bias = g2.sum(dim=1)
        if a2.shape[1] == 1:
            sq = a2.square().sum((1, 2)) * g2.square().sum((1, 2))
            terms = RankOne(g2, a2, bias)
        else:
            psg = torch.bmm(g2.transpose(1, 2), a2)  # (N, out, in): record r's P_r
            sq = psg.flatten(1).square().sum(1)
            terms = {"weight": psg, "bias": bias} if self.bias is not None else {"weight": psg}
        if self.bias is not None:
            sq = sq + bias.square().sum(1)
        return sq, terms
