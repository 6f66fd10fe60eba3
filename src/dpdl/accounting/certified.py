"""Certified ε/δ of a noise-multiplier schedule: PLD, RDP and the CLT approximation (MATH.md §2).

A schedule is accounted through its noise multipliers z_k = σ_k / C_k: step k is a
Poisson(p)-subsampled Gaussian mechanism with multiplier z_k, under one of two neighbouring
relations (``neighboring``, MATH.md Conventions), each a dp_accounting ``NeighboringRelation``:

* ``"add-remove"`` (``ADD_OR_REMOVE_ONE``, dp_accounting's default and these functions'):
  one record added or removed; the pair (1 − q)N(0, z²) + qN(−1, z²) vs N(0, z²) and its
  reverse (two PLD directions).
* ``"replace-one"`` (``REPLACE_ONE``, the default of a run, which releases node sizes): one
  record replaced by another; the pair (1 − q)N(0, z²) + qN(−1, z²) vs
  (1 − q)N(0, z²) + qN(1, z²), symmetric (one PLD direction).  ``pld`` accounts it exactly as
  dp_accounting's ``PLDAccountant(REPLACE_ONE)``; ``rdp`` with the Rényi divergence of this
  pair integrated numerically (``_rdp_replace``: dp_accounting's ``RdpAccountant`` refuses
  REPLACE_ONE for Poisson sampling), converted to (ε, δ) by dp_accounting's conversion;
  ``clt`` with this pair's χ² term 2(e^{1/z²} − e^{−1/z²}) for expm1(1/z²) (≈ sensitivity
  2C; still an approximation, MATH.md §1.3).

Accountants
-----------
Each method is one :class:`Accountant` in the registry :data:`ACCOUNTANTS` (its ε, δ, the
compositions it accepts, whether it is certified, its calibration's coarse phase);
``compute_epsilon`` / ``compute_delta`` check the common arguments and dispatch to it, and
``register_accountant`` adds another, which every caller then takes by name.

``pld``  (certified) privacy-loss distributions, pessimistic connect-the-dots discretisation
         on a grid of ``value_discretization`` (dp_accounting's construction). ``mode="exact"``
         composes every step: the PMFs of all distinct multipliers are multiplied in the
         Fourier domain at once, identical multipliers as one power (``_pld_gaussian``);
         it matches dp_accounting's one-by-one ``PLDAccountant`` at the same grid to ~1e-9
         and costs ~25-60 ms per *distinct* multiplier at grid 1e-4 (dp_accounting one by
         one: 0.4-2 s per step), so Dyn[μ] with K = 1e4 distinct steps takes minutes.
         ``mode="blocked"`` is a cheaper certified upper bound: the steps are cut into
         ``blocks`` groups of (nearly) equal size and each group is composed as a
         self-composition at its *smallest* multiplier (less noise dominates, so ε only
         grows). Composition is order-free, so the groups are contiguous runs of the
         multipliers *sorted* — for the monotone schedules of MATH.md §2 these are exactly the
         contiguous blocks in time, for any other order they are at least as tight, and the
         bound never depends on the order of the steps. ``DEFAULT_BLOCKS`` = 100 keeps the
         bound within 2 % of exact on the Dyn[μ] schedule of MATH.md §2 (1.6 % there).
         ``mode="binned"`` (the default for long heterogeneous schedules) is the tight
         certified bound: the distinct multipliers are cut into ``bins`` groups *by value*
         (``value_bins``: narrow where a step's privacy loss is most sensitive to its
         multiplier, i.e. at small z; wide where it hardly matters), each group is composed
         at its smallest multiplier (upper bound) and, sharing the same per-multiplier PMFs
         and Fourier transforms, at the next group's smallest multiplier (a *lower companion*
         that bounds the exact composition at the same grid from below). The report carries
         both, ``epsilon`` (certified upper bound) and ``epsilon_lower``: the exact PLD ε at
         the grid lies in between, so every report shows how tight it is. The default
         ``DEFAULT_BINS`` = 500 on a 3e-4 loss grid (``BINNED_DISCRETIZATION``) puts the SPEC
         §2 Dyn[μ] case (exact 3.0373) at [3.0339, 3.0401], +0.09 %, in seconds
         (``benchmarks/bench_accounting.py``). Each step's grid starts at loss −3 (smaller
         losses moved up to it) and ends where its δ ≤ 1e-20 (the rest counted as infinity
         mass): both only raise δ.
``rdp``  (certified) Rényi DP through dp_accounting's ``RdpAccountant`` (its default orders and
         its improved RDP → (ε, δ) conversion); exact RDP composition is a sum, one RDP
         evaluation per distinct multiplier (~20 ms each).
``clt``  (NOT certified) the paper's central-limit approximation, MATH.md §1.3 eq. 6:
         μ_tot = p·sqrt(Σ_k expm1(1/z_k²)), then ε(δ) / δ(ε) of μ_tot-GDP (eq. 4). It
         understates ε badly at small p (MATH.md §2); reports say ``certified=False``.

Non-private steps: z_k ≤ 0 (no noise, e.g. SGP) or NaN is **refused** with ``DPDLError``
— such a step has no finite guarantee and no accountant here returns a number for it;
callers that want to display "ε = ∞" for SGP must do so themselves. z_k = +∞ (infinite noise)
releases nothing and is dropped. An empty schedule has ε = 0 and δ = 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant
from numpy.typing import ArrayLike

from dpdl.accounting import _pld_gaussian, _rdp_replace
from dpdl.accounting import validators as check
from dpdl.accounting.gdp import (
    clt_mu_total,
    clt_noise_scale,
    delta_from_epsilon,
    epsilon_from_delta,
    mu_from_epsilon_delta,
)
from dpdl.accounting.validators import ADD_REMOVE
from dpdl.errors import DPDLError, require

__all__ = [
    "ACCOUNTANTS",
    "Accountant",
    "Bound",
    "Composition",
    "register_accountant",
    "unregister_accountant",
    "get_accountant",
    "accountant_names",
    "approximate_accountant",
    "MODES",
    "DEFAULT_BLOCKS",
    "DEFAULT_BINS",
    "BINNED_DISCRETIZATION",
    "value_bins",
    "EpsilonReport",
    "compute_epsilon",
    "compute_delta",
    "run_length",
    "blocked_run_length",
    "privacy_loss_distribution",
    "EXACT_MAX_DISTINCT",
    "accountant_options",
    "check_accountant",
    "epsilon_report",
]

MODES = ("exact", "blocked", "binned")
DEFAULT_BLOCKS = 100
DEFAULT_BINS = 500
BINNED_DISCRETIZATION = 3e-4
DEFAULT_DISCRETIZATION = 1e-4


@dataclass(frozen=True)
class EpsilonReport:
    """One privacy statement (ε, δ) and how it was obtained."""

    accountant: str  # "clt" | "pld" | "rdp"
    epsilon: float
    delta: float
    certified: bool  # False for "clt" (an approximation), True for pld/rdp
    method: str  # "clt", "pld-exact", "pld-blocked(B=100)", "pld-binned(bins=500)", "rdp", ...
    # a lower companion of ``epsilon`` (mode="binned"): the exact composition at the same
    # grid lies in [epsilon_lower, epsilon]; None where not computed
    epsilon_lower: float | None = None
    neighboring: str = ADD_REMOVE  # the relation the statement is for

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- input checks


def run_length(noise_multipliers: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Distinct multipliers (ascending) and how many steps use each.

    Accepts a 1-D array of per-step multipliers z_k (length K) or a run-length array of shape
    (R, 2) whose rows are (multiplier, count). Steps with z = +∞ or count 0 are dropped.
    Raises DPDLError for z ≤ 0 / NaN (non-private: refused) or malformed counts.
    """
    try:
        array = np.asarray(noise_multipliers, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise DPDLError(
            f"noise_multipliers must be numbers, per step or (multiplier, count) rows: {error}"
        ) from None
    if array.ndim == 1:
        multipliers, counts = array, np.ones(array.size, dtype=np.int64)
    elif array.ndim == 2 and array.shape[1] == 2:
        multipliers, raw_counts = array[:, 0], array[:, 1]
        bad = ~(np.isfinite(raw_counts) & (raw_counts >= 0) & (raw_counts == np.round(raw_counts)))
        if np.any(bad):
            raise DPDLError(
                f"run-length counts must be non-negative integers, got {raw_counts[bad][0]!r} "
                f"in row {int(np.flatnonzero(bad)[0])}"
            )
        counts = raw_counts.astype(np.int64)
    else:
        raise DPDLError(
            "noise_multipliers must be a 1-D array of per-step multipliers or an (R, 2) array of "
            f"(multiplier, count) rows, got shape {array.shape}"
        )
    invalid = np.isnan(multipliers) | (multipliers <= 0)
    if np.any(invalid):
        position = int(np.flatnonzero(invalid)[0])
        raise DPDLError(
            f"noise multiplier {multipliers[position]!r} at position {position} is not > 0: a "
            "step without noise has no finite privacy guarantee (epsilon = inf); refused"
        )
    keep = np.isfinite(multipliers) & (counts > 0)
    distinct, inverse = np.unique(multipliers[keep], return_inverse=True)
    totals = np.bincount(inverse, weights=counts[keep], minlength=distinct.size)
    return distinct, totals.astype(np.int64)


def blocked_run_length(
    multipliers: np.ndarray, counts: np.ndarray, blocks: int
) -> tuple[np.ndarray, np.ndarray]:
    """The blocked dominating schedule: ``blocks`` equal groups of the sorted steps, each at
    its smallest multiplier (MATH.md §2, "A certified upper bound")."""
    total = int(counts.sum())
    blocks = min(blocks, total)
    if blocks == 0:
        return multipliers, counts
    boundaries = (np.arange(blocks + 1) * total) // blocks  # sorted-step positions
    # the multiplier at sorted position s is distinct[searchsorted(cumulative, s, "right")]
    first_of_block = np.searchsorted(np.cumsum(counts), boundaries[:-1], side="right")
    block_counts = np.diff(boundaries)
    return run_length(np.column_stack([multipliers[first_of_block], block_counts]))


def value_bins(multipliers: np.ndarray, counts: np.ndarray, bins: int) -> np.ndarray:
    """First index (into the ascending distinct ``multipliers``) of each of ≤ ``bins`` bins.

    Bins are chosen by value, not by count: composing a bin at its smallest multiplier
    overstates ε by about Σ_k s(z_k)·(z_k − z_min) with s(z) the sensitivity of a step's
    privacy loss to its multiplier, and that total is smallest for equal bins in the
    coordinate u = ∫ √(s(z)·n(z)) dz, n the density of steps (a Lagrange-multiplier
    argument). s(z) ≈ z⁻³·e^{2/z²} is a heuristic (the CLT's e^{1/z²} understates how
    much the small multipliers dominate a PLD); it only steers tightness, never soundness.
    """
    size = multipliers.size
    if size <= bins:
        return np.arange(size)
    log_weight = 0.5 * (-3.0 * np.log(multipliers[:-1]) + 2.0 / multipliers[:-1] ** 2
                        + np.log(counts[:-1] * np.diff(multipliers)))
    weight = np.exp(log_weight - log_weight.max())
    position = np.concatenate([[0.0], np.cumsum(weight)])
    starts = np.searchsorted(position, np.linspace(0.0, position[-1], bins + 1)[:-1], "right")
    return np.unique(np.maximum(starts - 1, 0))


def binned_run_lengths(
    multipliers: np.ndarray, counts: np.ndarray, bins: int
) -> tuple[np.ndarray, np.ndarray]:
    """(upper, lower) counts over ``multipliers``: each bin of ``value_bins`` at its own
    smallest multiplier, and at the next bin's smallest (the largest overall for the last)."""
    starts = value_bins(multipliers, counts, bins)
    bin_of = np.searchsorted(starts, np.arange(multipliers.size), side="right") - 1
    upper = np.zeros(multipliers.size, dtype=np.int64)
    lower = np.zeros(multipliers.size, dtype=np.int64)
    np.add.at(upper, starts[bin_of], counts)
    following = np.append(starts[1:], multipliers.size - 1)
    np.add.at(lower, following[bin_of], counts)
    return upper, lower


def _composition(
    accountant: Accountant,
    sample_rate: float,
    mode: str,
    blocks: int | None,
    discretization: float,
    bins: int | None = None,
    neighboring: str = ADD_REMOVE,
) -> Composition:
    """The checked options of one accounting (one-line errors naming the value)."""
    check.neighboring(neighboring)
    require(
        isinstance(sample_rate, int | float | np.integer | np.floating)
        and 0 < float(sample_rate) <= 1,
        f"sample_rate must lie in (0, 1], got {sample_rate!r}",
    )
    require(mode in MODES, f"unknown mode {mode!r}; use one of {MODES}")
    accountant.check_options(mode, blocks, bins)
    require(
        isinstance(discretization, int | float | np.floating)
        and math.isfinite(discretization)
        and 0 < discretization <= 0.1,
        f"value_discretization must lie in (0, 0.1], got {discretization!r}",
    )
    return Composition(mode, blocks, bins, discretization, neighboring)


def _discretization(mode: str, value_discretization: float | None) -> float:
    if value_discretization is None:
        return BINNED_DISCRETIZATION if mode == "binned" else DEFAULT_DISCRETIZATION
    return value_discretization


def _composed_plds(
    multipliers: np.ndarray,
    counts: np.ndarray,
    sample_rate: float,
    discretization: float,
    mode: str,
    bins: int | None,
    neighboring: str = ADD_REMOVE,
):
    """(upper PLD, lower-companion PLD or None, method suffix) of a run-length schedule."""
    relation = {"relation": neighboring}
    if mode != "binned":
        pld = _pld_gaussian.compose(multipliers, counts, sample_rate, discretization, **relation)
        return pld, None, ""
    chosen = DEFAULT_BINS if bins is None else int(bins)
    if multipliers.size <= chosen:  # nothing to bin: the exact composition, both ways
        upper = _pld_gaussian.compose_schedules(multipliers, [counts], sample_rate,
                                                discretization, **relation)[0]
        return upper, upper, f"pld-binned(bins={chosen}, exact)"
    upper_counts, lower_counts = binned_run_lengths(multipliers, counts, chosen)
    upper, lower = _pld_gaussian.compose_schedules(
        multipliers, [upper_counts, lower_counts], sample_rate, discretization, **relation)
    return upper, lower, f"pld-binned(bins={chosen})"


# ------------------------------------------------------------------------------ accountants


def _clt_mu_total(multipliers: np.ndarray, counts: np.ndarray, sample_rate: float,
                  neighboring: str = ADD_REMOVE) -> float:  # fmt: skip
    """μ_tot of a run-length schedule (z_k, c_k) under ``neighboring``; 0 for no steps."""
    if multipliers.size == 0:
        return 0.0
    return clt_mu_total(sample_rate, noise_multipliers=multipliers, counts=counts,
                        neighboring=neighboring)  # fmt: skip


def privacy_loss_distribution(
    noise_multipliers: ArrayLike,
    sample_rate: float,
    *,
    mode: str = "exact",
    blocks: int | None = None,
    bins: int | None = None,
    value_discretization: float | None = None,
    neighboring: str = ADD_REMOVE,
):
    """The composed pessimistic PLD (a dp_accounting ``PrivacyLossDistribution``) or ``None``
    for an empty schedule. See the module docstring for ``mode``, ``blocks``, ``bins`` and
    ``neighboring``; with ``mode="binned"`` this is the upper bound."""
    discretization = _discretization(mode, value_discretization)
    composition = _composition(ACCOUNTANTS["pld"], sample_rate, mode, blocks, discretization,
                               bins, neighboring)  # fmt: skip
    multipliers, counts, _ = ACCOUNTANTS["pld"].run_length(noise_multipliers, composition)
    if multipliers.size == 0:
        return None
    return _composed_plds(multipliers, counts, float(sample_rate), float(discretization), mode,
                          bins, neighboring)[0]  # fmt: skip


@contextlib.contextmanager
def _quiet_rdp_orders():
    """dp_accounting logs one absl warning per fractional order whose series does not
    converge (hundreds in a calibration); it then leaves that order out, so the ε of the
    others is still a valid bound. Keep those lines out of the user's terminal."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _rdp_accountant(
    multipliers: np.ndarray, counts: np.ndarray, sample_rate: float
) -> rdp_privacy_accountant.RdpAccountant:
    accountant = rdp_privacy_accountant.RdpAccountant()
    for z, count in zip(multipliers, counts, strict=True):
        gaussian = dp_event.GaussianDpEvent(float(z))
        event = dp_event.PoissonSampledDpEvent(float(sample_rate), gaussian)
        accountant.compose(event, int(count))
    return accountant


@dataclass(frozen=True)
class _RdpCurve:
    """A composed RDP curve ε(α) at ``orders`` and its (ε, δ) conversions (dp_accounting's)."""

    orders: np.ndarray
    rdp: np.ndarray

    def epsilon(self, delta: float) -> float:
        return float(rdp_privacy_accountant.compute_epsilon(self.orders, self.rdp, delta)[0])

    def delta(self, epsilon: float) -> float:
        return float(rdp_privacy_accountant.compute_delta(self.orders, self.rdp, epsilon)[0])


def _rdp_curve(multipliers: np.ndarray, counts: np.ndarray, sample_rate: float,
               neighboring: str) -> _RdpCurve:  # fmt: skip
    """The schedule's RDP curve: dp_accounting's ``RdpAccountant`` under add/remove, the
    numerically integrated replace-one divergence (``_rdp_replace``) under replace-one;
    composition adds the curves, dp_accounting's conversion gives (ε, δ) either way."""
    if neighboring == ADD_REMOVE:
        accountant = _rdp_accountant(multipliers, counts, sample_rate)
        return _RdpCurve(accountant.orders, accountant.rdp)
    rdp = sum(int(count) * np.asarray(_rdp_replace.rdp_replace_one(float(z), float(sample_rate)))
              for z, count in zip(multipliers, counts, strict=True))  # fmt: skip
    return _RdpCurve(_rdp_replace.ORDERS, rdp)


def _check_mode_option(name: str, value, owner: str, mode: str, applies: bool) -> None:
    """``blocks`` / ``bins``: None, or a positive integer given with the mode that uses it
    (with any mode where composition options do not apply: ``applies`` False)."""
    require(
        value is None or (isinstance(value, int | np.integer) and value >= 1),
        f"{name} must be a positive integer, got {value!r}",
    )
    require(
        value is None or mode == owner or not applies,
        f"{name}={value!r} only applies to mode={owner!r} (mode is {mode!r})",
    )


# ---------------------------------------------------------------- the accountant registry
@dataclass(frozen=True)
class Composition:
    """The checked options of one accounting: how the steps are composed (``mode`` with its
    ``blocks`` / ``bins``), the PLD loss grid and the neighbouring relation."""

    mode: str = "exact"
    blocks: int | None = None
    bins: int | None = None
    value_discretization: float = DEFAULT_DISCRETIZATION
    neighboring: str = ADD_REMOVE


@dataclass(frozen=True)
class Bound:
    """What an accountant's ``epsilon`` / ``delta`` may return instead of a bare number: the
    value, a lower companion (the exact value lies in [lower, value]) and a method name that
    replaces the composition's (e.g. "pld-binned(bins=500)")."""

    value: float
    lower: float | None = None
    method: str | None = None


class Accountant:
    """One accounting method (the registry :data:`ACCOUNTANTS` holds one instance per name).

    Subclass and override :meth:`epsilon` (and :meth:`delta`, if δ at an ε is wanted), then
    ``register_accountant(MyAccountant())``: every caller (``compute_epsilon``, the ledger,
    calibration, the settings' ``calibrate`` / ``certified_accountant`` and
    ``AlgorithmSpec``'s ``@name`` suffix, ``dpdl account``) finds it by name.

    Attributes: ``name`` (lower case, the key), ``display`` (how reports name it),
    ``certified`` (a certified upper bound, or an approximation like the CLT), ``modes`` (the
    composition modes it accepts, of :data:`MODES`), ``composition_options`` (False: ``mode``,
    ``blocks`` and ``bins`` do not apply and are ignored, as for a closed form),
    ``exact_max_distinct`` (beyond this many distinct multipliers its default composition is
    not exact: :meth:`long_options`; None: always exact), ``exact_method`` (the method name of
    an exact composition; default the name), ``calibration_blocks`` (whether a run's
    ``privacy.calibration_blocks`` is handed to its calibration).
    """

    name: str = ""
    display: str = ""
    certified: bool = True
    modes: tuple[str, ...] = ("exact", "blocked")
    composition_options: bool = True
    exact_max_distinct: int | None = None
    exact_method: str | None = None
    calibration_blocks: bool = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    # ---------------------------------------------------------------- options
    def check_options(self, mode: str, blocks: int | None, bins: int | None) -> None:
        """Refuse (one line) a composition this accountant cannot do."""
        _check_mode_option("blocks", blocks, "blocked", mode, self.composition_options)
        _check_mode_option("bins", bins, "binned", mode, self.composition_options)
        require(
            not self.composition_options or mode in self.modes,
            f"mode={mode!r} is not a composition of {self.name}; use one of {self.modes}",
        )

    def run_length(self, noise_multipliers: ArrayLike, composition: Composition
                   ) -> tuple[np.ndarray, np.ndarray, str]:  # fmt: skip
        """(distinct multipliers, their counts, method name) of the steps to compose: the
        blocked dominating schedule under ``mode="blocked"``."""
        multipliers, counts = run_length(noise_multipliers)
        if not self.composition_options:  # a closed form: nothing to gain from blocking
            return multipliers, counts, self.exact_method or self.name
        if composition.mode == "blocked":
            chosen = DEFAULT_BLOCKS if composition.blocks is None else int(composition.blocks)
            multipliers, counts = blocked_run_length(multipliers, counts, chosen)
            return multipliers, counts, f"{self.name}-blocked(B={chosen})"
        return multipliers, counts, self.exact_method or self.name

    def default_options(self, noise_multipliers: ArrayLike, blocks: int | None = None
                        ) -> dict[str, Any]:  # fmt: skip
        """``compute_epsilon`` options (mode, blocks) for this schedule: blocked with
        ``blocks`` when given, else exact up to ``exact_max_distinct`` distinct multipliers and
        :meth:`long_options` beyond."""
        if not self.composition_options:
            return {}
        if blocks is not None:
            require(
                isinstance(blocks, int | np.integer) and blocks >= 1,
                f"blocks must be a positive integer, got {blocks!r}",
            )
            return {"mode": "blocked", "blocks": int(blocks)}
        if self.exact_max_distinct is not None:
            distinct = np.unique(np.asarray(noise_multipliers, dtype=np.float64)).size
            if distinct > self.exact_max_distinct:
                return self.long_options()
        return {"mode": "exact"}

    def long_options(self) -> dict[str, Any]:
        """The composition of a schedule with more than ``exact_max_distinct`` distinct
        multipliers (blocked with ``DEFAULT_BLOCKS``)."""
        return {"mode": "blocked", "blocks": DEFAULT_BLOCKS}

    def report_options(self, noise_multipliers: ArrayLike, *, final: bool, final_mode: str,
                       final_blocks: int, eval_blocks: int) -> dict[str, Any]:  # fmt: skip
        """How a run's certified ε spent is composed, at an evaluation point or (``final``) in
        its last report; the ``final_mode`` / ``final_blocks`` / ``eval_blocks`` settings are
        PLD's (:class:`PldAccountant`), others compose as :meth:`default_options` says."""
        return self.default_options(noise_multipliers)

    # ------------------------------------------------------------- calibration
    def closed_form_scale(self, shape: np.ndarray, *, epsilon: float, delta: float,
                          sample_rate: float, neighboring: str) -> float | None:  # fmt: skip
        """The noise scale t with ε(t·shape) = ``epsilon`` in closed form, or None: the
        calibration then searches (``calibration.calibrate_noise_scale``)."""
        return None

    def coarse_options(self, shape: np.ndarray) -> dict[str, Any] | None:
        """The options of a calibration's cheap coarse phase on a heterogeneous shape (a
        certified bound of this accountant), or None to search with the final options at
        once."""
        return None

    # -------------------------------------------------------------- the bounds
    def epsilon(self, multipliers: np.ndarray, counts: np.ndarray, sample_rate: float,
                delta: float, composition: Composition) -> float | Bound:  # fmt: skip
        """ε at ``delta`` of the run-length schedule (``counts[i]`` steps at multiplier
        ``multipliers[i]`` > 0, ascending, at least one): a number or a :class:`Bound`."""
        raise NotImplementedError(f"accountant {self.name!r} gives no epsilon")

    def delta(self, multipliers: np.ndarray, counts: np.ndarray, sample_rate: float,
              epsilon: float, composition: Composition) -> float | Bound:  # fmt: skip
        """δ at ``epsilon`` of the run-length schedule (see :meth:`epsilon`)."""
        raise DPDLError(f"accountant {self.name!r} gives no delta at a given epsilon")


class CltAccountant(Accountant):
    """The paper's central-limit approximation (MATH.md §1.3 eq. 6): NOT certified."""

    name, display, certified = "clt", "CLT", False
    modes = MODES
    composition_options = False

    def closed_form_scale(self, shape, *, epsilon, delta, sample_rate, neighboring):
        return clt_noise_scale(mu_from_epsilon_delta(epsilon, delta), sample_rate, shape,
                               neighboring)  # fmt: skip

    def epsilon(self, multipliers, counts, sample_rate, delta, composition):
        mu_total = _clt_mu_total(multipliers, counts, sample_rate, composition.neighboring)
        if mu_total == 0.0:  # z so large that every step's μ_k² underflows
            return 0.0
        if not math.isfinite(mu_total):
            return math.inf
        return epsilon_from_delta(delta, mu_total)

    def delta(self, multipliers, counts, sample_rate, epsilon, composition):
        mu_total = _clt_mu_total(multipliers, counts, sample_rate, composition.neighboring)
        if mu_total == 0.0:
            return 0.0
        if not math.isfinite(mu_total):
            return 1.0
        return delta_from_epsilon(epsilon, mu_total)


class PldAccountant(Accountant):
    """Privacy-loss distributions (certified): exact, blocked or binned composition."""

    name, display, certified = "pld", "PLD", True
    modes = MODES
    exact_max_distinct = 200
    exact_method = "pld-exact"
    calibration_blocks = True

    def long_options(self):
        return {"mode": "binned"}

    def report_options(self, noise_multipliers, *, final, final_mode, final_blocks,
                       eval_blocks):  # fmt: skip
        # at evaluation points the cheap blocked bound, in the final report ``final_mode``
        if final and final_mode == "auto":
            return self.default_options(noise_multipliers)
        if final and final_mode == "exact":
            return {"mode": "exact"}
        return {"mode": "blocked", "blocks": final_blocks if final else eval_blocks}

    def coarse_options(self, shape):
        return dict(COARSE_PLD)

    def epsilon(self, multipliers, counts, sample_rate, delta, composition):
        pld, pld_lower, binned = _composed_plds(
            multipliers, counts, sample_rate, float(composition.value_discretization),
            composition.mode, composition.bins, composition.neighboring)  # fmt: skip
        epsilon = float(pld.get_epsilon_for_delta(delta))
        if pld_lower is None:
            return epsilon
        return Bound(epsilon, min(epsilon, float(pld_lower.get_epsilon_for_delta(delta))), binned)

    def delta(self, multipliers, counts, sample_rate, epsilon, composition):
        pld, _, binned = _composed_plds(
            multipliers, counts, sample_rate, float(composition.value_discretization),
            composition.mode, composition.bins, composition.neighboring)  # fmt: skip
        return Bound(float(pld.get_delta_for_epsilon(epsilon)), None, binned or None)


class RdpAccountant(Accountant):
    """Rényi DP (certified) through dp_accounting's ``RdpAccountant`` (add/remove) or the
    integrated replace-one divergence (``_rdp_replace``); exact or blocked composition."""

    name, display, certified = "rdp", "RDP", True
    modes = ("exact", "blocked")
    exact_max_distinct = 200

    def coarse_options(self, shape):
        # with few distinct multipliers a coarse phase would cost as much as the real thing
        return None if np.unique(shape).size <= COARSE_RDP["blocks"] else dict(COARSE_RDP)

    def epsilon(self, multipliers, counts, sample_rate, delta, composition):
        with _quiet_rdp_orders():
            return _rdp_curve(multipliers, counts, sample_rate,
                              composition.neighboring).epsilon(delta)  # fmt: skip

    def delta(self, multipliers, counts, sample_rate, epsilon, composition):
        with _quiet_rdp_orders():
            return _rdp_curve(multipliers, counts, sample_rate,
                              composition.neighboring).delta(epsilon)  # fmt: skip


# The coarse phase of a heterogeneous calibration (``calibration``): PLD binned with 100 bins
# on a 1e-3 loss grid, RDP blocked in 20 blocks.
COARSE_PLD = {"mode": "binned", "bins": 100, "value_discretization": 1e-3}
COARSE_RDP = {"mode": "blocked", "blocks": 20}

# name -> accountant, in registration order (reports list them in this order); iterating
# gives the names, as the tuple it once was did.
ACCOUNTANTS: dict[str, Accountant] = {}


def accountant_names() -> tuple[str, ...]:
    """The registered accountants' names, in registration order."""
    return tuple(ACCOUNTANTS)


def register_accountant(accountant: Accountant, *, replace: bool = False) -> Accountant:
    """Add ``accountant`` to the registry under ``accountant.name`` (one call; every caller
    then accepts the name). ``replace`` lets a name already taken be re-registered."""
    require(isinstance(accountant, Accountant),
            f"register an Accountant instance, got {type(accountant).__name__}")  # fmt: skip
    name = accountant.name
    require(isinstance(name, str) and name == name.strip().lower() and name != ""
            and not set(name) & set("@, "),
            f"an accountant's name must be lower case without '@', ',' or spaces, got {name!r}")
    require(replace or name not in ACCOUNTANTS, f"accountant {name!r} is already registered")
    require(set(accountant.modes) <= set(MODES) and accountant.modes,
            f"accountant {name!r}: modes must be some of {MODES}, got {accountant.modes!r}")
    ACCOUNTANTS[name] = accountant
    _cached_compute.cache_clear()
    return accountant


def unregister_accountant(name: str) -> Accountant:
    """Remove (and return) the accountant registered as ``name``."""
    accountant = get_accountant(name)
    del ACCOUNTANTS[name]
    _cached_compute.cache_clear()
    return accountant


def get_accountant(name: str | Accountant) -> Accountant:
    """The registered accountant called ``name`` (one-line DPDLError for an unknown one)."""
    if isinstance(name, Accountant):
        return name
    require(
        isinstance(name, str) and name in ACCOUNTANTS,
        f"unknown accountant {name!r}; expected one of {accountant_names()}",
    )
    return ACCOUNTANTS[name]


def approximate_accountant(name: str) -> bool:
    """Whether ``name`` is a registered accountant that is not certified (the CLT): what a
    report marks as an approximation. A name not registered here is not marked."""
    accountant = ACCOUNTANTS.get(name)
    return accountant is not None and not accountant.certified


def _bound(value: float | Bound) -> Bound:
    return value if isinstance(value, Bound) else Bound(float(value))


def compute_epsilon(
    accountant: str,
    noise_multipliers: ArrayLike,
    sample_rate: float,
    delta: float,
    *,
    mode: str = "exact",
    blocks: int | None = None,
    bins: int | None = None,
    value_discretization: float | None = None,
    neighboring: str = ADD_REMOVE,
) -> EpsilonReport:
    """The smallest ε with the schedule (ε, δ)-DP under ``accountant`` (MATH.md §2), a name of
    :data:`ACCOUNTANTS` (its ``epsilon``, dispatched).

    ``noise_multipliers``: per-step z_k (1-D, length K) or (multiplier, count) rows.
    ``mode``/``blocks``/``bins`` select exact, blocked or binned composition (pld, rdp;
    ignored by clt); ``value_discretization`` is the PLD loss grid (default 1e-4, 3e-4 for
    ``binned``); ``neighboring`` the relation ("add-remove", the default, or "replace-one").
    Fails closed: see the module docstring.
    """
    chosen = get_accountant(accountant)
    discretization = _discretization(mode, value_discretization)
    composition = _composition(chosen, sample_rate, mode, blocks, discretization, bins,
                               neighboring)  # fmt: skip
    require(
        isinstance(delta, int | float | np.floating) and 0 < float(delta) < 1,
        f"delta must lie in (0, 1), got {delta!r}",
    )
    delta = float(delta)
    multipliers, counts, method = chosen.run_length(noise_multipliers, composition)
    if multipliers.size == 0:
        return EpsilonReport(chosen.name, 0.0, delta, chosen.certified, method, None, neighboring)
    bound = _bound(chosen.epsilon(multipliers, counts, float(sample_rate), delta, composition))
    return EpsilonReport(chosen.name, bound.value, delta, chosen.certified,
                         bound.method or method, bound.lower, neighboring)  # fmt: skip


def compute_delta(
    accountant: str,
    noise_multipliers: ArrayLike,
    sample_rate: float,
    epsilon: float,
    *,
    mode: str = "exact",
    blocks: int | None = None,
    bins: int | None = None,
    value_discretization: float | None = None,
    neighboring: str = ADD_REMOVE,
) -> EpsilonReport:
    """The smallest δ with the schedule (ε, δ)-DP under ``accountant``; see compute_epsilon.
    (With ``mode="binned"`` the lower companion is not reported for δ.)"""
    chosen = get_accountant(accountant)
    discretization = _discretization(mode, value_discretization)
    composition = _composition(chosen, sample_rate, mode, blocks, discretization, bins,
                               neighboring)  # fmt: skip
    require(
        isinstance(epsilon, int | float | np.floating)
        and math.isfinite(epsilon)
        and float(epsilon) >= 0,
        f"epsilon must be a finite number >= 0, got {epsilon!r}",
    )
    epsilon = float(epsilon)
    multipliers, counts, method = chosen.run_length(noise_multipliers, composition)
    if multipliers.size == 0:
        return EpsilonReport(chosen.name, epsilon, 0.0, chosen.certified, method, None,
                             neighboring)  # fmt: skip
    bound = _bound(chosen.delta(multipliers, counts, float(sample_rate), epsilon, composition))
    return EpsilonReport(chosen.name, epsilon, min(bound.value, 1.0), chosen.certified,
                         bound.method or method, None, neighboring)  # fmt: skip


# ------------------------------------------------------------------------ epsilon reports
def check_accountant(accountant: str, neighboring: str | None = None) -> str:
    """``accountant``, known (and ``neighboring``, when given, a known relation)."""
    get_accountant(accountant)
    if neighboring is not None:
        check.neighboring(neighboring)
    return accountant


def accountant_options(
    accountant: str, noise_multipliers: ArrayLike, blocks: int | None = None
) -> dict[str, Any]:
    """``compute_epsilon`` options (mode, blocks) for this schedule: the accountant's
    ``default_options`` (see the module docstring)."""
    return get_accountant(accountant).default_options(noise_multipliers, blocks)


def epsilon_report(
    accountant: str,
    noise_multipliers: ArrayLike,
    sample_rate: float,
    delta: float,
    **options: Any,
) -> EpsilonReport:
    """ε of Poisson(p)-subsampled Gaussian steps with multipliers z_k under ``accountant``.

    ``clt`` is the CLT approximation (MATH.md §1.3, not certified); ``pld``/``rdp`` are
    certified. ``options`` go to ``certified.compute_epsilon`` (``neighboring`` among them);
    without ``mode`` they default to :func:`accountant_options`. A step without noise (z = 0)
    gives ε = ∞.
    """
    chosen = get_accountant(accountant)
    check.neighboring(options.get("neighboring", ADD_REMOVE))
    z = np.asarray(noise_multipliers, dtype=np.float64)
    # Per-step multipliers only: a (multiplier, count) table flattened would count its counts
    # as steps and understate ε.
    require(z.ndim == 1, f"noise_multipliers must be 1-D (one per step), got shape {z.shape}")
    require(z.size > 0, "noise_multipliers must not be empty")
    require(
        bool(np.all(np.isfinite(z))) and bool(np.all(z >= 0)),
        "noise multipliers must be finite and >= 0",
    )
    sample_rate, delta = check.sample_rate(sample_rate), check.delta(delta)
    if np.any(z <= 0):  # a step without noise has no finite privacy guarantee
        return EpsilonReport(
            accountant=accountant,
            epsilon=math.inf,
            delta=delta,
            certified=chosen.certified,
            method="no-noise",
            neighboring=options.get("neighboring", ADD_REMOVE),
        )
    if "mode" not in options and chosen.composition_options:
        options = {**chosen.default_options(z, options.pop("blocks", None)), **options}
    return _cached_epsilon(accountant, z, sample_rate, delta, **options)


@functools.lru_cache(maxsize=64)
def _cached_compute(accountant, z_bytes, sample_rate, delta, options) -> EpsilonReport:
    z = np.frombuffer(z_bytes, dtype=np.float64)
    return compute_epsilon(accountant, z, sample_rate, delta, **dict(options))


def _cached_epsilon(
    accountant: str, z: np.ndarray, sample_rate: float, delta: float, **options: Any
) -> EpsilonReport:
    """``compute_epsilon``, memoised: a calibration's last evaluation is also its report."""
    z = np.ascontiguousarray(z, dtype=np.float64)
    key = tuple(sorted(options.items()))
    return _cached_compute(accountant, z.tobytes(), float(sample_rate), float(delta), key)


for _builtin in (CltAccountant(), PldAccountant(), RdpAccountant()):
    register_accountant(_builtin)
del _builtin

# Beyond this many distinct multipliers exact composition is too slow for interactive use
# (each accountant's ``exact_max_distinct``; kept as the dict it was).
EXACT_MAX_DISTINCT = {name: ACCOUNTANTS[name].exact_max_distinct for name in ("pld", "rdp")}
