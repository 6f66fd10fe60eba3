"""A node's released noisy sum from first principles (mpmath), for the engine's tests."""

from __future__ import annotations

import torch


def reference_noisy_sum(stream, totals, sigma: float):
    """A node's released noisy sum computed from first principles: G = g·round((S + sigma·X)
    / g), X = sqrt(2) erfinv(2P - 1) in mpmath at the midpoint of P's 64-bit interval (the
    node's next d words, word xor 2^63 = P·2^64), g = 2^(floor(log2 sigma) - 10).  ``totals``:
    the node's float64 sums, one tensor per parameter; returns the same shapes."""
    import math

    import mpmath

    d = sum(t.numel() for t in totals)
    words = stream.words(d)
    g = 2.0 ** (math.frexp(sigma)[1] - 1 - 10)
    flat = torch.cat([t.reshape(-1).double() for t in totals]).tolist()
    out = []
    with mpmath.workprec(120):
        for s, w in zip(flat, words.tolist(), strict=True):
            p = (mpmath.mpf(int(w) ^ (1 << 63)) + mpmath.mpf(0.5)) / mpmath.mpf(2) ** 64
            x = mpmath.sqrt(2) * mpmath.erfinv(2 * p - 1)
            out.append(g * float(mpmath.nint((s + sigma * x) / g)))
    sizes = [t.numel() for t in totals]
    return [c.reshape(t.shape) for c, t in zip(torch.tensor(out, dtype=torch.float64).split(sizes),
                                               totals, strict=True)]


def assert_close_up_to_a_grid_step(actual, expected, *, atol: float, step: float,
                                   share: float = 0.01):
    """Equal within ``atol``, except a few coordinates (at most ``share``) one grid step apart:
    a sum computed in float32 by the engine and in float64 by a reference may fall on the
    two sides of a cell boundary of the released noisy sum."""
    diff = (torch.as_tensor(actual).double() - torch.as_tensor(expected).double()).abs()
    assert float(diff.max()) <= atol + step * 1.001, float(diff.max())
    assert float((diff > atol).double().mean()) <= share
