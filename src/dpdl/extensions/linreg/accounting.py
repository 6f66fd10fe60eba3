"""Privacy of DP decentralized linear regression (MATH.md §5, seed 001 Theorem 1).

Mechanism: every node shares ``β♭_i(t) = β_i(t) + ω_i(t)`` with i.i.d. Laplace coordinates of
*scale* ``v(t)`` (density ∝ exp(−|x|/v), std √2·v). Adjacency ("(δ_X, δ_y)-adjacency"): one
node's whole data set is replaced, both versions satisfying ``‖X_i‖₂ ≤ δ_X`` (spectral norm)
and ``‖y_i‖₂ ≤ δ_y``. These are *data-norm bounds*, not the δ of (ε, δ)-DP: the guarantee
is pure ε-DP. Per step the ℓ1 sensitivity of the gradient term divided by the Laplace scale
gives (MATH.md §5)::

    ε_T = Σ_{t<T} 4 δ_X √(m n_M) (δ_X B_Ω √(k m) + δ_y) · α(t) / v(t+1)

with m features, n_M = max_i n_i records per node, k nodes and B_Ω = sup_{β∈Ω} ‖β‖. This sum
is exact for the schedules used and is the one dpdl calibrates with. The paper's closed form
``4 δ_X (c_α/c_v) T √(m n_M)(δ_X B_Ω √(km) + δ_y)`` is an upper bound on it, valid only when
``1 < d_v + 1 ≤ d_α`` and ``e_v ≤ e_α`` (then every ratio α(t)/v(t+1) ≤ c_α/c_v because
``(t+1+d_v)^{e_v} ≤ (t+d_α)^{e_v} ≤ (t+d_α)^{e_α}`` with ``t + d_α ≥ 1``).

The factor √(km) is the seed's (it bounds ‖P_Ω^*(β♭)‖₁ over all k nodes); only the changed
node's block matters, so the bound is conservative by up to √k. dpdl keeps the seed's constant.

Enforcing the data-norm bounds: clip every feature row to ℓ2 norm ``r`` and every label to
``|y_j| ≤ r_y``; then ``‖X_i‖₂ ≤ ‖X_i‖_F ≤ r √n_i`` and ``‖y_i‖₂ ≤ r_y √n_i``, so
``δ_X = r √n_M`` and ``δ_y = r_y √n_M`` (not r). See :func:`data_norm_bounds`.

This module is pure numpy/scipy: it never imports torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from numpy.typing import ArrayLike

from dpdl.accounting import validators as check
from dpdl.accounting.calibration import calibrate_safe
from dpdl.errors import DPDLError, require

__all__ = [
    "PowerDecay",
    "LinRegSensitivity",
    "LinRegPrivacyReport",
    "data_norm_bounds",
    "epsilon_per_step",
    "epsilon_sum",
    "closed_form_violations",
    "epsilon_closed_form",
    "calibrate_noise_scale",
    "default_noise_shape",
    "privacy_report",
]


@dataclass(frozen=True)
class PowerDecay:
    """The decaying sequence ``c / (t + d)^e`` for t = 0, 1, 2, ... (MATH.md §5: α(t), v(t)).

    ``c > 0`` and ``d > 0`` (so every term is finite and positive); ``e ≥ 0`` (``e = 0`` is a
    constant sequence, allowed for the exact sum but not by the paper's closed form).
    """

    c: float
    d: float
    e: float

    def __post_init__(self) -> None:
        check.positive("the scale c of c/(t+d)^e", self.c)
        check.positive("the offset d of c/(t+d)^e", self.d)
        require(
            isinstance(self.e, int | float | np.integer | np.floating)
            and not isinstance(self.e, bool)
            and math.isfinite(self.e)
            and self.e >= 0,
            f"the exponent e of c/(t+d)^e must be a finite number >= 0, got {self.e!r}",
        )

    def __call__(self, t: ArrayLike) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        if np.any(t < 0):
            raise DPDLError(f"PowerDecay is defined for t >= 0, got min t = {t.min()!r}")
        # Log space keeps large (t + d)^e finite.
        return self.c * np.exp(-self.e * np.log(t + self.d))

    def to_dict(self) -> dict:
        return {"c": float(self.c), "d": float(self.d), "e": float(self.e)}


def data_norm_bounds(row_norm: float, label_bound: float, max_local_records: int):
    """Data-norm bounds ``(δ_X, δ_y)`` enforced by clipping (MATH.md §5).

    Rows clipped to ℓ2 norm ``row_norm`` and labels to ``|y_j| ≤ label_bound`` give
    ``‖X_i‖₂ ≤ ‖X_i‖_F ≤ row_norm √n_i`` and ``‖y_i‖₂ ≤ label_bound √n_i``; the adjacency
    needs the bound for every node, hence n_M = max_i n_i.
    """
    row_norm = check.positive("row_norm (feature-row clipping norm r)", row_norm)
    label_bound = check.positive("label_bound (label clipping bound r_y)", label_bound)
    n_max = check.count("max_local_records (n_M)", max_local_records)
    root = math.sqrt(n_max)
    return row_norm * root, label_bound * root


@dataclass(frozen=True)
class LinRegSensitivity:
    """The quantities of Theorem 1 (seed 001) that fix the per-step privacy loss.

    delta_x, delta_y: data-norm bounds ‖X_i‖₂ ≤ δ_X, ‖y_i‖₂ ≤ δ_y (not the DP δ);
    omega_bound: B_Ω = sup_{β∈Ω} ‖β‖₂; num_features: m; max_local_records: n_M;
    num_nodes: k.
    """

    delta_x: float
    delta_y: float
    omega_bound: float
    num_features: int
    max_local_records: int
    num_nodes: int

    def __post_init__(self) -> None:
        check.positive("delta_x (data-norm bound on ‖X_i‖₂)", self.delta_x)
        check.positive("delta_y (data-norm bound on ‖y_i‖₂)", self.delta_y)
        check.positive("omega_bound (B_Ω = sup ‖β‖ over Ω)", self.omega_bound)
        check.count("num_features (m)", self.num_features)
        check.count("max_local_records (n_M)", self.max_local_records)
        check.count("num_nodes (k)", self.num_nodes)

    @property
    def coefficient(self) -> float:
        """``4 δ_X √(m n_M) (δ_X B_Ω √(k m) + δ_y)``: ε of one step per unit α(t)/v(t+1)."""
        m, n_max, k = self.num_features, self.max_local_records, self.num_nodes
        return (
            4.0
            * self.delta_x
            * math.sqrt(m * n_max)
            * (self.delta_x * self.omega_bound * math.sqrt(k * m) + self.delta_y)
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "coefficient": self.coefficient}


def _check_steps(steps) -> int:
    return check.count("steps (T)", steps)


def epsilon_per_step(
    sensitivity: LinRegSensitivity, alpha: PowerDecay, noise: PowerDecay, steps: int
) -> np.ndarray:
    """ε spent by each step t = 0..T−1: ``coefficient · α(t) / v(t+1)`` (MATH.md §5)."""
    t = np.arange(_check_steps(steps), dtype=np.float64)
    return sensitivity.coefficient * alpha(t) / noise(t + 1.0)


def epsilon_sum(
    sensitivity: LinRegSensitivity, alpha: PowerDecay, noise: PowerDecay, steps: int
) -> float:
    """The exact ε_T of T steps: the sum of :func:`epsilon_per_step` (pure ε-DP composition)."""
    return math.fsum(epsilon_per_step(sensitivity, alpha, noise, steps))


def closed_form_violations(alpha: PowerDecay, noise: PowerDecay) -> list[str]:
    """Which conditions of the paper's closed form fail (empty list: it applies).

    Theorem 1 (seed 001) needs c_α, e_α, c_v, e_v > 0 and 1 < d_v + 1 ≤ d_α; MATH.md §5 adds
    e_v ≤ e_α, without which α(t)/v(t+1) grows and the closed form is not a bound.
    """
    problems = []
    if alpha.e <= 0:
        problems.append(f"e_alpha must be > 0, got {alpha.e!r}")
    if noise.e <= 0:
        problems.append(f"e_v must be > 0, got {noise.e!r}")
    if not noise.d + 1 > 1:
        problems.append(f"need 1 < d_v + 1, got d_v = {noise.d!r}")
    if not noise.d + 1 <= alpha.d:
        problems.append(f"need d_v + 1 <= d_alpha, got d_v = {noise.d!r}, d_alpha = {alpha.d!r}")
    if not noise.e <= alpha.e:
        problems.append(f"need e_v <= e_alpha, got e_v = {noise.e!r}, e_alpha = {alpha.e!r}")
    return problems


def epsilon_closed_form(
    sensitivity: LinRegSensitivity, alpha: PowerDecay, noise: PowerDecay, steps: int
) -> float:
    """The paper's closed form ``4 δ_X (c_α/c_v) T √(m n_M)(δ_X B_Ω √(km) + δ_y)``.

    Raises DPDLError naming the violated condition when it does not apply; it is then not a
    valid bound and :func:`epsilon_sum` must be used.
    """
    steps = _check_steps(steps)
    problems = closed_form_violations(alpha, noise)
    if problems:
        raise DPDLError(
            "the closed-form epsilon of seed 001 Theorem 1 does not apply: "
            + "; ".join(problems)
            + " (use the exact sum instead)"
        )
    return sensitivity.coefficient * (alpha.c / noise.c) * steps


def calibrate_noise_scale(
    epsilon: float,
    sensitivity: LinRegSensitivity,
    alpha: PowerDecay,
    steps: int,
    *,
    noise_offset: float,
    noise_exponent: float,
) -> PowerDecay:
    """The noise schedule ``v(t) = c_v/(t + d_v)^{e_v}`` whose exact ε_T equals ``epsilon``.

    ε_T is proportional to 1/c_v, so ``c_v = ε_T(c_v = 1) / ε``. Fails closed: if rounding
    leaves ε_T a hair above the target, the safe calibrator moves c_v to where it is not.
    """
    epsilon = check.positive("epsilon (target privacy budget)", epsilon)
    unit = PowerDecay(1.0, noise_offset, noise_exponent)
    epsilon_at_unit_scale = epsilon_sum(sensitivity, alpha, unit, steps)
    scale = epsilon_at_unit_scale / epsilon
    require(
        math.isfinite(scale) and scale > 0,
        f"cannot calibrate c_v for epsilon = {epsilon!r}: got c_v = {scale!r}",
    )

    def epsilon_of(c_v: float) -> float:
        return epsilon_sum(sensitivity, alpha, PowerDecay(c_v, noise_offset, noise_exponent), steps)

    # The closed form's scale up to round-off: the safe calibrator settles the last bits.
    c_v = calibrate_safe(epsilon_of, epsilon, (scale * (1 - 1e-9), scale * (1 + 1e-9)),
                         xtol=1e-15)
    return PowerDecay(c_v, noise_offset, noise_exponent)


def default_noise_shape(alpha: PowerDecay) -> tuple[float, float]:
    """``(d_v, e_v) = (d_α − 1, e_α)``: every α(t)/v(t+1) then equals c_α/c_v, so the closed
    form holds and equals the exact sum. With d_α ≤ 1 no d_v > 0 satisfies d_v + 1 ≤ d_α;
    then d_v = d_α (the closed form does not apply; the exact sum still does)."""
    return (alpha.d - 1.0 if alpha.d > 1.0 else alpha.d), alpha.e


@dataclass(frozen=True)
class LinRegPrivacyReport:
    """ε of T steps: the exact sum, and the paper's closed form when its conditions hold."""

    steps: int
    epsilon: float  # the exact sum: the guarantee dpdl states
    epsilon_closed_form: float | None
    closed_form_violations: tuple[str, ...]
    sensitivity: LinRegSensitivity
    alpha: PowerDecay
    noise: PowerDecay

    def to_dict(self) -> dict:
        return {
            "steps": self.steps,
            "epsilon": self.epsilon,
            "epsilon_closed_form": self.epsilon_closed_form,
            "closed_form_violations": list(self.closed_form_violations),
            "sensitivity": self.sensitivity.to_dict(),
            "alpha": self.alpha.to_dict(),
            "noise": self.noise.to_dict(),
            "dp_notion": "pure epsilon-DP, (delta_X, delta_y)-adjacency: one node's whole "
            "data set replaced",
        }


def privacy_report(
    sensitivity: LinRegSensitivity, alpha: PowerDecay, noise: PowerDecay, steps: int
) -> LinRegPrivacyReport:
    problems = tuple(closed_form_violations(alpha, noise))
    return LinRegPrivacyReport(
        steps=_check_steps(steps),
        epsilon=epsilon_sum(sensitivity, alpha, noise, steps),
        epsilon_closed_form=None
        if problems
        else epsilon_closed_form(sensitivity, alpha, noise, steps),
        closed_form_violations=problems,
        sensitivity=sensitivity,
        alpha=alpha,
        noise=noise,
    )
