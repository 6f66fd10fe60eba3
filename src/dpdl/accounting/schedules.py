"""Clip, budget and noise schedules of the Dyn-D2P family (MATH.md §2, seed 000 §3).

Every private schedule is described the same way: a *noise-multiplier shape* s_k > 0 and a
scalar *noise scale* t, the noise multiplier of step k being z_k = σ_k / C_k = t · s_k.

=============  =======================  ====================  =========================
algorithm      clip C_k                 budget μ_k = 1/z_k    scale t
=============  =======================  ====================  =========================
dyn-d2p        C0 ρ_c^(−k/K)            μ0 ρ_μ^(k/K)          1/μ0   (s_k = ρ_μ^(−k/K))
dyn-c-d2p      C0 ρ_c^(−k/K)            μ̄                     1/μ̄    (s_k = 1)
dyn-mu-d2p     C̄                        μ0 ρ_μ^(k/K)          1/μ0   (s_k = ρ_μ^(−k/K))
const-d2p      C̄                        μ̄                     1/μ̄    (s_k = 1)
general        any C_k > 0              C_k / (σ̃ σ̃_k)         σ̃      (s_k = σ̃_k / C_k)
sgp            no clipping              —                     no noise
=============  =======================  ====================  =========================

so one calibration routine (a 1-D root find in log t, ε is decreasing in t) serves every
algorithm and every accountant: the CLT (eq. 8, 9, 10, solved here) and the certified PLD/RDP
accountants (``dpdl.accounting.calibration``).

Defaults (exposed everywhere; the paper's appendix with its values is not available, see
MATH.md §4): C̄ = 1.0, C0 = C̄, ρ_c = 2, ρ_μ = 2; ``general`` defaults to Corollary 1's instance
C_k ∝ ρ_c^(−k/K), σ̃_k ∝ (ρ_c ρ_μ)^(−k/K) with C_0 = C0.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from dpdl.accounting import validators as check
from dpdl.accounting.calibration import ProgressCallback, calibrate_noise_scale
from dpdl.accounting.certified import (
    ACCOUNTANTS,
    EpsilonReport,
    accountant_names,
    check_accountant,
    epsilon_report,
)
from dpdl.accounting.validators import ADD_REMOVE
from dpdl.accounting.validators import per_step as array_schedule
from dpdl.errors import DPDLError, require

__all__ = [
    "ALGORITHMS",
    "ScheduleFamily",
    "ShapeOptions",
    "register_schedule_family",
    "unregister_schedule_family",
    "schedule_family",
    "algorithm_names",
    "private_algorithm_names",
    "algorithm_private",
    "DEFAULT_CLIP",
    "DEFAULT_RHO_C",
    "DEFAULT_RHO_MU",
    "PrivacySchedule",
    "constant_clip",
    "exponential_clip",
    "uniform_budget",
    "exponential_budget",
    "array_schedule",
    "noise_from_budget",
    "noise_shape_of",
    "make_schedule",
    "calibrate",
    "CalibrationResult",
]

DEFAULT_CLIP = 1.0
DEFAULT_RHO_C = 2.0
DEFAULT_RHO_MU = 2.0


def _fraction(steps: int) -> np.ndarray:
    return np.arange(steps, dtype=np.float64) / steps  # k / K, k = 0 … K−1


# --------------------------------------------------------------------------- shapes
def constant_clip(clip: float, steps: int) -> np.ndarray:
    """C_k = C̄ for every step (Dyn[μ], Const)."""
    return np.full(check.steps(steps), check.positive("clip", clip))


def exponential_clip(clip0: float, rho_c: float, steps: int) -> np.ndarray:
    """C_k = C0 · ρ_c^(−k/K) (Dyn-D2P, Dyn[C]; MATH.md §2 table)."""
    clip0, rho_c, steps = (
        check.positive("clip0", clip0),
        check.ratio("rho_c", rho_c),
        check.steps(steps),
    )
    return clip0 * rho_c ** (-_fraction(steps))


def uniform_budget(mu_bar: float, steps: int) -> np.ndarray:
    """μ_k = μ̄ for every step."""
    return np.full(check.steps(steps), check.positive("mu_bar", mu_bar))


def exponential_budget(mu0: float, rho_mu: float, steps: int) -> np.ndarray:
    """μ_k = μ0 · ρ_μ^(k/K) (Dyn-D2P, Dyn[μ]; MATH.md §2 table)."""
    mu0, rho_mu, steps = (
        check.positive("mu0", mu0),
        check.ratio("rho_mu", rho_mu),
        check.steps(steps),
    )
    return mu0 * rho_mu ** _fraction(steps)


def noise_from_budget(clip: ArrayLike, mu: ArrayLike) -> np.ndarray:
    """σ_k = C_k / μ_k (the Gaussian mechanism of sensitivity C_k is μ_k-GDP, Prop. 1)."""
    clip = array_schedule("clip", clip)
    mu = array_schedule("mu", mu, clip.size)
    return clip / mu


# --------------------------------------------------------------------------- schedule
@dataclass(frozen=True)
class PrivacySchedule:
    """The per-step clip bound and noise of one run, and how they were calibrated (MATH.md §2).

    ``mu_tot`` is the CLT total μ (eq. 6) of the schedule under its relation; it equals
    μ(ε, δ) when the schedule was calibrated with the CLT and is smaller when a certified
    accountant was used.  ``mu`` (μ_k = C_k / σ_k), ``mu0`` and ``mu_bar`` describe its shape in
    the paper's units whatever the relation.  ``neighboring``: the relation its ε is stated
    (and was calibrated) for, "add-remove" or "replace-one" (MATH.md Conventions).
    """

    algorithm: str
    steps: int
    sample_rate: float
    delta: float | None
    epsilon_target: float | None
    clip: np.ndarray | None
    sigma: np.ndarray
    mu: np.ndarray | None
    calibrated_with: str | None
    mu_tot: float | None = None
    mu0: float | None = None
    mu_bar: float | None = None
    sigma_scale: float | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    neighboring: str = ADD_REMOVE
    # The noisy messages one step releases (an algorithm's releases: name, multiplier factor):
    # release r of step k is a subsampled Gaussian with multiplier z_k * factor_r.
    release_names: tuple[str, ...] = ("update",)
    release_factors: tuple[float, ...] = (1.0,)

    @property
    def releases(self) -> tuple[str, ...]:
        return self.release_names

    @property
    def release_multipliers(self) -> np.ndarray:
        """Every mechanism of the run, step by step and release by release: z_k * factor_r."""
        return np.outer(self.noise_multipliers, self.release_factors).ravel()

    @property
    def private(self) -> bool:
        """True when every step clips and adds noise."""
        return self.clip is not None and bool(np.all(self.sigma > 0))

    @property
    def noise_multipliers(self) -> np.ndarray:
        """z_k = σ_k / C_k; zeros for the non-private ``sgp``."""
        if self.clip is None:
            return np.zeros(self.steps)
        return self.sigma / self.clip

    def epsilon(self, accountant: str = "pld", steps: int | None = None, **options: Any):
        """ε of the first ``steps`` steps (all by default) under ``accountant`` at δ.

        Returns an ``EpsilonReport`` under the schedule's relation; ``sgp`` (no noise) has
        ε = ∞. ``options`` go to ``dpdl.accounting.certified.compute_epsilon`` (``mode``,
        ``blocks``, ...).
        """
        require(self.delta is not None, "this schedule has no delta; epsilon is undefined")
        steps = self.steps if steps is None else check.steps(steps)
        require(steps <= self.steps, f"steps = {steps} exceeds the schedule's {self.steps} steps")
        return epsilon_report(
            accountant,
            self.release_multipliers[: steps * len(self.release_factors)],
            self.sample_rate,
            self.delta,
            **({"neighboring": self.neighboring} | options),
        )

    def to_dict(self) -> dict[str, Any]:
        """Scalars of the schedule (no per-step arrays), JSON-ready."""
        z = self.noise_multipliers
        return {
            "algorithm": self.algorithm,
            "steps": self.steps,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
            "epsilon_target": self.epsilon_target,
            "calibrated_with": self.calibrated_with,
            "neighboring": self.neighboring,
            "mu_tot": self.mu_tot,
            "mu0": self.mu0,
            "mu_bar": self.mu_bar,
            "sigma_scale": self.sigma_scale,
            "clip_first": None if self.clip is None else float(self.clip[0]),
            "clip_last": None if self.clip is None else float(self.clip[-1]),
            "sigma_first": float(self.sigma[0]),
            "sigma_last": float(self.sigma[-1]),
            "noise_multiplier_first": float(z[0]),
            "noise_multiplier_last": float(z[-1]),
            **self.parameters,
        } | ({} if self.release_factors == (1.0,) else {
            "releases": dict(zip(self.release_names, self.release_factors, strict=True))})

    def table(self) -> np.ndarray:
        """Per-step rows (k, C_k, μ_k, σ_k); NaN where undefined (sgp)."""
        nan = np.full(self.steps, np.nan)
        return np.column_stack(
            [
                np.arange(self.steps, dtype=np.float64),
                nan if self.clip is None else self.clip,
                nan if self.mu is None else self.mu,
                self.sigma,
            ]
        )


# --------------------------------------------------------------------- the families
@dataclass(frozen=True)
class ShapeOptions:
    """What a family's shapes may read: C̄, C0 (None: C̄), ρ_c, ρ_μ and, for ``general``,
    given clip and noise shapes (None: Corollary 1's)."""

    clip: float = DEFAULT_CLIP
    clip0: float | None = None
    rho_c: float = DEFAULT_RHO_C
    rho_mu: float = DEFAULT_RHO_MU
    clip_shape: ArrayLike | None = None
    noise_shape: ArrayLike | None = None

    @property
    def first_clip(self) -> float:
        """C0: the given one, else C̄."""
        return self.clip if self.clip0 is None else self.clip0


Shape = Callable[[int, ShapeOptions], np.ndarray]


@dataclass(frozen=True)
class ScheduleFamily:
    """One schedule of the Dyn-D2P family (a row of the module docstring's table).

    ``clip_shape(steps, options)`` gives C_k and either ``multiplier_shape`` the noise
    multiplier's shape s_k (σ̃_k = C_k s_k) or ``noise_shape`` the noise's σ̃_k (s_k = σ̃_k /
    C_k); a family with neither clip nor noise (``sgp``) is not private. ``scale`` names what
    the calibrated scale t is reported as ("mu0": μ_0 = 1/t, "mu_bar": μ̄ = 1/t,
    "sigma_scale": σ̃ = t, or None). ``parameters``: the settings its shapes read (of
    ``clip``, ``clip0``, ``rho_c``, ``rho_mu``, ``clip_shape``, ``noise_shape``); a
    schedule records the ρ's it read. ``display`` (how reports and notes name it), ``short``
    (in a gain's column, "gain Dyn vs Const"), ``order`` (the report's order: None, the
    registration order), ``rivals`` (the families a report checks it against at equal ε,
    paired by seed) and ``baseline`` (the rival whose relative gain the report tabulates).
    """

    name: str
    display: str
    clip_shape: Shape | None = None
    multiplier_shape: Shape | None = None
    noise_shape: Shape | None = None
    scale: str | None = None
    parameters: tuple[str, ...] = ()
    short: str = ""
    order: int | None = None
    rivals: tuple[str, ...] = ()
    baseline: str | None = None
    description: str = ""

    @property
    def private(self) -> bool:
        """Whether its steps clip and add noise (``sgp``: no)."""
        return self.clip_shape is not None

    def shapes(self, steps: int, options: ShapeOptions) -> tuple[np.ndarray, np.ndarray,
                                                                np.ndarray]:  # fmt: skip
        """(clip C_k, noise-multiplier shape s_k, noise shape σ̃_k); σ_k = t · σ̃_k."""
        require(self.private, f"{self.name} is not private: it has no clip or noise shape")
        clips = self.clip_shape(steps, options)
        if self.noise_shape is not None:
            sigma_shape = self.noise_shape(steps, options)
            return clips, sigma_shape / clips, sigma_shape
        multiplier_shape = self.multiplier_shape(steps, options)
        return clips, multiplier_shape, clips * multiplier_shape

    def recorded_parameters(self, options: ShapeOptions) -> dict[str, float]:
        """The ρ's its shapes read (a given clip / noise shape replaces them)."""
        out: dict[str, float] = {}
        if "rho_c" in self.parameters and options.clip_shape is None:
            out["rho_c"] = float(options.rho_c)
        if "rho_mu" in self.parameters and not (
                options.noise_shape is not None and "noise_shape" in self.parameters):
            out["rho_mu"] = float(options.rho_mu)
        return out


def _exponential_clip(steps: int, o: ShapeOptions) -> np.ndarray:
    return exponential_clip(o.first_clip, o.rho_c, steps)


def _constant_clip(steps: int, o: ShapeOptions) -> np.ndarray:
    return constant_clip(o.clip, steps)


def _growing_budget(steps: int, o: ShapeOptions) -> np.ndarray:
    return check.ratio("rho_mu", o.rho_mu) ** (-_fraction(steps))  # s_k = ρ_μ^(−k/K)


def _uniform_budget(steps: int, o: ShapeOptions) -> np.ndarray:
    return np.ones(steps)


def _general_clip(steps: int, o: ShapeOptions) -> np.ndarray:
    if o.clip_shape is None:  # Corollary 1: C_k ∝ ρ_c^(−k/K)
        return exponential_clip(o.first_clip, o.rho_c, steps)
    return array_schedule("clip_shape", o.clip_shape, steps)


def _general_noise(steps: int, o: ShapeOptions) -> np.ndarray:
    if o.noise_shape is None:  # Corollary 1: σ̃_k ∝ (ρ_c ρ_μ)^(−k/K)
        rho_c, rho_mu = check.ratio("rho_c", o.rho_c), check.ratio("rho_mu", o.rho_mu)
        return (rho_c * rho_mu) ** (-_fraction(steps))
    return array_schedule("noise_shape", o.noise_shape, steps)


# name -> family, in registration order (the report's order unless a family sets one);
# iterating gives the names, as the tuple it once was did.
ALGORITHMS: dict[str, ScheduleFamily] = {}


def algorithm_names() -> tuple[str, ...]:
    """The registered families' names, in registration order."""
    return tuple(ALGORITHMS)


def private_algorithm_names() -> tuple[str, ...]:
    """The registered private families' names, in registration order."""
    return tuple(name for name, family in ALGORITHMS.items() if family.private)


def algorithm_private(name: str) -> bool:
    """Whether the family called ``name`` is private. A name not registered here (a run of a
    family this process has not registered, read from its results) counts as private, as
    every name but ``sgp`` always did."""
    family = ALGORITHMS.get(name)
    return family is None or family.private


def register_schedule_family(family: ScheduleFamily, *, replace: bool = False) -> ScheduleFamily:
    """Add ``family`` under ``family.name`` (one call: ``make_schedule``, the settings'
    algorithm names, ``dpdl account`` and the reports then know it). Its ``order`` defaults
    to the registration order; its rivals and baseline must be registered already."""
    name = family.name
    require(isinstance(family, ScheduleFamily),
            f"register a ScheduleFamily, got {type(family).__name__}")  # fmt: skip
    require(isinstance(name, str) and name == name.strip().lower() and name != ""
            and not set(name) & set("@, "),
            f"a family's name must be lower case without '@', ',' or spaces, got {name!r}")
    require(replace or name not in ALGORITHMS,
            f"schedule family {name!r} is already registered")  # fmt: skip
    require(family.private == (family.multiplier_shape is not None
                               or family.noise_shape is not None),
            f"schedule family {name!r}: give a clip shape and one noise or multiplier shape "
            "(neither for a non-private family)")
    require(family.multiplier_shape is None or family.noise_shape is None,
            f"schedule family {name!r}: give a multiplier shape or a noise shape, not both")
    require(family.scale in (None, "mu0", "mu_bar", "sigma_scale"),
            f"schedule family {name!r}: scale must be 'mu0', 'mu_bar', 'sigma_scale' or None")
    for other in (*family.rivals, *([family.baseline] if family.baseline else [])):
        require(other in ALGORITHMS or other == name,
                f"schedule family {name!r}: unknown rival {other!r}")  # fmt: skip
    if family.order is None:
        family = dataclasses.replace(family, order=len(ALGORITHMS) if name not in ALGORITHMS
                         else ALGORITHMS[name].order)  # fmt: skip
    ALGORITHMS[name] = family
    return family


def unregister_schedule_family(name: str) -> ScheduleFamily:
    """Remove (and return) the family registered as ``name``."""
    return ALGORITHMS.pop(schedule_family(name).name)


def schedule_family(name: str) -> ScheduleFamily:
    """The registered family called ``name`` (one-line DPDLError for an unknown one)."""
    require(isinstance(name, str) and name in ALGORITHMS,
            f"unknown algorithm {name!r}; expected one of {algorithm_names()}")  # fmt: skip
    return ALGORITHMS[name]


for _family in (
    ScheduleFamily("sgp", "SGP", short="SGP",
                   description="stochastic gradient push: no clipping, no noise"),
    ScheduleFamily("const-d2p", "Const-D2P", _constant_clip, _uniform_budget, scale="mu_bar",
                   parameters=("clip",), short="Const",
                   description="constant clip C̄ and budget μ̄"),
    ScheduleFamily("dyn-c-d2p", "Dyn[C]-D2P", _exponential_clip, _uniform_budget,
                   scale="mu_bar", parameters=("clip0", "rho_c"), short="Dyn[C]",
                   description="decaying clip C0 ρ_c^(−k/K), constant budget μ̄"),
    ScheduleFamily("dyn-mu-d2p", "Dyn[μ]-D2P", _constant_clip, _growing_budget, scale="mu0",
                   parameters=("clip", "rho_mu"), short="Dyn[μ]",
                   description="constant clip C̄, growing budget μ0 ρ_μ^(k/K)"),
    ScheduleFamily("dyn-d2p", "Dyn-D2P", _exponential_clip, _growing_budget, scale="mu0",
                   parameters=("clip0", "rho_c", "rho_mu"), short="Dyn",
                   rivals=("dyn-c-d2p", "dyn-mu-d2p", "const-d2p"), baseline="const-d2p",
                   description="decaying clip and growing budget (Algorithm 1)"),
    ScheduleFamily("general", "General", _general_clip, noise_shape=_general_noise,
                   scale="sigma_scale",
                   parameters=("clip0", "rho_c", "rho_mu", "clip_shape", "noise_shape"),
                   short="General", description="any clip C_k and noise shape σ̃_k"),
):
    register_schedule_family(_family)
del _family


def noise_shape_of(
    algorithm: str,
    steps: int,
    *,
    clip: float = DEFAULT_CLIP,
    clip0: float | None = None,
    rho_c: float = DEFAULT_RHO_C,
    rho_mu: float = DEFAULT_RHO_MU,
    clip_shape: ArrayLike | None = None,
    noise_shape: ArrayLike | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(clip C_k, noise-multiplier shape s_k, noise shape σ̃_k) of a private algorithm.

    σ_k = t · σ̃_k with the calibrated scale t; z_k = t · s_k.
    """
    steps = check.steps(steps)
    family = ALGORITHMS.get(algorithm)
    if family is None or not family.private:
        raise DPDLError(
            f"unknown private algorithm {algorithm!r}; expected one of "
            f"{private_algorithm_names()}"
        )
    options = ShapeOptions(clip, clip0, rho_c, rho_mu, clip_shape, noise_shape)
    return family.shapes(steps, options)


def _build(
    algorithm: str,
    clips: np.ndarray,
    multiplier_shape: np.ndarray,
    sigma_shape: np.ndarray,
    scale: float,
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    calibrated_with: str,
    parameters: dict[str, Any],
    neighboring: str,
) -> PrivacySchedule:
    from dpdl.accounting.gdp import clt_mu_total

    mus = 1.0 / (scale * multiplier_shape)
    reported = ALGORITHMS[algorithm].scale  # what the scale t is: 1/μ0, 1/μ̄ or σ̃
    return PrivacySchedule(
        algorithm=algorithm,
        steps=clips.size,
        sample_rate=sample_rate,
        delta=delta,
        epsilon_target=epsilon,
        clip=clips,
        sigma=scale * sigma_shape,
        mu=mus,
        calibrated_with=calibrated_with,
        mu_tot=clt_mu_total(sample_rate, mus, neighboring=neighboring),
        mu0=float(mus[0]) if reported == "mu0" else None,
        mu_bar=float(mus[0]) if reported == "mu_bar" else None,
        sigma_scale=scale if reported == "sigma_scale" else None,
        parameters=parameters,
        neighboring=neighboring,
    )


def make_schedule(
    algorithm: str,
    *,
    epsilon: float | None,
    delta: float | None,
    steps: int,
    sample_rate: float,
    options: ShapeOptions | None = None,
    calibrate: str = "pld",
    blocks: int | None = None,
    on_iteration: ProgressCallback | None = None,
    neighboring: str = ADD_REMOVE,
    releases: dict[str, float] | None = None,
) -> PrivacySchedule:
    """The calibrated schedule of ``algorithm`` for a target (ε, δ) under the neighbouring
    relation ``neighboring`` (MATH.md §2 and Conventions: "add-remove", dp_accounting's
    default and this function's, or "replace-one", a run's default; σ is calibrated for it).

    ``calibrate`` picks the accountant whose ε must stay ≤ ``epsilon``: ``"clt"`` is the
    paper's approximation (eq. 8-10, closed form / root find); ``"pld"`` (default) and
    ``"rdp"`` are certified (``dpdl.accounting.calibration``). ``options`` (default
    ``ShapeOptions()``) are what the family's shapes read: C̄, C0 (default C̄), ρ_c, ρ_μ and
    ``general``'s clip and noise shapes. ``blocks`` selects the blocked PLD upper bound with
    that many blocks.
    ``on_iteration(i, total, epsilon)`` is told of the calibration's progress
    (``dpdl.accounting.calibration``).
    ``releases`` ({name: factor}, default one release of factor 1): a step releases one
    subsampled Gaussian per entry, with multiplier z_k * factor; σ is calibrated so that all
    of them, composed, meet the target.
    ``algorithm`` names a registered :class:`ScheduleFamily` (:data:`ALGORITHMS`); a
    non-private one (``sgp``) has no clipping, zero noise, and ε, δ may be None.
    """
    family = schedule_family(algorithm)
    steps = check.steps(steps)
    sample_rate = check.sample_rate(sample_rate)
    neighboring = check.neighboring(neighboring)
    if not family.private:
        return PrivacySchedule(
            algorithm=family.name,
            steps=steps,
            sample_rate=sample_rate,
            delta=None if delta is None else check.delta(delta),
            epsilon_target=None,
            clip=None,
            sigma=np.zeros(steps),
            mu=None,
            calibrated_with=None,
            neighboring=neighboring,
        )
    require(epsilon is not None, f"algorithm {algorithm!r} needs a target epsilon")
    epsilon = check.positive("epsilon", epsilon)
    require(delta is not None, f"algorithm {algorithm!r} needs a target delta")
    delta = check.delta(delta)
    check_accountant(calibrate, neighboring)
    options = ShapeOptions() if options is None else options
    clip = check.positive("clip", options.clip)
    clip0 = None if options.clip0 is None else check.positive("clip0", options.clip0)
    options = replace(options, clip=clip, clip0=clip0)
    clips, multiplier_shape, sigma_shape = noise_shape_of(
        algorithm,
        steps,
        clip=clip,
        clip0=clip0,
        rho_c=options.rho_c,
        rho_mu=options.rho_mu,
        clip_shape=options.clip_shape,
        noise_shape=options.noise_shape,
    )
    parameters: dict[str, Any] = {"clip": clip, "clip0": clip if clip0 is None else clip0}
    parameters |= family.recorded_parameters(options)
    if blocks is not None:
        parameters["blocks"] = int(blocks)

    names, factors = _releases(releases)
    scale = calibrate_noise_scale(
        np.outer(multiplier_shape, factors).ravel(),
        epsilon=epsilon,
        delta=delta,
        sample_rate=sample_rate,
        accountant=calibrate,
        blocks=blocks,
        on_iteration=on_iteration,
        neighboring=neighboring,
    )
    schedule = _build(
        algorithm,
        clips,
        multiplier_shape,
        sigma_shape,
        scale,
        epsilon=epsilon,
        delta=delta,
        sample_rate=sample_rate,
        calibrated_with=calibrate,
        parameters=parameters,
        neighboring=neighboring,
    )
    if factors == (1.0,):
        return schedule
    from dpdl.accounting.gdp import clt_mu_total

    every = replace(schedule, release_names=names, release_factors=factors)
    # the CLT μ of every mechanism, each release of each step
    mu_tot = clt_mu_total(sample_rate, 1.0 / every.release_multipliers, neighboring=neighboring)
    return replace(every, mu_tot=mu_tot)


def _releases(releases: dict[str, float] | None) -> tuple[tuple[str, ...], tuple[float, ...]]:
    if releases is None:
        return ("update",), (1.0,)
    require(len(releases) >= 1 and all(math.isfinite(f) and f > 0 for f in releases.values()),
            f"releases must map names to factors > 0, got {releases!r}")  # fmt: skip
    return tuple(releases), tuple(float(f) for f in releases.values())


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
    report: tuple[str, ...] | list[str] | None = None,
    **schedule_options: Any,
) -> CalibrationResult:
    """``make_schedule(algorithm, **schedule_options)``, then ε under every accountant in
    ``report`` (default: every registered one; issue 2, item 4) and the schedule's relation,
    each composed as :func:`accountant_options` says.
    """
    report = accountant_names() if report is None else report
    neighboring = check.neighboring(schedule_options.get("neighboring", ADD_REMOVE))
    for name in report:
        check_accountant(name, neighboring)
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
                certified=ACCOUNTANTS[name].certified,
                method="no-noise",
                neighboring=neighboring,
            )
    return CalibrationResult(schedule=schedule, reports=reports)
