"""Calibrate a schedule's noise scale under any registered accountant (MATH.md §2).

A private schedule has noise multipliers z_k = t · s_k (see ``schedules``): t = 1/μ0 for the
dyn-μ variants, 1/μ̄ for the constant-budget ones and σ̃ for the general form. ε falls as t
grows, so calibration is a 1-D root find in log t (scipy's brentq) of ε(t) = target:

* ``clt``: the paper's equations 8-10 (closed form or a cheap root find): an accountant's
  ``closed_form_scale``, when it has one, is the answer.
* ``pld`` / ``rdp`` (any accountant without a closed form): certified accountants from
  ``dpdl.accounting.certified``, dispatched through its registry ``ACCOUNTANTS``. The answer is
  bracketed on the *safe* side: the scale returned is the smallest one *evaluated* with the
  requested accountant whose ε is ≤ the target, never an interpolated root.

Which composition a certified accountant uses (:func:`accountant_options`): the blocked
upper bound with ``blocks`` blocks when the caller gives ``blocks`` (kept for backward
compatibility); otherwise exact composition, unless the schedule has more distinct
multipliers than ``EXACT_MAX_DISTINCT`` (exact PLD costs ~50 ms per distinct step on two
shared cores, 10 min for 10⁴; exact RDP ~20 ms). Then PLD uses the binned bound with its
lower companion (``certified``'s ``mode="binned"``: within 0.1 % of exact on MATH.md §2's
Dyn[μ] case, where 100 blocks by count overstate ε by 1.6 % and so cost noise) and RDP the
blocked bound with ``DEFAULT_BLOCKS``. Either way the number is a certified upper bound and
its ``method`` says which.

Heterogeneous schedules are calibrated in two phases: a secant/brentq search on a cheap,
coarse certified bound (the accountant's ``coarse_options``: PLD binned with 100 bins on a
1e-3 loss grid, or 20 blocks for RDP when it has more than 20 distinct multipliers; none:
no coarse phase), then a short
safeguarded secant search with the accountant actually requested, which both refines the
scale (to ``epsilon_rtol`` below the target) and verifies the final answer.

Progress: both calibrators take ``on_iteration(i, total, epsilon)``, called after every
evaluation of ε (i = 1, 2, ...; ``total`` None, the count is not known in advance; ``epsilon``
the ε just computed, under the coarse bound in a coarse phase), and once more at the end with
``total == i`` and the ε of the parameter returned. A certified calibration of a long
heterogeneous schedule takes tens of seconds; this lets a caller show that it is running.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike
from scipy.optimize import brentq

from dpdl.accounting import validators as check
from dpdl.accounting.certified import (
    COARSE_PLD,
    COARSE_RDP,
    Accountant,
    _cached_epsilon,
    get_accountant,
)
from dpdl.accounting.gdp import clt_noise_scale, mu_from_epsilon_delta
from dpdl.accounting.validators import ADD_REMOVE
from dpdl.errors import DPDLError, require

__all__ = ["calibrate_noise_scale", "calibrate_safe", "COARSE_PLD", "COARSE_RDP"]


ProgressCallback = Callable[[int, "int | None", float], None]


class _Progress:
    """Counts a calibration's evaluations of ε and tells ``on_iteration`` of each."""

    def __init__(self, on_iteration: ProgressCallback | None):
        self.on_iteration, self.count = on_iteration, 0

    def watch(self, evaluate: Callable[[float], float]) -> Callable[[float], float]:
        """``evaluate``, reporting every value it returns."""

        def watched(u: float) -> float:
            epsilon = evaluate(u)
            self.count += 1
            if self.on_iteration is not None:
                self.on_iteration(self.count, None, float(epsilon))
            return epsilon

        return watched

    def finish(self, epsilon: float) -> None:
        """The last call: ``total`` = the evaluations made, ``epsilon`` that of the answer."""
        if self.on_iteration is not None:
            self.on_iteration(self.count, self.count, float(epsilon))


def _is_constant(shape: np.ndarray) -> bool:
    return bool(np.ptp(shape) <= 1e-12 * float(np.max(shape)))


class _Converged(Exception):
    """Raised inside a search once a safe point close enough to the target is found."""


class _Search:
    """Memoised ε − target along a coordinate u in which ε falls; remembers the smallest u
    *evaluated* safe (ε ≤ target) and stops (raising ``_Converged``) at the first safe point
    with ε ≥ target · (1 − epsilon_rtol)."""

    def __init__(self, evaluate, target: float, epsilon_rtol: float):
        self.evaluate, self.target, self.epsilon_rtol = evaluate, target, epsilon_rtol
        self.cache: dict[float, float] = {}
        self.best_safe = math.inf

    def __call__(self, u: float) -> float:
        if u not in self.cache:
            epsilon = float(self.evaluate(u))
            self.cache[u] = epsilon
            if epsilon <= self.target:
                self.best_safe = min(self.best_safe, u)
                if epsilon >= self.target * (1 - self.epsilon_rtol):
                    raise _Converged
        return self.cache[u] - self.target

    def _slope(self, log_a: float, log_b: float, fallback: float) -> float:
        eps_a, eps_b = self.cache[log_a], self.cache[log_b]
        if log_a == log_b or not (0 < eps_a < math.inf and 0 < eps_b < math.inf):
            return fallback
        slope = (math.log(eps_b) - math.log(eps_a)) / (log_b - log_a)
        return slope if slope < 0 else fallback

    def log_slope(self) -> float:
        """d log ε / d log t from the two evaluations nearest the target (−3 if unknown)."""
        nearest = sorted(self.cache, key=lambda log_t: abs(self.cache[log_t] - self.target))
        return -3.0 if len(nearest) < 2 else self._slope(nearest[0], nearest[1], -3.0)

    def _best(self) -> float:
        if not math.isfinite(self.best_safe):
            raise DPDLError("calibration failed to find a safe noise scale")
        return self.best_safe

    def solve(self, log_t0: float, slope: float = -3.0, *, log_rtol: float = 1e-5) -> float:
        """Secant steps in log ε from log_t0 until the root is bracketed, then brentq.

        Returns the smallest safe u evaluated (its ε is ≤ the target, within
        ``epsilon_rtol`` of it unless the search ran out of resolution).
        """
        try:
            self._solve(log_t0, slope, log_rtol)
        except _Converged:
            pass
        return self._best()

    def solve_bracket(self, low: float, high: float, xtol: float) -> float:
        """brentq on [low, high] (ε(low) > target ≥ ε(high)); the smallest safe u evaluated."""
        try:
            brentq(self, low, high, xtol=xtol, rtol=4 * np.finfo(float).eps)
        except _Converged:
            pass
        return self._best()

    def _solve(self, log_t: float, slope: float, log_rtol: float) -> None:
        low = high = None  # unsafe (ε > target) and safe log scales
        previous = None
        for _ in range(60):
            unsafe = self(log_t) > 0
            if unsafe:
                low = log_t if low is None else max(low, log_t)
            else:
                high = log_t if high is None else min(high, log_t)
            if low is not None and high is not None:
                break
            if previous is not None:
                slope = self._slope(previous, log_t, slope)
            previous = log_t
            # Aim a little past the target so that the next point lands on the other side.
            aim = self.target * ((1 + self.epsilon_rtol) if not unsafe else (1 - self.epsilon_rtol))
            current = self.cache[log_t]
            if 0 < current < math.inf:
                step = (math.log(aim) - math.log(current)) / slope
            else:  # ε = 0 (far too much noise) or ∞: no slope to follow, take the longest step
                step = 2.0
            step = math.copysign(min(max(abs(step), 1e-3), 2.0), 1.0 if unsafe else -1.0)
            log_t += step
        else:
            raise DPDLError("calibration failed: no noise scale brackets the target epsilon")
        brentq(self, low, high, xtol=log_rtol, rtol=1e-14)


def calibrate_noise_scale(
    multiplier_shape: ArrayLike,
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    accountant: str = "pld",
    blocks: int | None = None,
    epsilon_rtol: float = 2e-3,
    on_iteration: ProgressCallback | None = None,
    neighboring: str = ADD_REMOVE,
) -> float:
    """The smallest scale t (its ε within ``epsilon_rtol`` of the target) with
    ε(z = t·s) ≤ ``epsilon`` under ``accountant`` and the relation ``neighboring``
    (MATH.md §2, "Calibration"; "add-remove" or "replace-one", whose ε is calibrated for).

    For ``pld``/``rdp`` the result is on the safe side: its ε under the accountant with
    :func:`accountant_options` (``blocks``) has been computed and is ≤ the target.
    ``on_iteration``: progress (see the module docstring).
    """
    chosen = get_accountant(accountant)
    check.neighboring(neighboring)
    shape = np.asarray(multiplier_shape, dtype=np.float64).ravel()
    require(
        shape.size > 0 and bool(np.all(np.isfinite(shape))) and bool(np.all(shape > 0)),
        "the noise-multiplier shape must be finite and positive",
    )
    require(
        isinstance(epsilon, int | float | np.floating) and math.isfinite(epsilon) and epsilon > 0,
        f"epsilon must be a finite positive number, got {epsilon!r}",
    )
    delta, sample_rate = check.delta(delta), check.sample_rate(sample_rate)

    clt_scale = clt_noise_scale(mu_from_epsilon_delta(epsilon, delta), sample_rate, shape,
                                neighboring)  # fmt: skip
    final_options = chosen.default_options(shape, blocks) | {"neighboring": neighboring}

    def final(t: float) -> float:
        return _cached_epsilon(chosen.name, t * shape, sample_rate, delta,
                               **final_options).epsilon  # fmt: skip

    progress = _Progress(on_iteration)
    closed_form = chosen.closed_form_scale(shape, epsilon=epsilon, delta=delta,
                                           sample_rate=sample_rate, neighboring=neighboring)
    if closed_form is not None:  # the CLT's equations 8-10: no search
        progress.finish(final(closed_form))
        return closed_form
    search = _Search(progress.watch(lambda log_t: final(math.exp(log_t))), epsilon, epsilon_rtol)
    log_scale = _certified_log_scale(search, shape, clt_scale, progress, delta=delta,
                                     sample_rate=sample_rate, accountant=chosen,
                                     neighboring=neighboring)  # fmt: skip
    progress.finish(search.cache[log_scale])
    return math.exp(log_scale)


def _certified_log_scale(search: _Search, shape, clt_scale, progress, *, delta, sample_rate,
                         accountant: Accountant, neighboring) -> float:  # fmt: skip
    """The two-phase search of :func:`calibrate_noise_scale` (module docstring): log t, the
    coarse phase on the accountant's ``coarse_options`` (none: search directly)."""
    epsilon, epsilon_rtol = search.target, search.epsilon_rtol
    coarse_options = accountant.coarse_options(shape)
    if _is_constant(shape) or coarse_options is None:
        # A coarse phase would cost as much as the real thing: search directly.
        return search.solve(math.log(clt_scale))
    coarse_options = coarse_options | {"neighboring": neighboring}
    coarse = _Search(
        progress.watch(lambda log_t: _cached_epsilon(
            accountant.name, math.exp(log_t) * shape, sample_rate, delta, **coarse_options
        ).epsilon),
        epsilon,
        epsilon_rtol,
    )  # fmt: skip
    coarse_scale = math.exp(coarse.solve(math.log(clt_scale)))
    return search.solve(math.log(coarse_scale), coarse.log_slope())


def calibrate_safe(
    epsilon_of: Callable[[float], float],
    target: float,
    bracket: tuple[float, float],
    *,
    log_scale: bool = True,
    xtol: float = 1e-12,
    epsilon_rtol: float = 0.0,
    max_expansions: int = 60,
    on_iteration: ProgressCallback | None = None,
) -> float:
    """The parameter nearest the root of ε(x) = ``target`` whose ε was *evaluated* ≤ target:
    the one safe calibrator of every accountant (shaped like dp_accounting's
    ``calibrate_dp_mechanism``: a function from the parameter to ε, a target, a bracket).

    ε must be monotone in x on the bracket, falling (a noise scale) or rising (a per-step ε):
    the direction is read from the bracket's ends, which must give distinct, non-NaN ε. The
    safe end is pushed outwards (×4, or +1.4 without ``log_scale``) until it is safe; with
    ``log_scale`` the other end is pushed outwards too while it is safe (without, it is returned
    as it is: the caller's domain ends there). ``xtol`` is brentq's tolerance in log x (in x
    without ``log_scale``); ``epsilon_rtol`` > 0 stops at the first safe point within that
    relative distance of the target. ``on_iteration``: progress (module docstring). Every
    failure is a one-line ``DPDLError``.
    """
    require(math.isfinite(target) and target > 0, f"target epsilon must be > 0, got {target!r}")
    low, high = (float(b) for b in bracket)
    require(low < high, f"the bracket must be increasing, got {bracket!r}")
    require(not log_scale or low > 0, f"a log-scale bracket must be positive, got {bracket!r}")
    to_x = math.exp if log_scale else float
    memo: dict[float, float] = {}
    progress = _Progress(on_iteration)
    evaluate = progress.watch(epsilon_of)

    def epsilon_at(x: float) -> float:
        if x not in memo:
            memo[x] = float(evaluate(x))
            require(not math.isnan(memo[x]), f"epsilon is NaN at {x!r}: cannot calibrate")
        return memo[x]

    u_low, u_high = (math.log(low), math.log(high)) if log_scale else (low, high)
    at_low, at_high = epsilon_at(to_x(u_low)), epsilon_at(to_x(u_high))
    require(at_low != at_high, f"epsilon is {at_low!r} at both ends of {bracket!r}")
    sign = 1.0 if at_high < at_low else -1.0  # the search runs along v = sign · u; ε falls in v
    search = _Search(lambda v: epsilon_at(to_x(sign * v)), target, epsilon_rtol)
    unsafe_end, safe_end = (u_low, u_high) if sign > 0 else (-u_high, -u_low)
    step = math.log(4.0) if log_scale else 1.4
    try:
        found = _safe_point(search, unsafe_end, safe_end, step, log_scale, max_expansions, xtol)
        answer = to_x(sign * found)
    except _Converged:  # an end (or an expanded end) already met the target closely enough
        answer = to_x(sign * search._best())
    except (ValueError, OverflowError) as err:  # NaN inside the bracket, overflow of x
        raise DPDLError(f"calibration failed: {err}") from None
    progress.finish(epsilon_at(answer))
    return answer


def _safe_point(search, unsafe_end, safe_end, step, expand_unsafe, max_expansions, xtol):
    for _ in range(max_expansions):
        if search(safe_end) <= 0:
            break
        unsafe_end, safe_end = safe_end, safe_end + step
    else:
        raise DPDLError(f"no parameter reaches epsilon <= {search.target!r} (searched "
                        f"{max_expansions} expansions of the bracket)")
    for _ in range(max_expansions if expand_unsafe else 0):
        if search(unsafe_end) > 0:
            break
        unsafe_end -= step
    if search(unsafe_end) <= 0:
        return unsafe_end
    return search.solve_bracket(unsafe_end, safe_end, xtol)
