"""The two Gaussian samplers dpdl released noise with until issue 38, kept to be attacked.

Both are *floating-point* samplers, and the arithmetic after them is float32:

* ``legacy-box-muller`` (the old default): Box-Muller with a 63-bit radius word and a 32-bit
  angle, the radius transform in float32, so r^2 = 87.34 - 2 log(...) lies on 2^-17 Z (the
  subtraction of two float32 numbers in [64, 128) is exact): the pair (xi_j, xi_{P+j}) read
  off a message sits on that lattice only under the true clipped sum (attack
  ``fp_lattice.py``);
* ``legacy-hardened`` (the old ``--secure-noise``): each normal the sum of four float64
  Box-Muller draws, halved, then rounded to float32; the message fl(fl(x + s32 xi) + a32 S)
  leaves float32 values no xi produces, so a wrong S is ruled out with certainty
  (``fp_hardened.py``).

Each is a :class:`~dpdl.algorithms.dyn_d2p.NoiseMechanism` that reproduces the old step's
arithmetic exactly (x + s·xi in float32 first, then the clipped sums with weight -lr/b; the
optimiser's path S + sigma·xi), so ``dpdl audit --threat implementation`` can show that its
tests refute them and pass the current mechanism.  Nothing outside the audit uses them, and
the engine never picks them: they are passed in explicitly, like ``--noise-scale``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from dpdl.algorithms.randomness import SecretStream
from dpdl.errors import require

__all__ = ["LEGACY_MECHANISMS", "LegacyGaussian", "box_muller_normals", "hardened_normals"]

_TWO_LN_2_POW_63 = 126.0 * math.log(2.0)
_HARDENED_WORDS = 4  # four 53-bit uniforms per hardened normal


def box_muller_normals(streams: Sequence[SecretStream], d: int) -> torch.Tensor:
    """(m, d) float32, row i from ``streams[i]``: 12 bytes per pair (8 radius, 4 angle).

    out[:, :P] = r cos(theta), out[:, P:] = r sin(theta), P = ceil(d / 2), with
    u = (|w| + 1/2) 2^-63 and theta = w' pi 2^-31, the radius transform in float32."""
    pairs = -(-d // 2)
    out = torch.empty((len(streams), d), dtype=torch.float32)
    for i, stream in enumerate(streams):
        radius = torch.from_numpy(stream.read(8 * pairs)).view(torch.int64)
        angle = torch.from_numpy(stream.read(4 * pairs)).view(torch.int32)
        r = radius.to(torch.float32).abs_().add_(0.5).log_()
        r = r.mul_(-2.0).add_(_TWO_LN_2_POW_63).clamp_min_(0.0).sqrt_()
        theta = angle.to(torch.float32).mul_(math.pi * 2.0**-31)
        out[i, :pairs] = torch.cos(theta).mul_(r)
        out[i, pairs:] = torch.sin(theta[: d - pairs]).mul_(r[: d - pairs])
    return out


def hardened_normals(streams: Sequence[SecretStream], d: int) -> torch.Tensor:
    """(m, d) float32: per normal, four Box-Muller draws from 53-bit uniforms in float64
    (pairs j and j + d of each half), summed, halved, rounded to float32."""
    out = torch.empty((len(streams), d), dtype=torch.float32)
    for i, stream in enumerate(streams):
        words = torch.from_numpy(stream.read(8 * _HARDENED_WORDS * d)).view(torch.int64)
        halves = words.view(2, 2 * d)
        u = ((halves >> 11) & ((1 << 53) - 1)).add_(1).to(torch.float64).mul_(2.0**-53)
        radius = u[0].log_().mul_(-2.0).sqrt_()
        angle = u[1].mul_(2.0 * math.pi)
        cos, sin = torch.cos(angle).mul_(radius), angle.sin_().mul_(radius)
        out[i] = ((cos[:d] + cos[d:] + sin[:d] + sin[d:]) * 0.5).to(torch.float32)
    return out


class LegacyGaussian:
    """A floating-point Gaussian with the old step's float32 arithmetic (module doc)."""

    certified = False

    def __init__(self, name: str, sampler):
        self.name, self._sampler = name, sampler

    def start(self, generators, d: int, sigma: float, *, device=None, reuse=None):
        require(len(generators) > 0, "no streams to draw from")
        return self._sampler(generators, d).to(device), float(sigma)

    def noisy_sums(self, noise, sums):
        normals, sigma = noise
        for (lo, hi), s in zip(_columns(sums), sums.values(), strict=True):
            s.add_(normals[:, lo:hi].view(s.shape), alpha=sigma)
        return sums

    def noisy_step(self, noise, x, sums, step_size: float, out):
        """out = fl32(fl32(x - step_size sigma xi) - step_size S): the old fused step with
        its clipped sums in one chunk."""
        normals, sigma = noise
        for (lo, hi), (name, s) in zip(_columns(sums), sums.items(), strict=True):
            total = s.clone()
            torch.add(x[name], normals[:, lo:hi].view(s.shape), alpha=-step_size * sigma,
                      out=out[name])  # fmt: skip
            out[name].add_(total, alpha=-step_size)
        return out


def _columns(params) -> list[tuple[int, int]]:
    bounds, lo = [], 0
    for p in params.values():
        size = int(np.prod(p.shape[1:]))
        bounds.append((lo, lo + size))
        lo += size
    return bounds


LEGACY_MECHANISMS = {
    "legacy-box-muller": LegacyGaussian("legacy-box-muller", box_muller_normals),
    "legacy-hardened": LegacyGaussian("legacy-hardened", hardened_normals),
}
