"""nn.Conv2d (zero padding): the per-record gradient P_r (O x C/groups x k_h x k_w) as the
weight gradient of one grouped convolution with a group per record, the bias gradient summed
over output positions."""

from __future__ import annotations

import math

import torch
from torch import nn

from dpdl.algorithms.per_sample_layers.registry import LayerTerms, register_layer


def conv_padding(conv: nn.Conv2d) -> tuple[int, int] | None:
    """Symmetric integer padding of ``conv`` (None when it is not zero padding that the
    convolution's own ``padding`` argument can express)."""
    if conv.padding_mode != "zeros":
        return None
    if isinstance(conv.padding, str):
        if conv.padding == "valid":
            return (0, 0)
        total = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size, strict=True)]
        if any(t % 2 for t in total):
            return None
        return (total[0] // 2, total[1] // 2)
    return tuple(int(p) for p in conv.padding)


@register_layer(nn.Conv2d)
class Conv2dTerms(LayerTerms):
    def problem(self) -> str | None:
        return "padding" if conv_padding(self.module) is None else None

    def cost(self) -> tuple[float, float]:
        conv = self.module
        kk = conv.in_channels // conv.groups * math.prod(conv.kernel_size)
        positions = math.prod(self.out_shape[1:])
        macs = 3.0 * positions * kk * conv.out_channels
        return macs, 4.0 * conv.weight.numel()  # the per-record gradient

    def terms(self, a: torch.Tensor, g: torch.Tensor):
        psg = self._per_record_weight_grads(a, g)
        sq = psg.flatten(1).square().sum(1)
        terms = {"weight": psg}
        if self.bias is not None:
            terms["bias"] = bias = g.flatten(2).sum(dim=2)
            sq = sq + bias.square().sum(1)
        return sq, terms

    def unit_sums(self, a: torch.Tensor, g: torch.Tensor):
        """Each unit's records' gradients summed, as the weight gradient of a convolution over
        the unit's B records: one plain convolution per unit (B >= 4, where it is several
        times faster than a grouped one on CPU), else one grouped convolution with a group per
        unit, (B, m C, H, W) -> (B, m O, H', W').  No record's gradient is formed alone."""
        conv, (m, B) = self.module, a.shape[:2]
        args = (conv.stride, conv_padding(conv), conv.dilation, False, (0, 0))
        if B >= 4:
            weight = a.new_empty(conv.weight.shape)  # only its shape is read
            per_unit = [torch.ops.aten.convolution_backward(
                g[u], a[u], weight, None, *args, conv.groups, (False, True, False))[1]
                for u in range(m)]  # fmt: skip
            grad_weight = torch.stack(per_unit)
        else:
            inputs = a.transpose(0, 1).reshape(B, m * conv.in_channels, *a.shape[3:])
            grads = g.transpose(0, 1).reshape(B, m * conv.out_channels, *g.shape[3:])
            weight = a.new_empty((m * conv.out_channels, *conv.weight.shape[1:]))
            grad_weight = torch.ops.aten.convolution_backward(
                grads, inputs, weight, None, *args, m * conv.groups, (False, True, False))[1]
        sums = {self.weight: grad_weight.reshape(m, *conv.weight.shape)}
        if self.bias is not None:
            sums[self.bias] = g.sum(dim=(1, *range(3, g.dim())))
        return sums

    def _per_record_weight_grads(self, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """(N, *weight shape): record r's weight gradient from its own input a_r and output
        gradient g_r alone.  The N records are the groups of one convolution over a batch of
        one, (1, N C, H, W) -> (1, N O, H', W'), whose weight gradient (N O, C/groups, k, k)
        stacks the records' gradients: the convolution's own backward kernel, ~2x faster on
        CPU than unfolding the input and multiplying (and no unfolded copy in memory).  On
        CUDA, cuDNN may run it in TF32 (``torch.backends.cudnn.allow_tf32``, on by default):
        less precise terms, the same bound, since the norm is taken of this very tensor."""
        conv, N = self.module, a.shape[0]
        # only the weight's shape is read (the input gradient is not asked for)
        weight = a.new_empty((N * conv.out_channels, *conv.weight.shape[1:]))
        _, grad_weight, _ = torch.ops.aten.convolution_backward(
            g.reshape(1, N * conv.out_channels, *g.shape[2:]),
            a.reshape(1, N * conv.in_channels, *a.shape[2:]),
            weight,
            None,
            conv.stride,
            conv_padding(conv),
            conv.dilation,
            False,
            (0, 0),
            N * conv.groups,
            (False, True, False),
        )
        return grad_weight.reshape(N, *conv.weight.shape)
