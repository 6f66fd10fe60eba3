"""Plots of a run: test accuracy and test loss (average model) against iteration.

The training loss is not plotted: it is a noise-free function of the nodes' private records
(see ``DecentralizedTrainer``'s ``unsafe_train_metrics``)."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

import numpy as np


def read_curves(metrics_csv: str | Path) -> dict[str, dict[str, np.ndarray]]:
    """metrics.csv -> {curve label: {"iteration", "test_accuracy", "test_loss"}}.

    A curve is one algorithm at one target epsilon, averaged over seeds (at the iterations
    that every seed reached).
    """
    grouped: dict[str, dict[int, dict[str, list[float]]]] = defaultdict(dict)
    with Path(metrics_csv).open(newline="") as fh:
        for row in csv.DictReader(fh):
            eps = float(row["epsilon_target"]) if row.get("epsilon_target") else math.nan
            label = row["algorithm"] + ("" if math.isnan(eps) else f" (ε={eps:g})")
            point = grouped[label].setdefault(
                int(row["iteration"]), {"test_accuracy": [], "test_loss": []}
            )
            point["test_accuracy"].append(float(row["test_accuracy"]))
            point["test_loss"].append(float(row["test_loss"]))
    curves = {}
    for label, points in grouped.items():
        its = sorted(points)
        n_seeds = max(len(points[i]["test_loss"]) for i in its)
        its = [i for i in its if len(points[i]["test_loss"]) == n_seeds]
        curves[label] = {
            "iteration": np.array(its),
            "test_accuracy": np.array([np.mean(points[i]["test_accuracy"]) for i in its]),
            "test_loss": np.array([np.mean(points[i]["test_loss"]) for i in its]),
        }
    return curves


def plot_curves(metrics_csv: str | Path, out_png: str | Path, *, title: str = "") -> Path:
    """Two panels (test accuracy, test loss) with one line per algorithm and epsilon."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = read_curves(metrics_csv)
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label, c in curves.items():
        (line,) = ax_acc.plot(c["iteration"], c["test_accuracy"], label=label)
        ax_loss.plot(c["iteration"], c["test_loss"], label=label, color=line.get_color())
    ax_acc.set(xlabel="iteration", ylabel="test accuracy (average model)")
    ax_loss.set(xlabel="iteration", ylabel="test loss (average model)", yscale="log")
    for ax in (ax_acc, ax_loss):
        ax.grid(alpha=0.3)
    if curves:
        ax_acc.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
