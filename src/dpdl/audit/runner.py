"""``run_audit``: calibrate a schedule, run canary trials through the engine, bound ε (MATH.md §8).

The trials are split once, by index, into a *selection* part (every tenth pair of trials, one
without and one with the canary) whose scores
fix the thresholds and an *evaluation* part on which the Clopper–Pearson bounds are taken, so
the thresholds never depend on the trials that test them; Bonferroni then covers the fixed set
of thresholds.  Half of the trials (alternating) hold the canary.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import make_schedule
from dpdl.audit.stats import (
    epsilon_lower_bound,
    gdp_epsilon_lower_bound,
    one_run_epsilon_lower_bound,
    threshold_bounds,
)
from dpdl.audit.trials import AuditDesign, run_one_run, run_trials
from dpdl.errors import require

__all__ = [
    "AuditExecution",
    "AuditResult",
    "run_audit",
    "run_one_run_audit",
    "DEFAULT_TRIALS",
    "THRESHOLD_LEVELS",
    "SELECTION_EVERY",
]

# Quantile levels of the selection scores used as thresholds (fixed before the evaluation).
THRESHOLD_LEVELS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.95, 0.98, 0.99)
SELECTION_EVERY = 10
DEFAULT_TRIALS = 5000
DEFAULT_CHUNK = 1000  # trials per engine call: bounds memory, not results


@dataclass(frozen=True)
class AuditExecution:
    """How an audit runs, not what it audits: ``noise_scale`` multiplies the noise the engine
    adds (the claim checked stays the calibrated ε), ``confidence`` is the bounds' level,
    ``seed`` makes the audit reproducible (None: every trial's noise and sampling come from OS
    entropy), ``noise`` names the mechanism audited (``"exact"``, the engine's; or an old
    sampler kept to be refuted: :data:`~dpdl.audit.trials.NOISE_MECHANISMS`), ``chunk`` is the
    trials per engine call (bounds memory, not results; a one-run audit has one run) and
    ``progress`` shows a progress bar."""

    noise_scale: float = 1.0
    confidence: float = 0.95
    seed: int | None = None
    noise: str = "exact"
    chunk: int = DEFAULT_CHUNK
    progress: bool = False


@dataclass
class AuditResult:
    algorithm: str
    threat: str
    canary: str
    trials: int
    confidence: float
    delta: float
    steps: int
    sample_rate: float
    calibrated_with: str
    noise_scale: float
    epsilon_claimed: float
    epsilon_clt: float
    epsilon_certified: float
    epsilon_lower: float
    epsilon_lower_gdp: float | None
    mu_lower_gdp: float | None
    claim_refuted: bool
    trials_per_second: float
    seeded: bool
    noise: str
    design: dict[str, Any] = field(default_factory=dict)
    # threat "observer", p = 1: the exact privacy of the observers' view (MATH.md §9)
    mu_view: float | None = None
    epsilon_view: float | None = None
    one_run: dict[str, Any] | None = None  # m, guesses, correct of a one-run audit
    scores: np.ndarray | None = field(default=None, repr=False)
    members: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("scores")
        out.pop("members")
        return out


def _check_scale_and_confidence(noise_scale: float, confidence: float) -> None:
    require(
        math.isfinite(noise_scale) and noise_scale > 0,
        f"--noise-scale must be positive, got {noise_scale}",
    )
    require(0 < confidence < 1, f"confidence must lie in (0, 1), got {confidence}")


def _result(schedule, design: AuditDesign, *, algorithm, epsilon, calibrate, epsilon_clt,
            epsilon_certified, seed, elapsed, runs, **specific) -> AuditResult:
    """The fields every audit reports; ``specific`` holds the rest (trials, bounds, scores)."""
    return AuditResult(
        algorithm=algorithm, threat=design.threat, delta=schedule.delta, steps=schedule.steps,
        sample_rate=schedule.sample_rate, calibrated_with=calibrate,
        epsilon_claimed=float(epsilon), epsilon_clt=epsilon_clt,
        epsilon_certified=epsilon_certified, claim_refuted=specific["epsilon_lower"] > epsilon,
        trials_per_second=runs / elapsed if elapsed > 0 else math.inf,
        seeded=seed is not None, design=asdict(design), **specific,
    )  # fmt: skip


def algorithm_design(algorithm: str, design: AuditDesign
                     ) -> tuple[str, AuditDesign, dict[str, float] | None]:  # fmt: skip
    """(schedule family, the design with the algorithm's rounds per step, its releases as a
    schedule takes them) of a registered algorithm "name(key=value, ...)".

    One release: the trials play its view, one release then R rounds.  Several releases (each
    step sends several noisy messages, e.g. gradient tracking's model and tracker): the view is
    bounded by local DP, so the trials play every release of node 0 and the adversary is given
    node 0's state (white box, stronger than any coalition of observers); the claim checked is
    the ledger's composition of all of them."""
    from dataclasses import replace

    from dpdl.algorithms.registry import resolve

    plugin, settings = resolve(algorithm)
    releases = plugin.schedule_releases(settings)
    view = plugin.view(settings)
    if releases is not None and len(releases) > 1:
        require(design.threat in ("messages", "observer"),
                f"{algorithm} releases {len(releases)} noisy messages per step "
                f"({', '.join(releases)}); the audit plays them under the 'messages' or "
                f"'observer' threat, not {design.threat!r} (the trials play the releases, "
                "not the algorithm's own update)")  # fmt: skip
        require(view.rounds == 1, f"{algorithm}: several releases and {view.rounds} rounds "
                "per step; the audit plays one round")  # fmt: skip
        return plugin.schedule, design, releases
    require(view.exact, f"{algorithm}: its view is not one linear Gaussian stream; nothing "
            "to audit")  # fmt: skip
    # the trials play one release then rounds without fresh noise (Muffliato's steps)
    require(view.rounds == 1 or not view.fresh_noise_every_round,
            f"{algorithm}: {view.rounds} rounds per step, each with fresh noise: the audit's "
            "trials play one noisy round per step")  # fmt: skip
    return plugin.schedule, replace(design, rounds_per_step=view.rounds), releases


def _calibrated(algorithm, epsilon, delta, steps, sample_rate, calibrate, schedule_options):
    """The schedule `dpdl run` would train with, its approved ledger, and its CLT/PLD ε."""
    schedule = make_schedule(
        algorithm, epsilon=epsilon, delta=delta, steps=steps, sample_rate=sample_rate,
        calibrate=calibrate, **(schedule_options or {}),
    )  # fmt: skip
    require(schedule.private, f"algorithm {algorithm!r} is not private: nothing to audit")
    # The same fail-closed gate as `dpdl run`: the claim must fit its budget before any trial.
    ledger = PrivacyLedger.for_schedule(schedule)
    return (
        schedule,
        ledger,
        float(schedule.epsilon("clt").epsilon),
        float(schedule.epsilon("pld").epsilon),
    )


def _thresholds(scores: np.ndarray) -> np.ndarray:
    return np.unique(np.quantile(scores, THRESHOLD_LEVELS))


def run_audit(
    algorithm: str,
    *,
    epsilon: float,
    delta: float,
    steps: int,
    sample_rate: float,
    calibrate: str = "pld",
    trials: int = DEFAULT_TRIALS,
    design: AuditDesign | None = None,
    schedule_options: dict[str, Any] | None = None,
    execution: AuditExecution | None = None,
) -> AuditResult:
    """Audit ``algorithm`` calibrated to (ε, δ) over ``trials`` independent trainings.

    ``schedule_options`` are further keyword arguments of
    :func:`~dpdl.accounting.schedules.make_schedule` (``options``, ``blocks``).
    ``execution`` (default ``AuditExecution()``) is how the audit runs: its ``seed`` makes
    the audit itself reproducible (labelled ``seeded`` in the result); by default every
    trial's noise and sampling come from OS entropy.  The claim checked is the calibrated ε
    (the target); ``execution.noise_scale`` only changes the noise the engine adds.
    """
    run = AuditExecution() if execution is None else execution
    noise_scale, confidence, seed, noise = run.noise_scale, run.confidence, run.seed, run.noise
    chunk, progress = run.chunk, run.progress
    family, design, releases = algorithm_design(algorithm, design or AuditDesign())
    design.validate()
    require(
        isinstance(trials, int) and trials >= 2, f"trials must be an integer >= 2, got {trials}"
    )
    _check_scale_and_confidence(noise_scale, confidence)
    require(chunk >= 1, f"chunk must be >= 1, got {chunk}")
    schedule, ledger, epsilon_clt, epsilon_certified = _calibrated(
        family, epsilon, delta, steps, sample_rate, calibrate,
        {**(schedule_options or {}), "releases": releases},
    )
    members = np.arange(trials) % 2 == 1
    scores = np.empty(trials)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=trials * steps, desc=f"audit {algorithm}", unit="trial-step")
    start = time.perf_counter()
    for first in range(0, trials, chunk):
        block = members[first : first + chunk]
        scores[first : first + block.size] = run_trials(
            schedule, design, block, noise_scale=noise_scale, seed=seed,
            noise=noise, first_trial=first, total_trials=trials,
            on_step=None if bar is None else (lambda size=block.size: bar.update(size)),
        )  # fmt: skip
    elapsed = time.perf_counter() - start
    if bar is not None:
        bar.close()
    ledger.record_steps(schedule.release_multipliers)  # the claim every trial ran under

    # Whole (out, in) pairs of consecutive trials, so the selection part holds both labels.
    selection = (np.arange(trials) // 2) % SELECTION_EVERY == 0
    evaluation = ~selection
    eps_lower, mu_gdp, eps_gdp = 0.0, None, None
    exact_gaussian = schedule.sample_rate >= 1
    if selection.any() and members[evaluation].any() and (~members[evaluation]).any():
        bounds = threshold_bounds(
            scores[evaluation], members[evaluation], _thresholds(scores[selection]), confidence
        )
        eps_lower = epsilon_lower_bound(bounds, delta)
        if exact_gaussian:
            mu_gdp, eps_gdp = gdp_epsilon_lower_bound(bounds, delta)
    elif exact_gaussian:
        mu_gdp, eps_gdp = 0.0, 0.0
    mu_view = eps_view = None
    if design.threat == "observer" and exact_gaussian and len(schedule.release_factors) == 1:
        mu_view, eps_view = _view_privacy(schedule, design)
    return _result(
        schedule, design, algorithm=algorithm, epsilon=epsilon, calibrate=calibrate,
        epsilon_clt=epsilon_clt, epsilon_certified=epsilon_certified, seed=seed,
        elapsed=elapsed, runs=trials, canary=design.canary, trials=trials,
        confidence=confidence, noise_scale=noise_scale, epsilon_lower=eps_lower,
        epsilon_lower_gdp=eps_gdp, mu_lower_gdp=mu_gdp, noise=noise,
        scores=scores, members=members, mu_view=mu_view, epsilon_view=eps_view,
    )  # fmt: skip


def _view_privacy(schedule, design: AuditDesign) -> tuple[float, float]:
    """The exact μ and ε(δ) of node 0's gradient canary against the observers (p = 1)."""
    from dpdl.accounting.gossip import epsilon_of, schedule_view_mu
    from dpdl.topology import make_topology

    topology = make_topology(design.topology, design.nodes)
    sigmas = schedule.sigma[: schedule.steps] * schedule.release_factors[0]
    if design.correlation == "independent":
        mu = schedule_view_mu(topology.mixing_matrix, target=0, observers=design.observers,
                              sigmas=sigmas, sensitivities=schedule.clip[: schedule.steps],
                              period=design.rounds_per_step)  # fmt: skip
    else:
        from dpdl.accounting.correlated import correlated_schedule_view_mu, make_noise_model

        mu = correlated_schedule_view_mu(
            topology.mixing_matrix, target=0, observers=design.observers,
            model=make_noise_model(design.correlation, design.correlation_factor),
            sigmas=sigmas, sensitivities=schedule.clip[: schedule.steps],
            period=design.rounds_per_step)  # fmt: skip
    return mu, float(epsilon_of(mu, schedule.delta))


# Guess counts r (as fractions of m) tried by the one-run audit; Bonferroni over them.
ONE_RUN_GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def run_one_run_audit(
    algorithm: str,
    *,
    epsilon: float,
    delta: float,
    steps: int,
    sample_rate: float,
    canaries: int,
    calibrate: str = "pld",
    design: AuditDesign | None = None,
    schedule_options: dict[str, Any] | None = None,
    execution: AuditExecution | None = None,
) -> AuditResult:
    """Audit with ``canaries`` gradient canaries in ONE training run (Steinke et al. 2023).

    Each canary is in with probability ½; the auditor guesses "in" for the r/2 highest and "out"
    for the r/2 lowest scores, for every r in ``ONE_RUN_GUESS_FRACTIONS`` · m (Bonferroni over
    them), and reports the one-run bound of the best.  No GDP bound: the canaries of one run are
    not independent trials.  ``execution`` is how the audit runs (its ``chunk`` is unused).
    """
    run = AuditExecution() if execution is None else execution
    noise_scale, confidence, seed, noise = run.noise_scale, run.confidence, run.seed, run.noise
    progress = run.progress
    family, design, releases = algorithm_design(algorithm, design or AuditDesign())
    require(releases is None or len(releases) == 1,
            f"{algorithm}: a one-run audit plays one release per step")  # fmt: skip
    require(design.rounds_per_step == 1,
            f"{algorithm}: a one-run audit plays one gossip round per step")  # fmt: skip
    design.validate()
    require(
        isinstance(canaries, int) and canaries >= 2,
        f"a one-run audit needs >= 2 canaries, got {canaries}",
    )
    _check_scale_and_confidence(noise_scale, confidence)
    schedule, ledger, epsilon_clt, epsilon_certified = _calibrated(
        family, epsilon, delta, steps, sample_rate, calibrate, schedule_options
    )
    # Which canaries are in: the auditor's coin flips (OS entropy unless the audit is seeded).
    coins = np.random.default_rng(None if seed is None else [seed, 1])
    included = coins.random(canaries) < 0.5
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, desc=f"one-run audit {algorithm}", unit="step")
    start = time.perf_counter()
    scores = run_one_run(
        schedule, design, included, noise_scale=noise_scale, seed=seed,
        noise=noise, on_step=None if bar is None else (lambda: bar.update(1)),
    )  # fmt: skip
    elapsed = time.perf_counter() - start
    if bar is not None:
        bar.close()
    ledger.record_steps(schedule.noise_multipliers)

    order = np.argsort(-scores, kind="stable")
    ranked = included[order]
    sizes = sorted({max(1, int(round(f * canaries / 2))) for f in ONE_RUN_GUESS_FRACTIONS})
    sizes = [k for k in sizes if 2 * k <= canaries]
    level = 1 - (1 - confidence) / len(sizes)
    best = (0.0, 0, 0)
    for k in sizes:
        correct = int(ranked[:k].sum() + (~ranked[-k:]).sum())
        bound = one_run_epsilon_lower_bound(canaries, 2 * k, correct, delta, level)
        if bound > best[0] or best[1] == 0:
            best = (bound, 2 * k, correct)
    eps_lower, guesses, correct = best
    return _result(
        schedule, design, algorithm=algorithm, epsilon=epsilon, calibrate=calibrate,
        epsilon_clt=epsilon_clt, epsilon_certified=epsilon_certified, seed=seed,
        elapsed=elapsed, runs=1, canary="gradient", trials=1, confidence=confidence,
        noise_scale=noise_scale, epsilon_lower=eps_lower, epsilon_lower_gdp=None,
        mu_lower_gdp=None, noise=noise, scores=scores, members=included,
        one_run={"canaries": canaries, "guesses": guesses, "correct": correct},
    )  # fmt: skip
