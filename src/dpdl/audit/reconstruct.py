"""Reconstruction attacks on gossip (El Mrini, Cyffers & Bellet, "Privacy attacks in
decentralized learning", ICML 2024; MATH.md §9).

A coalition V writes everything it received as linear equations in the honest nodes'
contributions: the *knowledge matrix* K (one row per observed message, one column per honest
node), so that what it saw, less what it knows (its own inputs and noises, the public initial
model), is y = K·a (+ noise).  Node u is **reconstructible** iff e_u lies in the row space of
K: then (K⁺ y)_u = a_u exactly, whatever the other nodes hold.  Membership is read off the
SVD K = U S Vᵀ of rank r: the squared norm of column u of V_r (its *leverage*) is the squared
length of e_u's projection on row(K), 1 exactly when e_u is in it.  The paper reads the same
set off a reduced row echelon form; the SVD gives it without pivoting on rounded entries.

The protocol is the one accounted in :mod:`dpdl.accounting.gossip`: x⁰ = 0, every node sends
m_iᵗ = x_iᵗ + a_iᵗ + z_iᵗ and x^{t+1} = Pᵗ mᵗ; V sees the messages of its in-neighbours outside
V at t = 0..T−1.  ``contribution="once"`` is plain gossip averaging of private values (the
paper's §3); ``"every-round"`` a value added at every round, the paper's model of decentralized
gradient descent with slowly changing gradients (:mod:`dpdl.audit.reconstruct_dgd` runs the
engine itself).  With noise (σ > 0) the same least-squares attack returns a_u plus Gaussian
error; no unbiased estimate of a_u, even by an adversary who knows every other node's value,
has a standard deviation below Δ/μ_u, μ_u the exact view privacy of §9 (a Cramér–Rao bound
that the informed adversary's generalised least squares attains: :func:`informed_estimate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dpdl.accounting.gossip import CONTRIBUTIONS, NOISES, View, build_view
from dpdl.errors import require

__all__ = [
    "LEVERAGE_TOL",
    "Knowledge",
    "Reconstruction",
    "attack_gossip",
    "informed_estimate",
    "knowledge_matrix",
    "least_squares_attack",
    "reconstructible",
    "simulate_gossip",
]

# e_u is in row(K) when its projection keeps all but this fraction of its squared length;
# outside, the leverage is bounded away from 1 (two indistinguishable nodes get 1/2 each).
LEVERAGE_TOL = 1e-8


@dataclass(frozen=True)
class Knowledge:
    """The coalition's view (``view``) and its knowledge matrix over every node's contribution
    (``matrix``, (observations, n); the coalition's own columns are known, not unknowns)."""

    view: View
    contribution: str
    matrix: np.ndarray

    @property
    def honest(self) -> np.ndarray:
        inside = np.zeros(self.view.n, dtype=bool)
        inside[list(self.view.observers)] = True
        return np.flatnonzero(~inside)


def knowledge_matrix(mixing, *, rounds: int, coalition: Sequence[int] | int,
                     contribution: str = "once") -> Knowledge:
    """K: the coefficient of every observed message on every node's contribution."""
    require(contribution in CONTRIBUTIONS,
            f"contribution must be one of {CONTRIBUTIONS}, got {contribution!r}")  # fmt: skip
    view = build_view(mixing, rounds=rounds, observers=coalition)
    n = view.n
    times = range(view.rounds) if contribution == "every-round" else (0,)
    K = sum(view.matrix[:, t * n : (t + 1) * n] for t in times)
    return Knowledge(view, contribution, np.asarray(K, dtype=np.float64))


def _row_space_basis(K: np.ndarray) -> np.ndarray:
    """Orthonormal rows spanning row(K) (numpy's matrix_rank tolerance)."""
    if K.size == 0:
        return np.zeros((0, K.shape[1]))
    _, s, vt = np.linalg.svd(K, full_matrices=False)
    tol = s.max(initial=0.0) * max(K.shape) * np.finfo(np.float64).eps
    return vt[: int((s > tol).sum())]


def reconstructible(knowledge: Knowledge) -> np.ndarray:
    """(n,) bool: the honest nodes whose contribution the coalition recovers exactly."""
    honest = knowledge.honest
    basis = _row_space_basis(knowledge.matrix[:, honest])
    out = np.zeros(knowledge.view.n, dtype=bool)
    out[honest] = (basis**2).sum(axis=0) > 1 - LEVERAGE_TOL
    return out


def least_squares_attack(knowledge: Knowledge, observed: np.ndarray) -> np.ndarray:
    """The attack: K⁺ y for every honest node ((n, ...), NaN on the coalition and wherever the
    contribution is not reconstructible).  ``observed`` is y, (observations, ...), with what
    the coalition knows already subtracted."""
    honest = knowledge.honest
    y = np.asarray(observed, dtype=np.float64)
    require(y.shape[:1] == knowledge.matrix.shape[:1],
            f"observed has {y.shape[:1]} rows for {knowledge.matrix.shape[0]} observations")
    flat = y.reshape(len(y), -1)
    out = np.full((knowledge.view.n, flat.shape[1]), math.nan)
    if len(flat):
        solution, *_ = np.linalg.lstsq(knowledge.matrix[:, honest], flat, rcond=None)
        out[honest] = solution
    out[~reconstructible(knowledge)] = math.nan
    return out.reshape(knowledge.view.n, *y.shape[1:])


def _inputs(values: np.ndarray, rounds: int, contribution: str) -> np.ndarray:
    """(rounds, n, ...) contributions of every node at every round."""
    inputs = np.zeros((rounds, *values.shape))
    inputs[:] = values if contribution == "every-round" else 0.0
    inputs[0] = values
    return inputs


def simulate_gossip(mixing, values: np.ndarray, *, rounds: int, coalition: Sequence[int] | int,
                    sigma: float = 0.0, contribution: str = "once", noise: str = "every-round",
                    rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Run the protocol forward (not through K) and return what the coalition sees and the
    noise every node added: (observed (observations, ...), noises (rounds, n, ...)).  The
    observations follow ``build_view``'s rows: round by round, in-neighbours in node order."""
    from dpdl.accounting.gossip import _mixing_of

    require(contribution in CONTRIBUTIONS, f"contribution must be one of {CONTRIBUTIONS}")
    require(noise in NOISES, f"noise must be one of {NOISES}, got {noise!r}")
    require(math.isfinite(sigma) and sigma >= 0, f"sigma must be >= 0, got {sigma!r}")
    require(sigma == 0 or rng is not None, "noisy gossip needs a generator (rng)")
    P_of, n = _mixing_of(mixing)
    values = np.asarray(values, dtype=np.float64)
    require(values.shape[:1] == (n,), f"values must have one entry per node ({n}), got "
            f"shape {values.shape}")  # fmt: skip
    view = build_view(mixing, rounds=rounds, observers=coalition)
    inputs = _inputs(values, rounds, contribution)
    noises = np.zeros_like(inputs)
    if sigma > 0:
        noisy = rounds if noise == "every-round" else 1
        noises[:noisy] = sigma * rng.standard_normal(noises[:noisy].shape)
    x = np.zeros_like(values)
    messages = []
    for t in range(rounds):
        m = x + inputs[t] + noises[t]
        messages.append(m)
        x = np.einsum("ij,j...->i...", P_of(t), m)
    observed = np.stack([messages[t][j] for t, j in view.rows]) if view.rows else (
        np.zeros((0, *values.shape[1:])))
    return observed, noises


def _known_part(knowledge: Knowledge, values: np.ndarray, noises: np.ndarray) -> np.ndarray:
    """What the coalition's own contributions and noises add to its observations."""
    view, n = knowledge.view, knowledge.view.n
    own = list(view.observers)
    inputs = _inputs(values, view.rounds, knowledge.contribution) + noises
    known = np.zeros((len(view.rows), *values.shape[1:]))
    for t in range(view.rounds):
        block = view.matrix[:, t * n : (t + 1) * n][:, own]
        known += np.tensordot(block, inputs[t][own], axes=(1, 0))
    return known


@dataclass(frozen=True)
class Reconstruction:
    """One attack: which honest nodes are reconstructible, the estimates, the truth."""

    protocol: str
    coalition: tuple[int, ...]
    rounds: int
    sigma: float
    reconstructible: np.ndarray  # (n,) bool
    truth: np.ndarray  # (n, ...)
    estimate: np.ndarray  # (n, ...), NaN where not reconstructed
    extra: dict = field(default_factory=dict)

    @property
    def n(self) -> int:
        return len(self.truth)

    def errors(self) -> np.ndarray:
        """(n,) ‖estimate − truth‖ per node (NaN where not reconstructed)."""
        diff = (self.estimate - self.truth).reshape(self.n, -1)
        return np.sqrt((diff**2).sum(axis=1))

    def relative_errors(self) -> np.ndarray:
        scale = np.sqrt((self.truth.reshape(self.n, -1) ** 2).sum(axis=1))
        return self.errors() / np.maximum(scale, 1e-300)

    def to_dict(self) -> dict:
        def floats(a):
            return [None if not math.isfinite(v) else float(v) for v in np.ravel(a)]

        errors = self.relative_errors()
        hit = self.reconstructible
        return {
            "protocol": self.protocol, "coalition": list(self.coalition),
            "rounds": self.rounds, "sigma": self.sigma,
            "reconstructible": [int(i) for i in np.flatnonzero(hit)],
            "not_reconstructible": [int(i) for i in np.flatnonzero(~hit)
                                    if i not in self.coalition],
            "relative_error": floats(errors),
            "median_relative_error": (float(np.median(errors[hit])) if hit.any() else None),
            **self.extra,
        }  # fmt: skip


def attack_gossip(mixing, values: np.ndarray, *, rounds: int, coalition: Sequence[int] | int,
                  sigma: float = 0.0, contribution: str = "once", noise: str = "every-round",
                  rng: np.random.Generator | None = None) -> Reconstruction:
    """Simulate gossip of ``values`` (noise σ per message) and attack it from ``coalition``."""
    knowledge = knowledge_matrix(mixing, rounds=rounds, coalition=coalition,
                                 contribution=contribution)  # fmt: skip
    values = np.asarray(values, dtype=np.float64)
    observed, noises = simulate_gossip(mixing, values, rounds=rounds, coalition=coalition,
                                       sigma=sigma, contribution=contribution, noise=noise,
                                       rng=rng)  # fmt: skip
    y = observed - _known_part(knowledge, values, noises)
    return Reconstruction(
        "gossip", knowledge.view.observers, rounds, float(sigma), reconstructible(knowledge),
        values, least_squares_attack(knowledge, y),
        {"contribution": contribution, "noise": noise},
    )


def informed_estimate(mixing, observed: np.ndarray, values: np.ndarray, noises: np.ndarray, *,
                      rounds: int, coalition: Sequence[int] | int, target: int,
                      contribution: str = "once", noise: str = "every-round") -> np.ndarray:
    """The strongest adversary of DP: it knows every value but ``target``'s and its own
    noises, and estimates a_target by generalised least squares (the best linear unbiased
    estimate; its standard deviation is exactly σ·Δ/(σ·μ) = Δ/μ per unit of contribution)."""
    from dpdl.accounting.gossip import _honest_columns, gls_weights

    knowledge = knowledge_matrix(mixing, rounds=rounds, coalition=coalition,
                                 contribution=contribution)  # fmt: skip
    view, n = knowledge.view, knowledge.view.n
    require(target not in view.observers, f"the target {target} is one of the observers")
    values = np.asarray(values, dtype=np.float64)
    others = values.copy()
    others[target] = 0.0
    # everything but the target's contribution and the honest noises is known
    y = observed.reshape(len(observed), -1) - knowledge.matrix @ others.reshape(n, -1)
    own_noise = np.zeros_like(noises)
    own_noise[:, list(view.observers)] = noises[:, list(view.observers)]
    y = y - _known_part(knowledge, np.zeros_like(values), own_noise).reshape(len(y), -1)
    w = gls_weights(_honest_columns(view, noise), knowledge.matrix[:, target])
    return (w @ y / (w @ knowledge.matrix[:, target])).reshape(values.shape[1:])
