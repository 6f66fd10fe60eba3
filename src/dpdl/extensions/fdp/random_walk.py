"""PN-f-DP of random-walk DP-SGD on any graph (MATH.md §7; seed 003, Lemmas 4.1–4.3).

A token walks on the graph with row-stochastic W (W_ab = Pr(token moves a → b)); the node
holding it takes K_loc noisy local steps and passes it on. Node j sees the token whenever the
walk reaches it, so one contribution of node i reaches j after a random number t of hops
(the first hitting time of j from i) and is then μ_t-GDP, or never within T steps.

* First-hitting weights without the (T+1)·n² table: per observer j, h_1 = W e_j and
  h_{t+1} = W (h_t with entry j zeroed) (the product with W̃_j = W whose column j is
  zeroed), for a chunk of observers at once (one n×m product per hop, sparse when W is);
  w_t(i, j) = h_t[i] is added to the bin of μ_t² as soon as it is produced.
  :func:`first_hitting_weights` still returns the table for small problems.
* Truncation (``tolerance``): once every pair's not-yet-reached mass is below it, that mass
  is put on the next hop's μ (the largest any later hop has): a dominating law, so still a
  certified bound; n = 256, T = 20000 stops after a few thousand hops.
* Per-hop μ_t (``hop_form``): ``lemma`` = Lemma 4.3's √K_loc·Δ/(σ√(t·K_loc+1)) (default),
  ``table`` = √K_loc·Δ/(σ√t), what the code behind the paper's Table 3 uses (more
  conservative; reproduces its σ column); or for a c-contractive hop map (strongly convex,
  Lemma 4.2, lemma form only) g_t² = c^{2t}(1 − c²)/(1 − c^{2(t+1)}).
* The single-visit view reveals the hop count, so its f is the revealed mixture
  Σ_t w_t·G_{μ_t} + w_{T+1}·Id (CDF of the privacy loss F(y) = Σ_t w_t Φ(y/μ_t − μ_t/2) +
  w_{T+1}·1{y ≥ 0}); k of them compose to δ(ε) = E[δ_G(ε; √S)], S the sum of k independent
  copies of μ². The law of S is computed on a grid by one FFT per pair class, with μ²
  rounded *up* (certified upper bound) and, on request, *down* (the optimistic twin).
  The grid step is ``relative_slack · μ_1²``, so the total rounding of S is at most
  ``relative_slack · k · μ_1²``: sized by the number of compositions k, not by T.
* k = ⌊T/n⌋ under a contribution cap, or k = ⌈(1+ζ)T/n⌉ with the Markov-chain (Hoeffding
  for reversible chains) slack δ' = exp(−(1−λ)/(1+λ) · 2ζ²T/n²), λ = max(λ₂(W), 0).
* The k-fold law's negative FFT round-off is clipped to 0. FFT round-off (≈1e-16 per
  point) is not bounded rigorously; it is many orders of magnitude below the δ of interest.
* Pairs whose binned laws agree to 1e-12 (e.g. equal Hamming distance on a hypercube) share
  one computation, also across chunks: the representative's tail sums P(μ² ≥ b) are the
  group's rounded *up*, which dominates every member, so the shared answer is an upper
  bound for each of them.

The RDP baseline (Cyffers et al. 2024, MATH.md §7) is ρ_ij = Δ²(T·H_T/(σ²n²) +
T·[log W]_ij/(σ²n)), (α, αρ_ij)-RDP for all α > 1, converted with dp_accounting's RDP
conversion. "RDP (HT)" (seed 003's Table 1 / Figure 1c) replaces its spectral estimate of
the hitting times by the exact first-hitting weights: ρ_ij = K_loc·Δ²·(T/n)·Σ_t w_t/(tσ²).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq
from scipy.special import ndtr

from dpdl.accounting.calibration import calibrate_safe
from dpdl.accounting.pairwise import PairwiseEpsilon
from dpdl.accounting.rdp import rdp_epsilon
from dpdl.errors import DPDLError, require
from dpdl.extensions.fdp.tradeoff import (
    RevealedGaussianMixture,
    gaussian_log_delta,
    self_convolve,
)

__all__ = [
    "DEFAULT_TOLERANCE",
    "HOP_FORMS",
    "walk_matrix",
    "first_hitting_weights",
    "per_hop_mu",
    "composition_count",
    "markov_slack_delta",
    "single_visit_tradeoff",
    "PairwiseReport",
    "BoundSettings",
    "pnfdp_epsilon",
    "pnfdp_epsilon_matrix",
    "rdp_baseline_rho",
    "rdp_baseline_epsilon",
    "rdp_epsilon_from_rho",
    "rdp_ht_epsilon",
    "rdp_ht_epsilon_from_rho",
    "calibrate_sigma_pnfdp",
    "calibrate_sigma_rdp_baseline",
]

HOP_FORMS = ("lemma", "table")
DEFAULT_TOLERANCE = 1e-12


@dataclass(frozen=True)
class BoundSettings:
    """How a PN-f-DP bound is computed (shared by :func:`pnfdp_epsilon`,
    :func:`pnfdp_epsilon_matrix` and :func:`calibrate_sigma_pnfdp`): the per-step
    ``sensitivity``, ``local_steps`` K_loc, the hop map's ``contraction``, the optional
    composition cap ``zeta``, the discretisation's ``relative_slack``, the ``hop_form``
    ("lemma" or "table") and the truncation ``tolerance`` of the hitting laws."""

    sensitivity: float = 1.0
    local_steps: int = 1
    contraction: float = 1.0
    zeta: float | None = None
    relative_slack: float = 1e-4
    hop_form: str = "lemma"
    tolerance: float = DEFAULT_TOLERANCE

    def fields(self) -> tuple:
        """(sensitivity, local_steps, contraction, zeta, relative_slack, hop_form, tolerance)."""
        return (self.sensitivity, self.local_steps, self.contraction, self.zeta,
                self.relative_slack, self.hop_form, self.tolerance)
_MAX_WEIGHT_ENTRIES = 2e8
_CALIBRATION_CANDIDATES = 32
_TINY = 1e-280


def walk_matrix(matrix: ArrayLike) -> np.ndarray:
    """Validate a row-stochastic walk matrix (W_ab = Pr(a → b)); for undirected graphs the
    symmetric mixing matrix of ``dpdl.topology`` is already one (for a directed graph pass
    the transpose of its column-stochastic P)."""
    W = np.asarray(matrix, dtype=float)
    require(W.ndim == 2 and W.shape[0] == W.shape[1] and W.shape[0] >= 2,
            f"walk matrix must be square n×n with n >= 2, got shape {W.shape}")
    require(bool(np.all(np.isfinite(W)) and np.all(W >= 0)),
            "walk matrix entries must be finite and >= 0")
    rows = W.sum(axis=1)
    bad = int(np.argmax(np.abs(rows - 1)))
    require(abs(rows[bad] - 1) < 1e-9,
            f"walk matrix must be row-stochastic; row {bad} sums to {rows[bad]!r}")
    return W


def node_transitive_symmetry(walk: ArrayLike) -> str | None:
    """A group of exact automorphisms of W that moves any node to node 0, if W has one of
    two: ``"cyclic"`` (W[i+1, j+1] = W[i, j] mod n: rings, complete graphs, circulants) or
    ``"xor"`` (W[i⊕k, j⊕k] = W[i, j] for every k: hypercubes, n a power of two).

    With one, the pair (i → j) has the law of (g(i) → 0) for the g with g(j) = 0, so
    observer 0's column holds every pair's law. Only exact equality counts (a W that is
    nearly symmetric gets no shortcut): the check is n² comparisons per generator."""
    W = walk_matrix(walk)
    n = W.shape[0]
    shift = np.roll(np.arange(n), -1)
    if np.array_equal(W[np.ix_(shift, shift)], W):
        return "cyclic"
    if n & (n - 1) == 0:
        nodes = np.arange(n)
        generators = [nodes ^ (1 << b) for b in range(n.bit_length() - 1)]
        if all(np.array_equal(W[np.ix_(g, g)], W) for g in generators):
            return "xor"
    return None


def _pair_to_observer_zero(symmetry: str, n: int) -> np.ndarray:
    """index[i, j]: the source s with (i → j) ≅ (s → 0) under the group."""
    i, j = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return (i - j) % n if symmetry == "cyclic" else i ^ j


def _check_steps(steps: int) -> int:
    require(isinstance(steps, int | np.integer) and steps >= 1,
            f"steps (T) must be a positive integer, got {steps!r}")
    return int(steps)


def first_hitting_weights(walk: ArrayLike, steps: int, *, target: int | None = None) -> np.ndarray:
    """First-hitting weights of MATH.md §7 (the reference's w_t), vectorized over pairs.

    Returns shape (T+1, n, n) with ``out[t-1, i, j]`` = Pr(the walk from i first reaches j
    at hop t) for t = 1..T and ``out[T, i, j]`` = Pr(it does not within T hops); with
    ``target=j`` only that column, shape (T+1, n). Diagonal entries are meaningless (i = j).
    """
    W = walk_matrix(walk)
    T = _check_steps(steps)
    n = W.shape[0]
    if target is not None:
        require(isinstance(target, int | np.integer) and 0 <= target < n,
                f"target node must be in [0, {n}), got {target!r}")
        masked = W.copy()
        masked[:, target] = 0.0
        out = np.empty((T + 1, n))
        h = W[:, target].copy()
        for t in range(T):  # a recurrence over hops: each step one matrix-vector product
            out[t] = h
            h = masked @ h
        out[T] = 1.0 - out[:T].sum(axis=0)
        np.clip(out[T], 0.0, None, out=out[T])
        return out
    require((T + 1) * n * n <= _MAX_WEIGHT_ENTRIES,
            f"(T+1)·n² = {(T + 1) * n * n:.3g} weights exceed {_MAX_WEIGHT_ENTRIES:.0e}; "
            "use fewer steps or pass target=")
    out = np.empty((T + 1, n, n))
    H = W.copy()
    for t in range(T):  # one n×n product per hop covers all n² pairs
        out[t] = H
        H = W @ H - W * np.diag(H)[None, :]
    out[T] = 1.0 - out[:T].sum(axis=0)
    np.clip(out[T], 0.0, None, out=out[T])
    return out


def per_hop_mu(steps: int, sigma: float, *, sensitivity: float = 1.0, local_steps: int = 1,
               contraction: float = 1.0, hop_form: str = "lemma") -> np.ndarray:
    """μ_t for t = 1..T (MATH.md §7), K = ``local_steps``, Δ = ``sensitivity``:

    * ``hop_form="lemma"`` (default) — Lemma 4.3 of seed 003: √K·Δ/(σ√(tK+1));
    * ``hop_form="table"`` — what the script behind the paper's Table 3 uses: √K·Δ/(σ√t),
      larger for every t (more conservative); it reproduces the paper's σ column;
    * ``contraction`` c < 1 (lemma form only) — a c-contractive hop map (strongly convex,
      Lemma 4.2): √K·Δ/σ · c^t √((1−c²)/(1−c^{2(t+1)})).

    c is the Lipschitz constant of one hop's noiseless update map (for an m-strongly convex,
    L-smooth loss and η ≤ 2/(m+L), c = (1 − ηm)^{K_loc}); the intermediate noise draws of a
    hop are given no shift, which only loosens the bound.
    """
    T = _check_steps(steps)
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    require(math.isfinite(sensitivity) and sensitivity > 0,
            f"sensitivity must be > 0, got {sensitivity!r}")
    require(isinstance(local_steps, int | np.integer) and local_steps >= 1,
            f"local_steps must be a positive integer, got {local_steps!r}")
    require(0 < contraction <= 1, f"contraction must lie in (0, 1], got {contraction!r}")
    require(hop_form in HOP_FORMS, f"hop_form must be one of {HOP_FORMS}, got {hop_form!r}")
    require(contraction == 1.0 or hop_form == "lemma",
            f"contraction={contraction!r} needs hop_form='lemma' (the table form has none)")
    t = np.arange(1, T + 1, dtype=float)
    if hop_form == "table":
        shape = 1.0 / np.sqrt(t)
    elif contraction == 1.0:
        shape = 1.0 / np.sqrt(t + 1.0 / local_steps)  # √K/√(tK+1) = 1/√(t + 1/K)
        return sensitivity / sigma * shape
    else:
        c2 = contraction**2
        # c^{2t}(1−c²)/(1−c^{2(t+1)}) in log space (c^{2t} underflows for long walks)
        log_g2 = t * math.log(c2) + math.log1p(-c2) - np.log(-np.expm1((t + 1) * math.log(c2)))
        with np.errstate(under="ignore"):
            shape = np.exp(log_g2 / 2)
    return math.sqrt(local_steps) * sensitivity / sigma * shape


def markov_slack_delta(walk: ArrayLike, steps: int, zeta: float) -> float:
    """δ' = exp(−(1−λ)/(1+λ) · 2ζ²T/n²), λ = max(λ₂, 0) (MATH.md §7).

    The Hoeffding bound for Markov chains needs a reversible chain started at its uniform
    stationary law, so W must be symmetric (fails closed otherwise).
    """
    W = walk_matrix(walk)
    T = _check_steps(steps)
    require(math.isfinite(zeta) and zeta > 0, f"zeta must be > 0, got {zeta!r}")
    require(np.allclose(W, W.T, atol=1e-12),
            "the zeta slack needs a symmetric (reversible, uniform-stationary) walk matrix")
    n = W.shape[0]
    eigenvalues = np.linalg.eigvalsh((W + W.T) / 2)
    lam = max(float(eigenvalues[-2]), 0.0)
    require(lam < 1 - 1e-12, "the walk matrix is not connected (λ₂ = 1): no concentration")
    return math.exp(-(1 - lam) / (1 + lam) * 2 * zeta**2 * T / n**2)


def composition_count(n: int, steps: int, *, zeta: float | None = None) -> int:
    """k = ⌊T/n⌋ (contribution cap) or ⌈(1+ζ)T/n⌉ (ζ slack) (MATH.md §7)."""
    T = _check_steps(steps)
    if zeta is None:
        k = T // n
        require(k >= 1, f"steps T={T} < n={n}: the cap ⌊T/n⌋ allows no contribution")
        return k
    require(math.isfinite(zeta) and zeta > 0, f"zeta must be > 0, got {zeta!r}")
    return math.ceil((1 + zeta) * T / n - 1e-12)


def single_visit_tradeoff(walk: ArrayLike, source: int, target: int, steps: int, sigma: float,
                          **mu_kwargs) -> RevealedGaussianMixture:
    """f_ij^single: Σ_t w_t G_{μ_t} + w_{T+1} Id with the hop count revealed (Lemma 4.1)."""
    W = walk_matrix(walk)
    require(source != target, f"source and target must differ, got {source} twice")
    require(0 <= source < W.shape[0], f"source node must be in [0, {W.shape[0]}), got {source}")
    weights = first_hitting_weights(W, steps, target=target)[:, source]
    mus = np.append(per_hop_mu(steps, sigma, **mu_kwargs), 0.0)
    return RevealedGaussianMixture.from_mus(mus, weights)


@dataclass(frozen=True)
class PairwiseReport(PairwiseEpsilon):
    """Pairwise ε of PN-f-DP (or the RDP baseline) for a graph; entry [i, j] is the leakage of
    i's data to j (a certified upper bound); the diagonal is NaN."""

    accountant: str                 # "pn-fdp" | "rdp-baseline"
    steps: int
    sigma: float
    compositions: int | None = None
    delta_slack: float = 0.0        # δ' of the ζ slack, included in delta
    epsilon_optimistic: np.ndarray | None = None
    method: str = ""
    extra: dict = field(default_factory=dict)
    epsilon_rdp_ht: np.ndarray | None = None  # the RDP (HT) baseline of the same pairs

    def summary(self) -> dict:
        out = {"accountant": self.accountant, "delta": self.delta, "steps": self.steps,
               "sigma": self.sigma, "compositions": self.compositions,
               "delta_slack": self.delta_slack, "method": self.method,
               "pairs": int(self.defined().size), "epsilon_max": self.worst,
               "epsilon_mean": self.mean, "epsilon_min": self.best,
               **self.extra}
        if self.epsilon_rdp_ht is not None:
            ht = self.epsilon_rdp_ht[~np.isnan(self.epsilon_rdp_ht)]
            out.update({"epsilon_rdp_ht_max": float(ht.max()),
                        "epsilon_rdp_ht_mean": float(ht.mean())})
        return out


@dataclass(frozen=True)
class _ComposedLaws:
    """Laws of S = Σ_k μ² (rows) on the grid {0, h, 2h, …} for σ = 1; for another σ the
    support scales by 1/σ² (a rounding that dominated at σ = 1 still dominates), so σ
    calibration reuses one FFT."""

    laws: list[np.ndarray]       # per row: the masses at the support points kept
    support: list[np.ndarray]    # per row: S values at σ = 1 (grid multiples)

    def epsilons(self, sigma: float, delta: float) -> np.ndarray:
        return np.array([_epsilon_of_law(p, np.sqrt(s) / sigma, delta)
                         for p, s in zip(self.laws, self.support, strict=True)])

    def means(self) -> np.ndarray:
        return np.array([float(p @ s) for p, s in zip(self.laws, self.support, strict=True)])


def _compose_binned(laws: np.ndarray, grid: float, compositions: int,
                    chunk: int = 16) -> _ComposedLaws:
    """k-fold laws of Σμ² of binned single-visit laws (rows of ``laws``, grid step ``grid``)."""
    out, support = [], []
    top = int(np.max(np.flatnonzero(laws.any(axis=0)), initial=0))
    laws = laws[:, : top + 1]
    for start in range(0, laws.shape[0], chunk):
        for row in self_convolve(laws[start:start + chunk], compositions):
            kept = np.flatnonzero(row > 0)
            out.append(np.maximum(row[kept], _TINY))  # no subnormals; only adds mass
            support.append(kept * grid)
    return _ComposedLaws(out, support)


@dataclass
class _HittingLaws:
    """Single-visit laws of μ² (σ = 1) binned on {0, h, 2h, …}, one row per pair.

    ``up`` rounds every μ² up (certified), ``down`` down (the optimistic twin); ``rho_ht``
    is Σ_t w_t/t (the RDP-with-hitting-times baseline); ``hops`` is how many hops were
    iterated before the truncation tolerance was met (T when it never was)."""

    up: np.ndarray
    down: np.ndarray | None
    rho_ht: np.ndarray
    hops: int


def _hitting_laws(W: np.ndarray, targets: np.ndarray, sources: np.ndarray | None, steps: int,
                  mu_squared: np.ndarray, grid: float, tolerance: float, optimistic: bool
                  ) -> _HittingLaws:
    """Binned single-visit laws for the pairs (source → target) of a chunk of targets.

    First-hitting recurrence per target column: h_1 = W e_j, h_{t+1} = W (h_t with entry j
    zeroed) — one n×m product per hop for m targets; the weight of hop t is added to the
    bin of μ_t² as it is produced, so the (T+1)·n² weight table is never stored. Rows are
    ordered target-major: row c·r + a is (sources[a] → targets[c]); pairs i = j are
    meaningless (the caller drops them).

    Truncation: once every pair's not-yet-reached mass r_t = 1 − Σ_{s≤t} w_s is below
    ``tolerance``, r_t is put on hop t+1's μ² — the largest any later hop has, and larger
    than "never reached" (μ = 0) — which dominates the true law, so the bound stays
    certified. The optimistic twin puts it on μ = 0 instead.
    """
    n = W.shape[0]
    targets = np.asarray(targets, dtype=np.int64)
    rows = np.arange(n) if sources is None else np.asarray(sources, dtype=np.int64)
    m, r = targets.size, rows.size
    bin_up = np.ceil(mu_squared / grid).astype(np.int64)
    bin_down = np.floor(mu_squared / grid).astype(np.int64)
    bins = int(bin_up.max()) + 2
    # bins first: each hop adds one contiguous (m, r) slab
    up = np.zeros((bins, m, r))
    down = np.zeros((bins, m, r)) if optimistic else None
    remaining = np.ones((m, r))
    rho = np.zeros((m, r))
    # pairs i = j never count toward the stopping rule
    same = rows[None, :] == targets[:, None]
    H = np.ascontiguousarray(W[:, targets])
    columns = np.arange(m)
    operator = W
    if np.count_nonzero(W) < 0.1 * n * n:  # sparse graphs (hypercube, torus, ring): O(nnz·m)
        from scipy.sparse import csr_matrix

        operator = csr_matrix(W)
    hops = steps
    for t in range(1, steps + 1):
        step = H[rows].T  # (m, r): w_t for every pair of the chunk
        up[bin_up[t - 1]] += step
        if down is not None:
            down[bin_down[t - 1]] += step
        remaining -= step
        rho += step / t
        if t == steps:
            break
        if tolerance > 0 and t % 32 == 0:
            left = np.where(same, 0.0, remaining)
            if float(left.max()) < tolerance:
                hops = t
                break
        H[targets, columns] = 0.0
        H = operator @ H
    np.clip(remaining, 0.0, None, out=remaining)
    if hops < steps:  # truncated: the rest may still arrive at hop t+1 or later
        up[bin_up[hops]] += remaining
        rho += remaining / (hops + 1)
    else:  # never reached within T hops: μ = 0
        up[0] += remaining
    if down is not None:
        down[0] += remaining

    def rows_of(laws: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(laws.reshape(bins, m * r).T)

    return _HittingLaws(rows_of(up), None if down is None else rows_of(down),
                        rho.reshape(m * r), hops)


def _dominating_rows(laws: np.ndarray, resolution: float = 1e-12
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Group rows (binned laws of μ²) whose upper-tail sums P(μ² ≥ b) agree to
    ``resolution`` and give each group one representative that dominates every member:
    its tail sums are the group's key rounded *up* to the next multiple of ``resolution``
    (so any row with the same key, from any chunk, is dominated by it). Returns
    (representatives, inverse, keys)."""
    tails = np.cumsum(laws[:, ::-1], axis=1)[:, ::-1]
    keys = np.floor(tails / resolution).astype(np.int64)
    # group by the bytes of each key (a hash table: np.unique(axis=0) sorts whole rows)
    groups: dict[bytes, int] = {}
    inverse = np.array([groups.setdefault(key.tobytes(), len(groups)) for key in keys],
                       dtype=np.int64)
    first = np.zeros(len(groups), dtype=np.int64)
    first[inverse[::-1]] = np.arange(inverse.size)[::-1]  # first row of each group
    unique = keys[first]
    rep_tails = np.minimum((unique + 1) * resolution, 1.0)
    rep_tails[:, 0] = 1.0
    rep_tails = np.minimum.accumulate(rep_tails, axis=1)
    reps = rep_tails - np.append(rep_tails[:, 1:], np.zeros((unique.shape[0], 1)), axis=1)
    return np.clip(reps, 0.0, None), inverse.ravel(), unique


def _epsilon_of_law(masses: np.ndarray, mus: np.ndarray, delta: float) -> float:
    """Smallest ε with Σ_s p_s δ_G(ε; μ_s) ≤ δ, returned from the certified side."""
    log_target = math.log(delta)
    with np.errstate(divide="ignore"):
        log_masses = np.log(masses)

    positive = mus > 0
    mus_pos, masses_pos = mus[positive], masses[positive]

    def log_delta(eps: float) -> float:
        if eps < 500:  # direct form: ~3x faster; its round-off (~1e-16) is far below δ
            with np.errstate(under="ignore"):
                # arguments below -37 would give subnormals (slow); raising the first one
                # and dropping the second term there only increases δ
                upper_arg = -eps / mus_pos - mus_pos / 2
                second = np.where(upper_arg < -37.0, 0.0, ndtr(np.maximum(upper_arg, -37.0)))
                terms = ndtr(np.maximum(-eps / mus_pos + mus_pos / 2, -37.0)) \
                    - math.exp(eps) * second
                # einsum, not np.dot: a BLAS dot under thread contention is ~1000x slower
                total = float(np.einsum("i,i->", masses_pos, np.maximum(terms, 0.0)))
            return math.log(total) if total > 0 else -math.inf
        with np.errstate(under="ignore"):
            terms = gaussian_log_delta(eps, mus) + log_masses
            peak = float(np.max(terms))
            if not math.isfinite(peak):
                return -math.inf
            return peak + math.log(float(np.sum(np.exp(terms - peak))))

    if log_delta(0.0) <= log_target:
        return 0.0
    # the mixture is dominated by its largest μ, whose ε is a valid upper end
    high = _gaussian_epsilon(float(mus.max()), delta) + 1e-9
    while log_delta(high) > log_target:  # guards the bracket against rounding
        high = 2 * high + 1e-6
    root = brentq(lambda e: log_delta(e) - log_target, 0.0, high, xtol=1e-10, rtol=1e-12)
    step = 1e-10
    while log_delta(root) > log_target:
        root, step = root + step, 2 * step
    return float(root)


def _gaussian_epsilon(mu: float, delta: float) -> float:
    from dpdl.accounting.gdp import epsilon_from_delta

    return epsilon_from_delta(delta, mu) if mu > 0 else 0.0


def _mechanism_delta(delta: float, walk: np.ndarray, steps: int, zeta: float | None):
    require(isinstance(delta, int | float | np.floating) and 0 < delta < 1,
            f"delta must lie in (0, 1), got {delta!r}")
    slack = 0.0 if zeta is None else markov_slack_delta(walk, steps, zeta)
    require(slack < delta,
            f"the Markov-chain slack δ'={slack:.3g} (zeta={zeta}) is not below delta={delta}; "
            "raise zeta or steps")
    return delta - slack, slack


@dataclass(frozen=True)
class _Setup:
    W: np.ndarray
    steps: int
    compositions: int
    mechanism_delta: float
    slack: float
    mu_squared: np.ndarray  # μ_t² at σ = 1, t = 1..T
    grid: float


def _setup(walk, *, steps, delta, sensitivity, local_steps, contraction, zeta, relative_slack,
           hop_form, tolerance) -> _Setup:
    W = walk_matrix(walk)
    n = W.shape[0]
    require(0 < relative_slack < 1, f"relative_slack must be in (0, 1), got {relative_slack!r}")
    require(math.isfinite(tolerance) and 0 <= tolerance < 1e-3,
            f"tolerance must lie in [0, 1e-3), got {tolerance!r}")
    k = composition_count(n, steps, zeta=zeta)
    mech_delta, slack = _mechanism_delta(delta, W, steps, zeta)
    mu2 = per_hop_mu(steps, 1.0, sensitivity=sensitivity, local_steps=local_steps,
                     contraction=contraction, hop_form=hop_form) ** 2
    return _Setup(W, int(steps), k, mech_delta, slack, mu2, relative_slack * float(mu2.max()))


def _check_node(node: int, n: int, what: str) -> int:
    require(isinstance(node, int | np.integer) and 0 <= node < n,
            f"{what} node must be in [0, {n}), got {node!r}")
    return int(node)


def pnfdp_epsilon(walk: ArrayLike, source: int, target: int, *, steps: int, sigma: float,
                  delta: float, bound: BoundSettings = BoundSettings()) -> tuple[float, float]:
    """(certified upper bound, optimistic value) of ε for the pair source → target (MATH.md §7).

    Costs T matrix-vector products (one column of first-hitting weights); never builds the
    (T+1)·n² table."""
    (sensitivity, local_steps, contraction, zeta, relative_slack, hop_form,
     tolerance) = bound.fields()
    setup = _setup(walk, steps=steps, delta=delta, sensitivity=sensitivity,
                   local_steps=local_steps, contraction=contraction, zeta=zeta,
                   relative_slack=relative_slack, hop_form=hop_form, tolerance=tolerance)
    n = setup.W.shape[0]
    source, target = _check_node(source, n, "source"), _check_node(target, n, "target")
    require(source != target, f"source and target must differ, got {source} twice")
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    laws = _hitting_laws(setup.W, np.array([target]), np.array([source]), setup.steps,
                         setup.mu_squared, setup.grid, tolerance, optimistic=True)
    upper = _compose_binned(laws.up, setup.grid, setup.compositions)
    lower = _compose_binned(laws.down, setup.grid, setup.compositions)
    return (float(upper.epsilons(sigma, setup.mechanism_delta)[0]),
            float(lower.epsilons(sigma, setup.mechanism_delta)[0]))


def rdp_ht_epsilon_from_rho(rho_ht: ArrayLike, *, steps: int, n: int, sigma: float,
                            delta: float, sensitivity: float = 1.0,
                            local_steps: int = 1) -> np.ndarray:
    """ε of the RDP baseline with exact hitting times ("RDP (HT)" of seed 003's Table 1 and
    Figure 1c): ρ = K·Δ²·(T/n)·Σ_t w_t/(t σ²), (α, αρ)-RDP, dp_accounting's conversion.

    ``rho_ht`` is Σ_t w_t/t. Like the Cyffers et al. 2024 bound it averages the per-hop RDP
    linearly over the hitting time. For a mixture whose hop count is revealed the Rényi
    divergence is (1/(α−1))·ln Σ_t w_t e^{(α−1)·D_t} ≥ Σ_t w_t D_t (Jensen), so this
    average is *not* certified here: it is reported as the paper's baseline, beside
    PN-f-DP. (At n = 2048, k = 9 it falls below the certified PN-f-DP ε: bench_fdp.py.)"""
    rho = np.asarray(rho_ht, dtype=float) * (local_steps * sensitivity**2 * steps
                                              / (n * sigma**2))
    return rdp_epsilon_from_rho(rho, delta)


def rdp_ht_epsilon(walk: ArrayLike, source: int, target: int, *, steps: int, sigma: float,
                   delta: float, sensitivity: float = 1.0, local_steps: int = 1,
                   tolerance: float = DEFAULT_TOLERANCE) -> float:
    """ε of the RDP (HT) baseline for one pair (see :func:`rdp_ht_epsilon_from_rho`)."""
    W = walk_matrix(walk)
    n = W.shape[0]
    source, target = _check_node(source, n, "source"), _check_node(target, n, "target")
    require(source != target, f"source and target must differ, got {source} twice")
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    T = _check_steps(steps)
    laws = _hitting_laws(W, np.array([target]), np.array([source]), T, np.ones(T), 1.0,
                         tolerance, optimistic=False)
    return float(rdp_ht_epsilon_from_rho(laws.rho_ht, steps=T, n=n, sigma=sigma, delta=delta,
                                         sensitivity=sensitivity,
                                         local_steps=local_steps)[0])


def _pairs_report(setup: _Setup, targets: np.ndarray, sources: np.ndarray | None,
                  sigma: float, tolerance: float, bracket: bool, chunk: int,
                  progress: bool, sensitivity: float, local_steps: int):
    """(upper, optimistic or None, rho_ht, hops, classes) for targets × sources, computed in
    chunks of ``chunk`` targets; identical laws (any chunk) are composed once."""
    n = setup.W.shape[0]
    rows = np.arange(n) if sources is None else np.asarray(sources, dtype=np.int64)
    shape = (targets.size, rows.size)
    upper = np.full(shape, np.nan)
    optimistic = np.full(shape, np.nan) if bracket else None
    rho_ht = np.full(shape, np.nan)
    cache: dict[bytes, float] = {}
    hops = 0
    starts = range(0, targets.size, chunk)
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="PN-f-DP targets", unit="chunk", leave=False)
    for start in starts:
        block = targets[start:start + chunk]
        laws = _hitting_laws(setup.W, block, rows, setup.steps, setup.mu_squared, setup.grid,
                             tolerance, optimistic=bracket)
        hops = max(hops, laws.hops)
        valid = (rows[None, :] != block[:, None]).ravel()
        index = np.flatnonzero(valid)
        reps, inverse, keys = _dominating_rows(laws.up[index])
        eps = np.empty(reps.shape[0])
        todo = [g for g in range(reps.shape[0]) if keys[g].tobytes() not in cache]
        if todo:
            computed = _compose_binned(reps[todo], setup.grid, setup.compositions).epsilons(
                sigma, setup.mechanism_delta)
            for g, value in zip(todo, computed, strict=True):
                cache[keys[g].tobytes()] = float(value)
        eps[:] = [cache[keys[g].tobytes()] for g in range(reps.shape[0])]
        out = np.full(block.size * rows.size, np.nan)
        out[index] = eps[inverse]
        upper[start:start + block.size] = out.reshape(block.size, rows.size)
        if bracket:
            # the optimistic twin needs each pair's own law, not a dominating one
            low = np.full(block.size * rows.size, np.nan)
            low[index] = _compose_binned(laws.down[index], setup.grid,
                                         setup.compositions).epsilons(
                sigma, setup.mechanism_delta)
            optimistic[start:start + block.size] = low.reshape(block.size, rows.size)
        rho = np.where(valid, laws.rho_ht, np.nan)
        rho_ht[start:start + block.size] = rho.reshape(block.size, rows.size)
    rdp_ht = rdp_ht_epsilon_from_rho(rho_ht, steps=setup.steps, n=n, sigma=sigma,
                                     delta=setup.mechanism_delta + setup.slack,
                                     sensitivity=sensitivity, local_steps=local_steps)
    return upper, optimistic, rdp_ht, hops, len(cache)


def pnfdp_epsilon_matrix(walk: ArrayLike, *, steps: int, sigma: float, delta: float,
                         bound: BoundSettings = BoundSettings(), bracket: bool = False,
                         targets: ArrayLike | None = None, chunk: int | None = None,
                         progress: bool = False) -> PairwiseReport:
    """The PN-f-DP ε of every ordered pair (i → j), certified upper bounds (MATH.md §7).

    Entry [i, j] is the leak of i's data to j. The first-hitting weights are produced in
    chunks of ``chunk`` targets (one n×chunk product per hop; memory ~ chunk·n·(1/slack)
    floats) and truncated once every pair's unreached mass is below ``tolerance`` (see
    :func:`_hitting_laws`: sound). ``targets`` restricts the columns computed (``[j]`` is
    one column: every source against observer j); the others stay NaN. ``progress`` shows
    a tqdm bar over the chunks. ``extra["epsilon_rdp_ht"]`` holds the RDP (HT) baseline of
    the same pairs.
    """
    (sensitivity, local_steps, contraction, zeta, relative_slack, hop_form,
     tolerance) = bound.fields()
    setup = _setup(walk, steps=steps, delta=delta, sensitivity=sensitivity,
                   local_steps=local_steps, contraction=contraction, zeta=zeta,
                   relative_slack=relative_slack, hop_form=hop_form, tolerance=tolerance)
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    n = setup.W.shape[0]
    symmetry = node_transitive_symmetry(setup.W) if targets is None else None
    if symmetry is not None:
        targets = [0]  # every other column follows from observer 0's by the group
    columns = np.arange(n) if targets is None else np.array(
        [_check_node(j, n, "target") for j in np.atleast_1d(targets)], dtype=np.int64)
    if chunk is None:  # keep a chunk's laws near 100 MB
        bins = 1.0 / relative_slack + 2
        chunk = max(1, min(64, int(1.2e7 / (n * bins))))
    require(isinstance(chunk, int | np.integer) and chunk >= 1,
            f"chunk must be a positive integer, got {chunk!r}")
    upper_t, optimistic_t, rdp_ht_t, hops, classes = _pairs_report(
        setup, columns, None, sigma, tolerance, bracket, int(chunk), progress, sensitivity,
        local_steps)

    def full(block: np.ndarray | None) -> np.ndarray | None:
        if block is None:
            return None
        if symmetry is not None:  # entry [i, j] is column 0's entry of its orbit
            out = block[0][_pair_to_observer_zero(symmetry, n)]
            np.fill_diagonal(out, np.nan)
            return out
        out = np.full((n, n), np.nan)
        out[:, columns] = block.T  # rows of the block are targets
        return out

    return PairwiseReport(
        accountant="pn-fdp", epsilon=full(upper_t), delta=float(delta), steps=int(steps),
        sigma=float(sigma), compositions=setup.compositions, delta_slack=setup.slack,
        epsilon_optimistic=full(optimistic_t),
        method=f"revealed-mixture FFT (relative_slack={relative_slack:g}, hop_form={hop_form}, "
               f"{classes} distinct pair classes, {hops} hops, tolerance={tolerance:g}"
               + ("" if symmetry is None else f", observer 0 and the {symmetry} symmetry")
               + ")",
        extra={"zeta": zeta, "local_steps": local_steps, "contraction": contraction,
               "sensitivity": sensitivity, "hop_form": hop_form, "hops": hops},
        epsilon_rdp_ht=full(rdp_ht_t),
    )


def rdp_baseline_rho(walk: ArrayLike, *, steps: int, sigma: float,
                     sensitivity: float = 1.0) -> np.ndarray:
    """ρ_ij = Δ²(T·H_T/(σ²n²) + T·[log W]_ij/(σ²n)), log W = Σ_{λ_k<1} −ln(1−λ_k) u_k u_kᵀ
    (Cyffers et al. 2024 as stated in MATH.md §7); needs a symmetric W. Diagonal NaN."""
    W = walk_matrix(walk)
    T = _check_steps(steps)
    require(np.allclose(W, W.T, atol=1e-12), "the RDP baseline needs a symmetric walk matrix")
    require(math.isfinite(sigma) and sigma > 0, f"sigma must be > 0, got {sigma!r}")
    n = W.shape[0]
    eigenvalues, vectors = np.linalg.eigh((W + W.T) / 2)
    below_one = eigenvalues < 1 - 1e-10
    log_w = (vectors[:, below_one] * -np.log1p(-eigenvalues[below_one])) @ vectors[:, below_one].T
    harmonic = float(np.sum(1.0 / np.arange(1, T + 1)))
    rho = sensitivity**2 * (T * harmonic / (sigma**2 * n**2) + T * log_w / (sigma**2 * n))
    np.fill_diagonal(rho, np.nan)
    return rho


def rdp_epsilon_from_rho(rho: ArrayLike, delta: float) -> np.ndarray:
    """ε of an (α, αρ)-RDP guarantee (all α > 1): :func:`dpdl.accounting.rdp.rdp_epsilon`.

    ρ = ∞ gives ε = ∞. A negative ρ (the baseline's formula can go below zero for some pairs
    of a small graph) is no guarantee at all, never "ε = 0": it gives NaN, as does the
    diagonal.
    """
    return np.asarray(rdp_epsilon(np.asarray(rho, dtype=float), delta), dtype=float)


def rdp_baseline_epsilon(walk: ArrayLike, *, steps: int, sigma: float, delta: float,
                         sensitivity: float = 1.0) -> PairwiseReport:
    rho = rdp_baseline_rho(walk, steps=steps, sigma=sigma, sensitivity=sensitivity)
    return PairwiseReport(accountant="rdp-baseline", epsilon=rdp_epsilon_from_rho(rho, delta),
                          delta=float(delta), steps=int(steps), sigma=float(sigma),
                          method="rdp (Cyffers et al. 2024), dp_accounting conversion")


def _check_target(target_epsilon: float) -> float:
    require(math.isfinite(target_epsilon) and target_epsilon > 0,
            f"target epsilon must be > 0, got {target_epsilon!r}")
    return float(target_epsilon)


def calibrate_sigma_pnfdp(walk: ArrayLike, *, steps: int, target_epsilon: float, delta: float,
                          bound: BoundSettings = BoundSettings(),
                          pair: tuple[int, int] | None = None,
                          targets: ArrayLike | None = None, progress: bool = False) -> float:
    """The smallest σ (to 1e-5 relative) whose certified PN-f-DP ε ≤ target for the worst
    ordered pair (or for ``pair``, or the worst source of the ``targets`` columns).

    The single-visit laws do not depend on σ (μ_t ∝ 1/σ): they are computed and composed
    once at σ = 1 and only the support is rescaled during the root find. The returned σ is
    checked against the target."""
    (sensitivity, local_steps, contraction, zeta, relative_slack, hop_form,
     tolerance) = bound.fields()
    setup = _setup(walk, steps=steps, delta=delta, sensitivity=sensitivity,
                   local_steps=local_steps, contraction=contraction, zeta=zeta,
                   relative_slack=relative_slack, hop_form=hop_form, tolerance=tolerance)
    target_epsilon = _check_target(target_epsilon)
    n = setup.W.shape[0]
    if pair is not None:
        i, j = pair
        i, j = _check_node(i, n, "source"), _check_node(j, n, "target")
        require(i != j, f"invalid pair {pair!r}: source and target must differ")
        laws = _hitting_laws(setup.W, np.array([j]), np.array([i]), setup.steps,
                             setup.mu_squared, setup.grid, tolerance, optimistic=False).up
    else:
        if targets is None and node_transitive_symmetry(setup.W) is not None:
            targets = [0]  # observer 0's column holds every pair's law
        columns = np.arange(n) if targets is None else np.array(
            [_check_node(j, n, "target") for j in np.atleast_1d(targets)], dtype=np.int64)
        chunk = max(1, min(64, int(1.2e7 / (n * (1.0 / relative_slack + 2)))))
        groups, seen = [], set()
        starts = range(0, columns.size, chunk)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="PN-f-DP laws", unit="chunk", leave=False)
        for start in starts:
            block = columns[start:start + chunk]
            chunk_laws = _hitting_laws(setup.W, block, None, setup.steps, setup.mu_squared,
                                       setup.grid, tolerance, optimistic=False)
            valid = (np.arange(n)[None, :] != block[:, None]).ravel()
            reps, _, keys = _dominating_rows(chunk_laws.up[valid])
            for g in range(reps.shape[0]):
                if keys[g].tobytes() not in seen:
                    seen.add(keys[g].tobytes())
                    groups.append(reps[g])
        width = max(g.size for g in groups)
        laws = np.array([np.pad(g, (0, width - g.size)) for g in groups])
    composed = _compose_binned(laws, setup.grid, setup.compositions)
    # Calibrate on a few candidate classes (largest mean Σμ²), then check every class at
    # the σ found and add any that still exceeds the target.
    everyone = np.arange(len(composed.laws))
    candidates = everyone[np.argsort(composed.means())[-_CALIBRATION_CANDIDATES:]]
    while True:
        subset = _ComposedLaws([composed.laws[c] for c in candidates],
                               [composed.support[c] for c in candidates])
        sigma = _calibrate_decreasing(
            lambda s, laws=subset: float(laws.epsilons(s, setup.mechanism_delta).max()),
            target_epsilon)
        if candidates.size == everyone.size:
            return sigma
        violators = np.flatnonzero(composed.epsilons(sigma, setup.mechanism_delta)
                                   > target_epsilon)
        if violators.size == 0:
            return sigma
        candidates = np.union1d(candidates, violators)


def _calibrate_decreasing(epsilon_of_sigma, target: float) -> float:
    """The smallest σ whose ε(σ), a decreasing function, was evaluated ≤ target."""
    require(epsilon_of_sigma(1e-8) > target, f"epsilon {target} is met even with sigma -> 0")
    return calibrate_safe(epsilon_of_sigma, target, (1e-8, 1.0), xtol=1e-9, max_expansions=14)


def calibrate_sigma_rdp_baseline(walk: ArrayLike, *, steps: int, target_epsilon: float,
                                 delta: float, sensitivity: float = 1.0) -> float:
    """σ with max_ij ε_RDP-baseline = target; ρ ∝ 1/σ², so one 1-D root find in ρ."""
    target_epsilon = _check_target(target_epsilon)
    rho_at_one = float(np.nanmax(rdp_baseline_rho(walk, steps=steps, sigma=1.0,
                                                  sensitivity=sensitivity)))
    if rho_at_one <= 0:
        raise DPDLError("the RDP baseline's ρ is not positive for this graph")

    def worst(sigma: float) -> float:
        return float(rdp_epsilon_from_rho(np.array([rho_at_one / sigma**2]), delta)[0])

    return _calibrate_decreasing(worst, target_epsilon)
