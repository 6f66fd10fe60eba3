"""Fast, vectorised PLD of Poisson-subsampled Gaussian steps and their Fourier composition.

Private helper of ``dpdl.accounting.certified`` (MATH.md §2, "Rigorous accounting").

1. :func:`subsampled_gaussian_pmfs` builds the same pessimistic connect-the-dots PMFs as
   ``dp_accounting.pld.privacy_loss_distribution.from_gaussian_mechanism(z,
   sampling_prob=p, pessimistic_estimate=True, value_discretization_interval=d)``
   (add/remove adjacency, ``log_mass_truncation_bound=-50``), with the same formulas, grid
   and rounding, but evaluated with numpy/scipy vector operations instead of one Python
   call per grid point (dp_accounting needs 0.2-0.9 s per multiplier at d = 1e-4; this
   takes a few ms). The test suite checks the two agree entry by entry.
2. :func:`compose` convolves the PMFs of every step at once in the Fourier domain: every
   distinct multiplier's PMF is folded onto one circular grid of length N, transformed
   once, raised to its multiplicity and multiplied into an accumulator; one inverse
   transform gives the composed PMF. The kept window [lo, hi] of losses: hi is a Chernoff
   bound on the composed loss (as in dp_accounting's ``self_convolve``), evaluated exactly
   over all steps at orders picked by a Brent search on a few representative multipliers;
   the mass above hi (≤ ``tail_mass_truncation``, which may alias into the window) is added
   to the infinity mass. lo ≤ 0 comes from the same search (approximate): mass below it has
   negative loss, so it either falls outside the window (no δ at any ε ≥ 0) or wraps
   upwards (only raises δ). FFT round-off is clipped up. δ(ε) therefore keeps dp_accounting's
   upper-bound (pessimistic) semantics; the result equals dp_accounting's one-by-one
   composition at the same grid to ~1e-9 relative (tested).
3. :func:`compose_schedules` composes several schedules over the same multipliers (the
   binned upper bound and its lower companion): each multiplier's PMF, transform and
   complex logarithm are computed once and Σ c·Log F is accumulated per schedule. Each
   step's grid there starts at loss −3 and ends where its δ ≤ 1e-20 (both pessimistic,
   see the constants), which shrinks the composed grid several times over.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from scipy import fft as sp_fft
from scipy.optimize import minimize_scalar
from scipy.special import log_ndtr, ndtr, ndtri

from dpdl.errors import DPDLError

LOG_MASS_TRUNCATION_BOUND = -50.0  # dp_accounting's default for the Gaussian mechanism
TAIL_MASS_TRUNCATION = 1e-15  # dp_accounting's default per composition
MAX_PMF_POINTS = 5_000_000  # one step's loss grid; beyond this memory use gets out of hand
MAX_FOURIER_POINTS = 1 << 25  # the composed loss grid (a few hundred MB of spectra)
_PILOT_GROUPS = 8
# compose_schedules: each step's grid starts at −LUMP_LOSS_FLOOR, smaller losses moved up to
# it (pessimistic). It drops a long, nearly empty left tail (mostly the round-off of
# δ ≈ 1 − e^ε in the connect-the-dots construction) that widened the composed grid 4×.
LUMP_LOSS_FLOOR = 3.0
# compose_schedules: each step's grid ends where its δ ≤ TAIL_DELTA (the rest is infinity
# mass, K·TAIL_DELTA in all: 1e-16 for K = 1e4)
TAIL_DELTA = 1e-20
_LOG_ZERO = -1e3
_WINDOW_MARGIN = 1.15


@dataclass(frozen=True)
class GridPmf:
    """Losses ``(lower_index + arange(len(probs))) * discretization`` with ``probs``."""

    lower_index: int
    probs: np.ndarray
    infinity_mass: float


def _loss_remove(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """ln(mu_upper/mu_lower) for REMOVE: ln(1 − q + q·exp((−1/2 − x)/σ²))."""
    unsampled = (-0.5 - x) / sigma**2
    if q == 1.0:
        return unsampled
    return np.logaddexp(unsampled + math.log(q), math.log1p(-q))


def _loss_add(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """ADD loss, −loss_remove(−x) by the symmetry of the Gaussian."""
    return -_loss_remove(-x, sigma, q)


def _deltas_remove(epsilons: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """Hockey-stick divergence δ(ε) of the REMOVE pair on a grid of ε.

    dp_accounting evaluates mu_upper_cdf(x) − e^ε·mu_lower_cdf(x) at x = inverse_privacy_loss(ε).
    With s = (e^ε − 1)/q, the unsubsampled loss is ln(1 + s), x = −1/2 − σ² ln(1 + s) and
    δ = q·[Φ((x + 1)/σ) − (1 + s)·Φ(x/σ)], one expm1, one log1p and two Φ per point.
    Below ε = ln(1 − q) the divergence is 1 − e^ε.
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = np.expm1(epsilons) / q
        log_ratio = np.log1p(scaled)
        x_over_sigma = -0.5 / sigma - log_ratio * sigma
        deltas = q * (ndtr(x_over_sigma + 1.0 / sigma) - (1.0 + scaled) * ndtr(x_over_sigma))
    if q < 1.0:
        below = epsilons <= math.log1p(-q)
        deltas = np.where(below, -np.expm1(epsilons), deltas)
    return np.clip(np.nan_to_num(deltas, nan=0.0), 0.0, 1.0)


def _deltas_add(epsilons: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """Hockey-stick divergence δ(ε) of the ADD pair on a grid of ε (zero for ε ≥ −ln(1 − q)).

    With u = (e^{−ε} − 1)/q, x = 1/2 + σ² ln(1 + u) and
    δ = Φ(x/σ) − e^ε[(1 − q)Φ(x/σ) + qΦ((x − 1)/σ)] = q·e^ε·[(1 + u)Φ(x/σ) − Φ((x − 1)/σ)].
    """
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scaled = np.expm1(-epsilons) / q
        log_ratio = np.log1p(scaled)
        x_over_sigma = 0.5 / sigma + log_ratio * sigma
        deltas = (q * np.exp(epsilons)) * (
            (1.0 + scaled) * ndtr(x_over_sigma) - ndtr(x_over_sigma - 1.0 / sigma)
        )
    deltas = np.where(epsilons >= -math.log1p(-q), 0.0, deltas)
    return np.clip(np.nan_to_num(deltas, nan=0.0), 0.0, 1.0)


def _loss_replace(x: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """REPLACE loss (one record's contribution +1 in one data set, −1 in the other):
    ln[(1 − q)φ(x) + qφ(x + 1)] − ln[(1 − q)φ(x) + qφ(x − 1)] = loss_remove(x) + loss_add(x)."""
    return _loss_remove(x, sigma, q) + _loss_add(x, sigma, q)


def _asinh_exp(log_a: np.ndarray) -> np.ndarray:
    """asinh(e^a) without overflow: a + ln(1 + sqrt(1 + e^{−2a})) for a > 0."""
    with np.errstate(over="ignore"):
        small = np.arcsinh(np.exp(np.minimum(log_a, 0.0)))
        large = log_a + np.log1p(np.sqrt(1.0 + np.exp(-2.0 * np.maximum(log_a, 0.0))))
    return np.where(log_a > 0, large, small)


def _inverse_loss_replace(epsilons: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """The largest x with loss_replace(x) ≥ ε (dp_accounting's closed form):
    x = σ²·(asinh(−sinh(ε/2)·α) − ε/2), α = e^{1/(2σ²)}(1 − q)/q (x = −σ²ε/2 at q = 1)."""
    if q == 1.0:
        return -0.5 * epsilons * sigma**2
    half = 0.5 * np.abs(epsilons)
    with np.errstate(divide="ignore"):
        log_sinh = half + np.log(-np.expm1(-2.0 * half)) - math.log(2.0)
    log_alpha = 0.5 / sigma**2 + math.log1p(-q) - math.log(q)
    asinh = -np.sign(epsilons) * _asinh_exp(log_alpha + log_sinh)
    return np.where(epsilons == 0, 0.0, sigma**2 * (asinh - 0.5 * epsilons))


def _deltas_replace(epsilons: np.ndarray, sigma: float, q: float) -> np.ndarray:
    """Hockey-stick divergence δ(ε) of the REPLACE pair on a grid of ε, as dp_accounting
    evaluates it: upper_cdf(x) − e^{ε + ln lower_cdf(x)} at x = inverse_loss(ε), with
    upper = (1 − q)N(0, σ²) + qN(−1, σ²) and lower = (1 − q)N(0, σ²) + qN(1, σ²)."""
    x = _inverse_loss_replace(epsilons, sigma, q)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if q == 1.0:
            upper = ndtr((x + 1.0) / sigma)
            log_lower = log_ndtr((x - 1.0) / sigma)
        else:
            upper = (1.0 - q) * ndtr(x / sigma) + q * ndtr((x + 1.0) / sigma)
            log_lower = np.logaddexp(math.log1p(-q) + log_ndtr(x / sigma),
                                     math.log(q) + log_ndtr((x - 1.0) / sigma))  # fmt: skip
        deltas = upper - np.exp(epsilons + log_lower)
    return np.clip(np.nan_to_num(deltas, nan=0.0), 0.0, 1.0)


# The adjacency directions of each neighbouring relation (MATH.md Conventions): add/remove
# has two (a PLD pair), replace-one one (its pair is symmetric under x → −x).
RELATION_SIDES = {"add-remove": ("remove", "add"), "replace-one": ("replace",)}


def _side(side: str, lower_x: float, upper_x: float):
    """(lowest x, highest x, loss, δ) of one direction: dp_accounting's truncation, the
    lower end shifted by the sensitivity for REMOVE and REPLACE, the upper one for ADD."""
    return {
        "remove": (lower_x - 1.0, upper_x, _loss_remove, _deltas_remove),
        "add": (lower_x, upper_x + 1.0, _loss_add, _deltas_add),
        "replace": (lower_x - 1.0, upper_x, _loss_replace, _deltas_replace),
    }[side]


def _sides(relation: str, sample_rate: float) -> tuple[str, ...]:
    """The directions composed: REMOVE alone at p = 1 under add/remove (then symmetric)."""
    sides = RELATION_SIDES[relation]
    return sides[:1] if sample_rate == 1.0 else sides


def _connect_dots_fixed_gap(
    discretization: float, lower: int, upper: int, deltas: np.ndarray
) -> GridPmf:
    """dp_accounting's ``create_pmf_pessimistic_connect_dots_fixed_gap``, returned as arrays."""
    if lower == upper:
        return GridPmf(lower, np.array([1.0 - deltas[0]]), float(deltas[0]))
    deltas = np.minimum.accumulate(deltas)
    diffs = np.diff(deltas)
    probs = np.empty_like(deltas)
    probs[0] = 1.0 - deltas[0] + diffs[0] / math.expm1(discretization)
    probs[1:-1] = (diffs[1:] - diffs[:-1] * math.exp(discretization)) / math.expm1(discretization)
    probs[-1] = diffs[-1] / math.expm1(-discretization)
    return GridPmf(lower, np.maximum(0.0, probs), float(deltas[-1]))


def subsampled_gaussian_pmfs(
    noise_multiplier: float,
    sample_rate: float,
    discretization: float,
    *,
    loss_floor: float | None = None,
    tail_delta: float | None = None,
    relation: str = "add-remove",
) -> tuple[GridPmf, GridPmf | None]:
    """The connect-the-dots PMFs of one Poisson(p)-subsampled Gaussian step: (REMOVE, ADD)
    under ``relation="add-remove"`` (ADD ``None`` when p = 1, symmetric), (REPLACE, None)
    under ``"replace-one"`` (dp_accounting's ``REPLACE_ONE``: symmetric).

    Sensitivity 1 (each record's contribution has norm ≤ 1), noise std ``noise_multiplier``.
    By default the grid is dp_accounting's. Two pessimistic shortcuts narrow it:
    ``loss_floor`` starts it at −loss_floor (the construction then puts the mass of all
    smaller losses on the first point, a move to larger losses), and ``tail_delta`` ends it
    at the first loss (on a 1000-point coarse scan) where δ ≤ tail_delta, which becomes the
    infinity mass.
    """
    sigma, q, d = float(noise_multiplier), float(sample_rate), float(discretization)
    lower_x = sigma * float(ndtri(0.5 * math.exp(LOG_MASS_TRUNCATION_BOUND)))
    sides: list[GridPmf | None] = []
    for side in _sides(relation, q):
        lo_x, hi_x, loss, deltas_fn = _side(side, lower_x, -lower_x)
        eps_upper = float(loss(np.array(lo_x), sigma, q))
        eps_lower = float(loss(np.array(hi_x), sigma, q))
        upper = math.ceil(eps_upper / d)
        lower = math.floor(eps_lower / d)
        if loss_floor is not None:
            lower = min(max(lower, -math.floor(loss_floor / d)), upper)
        if tail_delta is not None and upper - lower > 1000:
            coarse = np.linspace(lower, upper, 1001)
            small = np.flatnonzero(deltas_fn(coarse * d, sigma, q) <= tail_delta)
            if small.size:
                upper = max(math.ceil(coarse[small[0]]), lower)
        if upper - lower + 1 > MAX_PMF_POINTS:
            raise DPDLError(
                f"noise multiplier {sigma!r} at value_discretization={d!r} needs a privacy-loss "
                f"grid of {upper - lower + 1} points; use a coarser value_discretization"
            )
        epsilons = np.arange(lower, upper + 1, dtype=np.float64) * d
        sides.append(_connect_dots_fixed_gap(d, lower, upper, deltas_fn(epsilons, sigma, q)))
    if len(sides) == 1:
        sides.append(None)
    return sides[0], sides[1]


def _log_mgf(probs: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """ln Σ_j probs_j e^{t j} (j = 0, 1, ... relative to the PMF's first loss) per order t."""
    with np.errstate(divide="ignore"):
        log_probs = np.log(probs)
    index = np.arange(probs.size, dtype=np.float64)
    out = np.empty(orders.size)
    work = np.empty_like(index)
    for position, order in enumerate(orders):
        np.multiply(index, order, out=work)
        work += log_probs
        peak = work.max()
        work -= peak
        np.exp(work, out=work)
        out[position] = peak + math.log(work.sum())
    return out


def _tail_index(log_mgf_total: float | np.ndarray, orders: np.ndarray, tail: float) -> float:
    """Chernoff: P(S ≥ b) ≤ e^{ln E e^{tS} − t b} ≤ tail for b = (ln E e^{tS} + ln(1/tail))/t."""
    return float(np.min((np.asarray(log_mgf_total) - math.log(tail)) / orders))


def _fold_rfft(probs: np.ndarray, length: int) -> np.ndarray:
    """rfft of ``probs`` wrapped modulo ``length`` (circular convolution keeps all mass)."""
    if probs.size > length:
        rows = -(-probs.size // length)
        padded = np.zeros(rows * length)
        padded[: probs.size] = probs
        probs = padded.reshape(rows, length).sum(axis=0)
    return sp_fft.rfft(probs, n=length)


@dataclass
class _Plan:
    """Fourier grid of one adjacency direction: circular length and Chernoff orders."""

    length: int
    window_low: int  # absolute loss index (loss / discretization) of the first kept loss, ≤ 0
    orders: np.ndarray  # positive orders for the rigorous right-tail bound


class _Side:
    """Accumulates one adjacency direction (REMOVE or ADD) of the composition."""

    _SUBNORMAL_EVERY = 32

    def __init__(self, plan: _Plan):
        self.plan = plan
        self.log_mgf = np.zeros(plan.orders.size)
        self.spectrum = np.ones(plan.length // 2 + 1, dtype=np.complex128)
        self.lower_index = 0
        self.support_top = 0  # largest relative index with mass: Σ c_k (len_k − 1)
        self.log_finite_mass = 0.0  # ln Π (1 − infinity_mass_k)^{c_k}
        self.steps_added = 0

    def add_moments(self, pmf: GridPmf, count: int, log_mgf: np.ndarray | None = None) -> None:
        """Everything but the spectrum: Chernoff moments, offsets, support, infinity mass."""
        if log_mgf is None:
            log_mgf = _log_mgf(pmf.probs, self.plan.orders)
        # absolute coordinates: ln E e^{t·(lower + j)} = t·lower + ln E e^{t j}
        self.log_mgf += count * (log_mgf + self.plan.orders * pmf.lower_index)
        self.lower_index += count * pmf.lower_index
        self.support_top += count * (pmf.probs.size - 1)
        self.log_finite_mass += count * math.log1p(-pmf.infinity_mass)

    def add(self, pmf: GridPmf, count: int) -> None:
        self.add_moments(pmf, count)
        transform = _fold_rfft(pmf.probs, self.plan.length)
        self.spectrum *= transform if count == 1 else transform**count
        self.steps_added += 1
        if self.steps_added % self._SUBNORMAL_EVERY == 0:
            # values this small are zero for every purpose; subnormals only slow products down
            self.spectrum[np.abs(self.spectrum) < 1e-250] = 0.0

    def composed_spectrum(self) -> np.ndarray:
        return self.spectrum

    def window(self, tail: float) -> tuple[int, int, float]:
        """Kept relative indices [low, high] and the mass the Chernoff bound allows above."""
        low = max(self.plan.window_low - self.lower_index, 0)
        top = math.ceil(_tail_index(self.log_mgf, self.plan.orders, tail)) - self.lower_index
        if top >= self.support_top:
            return low, self.support_top, 0.0
        return low, max(top, low), tail

    def finish(self, discretization: float, tail: float) -> pld_pmf.DensePLDPmf | None:
        low, high, right_mass = self.window(tail)
        if high - low + 1 > self.plan.length:
            return None  # the circular grid was too short: the caller retries with a longer one
        circular = sp_fft.irfft(self.composed_spectrum(), n=self.plan.length)
        window = np.roll(circular, -low)[: high - low + 1]
        # Mass wrapped from above ``high`` is ≤ ``right_mass`` and is charged to the infinity
        # mass; mass from below ``low`` sits at losses ≤ 0 (no δ at any ε ≥ 0) or was wrapped
        # upwards (only raises δ). FFT round-off is clipped up, which also only raises δ.
        probs = np.maximum(window, 0.0)
        infinity_mass = min(1.0, right_mass - math.expm1(self.log_finite_mass))
        return pld_pmf.DensePLDPmf(
            discretization, self.lower_index + low, probs, infinity_mass, True
        )


def _representatives(counts: np.ndarray) -> list[tuple[int, int]]:
    """(index, weight) of count-weighted quantile multipliers standing in for the schedule."""
    if counts.size <= _PILOT_GROUPS:
        return [(i, int(c)) for i, c in enumerate(counts)]
    cumulative = np.cumsum(counts)
    edges = np.linspace(0, cumulative[-1], _PILOT_GROUPS + 1)
    middles = (edges[:-1] + edges[1:]) / 2
    indices = np.searchsorted(cumulative, middles, side="right")
    return [(int(i), float(w)) for i, w in zip(indices, np.diff(edges), strict=True)]


def _plan(pmfs: list[tuple[GridPmf, float]], tail: float) -> tuple[_Plan, int]:
    """Chernoff orders and window from representative PMFs (approximate; verified later).

    The Chernoff bound b(t) = (ln E e^{tS} − ln tail)/t is minimised over ln t (t > 0, upper
    edge) and maximised over ln(−t) (t < 0, lower edge) with scipy's bounded Brent search;
    the optimum can sit far from 1/std because the per-step losses are very skewed.
    """
    support_top = sum(weight * (pmf.lower_index + pmf.probs.size - 1) for pmf, weight in pmfs)
    support_bottom = sum(weight * pmf.lower_index for pmf, weight in pmfs)

    def bound(order: float) -> float:
        orders = np.array([order])
        log_mgf = sum(
            weight * (_log_mgf(pmf.probs, orders)[0] + order * pmf.lower_index)
            for pmf, weight in pmfs
        )
        return (log_mgf - math.log(tail)) / order  # an absolute loss index

    span = max(support_top - support_bottom, 1.0)
    log_range = (math.log(1.0 / (100.0 * span)), math.log(10.0))
    upper = minimize_scalar(
        lambda log_t: bound(math.exp(log_t)), bounds=log_range, method="bounded",
        options={"xatol": 0.02},
    )
    lower = minimize_scalar(
        lambda log_t: -bound(-math.exp(log_t)), bounds=log_range, method="bounded",
        options={"xatol": 0.05},
    )
    best = math.exp(upper.x)
    high = min(float(upper.fun), support_top)
    # keep every loss > 0 inside the window: what falls below it then never counts toward δ
    low = math.floor(min(max(-float(lower.fun), support_bottom), 0.0))
    # the bound is steep above the optimum and flat below it: hedge downwards
    orders = best * np.array([0.6, 0.8, 1.0])
    return _Plan(0, low, orders), math.ceil(high) - low + 1


def _check_length(length: int, discretization: float) -> None:
    if length > MAX_FOURIER_POINTS:
        raise DPDLError(
            f"the composed privacy-loss grid needs {length} points at value_discretization="
            f"{discretization!r}; use a coarser value_discretization"
        )


def compose(
    multipliers: np.ndarray,
    counts: np.ndarray,
    sample_rate: float,
    discretization: float,
    tail_mass_truncation: float = TAIL_MASS_TRUNCATION,
    *,
    relation: str = "add-remove",
) -> pld_lib.PrivacyLossDistribution:
    """The composed PLD of ``counts[i]`` steps at each distinct ``multipliers[i]`` under the
    neighbouring ``relation`` ("add-remove" or "replace-one").

    Returns a pessimistic ``dp_accounting`` ``PrivacyLossDistribution``, so δ(ε) and ε(δ) are
    answered by dp_accounting's own routines.
    """
    multipliers = np.asarray(multipliers, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    sides = tuple(range(len(_sides(relation, sample_rate))))
    cache: dict[float, tuple[GridPmf, GridPmf | None]] = {}

    def build(z: float) -> tuple[GridPmf, GridPmf | None]:
        if z in cache:
            return cache[z]
        return subsampled_gaussian_pmfs(z, sample_rate, discretization, relation=relation)

    representatives = _representatives(counts)
    for i, _ in representatives:
        cache[float(multipliers[i])] = build(float(multipliers[i]))
    plans = {}
    for side in sides:
        pilot = [(cache[float(multipliers[i])][side], w) for i, w in representatives]
        plan, estimate = _plan(pilot, tail_mass_truncation)
        plan.length = sp_fft.next_fast_len(math.ceil(_WINDOW_MARGIN * estimate), real=True)
        _check_length(plan.length, discretization)
        plans[side] = plan
    if multipliers.size > _PILOT_GROUPS:
        cache.clear()  # the pass below builds them again, one at a time (bounded memory)

    for _attempt in range(3):
        accumulators = {side: _Side(plans[side]) for side in sides}
        for z, count in zip(multipliers, counts, strict=True):
            pmfs = build(float(z))
            for side in sides:
                accumulators[side].add(pmfs[side], int(count))
        results = {
            side: accumulators[side].finish(discretization, tail_mass_truncation) for side in sides
        }
        if all(result is not None for result in results.values()):
            if len(sides) == 1:
                return pld_lib.PrivacyLossDistribution(results[0])
            return pld_lib.PrivacyLossDistribution(results[0], results[1])
        for side in sides:
            if results[side] is None:
                low, high, _ = accumulators[side].window(tail_mass_truncation)
                needed = high - low + 1
                plans[side].length = sp_fft.next_fast_len(needed, real=True)
                _check_length(plans[side].length, discretization)
    raise DPDLError("PLD composition failed to size its Fourier grid")  # pragma: no cover


class _LogSide(_Side):
    """Accumulates Σ c·Log F instead of Π F^c (equal for integer c, whatever the branch), so
    one complex logarithm per multiplier serves every schedule that shares the multiplier."""

    def __init__(self, plan: _Plan):
        super().__init__(plan)
        self.spectrum = np.zeros(plan.length // 2 + 1, dtype=np.complex128)

    def add_log(self, pmf: GridPmf, count: int, log_transform: np.ndarray,
                log_mgf: np.ndarray) -> None:
        if count == 0:
            return
        self.add_moments(pmf, count, log_mgf)
        self.spectrum += float(count) * log_transform

    def composed_spectrum(self) -> np.ndarray:
        with np.errstate(under="ignore"):
            return np.exp(self.spectrum)


def _log_rfft(probs: np.ndarray, length: int) -> np.ndarray:
    with np.errstate(divide="ignore"):
        log_transform = np.log(_fold_rfft(probs, length))
    # an exact zero (log = −inf) would give nan once multiplied by a count: any finite value
    # this low is still 0 after exp, since no log |F| is positive
    log_transform.real[np.isneginf(log_transform.real)] = _LOG_ZERO
    return log_transform


def compose_schedules(
    multipliers: np.ndarray,
    counts: list[np.ndarray],
    sample_rate: float,
    discretization: float,
    tail_mass_truncation: float = TAIL_MASS_TRUNCATION,
    *,
    relation: str = "add-remove",
) -> list[pld_lib.PrivacyLossDistribution]:
    """Composed PLDs of several schedules over the same distinct ``multipliers``.

    ``counts[s][i]`` steps of schedule s use ``multipliers[i]``. Each distinct multiplier's
    PMF, transform and logarithm are computed once and shared by every schedule (a sandwich
    of upper and lower bounds costs barely more than one bound). ``counts[0]`` must be the
    schedule with the largest losses (the upper bound): it sizes the Fourier grid, and a
    grid too short for any schedule is detected and lengthened as in :func:`compose`.
    ``relation``: the neighbouring relation, as in :func:`compose`.
    """
    multipliers = np.asarray(multipliers, dtype=np.float64)
    counts = [np.asarray(c, dtype=np.int64) for c in counts]
    sides = tuple(range(len(_sides(relation, sample_rate))))
    leading = counts[0]
    used = np.flatnonzero(leading > 0)
    representatives = [(int(used[i]), w) for i, w in _representatives(leading[used])]

    def build(i: int) -> tuple[GridPmf, GridPmf | None]:
        return subsampled_gaussian_pmfs(float(multipliers[i]), sample_rate, discretization,
                                        loss_floor=LUMP_LOSS_FLOOR, tail_delta=TAIL_DELTA,
                                        relation=relation)

    pilot_pmfs = {i: build(i) for i, _ in representatives}
    plans = {}
    for side in sides:
        plan, estimate = _plan([(pilot_pmfs[i][side], w) for i, w in representatives],
                               tail_mass_truncation)
        plan.length = sp_fft.next_fast_len(math.ceil(_WINDOW_MARGIN * estimate), real=True)
        _check_length(plan.length, discretization)
        plans[side] = plan
    needed_values = np.flatnonzero(np.sum(counts, axis=0) > 0)
    for _attempt in range(3):
        accumulators = [{side: _LogSide(plans[side]) for side in sides} for _ in counts]
        for i in needed_values:
            pmfs = pilot_pmfs.get(int(i)) or build(int(i))
            for side in sides:
                pmf = pmfs[side]
                log_transform = _log_rfft(pmf.probs, plans[side].length)
                log_mgf = _log_mgf(pmf.probs, plans[side].orders)
                for schedule, accumulator in zip(counts, accumulators, strict=True):
                    accumulator[side].add_log(pmf, int(schedule[i]), log_transform, log_mgf)
        results = [{side: acc[side].finish(discretization, tail_mass_truncation)
                    for side in sides} for acc in accumulators]
        if all(r is not None for result in results for r in result.values()):
            return [pld_lib.PrivacyLossDistribution(*(result[side] for side in sides))
                    for result in results]
        for side in sides:
            needed = max(
                acc[side].window(tail_mass_truncation)[1]
                - acc[side].window(tail_mass_truncation)[0] + 1 for acc in accumulators)
            plans[side].length = max(plans[side].length,
                                     sp_fft.next_fast_len(needed, real=True))
            _check_length(plans[side].length, discretization)
    raise DPDLError("PLD composition failed to size its Fourier grid")  # pragma: no cover
