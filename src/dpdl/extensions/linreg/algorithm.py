"""DP decentralized linear regression (MATH.md §5, seed 001 Algorithm 1), vectorized over nodes.

State: β is an (k, m) array, one row per node. Node i holds X_i (n_i × m) and y_i, with
L_i(β) = ½‖X_i β − y_i‖², so ∇L_i(β) = G_i β − h_i with the Gram matrix G_i = X_iᵀX_i and
h_i = X_iᵀy_i (precomputed once; the step never touches the raw records). For t = 0 … T−1:

1. ω_i(t) with i.i.d. Laplace(0, v(t)) coordinates (v is the *scale*, std √2·v);
2. every node shares β♭_i(t) = β_i(t) + ω_i(t);
3. β♯_i(t) = P_Ω(β♭_i(t));
4. β_i(t+1) = Σ_j W_ij β♯_j(t) − α(t) ∇L_i(β♯_i(t)).

The privacy guarantee (:mod:`dpdl.extensions.linreg.accounting`) covers everything shared,
β♭(0..T−1),
and the final shared estimate β♭(T) = β(T) + ω(T) (its privacy loss is the t = T−1 term of
the sum); the internal β_i(T) itself is not noised, so a publishable estimate is
``released`` = P_Ω(β♭(T)). Utility is ‖β_i(t) − β*‖ against the pooled least-squares β*.
The non-private variant (``noise=None``, ``domain=None``) is decentralized gradient descent,
which converges to β* when Σα(t) = ∞ and α(t) → 0.

The Laplace draws ω are secret randomness: ``seed`` is None (the default: OS entropy), a
``numpy.random.Generator`` or ``SeedSequence`` (an experiment's cell stream), or an int
(reproducible noise, for tests and research only).  A private replica's scales v(t) must all
be finite and > 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse.csgraph import connected_components

from dpdl.algorithms.noise import release_numpy
from dpdl.algorithms.randomness import Randomness, secret_rng
from dpdl.errors import DPDLError, require
from dpdl.extensions.linreg.accounting import (
    LinRegPrivacyReport,
    LinRegSensitivity,
    PowerDecay,
    calibrate_noise_scale,
    data_norm_bounds,
    default_noise_shape,
    privacy_report,
)

__all__ = [
    "Ball",
    "Box",
    "clip_rows",
    "omega_bound",
    "clip_labels",
    "spectral_norm_bound_holds",
    "BoundedData",
    "enforce_data_bounds",
    "PrivateFit",
    "fit_private_linreg",
    "validate_symmetric_mixing",
    "LocalProblems",
    "pooled_least_squares",
    "LinRegResult",
    "run_linreg",
    "run_linreg_replicas",
]


# ---------------------------------------------------------------------------- domains Ω
@dataclass(frozen=True)
class Ball:
    """Ω = {β : ‖β − center‖₂ ≤ radius}; center 0 by default (MATH.md §5's default Ω)."""

    radius: float
    center: np.ndarray | None = None

    def __post_init__(self) -> None:
        require(
            isinstance(self.radius, int | float | np.integer | np.floating)
            and math.isfinite(self.radius)
            and self.radius > 0,
            f"the radius of the ball Ω must be a finite positive number, got {self.radius!r}",
        )
        if self.center is not None:
            center = np.asarray(self.center, dtype=np.float64)
            require(center.ndim == 1 and np.all(np.isfinite(center)),
                    f"the centre of the ball Ω must be a finite vector, got {self.center!r}")
            object.__setattr__(self, "center", center)

    @property
    def bound(self) -> float:
        """B_Ω = sup_{β∈Ω} ‖β‖₂ = ‖center‖ + radius."""
        shift = 0.0 if self.center is None else float(np.linalg.norm(self.center))
        return shift + float(self.radius)

    def project(self, beta: np.ndarray) -> np.ndarray:
        """Euclidean projection of every row (last axis) of ``beta`` onto the ball."""
        center = 0.0 if self.center is None else self.center
        offset = beta - center
        norms = np.sqrt(np.einsum("...i,...i->...", offset, offset))[..., None]
        # rows inside the ball stay as they are (a tiny norm would overflow radius / norm)
        outside = norms > self.radius
        shrink = np.where(outside, self.radius / np.where(outside, norms, 1.0), 1.0)
        return center + offset * shrink

    def contains(self, beta: np.ndarray, *, tol: float = 1e-9) -> np.ndarray:
        center = 0.0 if self.center is None else self.center
        return np.linalg.norm(np.asarray(beta) - center, axis=-1) <= self.radius * (1 + tol)


@dataclass(frozen=True)
class Box:
    """Ω = {β : lower ≤ β ≤ upper} coordinate-wise (scalars broadcast); projection is a clip."""

    lower: np.ndarray | float
    upper: np.ndarray | float

    def __post_init__(self) -> None:
        lower = np.asarray(self.lower, dtype=np.float64)
        upper = np.asarray(self.upper, dtype=np.float64)
        require(np.all(np.isfinite(lower)) and np.all(np.isfinite(upper)),
                f"the box Ω must have finite bounds, got lower={self.lower!r}, "
                f"upper={self.upper!r}")
        require(np.all(lower <= upper),
                f"the box Ω needs lower <= upper, got lower={self.lower!r}, upper={self.upper!r}")
        object.__setattr__(self, "lower", lower)
        object.__setattr__(self, "upper", upper)

    def bound_for(self, num_features: int) -> float:
        """B_Ω = ‖(max(|l_j|, |u_j|))_j‖₂ for an m-dimensional box."""
        corner = np.broadcast_to(np.maximum(np.abs(self.lower), np.abs(self.upper)),
                                 (num_features,))
        return float(np.linalg.norm(corner))

    @property
    def bound(self) -> float:
        if self.lower.ndim == 0 and self.upper.ndim == 0:
            raise DPDLError("a scalar box needs the dimension: use Box.bound_for(m)")
        return self.bound_for(int(np.broadcast_shapes(self.lower.shape, self.upper.shape)[0]))

    def project(self, beta: np.ndarray) -> np.ndarray:
        return np.clip(beta, self.lower, self.upper)

    def contains(self, beta: np.ndarray, *, tol: float = 1e-12) -> np.ndarray:
        beta = np.asarray(beta)
        return np.all((beta >= self.lower - tol) & (beta <= self.upper + tol), axis=-1)


def omega_bound(domain: Ball | Box, num_features: int) -> float:
    return domain.bound_for(num_features) if isinstance(domain, Box) else domain.bound


# ---------------------------------------------------------------- data-norm enforcement
def clip_rows(x: np.ndarray, max_norm: float) -> tuple[np.ndarray, int]:
    """Scale every row of ``x`` to ℓ2 norm at most ``max_norm``; returns (clipped, #clipped).

    Then ‖X_i‖₂ ≤ max_norm·√n_i (MATH.md §5: δ_X = r√n_M, not r).
    """
    require(math.isfinite(max_norm) and max_norm > 0,
            f"the row clipping norm must be a finite positive number, got {max_norm!r}")
    x = np.asarray(x, dtype=np.float64)
    require(x.ndim == 2, f"features must be a 2-D (records, features) array, got {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    scale = np.minimum(1.0, max_norm / np.maximum(norms, np.finfo(np.float64).tiny))
    return x * scale, int(np.count_nonzero(scale < 1.0))


def clip_labels(y: np.ndarray, bound: float) -> tuple[np.ndarray, int]:
    """Clip every label to [−bound, bound]; returns (clipped, #clipped). ‖y_i‖₂ ≤ bound·√n_i."""
    require(math.isfinite(bound) and bound > 0,
            f"the label clipping bound must be a finite positive number, got {bound!r}")
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    return np.clip(y, -bound, bound), int(np.count_nonzero(np.abs(y) > bound))


def spectral_norm_bound_holds(
    x_parts: Sequence[np.ndarray], y_parts: Sequence[np.ndarray], delta_x: float, delta_y: float
) -> bool:
    """Whether every node satisfies ‖X_i‖₂ ≤ δ_X and ‖y_i‖₂ ≤ δ_y (with a 1e-9 relative slack)."""
    for x, y in zip(x_parts, y_parts, strict=True):
        if np.linalg.norm(np.asarray(x, dtype=np.float64), ord=2) > delta_x * (1 + 1e-9):
            return False
        if np.linalg.norm(np.asarray(y, dtype=np.float64)) > delta_y * (1 + 1e-9):
            return False
    return True


@dataclass(frozen=True)
class BoundedData:
    """Per-node blocks after clipping, with the data-norm bounds they provably satisfy."""

    x_parts: list[np.ndarray]
    y_parts: list[np.ndarray]
    delta_x: float
    delta_y: float
    row_clip: float
    label_clip: float
    max_local_records: int
    rows_clipped: int
    labels_clipped: int

    def describe(self) -> str:
        records = sum(len(y) for y in self.y_parts)
        return (f"data-norm bounds enforced by clipping {self.rows_clipped} of {records} "
                f"feature rows to norm {self.row_clip:g} and {self.labels_clipped} labels to "
                f"|y| <= {self.label_clip:g}: delta_X = {self.delta_x:.4g}, "
                f"delta_y = {self.delta_y:.4g} (n_M = {self.max_local_records})")


def enforce_data_bounds(
    x_parts: Sequence[np.ndarray], y_parts: Sequence[np.ndarray], *, row_clip: float,
    label_clip: float,
) -> BoundedData:
    """Clip every node's rows and labels so that ‖X_i‖₂ ≤ δ_X = r√n_M and ‖y_i‖₂ ≤ δ_y =
    r_y√n_M (MATH.md §5), then verify the bounds on the clipped blocks (fails closed)."""
    require(len(x_parts) >= 1 and len(x_parts) == len(y_parts),
            f"need one (X_i, y_i) per node; got {len(x_parts)} feature and {len(y_parts)} "
            "label blocks")
    x_clipped, rows = zip(*(clip_rows(x, row_clip) for x in x_parts), strict=True)
    y_clipped, labels = zip(*(clip_labels(y, label_clip) for y in y_parts), strict=True)
    n_max = max(len(y) for y in y_clipped)
    delta_x, delta_y = data_norm_bounds(row_clip, label_clip, n_max)
    if not spectral_norm_bound_holds(x_clipped, y_clipped, delta_x, delta_y):
        raise DPDLError("a node's data exceed the data-norm bounds after clipping; refusing "
                        "to claim the privacy guarantee")  # pragma: no cover (a theorem)
    return BoundedData(list(x_clipped), list(y_clipped), delta_x, delta_y, float(row_clip),
                       float(label_clip), n_max, int(sum(rows)), int(sum(labels)))


# ------------------------------------------------------------------------- mixing matrix
def validate_symmetric_mixing(w: np.ndarray, *, atol: float = 1e-10) -> np.ndarray:
    """Check MATH.md §5's W: square, non-negative, symmetric, doubly stochastic, positive
    diagonal, and a connected graph. Returns W as float64."""
    w = np.asarray(w, dtype=np.float64)
    require(w.ndim == 2 and w.shape[0] == w.shape[1] and w.shape[0] >= 1,
            f"the mixing matrix W must be square, got shape {w.shape}")
    require(np.all(np.isfinite(w)), "the mixing matrix W has non-finite entries")
    require(np.all(w >= -atol), f"the mixing matrix W has a negative entry {w.min()!r}")
    asym = float(np.max(np.abs(w - w.T)))
    require(asym <= atol, f"the mixing matrix W must be symmetric; max |W - W^T| = {asym:.3g}")
    row_err = float(np.max(np.abs(w.sum(axis=1) - 1.0)))
    require(row_err <= atol,
            f"the mixing matrix W must be doubly stochastic; max |row sum - 1| = {row_err:.3g}")
    require(np.all(np.diag(w) > 0), "the mixing matrix W needs W_ii > 0 for every node")
    n_components, _ = connected_components(w > atol, directed=False)
    require(n_components == 1,
            f"the graph of W must be connected, it has {n_components} components")
    return w


# -------------------------------------------------------------------------- local problems
@dataclass(frozen=True)
class LocalProblems:
    """The per-node least-squares problems in the form the iteration needs.

    gram: (k, m, m) stack of X_iᵀX_i; xty: (k, m) stack of X_iᵀy_i; records: (k,) n_i.
    """

    gram: np.ndarray
    xty: np.ndarray
    records: np.ndarray

    @classmethod
    def from_parts(cls, x_parts: Sequence[np.ndarray], y_parts: Sequence[np.ndarray]):
        require(len(x_parts) >= 1 and len(x_parts) == len(y_parts),
                f"need one (X_i, y_i) per node; got {len(x_parts)} feature and "
                f"{len(y_parts)} label blocks")
        xs = [np.asarray(x, dtype=np.float64) for x in x_parts]
        ys = [np.asarray(y, dtype=np.float64).reshape(-1) for y in y_parts]
        m = xs[0].shape[1] if xs[0].ndim == 2 else -1
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            require(x.ndim == 2 and x.shape[1] == m,
                    f"node {i}: features must be (n_i, {m}), got {x.shape}")
            require(x.shape[0] == y.shape[0] and x.shape[0] >= 1,
                    f"node {i}: {x.shape[0]} feature rows but {y.shape[0]} labels")
            require(np.all(np.isfinite(x)) and np.all(np.isfinite(y)),
                    f"node {i}: data contain non-finite values")
        return cls(
            gram=np.stack([x.T @ x for x in xs]),
            xty=np.stack([x.T @ y for x, y in zip(xs, ys, strict=True)]),
            records=np.array([x.shape[0] for x in xs]),
        )

    @property
    def num_nodes(self) -> int:
        return int(self.gram.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.gram.shape[1])

    def gradients(self, beta: np.ndarray) -> np.ndarray:
        """∇L_i(β_i) = X_iᵀX_i β_i − X_iᵀy_i for every node at once (β: (k, m))."""
        return (self.gram @ beta[..., None])[..., 0] - self.xty

    def replica_gradients(self, beta: np.ndarray) -> np.ndarray:
        """The same for a node-major stack of replicas, β: (k, R, m) -> (k, R, m).

        One batched (R, m) @ (m, m) product per node (X_iᵀX_i is symmetric).
        """
        return beta @ self.gram - self.xty[:, None, :]

    def pooled_solution(self) -> np.ndarray:
        """β* = (XᵀX)⁻¹Xᵀy of the pooled data, from the summed normal equations."""
        gram = self.gram.sum(axis=0)
        rank = np.linalg.matrix_rank(gram)
        require(rank == self.num_features,
                f"the pooled data have rank {rank} < {self.num_features} features: "
                "β* = (XᵀX)⁻¹Xᵀy is not unique")
        return np.linalg.solve(gram, self.xty.sum(axis=0))


def pooled_least_squares(x_parts: Sequence[np.ndarray], y_parts: Sequence[np.ndarray]):
    """β* of the pooled data (MATH.md §5 utility reference), by ``numpy.linalg.lstsq``."""
    x = np.concatenate([np.asarray(p, dtype=np.float64) for p in x_parts])
    y = np.concatenate([np.asarray(p, dtype=np.float64).reshape(-1) for p in y_parts])
    return np.linalg.lstsq(x, y, rcond=None)[0]


# ------------------------------------------------------------------------------ iteration
@dataclass
class LinRegResult:
    """What one run recorded.

    steps: the recorded t (0 … T); errors: (len(steps), k) ‖β_i(t) − β*‖;
    consensus: (len(steps),) max_i ‖β_i(t) − mean_j β_j(t)‖; beta: final β(T), (k, m);
    released: P_Ω(β(T) + ω(T)), the private estimate a node may publish (= β(T) when
    non-private); released_errors: (k,) its distance to β*; noise_scale: v(t) per step t < T
    (zeros when non-private); shared: (len(steps), k, m) what the nodes released at the
    recorded t, P_Ω(β♭_i(t)) (the projection of the shared noisy β♭, post-processing), and
    ``released`` at t = T.  ``errors``, ``consensus``, ``beta`` and ``released_errors`` are
    noise-free functions of the private data (β* is the pooled solution); ``shared`` and
    ``released`` are what the privacy guarantee covers.
    """

    steps: np.ndarray
    errors: np.ndarray
    consensus: np.ndarray
    beta: np.ndarray
    released: np.ndarray
    released_errors: np.ndarray
    beta_star: np.ndarray
    noise_scale: np.ndarray
    shared: np.ndarray
    trajectory: np.ndarray | None = None  # (len(steps), k, m) when requested


def run_linreg(
    problems: LocalProblems,
    mixing: np.ndarray,
    *,
    steps: int,
    alpha: PowerDecay,
    noise: PowerDecay | None,
    domain: Ball | Box | None,
    seed: Randomness = None,
    beta0: np.ndarray | None = None,
    beta_star: np.ndarray | None = None,
    record_every: int = 1,
    keep_trajectory: bool = False,
) -> LinRegResult:
    """Run T steps of MATH.md §5's algorithm for all nodes at once.

    ``noise=None`` skips step 1 and ``domain=None`` skips step 3 (the non-private baseline).
    Privacy-critical: a private run must have both (the guarantee needs ‖β♯‖ ≤ B_Ω), so
    noise without a domain is refused. ``beta0`` (default 0) may be (m,) or (k, m);
    ``beta_star`` defaults to the pooled least-squares solution. Laplace draws come from
    :func:`dpdl.algorithms.randomness.secret_rng` (seed None: a ChaCha20 key from the OS).
    """
    return run_linreg_replicas(
        problems, mixing, steps=steps, alpha=alpha, noises=[noise], domain=domain,
        seeds=[seed], beta0=beta0, beta_star=beta_star, record_every=record_every,
        keep_trajectory=keep_trajectory,
    )[0]


def run_linreg_replicas(
    problems: LocalProblems,
    mixing: np.ndarray,
    *,
    steps: int,
    alpha: PowerDecay,
    noises: Sequence[PowerDecay | None],
    domain: Ball | Box | None,
    seeds: Sequence[Randomness],
    beta0: np.ndarray | None = None,
    beta_star: np.ndarray | None = None,
    record_every: int = 1,
    keep_trajectory: bool = False,
) -> list[LinRegResult]:
    """Run independent replicas (one per ``(noises[r], seeds[r])``) in one vectorized loop.

    The state is an (R, k, m) array; replica r gives exactly what :func:`run_linreg` gives
    with ``noise=noises[r], seed=seeds[r]``. Non-private replicas (noise None) are neither
    noised nor projected; private ones need ``domain``.
    """
    private, w, beta_star, start = _checked_replica_inputs(
        problems, mixing, steps=steps, noises=noises, domain=domain, seeds=seeds, beta0=beta0,
        beta_star=beta_star, record_every=record_every)
    k, m, replicas = problems.num_nodes, problems.num_features, len(seeds)
    # Node-major state (k, R, m): mixing is then one (k, k) @ (k, R·m) product.
    beta = np.broadcast_to(start.reshape(-1, 1, m) if start.ndim == 2 else start,
                           (k, replicas, m)).copy()
    rngs = [secret_rng(seed) for seed in seeds]
    times = np.arange(steps + 1)
    scales = _laplace_scales(noises, times, private)
    recorder = _Recorder(np.unique(np.append(times[::record_every], steps)), beta_star,
                         replicas, k, m, keep_trajectory)  # fmt: skip
    beta = _iterate(problems, w, beta, alpha(times[:-1]), scales, rngs, private, domain,
                    recorder)  # fmt: skip
    state, (beta, released) = beta, _release(beta, scales[:, steps], rngs, private, domain)
    recorder.record(state, released.transpose(1, 0, 2))
    released_errors = np.linalg.norm(released - beta_star, axis=-1)
    return [
        LinRegResult(
            steps=recorder.record_at,
            errors=recorder.errors[:, r],
            consensus=recorder.consensus[:, r],
            beta=beta[r],
            released=released[r],
            released_errors=released_errors[r],
            beta_star=beta_star,
            noise_scale=scales[r, :-1],
            shared=recorder.shared[:, r],
            trajectory=None if recorder.trajectory is None else recorder.trajectory[:, r],
        )
        for r in range(replicas)
    ]


def _checked_replica_inputs(problems: LocalProblems, mixing: np.ndarray, *, steps: int,
                            noises: Sequence[PowerDecay | None], domain: Ball | Box | None,
                            seeds: Sequence[Randomness], beta0: np.ndarray | None,
                            beta_star: np.ndarray | None, record_every: int):
    """Refuse what :func:`run_linreg_replicas` cannot run; returns which replicas are
    private, the checked mixing matrix, β* (default: the pooled solution) and β(0)."""
    require(isinstance(steps, int | np.integer) and not isinstance(steps, bool) and steps >= 1,
            f"steps (T) must be a positive integer, got {steps!r}")
    require(isinstance(record_every, int | np.integer) and record_every >= 1,
            f"record_every must be a positive integer, got {record_every!r}")
    require(len(noises) == len(seeds) and len(seeds) >= 1,
            f"need one seed per replica: {len(noises)} noise schedules, {len(seeds)} seeds")
    private = np.array([noise is not None for noise in noises])
    require(not private.any() or domain is not None,
            "a private run (noise given) needs the projection domain Ω: the privacy bound "
            "uses ‖P_Ω(β)‖ ≤ B_Ω")
    k, m = problems.num_nodes, problems.num_features
    w = validate_symmetric_mixing(mixing)
    require(w.shape[0] == k, f"the mixing matrix is {w.shape[0]}x{w.shape[0]} but there are "
                             f"{k} nodes")
    if beta_star is None:
        beta_star = problems.pooled_solution()
    beta_star = np.asarray(beta_star, dtype=np.float64)
    require(beta_star.shape == (m,), f"beta_star must have shape ({m},), got {beta_star.shape}")
    start = np.zeros((k, m)) if beta0 is None else np.asarray(beta0, dtype=np.float64)
    require(start.shape in ((m,), (k, m)), f"beta0 must have shape ({m},) or ({k}, {m}), "
                                           f"got {start.shape}")
    return private, w, beta_star, start


def _laplace_scales(noises: Sequence[PowerDecay | None], times: np.ndarray,
                    private: np.ndarray) -> np.ndarray:
    """(R, T+1) Laplace scales v(t); zero rows for non-private replicas."""
    scales = np.stack([np.zeros(len(times)) if noise is None else noise(times)
                       for noise in noises])
    for r in np.flatnonzero(private):  # no silent zero noise in a private replica
        bad = ~(np.isfinite(scales[r]) & (scales[r] > 0))
        if bad.any():
            t = int(np.argmax(bad))
            raise DPDLError(f"replica {r}: the Laplace scale v({t}) = {float(scales[r, t])!r} "
                            "must be finite and > 0 in a private run (noise=None is the "
                            "non-private one)")
    return scales


class _Recorder:
    """What the replicas record at the steps ``record_at``, filled in order."""

    def __init__(self, record_at: np.ndarray, beta_star: np.ndarray, replicas: int, k: int,
                 m: int, keep_trajectory: bool) -> None:
        self.record_at, self.beta_star, self.slot = record_at, beta_star, 0
        self.errors = np.empty((len(record_at), replicas, k))
        self.consensus = np.empty((len(record_at), replicas))
        self.trajectory = (np.empty((len(record_at), replicas, k, m)) if keep_trajectory
                           else None)  # fmt: skip
        self.shared = np.empty((len(record_at), replicas, k, m))

    def due(self, t: int) -> bool:
        return self.record_at[self.slot] == t

    def record(self, state: np.ndarray, sent: np.ndarray) -> None:
        """``state`` β(t) and ``sent`` what was released at t, both (k, R, m)."""
        slot = self.slot
        self.errors[slot] = np.linalg.norm(state - self.beta_star, axis=-1).T
        self.consensus[slot] = np.linalg.norm(state - state.mean(axis=0, keepdims=True),
                                              axis=-1).max(axis=0)
        self.shared[slot] = sent.transpose(1, 0, 2)
        if self.trajectory is not None:
            self.trajectory[slot] = state.transpose(1, 0, 2)
        self.slot += 1


def _iterate(problems: LocalProblems, w: np.ndarray, beta: np.ndarray, step_sizes: np.ndarray,
             scales: np.ndarray, rngs: list, private: np.ndarray, domain: Ball | Box | None,
             recorder: _Recorder) -> np.ndarray:
    """The T noisy, projected gossip-and-gradient steps on the (k, R, m) state; returns β(T).

    Each private replica's shares come from its own stream: released exactly in law as
    round_g(β + v(t) L), L standard Laplace (:func:`dpdl.algorithms.noise.release_numpy`:
    the Laplace mechanism's output on a grid, no floating-point sampler in it)."""
    k, replicas, m = beta.shape
    steps = len(step_sizes)
    project_all = domain is not None and private.all()
    with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported below
        for t in range(steps):
            shared = beta.copy()
            for r in np.flatnonzero(private):
                shared[:, r] = release_numpy(beta[:, r], float(scales[r, t]), rngs[r], "laplace")
            if project_all:
                projected = domain.project(shared)
            elif domain is not None and private.any():
                projected = np.where(private[:, None], domain.project(shared), shared)
            else:
                projected = shared
            if recorder.due(t):
                _check_finite(beta, t, step_sizes)
                recorder.record(beta, projected)
            mixed = (w @ projected.reshape(k, -1)).reshape(k, replicas, m)
            beta = mixed - step_sizes[t] * problems.replica_gradients(projected)
        _check_finite(beta, steps - 1, step_sizes)
    return beta


def _release(state: np.ndarray, final_scales: np.ndarray, rngs: list, private: np.ndarray,
             domain: Ball | Box | None) -> tuple[np.ndarray, np.ndarray]:
    """β(T) per replica, (R, k, m), and what a node may publish: P_Ω(β(T) + ω(T)) for a
    private replica (its last draws), β(T) itself for a non-private one."""
    beta = state.transpose(1, 0, 2)
    released = beta.copy()
    for r in np.flatnonzero(private):
        released[r] = domain.project(release_numpy(beta[r], float(final_scales[r]), rngs[r],
                                                   "laplace"))  # fmt: skip
    return beta, released


def _check_finite(beta: np.ndarray, t: int, step_sizes: np.ndarray) -> None:
    if not np.all(np.isfinite(beta)):
        raise DPDLError(
            f"the iteration diverged by t = {t} (alpha(t) = {step_sizes[t]:.3g}); "
            "reduce c_alpha or use a projection domain"
        )


@dataclass(frozen=True)
class PrivateFit:
    """A private run with what backs its guarantee: the clipped data and the ε report."""

    result: LinRegResult
    privacy: LinRegPrivacyReport
    data: BoundedData
    noise: PowerDecay


def fit_private_linreg(
    x_parts: Sequence[np.ndarray],
    y_parts: Sequence[np.ndarray],
    mixing: np.ndarray,
    *,
    epsilon: float,
    steps: int,
    alpha: PowerDecay,
    domain: Ball | Box,
    row_clip: float,
    label_clip: float,
    seed: Randomness = None,
    noise_shape: tuple[float, float] | None = None,
    record_every: int = 1,
) -> PrivateFit:
    """ε-DP decentralized linear regression end to end (MATH.md §5), failing closed.

    Clips the data (:func:`enforce_data_bounds`), calibrates c_v so that the exact ε_T sum
    is ``epsilon`` (``noise_shape`` is the noise's (d_v, e_v); None:
    :func:`dpdl.extensions.linreg.accounting.default_noise_shape`),
    and runs the algorithm; β* is the pooled least-squares solution of the clipped data.
    """
    require(domain is not None, "a private fit needs the projection domain Ω")
    bounded = enforce_data_bounds(x_parts, y_parts, row_clip=row_clip, label_clip=label_clip)
    problems = LocalProblems.from_parts(bounded.x_parts, bounded.y_parts)
    m, k = problems.num_features, problems.num_nodes
    sensitivity = LinRegSensitivity(bounded.delta_x, bounded.delta_y, omega_bound(domain, m),
                                    m, bounded.max_local_records, k)
    d_v, e_v = default_noise_shape(alpha) if noise_shape is None else noise_shape
    noise = calibrate_noise_scale(epsilon, sensitivity, alpha, steps,
                                  noise_offset=d_v, noise_exponent=e_v)  # fmt: skip
    result = run_linreg(problems, mixing, steps=steps, alpha=alpha, noise=noise, domain=domain,
                        seed=seed, record_every=record_every)
    return PrivateFit(result, privacy_report(sensitivity, alpha, noise, steps), bounded, noise)
