"""Calibrate a schedule's noise scale under any accountant: clt, pld or rdp (SPEC §2).

A private schedule has noise multipliers z_k = t · s_k (see ``schedules``): t = 1/μ0 for the
dyn-μ variants, 1/μ̄ for the constant-budget ones and σ̃ for the general form. ε falls as t
grows, so calibration is a 1-D root find in log t (scipy's brentq) of ε(t) = target:

* ``clt``: the paper's equations 8-10 (closed form or a cheap root find).
* ``pld`` / ``rdp``: certified accountants from ``dpdl.accounting.certified``. The answer is
  bracketed on the *safe* side: the scale returned is the smallest one evaluated whose ε is
  ≤ the target, never the interpolated root. For long heterogeneous PLD schedules the search
  runs on the blocked upper bound (cheap, and ≥ the exact ε, so its safe points are safe for
  the exact accountant too) and then a short second search refines the scale against the
  accountant actually requested, which also verifies the final answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from dpdl.accounting.gdp import (
    _check_delta,
    _check_sample_rate,
    clt_mu_total,
    epsilon_from_delta,
    mu_from_epsilon_delta,
)
from dpdl.errors import DPDLError, require

try:  # the certified accountants live in their own module (another engineer's)
    from dpdl.accounting.certified import EpsilonReport, compute_epsilon
except ImportError:  # pragma: no cover - only while certified.py has not landed
    compute_epsilon = None

    @dataclass(frozen=True)
    class EpsilonReport:  # mirrors dpdl.accounting.certified.EpsilonReport
        accountant: str
        epsilon: float
        delta: float
        certified: bool
        method: str

        def to_dict(self) -> dict:
            return dict(self.__dict__)


__all__ = [
    "ACCOUNTANTS",
    "EpsilonReport",
    "CalibrationResult",
    "epsilon_report",
    "calibrate_noise_scale",
    "calibrate",
    "BLOCKED_SEARCH_MIN_STEPS",
    "SEARCH_BLOCKS",
]

ACCOUNTANTS = ("clt", "pld", "rdp")
# Above this many distinct multipliers the PLD search runs on the blocked bound first.
BLOCKED_SEARCH_MIN_STEPS = 2000
SEARCH_BLOCKS = 100


def _check_accountant(accountant: str) -> str:
    require(
        accountant in ACCOUNTANTS,
        f"unknown accountant {accountant!r}; expected one of {ACCOUNTANTS}",
    )
    return accountant


def _clt_report(noise_multipliers: np.ndarray, sample_rate: float, delta: float) -> EpsilonReport:
    if np.any(noise_multipliers <= 0):
        epsilon = math.inf
    else:
        mu_tot = clt_mu_total(sample_rate, 1.0 / noise_multipliers)
        epsilon = epsilon_from_delta(delta, mu_tot)
    return EpsilonReport(
        accountant="clt", epsilon=epsilon, delta=delta, certified=False, method="clt"
    )


def epsilon_report(
    accountant: str,
    noise_multipliers: ArrayLike,
    sample_rate: float,
    delta: float,
    **options: Any,
) -> EpsilonReport:
    """ε of Poisson(p)-subsampled Gaussian steps with multipliers z_k under ``accountant``.

    ``clt`` is the CLT approximation (SPEC §1.3, not certified); ``pld``/``rdp`` are delegated
    to ``dpdl.accounting.certified.compute_epsilon`` with ``options`` (mode, blocks, ...).
    """
    _check_accountant(accountant)
    z = np.asarray(noise_multipliers, dtype=np.float64).ravel()
    require(z.size > 0, "noise_multipliers must not be empty")
    require(
        bool(np.all(np.isfinite(z))) and bool(np.all(z >= 0)),
        "noise multipliers must be finite and >= 0",
    )
    sample_rate, delta = _check_sample_rate(sample_rate), _check_delta(delta)
    if accountant == "clt" and compute_epsilon is None:
        return _clt_report(z, sample_rate, delta)
    if np.any(z <= 0):  # a step without noise has no finite privacy guarantee
        return EpsilonReport(
            accountant=accountant,
            epsilon=math.inf,
            delta=delta,
            certified=accountant != "clt",
            method="no-noise",
        )
    if compute_epsilon is None:
        raise DPDLError(
            f"the {accountant!r} accountant needs dpdl.accounting.certified, which is missing"
        )
    return compute_epsilon(accountant, z, sample_rate, delta, **options)


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
            epsilon = self.evaluate(math.exp(log_t))
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


def calibrate_noise_scale(
    multiplier_shape: ArrayLike,
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    accountant: str = "pld",
    blocks: int | None = None,
    rtol: float = 1e-4,
) -> float:
    """The smallest scale t (to relative ``rtol``) with ε(z = t·s) ≤ ``epsilon`` (SPEC §2).

    For ``pld``/``rdp`` the result is on the safe side: its ε under the requested accountant
    (exact PLD, or the blocked bound with ``blocks`` blocks when given) is ≤ the target.
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

    final_options: dict[str, Any] = {}
    if accountant == "pld":
        final_options = {"mode": "blocked", "blocks": int(blocks)} if blocks else {"mode": "exact"}
    if (
        accountant == "pld"
        and blocks is None
        and not _is_constant(shape)
        and shape.size >= BLOCKED_SEARCH_MIN_STEPS
    ):
        # Coarse search on the cheap blocked bound, whose safe points are safe for exact too.
        coarse = _Search(
            lambda t: (
                epsilon_report(
                    "pld", t * shape, sample_rate, delta, mode="blocked", blocks=SEARCH_BLOCKS
                ).epsilon
            ),
            epsilon,
        )
        coarse_scale = coarse.solve(math.log(clt_scale), log_rtol=rtol)
        log_start, step = math.log(coarse_scale), 0.02
    else:
        log_start, step = math.log(clt_scale), 0.25

    search = _Search(
        lambda t: (
            epsilon_report(accountant, t * shape, sample_rate, delta, **final_options).epsilon
        ),
        epsilon,
    )
    scale = search.solve(log_start, step=step, log_rtol=rtol)
    require(math.isfinite(scale), "calibration failed to find a safe noise scale")
    return scale


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
    ``report`` (issue 2, item 4). PLD reports use the blocked bound when ``blocks`` is given.
    """
    from dpdl.accounting.schedules import make_schedule

    for name in report:
        _check_accountant(name)
    schedule = make_schedule(algorithm, **schedule_options)
    blocks = schedule_options.get("blocks")
    reports: dict[str, EpsilonReport] = {}
    for name in dict.fromkeys(report):
        options: dict[str, Any] = {}
        if name == "pld":
            options = {"mode": "blocked", "blocks": int(blocks)} if blocks else {"mode": "exact"}
        if schedule.private:
            reports[name] = schedule.epsilon(name, **options)
        else:  # sgp: no noise, no finite guarantee
            reports[name] = EpsilonReport(
                accountant=name,
                epsilon=math.inf,
                delta=math.nan if schedule.delta is None else schedule.delta,
                certified=name != "clt",
                method="no-noise",
            )
    return CalibrationResult(schedule=schedule, reports=reports)
