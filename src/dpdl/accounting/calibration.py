"""Calibrate a schedule's noise scale under any accountant: clt, pld or rdp (SPEC §2).

A private schedule has noise multipliers z_k = t · s_k (see ``schedules``): t = 1/μ0 for the
dyn-μ variants, 1/μ̄ for the constant-budget ones and σ̃ for the general form. ε falls as t
grows, so calibration is a 1-D root find in log t (scipy's brentq) of ε(t) = target:

* ``clt``: the paper's equations 8-10 (closed form or a cheap root find).
* ``pld`` / ``rdp``: certified accountants from ``dpdl.accounting.certified``. The answer is
  bracketed on the *safe* side: the scale returned is the smallest one *evaluated* with the
  requested accountant whose ε is ≤ the target, never an interpolated root.

Which composition a certified accountant uses (:func:`accountant_options`): the blocked
upper bound with ``blocks`` blocks when the caller gives ``blocks``; otherwise exact
composition, unless the schedule has more distinct multipliers than ``EXACT_MAX_DISTINCT``
(exact PLD of 10⁴ distinct steps takes minutes on two cores, exact RDP ~20 ms per distinct
step), where the blocked bound with certified's ``DEFAULT_BLOCKS`` (within 2 % of exact,
SPEC §2) is used. Either way the number is a certified upper bound and its ``method`` says
which.

Heterogeneous schedules are calibrated in two phases: a brentq search on a cheap,
coarse certified bound (PLD on a 10× coarser loss grid, or 20 blocks for RDP), then a short
safeguarded secant search with the accountant actually requested, which both refines the
scale (to ``epsilon_rtol`` below the target) and verifies the final answer.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from dpdl.accounting.certified import DEFAULT_BLOCKS, EpsilonReport, compute_epsilon
from dpdl.accounting.gdp import _check_delta, _check_sample_rate, mu_from_epsilon_delta
from dpdl.errors import DPDLError, require

__all__ = [
    "ACCOUNTANTS",
    "EXACT_MAX_DISTINCT",
    "EpsilonReport",
    "CalibrationResult",
    "accountant_options",
    "epsilon_report",
    "calibrate_noise_scale",
    "calibrate",
]

ACCOUNTANTS = ("clt", "pld", "rdp")
# Beyond this many distinct multipliers exact composition is too slow for interactive use.
EXACT_MAX_DISTINCT = {"pld": 500, "rdp": 200}
COARSE_PLD = {"mode": "blocked", "blocks": 100, "value_discretization": 1e-3}
COARSE_RDP = {"mode": "blocked", "blocks": 20}


def _check_accountant(accountant: str) -> str:
    require(
        accountant in ACCOUNTANTS,
        f"unknown accountant {accountant!r}; expected one of {ACCOUNTANTS}",
    )
    return accountant


def accountant_options(
    accountant: str, noise_multipliers: ArrayLike, blocks: int | None = None
) -> dict[str, Any]:
    """``compute_epsilon`` options (mode, blocks) for this schedule; see the module docstring."""
    _check_accountant(accountant)
    if accountant == "clt":
        return {}
    if blocks is not None:
        require(
            isinstance(blocks, int | np.integer) and blocks >= 1,
            f"blocks must be a positive integer, got {blocks!r}",
        )
        return {"mode": "blocked", "blocks": int(blocks)}
    distinct = np.unique(np.asarray(noise_multipliers, dtype=np.float64)).size
    if distinct > EXACT_MAX_DISTINCT[accountant]:
        return {"mode": "blocked", "blocks": DEFAULT_BLOCKS}
    return {"mode": "exact"}


def epsilon_report(
    accountant: str,
    noise_multipliers: ArrayLike,
    sample_rate: float,
    delta: float,
    **options: Any,
) -> EpsilonReport:
    """ε of Poisson(p)-subsampled Gaussian steps with multipliers z_k under ``accountant``.

    ``clt`` is the CLT approximation (SPEC §1.3, not certified); ``pld``/``rdp`` are
    certified. ``options`` go to ``certified.compute_epsilon``; without ``mode`` they default
    to :func:`accountant_options`. A step without noise (z = 0) gives ε = ∞.
    """
    _check_accountant(accountant)
    z = np.asarray(noise_multipliers, dtype=np.float64).ravel()
    require(z.size > 0, "noise_multipliers must not be empty")
    require(
        bool(np.all(np.isfinite(z))) and bool(np.all(z >= 0)),
        "noise multipliers must be finite and >= 0",
    )
    sample_rate, delta = _check_sample_rate(sample_rate), _check_delta(delta)
    if np.any(z <= 0):  # a step without noise has no finite privacy guarantee
        return EpsilonReport(
            accountant=accountant,
            epsilon=math.inf,
            delta=delta,
            certified=accountant != "clt",
            method="no-noise",
        )
    if "mode" not in options and accountant != "clt":
        options = {**accountant_options(accountant, z, options.pop("blocks", None)), **options}
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


def _is_constant(shape: np.ndarray) -> bool:
    return bool(np.ptp(shape) <= 1e-12 * float(np.max(shape)))


class _Search:
    """Memoised ε(t) − target on log t; remembers the smallest safe scale evaluated."""

    def __init__(self, evaluate, target: float):
        self.evaluate, self.target = evaluate, target
        self.cache: dict[float, float] = {}
        self.best_safe = math.inf

    def __call__(self, log_t: float) -> float:
        if log_t not in self.cache:
            epsilon = float(self.evaluate(math.exp(log_t)))
            self.cache[log_t] = epsilon
            if epsilon <= self.target:
                self.best_safe = min(self.best_safe, math.exp(log_t))
        return self.cache[log_t] - self.target

    def solve(self, log_t0: float, *, step: float = 0.25, log_rtol: float = 1e-4) -> float:
        """Bracket the root from log_t0 by steps of ``step`` in log t, then brentq."""
        low = high = log_t0
        if self(log_t0) > 0:  # unsafe: more noise needed
            for _ in range(200):
                low, high = high, high + step
                if self(high) <= 0:
                    break
            else:
                raise DPDLError("calibration failed: no noise scale reaches the target epsilon")
        else:
            for _ in range(200):
                high, low = low, low - step
                if self(low) > 0:
                    break
            else:
                raise DPDLError("calibration failed: epsilon stays below target at any noise")
        brentq(self, low, high, xtol=log_rtol, rtol=1e-12)
        return self.best_safe

    def log_slope(self) -> float:
        """d log ε / d log t from the two evaluations nearest the target (−1 if unknown)."""
        points = sorted(
            (abs(eps - self.target), log_t, eps)
            for log_t, eps in self.cache.items()
            if 0 < eps < math.inf
        )
        for _, log_a, eps_a in points[:1]:
            for _, log_b, eps_b in points[1:]:
                if log_b != log_a and eps_b != eps_a:
                    slope = (math.log(eps_b) - math.log(eps_a)) / (log_b - log_a)
                    if slope < 0:
                        return slope
        return -1.0

    def refine(self, log_t0: float, slope: float, *, epsilon_rtol: float, max_evals: int = 12):
        """Safeguarded secant steps from log_t0 until the best safe ε is within
        ``epsilon_rtol`` below the target; every candidate is evaluated, so the scale
        returned is verified."""
        log_safe = log_unsafe = None
        log_t = log_t0
        for _ in range(max_evals):
            gap = self(log_t)
            if gap <= 0:
                log_safe = log_t if log_safe is None else min(log_safe, log_t)
            else:
                log_unsafe = log_t if log_unsafe is None else max(log_unsafe, log_t)
            if log_safe is None:  # no verified point yet: add noise
                log_t = log_t + max(
                    0.02, (math.log(self.cache[log_t]) - math.log(self.target)) / -slope * 1.5
                )
                continue
            eps_safe = self.cache[log_safe]
            if eps_safe >= self.target * (1 - epsilon_rtol):
                break
            aim = math.log(self.target * (1 - epsilon_rtol / 3))
            log_t = log_safe + (aim - math.log(eps_safe)) / slope
            if log_unsafe is not None and not log_unsafe < log_t < log_safe:
                log_t = 0.5 * (log_unsafe + log_safe)
            if log_unsafe is not None and log_safe - log_unsafe < 1e-7:
                break
        require(math.isfinite(self.best_safe), "calibration failed to find a safe noise scale")
        return self.best_safe


def calibrate_noise_scale(
    multiplier_shape: ArrayLike,
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    accountant: str = "pld",
    blocks: int | None = None,
    epsilon_rtol: float = 2e-3,
) -> float:
    """The smallest scale t (its ε within ``epsilon_rtol`` of the target) with
    ε(z = t·s) ≤ ``epsilon`` under ``accountant`` (SPEC §2, "Calibration").

    For ``pld``/``rdp`` the result is on the safe side: its ε under the accountant with
    :func:`accountant_options` (``blocks``) has been computed and is ≤ the target.
    """
    _check_accountant(accountant)
    shape = np.asarray(multiplier_shape, dtype=np.float64).ravel()
    require(
        shape.size > 0 and bool(np.all(np.isfinite(shape))) and bool(np.all(shape > 0)),
        "the noise-multiplier shape must be finite and positive",
    )
    require(
        isinstance(epsilon, int | float | np.floating) and math.isfinite(epsilon) and epsilon > 0,
        f"epsilon must be a finite positive number, got {epsilon!r}",
    )
    delta, sample_rate = _check_delta(delta), _check_sample_rate(sample_rate)

    from dpdl.accounting.schedules import clt_noise_scale

    clt_scale = clt_noise_scale(mu_from_epsilon_delta(epsilon, delta), sample_rate, shape)
    if accountant == "clt":
        return clt_scale
    final_options = accountant_options(accountant, shape, blocks)

    def final(t: float) -> float:
        return _cached_epsilon(accountant, t * shape, sample_rate, delta, **final_options).epsilon

    search = _Search(final, epsilon)
    distinct = np.unique(shape).size
    if _is_constant(shape) or (accountant == "rdp" and distinct <= COARSE_RDP["blocks"]):
        # A coarse phase would cost as much as the real thing: search directly.
        search.solve(math.log(clt_scale), log_rtol=epsilon_rtol / 4)
        return search.best_safe
    coarse_options = COARSE_PLD if accountant == "pld" else COARSE_RDP
    coarse = _Search(
        lambda t: (
            _cached_epsilon(accountant, t * shape, sample_rate, delta, **coarse_options).epsilon
        ),
        epsilon,
    )
    coarse_scale = coarse.solve(math.log(clt_scale), log_rtol=epsilon_rtol / 4)
    return search.refine(math.log(coarse_scale), coarse.log_slope(), epsilon_rtol=epsilon_rtol)


@dataclass(frozen=True)
class CalibrationResult:
    """A calibrated schedule and the ε each accountant reports for it."""

    schedule: Any  # PrivacySchedule
    reports: dict[str, EpsilonReport] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out = self.schedule.to_dict()
        out["epsilon"] = {name: report.epsilon for name, report in self.reports.items()}
        out["reports"] = {name: report.to_dict() for name, report in self.reports.items()}
        return out


def calibrate(
    algorithm: str,
    *,
    report: tuple[str, ...] | list[str] = ACCOUNTANTS,
    **schedule_options: Any,
) -> CalibrationResult:
    """``make_schedule(algorithm, **schedule_options)``, then ε under every accountant in
    ``report`` (issue 2, item 4), each composed as :func:`accountant_options` says.
    """
    from dpdl.accounting.schedules import make_schedule

    for name in report:
        _check_accountant(name)
    schedule = make_schedule(algorithm, **schedule_options)
    blocks = schedule_options.get("blocks")
    reports: dict[str, EpsilonReport] = {}
    for name in dict.fromkeys(report):
        if schedule.private:
            reports[name] = schedule.epsilon(name, blocks=blocks)
        else:  # sgp: no noise, no finite guarantee
            reports[name] = EpsilonReport(
                accountant=name,
                epsilon=math.inf,
                delta=math.nan if schedule.delta is None else schedule.delta,
                certified=name != "clt",
                method="no-noise",
            )
    return CalibrationResult(schedule=schedule, reports=reports)
