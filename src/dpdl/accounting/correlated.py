"""Exact privacy of a gossip view when the noise is correlated across nodes (MATH.md §9.4).

The view of :mod:`dpdl.accounting.gossip` with one change: round t's noise inputs are not
independent per node but z^t = σ G_t ζ^t, ζ^t ~ N(0, I) the round's *sources*, and every node
knows some linear functionals of them (its own sources, the secrets it shares).  A coalition V
sees y = θ·c + Σ_t M_t z^t (M_t the view's columns of round t) and knows K_t ζ^t (its members'
functionals, stacked).  Given what it knows, ζ^t is Gaussian on the null space of K_t:
ζ^t = E[ζ^t | K_t ζ^t] + N_t η^t with N_t an orthonormal basis of null(K_t) and η^t ~ N(0, I), the
first term a known shift.  So node u is μ-GDP against V with

    μ = (Δ/σ) · min{‖w‖ : B w = c_u},   B = [M_t G_t N_t]_t  (the matrix-factorization view),

μ = ∞ when c_u lies outside col(B) (V reconstructs u's contribution).  With G_t = I and each
node knowing its own source this is exactly :func:`dpdl.accounting.gossip.view_norms`.

Noise models (:data:`NOISE_MODELS`, one class each, registered by name):

* ``independent`` -- z_i = σ ξ_i (local DP; dpdl's default);
* ``pairwise`` -- DECOR (Allouah et al. 2024): z_i = σ(ξ_i + f Σ_{j ∈ N_t(i)} ±η_ij), one source
  η_ij per edge of round t's undirected graph, added by i and subtracted by j (the network sum
  of the pairwise part is 0); both endpoints know η_ij;
* ``neighbourhood-zero-sum`` -- every node k draws ζ_k over its closed neighbourhood N_t[k] and
  hands member i the share f(ζ_ki − mean ζ_k) (the shares sum to 0 over N_t[k]); k knows ζ_k,
  i knows its share.  Each node adds its independent part and the shares it holds.

Trust models (:data:`TRUST_MODELS`): the exact view of any coalition is the general case; the
two named ones are ``curious-neighbours`` (the coalition of all of u's neighbours over the
run: every secret u shares is known, only the independent part protects) and ``sec-ldp``
(Allouah et al.'s Sec-LDP: an adversary seeing u's messages who knows no honest pair's secret).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dpdl.accounting.gossip import (
    CONTRIBUTIONS,
    RESIDUAL_RTOL,
    View,
    _check_period,
    _check_sigma,
    _check_target,
    _mixing_of,
    build_view,
    min_norm,
    schedule_view,
)
from dpdl.errors import require

__all__ = [
    "NOISE_MODELS",
    "TRUST_MODELS",
    "IndependentNoise",
    "NeighbourhoodZeroSumNoise",
    "PairwiseNoise",
    "Sources",
    "correlated_view_mu",
    "correlated_schedule_view_mu",
    "correlated_view_norms",
    "eavesdropper_view",
    "sec_ldp_noise_factor",
    "unknown_noise_columns",
    "make_noise_model",
    "undirected_adjacency",
    "undirected_edges",
]

TRUST_MODELS = ("curious-neighbours", "sec-ldp", "coalition")


@dataclass(frozen=True)
class Sources:
    """One round's noise: node inputs σ·``matrix`` ζ, ζ ~ N(0, I_m); ``knowledge[i]`` the
    (k_i, m) functionals of ζ node i knows."""

    matrix: np.ndarray
    knowledge: tuple[np.ndarray, ...]

    def unknown_basis(self, coalition: Sequence[int]) -> np.ndarray:
        """An orthonormal basis (m, r) of the sources' directions the coalition does not know."""
        m = self.matrix.shape[1]
        known = [self.knowledge[v] for v in coalition if self.knowledge[v].size]
        if not known:
            return np.eye(m)
        from scipy.linalg import null_space

        return null_space(np.vstack(known))


def undirected_adjacency(P: np.ndarray) -> np.ndarray:
    """(n, n) bool: i and j talk in a round's graph (P_ij > 0 or P_ji > 0, i != j), so they
    can share a secret (DECOR's pairs); the engine's and the accounting's one definition."""
    A = np.asarray(P) > 0
    A = A | A.T
    np.fill_diagonal(A, False)
    return A


def undirected_edges(P: np.ndarray) -> list[tuple[int, int]]:
    """The edges {i, j}, i < j, of :func:`undirected_adjacency`."""
    i, j = np.nonzero(np.triu(undirected_adjacency(P), k=1))
    return list(zip(i.tolist(), j.tolist(), strict=True))


def _own(n: int, width: int) -> tuple[np.ndarray, list[list[np.ndarray]]]:
    """The independent part: I_n in the first n of ``width`` columns, node i knows ξ_i."""
    matrix = np.zeros((n, width))
    matrix[:, :n] = np.eye(n)
    knowledge = [[np.eye(1, width, i)] for i in range(n)]
    return matrix, knowledge


class IndependentNoise:
    name = "independent"

    def sources(self, P: np.ndarray) -> Sources:
        n = P.shape[0]
        matrix, knowledge = _own(n, n)
        return Sources(matrix, tuple(np.vstack(k) for k in knowledge))


@dataclass(frozen=True)
class PairwiseNoise:
    """DECOR's pairwise-cancelling noise, ``factor`` f = σ_pair / σ_independent."""

    factor: float
    name = "pairwise"

    def sources(self, P: np.ndarray) -> Sources:
        n, edges = P.shape[0], undirected_edges(P)
        matrix, knowledge = _own(n, n + len(edges))
        for e, (i, j) in enumerate(edges):
            matrix[i, n + e], matrix[j, n + e] = self.factor, -self.factor
            row = np.eye(1, n + len(edges), n + e)
            knowledge[i].append(row)
            knowledge[j].append(row)
        return Sources(matrix, tuple(np.vstack(k) for k in knowledge))


@dataclass(frozen=True)
class NeighbourhoodZeroSumNoise:
    """Zero-sum shares over each closed neighbourhood, ``factor`` f (module doc)."""

    factor: float
    name = "neighbourhood-zero-sum"

    def sources(self, P: np.ndarray) -> Sources:
        n = P.shape[0]
        adjacency = undirected_adjacency(P)
        blocks = [np.concatenate(([k], np.flatnonzero(adjacency[k]))) for k in range(n)]
        starts = np.cumsum([n, *(len(b) for b in blocks)])
        matrix, knowledge = _own(n, int(starts[-1]))
        for k, members in enumerate(blocks):
            cols = np.arange(starts[k], starts[k + 1])
            share = np.eye(len(members)) - 1.0 / len(members)  # row i: ζ_ki − mean ζ_k
            matrix[np.ix_(members, cols)] += self.factor * share.T
            drawn = np.zeros((len(members), matrix.shape[1]))
            drawn[:, cols] = np.eye(len(members))
            knowledge[k].append(drawn)  # k drew ζ_k
            for r, i in enumerate(members[1:], start=1):
                held = np.zeros((1, matrix.shape[1]))
                held[0, cols] = share[r]
                knowledge[i].append(held)  # i holds its share
        return Sources(matrix, tuple(np.vstack(k) for k in knowledge))


NOISE_MODELS: dict[str, type] = {
    "independent": IndependentNoise,
    "pairwise": PairwiseNoise,
    "neighbourhood-zero-sum": NeighbourhoodZeroSumNoise,
}


def make_noise_model(name: str, factor: float = 0.0):
    """The noise model ``name`` (:data:`NOISE_MODELS`), ``factor`` its correlated part's std
    over the independent part's (ignored by ``independent``)."""
    require(name in NOISE_MODELS, f"unknown noise model {name!r}; choose one of "
            f"{', '.join(NOISE_MODELS)}")  # fmt: skip
    if name == "independent":
        return IndependentNoise()
    require(isinstance(factor, int | float) and math.isfinite(factor) and factor > 0,
            f"the correlated noise factor must be a finite number > 0, got {factor!r}")
    return NOISE_MODELS[name](float(factor))


def unknown_noise_columns(view: View, mixing, model, scales: Sequence[float] | None = None,
                          period: int = 1, noise_once: bool = False) -> np.ndarray:
    """B: the view's map of the sources its coalition does not know, every ``period``-th round
    (round 0 only with ``noise_once``), round t's columns scaled by ``scales[t // period]``
    (the step's σ; 1 when None)."""
    P_of, n = _mixing_of(mixing)
    R = _check_period(period)
    fresh = list(range(0, view.rounds, R))[: 1 if noise_once else None]
    blocks = []
    for t in fresh:
        S = model.sources(P_of(t))
        scale = 1.0 if scales is None else float(scales[t // R])
        blocks.append(scale * (view.matrix[:, t * n : (t + 1) * n] @ S.matrix
                               @ S.unknown_basis(view.observers)))  # fmt: skip
    return np.hstack(blocks) if blocks else np.zeros((view.matrix.shape[0], 0))


def correlated_view_norms(view: View, mixing, targets: Sequence[int], model,
                          contribution: str = "every-round", period: int = 1,
                          noise_once: bool = False) -> np.ndarray:  # fmt: skip
    """min ‖w‖ with B w = c_u for each target u (∞ where c_u ∉ col(B)), B the view of the
    unknown correlated sources (module doc): μ_u = (Δ/σ) · this.  ``period`` R: contributions
    and sources enter every R-th round only; ``noise_once``: sources at round 0 only."""
    require(contribution in CONTRIBUTIONS,
            f"contribution must be one of {CONTRIBUTIONS}, got {contribution!r}")  # fmt: skip
    n, R = view.n, _check_period(period)
    B = unknown_noise_columns(view, mixing, model, None, R, noise_once)
    times = range(0, view.rounds, R) if contribution == "every-round" else (0,)
    C = np.stack([sum(view.column(_check_target(u, n), t) for t in times) for u in targets],
                 axis=1)  # fmt: skip
    if B.shape[0] == 0:
        return np.zeros(len(targets))
    w, *_ = np.linalg.lstsq(B, C, rcond=None)
    residual = np.linalg.norm(B @ w - C, axis=0)
    scale = np.maximum(np.linalg.norm(C, axis=0), 1e-300)
    return np.where(residual <= RESIDUAL_RTOL * scale, np.linalg.norm(w, axis=0), math.inf)


def correlated_schedule_view_mu(mixing, *, target: int, observers: Sequence[int], model,
                                sigmas: Sequence[float], sensitivities: Sequence[float],
                                period: int = 1) -> float:  # fmt: skip
    """μ of ``target`` contributing Δ_k at step k with noise σ_k (the independent part's;
    the model's correlated part scales with it), each step ``period`` rounds whose first
    carries the contribution and the fresh sources: :func:`dpdl.accounting.gossip.
    schedule_view_mu` with the noise entering through ``model`` (a gradient canary, p = 1)."""
    view, c, sigmas, R = schedule_view(mixing, target, observers, sigmas, sensitivities, period)
    return min_norm(unknown_noise_columns(view, mixing, model, sigmas, R), c)


def sec_ldp_noise_factor(mixing, *, rounds: int, factor: float,
                         curious: Sequence[int] = ()) -> float:
    """How much more noise one step of DECOR hides a node under against Sec-LDP's adversary
    than its independent part alone: 1/√q, q = max over rounds t < ``rounds`` and honest i of
    [(I + f² L_t)⁻¹]_ii, L_t the Laplacian of round t's undirected graph induced on the honest
    nodes (``curious`` know their secrets and are removed; MATH.md §9.4).

    One step's shares, given every earlier message, are the honest nodes' clipped sums plus
    noise of covariance σ²(I + f² L_t) per coordinate, so moving u's sum by v (‖v‖ ≤ C) is a
    Gaussian mechanism of μ = (C/σ)·√[(I + f² L_t)⁻¹]_uu: the ledger's subsampled Gaussian of
    multiplier z·(this factor) (Poisson sampling of u's records mixes the same two shifted
    Gaussians along the whitened direction), composed adaptively over the steps."""
    P_of, n = _mixing_of(mixing)
    require(isinstance(factor, int | float) and math.isfinite(factor) and factor >= 0,
            f"the pairwise noise factor must be a finite number >= 0, got {factor!r}")
    honest = np.setdiff1d(np.arange(n), [int(c) for c in curious])
    require(honest.size >= 1, "at least one node must be honest")
    worst, seen = 0.0, set()
    for t in range(rounds):
        adjacency = undirected_adjacency(P_of(t))
        if adjacency.tobytes() in seen:  # a periodic schedule repeats its graphs
            continue
        seen.add(adjacency.tobytes())
        A = adjacency[np.ix_(honest, honest)].astype(np.float64)
        L = np.diag(A.sum(axis=1)) - A
        inverse = np.linalg.inv(np.eye(honest.size) + factor**2 * L)
        worst = max(worst, float(np.max(np.diag(inverse))))
    return 1.0 / math.sqrt(worst)


def eavesdropper_view(mixing, *, rounds: int) -> View:
    """The view of an adversary outside the network who sees every message of every round
    and knows no source (Sec-LDP's adversary with no corrupted node): rows (t, j) for every
    node j, row (t, j)'s coefficient on node k's input at round s ≤ t is (P^{t-1}···P^s)_jk."""
    P_of, n = _mixing_of(mixing)
    matrix = np.zeros((n * rounds, n * rounds))
    state = np.zeros((n, n * rounds))  # m^t as a map of every input so far
    for t in range(rounds):
        if t:
            state = P_of(t - 1) @ state
        state[:, t * n : (t + 1) * n] += np.eye(n)
        matrix[t * n : (t + 1) * n] = state
    rows = tuple((t, j) for t in range(rounds) for j in range(n))
    return View(n, rounds, (), rows, matrix)


def correlated_view_mu(mixing, *, rounds: int, target: int, observers: Sequence[int] | int,
                       sigma: float, model, sensitivity: float = 1.0,
                       contribution: str = "every-round", period: int = 1,
                       noise_once: bool = False,
                       progress: Callable[[int], None] | None = None) -> float:  # fmt: skip
    """μ of node ``target`` against the coalition ``observers`` under the correlated noise
    ``model`` (σ the independent part's std); μ = ∞: reconstructible.  ``observers=()``: the
    eavesdropper who sees every message and knows no source (:func:`eavesdropper_view`)."""
    sigma, sensitivity = _check_sigma(sigma, sensitivity)
    _check_target(target, _mixing_of(mixing)[1])
    if isinstance(observers, Sequence) and len(observers) == 0:
        view = eavesdropper_view(mixing, rounds=rounds)
    else:
        view = build_view(mixing, rounds=rounds, observers=observers, progress=progress)
    require(target not in view.observers, f"the target {target} is one of the observers")
    norms = correlated_view_norms(view, mixing, [target], model, contribution, period,
                                  noise_once)  # fmt: skip
    return float(sensitivity / sigma * norms[0])
