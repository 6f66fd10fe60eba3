"""nn.Conv2d (zero padding): the per-record gradient P_r (O x C/groups x k_h x k_w) from the
unfolded input, the bias gradient summed over output positions."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dpdl.algorithms.per_sample_layers.registry import LayerTerms, register_layer


def conv_padding(conv: nn.Conv2d) -> tuple[int, int] | None:
    """Symmetric integer padding of ``conv`` (None when F.unfold cannot reproduce it)."""
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
        # the unfolded input and the per-record gradient
        return macs, 4.0 * (positions * kk * conv.groups) + 4.0 * conv.weight.numel()

    def terms(self, a: torch.Tensor, g: torch.Tensor):
        conv, N = self.module, a.shape[0]
        u = self._unfold(a)  # (N, C/groups * k*k * groups, T)
        g2 = g.reshape(N, conv.out_channels, -1)  # (N, O, T)
        G, T = conv.groups, u.shape[-1]
        psg = torch.einsum(
            "ngot,ngkt->ngok",
            g2.reshape(N, G, conv.out_channels // G, T),
            u.reshape(N, G, -1, T),
        ).reshape(N, *conv.weight.shape)
        sq = psg.flatten(1).square().sum(1)
        terms = {"weight": psg}
        if self.bias is not None:
            terms["bias"] = bias = g2.sum(dim=2)
            sq = sq + bias.square().sum(1)
        return sq, terms

    def _unfold(self, a: torch.Tensor) -> torch.Tensor:
        """F.unfold of the input, (N, C k_h k_w, T): a strided view copied once, which on CPU
        is ~1.5-2x faster than F.unfold's im2col (Opacus's unfold2d does the same)."""
        conv = self.module
        ph, pw = conv_padding(conv)
        (kh, kw), (sh, sw), (dh, dw) = conv.kernel_size, conv.stride, conv.dilation
        padded = F.pad(a, (pw, pw, ph, ph)) if ph or pw else a
        N, C, H, W = padded.shape
        out_h, out_w = (H - dh * (kh - 1) - 1) // sh + 1, (W - dw * (kw - 1) - 1) // sw + 1
        sn, sc, s_h, s_w = padded.stride()
        windows = padded.as_strided(
            (N, C, kh, kw, out_h, out_w), (sn, sc, s_h * dh, s_w * dw, s_h * sh, s_w * sw)
        )
        return windows.reshape(N, C * kh * kw, out_h * out_w)
