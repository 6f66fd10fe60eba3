"""Exact privacy of a linear Gaussian view: what a coalition of nodes learns about node u from
the messages of noisy gossip (MATH.md §9).

Protocol (the tests' convention): x^0 = 0; at round t every node i sends the message
m_i^t = x_i^t + a_i^t + z_i^t (its contribution a and fresh noise z_i^t ~ N(0, σ²)), and
x^{t+1} = P^t m^t with P^t column-stochastic (P^t_ij > 0 iff i receives from j).  The
observers V see, at t = 0..T-1, the message of each of their in-neighbours j ∉ V at round t,
and know their own contributions and noises.  Everything they see is y = A·a + B·z: node u is
μ_u-GDP against V with

    μ_u² = Δ² · c_uᵀ (σ² B Bᵀ)⁺ c_u = (Δ/σ)² · min{‖w‖² : B w = c_u},

c_u the observed trace of u's contribution (Δ at every round, or once at t = 0), B the observed
traces of the honest nodes' unit noises; μ_u = ∞ when c_u is not in B's column space (V
reconstructs u's contribution).  Computed by least squares on B, never an explicit inverse.
Other nodes' contributions are fixed inputs (the adversary may know them): they shift y by a
known vector and do not enter μ.

Scope (MATH.md §9): exact for fixed inputs (averaging, sums, histograms) and for a gradient canary
whose contribution does not depend on the model; a valid *lower* bound on D-SGD's pairwise
loss, not an upper bound for D-SGD with data-dependent gradients (there only local DP, μ ≤
√T·Δ/σ, is a guarantee).

``noise="once"`` is the protocol of Muffliato (Cyffers et al. 2022): every node adds its noise
once, at t = 0, and then only gossips (m^t = x^t); with ``contribution="once"`` too it is
private averaging.

Pitfall (why :func:`per_message_mu` exists): adding up each observed message's own Mahalanobis
term, as Muffliato's simulation does, is not an upper bound: gossip correlates the noise across
messages, and two messages that share noise can cancel it (with noise added once, the whole
view is a function of n noises only).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dpdl.accounting.gdp import epsilon_from_delta, mu_from_epsilon_delta
from dpdl.errors import DPDLError, require

CONTRIBUTIONS = ("every-round", "once")
NOISES = ("every-round", "once")
# A contribution is outside B's column space when the least-squares residual exceeds this
# fraction of its norm (B is built from exact products of stochastic matrices).
RESIDUAL_RTOL = 1e-8

__all__ = [
    "CONTRIBUTIONS",
    "NOISES",
    "View",
    "build_view",
    "gls_weights",
    "schedule_view_mu",
    "view_mu",
    "view_norms",
    "pairwise_mu",
    "per_message_mu",
    "per_message_norms",
    "epsilon_of",
    "sigma_for_target",
    "graph_distances",
]


@dataclass(frozen=True)
class View:
    """What observers ``V`` see over ``rounds`` rounds, as linear maps of every node's
    per-round input (contribution + noise): ``rows`` the (round, node) of each observed
    message, ``matrix`` (len(rows), n·rounds) the message's coefficient on the input of node k at
    round s in column s·n + k."""

    n: int
    rounds: int
    observers: tuple[int, ...]
    rows: tuple[tuple[int, int], ...]
    matrix: np.ndarray

    def column(self, node: int, round_: int) -> np.ndarray:
        return self.matrix[:, round_ * self.n + node]


def _mixing_of(mixing, n: int | None = None) -> tuple[Callable[[int], np.ndarray], int]:
    """``mixing`` as a function k -> P^k and the node count, every matrix validated."""
    if callable(mixing):
        first = np.asarray(mixing(0), dtype=np.float64)
        fn = mixing
    else:
        first = np.asarray(mixing, dtype=np.float64)

        def fn(k: int, P=first) -> np.ndarray:
            return P

    require(first.ndim == 2 and first.shape[0] == first.shape[1] and first.shape[0] >= 2,
            f"a mixing matrix must be square, n >= 2; got shape {first.shape}")  # fmt: skip
    n = first.shape[0] if n is None else n
    cache: dict[int, np.ndarray] = {}

    def checked(k: int) -> np.ndarray:
        if k not in cache:
            P = np.asarray(fn(k), dtype=np.float64)
            require(P.shape == (n, n), f"mixing matrix of round {k} has shape {P.shape}")
            require(bool(np.all(P >= 0)) and np.allclose(P.sum(axis=0), 1.0, atol=1e-9),
                    f"mixing matrix of round {k} is not column-stochastic (columns must sum "
                    "to 1, entries >= 0)")  # fmt: skip
            cache[k] = P
        return cache[k]

    return checked, n


def _check_nodes(nodes: Sequence[int] | int, n: int, what: str) -> tuple[int, ...]:
    values = (nodes,) if isinstance(nodes, int | np.integer) else tuple(nodes)
    require(len(values) >= 1, f"{what} needs at least one node")
    for v in values:
        require(isinstance(v, int | np.integer) and not isinstance(v, bool) and 0 <= v < n,
                f"{what}: node {v!r} is not in 0..{n - 1}")  # fmt: skip
    return tuple(sorted({int(v) for v in values}))


def _check_target(target: int, n: int) -> int:
    """The target node, one of 0..n-1 (a column index: -1 or n would read another node's)."""
    return _check_nodes([target], n, "the target")[0]


def _advance(progress: Callable[[int], None] | None, units: int = 1) -> None:
    if progress is not None:
        progress(units)


def build_view(mixing, *, rounds: int, observers: Sequence[int] | int,
               progress: Callable[[int], None] | None = None) -> View:  # fmt: skip
    """The observers' view over ``rounds`` rounds (see the module doc); ``progress(1)``
    after each round."""
    _check_rounds(rounds)
    P_of, n = _mixing_of(mixing)
    V = _check_nodes(observers, n, "observers")
    # at least: every round's matrix (read once each) and one observed message per round
    _check_memory((n + rounds) * n * rounds * 8, f"{n} nodes over {rounds} rounds")
    inside = np.zeros(n, dtype=bool)
    inside[list(V)] = True
    seen = [np.flatnonzero((P_of(t)[list(V)] > 0).any(axis=0) & ~inside)  # in-neighbours ∉ V
            for t in range(rounds)]  # fmt: skip
    rows = [(t, int(j)) for t in range(rounds) for j in seen[t]]
    starts = np.cumsum([0, *(len(s) for s in seen)])  # round t's rows: starts[t]..starts[t+1]
    _check_memory(len(rows) * n * rounds * 8, f"{n} nodes over {rounds} rounds")
    matrix = np.zeros((len(rows), n * rounds))
    # m^t = input^t + P^{t-1} m^{t-1}: row (t, j) holds e_jᵀ P^{t-1} ··· P^s on round s's
    # inputs.  Built backwards from s = t for every observed row at once: (rows × n) per
    # round, where forwards the whole state (n × n·rounds) would be carried along.
    R = np.zeros((len(rows), n))
    for s in range(rounds - 1, -1, -1):
        R[np.arange(starts[s], starts[s + 1]), seen[s]] = 1.0
        matrix[starts[s] :, s * n : (s + 1) * n] = R[starts[s] :]
        if s > 0:
            R[starts[s] :] = R[starts[s] :] @ _sparse_if_pays(P_of(s - 1))
        _advance(progress)
    return View(n, rounds, V, tuple(rows), matrix)


def _check_memory(nbytes: int, what: str) -> None:
    """Refuse a view whose matrix (and the least squares on it, ~3 times as much) would not
    fit in this machine's memory: better one line now than a process killed later."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system: nothing to compare
        return
    require(3 * nbytes <= physical,
            f"the observers' view of {what} needs at least {nbytes / 2**30:.3g} GiB (and "
            f"about 3x that for its least squares), more than this machine's "
            f"{physical / 2**30:.0f} GiB: give fewer rounds or nodes")  # fmt: skip


def _check_rounds(rounds) -> None:
    require(isinstance(rounds, int | np.integer) and not isinstance(rounds, bool)
            and rounds >= 1, f"rounds must be a positive integer, got {rounds!r}")  # fmt: skip


def _sparse_if_pays(P: np.ndarray):
    """P as a scipy CSR matrix when at most a quarter of it is non-zero, else P."""
    if np.count_nonzero(P) * 4 > P.size:
        return P
    from scipy import sparse

    return sparse.csr_array(P)


def _contribution(view: View, target: int, contribution: str, period: int = 1) -> np.ndarray:
    require(contribution in CONTRIBUTIONS,
            f"contribution must be one of {CONTRIBUTIONS}, got {contribution!r}")  # fmt: skip
    target = _check_target(target, view.n)
    require(target not in view.observers, f"the target {target} is one of the observers")
    times = range(0, view.rounds, _check_period(period)) if contribution == "every-round" else (0,)
    return sum(view.column(target, t) for t in times)


def _honest_columns(view: View, noise: str = "every-round", period: int = 1) -> np.ndarray:
    """B: the columns of the noises the observers do not know (every node outside V, at
    every ``period``-th round from t = 0, or at t = 0 only with ``noise="once"``)."""
    require(noise in NOISES, f"noise must be one of {NOISES}, got {noise!r}")
    keep = np.ones(view.n, dtype=bool)
    keep[list(view.observers)] = False
    fresh = np.arange(view.rounds) % _check_period(period) == 0
    columns = (fresh[:, None] & keep[None, :]).ravel()
    if noise == "once":
        columns[view.n :] = False
    return view.matrix[:, columns]


def _check_period(period) -> int:
    require(isinstance(period, int | np.integer) and not isinstance(period, bool) and period >= 1,
            f"period must be a positive integer (rounds per step), got {period!r}")
    return int(period)


def view_norms(view: View, targets: Sequence[int], contribution: str = "every-round",
               noise: str = "every-round", period: int = 1) -> np.ndarray:
    """min ‖w‖ with B w = c_u for each target u (∞ where c_u ∉ col(B)): μ_u = (Δ/σ) · this.
    ``period`` R > 1: contributions and noise enter every R-th round only (a step of R
    gossip rounds, the first with fresh noise: Muffliato's steps)."""
    B = _honest_columns(view, noise, period)
    C = np.stack([_contribution(view, u, contribution, period) for u in targets], axis=1)
    if B.shape[0] == 0:  # the observers see nothing
        return np.zeros(len(targets))
    w, *_ = np.linalg.lstsq(B, C, rcond=None)  # the minimum-norm solutions, by SVD
    residual = np.linalg.norm(B @ w - C, axis=0)
    scale = np.maximum(np.linalg.norm(C, axis=0), 1e-300)
    norms = np.linalg.norm(w, axis=0)
    return np.where(residual <= RESIDUAL_RTOL * scale, norms, math.inf)


def _check_sigma(sigma: float, sensitivity: float) -> tuple[float, float]:
    require(isinstance(sigma, int | float) and math.isfinite(sigma) and sigma > 0,
            f"sigma must be a finite number > 0, got {sigma!r}")  # fmt: skip
    require(isinstance(sensitivity, int | float) and math.isfinite(sensitivity)
            and sensitivity > 0, f"sensitivity must be > 0, got {sensitivity!r}")  # fmt: skip
    return float(sigma), float(sensitivity)


def view_mu(mixing, *, rounds: int, target: int, observers: Sequence[int] | int, sigma: float,
            sensitivity: float = 1.0, contribution: str = "every-round",
            noise: str = "every-round", progress: Callable[[int], None] | None = None,
            period: int = 1) -> float:
    """μ of node ``target`` against the coalition ``observers`` (μ = ∞: reconstructible);
    ``progress(1)`` after each of the ``rounds`` rounds of the view; ``period`` as
    :func:`view_norms`'s."""
    sigma, sensitivity = _check_sigma(sigma, sensitivity)
    _check_target(target, _mixing_of(mixing)[1])  # before the view is built
    view = build_view(mixing, rounds=rounds, observers=observers, progress=progress)
    norms = view_norms(view, [target], contribution, noise, period)
    return float(sensitivity / sigma * norms[0])


def pairwise_mu(mixing, *, rounds: int, sigma: float, sensitivity: float = 1.0,
                contribution: str = "every-round", noise: str = "every-round",
                progress: Callable[[int], None] | None = None, period: int = 1) -> np.ndarray:
    """(n, n): entry [u, v] the μ of node u against the single observer v (NaN on the
    diagonal); ``progress(1)`` after each observer (n in all); ``period`` as
    :func:`view_norms`'s."""
    sigma, sensitivity = _check_sigma(sigma, sensitivity)
    _, n = _mixing_of(mixing)
    out = np.full((n, n), math.nan)
    for v in range(n):
        view = build_view(mixing, rounds=rounds, observers=[v])
        targets = [u for u in range(n) if u != v]
        norms = view_norms(view, targets, contribution, noise, period)
        out[targets, v] = sensitivity / sigma * norms
        _advance(progress)
    return out


def gls_weights(B: np.ndarray, c: np.ndarray) -> np.ndarray:
    """w = (B Bᵀ)⁺ c by the SVD of B (no inverse): wᵀy is the Neyman–Pearson statistic for the
    shift θ·c of y = θ·c + B z, wᵀy / wᵀc the best linear unbiased estimate of θ, with
    standard deviation 1/sqrt(cᵀw) (μ = sqrt(cᵀw) for a unit shift).  Refuses a c outside
    col(B): then the shift is seen without noise (μ = ∞)."""
    U, s, _ = np.linalg.svd(B, full_matrices=False)
    keep = s > s.max(initial=0.0) * max(B.shape) * np.finfo(np.float64).eps
    U, s = U[:, keep], s[keep]
    coefficients = U.T @ c
    require(np.linalg.norm(U @ coefficients - c) <= RESIDUAL_RTOL * np.linalg.norm(c),
            "the contribution is seen without noise (μ = ∞): no test statistic to weigh")
    return U @ (coefficients / s**2)


def schedule_view_mu(mixing, *, target: int, observers: Sequence[int] | int,
                     sigmas: Sequence[float], sensitivities: Sequence[float],
                     period: int = 1) -> float:
    """μ of ``target`` contributing Δ_k at step k, with noise std σ_k at step k (Dyn-D2P's
    C_k and σ_k of a gradient canary, p = 1); steps = len(sigmas), each ``period`` gossip
    rounds whose first carries the contribution and the fresh noise (Muffliato's steps).
    Constant Δ, σ give :func:`view_mu` with ``contribution="every-round"``."""
    view, c, sigmas, R = schedule_view(mixing, target, observers, sigmas, sensitivities, period)
    scale = np.repeat(np.repeat(sigmas, R), view.n)
    fresh = np.arange(view.rounds) % R == 0
    keep = (fresh[:, None] & ~np.isin(np.arange(view.n), view.observers)[None, :]).ravel()
    return min_norm(view.matrix[:, keep] * scale[keep], c)


def schedule_view(mixing, target: int, observers, sigmas, sensitivities, period: int
                  ) -> tuple[View, np.ndarray, np.ndarray, int]:  # fmt: skip
    """(the view over every round, the target's trace Σ_k Δ_k c_{kR}, σ_k as an array, R) of
    a schedule, every argument checked: :func:`schedule_view_mu`'s and the correlated one's."""
    sigmas = np.asarray(sigmas, dtype=np.float64)
    deltas = np.asarray(sensitivities, dtype=np.float64)
    require(sigmas.ndim == 1 and sigmas.shape == deltas.shape and len(sigmas) >= 1,
            "sigmas and sensitivities must be equal-length sequences, one per round")
    for sigma, delta in zip(sigmas, deltas, strict=True):
        _check_sigma(float(sigma), float(delta))
    target = _check_target(target, _mixing_of(mixing)[1])
    R = _check_period(period)
    view = build_view(mixing, rounds=len(sigmas) * R, observers=observers)
    require(target not in view.observers, f"the target {target} is one of the observers")
    c = sum(delta * view.column(target, k * R) for k, delta in enumerate(deltas))
    return view, c, sigmas, R


def min_norm(B: np.ndarray, c: np.ndarray) -> float:
    """min ‖w‖ with B w = c (∞ when c ∉ col(B); 0 when nothing is seen): a view's μ."""
    if B.shape[0] == 0:
        return 0.0
    w, *_ = np.linalg.lstsq(B, c, rcond=None)
    if np.linalg.norm(B @ w - c) > RESIDUAL_RTOL * max(np.linalg.norm(c), 1e-300):
        return math.inf
    return float(np.linalg.norm(w))


def per_message_norms(view: View, targets: Sequence[int], contribution: str = "every-round",
                      noise: str = "every-round") -> np.ndarray:
    """sqrt(Σ_i c_i² / Var y_i) per target, each observed message taken alone (Muffliato's
    simulation): NOT a bound, the pitfall of the module doc, kept to show by how much it
    under-counts.  μ = (Δ/σ) · this."""
    C = np.stack([_contribution(view, u, contribution) for u in targets], axis=1)
    var = (_honest_columns(view, noise) ** 2).sum(axis=1)
    seen = var > 0
    out = np.sqrt((C[seen] ** 2 / var[seen, None]).sum(axis=0))
    return np.where(((C[~seen] != 0).any(axis=0)), math.inf, out)


def per_message_mu(mixing, *, rounds: int, target: int, observers: Sequence[int] | int,
                   sigma: float, sensitivity: float = 1.0, contribution: str = "every-round",
                   noise: str = "every-round") -> float:
    """:func:`per_message_norms` as a μ (the pitfall, not a bound)."""
    sigma, sensitivity = _check_sigma(sigma, sensitivity)
    view = build_view(mixing, rounds=rounds, observers=observers)
    return float(sensitivity / sigma * per_message_norms(view, [target], contribution, noise)[0])


def epsilon_of(mu: float | np.ndarray, delta: float) -> float | np.ndarray:
    """The exact ε(δ) of μ-GDP (MATH.md §1 eq. 4), elementwise; ∞ for μ = ∞, 0 for μ = 0."""
    def one(m: float) -> float:
        if not math.isfinite(m):
            return math.inf
        return 0.0 if m <= 0 else float(epsilon_from_delta(delta, m))

    if np.ndim(mu) == 0:
        return one(float(mu))
    return np.vectorize(lambda m: math.nan if math.isnan(m) else one(m))(np.asarray(mu, float))


def graph_distances(mixing, rounds: int) -> np.ndarray:
    """(n, n) hop distance from u to v in the union of the rounds' graphs (j → i when
    P_ij > 0), ∞ when v never hears from u."""
    P_of, n = _mixing_of(mixing)
    adj = np.zeros((n, n), dtype=bool)
    for t in range(rounds):
        adj |= P_of(t) > 0
    np.fill_diagonal(adj, False)
    dist = np.full((n, n), math.inf)
    for u in range(n):
        dist[u, u], frontier, d = 0, [u], 0
        while frontier:
            d += 1
            nxt = [int(i) for j in frontier for i in np.flatnonzero(adj[:, j])
                   if not math.isfinite(dist[u, i])]  # fmt: skip
            for i in set(nxt):
                dist[u, i] = d
            frontier = sorted(set(nxt))
    return dist


def sigma_for_target(mixing, *, rounds: int, epsilon: float, delta: float,
                     beyond_distance: int = 0, sensitivity: float = 1.0,
                     contribution: str = "every-round", noise: str = "every-round",
                     progress: Callable[[int], None] | None = None, period: int = 1) -> float:
    """The smallest σ with every pair (u, v) at graph distance > ``beyond_distance`` within
    (ε, δ): μ is exactly (Δ/σ) · the view norm, so σ = Δ · max norm / μ(ε, δ).
    ``progress`` as :func:`pairwise_mu`'s."""
    require(isinstance(epsilon, int | float) and math.isfinite(epsilon) and epsilon > 0,
            f"the target epsilon must be a finite number > 0, got {epsilon!r}")  # fmt: skip
    require(isinstance(beyond_distance, int | np.integer) and not isinstance(beyond_distance, bool)
            and beyond_distance >= 0,
            f"beyond_distance must be an integer >= 0 (hops), got {beyond_distance!r}")
    mu = mu_from_epsilon_delta(epsilon, delta)
    norms = pairwise_mu(mixing, rounds=rounds, sigma=1.0, sensitivity=sensitivity,
                        contribution=contribution, noise=noise, progress=progress,
                        period=period)  # fmt: skip
    far = graph_distances(mixing, rounds) > beyond_distance
    np.fill_diagonal(far, False)
    worst = float(np.nanmax(np.where(far, norms, math.nan))) if far.any() else 0.0
    if not math.isfinite(worst):
        raise DPDLError(f"some node beyond distance {beyond_distance} is reconstructible by a "
                        "single observer: no noise level protects it")  # fmt: skip
    return worst / mu
