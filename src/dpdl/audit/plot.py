"""The audit's figure: score distributions with and without the canary, and the attack's ROC."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpdl.accounting.schedules import ALGORITHMS
from dpdl.audit.runner import AuditResult
from dpdl.errors import require
from dpdl.plotting import legend_outside, pyplot, save_figure, styled

__all__ = ["empirical_roc", "plot_audit"]


def empirical_roc(scores: np.ndarray, members: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) of "score ≥ t ⇒ member" at every observed score t, from (0, 0) to (1, 1)."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    labels = np.asarray(members, dtype=bool)[order]
    tpr = np.concatenate([[0.0], np.cumsum(labels) / max(1, labels.sum())])
    fpr = np.concatenate([[0.0], np.cumsum(~labels) / max(1, (~labels).sum())])
    return fpr, tpr


@styled
def plot_audit(result: AuditResult, path: str | Path) -> Path:
    """Save a PNG (with its PDF and SVG, :mod:`dpdl.plotting`): score histograms (canary in /
    out) and the ROC beside the claimed ε's limit."""
    require(result.scores is not None, "this audit result carries no scores to plot")
    scores, members = result.scores, result.members
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(8.2, 3.2), layout="constrained")
    bins = np.histogram_bin_edges(scores, bins=60)
    left.hist(scores[~members], bins=bins, alpha=0.6, label="canary out", density=True)
    left.hist(scores[members], bins=bins, alpha=0.6, label="canary in", density=True)
    left.set_xlabel("attack score")
    left.set_ylabel("density")
    family = ALGORITHMS.get(result.algorithm.partition("@")[0])
    name = family.display if family is not None else result.algorithm
    left.set_title(f"{name}, threat {result.threat} ({result.canary} canary)")

    fpr, tpr = empirical_roc(scores, members)
    runs = f"{result.trials} trials" if result.one_run is None else f"{scores.size} canaries, 1 run"
    right.plot(fpr, tpr, label=f"attack ({runs})")
    grid = np.logspace(-4, 0, 400)
    eps, delta = result.epsilon_claimed, result.delta
    limit = np.minimum.reduce(
        [np.ones_like(grid), np.exp(eps) * grid + delta, 1 - np.exp(-eps) * (1 - delta - grid)]
    )
    right.plot(grid, limit, linestyle="--", color="black", label=f"({eps:g}, {delta:g})-DP limit")
    right.plot(grid, grid, linestyle=":", color="grey", label="chance")
    right.set_xscale("log")
    right.set_xlim(1e-4, 1)
    right.set_ylim(0, 1)
    right.set_xlabel("false positive rate")
    right.set_ylabel("true positive rate")
    gdp = "" if result.epsilon_lower_gdp is None else f", GDP {result.epsilon_lower_gdp:.3g}"
    right.set_title(f"lower bound ε ≥ {result.epsilon_lower:.3g}{gdp} (claimed ε = {eps:g})")
    legend_outside(fig, (left, right))
    return save_figure(fig, path)
