"""Ordering, selecting and averaging runs: what the tables, claims and figures share.

Runs that differ only by seed are repeats; the remaining grid keys (other than seed,
algorithms and epsilon) form the *setting* of a run (``CellRun.setting``).
"""

from __future__ import annotations

import math

import numpy as np

from dpdl.accounting.certified import ACCOUNTANTS
from dpdl.accounting.schedules import ALGORITHMS, algorithm_private
from dpdl.experiments.report.collect import CellRun
from dpdl.training.results import sample_std
from dpdl.training.settings import display_label  # noqa: F401  (the report imports it here)

# Names not registered in this process (read from a sweep's results) come after the others.
UNKNOWN_RANK = 99


def natural_key(value: str):
    """Numbers before words, numbers by value: "2" < "10" < "ring"."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def calibration_rank(calibration: str) -> int:
    """No calibration first, then the accountants in their registration order."""
    order = ("", *ACCOUNTANTS)
    return order.index(calibration) if calibration in order else UNKNOWN_RANK


def algorithm_rank(label: str) -> tuple[int, int, str]:
    """The schedule family's report order (``ScheduleFamily.order``), then the calibration."""
    name, _, calibration = label.partition("@")
    family = ALGORITHMS.get(name)
    return (
        UNKNOWN_RANK if family is None else family.order,
        calibration_rank(calibration),
        label,
    )


def _private_label(label: str) -> bool:
    return algorithm_private(label.partition("@")[0])


def algorithms_of(runs: list[CellRun]) -> list[str]:
    """Algorithm labels grouped by calibration (the non-private first), then in the report's
    order of the schedule families."""
    labels = {r.algorithm for r in runs}
    return sorted(
        labels,
        key=lambda a: (_private_label(a), algorithm_rank(a)[1], algorithm_rank(a)),
    )


def private_algorithms_of(runs: list[CellRun]) -> list[str]:
    return [a for a in algorithms_of(runs) if _private_label(a)]


def contender(label: str) -> bool:
    """Whether a label's family is one the report compares with rivals (Dyn-D2P)."""
    family = ALGORITHMS.get(label.partition("@")[0])
    return family is not None and bool(family.rivals)


def short_name(label: str) -> str:
    """The short name of a label's family ("Dyn" for "dyn-d2p@pld"), else its name."""
    family = ALGORITHMS.get(label.partition("@")[0])
    return family.short if family is not None and family.short else label.partition("@")[0]


def settings_of(runs: list[CellRun]) -> list[tuple]:
    return sorted({r.setting for r in runs}, key=lambda s: [(k, natural_key(v)) for k, v in s])


def epsilons_of(runs: list[CellRun]) -> list[float]:
    return sorted({r.epsilon_target for r in runs if not math.isnan(r.epsilon_target)})


def setting_label(setting: tuple) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in setting) or "base"


# how a grid key's last part reads in a figure (others: the key's last part as it is)
KEY_NAMES = {"rho_c": r"$\rho_c$", "rho_mu": r"$\rho_\mu$", "nodes": "nodes", "lr": "step size",
             "batch_size": "batch size", "local_steps": "local steps"}  # fmt: skip


def key_display(key: str) -> str:
    """A grid key as an axis names it: "topology.name" -> "topology", "privacy.rho_c" -> "ρ_c"."""
    section, _, leaf = key.rpartition(".")
    if leaf == "name" and section:
        return section.rsplit(".", 1)[-1]
    return KEY_NAMES.get(leaf, leaf)


def setting_display(setting: tuple) -> str:
    """A setting as a reader says it: "topology.name=complete" -> "complete topology",
    "topology.nodes=16" -> "16 nodes", "privacy.rho_c=2" -> "ρ_c = 2"."""
    parts = []
    for key, value in setting:
        section, _, leaf = key.rpartition(".")
        if leaf == "name" and section:
            parts.append(f"{value} {section.rsplit('.', 1)[-1]}")
        elif leaf == "nodes":
            parts.append(f"{value} nodes")
        else:
            parts.append(f"{KEY_NAMES.get(leaf, leaf)} = {value}")
    return ", ".join(parts) or "base"


def epsilon_text(eps: float) -> str:
    return "—" if math.isnan(eps) else f"{eps:g}"


def select(runs, *, setting=None, algorithm=None, epsilon=None) -> list[CellRun]:
    """Runs matching the filters; a non-private run matches every ε (it has none)."""
    return [
        r
        for r in runs
        if (setting is None or r.setting == setting)
        and (algorithm is None or r.algorithm == algorithm)
        and (
            epsilon is None
            or not r.private
            or (not math.isnan(r.epsilon_target) and math.isclose(r.epsilon_target, epsilon))
        )
    ]


def mean_final_accuracy(runs, **filters) -> tuple[float, float, int]:
    """Mean and sample std (NaN for one run: ``sample_std``) of the final accuracy of the runs
    matching ``filters`` (see select), and how many there are."""
    chosen = select(runs, **filters)
    if not chosen:
        return math.nan, math.nan, 0
    finals = [r.final_accuracy for r in chosen]
    return float(np.mean(finals)), sample_std(finals), len(chosen)


def gain_pairs(algorithms: list[str], declared: list[tuple[str, str]] | None = None,
               ) -> list[tuple[str, str, str]]:  # fmt: skip
    """(calibration, label A, label B) for every pair the report compares that both ran.

    ``declared``: the sweep's own pairs (its ``[report]`` table), in their order, the
    calibration being the suffix both share ("" if they differ). Else from the registry:
    every calibration and every family with a ``baseline`` (Dyn-D2P: Const-D2P)."""
    if declared is not None:
        return [(shared_calibration(a, b), a, b) for a, b in declared
                if a in algorithms and b in algorithms]  # fmt: skip
    pairs = []
    families = sorted((f for f in ALGORITHMS.values() if f.baseline), key=lambda f: f.order)
    for calibration in sorted({a.partition("@")[2] for a in algorithms}, key=calibration_rank):
        suffix = f"@{calibration}" if calibration else ""
        for family in families:
            dyn, const = f"{family.name}{suffix}", f"{family.baseline}{suffix}"
            if dyn in algorithms and const in algorithms:
                pairs.append((calibration, dyn, const))
    return pairs


def shared_calibration(a: str, b: str) -> str:
    """The @suffix two labels share, "" when they differ (or neither has one)."""
    calibration = a.partition("@")[2]
    return calibration if calibration == b.partition("@")[2] else ""


def pair_name(a: str, b: str) -> str:
    """How a column or claim names a pair: the short names when both share a calibration
    ("Dyn vs Const (pld)"), else the whole labels ("dyn-d2p@pld vs dyn-d2p@clt")."""
    if a.partition("@")[2] != b.partition("@")[2]:
        return f"{a} vs {b}"
    calibration = shared_calibration(a, b)
    return f"{short_name(a)} vs {short_name(b)}{f' ({calibration})' if calibration else ''}"


def relative_gain(dyn: float, const: float) -> float:
    """Dyn-D2P's accuracy relative to Const-D2P's, minus one (MATH.md §4: +39 % at ε = 0.3)."""
    return dyn / const - 1 if const > 0 else math.nan
