"""What a run will do, fixed before anything runs: its number of steps, the calibrated privacy
schedule, the ledger's approval of that whole schedule, the step sizes, and the root of its
secret streams; and the epsilon a ledger says was spent.

A private run trains only after a :class:`PrivacyLedger` under the schedule's calibrating
accountant has approved every step of it (``PrivacyBudgetExceeded`` otherwise): the plan is
complete, and checked, before the engine exists.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpdl.accounting.calibration import ProgressCallback
from dpdl.accounting.certified import ACCOUNTANTS, get_accountant
from dpdl.accounting.ledger import MAX_NODE_RATES, PrivacyLedger, accounted_node_rates
from dpdl.accounting.schedules import PrivacySchedule, ShapeOptions, make_schedule
from dpdl.algorithms.dyn_d2p import node_sample_rates
from dpdl.algorithms.randomness import stream_root
from dpdl.algorithms.step import StepArguments
from dpdl.training.settings import AlgorithmSpec, PrivacySection, TrainingSection

__all__ = [
    "RunPlan",
    "approve_schedule",
    "build_schedule",
    "epsilon_per_node",
    "epsilon_spent",
    "node_rates",
    "noise_root",
    "resolve_steps",
]


def noise_root(entropy: str, seed: int, settings: dict[str, Any]) -> bytes | None:
    """The root of one run's secret per-node streams (Poisson sampling and noise).

    The one place where it is decided, for ``dpdl run`` and the Python API alike
    (:mod:`dpdl.algorithms.randomness`): ``entropy="os"`` (the default) gives None, every
    node's stream keyed from the operating system; ``"seed"`` derives it from ``seed`` and the
    run's ``settings`` (:meth:`DecentralizedTrainer.stream_settings`: everything that shapes
    training), so runs that differ in any of them never share noise.
    """
    return stream_root(entropy, seed, settings)


def resolve_steps(steps: int | None, epochs: float | None, counts: Sequence[int] | None,
                  batch_size: float, sampling: str = "uniform",
                  sample_rate: float | None = None) -> int:  # fmt: skip
    """``steps``, or ``epochs`` in steps.  One epoch with ``"uniform"`` sampling is J_min / b
    steps (the smallest node samples each of its records once per epoch on average); with
    ``"per-node"`` it is J̄ / b steps, J̄ = Σ J_i / n the mean node size: the network then draws
    n·b records per step, as many records per epoch as it holds (a node of mean size sees
    each record once, a smaller node more often, a larger one less); with a given
    ``sample_rate`` q it is 1 / q steps (every record sampled once per epoch on average)."""
    if steps is not None:
        return steps
    if sample_rate is not None:
        return max(1, math.ceil(epochs / sample_rate))
    if sampling == "per-node":
        return max(1, math.ceil(epochs * sum(counts) / (len(counts) * batch_size)))
    return max(1, math.ceil(epochs * min(counts) / batch_size))


def node_rates(training: TrainingSection, n: int,
               counts: Sequence[int] | None) -> tuple[np.ndarray, float]:  # fmt: skip
    """(every node's Poisson rate, the rate the schedule is accounted at, the largest): the
    given ``training.sample_rate`` q at every node (no size read), else b / J_min or b / J_i
    as ``training.sampling`` says (:func:`dpdl.algorithms.dyn_d2p.node_sample_rates`)."""
    if training.sample_rate is not None:
        return np.full(n, float(training.sample_rate)), float(training.sample_rate)
    rates = node_sample_rates(counts, training.batch_size, training.sampling)
    return rates, training.batch_size / min(counts)


def build_schedule(
    privacy: PrivacySection,
    spec: AlgorithmSpec,
    epsilon: float | None,
    steps: int,
    sample_rate: float,
    on_iteration: ProgressCallback | None = None,
    trust_factor: float = 1.0,
) -> PrivacySchedule:
    """The calibrated privacy schedule of one run (MATH.md §2); ``on_iteration`` is told of
    the calibration's progress (``dpdl.accounting.calibration``).  ``trust_factor``: how much
    more noise the step's own release hides a record under than σ_k alone, against the trust
    model calibrated for (Sec-LDP's 1/√q, :func:`trust_noise_factor`; 1 for local DP): the
    ledger records z_k · it for that release, the engine adds σ_k."""
    calibrate = spec.calibrate or privacy.calibrate
    algorithm = spec.algorithm
    return make_schedule(
        algorithm.schedule,
        epsilon=epsilon if algorithm.private else None,
        delta=privacy.delta,
        steps=steps,
        sample_rate=sample_rate,
        options=ShapeOptions(clip=privacy.clip, clip0=privacy.clip0, rho_c=privacy.rho_c,
                             rho_mu=privacy.rho_mu),
        calibrate=calibrate,
        blocks=privacy.calibration_blocks if get_accountant(calibrate).calibration_blocks else None,
        on_iteration=on_iteration,
        neighboring=privacy.neighboring,
        releases=_with_trust(algorithm.schedule_releases(spec.algorithm_settings),
                             trust_factor),
    )


def _with_trust(releases: dict[str, float] | None, trust_factor: float
                ) -> dict[str, float] | None:  # fmt: skip
    """The releases with the first (the step's own, σ_k) scaled by the trust model's factor."""
    if trust_factor == 1.0:
        return releases
    named = dict(releases or {"update": 1.0})
    first = next(iter(named))
    named[first] *= trust_factor
    return named


def trust_noise_factor(privacy: PrivacySection, topology, mixing_rounds: int) -> float:
    """The first release's accounting factor of the trust model ``privacy`` names: 1 against
    curious neighbours (only σ_k protects), 1/√q against Sec-LDP's eavesdropper over the
    graphs of the run's ``mixing_rounds`` rounds (MATH.md §9.4)."""
    if privacy.trust_model != "sec-ldp":
        return 1.0
    from dpdl.accounting.correlated import sec_ldp_noise_factor

    return sec_ldp_noise_factor(topology.mixing_matrix, rounds=max(1, mixing_rounds),
                                factor=float(privacy.correlation_factor))  # fmt: skip


def approve_schedule(
    privacy: PrivacySection,
    schedule: PrivacySchedule,
    node_sample_rates: Sequence[float] | None = None,
) -> PrivacyLedger:
    """A ledger that has approved the whole schedule (else ``PrivacyBudgetExceeded``): the one
    gate, ``PrivacyLedger.for_schedule``, holds it to the accountant (and blocks) it was
    calibrated with, at the schedule's rate, and knows every node's own rate
    (``node_sample_rates``, for the per-node epsilons); ``privacy`` is kept for the callers'
    signature."""
    return PrivacyLedger.for_schedule(schedule, node_sample_rates=node_sample_rates)


def epsilon_spent(privacy: PrivacySection, ledger: PrivacyLedger | None, final: bool):
    """(CLT epsilon, certified epsilon, certified method) of the steps the ledger recorded:
    every epsilon a run reports is the ledger's, of what was actually sent.  At evaluation
    points the certified bound is the cheap blocked one, for the final report ``final_mode``."""
    if ledger is None:
        return math.inf, math.inf, "none"
    if ledger.steps_taken == 0:
        return 0.0, 0.0, "no-steps"
    clt = ledger.spent_report("clt").epsilon
    options = _certified_options(privacy, ledger.recorded_multipliers, final)
    report = ledger.spent_report(privacy.certified_accountant, **options)
    return float(clt), float(report.epsilon), report.method


def epsilon_per_node(privacy: PrivacySection, ledger: PrivacyLedger | None):
    """(each node's certified epsilon, how it was computed) of the steps the ledger recorded,
    at the node's own sampling rate with the final report's accountant and options: the
    worst node's is the run's epsilon (``epsilon_spent(..., final=True)``).  Computed once per
    distinct rate, at most ``MAX_NODE_RATES`` of them (more are rounded up, a larger ε: the
    method says so).  (None, None) without a ledger (a non-private run)."""
    if ledger is None or ledger.node_sample_rates is None:
        return None, None
    options = _certified_options(privacy, ledger.recorded_multipliers, final=True)
    reports = ledger.node_spent_reports(privacy.certified_accountant, **options)
    method = max(reports, key=lambda report: report.epsilon).method
    rates = ledger.node_sample_rates
    rounded = int(np.count_nonzero(accounted_node_rates(rates) != rates))
    if rounded:
        method += (f"; {rounded} nodes' rates rounded up to one of {MAX_NODE_RATES} composed "
                   "(an upper bound of theirs)")  # fmt: skip
    return [float(report.epsilon) for report in reports], method


def _certified_options(privacy: PrivacySection, multipliers, final: bool) -> dict[str, Any]:
    """How the certified epsilon spent is composed (the accountant's ``report_options``): for
    PLD at evaluation points the cheap blocked bound, in the final report ``final_mode``; RDP
    as ``accountant_options`` says."""
    return ACCOUNTANTS[privacy.certified_accountant].report_options(
        multipliers, final=final, final_mode=privacy.final_mode,
        final_blocks=privacy.final_blocks, eval_blocks=privacy.eval_blocks)  # fmt: skip


@dataclass(frozen=True)
class RunPlan:
    """The steps of one run, under its approved schedule: ``step_arguments(k)`` is what the
    engine's step ``k`` is given, ``noise_multiplier(k)`` what the ledger records before it.

    With ``local_steps`` H > 1 the nodes gossip only after every H-th step, and after the
    last step K - 1 whatever H (the run ends on a mixed model); round r = k // H uses the
    graph P^r, so the rounds walk through the topology's graphs in order as H = 1 does (with
    P^k, k mod H = H - 1, a period that divides H would gossip on one graph forever).  Every
    step, local or not, is a subsampled Gaussian step the ledger records: K mechanisms."""

    schedule: PrivacySchedule
    step_sizes: np.ndarray  # γ_k
    noise_multipliers: np.ndarray  # z_k = σ_k / C_k, computed once (a schedule recomputes it)
    private: bool
    local_steps: int = 1

    @classmethod
    def of(cls, schedule: PrivacySchedule, training: TrainingSection) -> RunPlan:
        k = np.arange(schedule.steps)
        step_sizes = training.lr * training.lr_decay ** (-k / schedule.steps)
        return cls(schedule, step_sizes, schedule.noise_multipliers, schedule.private,
                   training.local_steps)  # fmt: skip

    @property
    def steps(self) -> int:
        return self.schedule.steps

    def noise_multiplier(self, k: int) -> float | tuple[float, ...]:
        """z_k, or z_k times each release's factor when the step releases several messages."""
        z = float(self.noise_multipliers[k])
        factors = self.schedule.release_factors
        return z if factors == (1.0,) else tuple(z * f for f in factors)

    def mixes(self, k: int) -> bool:
        """Whether step k ends with a gossip round (every H-th step, and the last)."""
        return (k + 1) % self.local_steps == 0 or k == self.steps - 1

    def step_arguments(self, k: int) -> StepArguments:
        """What the engine's step k is given: C_k and σ_k (private runs), γ_k, and whether it
        ends with a gossip round on the graph of round k // H."""
        gossip = {"mix": self.mixes(k), "mixing_round": k // self.local_steps}
        lr = float(self.step_sizes[k])
        if not self.private:
            return StepArguments(private=False, lr=lr, **gossip)
        return StepArguments(private=True, clip=float(self.schedule.clip[k]),
                             sigma=float(self.schedule.sigma[k]), lr=lr, **gossip)  # fmt: skip
