"""Noise whose released values have exactly the law they are accounted for (MATH.md §10).

A private step releases a noisy sum G = S + scale·X (X a standard Gaussian, or a standard
Laplace for pure ε-DP): the accounting is that of a real-valued X.  What a node sends is a
float32 message computed from G, so what matters is the law of the bits: a floating-point
sampler whose outputs lie on a lattice, or leave gaps, lets a neighbour read X off the message
and recover S exactly (Mironov 2012; ``../shared/attacks``).  Here G is released **on a grid
g·Z** with g = 2^(floor(log2 scale) - GRID_BITS) (a power of two, about a thousandth of the
noise's scale), and its law is *exactly* the law of round_g(S + scale·X) with X a real
Gaussian: the rounding of a Gaussian mechanism's output, i.e. post-processing, so the
Gaussian accounting holds as it is and every later float operation (the step, momentum,
mixing, the float32 cast) is post-processing too.  No δ is added: the noise's support is
every grid point.

How (interval refining, Haney et al. 2022, with a certified fast path):

1. Every coordinate takes one 64-bit word of its node's secret stream, the first 64 bits of a
   uniform P in (0, 1); X = F^{-1}(P), F the law's CDF.  The words are made on the device
   where the parameters live (:func:`~dpdl.algorithms.randomness.fill_words`: the same bits
   from OpenSSL on a CPU or the torch ChaCha20 on a GPU).
2. Fast path, vectorised in float64 on the device: X̂ = F^{-1}(P̂) at P's midpoint, then
   v = (S + scale·X̂) / g and j = round(v).  A bound on |X̂ - X| over the whole 64-bit interval
   of P (the interval's width, the float64 conversion, the quantile function's error with 4096
   times the margin measured against mpmath) and on the float64 arithmetic certifies that every
   P of the interval lands in cell j: then j is exact.
3. Otherwise (about one coordinate in 10^6: |v - j| near 1/2, or P in the last 2^-20 of a
   tail) the exact path decides the cell in exact rational and mpmath arithmetic, comparing P
   with F at the cell's boundaries and drawing 64 more bits of P from the stream while P's
   interval straddles one (so the tails are exact too).

Which coordinates take the exact path depends on the device; the cell and the stream's use do
not (more bits are drawn only when P's interval truly straddles a boundary), so a seeded run
gives the same G on every machine that computes the same S.

The laws are a small registry (:data:`LAWS`): a law gives its quantile function in torch
float64 with the error model above, and its tail and quantile in mpmath.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dpdl.algorithms.randomness import SecretStream, fill_words
from dpdl.errors import require

__all__ = [
    "GRID_BITS",
    "LAWS",
    "NoiseDraw",
    "NoiseLaw",
    "draw",
    "exact_cell",
    "grid_step",
    "release",
    "release_numpy",
    "secret_normals",
]

#: The grid is 2^-GRID_BITS of the noise scale (to a factor of 2): rounding adds a variance of
#: at most (2 scale 2^-GRID_BITS)^2 / 12, about 4e-7 of the noise's own.
GRID_BITS = 10
#: Error model of the float64 quantile functions (with the P interval and the conversion):
#: |X̂ - F^{-1}(P)| <= _A / T + _B |X̂|, T = min(P, 1 - P).  Measured against mpmath at
#: 200 bits: torch's erfinv stays below 0.18 2^-52 (1/T + |X|); 2^-44 leaves 1400 times that.
_A = 2.0**-44
_B = 2.0**-44
#: P within this of 0 or 1 always takes the exact path (|X| > 4.9 for the Gaussian).
_TAIL = 2.0**-20
_HALF_WORD = 1 << 63
_WORD_MASK = (1 << 64) - 1
_MAX_BITS = 4096  # a uniform refined this far has straddled a boundary 63 times in a row


class NoiseLaw(Protocol):
    """A symmetric continuous law of scale 1 (the noise X before scaling)."""

    name: str

    def quantile(self, u: torch.Tensor) -> torch.Tensor:
        """F^{-1}((1 + u) / 2) for u in (-1, 1), float64, within the module's error model."""
        ...

    def upper_tail(self, b):
        """P(X > b) for an mpmath b >= 0, at the current mpmath precision."""
        ...

    def quantile_mp(self, p):
        """F^{-1}(p) for an mpmath p in (0, 1), at the current mpmath precision."""
        ...

    def lower_quantile(self, t: float) -> float:
        """F^{-1}(t) for 0 < t <= 1/2 in float64 (a guess: the exact path checks it)."""
        ...


class _Gaussian:
    name = "gaussian"

    def quantile(self, u):
        return torch.special.erfinv(u).mul_(math.sqrt(2.0))

    def upper_tail(self, b):
        import mpmath

        return mpmath.erfc(b / mpmath.sqrt(2)) / 2

    def quantile_mp(self, p):
        import mpmath

        return mpmath.sqrt(2) * mpmath.erfinv(2 * p - 1)

    def lower_quantile(self, t):
        from scipy.special import ndtri

        return float(ndtri(t))

    def lower_quantile_tensor(self, t):
        return torch.special.ndtri(t)


class _Laplace:
    name = "laplace"

    def quantile(self, u):
        # X = sign(u) (-log(1 - |u|)): log1p keeps the relative precision of small |u|
        return torch.log1p(-u.abs()).neg_().mul_(torch.sign(u))

    def upper_tail(self, b):
        import mpmath

        return mpmath.exp(-b) / 2

    def quantile_mp(self, p):
        import mpmath

        return mpmath.log(2 * p) if p < 0.5 else -mpmath.log(2 * (1 - p))

    def lower_quantile(self, t):
        return math.log(2 * t)

    def lower_quantile_tensor(self, t):
        return torch.log(2 * t)


LAWS: dict[str, NoiseLaw] = {law.name: law for law in (_Gaussian(), _Laplace())}


def _law(law: str | NoiseLaw) -> NoiseLaw:
    if isinstance(law, str):
        require(law in LAWS, f"unknown noise law {law!r}; choose one of {', '.join(LAWS)}")
        return LAWS[law]
    return law


def grid_step(scale: float) -> float:
    """g = 2^(floor(log2 scale) - GRID_BITS): exact, and between 2^-11 and 2^-10 of scale."""
    require(math.isfinite(scale) and scale > 0, f"a noise scale must be positive, got {scale}")
    _, exponent = math.frexp(scale)  # scale = m 2^e, m in [1/2, 1)
    return math.ldexp(1.0, exponent - 1 - GRID_BITS)


# --------------------------------------------------------------------------- bit sources
class BitSource(Protocol):
    """Where uniform 64-bit words come from: a :class:`~dpdl.algorithms.randomness.
    SecretStream`, or :class:`GeneratorBits` around a numpy Generator."""

    def words(self, count: int) -> np.ndarray: ...


@dataclass
class GeneratorBits:
    """The raw 64-bit output of a numpy Generator's bit generator (ChaCha20 for secret ones)."""

    rng: np.random.Generator

    def words(self, count: int) -> np.ndarray:
        return np.asarray(self.rng.bit_generator.random_raw(int(count)), dtype=np.uint64)


# --------------------------------------------------------------------------- phase 1
@dataclass
class NoiseDraw:
    """The data-free half of a release: every coordinate's word and its noise in grid units,
    split for a float32 second half, and what the fast path may certify.

    ``words`` (m, d) int64 on the draw's device (the raw 64-bit words' bit patterns); with
    s = X̂·scale/g the noise in grid units (X̂ the fast path's quantile), ``whole`` (m, d)
    float32 = round(s) and ``frac`` (m, d) float32 = s - round(s) rounded to float32;
    ``scratch``, ``scratch2`` (m, d) float32 for the second half.  The fast path certifies a
    coordinate when the fractional distance t of centre/g + s to its nearest integer is at
    most ``bulk_limit`` (grid units);
    the tail coordinates (min(P, 1 - P) < 2^-8, about 0.8 %: their X̂ comes from ``ndtri``)
    have their own limits ``tail_limit`` at the flat indices ``tail_index`` (-1: only the
    exact path decides).  ``scale``, ``grid``, the law; ``sources``: row i's bit source (the
    exact path's further bits).  Pass a draw back to :func:`draw` as ``reuse``: its buffers
    are refilled (fresh multi-megabyte tensors cost page faults every step).
    """

    words: torch.Tensor
    whole: torch.Tensor
    frac: torch.Tensor
    scratch: torch.Tensor
    scratch2: torch.Tensor
    tail_index: torch.Tensor | None = None
    tail_limit: torch.Tensor | None = None
    bulk_limit: float = -1.0
    scale: float = 1.0
    grid: float = 1.0
    law: NoiseLaw | None = None
    sources: Sequence[BitSource] = ()
    exact_count: int = 0  # coordinates the exact path decided (the last release)

    @classmethod
    def empty(cls, m: int, d: int, device=None) -> NoiseDraw:
        def buffer():
            return torch.empty((m, d), dtype=torch.float32, device=device)

        words = torch.empty((m, d), dtype=torch.int64, device=device)
        return cls(words, *(buffer() for _ in range(4)))

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.words.shape)

    def columns(self, lo: int, hi: int) -> NoiseDraw:
        """The draw's columns lo..hi-1 (views: one parameter's block of a flat draw)."""
        views = (t[:, lo:hi] for t in (self.whole, self.frac, self.scratch, self.scratch2))
        d = self.shape[1]
        rows, cols = self.tail_index // d, self.tail_index % d
        inside = (cols >= lo) & (cols < hi)
        index = rows[inside] * (hi - lo) + cols[inside] - lo
        return NoiseDraw(self.words[:, lo:hi], *views, index, self.tail_limit[inside],
                         self.bulk_limit, self.scale, self.grid, self.law,
                         self.sources)  # fmt: skip


# What the certificate leaves for the arithmetic after the quantile: frac rounded to float32
# (|frac| <= 1/2: 2^-25) and the float32 sum t = frac(centre/g) + frac (|t| < 1: 2^-25).
_ARITHMETIC_SLACK = 2.0**-25 + 2.0**-25
# centre/g is exact in float32 and its integer part exact below 2^23; the whole count j below
# 2^24 (what float32 holds exactly) with |s| < 2^15: beyond, release() takes float64.
_FLOAT32_RANGE = 2.0**23 - 2.0**16
# Coordinates of the first half processed together: few enough for small float64
# temporaries, many enough that the worker thread seldom holds the GIL (2^16: 10 % slower).
_GROUP_ELEMENTS = 1 << 18
# min(P, 1 - P) below this: a tail coordinate (its X̂ from ndtri, its own limit).
_TAIL_T = 2.0**-8


def draw(sources: Sequence[BitSource], d: int, scale: float, law: str | NoiseLaw = "gaussian",
         *, device=None, reuse: NoiseDraw | None = None) -> NoiseDraw:  # fmt: skip
    """Read d words from each source (row i from ``sources[i]``) and compute the noise in grid
    units and the slack the fast path may certify.  Nothing here depends on the data: it may
    run ahead, on another thread, while the sums are computed.  ``reuse``: a draw of the same
    shape to refill."""
    law = _law(law)
    g = grid_step(scale)
    m = len(sources)
    out = reuse if reuse is not None and reuse.shape == (m, int(d)) else None
    out = out or NoiseDraw.empty(m, int(d), device)
    _fill(sources, out.words)
    flat, units = out.words.reshape(-1), scale / g
    tails = [_first_half(out, flat[lo : lo + _GROUP_ELEMENTS], lo, law, units)
             for lo in range(0, flat.numel(), _GROUP_ELEMENTS)]  # fmt: skip
    out.tail_index = torch.cat([t[0] for t in tails]) if tails else torch.zeros(0, dtype=torch.long)
    out.tail_limit = torch.cat([t[1] for t in tails]) if tails else torch.zeros(0)
    # the bulk: T >= 2^-8, |X| <= 2.67, so |X̂ - X| <= A / T + B |X| (module doc) at most
    bulk_error = _A / _TAIL_T + _B * 2.67 + 2.0**-52 * 2.67  # and scale·X̂'s rounding
    out.bulk_limit = 0.5 - units * bulk_error - _ARITHMETIC_SLACK
    out.scale, out.grid, out.law, out.sources = float(scale), g, law, list(sources)
    return out


def _fill(sources: Sequence[BitSource], words: torch.Tensor) -> None:
    """Row i of ``words`` from ``sources[i]``: secret streams all at once on the words' device,
    any other bit source through the host."""
    if all(isinstance(source, SecretStream) for source in sources):
        fill_words(sources, words)
        return
    for row, source in zip(words, sources, strict=True):
        host = np.asarray(source.words(words.shape[1]), dtype=np.uint64)
        row.copy_(torch.from_numpy(host.view(np.int64)))


def _first_half(out: NoiseDraw, w: torch.Tensor, lo: int, law, units: float):
    """whole and frac of the flat coordinates lo.. from their words ``w`` (int64); returns the
    tail coordinates' (flat indices, limits)."""
    # u = 2P - 1 at the bottom of P's interval (the error model covers the whole interval)
    u = w.to(torch.float64).mul_(2.0**-63)
    tail = (u.abs() > 1.0 - 2.0 * _TAIL_T).nonzero().squeeze(1)
    steps = law.quantile(u).mul_(units)  # s = X̂ scale / g: the noise in grid units
    limits = torch.zeros(0, dtype=torch.float32, device=w.device)
    if tail.numel():
        values, limits = _tail_steps(law, w[tail], units)
        steps[tail] = values
    whole = torch.round(steps)
    where = slice(lo, lo + len(w))
    out.whole.view(-1)[where] = whole
    out.frac.view(-1)[where] = steps.sub_(whole)
    return tail + lo, limits


def _tail_steps(law, w: torch.Tensor, units: float):
    """s and its certified limit for tail words, from T = min(P, 1 - P) taken exactly off the
    word's integer (no 1 - |u| cancellation) and the law's lower quantile (ndtri, log)."""
    lower = w < 0  # P < 1/2
    ones = torch.bitwise_xor(w, torch.bitwise_right_shift(w, 63))  # |w| (ones' complement)
    # T·2^64 at the middle of P's interval: K + 1/2 below 1/2, 2^64 - K - 1/2 above
    t = ((2**63 - 1) - ones).to(torch.float64).add_(0.5).mul_(2.0**-64)
    x = law.lower_quantile_tensor(t)
    x = torch.where(lower, x, -x)
    # |X̂ - X| <= B |X| + 2^-62 / T: the interval's half-width (2^-65 · 1.26 / T) and T's
    # float64 rounding, with the quantile's error B |X| (ndtri, log: checked against mpmath)
    limit = 0.5 - units * (_B * x.abs() + 2.0**-62 / t) - _ARITHMETIC_SLACK
    limit = torch.where(limit > 0.25, limit, torch.full_like(limit, -1.0))
    return x.mul_(units), (limit - 2.0**-24).to(torch.float32)  # rounded down to float32


# --------------------------------------------------------------------------- phase 2
def release_float32(noise: NoiseDraw, centre: torch.Tensor) -> torch.Tensor:
    """The engine's second half: j (``noise.whole``, float32, integer-valued) with j·g =
    round_g(centre + scale·X), exactly in law, for a float32 ``centre`` (m, d), left as it
    is.  Float32 throughout when |centre / g| < 2^23 - 2^16 (always, but for a sum some 4000
    noise scales from zero); float64 otherwise."""
    require(tuple(centre.shape) == noise.shape and centre.dtype == torch.float32,
            f"centre has shape {tuple(centre.shape)} ({centre.dtype}), the noise "
            f"{noise.shape} (float32)")  # fmt: skip
    noise.exact_count = 0
    if not centre.numel():
        return noise.whole
    lo, hi = torch.aminmax(centre)
    if not max(-float(lo), float(hi)) / noise.grid < _FLOAT32_RANGE:  # inf and nan too
        return noise.whole.copy_(release(noise, centre))
    a = torch.mul(centre, 1.0 / noise.grid, out=noise.scratch)  # exact: g = 2^e
    whole_a = torch.round(a, out=noise.scratch2)
    t = a.sub_(whole_a)  # the fractional part of centre / g, exactly
    noise.whole.add_(whole_a)
    q = torch.round(t.add_(noise.frac), out=noise.scratch2)
    noise.whole.add_(q)  # j = round(s) + round(centre / g) + round(t): integers, exact
    slack = t.sub_(q)  # signed, exact (Sterbenz)
    uncertain = _uncertain(noise, slack)
    if uncertain is not None:
        _exact_rows(noise, centre, noise.whole, uncertain)
    return noise.whole


def _uncertain(noise: NoiseDraw, slack: torch.Tensor) -> torch.Tensor | None:
    """The flat indices where |slack| exceeds the certified limit, NaN included (None when
    nowhere: the usual case, found by one reduction)."""
    low, high = torch.aminmax(slack)
    tail = slack.reshape(-1)[noise.tail_index].abs()
    tail_fails = ~(tail <= noise.tail_limit.to(tail.dtype))
    if max(-float(low), float(high)) <= noise.bulk_limit and not bool(tail_fails.any()):
        return None
    size = slack.abs().contiguous()
    judged = torch.where(tail_fails, torch.inf, 0.0).to(size.dtype)  # the tails: judged above
    size.view(-1)[noise.tail_index] = judged
    if math.isnan(float(low)) or math.isnan(float(high)):  # aminmax propagates NaN
        size = torch.nan_to_num_(size, nan=torch.inf)
    d, found = size.shape[1], []
    for row in (size.amax(dim=1) > noise.bulk_limit).nonzero().squeeze(1).tolist():
        found.append((size[row] > noise.bulk_limit).nonzero().squeeze(1) + row * d)
    return torch.cat(found) if found else None  # row-major: each row's in coordinate order


def release(noise: NoiseDraw, centre: torch.Tensor) -> torch.Tensor:
    """j with j·g = round_g(centre + scale·X), exactly in law (integer-valued float64, (m, d)),
    for a centre of any float dtype, in float64 (the numpy kinds; tests)."""
    require(tuple(centre.shape) == noise.shape,
            f"centre has shape {tuple(centre.shape)}, the noise {noise.shape}")  # fmt: skip
    noise.exact_count = 0
    v = centre.to(torch.float64).mul(1.0 / noise.grid)  # exact: g = 2^e
    v.add_(noise.whole.double()).add_(noise.frac.double())  # s, as float32 pieces: exact
    j = torch.round(v)
    span = float(v.abs().max()) + 1.0 if v.numel() else 0.0
    # |v - j| plus the float64 rounding of v (at most 2^-52 |v|) against the certificate
    # the float64 rounding of v (at most 2^-52 |v|) against the certificate
    slack = v.sub_(j).abs_().add_(2.0**-52 * span)
    uncertain = _uncertain(noise, slack)
    if uncertain is not None:
        _exact_rows(noise, centre.double(), j, uncertain)
    return j


def _exact_rows(noise: NoiseDraw, centre, j, flat: torch.Tensor) -> None:
    """The exact path for the coordinates at sorted flat indices ``flat``, row by row (each
    row's own stream supplies any further bits, in coordinate order)."""
    d = noise.shape[1]
    noise.exact_count += int(flat.numel())
    rows, cols = (flat // d).tolist(), (flat % d).tolist()
    words = [w & _WORD_MASK for w in noise.words[rows, cols].tolist()]  # as unsigned
    centres = centre.reshape(-1)[flat].double().cpu().tolist() if centre.is_contiguous() else \
        [float(centre[r, c]) for r, c in zip(rows, cols, strict=True)]  # fmt: skip
    for r, c, cell, w in zip(rows, cols, centres, words, strict=True):
        j[r, c] = exact_cell(cell, noise.scale, noise.grid, noise.law, w, noise.sources[r].words)


# --------------------------------------------------------------------------- exact path
def exact_cell(centre: float, scale: float, grid: float, law: str | NoiseLaw, word: int,
               more: Callable[[int], np.ndarray]) -> int:  # fmt: skip
    """The cell j with j·g = round_g(centre + scale·X), X = F^{-1}(P), decided exactly.

    P's first 64 bits are ``word`` with its top bit flipped (P in [K/2^64, (K+1)/2^64), K the
    word read as unsigned and xor 2^63, the fast path's (1 + u) / 2); ``more(1)`` supplies 64
    further bits whenever P's interval straddles a cell boundary.  Boundaries are compared in
    mpmath at a precision well above P's bits, twice (at p and p + 64 bits) to check that the
    tail probability is resolved; ties of measure zero (P on a boundary) go up.
    """
    import mpmath

    law = _law(law)
    require(math.isfinite(centre), f"a noisy sum's centre is not finite ({centre}): nothing "
            "is released")  # fmt: skip
    numerator, bits = (int(word) ^ _HALF_WORD), 64
    c, s, g = mpmath.mpf(centre), mpmath.mpf(scale), mpmath.mpf(grid)
    j = _guess(law, centre, scale, grid, numerator)
    while True:
        prec = bits + 64  # F(b) to 2^-(bits + 32) relative: far finer than P's interval
        # P's interval touching 0 or 1 maps to an unbounded set of cells: only more bits
        # can decide it (never comparisons, which would walk the cells one by one).
        side = None if numerator in (0, (1 << bits) - 1) else _side(law, c, s, g, j,
                                                                    numerator, bits, prec)
        if side == 0:
            return j
        if side is None:  # P's interval straddles a boundary: 64 more bits of P
            require(bits < _MAX_BITS, "the exact noise path read 4096 bits of one uniform "
                    "without deciding its cell: the bit source is broken (a real one does "
                    "this with probability below 2^-4000)")  # fmt: skip
            numerator = (numerator << 64) | int(more(1)[0])
            bits += 64
            if numerator not in (0, (1 << bits) - 1):  # jump near the cell: no long walk
                with mpmath.workprec(bits + 64):
                    j = _guess_mp(law, c, s, g, numerator, bits)
        else:
            j += side


def _side(law, c, s, g, j, numerator, bits, prec):
    import mpmath

    with mpmath.workprec(prec):
        return _side_of_cell(law, c, s, g, j, numerator, bits, prec)


def _guess_mp(law, c, s, g, numerator, bits) -> int:
    """The cell of P's interval midpoint, in mpmath at the working precision."""
    import mpmath

    p = (mpmath.mpf(numerator) + mpmath.mpf(0.5)) / mpmath.mpf(2) ** bits
    return int(mpmath.floor((c + s * law.quantile_mp(p)) / g + mpmath.mpf(0.5)))


def _guess(law, centre, scale, grid, numerator) -> int:
    """A first cell for the exact path (float64; the search walks from it to the right one)."""
    low = numerator < _HALF_WORD
    t = (numerator if low else (1 << 64) - numerator) * 2.0**-64 + 2.0**-65  # P's middle
    x = law.lower_quantile(t)
    return round((centre + scale * (x if low else -x)) / grid)


def _side_of_cell(law, c, s, g, j, numerator, bits, prec):
    """0 if all of P's interval maps into cell j, -1 / +1 if all of it maps below / above
    cell j's lower / upper boundary, None if it straddles one of them."""
    import mpmath

    # the boundaries in mpmath from the integer j: a float j ± 0.5 is not exact past 2^53
    below = _compare(law, ((mpmath.mpf(j) - 0.5) * g - c) / s, numerator, bits, prec)
    if below == -1:
        return -1
    above = _compare(law, ((mpmath.mpf(j) + 0.5) * g - c) / s, numerator, bits, prec)
    if above == 1:
        return 1
    if below == 1 and above == -1:
        return 0
    return None


def _compare(law, b, numerator, bits, prec) -> int | None:
    """-1 if P < F(b) on all of [N/2^L, (N+1)/2^L), +1 if P >= F(b) on all of it, None if
    F(b) may lie inside (or within the precision of) the interval."""
    import mpmath

    low, high = numerator, numerator + 1  # the interval, in units of 2^-bits
    if b == 0:
        half = 1 << (bits - 1)  # F(0) = 1/2 exactly
        return -1 if high <= half else 1 if low >= half else None
    tail, tol = _tail(law, abs(b), prec)
    scale = mpmath.mpf(2) ** bits
    if b < 0:  # F(b) = P(X > -b): compare P itself with the tail
        if high <= tail * (1 - tol) * scale:
            return -1
        return 1 if low >= tail * (1 + tol) * scale else None
    # b > 0: F(b) = 1 - tail; compare 1 - P, in (2^L - high, 2^L - low] units, with the tail
    whole = 1 << bits
    if whole - high >= tail * (1 + tol) * scale:
        return -1
    return 1 if whole - low <= tail * (1 - tol) * scale else None


def _tail(law, b, prec):
    """P(X > b) at ``prec`` bits with a relative tolerance that covers its error: computed at
    prec and prec + 64 bits, the tolerance is 2^-(prec - 32) when they agree to a quarter."""
    import mpmath

    with mpmath.workprec(prec + 64):
        finer = law.upper_tail(b)
    with mpmath.workprec(prec):
        value = law.upper_tail(b)
        tol = mpmath.mpf(2) ** (-(prec - 32))
        require(value > 0 and abs(finer - value) <= tol * value / 4,
                "the exact noise path could not resolve a tail probability")  # fmt: skip
        return value, tol


# --------------------------------------------------------------------------- numpy
def release_numpy(centre, scale: float, rng: np.random.Generator | BitSource,
                  law: str | NoiseLaw = "gaussian") -> np.ndarray:  # fmt: skip
    """round_g(centre + scale·X) for the numpy algorithms: float64, the grid values j·g,
    exactly in law, one word of ``rng`` per value (a numpy Generator's raw bits, or a bit
    source) in C order.  ``scale`` 0 (a noise-free baseline, allowed by the caller only with
    ``unsafe_zero_noise``) returns the centre as it is."""
    centre = np.asarray(centre, dtype=np.float64)
    if scale == 0:
        return centre.copy()
    source = GeneratorBits(rng) if isinstance(rng, np.random.Generator) else rng
    flat = np.ascontiguousarray(centre).reshape(1, -1)
    noise = draw([source], flat.shape[1], scale, law)
    cells = release(noise, torch.from_numpy(flat))
    return (cells.numpy() * noise.grid).reshape(centre.shape)


def secret_normals(rng: np.random.Generator | BitSource, shape, scale: float) -> np.ndarray:
    """scale·X, X standard normals that are never released themselves (DECOR's pairwise
    secrets, which cancel in the network's sum and enter a release only inside its centre):
    X = F^{-1}(P) in float64 from a 64-bit P, within 2^-44 (1 / min(P, 1 - P) + |X|) of the
    real quantile (the error model above; MATH.md §10 bounds what that changes), computed in
    mpmath where P is within 2^-20 of 0 or 1."""
    import mpmath
    source = GeneratorBits(rng) if isinstance(rng, np.random.Generator) else rng
    count = int(np.prod(shape))
    words = source.words(count)
    u = torch.from_numpy(words.view(np.int64).copy()).to(torch.float64).mul_(2.0**-63)
    values = LAWS["gaussian"].quantile(u).numpy()
    for k in np.flatnonzero(1.0 - np.abs(u.numpy()) < 2.0 * _TAIL):
        with mpmath.workprec(128):
            p = (mpmath.mpf(int(words[k]) ^ _HALF_WORD) + mpmath.mpf(0.5)) / mpmath.mpf(2) ** 64
            values[k] = float(LAWS["gaussian"].quantile_mp(p))
    return scale * values.reshape(shape)


# --------------------------------------------------------------------------- the mechanism
Params = dict  # {name: (m, *shape) tensor}: stacked parameters of m nodes


class GaussianRelease:
    """The noise mechanism of every private step: node i's noisy sum released as
    round_g(S_i + sigma X_i), exactly in law (this module's doc).

    ``start`` (data-free: it may run on a worker thread while the sums are computed) draws the
    d words of every node, in parameter order, from its stream; ``noisy_sums`` replaces sums
    by the released G (rounded to the sums' dtype: post-processing); ``noisy_step`` writes
    x - step_size·G, the message, computed from G alone.  Any mechanism with these three
    methods can stand in (the audit's deliberately broken ones, :mod:`dpdl.audit.legacy_noise`).
    """

    name = "exact-gaussian-grid"
    certified = True
    law = "gaussian"

    def start(self, generators, d: int, sigma: float, *, device=None,
              reuse: NoiseDraw | None = None) -> NoiseDraw:  # fmt: skip
        return draw(generators, d, sigma, self.law, device=device, reuse=reuse)

    def noisy_sums(self, noise: NoiseDraw, sums: Params) -> Params:
        noise.exact_count = 0
        for block, flat in _blocks(noise, sums):
            torch.mul(_release_block(block, flat), noise.grid, out=flat)
            noise.exact_count += block.exact_count
        return sums

    def noisy_step(self, noise: NoiseDraw, x: Params, sums: Params, step_size: float,
                   out: Params) -> Params:  # fmt: skip
        """out = x - step_size·G; ``out`` may be ``sums`` (each block is read before written)."""
        noise.exact_count = 0
        for (block, flat), name in zip(_blocks(noise, sums), sums, strict=True):
            j = _release_block(block, flat)
            noise.exact_count += block.exact_count
            torch.add(x[name].reshape(flat.shape), j, alpha=-step_size * noise.grid,
                      out=out[name].view(flat.shape))  # fmt: skip
        return out


def _release_block(block: NoiseDraw, flat):
    """j of one parameter's block: float32 sums take the float32 second half."""
    if flat.dtype == torch.float32:
        return release_float32(block, flat)
    return release(block, flat).to(flat.dtype)


def _blocks(noise: NoiseDraw, sums: Params):
    """(the draw's columns of one parameter, that parameter's (m, size) view) in order."""
    lo = 0
    for tensor in sums.values():
        flat = tensor.view(tensor.shape[0], -1)
        yield noise.columns(lo, lo + flat.shape[1]), flat
        lo += flat.shape[1]
    require(lo == noise.shape[1], f"the noise has {noise.shape[1]} columns, the sums {lo}")
