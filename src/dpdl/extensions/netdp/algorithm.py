"""Token algorithms of Cyffers & Bellet (MATH.md §6, seed 002): A1-A4.

A token (a number, a count vector or a model) travels between users; each holder updates it.
Summation and histogram outputs come with their predicted error so the utility of local vs
network DP can be compared; their guarantees live in ``dpdl.extensions.netdp.accounting``.

All randomness here is secret: the noise, the randomized responses and the walk itself (under
network DP an observer sees only the messages that pass through it; who holds the token when
is part of what protects the others).  Every function takes ``seed``: ``None`` (the default)
draws from the operating system's entropy, a ``numpy.random.Generator`` or ``SeedSequence`` is
used as given (an experiment passes its cell's secret stream,
:func:`dpdl.algorithms.randomness.numpy_secret_rng`), and an int is reproducible noise, for
tests and research only.  An accountant may read a realised walk in memory; nothing here
writes it anywhere.

Transition matrices are row-stochastic: ``P[i, j]`` is the probability that i hands the token
to j. (``dpdl.topology`` mixing matrices are column-stochastic; pass their transpose.)
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from dpdl.algorithms.noise import release_numpy
from dpdl.algorithms.randomness import Randomness, check_noise_std, secret_rng
from dpdl.errors import DPDLError, require
from dpdl.extensions.netdp.accounting import contribution_mask, visit_ranks

__all__ = [
    "SumResult",
    "HistogramResult",
    "SGDResult",
    "Evaluation",
    "CapPolicy",
    "validate_transition_matrix",
    "sample_random_walk",
    "randomized_response",
    "ring_summation",
    "local_summation",
    "ring_histogram",
    "random_walk_summation",
    "clip_by_norm",
    "project_l2_ball",
    "random_walk_sgd",
]

MODELS = ("network", "local")



def _users(n) -> int:
    require(
        isinstance(n, int | np.integer) and not isinstance(n, bool) and n >= 2,
        f"n (number of users) must be an integer >= 2, got {n!r}",
    )
    return int(n)


def _steps(T) -> int:
    require(
        isinstance(T, int | np.integer) and not isinstance(T, bool) and T >= 1,
        f"T (number of steps) must be an integer >= 1, got {T!r}",
    )
    return int(T)


def _model(model: str) -> str:
    require(model in MODELS, f"model must be one of {MODELS}, got {model!r}")
    return model


@dataclass(frozen=True)
class SumResult:
    """A private sum: ``estimate`` of ``truth`` (the sum of the contributions actually made),
    unbiased, with predicted error std ``std`` = √(noise_draws) σ."""

    estimate: float
    truth: float
    std: float
    noise_draws: int
    contributions: np.ndarray  # per user
    walk: np.ndarray | None = None


@dataclass(frozen=True)
class HistogramResult:
    """A private histogram: unbiased ``estimate`` of ``truth`` with per-bin predicted ``std``
    and the normal-approximation expected L1 error √(2/π) Σ_l std_l."""

    estimate: np.ndarray
    truth: np.ndarray
    std: np.ndarray
    expected_l1: float
    counts: np.ndarray  # the final token


@dataclass
class SGDResult:
    weights: np.ndarray
    contributions: np.ndarray  # data-carrying steps per user
    history: list[dict] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# walks
def validate_transition_matrix(transition: ArrayLike, n: int | None = None) -> np.ndarray:
    """Check a row-stochastic transition matrix (square, finite, ≥ 0, rows summing to 1)."""
    P = np.asarray(transition, dtype=float)
    require(P.ndim == 2 and P.shape[0] == P.shape[1],
            f"transition matrix must be square, got shape {P.shape}")
    if n is not None:
        require(P.shape[0] == n, f"transition matrix is {P.shape[0]}x{P.shape[0]}, expected n={n}")
    require(P.shape[0] >= 2, "transition matrix needs at least 2 users")
    require(np.all(np.isfinite(P)), "transition matrix has non-finite entries")
    require(np.all(P >= 0), f"transition matrix has negative entries (min {P.min():.3g})")
    rows = P.sum(axis=1)
    bad = np.flatnonzero(np.abs(rows - 1) > 1e-9)
    if bad.size:
        raise DPDLError(
            f"transition matrix is not stochastic: row {bad[0]} sums to {rows[bad[0]]:.6g} "
            "(rows must sum to 1)"
        )
    return P


def sample_random_walk(
    n: int,
    steps: int,
    *,
    transition: ArrayLike | None = None,
    seed: Randomness = None,
    start: int | None = None,
) -> np.ndarray:
    """Holders of the token at steps 0..T−1. Default: the complete graph without self-loops
    (next holder uniform among the n − 1 others), drawn in one vectorized cumulative sum; a
    general ``transition`` matrix is a Markov chain, sampled step by step with inverse-CDF
    draws."""
    n, T = _users(n), _steps(steps)
    rng = secret_rng(seed)
    first = int(rng.integers(n)) if start is None else int(start)
    require(0 <= first < n, f"start must be a user id in [0, {n}), got {start!r}")
    if transition is None:
        offsets = np.concatenate([[0], rng.integers(1, n, size=T - 1)])
        return (first + np.cumsum(offsets)) % n
    P = validate_transition_matrix(transition, n)
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0
    uniforms = rng.random(T - 1)
    walk = np.empty(T, dtype=np.int64)
    walk[0] = first
    for t in range(1, T):  # a Markov chain: each step depends on the previous holder
        walk[t] = np.searchsorted(cdf[walk[t - 1]], uniforms[t - 1], side="right")
    return walk


# ---------------------------------------------------------------------------------------------
# A1 / A2 on the ring
def _check_values(values, name: str = "values") -> np.ndarray:
    x = np.asarray(values, dtype=float)
    require(x.ndim == 2 and x.shape[0] >= 1 and x.shape[1] >= 2,
            f"{name} must have shape (rounds K >= 1, users n >= 2), got {x.shape}")
    require(np.all(np.isfinite(x)), f"{name} must be finite")
    return x


def ring_summation(values: ArrayLike, sigma: float, *, seed: Randomness = None,
                   unsafe_zero_noise: bool = False) -> SumResult:
    """A1: the token visits users 0..n−1 for K rounds, each adds x_u^k; Gaussian noise σ is
    added once every n − 1 hops (and once more for a non-empty tail, so the released sum is
    covered too): ⌈Kn/(n − 1)⌉ draws, std √⌈Kn/(n − 1)⌉ σ. ``values`` has shape (K, n).

    Each noisy hop releases the token exactly as round_g(token + segment + σN) (MATH.md §10):
    the token stays on the grid, so that is the token plus round_g(segment + σN), one exact
    release per segment."""
    x = _check_values(values)
    sigma = check_noise_std(sigma, unsafe_zero_noise)
    K, n = x.shape
    draws = math.ceil(K * n / (n - 1))
    segments = np.add.reduceat(x.reshape(-1), np.arange(0, K * n, n - 1))
    released = release_numpy(segments, sigma, secret_rng(seed))
    return SumResult(estimate=float(released.sum()), truth=float(x.sum()),
                     std=math.sqrt(draws) * sigma, noise_draws=draws,
                     contributions=np.full(n, K))


def local_summation(values: ArrayLike, sigma: float, *, seed: Randomness = None,
                    unsafe_zero_noise: bool = False) -> SumResult:
    """The local DP baseline: every one of the Kn contributions is released with its own
    noise (exactly, MATH.md §10); std √(Kn) σ."""
    x = _check_values(values)
    sigma = check_noise_std(sigma, unsafe_zero_noise)
    released = release_numpy(x, sigma, secret_rng(seed))
    return SumResult(estimate=float(released.sum()), truth=float(x.sum()),
                     std=math.sqrt(x.size) * sigma, noise_draws=x.size,
                     contributions=np.full(x.shape[1], x.shape[0]))


def randomized_response(values: ArrayLike, num_values: int, gamma: float, *,
                        seed: Randomness = None):
    """L-ary RR_γ: each value is kept w.p. 1 − γ, else replaced by a uniform draw on [L]."""
    require(isinstance(num_values, int | np.integer) and num_values >= 2,
            f"L (number of values) must be an integer >= 2, got {num_values!r}")
    require(isinstance(gamma, int | float | np.floating) and 0 <= gamma <= 1,
            f"gamma must lie in [0, 1], got {gamma!r}")
    x = np.asarray(values)
    require(np.issubdtype(x.dtype, np.integer), "histogram values must be integers in [0, L)")
    require(x.size == 0 or (x.min() >= 0 and x.max() < num_values),
            f"histogram values must lie in [0, {num_values})")
    rng = secret_rng(seed)
    replace = rng.random(x.shape) < gamma
    return np.where(replace, rng.integers(0, num_values, size=x.shape), x)


def ring_histogram(
    values: ArrayLike,
    num_values: int,
    gamma: float,
    *,
    seed: Randomness = None,
    init_elements: int | None = None,
) -> HistogramResult:
    """A2: each contribution passes RR_γ and is added to a count-vector token that starts with
    ``init_elements`` (default n − 1) uniform elements, so even the first holders' views hide
    u among n − 1 reports. ``values`` (K, n) ints in [0, L).

    Debiased estimate: ĥ = (c − n₀/L − γR/L)/(1 − γ) with R = Kn reports and n₀ initial
    elements; Var c_l = h_l a(1 − a) + (R − h_l) b(1 − b) + n₀ (1/L)(1 − 1/L), a = 1 − γ + γ/L,
    b = γ/L.
    """
    x = np.asarray(values)
    require(x.ndim == 2 and x.shape[0] >= 1 and x.shape[1] >= 2,
            f"values must have shape (rounds K >= 1, users n >= 2), got {x.shape}")
    require(isinstance(gamma, int | float | np.floating) and 0 <= gamma < 1,
            f"gamma must lie in [0, 1) for an unbiased estimate, got {gamma!r}")
    L = int(num_values)
    n = x.shape[1]
    n0 = n - 1 if init_elements is None else int(init_elements)
    require(n0 >= 0, f"init_elements must be >= 0, got {init_elements!r}")
    rng = secret_rng(seed)
    reports = randomized_response(x, L, gamma, seed=rng)
    init = rng.integers(0, L, size=n0)
    counts = np.bincount(reports.ravel(), minlength=L) + np.bincount(init, minlength=L)
    R = x.size
    truth = np.bincount(x.ravel(), minlength=L).astype(float)
    estimate = (counts - n0 / L - gamma * R / L) / (1 - gamma)
    a, b = 1 - gamma + gamma / L, gamma / L
    var = truth * a * (1 - a) + (R - truth) * b * (1 - b) + n0 * (1 / L) * (1 - 1 / L)
    std = np.sqrt(var) / (1 - gamma)
    return HistogramResult(estimate=estimate, truth=truth, std=std,
                           expected_l1=float(math.sqrt(2 / math.pi) * std.sum()),
                           counts=counts)


# ---------------------------------------------------------------------------------------------
# A3 / A4 on a random walk
def random_walk_summation(
    values: ArrayLike,
    steps: int,
    sigma: float,
    *,
    transition: ArrayLike | None = None,
    cap: int | None = None,
    model: str = "network",
    seed: Randomness = None,
    walk: ArrayLike | None = None,
    unsafe_zero_noise: bool = False,
) -> SumResult:
    """A3: at each visit the holder u adds Perturb(x_u^k; σ) = x_u^k + N(0, σ²) and hands the
    token to a random user (complete graph or ``transition``). ``values`` is (n,) (the same
    value at every visit) or (n, M) (the k-th visit uses column k; M ≥ the visits it needs).

    Past ``cap`` visits a user adds only noise (network DP: the others' privacy relies on it)
    or nothing (local DP). ``walk`` overrides the sampled walk."""
    x = np.asarray(values, dtype=float)
    require(x.ndim in (1, 2) and x.shape[0] >= 2,
            f"values must have shape (n,) or (n, M) with n >= 2, got {x.shape}")
    require(np.all(np.isfinite(x)), "values must be finite")
    n, T, model = x.shape[0], _steps(steps), _model(model)
    sigma = check_noise_std(sigma, unsafe_zero_noise)
    rng = secret_rng(seed)
    if walk is None:
        walk = sample_random_walk(n, T, transition=transition, seed=rng)
    walk = np.asarray(walk)
    require(walk.shape == (T,), f"walk must have shape ({T},), got {walk.shape}")
    carries = contribution_mask(walk, n, cap)
    ranks = visit_ranks(walk, n)
    if x.ndim == 1:
        contrib = x[walk]
    else:
        needed = int(ranks[carries].max()) + 1 if carries.any() else 0
        require(x.shape[1] >= needed,
                f"values has {x.shape[1]} columns but a user contributes {needed} times")
        contrib = x[walk, np.minimum(ranks, x.shape[1] - 1)]
    contrib = np.where(carries, contrib, 0.0)
    noisy = np.ones(T, dtype=bool) if model == "network" else carries
    draws = int(noisy.sum())
    # every noisy hop releases the token (on the grid) plus round_g(contribution + σN)
    released = release_numpy(contrib[noisy], sigma, rng)
    return SumResult(estimate=float(released.sum()), truth=float(contrib.sum()),
                     std=math.sqrt(draws) * sigma, noise_draws=draws,
                     contributions=np.bincount(walk[carries], minlength=n), walk=walk)


def clip_by_norm(gradient: np.ndarray, clip: float) -> np.ndarray:
    """g · min(1, C/‖g‖): bounds the l2 norm by C (user-level sensitivity 2C, replace-one)."""
    norm = float(np.linalg.norm(gradient))
    return gradient if norm <= clip else gradient * (clip / norm)


def project_l2_ball(w: np.ndarray, radius: float | None) -> np.ndarray:
    """Π_W for W the l2 ball of the given radius (W = R^d when radius is None)."""
    if radius is None:
        return w
    norm = float(np.linalg.norm(w))
    return w if norm <= radius else w * (radius / norm)


@dataclass(frozen=True)
class Evaluation:
    """Evaluate the weights with ``evaluate`` (weights → dict of metrics) before the first step
    and every ``every`` steps (0: only before the first step), and after the last."""

    evaluate: Callable[[np.ndarray], dict] | None = None
    every: int = 0


@dataclass(frozen=True)
class CapPolicy:
    """Which steps of the walk carry data (``contributes``, one bool a step; None: all) and
    what a holder past its cap does under the trust ``model``: "network" adds only noise,
    "local" forwards the token untouched."""

    contributes: ArrayLike | None = None
    model: str = "network"


def random_walk_sgd(
    gradient: Callable[[np.ndarray, int], np.ndarray],
    w0: ArrayLike,
    walk: ArrayLike,
    *,
    lr: float,
    sigma: float,
    clip: float,
    n: int,
    cap: CapPolicy = CapPolicy(),
    radius: float | None = None,
    seed: Randomness = None,
    evaluation: Evaluation = Evaluation(),
    unsafe_zero_noise: bool = False,
) -> SGDResult:
    """A4: τ ← Π_W(τ − η(clip(∇f(τ; D_u)) + Z)), Z ~ N(0, σ² I), along ``walk``.

    The gradient is clipped to norm ``clip`` *before* the noise is added. Where
    ``cap.contributes`` is False (the user is past its cap ⌈cT/n⌉) the holder adds only noise
    under network DP and forwards the token untouched under local DP (``cap.model``). The
    noisy gradient is released exactly, round_g(clip(∇f) + σN) (MATH.md §10), then the step
    taken from it. ``evaluation`` evaluates the weights along the way (:class:`Evaluation`).
    ``sigma`` must be > 0: the noise-free run (``sigma=0``) needs ``unsafe_zero_noise=True``
    and is not private.
    """
    contributes, model = cap.contributes, cap.model
    evaluate, eval_every = evaluation.evaluate, evaluation.every
    require(isinstance(lr, int | float) and lr > 0, f"lr must be > 0, got {lr!r}")
    require(isinstance(clip, int | float) and clip > 0, f"clip must be > 0, got {clip!r}")
    sigma, model, n = check_noise_std(sigma, unsafe_zero_noise), _model(model), _users(n)
    walk = np.asarray(walk)
    T = walk.size
    mask = (np.ones(T, dtype=bool) if contributes is None
            else np.asarray(contributes, dtype=bool))
    require(mask.shape == (T,), "contributes must have the walk's shape")
    w = np.array(w0, dtype=float)
    rng = secret_rng(seed)
    history: list[dict] = []
    if evaluate is not None:
        history.append({"step": 0, **evaluate(w)})
    for t in range(T):
        if mask[t]:
            step = release_numpy(clip_by_norm(gradient(w, int(walk[t])), clip), sigma, rng)
        elif model == "network":
            step = release_numpy(np.zeros_like(w), sigma, rng)
        else:
            step = None
        if step is not None:
            w = project_l2_ball(w - lr * step, radius)
        if evaluate is not None and eval_every and ((t + 1) % eval_every == 0 or t + 1 == T):
            history.append({"step": t + 1, **evaluate(w)})
    return SGDResult(weights=w, contributions=np.bincount(walk[mask], minlength=n),
                     history=history)
