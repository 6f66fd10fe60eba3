"""A privacy ledger for training: what every step spent, and a budget that fails closed.

Each step is a Poisson(p)-subsampled Gaussian mechanism with noise multiplier z = σ/C (MATH.md §2),
stored run-length encoded ([z, count] pairs); an algorithm whose step releases several messages
with fresh noise (``releases``: gradient tracking's model and tracker) records one such
mechanism per release, each on its own Poisson sample, z = σ_r / Δ_r with that release's own
sensitivity Δ_r: in dp_accounting's event algebra (:meth:`PrivacyLedger.dp_event`) a step is
the composition of its releases' ``PoissonSampledDpEvent(p, GaussianDpEvent(z))``.
Training calls :meth:`PrivacyLedger.plan` once
with the whole schedule (one certified ε computation, refused if over budget) and then
:meth:`PrivacyLedger.record_step` per step, which only compares z with the approved plan: a
step beyond the plan or with less noise than planned raises ``PrivacyBudgetExceeded``. Without
a plan every step is accounted in full before it is accepted (correct but slow).

The JSON form carries a schema version, the budget and every recorded step; loading restores
the steps already spent (a ledger can never be reset by a save/load round trip), and anything
malformed is refused.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from dpdl.accounting import validators as check
from dpdl.accounting.certified import (
    ACCOUNTANTS,
    EpsilonReport,
    check_accountant,
    epsilon_report,
)
from dpdl.accounting.validators import ADD_REMOVE
from dpdl.errors import DPDLError, PrivacyBudgetExceeded, require

__all__ = [
    "LEDGER_SCHEMA_VERSION", "MAX_NODE_RATES", "ONE_RELEASE", "PrivacyLedger",
    "accounted_node_rates", "run_length_encode", "run_length_decode",
]  # fmt: skip

LEDGER_SCHEMA_VERSION = 1
# A recorded multiplier may fall short of the planned one by float rounding only.
MULTIPLIER_RTOL = 1e-9
# At most this many distinct node rates are composed for the per-node epsilons; more are
# rounded up to this many (:func:`accounted_node_rates`), so the cost stays bounded.
MAX_NODE_RATES = 8
# What a step of the Dyn-D2P family releases: one noisy message.
ONE_RELEASE = ("update",)


def run_length_encode(values: ArrayLike) -> list[list[float | int]]:
    """[[value, count], ...] of consecutive equal values (exact float equality)."""
    array = np.asarray(values, dtype=np.float64).ravel()
    if array.size == 0:
        return []
    starts = np.flatnonzero(np.concatenate(([True], array[1:] != array[:-1])))
    counts = np.diff(np.append(starts, array.size))
    return [[float(array[s]), int(c)] for s, c in zip(starts, counts, strict=True)]


def run_length_decode(runs: list[list[float | int]]) -> np.ndarray:
    """The inverse of :func:`run_length_encode`."""
    if not runs:
        return np.zeros(0)
    values = np.array([float(v) for v, _ in runs])
    counts = np.array([int(c) for _, c in runs])
    return np.repeat(values, counts)


def _check_multipliers(values: ArrayLike, what: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 0:
        array = array.reshape(1)
    # Per-step multipliers only: flattening a (multiplier, count) table would miscount steps.
    require(array.ndim == 1, f"{what} must be 1-D (one per step), got shape {array.shape}")
    require(array.size > 0, f"{what} must not be empty")
    require(
        bool(np.all(np.isfinite(array))) and bool(np.all(array >= 0)),
        f"{what} must be finite and >= 0 (got min {np.min(array)!r})",
    )
    return array


def _check_node_rates(rates: ArrayLike | None, sample_rate: float) -> np.ndarray | None:
    """The nodes' own sampling rates q_i (one per node), none above the accounted rate p."""
    if rates is None:
        return None
    array = np.asarray(rates, dtype=np.float64)
    require(
        array.ndim == 1 and array.size > 0,
        f"node_sample_rates must be a non-empty 1-D list, got shape {array.shape}",
    )
    for q in array:
        check.sample_rate(float(q))
    worst = int(np.argmax(array))
    require(
        array[worst] <= sample_rate,
        f"node {worst} samples at q = {float(array[worst])!r} above the accounted rate p = "
        f"{sample_rate!r}: its steps would not be accounted",
    )
    return array


def accounted_node_rates(rates: ArrayLike, max_rates: int = MAX_NODE_RATES) -> np.ndarray:
    """The rate each node's epsilon is composed at: its own, or with more than ``max_rates``
    distinct rates, the largest of its group (the distinct rates cut into ``max_rates``
    contiguous groups; the largest rate is always its own group's).

    Rounding up is safe: a Poisson-subsampled Gaussian step's hockey-stick divergence is
    convex in the rate q (a supremum of functions affine in q) and 0 at q = 0, hence never
    smaller at a larger q, and composition preserves that order.
    """
    rates = np.asarray(rates, dtype=np.float64)
    require(isinstance(max_rates, int) and max_rates >= 1,
            f"max_rates must be a positive integer, got {max_rates!r}")  # fmt: skip
    distinct = np.unique(rates)
    if distinct.size <= max_rates:
        return rates
    tops = np.array([group[-1] for group in np.array_split(distinct, max_rates)])
    return tops[np.searchsorted(tops, rates, side="left")]


# Relative slack of the budget check for float round-off of a calibration that hits its target.
ROUNDOFF_TOLERANCE = 1e-12


class PrivacyLedger:
    """Records the mechanism of every step and refuses steps that would exceed the budget.

    ``accountant`` ("pld" by default, certified; "rdp"; or "clt", the paper's approximation)
    decides both the budget checks and the default of :meth:`epsilon_spent`. ``blocks`` makes
    the certified accountants use the blocked upper bound with that many blocks; without it
    they compose exactly, or blocked when the steps have very many distinct multipliers
    (``certified.accountant_options``).

    ``node_sample_rates`` (optional, one per node): the rate q_i ≤ p at which node i samples
    (per-node sampling). The budget is held at p, the largest rate, which bounds every node;
    :meth:`node_spent_reports` gives each node's own ε.

    ``neighboring``: the relation every ε of the ledger is stated for ("add-remove", the
    default here as in dp_accounting, or "replace-one"; MATH.md Conventions). A ledger saved
    without it (before it existed) was add/remove and reads back as such.

    ``releases``: the names of the noisy messages every step releases (default one,
    :data:`ONE_RELEASE`); a step then records one multiplier per release, in this order, and
    every multiplier sequence (plans, :attr:`recorded_multipliers`) lists the mechanisms step
    by step, release by release.
    """

    def __init__(
        self,
        sample_rate: float,
        delta: float,
        epsilon_budget: float,
        accountant: str = "pld",
        *,
        blocks: int | None = None,
        node_sample_rates: ArrayLike | None = None,
        neighboring: str = ADD_REMOVE,
        releases: tuple[str, ...] = ONE_RELEASE,
    ):
        self.sample_rate = check.sample_rate(sample_rate)
        self.releases = _check_releases(releases)
        self.delta = check.delta(delta)
        self.epsilon_budget = check.positive("epsilon_budget", epsilon_budget)
        self.neighboring = check.neighboring(neighboring)
        self.accountant = check_accountant(accountant, self.neighboring)
        require(
            blocks is None or (isinstance(blocks, int) and blocks >= 1),
            f"blocks must be a positive integer, got {blocks!r}",
        )
        self.blocks = blocks
        self.node_sample_rates = _check_node_rates(node_sample_rates, self.sample_rate)
        self._recorded: list[float] = []  # per mechanism, step by step; encoded on save
        self._approved: np.ndarray | None = None  # the whole approved sequence from step 0
        self._approved_epsilon: float | None = None

    @classmethod
    def for_schedule(
        cls,
        schedule: Any,
        *,
        accountant: str | None = None,
        blocks: int | None = None,
        epsilon_budget: float | None = None,
        node_sample_rates: ArrayLike | None = None,
    ) -> PrivacyLedger:
        """A ledger for a ``PrivacySchedule`` with its whole schedule planned (one check).

        The one privacy gate of every run (``dpdl run``, ``dpdl.train``, ``dpdl audit``): nothing
        trains or is audited before it has approved the whole schedule.
        The budget defaults to the schedule's ε target and the accountant to the one it was
        calibrated with (a CLT-calibrated schedule is thus held to the CLT, as in the paper;
        pass ``accountant="pld"`` to hold it to a certified bound). ``node_sample_rates``: every
        node's own rate (none above the schedule's, the one accounted). The relation is the
        schedule's (``schedule.neighboring``). Raises ``PrivacyBudgetExceeded`` when the
        schedule does not fit the budget.
        """
        require(schedule.private, f"algorithm {schedule.algorithm!r} is not private: no ledger")
        # A closed-form (CLT) calibration lands on its target up to float round-off (~1e-16
        # relative); allow 1e-12 of it so an exact calibration is not refused. Anything more is.
        budget = schedule.epsilon_target if epsilon_budget is None else epsilon_budget
        budget = check.positive("epsilon_budget", budget) * (1 + ROUNDOFF_TOLERANCE)
        ledger = cls(
            schedule.sample_rate,
            schedule.delta,
            budget,
            accountant or schedule.calibrated_with,
            blocks=blocks if blocks is not None else schedule.parameters.get("blocks"),
            node_sample_rates=node_sample_rates,
            neighboring=getattr(schedule, "neighboring", ADD_REMOVE),
            releases=getattr(schedule, "releases", ONE_RELEASE),
        )
        ledger.plan(getattr(schedule, "release_multipliers", schedule.noise_multipliers))
        return ledger

    # ------------------------------------------------------------------ accounting
    def _report(
        self,
        multipliers: np.ndarray,
        accountant: str | None = None,
        sample_rate: float | None = None,
        **options: Any,
    ) -> EpsilonReport:
        """ε of ``multipliers`` at ``sample_rate`` (the ledger's p by default); ``options`` for
        ``epsilon_report`` (by default the ledger's ``blocks``)."""
        accountant = accountant or self.accountant
        rate = self.sample_rate if sample_rate is None else sample_rate
        options = (options or {"blocks": self.blocks}) | {"neighboring": self.neighboring}
        return epsilon_report(accountant, multipliers, rate, self.delta, **options)

    @property
    def steps_taken(self) -> int:
        return len(self._recorded) // len(self.releases)

    @property
    def recorded_multipliers(self) -> np.ndarray:
        return np.asarray(self._recorded, dtype=np.float64)

    @property
    def planned_steps(self) -> int | None:
        """Length of the approved plan (counted from step 0), or None without a plan."""
        return None if self._approved is None else int(self._approved.size) // len(self.releases)

    def spent_report(self, accountant: str | None = None, **options: Any) -> EpsilonReport:
        """The ``EpsilonReport`` of all steps recorded so far, at the ledger's rate p (the
        largest node's); ``options`` go to ``certified.epsilon_report`` (mode, blocks, bins;
        by default the ledger's ``blocks``)."""
        return self._spent_at(self.sample_rate, accountant, options)

    def _spent_at(self, rate: float, accountant: str | None, options: dict) -> EpsilonReport:
        if accountant is not None:
            check_accountant(accountant, self.neighboring)
        name = accountant or self.accountant
        if not self._recorded:
            return EpsilonReport(
                accountant=name,
                epsilon=0.0,
                delta=self.delta,
                certified=ACCOUNTANTS[name].certified,
                method="no-steps",
                neighboring=self.neighboring,
            )
        return self._report(self.recorded_multipliers, name, rate, **options)

    def node_spent_reports(
        self, accountant: str | None = None, *, max_rates: int = MAX_NODE_RATES, **options: Any
    ) -> list[EpsilonReport]:
        """Each node's ``EpsilonReport`` of the steps recorded, composed at its own rate q_i
        (in node order; :meth:`spent_report`'s options). One composition per distinct rate,
        at most ``max_rates`` of them (:func:`accounted_node_rates` rounds the others up). The
        node at the largest rate p has exactly :meth:`spent_report` with the same options."""
        require(
            self.node_sample_rates is not None,
            "this ledger was not given the nodes' sampling rates (node_sample_rates)",
        )
        rates = accounted_node_rates(self.node_sample_rates, max_rates)
        by_rate = {q: self._spent_at(q, accountant, options) for q in np.unique(rates)}
        return [by_rate[q] for q in rates]

    def epsilon_spent(self, accountant: str | None = None) -> float:
        """ε of all steps recorded so far under ``accountant`` (the ledger's by default)."""
        return float(self.spent_report(accountant).epsilon)

    # ------------------------------------------------------------------ budget
    def plan(self, noise_multipliers: ArrayLike) -> EpsilonReport:
        """Approve the steps that follow the ones already recorded, or raise.

        The recorded steps composed with ``noise_multipliers`` must have ε ≤ the budget under
        the ledger's accountant; then ``record_step`` only checks each step against the plan.
        """
        planned = _check_multipliers(noise_multipliers, "planned noise multipliers")
        _check_whole_steps(planned.size, self.releases, "the planned noise multipliers")
        whole = np.concatenate([self.recorded_multipliers, planned])
        report = self._report(whole)
        if not report.epsilon <= self.epsilon_budget:
            raise PrivacyBudgetExceeded(
                f"the planned schedule ({self.steps_taken} recorded + "
                f"{planned.size // len(self.releases)} planned "
                f"steps) has {report.accountant} epsilon {report.epsilon:.6g} > budget "
                f"{self.epsilon_budget:.6g} at delta {self.delta:g}"
            )
        self._approved = whole
        self._approved_epsilon = float(report.epsilon)
        return report

    def record_step(self, noise_multiplier: float | ArrayLike) -> None:
        """Record one step, or raise ``PrivacyBudgetExceeded``: its multiplier z = σ/C, or one
        per release (``releases``) when the step releases several noisy messages."""
        zs = _check_multipliers(np.atleast_1d(noise_multiplier), "noise multiplier")
        m = len(self.releases)
        require(zs.size == m, f"a step of this ledger releases {m} mechanisms "
                f"({', '.join(self.releases)}), got {zs.size} noise multipliers")  # fmt: skip
        k = self.steps_taken
        if self._approved is not None:
            if (k + 1) * m > self._approved.size:
                raise PrivacyBudgetExceeded(
                    f"step {k} lies beyond the approved plan of {self.planned_steps} steps"
                )
            planned = self._approved[k * m : (k + 1) * m]
            short = zs < planned * (1 - MULTIPLIER_RTOL)
            if np.any(short):
                r = int(np.flatnonzero(short)[0])
                raise PrivacyBudgetExceeded(
                    f"step {k} has noise multiplier {zs[r]:.9g} < the planned "
                    f"{planned[r]:.9g}" + ("" if m == 1 else f" (release {self.releases[r]!r})")
                )
        else:
            report = self._report(np.append(self.recorded_multipliers, zs))
            if not report.epsilon <= self.epsilon_budget:
                raise PrivacyBudgetExceeded(
                    f"step {k} would bring {report.accountant} epsilon to {report.epsilon:.6g}"
                    f" > budget {self.epsilon_budget:.6g}"
                )
        self._recorded.extend(float(z) for z in zs)

    def record_steps(self, noise_multipliers: ArrayLike) -> None:
        """Record several steps at once (one multiplier per step, or a (steps, releases)
        array), each checked as by :meth:`record_step`."""
        for z in np.asarray(noise_multipliers, dtype=np.float64).reshape(-1, len(self.releases)):
            self.record_step(z if z.size > 1 else float(z[0]))

    def dp_event(self) -> Any:
        """The recorded steps as one dp_accounting event: the composition, step by step, of
        each release's ``PoissonSampledDpEvent(p, GaussianDpEvent(z))`` (the ledger's rate p;
        the relation is :attr:`neighboring`, an accountant's setting in dp_accounting)."""
        import dp_accounting

        m = len(self.releases)
        zs = self.recorded_multipliers.reshape(-1, m)
        return dp_accounting.ComposedDpEvent([
            dp_accounting.ComposedDpEvent([
                dp_accounting.PoissonSampledDpEvent(self.sample_rate,
                                                    dp_accounting.GaussianDpEvent(float(z)))
                for z in step
            ]) for step in zs
        ])  # fmt: skip

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": LEDGER_SCHEMA_VERSION,
            "sample_rate": self.sample_rate,
            "delta": self.delta,
            "epsilon_budget": self.epsilon_budget,
            "accountant": self.accountant,
            "neighboring": self.neighboring,
            "blocks": self.blocks,
            "node_sample_rates": None
            if self.node_sample_rates is None
            else self.node_sample_rates.tolist(),
            "steps_taken": self.steps_taken,
            "recorded": run_length_encode(self._recorded),
            "approved_plan": None if self._approved is None else run_length_encode(self._approved),
            "approved_epsilon": self._approved_epsilon,
        } | ({} if self.releases == ONE_RELEASE else {"releases": list(self.releases)})

    def to_json(self, **json_options: Any) -> str:
        return json.dumps(self.to_dict(), **json_options)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PrivacyLedger:
        require(isinstance(data, dict), "a privacy ledger must be a JSON object")
        version = data.get("schema_version")
        require(
            version == LEDGER_SCHEMA_VERSION,
            f"unsupported ledger schema_version {version!r} (expected {LEDGER_SCHEMA_VERSION})",
        )
        missing = {"sample_rate", "delta", "epsilon_budget", "accountant", "recorded"} - set(data)
        require(not missing, f"privacy ledger lacks the keys {sorted(missing)}")
        ledger = cls(
            data["sample_rate"],
            data["delta"],
            data["epsilon_budget"],
            data["accountant"],
            blocks=data.get("blocks"),
            node_sample_rates=data.get("node_sample_rates"),
            # a ledger written before the relation was recorded was add/remove
            neighboring=data.get("neighboring", ADD_REMOVE),
            releases=tuple(data.get("releases", ONE_RELEASE)),
        )
        recorded = _decode(data["recorded"], "recorded")
        _check_whole_steps(recorded.size, ledger.releases, "the recorded multipliers")
        if "steps_taken" in data:
            require(
                data["steps_taken"] * len(ledger.releases) == recorded.size,
                f"ledger says steps_taken = {data['steps_taken']!r} but records "
                f"{recorded.size // len(ledger.releases)} steps",
            )
        if data.get("approved_plan") is not None:
            # Never trust a saved approval: re-check the plan against the budget, and every
            # recorded step against the plan (a tampered or stale file fails closed).
            approved = _decode(data["approved_plan"], "approved_plan")
            require(
                approved.size >= recorded.size,
                "the approved plan is shorter than the steps already recorded",
            )
            ledger.plan(approved)
            short = recorded < approved[: recorded.size] * (1 - MULTIPLIER_RTOL)
            if np.any(short):
                i = int(np.flatnonzero(short)[0])
                raise PrivacyBudgetExceeded(
                    f"ledger records step {i // len(ledger.releases)} with noise multiplier "
                    f"{recorded[i]:.9g} below the planned {approved[i]:.9g}"
                )
        elif recorded.size:
            spent = ledger._report(recorded)
            if not spent.epsilon <= ledger.epsilon_budget:
                raise PrivacyBudgetExceeded(
                    f"ledger records {spent.accountant} epsilon {spent.epsilon:.6g} > budget "
                    f"{ledger.epsilon_budget:.6g}"
                )
        ledger._recorded = [float(z) for z in recorded]
        return ledger

    @classmethod
    def from_json(cls, text: str) -> PrivacyLedger:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise DPDLError(f"privacy ledger is not valid JSON: {err}") from None
        return cls.from_dict(data)

    def __repr__(self) -> str:
        return (
            f"PrivacyLedger(steps_taken={self.steps_taken}, accountant={self.accountant!r}, "
            f"neighboring={self.neighboring!r}, "
            f"epsilon_budget={self.epsilon_budget}, delta={self.delta}, "
            f"sample_rate={self.sample_rate}, planned_steps={self.planned_steps})"
        )


def _check_releases(releases: Any) -> tuple[str, ...]:
    ok = (isinstance(releases, tuple | list) and len(releases) >= 1
          and all(isinstance(r, str) and r for r in releases)
          and len(set(releases)) == len(releases))  # fmt: skip
    require(ok, f"releases must be distinct non-empty names, got {releases!r}")
    return tuple(releases)


def _check_whole_steps(size: int, releases: tuple[str, ...], what: str) -> None:
    require(size % len(releases) == 0,
            f"{what} ({size}) are not a whole number of steps of {len(releases)} releases "
            f"({', '.join(releases)})")  # fmt: skip


def _decode(runs: Any, what: str) -> np.ndarray:
    require(isinstance(runs, list), f"ledger field {what!r} must be a list of [z, count] pairs")
    for run in runs:
        require(
            isinstance(run, list | tuple)
            and len(run) == 2
            and isinstance(run[1], int)
            and not isinstance(run[1], bool)
            and run[1] >= 1
            and isinstance(run[0], int | float)
            and math.isfinite(run[0])
            and run[0] >= 0,
            f"ledger field {what!r} holds a malformed run {run!r}",
        )
    return run_length_decode(runs)
