"""The report's tables, as header and rows of text, and the sentences that sum them up.

* accuracy: final test accuracy of the average model, mean ± sample std over seeds
  (ddof = 1: ``results.sample_std``), one row per (setting, ε), one column per algorithm
  label (``dyn-d2p@clt``: calibrated with the paper's CLT, MATH.md §2), and the relative gain of
  Dyn-D2P over Const-D2P per calibration;
* privacy: for every run the ε of the CLT approximation beside the certified ε, and the
  neighbouring relation both are stated for (results.json's ``neighboring``; add/remove for
  a run recorded before dpdl named it);
* calibration: for the runs of each algorithm and target ε, the certified ε they really
  spend against their target -- how much the paper's accounting understated privacy loss.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from dpdl.accounting.certified import approximate_accountant
from dpdl.experiments.report.collect import CellRun
from dpdl.experiments.report.grouping import (
    algorithm_rank,
    algorithms_of,
    epsilon_text,
    epsilons_of,
    gain_pairs,
    mean_final_accuracy,
    natural_key,
    pair_name,
    private_algorithms_of,
    relative_gain,
    select,
    setting_label,
    settings_of,
)

PRIVACY_HEADER = [
    "cell",
    "algorithm",
    "seed",
    "ε target",
    "ε CLT (approx.)",
    "ε certified",
    "certified / CLT",
    "neighbouring relation",
    "noise",
]
CALIBRATION_HEADER = [
    "algorithm",
    "calibrated with",
    "ε target",
    "ε CLT (mean)",
    "ε certified spent (mean, max)",
    "max certified / target",
]


@dataclass
class Tables:
    accuracy_header: list[str]
    accuracy_rows: list[list[str]]
    privacy_header: list[str]
    privacy_rows: list[list[str]]
    understatement: list[float]  # certified / CLT ε of every private run
    calibration_header: list[str] = field(default_factory=list)
    calibration_rows: list[list[str]] = field(default_factory=list)
    # certified ε spent / target ε of every run calibrated with the CLT
    clt_overspend: list[float] = field(default_factory=list)
    clt_overspend_by_epsilon: dict[float, list[float]] = field(default_factory=dict)
    # (setting label, label A, label B, ε): the relative gain of A over B
    gains: dict[tuple[str, str, str, float], float] = field(default_factory=dict)


def build_tables(runs: list[CellRun], declared: list[tuple[str, str]] | None = None) -> Tables:
    """``declared``: the sweep's comparison pairs (None: the registry's, ``gain_pairs``)."""
    accuracy_header, accuracy_rows, gains = _accuracy_table(runs, declared)
    privacy_rows, understatement, overspend, overspend_by_eps = _privacy_table(runs)
    return Tables(
        accuracy_header,
        accuracy_rows,
        PRIVACY_HEADER,
        privacy_rows,
        understatement,
        CALIBRATION_HEADER,
        _calibration_rows(runs),
        overspend,
        overspend_by_eps,
        gains,
    )


def _accuracy_table(runs: list[CellRun], declared: list[tuple[str, str]] | None,
                    ) -> tuple[list[str], list[list[str]], dict]:  # fmt: skip
    """Header, rows and {(setting label, A, B, ε): gain of A over B} for every compared pair
    (declared, else a family over its baseline: Dyn-D2P over Const-D2P)."""
    algorithms = algorithms_of(runs)
    pairs = gain_pairs(algorithms, declared)
    header = ["setting", "ε", *algorithms] + [f"gain {pair_name(a, b)}" for _, a, b in pairs]
    rows, gains = [], {}
    for setting in settings_of(runs):
        for eps in epsilons_of(runs) or [math.nan]:
            filters = {"setting": setting, "epsilon": None if math.isnan(eps) else eps}
            row = [setting_label(setting), epsilon_text(eps)]
            for algorithm in algorithms:
                stats = mean_final_accuracy(runs, algorithm=algorithm, **filters)
                row.append(_accuracy_text(*stats))
            for _, a, b in pairs:
                gain = relative_gain(
                    mean_final_accuracy(runs, algorithm=a, **filters)[0],
                    mean_final_accuracy(runs, algorithm=b, **filters)[0],
                )
                gains[(setting_label(setting), a, b, eps)] = gain
                row.append("—" if math.isnan(gain) else f"{100 * gain:+.1f} %")
            rows.append(row)
    return header, rows, gains


def _accuracy_text(mean: float, std: float, n: int) -> str:
    """In %: "mean ± std (n=…)"; no "±" for a single run, whose spread is not measured."""
    if n == 0:
        return "—"
    spread = f" ± {100 * std:.2f}" if math.isfinite(std) else ""
    return f"{100 * mean:.2f}{spread} (n={n})"


def _privacy_table(runs: list[CellRun]) -> tuple[list[list[str]], list, list, dict]:
    """Rows, every finite certified / CLT ratio, the certified / target ε of every
    CLT-calibrated run, and the same by target ε."""
    rows, understatement, overspend, overspend_by_eps = [], [], [], defaultdict(list)
    private = sorted(
        (r for r in runs if r.private),
        key=lambda r: (r.cell, algorithm_rank(r.algorithm), r.epsilon_target, natural_key(r.seed)),
    )
    for r in private:
        ratio = r.epsilon_certified / r.epsilon_clt if r.epsilon_clt > 0 else math.nan
        spent = r.epsilon_certified / r.epsilon_target if r.epsilon_target > 0 else math.nan
        if math.isfinite(ratio):
            understatement.append(ratio)
        if approximate_accountant(r.calibrated_with) and math.isfinite(spent):
            overspend.append(spent)
            overspend_by_eps[r.epsilon_target].append(spent)
        rows.append(
            [
                r.cell,
                r.algorithm,
                str(r.seed),
                epsilon_text(r.epsilon_target),
                f"{r.epsilon_clt:.4g}",
                f"{r.epsilon_certified:.4g}",
                f"{ratio:.2f}×" if math.isfinite(ratio) else "—",
                r.neighboring,
                noise_text(r.noise_entropy),
            ]
        )
    return rows, understatement, overspend, dict(overspend_by_eps)


def _calibration_rows(runs: list[CellRun]) -> list[list[str]]:
    rows = []
    for algorithm in private_algorithms_of(runs):
        for eps in epsilons_of(runs):
            chosen = select(runs, algorithm=algorithm, epsilon=eps)
            if not chosen:
                continue
            clt = float(np.nanmean([r.epsilon_clt for r in chosen]))
            cert = np.asarray([r.epsilon_certified for r in chosen], dtype=float)
            calibrated = sorted({f"{r.calibrated_with or '?'} ({r.neighboring})"
                                 for r in chosen})  # fmt: skip
            rows.append(
                [
                    algorithm,
                    "/".join(calibrated),
                    f"{eps:g}",
                    f"{clt:.4g}",
                    f"{np.nanmean(cert):.4g} (max {np.nanmax(cert):.4g})",
                    f"{np.nanmax(cert) / eps:.2f}×",
                ]
            )
    return rows


def noise_text(entropy: str | None) -> str:
    return {"os": "secret (OS entropy)", "seed": "reproducible (entropy = seed)"}.get(
        entropy, "not recorded"
    )


def understatement_sentence(tables: Tables) -> str:
    ratios = tables.understatement
    if not ratios:
        return "No private run reported both a CLT and a certified ε."
    worst, median = max(ratios), float(np.median(ratios))
    return (
        f"Across all private runs, the CLT approximation (the papers' accounting) understated ε "
        f"by a factor of up to {worst:.2f} (median {median:.2f}) relative to the certified "
        "accountant."
    )


def overspend_sentence(tables: Tables) -> str:
    if not tables.clt_overspend:
        return "No run was calibrated with the CLT."
    per_eps = "; ".join(
        f"ε = {eps:g}: up to {max(v):.2f}× (certified {eps * max(v):.3g})"
        for eps, v in sorted(tables.clt_overspend_by_epsilon.items())
    )
    return (
        "Runs calibrated with the paper's CLT really spend, by the certified accountant, up to "
        f"{max(tables.clt_overspend):.2f}× their target ε (median "
        f"{float(np.median(tables.clt_overspend)):.2f}×): {per_eps}."
    )
