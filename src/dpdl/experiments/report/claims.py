"""The claims of MATH.md §4, checked against the mean final accuracies of a sweep.

Each check returns (claim, verdict) pairs, and none when the sweep has nothing to compare
(a missing rival algorithm, a single ε, a single topology). Who is compared with whom comes
from the sweep's own declared pairs (its ``[report]`` table: dpdl.experiments.comparisons),
else from the schedule families' registry (``ScheduleFamily.rivals`` and ``baseline``:
Dyn-D2P against Dyn[C], Dyn[μ] and Const, its gain over Const).
"""

from __future__ import annotations

import math

import numpy as np

from dpdl.accounting.schedules import ALGORITHMS
from dpdl.experiments.intervals import t_interval
from dpdl.experiments.report.collect import CellRun
from dpdl.experiments.report.grouping import (
    algorithms_of,
    calibration_rank,
    display_label,
    epsilons_of,
    gain_pairs,
    mean_final_accuracy,
    natural_key,
    pair_name,
    private_algorithms_of,
    relative_gain,
    select,
    settings_of,
)

# (grid key, the order the paper claims, or None: by value; the claim)
ORDERED_CLAIMS = (
    ("topology.name", ["ring", "exp", "complete"], "accuracy ring < exponential < complete"),
    ("topology.nodes", None, "more nodes → better accuracy"),
)


def check_claims(runs: list[CellRun], declared: list[tuple[str, str]] | None = None,
                 ) -> list[tuple[str, str]]:  # fmt: skip
    """The claims of MATH.md §4 against the measured means: [(claim, verdict)].

    ``declared``: the sweep's own comparison pairs ([report] pairs): for each (A, B) that
    ran, "A > B at equal ε" and whether the A-vs-B gap grows as ε falls. None: the
    registry's (each family against its rivals, the gap over its baseline)."""
    claims = []
    if declared is not None:
        for _, a, b in gain_pairs(algorithms_of(runs), declared):
            claims += _beats(runs, a, b, f"{display_label(a)} > {display_label(b)} at equal ε")
            claims += _gap_grows(runs, a, b, f"the {pair_name(a, b)} gap grows as ε falls")
    else:
        claims += _registry_claims(runs)
    for key, order, claim in ORDERED_CLAIMS:
        claims += _accuracy_increases_along(runs, key, order, claim)
    return claims


def _registry_claims(runs: list[CellRun]) -> list[tuple[str, str]]:
    """Each family with rivals against them, and its gap over its baseline, per calibration."""
    claims = []
    calibrations = sorted({r.calibration for r in runs if r.private}, key=calibration_rank)
    contenders = sorted((f for f in ALGORITHMS.values() if f.rivals or f.baseline),
                        key=lambda f: f.order)  # fmt: skip
    for calibration in calibrations:
        for family in contenders:
            dyn = _label(family.name, calibration)
            if dyn not in algorithms_of(runs):
                continue
            for rival in family.rivals:
                claims += _beats(runs, dyn, _label(rival, calibration),
                                 f"{family.display} > {rival} at equal ε"
                                 f"{_calibration_name(calibration)}")  # fmt: skip
            if family.baseline:
                baseline = ALGORITHMS[family.baseline]
                claims += _gap_grows(runs, dyn, _label(baseline.name, calibration),
                                     f"the {family.short}-vs-{baseline.short} gap grows as ε "
                                     f"falls{_calibration_name(calibration)}")  # fmt: skip
    return claims


def _label(algorithm: str, calibration: str) -> str:
    return f"{algorithm}@{calibration}" if calibration else algorithm


def _calibration_name(calibration: str) -> str:
    return f" ({calibration} calibration)" if calibration else ""


def _beats(runs: list[CellRun], a: str, b: str, claim: str) -> list[tuple[str, str]]:
    """``a`` (Dyn-D2P) against ``b`` in every (setting, ε), paired by seed: held where the
    95 % interval of the per-seed gains lies above 0 everywhere, did not hold where it lies
    below 0 somewhere; an interval that contains 0 (or one seed) settles nothing."""
    if b not in algorithms_of(runs):
        return []
    above = below = unsettled = 0
    for setting in settings_of(runs):
        for eps in epsilons_of(runs):
            gains = _paired_gains(runs, setting, eps, a, b)
            if not gains:
                continue
            _, low, high = t_interval(gains)
            above += bool(low > 0)
            below += bool(high < 0)
            unsettled += not (low > 0 or high < 0)
    total = above + below + unsettled
    if not total:
        return []
    verdict = ("held" if above == total else "did not hold" if below
               else "inconclusive")  # fmt: skip
    return [(
        claim,
        f"{verdict}: paired by seed, the 95 % interval of the gain is above 0 in {above}, "
        f"below 0 in {below} and contains 0 (or has one seed) in {unsettled} of {total} "
        "(setting, ε)",
    )]  # fmt: skip


def _paired_gains(runs, setting, eps, a: str, b: str) -> list[float]:
    """Per seed run by both: final accuracy of ``a`` minus that of ``b``."""
    of_a = {r.seed: r.final_accuracy for r in select(runs, setting=setting, algorithm=a,
                                                        epsilon=eps)}  # fmt: skip
    of_b = {r.seed: r.final_accuracy for r in select(runs, setting=setting, algorithm=b,
                                                        epsilon=eps)}  # fmt: skip
    return [of_a[seed] - of_b[seed] for seed in sorted(set(of_a) & set(of_b))]


def _gains_by_epsilon(runs, setting, a: str, b: str) -> list[tuple[float, float]]:
    """(ε, relative gain of ``a`` over ``b``: Dyn vs Const) of one setting, at every ε where
    both have runs."""
    points = []
    for eps in epsilons_of(runs):
        gain = relative_gain(
            mean_final_accuracy(runs, setting=setting, algorithm=a, epsilon=eps)[0],
            mean_final_accuracy(runs, setting=setting, algorithm=b, epsilon=eps)[0],
        )
        if math.isfinite(gain):
            points.append((eps, gain))
    return points


def _gap_grows(runs: list[CellRun], a: str, b: str, claim: str) -> list[tuple[str, str]]:
    """The gain of ``a`` over ``b`` (Dyn-D2P over Const-D2P) does not shrink as ε falls, in
    every setting."""
    if b not in algorithms_of(runs) or len(epsilons_of(runs)) < 2:
        return []
    verdicts, text = [], ""
    for setting in settings_of(runs):
        points = _gains_by_epsilon(runs, setting, a, b)
        if len(points) > 1:
            # ε ascends along points: the gain at a smaller ε must be at least the next one's
            pairs = zip(points, points[1:], strict=False)
            verdicts.append(all(lo >= hi for (_, lo), (_, hi) in pairs))
            text = ", ".join(f"ε={e:g}: {100 * g:+.1f} %" for e, g in points)
    if not verdicts:
        return []
    held = sum(verdicts)
    return [
        (
            claim,
            ("held" if held == len(verdicts) else "did not hold")
            + f" in {held} of {len(verdicts)} settings"
            # the gains themselves when there is one setting to show them for
            + (f" ({text})" if len(verdicts) == 1 else ""),
        )
    ]


def _accuracy_increases_along(runs, key: str, order, claim: str) -> list[tuple[str, str]]:
    """Mean accuracy strictly increases along the values of grid key ``key`` (in ``order``, or
    by value), for every private algorithm and ε."""
    values = sorted({str(r.overrides[key]) for r in runs if key in r.overrides}, key=natural_key)
    if order is not None:
        values = [v for v in order if v in values]
    if len(values) < 2:
        return []
    held, total = 0, 0
    for algorithm in private_algorithms_of(runs):
        for eps in epsilons_of(runs) or [None]:
            chosen = select(runs, algorithm=algorithm, epsilon=eps)
            means = [
                np.mean([r.final_accuracy for r in chosen if str(r.overrides.get(key)) == v]
                        or [np.nan])
                for v in values
            ]  # fmt: skip
            if all(math.isfinite(m) for m in means):
                total += 1
                held += all(a < b for a, b in zip(means, means[1:], strict=False))
    if not total:
        return []
    verdict = "held" if held == total else "did not hold" if held == 0 else "mixed"
    return [(claim, f"{verdict}: strictly increasing in {held} of {total} (algorithm, ε)")]
