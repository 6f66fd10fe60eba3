"""The exact noise release (MATH.md §10) against first principles: mpmath quantiles and the
exact cell probabilities of a rounded Gaussian / Laplace, never the code under test."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
import torch
from scipy import stats

from dpdl.algorithms import noise
from dpdl.algorithms.randomness import SecretStream
from dpdl.errors import DPDLError


class Words:
    """A bit source that hands out given words, then counts what it was asked for."""

    def __init__(self, words):
        self.queue, self.asked = [int(w) for w in words], 0

    def words(self, count):
        self.asked += count
        taken, self.queue = self.queue[:count], self.queue[count:]
        return np.array(taken + [0] * (count - len(taken)), dtype=np.uint64)


def first_principles(centre, scale, law, numerator, bits):
    """The cell of P's interval midpoint, in mpmath: round((c + s F^{-1}(P)) / g)."""
    g = noise.grid_step(scale)
    with mpmath.workprec(2 * bits + 200):
        p = (mpmath.mpf(numerator) + mpmath.mpf(0.5)) / mpmath.mpf(2) ** bits
        x = noise.LAWS[law].quantile_mp(p)
        return int(mpmath.floor((mpmath.mpf(centre) + scale * x) / g + mpmath.mpf(0.5)))


def released_cells(centres, scale, law, words):
    drawn = noise.draw([Words(words)], len(words), scale, law)
    return noise.release(drawn, torch.as_tensor(np.asarray(centres)[None, :])).numpy()[0]


def test_the_grid_is_a_power_of_two_between_2e_11_and_2e_10_of_the_scale():
    for scale in (1e-30, 0.001, 0.7, 1.0, 2.0, 3.0, 1e12):
        g = noise.grid_step(scale)
        assert math.frexp(g)[0] == 0.5  # a power of two
        assert 2.0**-11 * scale < g <= 2.0**-10 * scale
    with pytest.raises(DPDLError, match="noise scale must be positive"):
        noise.grid_step(0.0)


@pytest.mark.parametrize("law", ["gaussian", "laplace"])
def test_the_fast_path_gives_the_cell_of_first_principles(law, rng):
    """2000 random words and centres (centres up to 10^6 scales): every cell the vectorised
    release gives is the mpmath cell of P's 64-bit interval."""
    words = rng.integers(0, 2**64, size=2000, dtype=np.uint64)
    scale = 0.37
    centres = rng.normal(size=2000) * np.logspace(-3, 6, 2000) * scale
    cells = released_cells(centres, scale, law, words)
    for c, w, j in zip(centres, words, cells, strict=True):
        assert j == first_principles(c, scale, law, int(w) ^ (1 << 63), 64)


@pytest.mark.parametrize("law", ["gaussian", "laplace"])
def test_a_p_interval_straddling_a_boundary_is_refined_with_more_bits(law, rng):
    """P's 64-bit interval is made to contain a cell boundary exactly: the exact path asks the
    stream for more bits until the cell is decided, and decides the cell of first principles
    at the refined P."""
    scale = 1.3
    g = noise.grid_step(scale)
    for _ in range(40):
        c = float(rng.normal() * 4)
        j = round(c / g) + int(rng.integers(-4000, 4000))
        with mpmath.workprec(400):
            b = ((j + mpmath.mpf(0.5)) * g - c) / scale
            tail = noise.LAWS[law].upper_tail(abs(b))
            boundary = 1 - tail if b > 0 else tail
            k = int(mpmath.floor(boundary * mpmath.mpf(2) ** 64))
        extra = [int(x) for x in rng.integers(0, 2**64, size=4, dtype=np.uint64)]
        source = Words(extra)
        cell = noise.exact_cell(c, scale, g, law, k ^ (1 << 63), source.words)
        assert source.asked >= 1  # it had to look further than 64 bits
        numerator = k
        for word in extra[: source.asked]:
            numerator = (numerator << 64) | word
        assert cell == first_principles(c, scale, law, numerator, 64 * (1 + source.asked))


def test_the_tails_are_unbounded_and_exact():
    """P in the first 2^-64 (all 64 bits zero, the old sampler's 9.42 sigma wall): further
    bits reach further into the tail, exactly where first principles put them."""
    scale, c = 1.0, 0.0
    for second in (2**60, 2**20, 3):
        source = Words([second])  # then zeros, if it asks for more
        j = noise.exact_cell(c, scale, noise.grid_step(scale), "gaussian", 1 << 63, source.words)
        numerator = second << (64 * (source.asked - 1))
        assert j == first_principles(c, scale, "gaussian", numerator, 64 * (1 + source.asked))
    assert j * noise.grid_step(scale) < -12.9  # P < 2^-126: beyond 12.9 sigma
    # through the vectorised release too (the fast path never certifies the tails): the
    # third word refines the first coordinate's P, the second's is decided at once
    drawn = noise.draw([Words([1 << 63, (1 << 63) - 1, 2**20])], 2, 1.0, "gaussian")
    cells = noise.release(drawn, torch.zeros((1, 2), dtype=torch.float64)).numpy()[0]
    assert cells[0] == first_principles(0.0, 1.0, "gaussian", 2**20, 128) < -11.9 * 1024
    top = first_principles(0.0, 1.0, "gaussian", ((1 << 64) - 1) << 64, 128)  # then zeros
    assert cells[1] == top > 9 * 1024
    # P's interval stuck at 0 (a source of zeros) decides no cell: refused, after 4096 bits
    with pytest.raises(DPDLError, match="read 4096 bits"):
        released_cells([0.0, 0.0], 1.0, "gaussian", [1 << 63, (1 << 63) - 1])


def test_a_centre_on_a_boundary_with_p_at_one_half_is_decided_exactly():
    """b = 0 (the centre exactly on a cell boundary) makes F(b) = 1/2 a dyadic number: the
    comparison is exact, and P's interval starting at 1/2 lies above it (no endless
    refinement)."""
    scale = 1.0
    g = noise.grid_step(scale)
    c = 7.5 * g
    source = Words([])
    assert noise.exact_cell(c, scale, g, "gaussian", 0, source.words) == 8  # P in [1/2, ..)
    assert source.asked == 0
    below = noise.exact_cell(c, scale, g, "gaussian", (1 << 64) - 1, source.words)
    assert below == 7  # P in [1/2 - 2^-64, 1/2)


@pytest.mark.parametrize(("law", "cdf"), [("gaussian", stats.norm.cdf),
                                          ("laplace", stats.laplace.cdf)])
def test_the_released_cells_have_the_law_of_the_rounded_mechanism(law, cdf):
    """400 000 releases at one centre: the counts of cells (grouped 256 grid steps a bin)
    match the exact probabilities of round_g(c + s X) (chi-square), and so do the low bits
    of j (the structure a lattice attack reads: uniform, as for a real Gaussian)."""
    scale, c, count = 0.8, 0.3141, 400_000
    stream = SecretStream(bytes(range(32)))
    drawn = noise.draw([stream], count, scale, law)
    j = noise.release(drawn, torch.full((1, count), c, dtype=torch.float64)).numpy()[0]
    g = drawn.grid
    edges = np.arange(-8 * 1024, 8 * 1024 + 1, 256)  # bins of 256 cells, +-8 scales
    inner = (j >= edges[0]) & (j < edges[-1])
    observed = np.histogram(j[inner], bins=edges)[0]
    bounds = cdf(((edges - 0.5) * g - c) / scale)
    expected = np.diff(bounds) * count
    keep = expected > 20
    assert stats.chisquare(observed[keep], expected[keep] * observed[keep].sum()
                           / expected[keep].sum()).pvalue > 1e-4  # fmt: skip
    low = np.bincount((j.astype(np.int64) % 64), minlength=64)
    assert stats.chisquare(low).pvalue > 1e-4


def test_the_quantile_functions_meet_the_error_model_the_certificate_assumes(rng):
    """|X̂ - X| <= 2^-44 (1/T + |X|) with T = min(P, 1 - P): checked at 20 000 points spread
    over T in [2^-20, 1/2] for both laws, on the CPU, against mpmath at 200 bits, with 256
    times of room (the observed worst is about 1400 times below the margin)."""
    exponents = rng.uniform(-20, -1, size=20_000)
    t = np.minimum(2.0**exponents * rng.uniform(1, 2, size=exponents.size), 0.5)
    u = np.where(rng.random(t.size) < 0.5, 1 - 2 * t, -(1 - 2 * t))
    for name, law in noise.LAWS.items():
        xhat = law.quantile(torch.as_tensor(u, dtype=torch.float64)).numpy()
        worst = 0.0
        with mpmath.workprec(200):
            for ui, xi in zip(u[::10], xhat[::10], strict=True):
                exact = law.quantile_mp((1 + mpmath.mpf(ui)) / 2)
                teff = (1 - abs(ui)) / 2
                worst = max(worst, float(abs(mpmath.mpf(xi) - exact)) / (1 / teff + abs(xi)))
        assert worst < 2.0**-44 / 2**8, (name, worst)


def test_the_fast_path_certifies_nearly_everything_and_the_two_halves_agree(rng):
    """The exact path is the exception (a few coordinates in 10^6), and the engine's float32
    second half gives the float64 one's cells, bit for bit."""
    count = 1_000_000
    centre = torch.as_tensor(rng.normal(size=(1, count)) * 3, dtype=torch.float32)
    drawn = noise.draw([SecretStream(bytes(32))], count, 0.5)
    j32 = noise.release_float32(drawn, centre).clone()
    assert drawn.exact_count <= 10
    again = noise.draw([SecretStream(bytes(32))], count, 0.5)
    assert torch.equal(noise.release(again, centre), j32.double())


def test_release_numpy_keeps_shapes_and_zero_scale_is_the_centre():
    centre = np.arange(12.0).reshape(3, 4)
    out = noise.release_numpy(centre, 0.5, np.random.default_rng(0))
    g = noise.grid_step(0.5)
    assert out.shape == (3, 4) and np.all(out / g == np.round(out / g))
    assert np.array_equal(noise.release_numpy(centre, 0.0, np.random.default_rng(0)), centre)


def test_secret_normals_are_standard_normals_with_unbounded_tails():
    rng = np.random.default_rng(1)
    z = noise.secret_normals(rng, (200_000,), 2.0) / 2.0
    assert stats.kstest(z, "norm").pvalue > 1e-4
    words = Words([1 << 63])  # P in [0, 2^-64): the mpmath branch, not erfinv's infinity
    value = noise.secret_normals(words, (1,), 1.0)[0]
    assert math.isfinite(value) and value < -9.0


@pytest.mark.parametrize("law", ["gaussian", "laplace"])
def test_the_tail_quantiles_meet_their_error_model(law, rng):
    """Tail words (min(P, 1 - P) < 2^-8, both sides, down to 2^-60) give s = X̂ scale / g with
    |X̂ - X(P)| <= 2^-44 |X| + 2^-62 / T at P's interval (mpmath at 200 bits), 128 times over
    (the worst of these 400 is 1.1e-15 at |X| = 4.29, 1/248 of the bound: about an ulp)."""
    exponents = rng.uniform(8, 60, size=400)
    k = np.floor(2.0 ** (64 - exponents)).astype(np.uint64)  # K = T 2^64 from the tail's end
    words = np.where(rng.random(400) < 0.5, k ^ np.uint64(1 << 63), ~k ^ np.uint64(1 << 63))
    w = torch.from_numpy(words.astype(np.uint64).view(np.int64))
    steps, _ = noise._tail_steps(noise.LAWS[law], w, 1.0)
    with mpmath.workprec(200):
        for word, x_hat in zip(words.tolist(), steps.tolist(), strict=True):
            numerator = int(word) ^ (1 << 63)
            p = (mpmath.mpf(numerator) + mpmath.mpf(0.5)) / mpmath.mpf(2) ** 64
            exact = noise.LAWS[law].quantile_mp(p)
            t = float(min(p, 1 - p))
            bound = 2.0**-44 * abs(float(exact)) + 2.0**-62 / t
            assert float(abs(mpmath.mpf(x_hat) - exact)) < bound / 2**7


@pytest.mark.parametrize("centre", [2.0**50, -(2.0**55) + 3.0])
def test_the_exact_path_decides_cells_beyond_2_to_the_53(centre):
    """A centre 2^61 grid steps out (a correlated centre far above σ): the boundaries j ± 1/2
    must be exact, not float64 (which made the search alternate between two cells forever).
    The reference: the cell of both ends of P's 64-bit interval at 256 bits in mpmath."""
    scale, grid = 1.0, 2.0**-11
    rng = np.random.default_rng(5)

    def more(count):
        raise AssertionError("P's first 64 bits already decide the cell")

    for word in rng.integers(0, 2**63, size=4, dtype=np.uint64).tolist():
        got = noise.exact_cell(centre, scale, grid, "gaussian", word, more)
        with mpmath.workprec(256):
            k = int(word) ^ (1 << 63)
            ends = [mpmath.mpf(k + e) / mpmath.mpf(2) ** 64 for e in (0, 1)]
            cells = {int(mpmath.floor((mpmath.mpf(centre) + scale * mpmath.sqrt(2)
                                       * mpmath.erfinv(2 * p - 1)) / grid + mpmath.mpf(0.5)))
                     for p in ends}  # fmt: skip
        assert cells == {got}
        assert abs(got) > 2**53
