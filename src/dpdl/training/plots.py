"""The figure of a run (``curves.png``): test accuracy and test loss of the average model
against iteration, in the paper style of :mod:`dpdl.plotting`.

One row of two panels per target ε (accuracy, loss; the rows share their axes, so the ε
read off one scale), one colour per algorithm label, named as the registries name it
("Dyn-D2P (PLD)"); each curve is the mean over the run's seeds (at the iterations every seed
reached) with a band of ± one standard deviation where there are two seeds or more, cut at
the quantity's bounds (accuracy in [0, 1], loss above 0).  Where the run evaluated the
nodes' own models, the worst node's accuracy is drawn dotted beside the average model's: a
decentralized run is only as good as its worst node.  The loss axis is logarithmic only
where the losses span decades.  The PNG (200 dpi) is always written; its PDF and SVG only
when asked (``vector``: ``dpdl run --vector-figures``, ``experiment.vector_figures``,
``OutputSpec.vector_figures``), since every run writes this figure.

The training loss is not plotted: it is a noise-free function of the nodes' private records
(see ``DecentralizedTrainer``'s ``unsafe_train_metrics``)."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpdl.plotting import PALETTE, band, legend_outside, pyplot, save_figure, spans_decades, styled
from dpdl.training.settings import display_label

# the columns a curve averages over seeds (a column a run did not write reads as NaN)
CURVE_COLUMNS = ("test_accuracy", "test_loss", "node_accuracy_worst")
WORST_NODE = "node_accuracy_worst"


@dataclass
class Curve:
    """One algorithm label at one target ε: per column, the mean and the sample std over
    seeds (NaN with one seed) at each iteration every seed reached."""

    algorithm: str
    epsilon: float  # NaN: a non-private run
    iteration: np.ndarray
    seeds: int
    mean: dict[str, np.ndarray] = field(default_factory=dict)
    std: dict[str, np.ndarray] = field(default_factory=dict)

    def has(self, column: str) -> bool:
        return bool(np.isfinite(self.mean.get(column, np.array([math.nan]))).any())


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def read_curves(metrics_csv: str | Path) -> list[Curve]:
    """metrics.csv -> one :class:`Curve` per (algorithm, target ε), in the file's order."""
    points: dict[tuple[str, float], dict[int, dict[str, dict[str, float]]]] = defaultdict(dict)
    with Path(metrics_csv).open(newline="") as fh:
        for row in csv.DictReader(fh):
            eps = _number(row.get("epsilon_target"))
            key = (row["algorithm"], round(eps, 12) if math.isfinite(eps) else math.nan)
            at = points[key].setdefault(int(row["iteration"]), {})
            at[row.get("seed", "")] = {c: _number(row.get(c)) for c in CURVE_COLUMNS}
    curves = []
    for (algorithm, eps), by_iteration in points.items():
        seeds = max(len(values) for values in by_iteration.values())
        iterations = sorted(i for i, values in by_iteration.items() if len(values) == seeds)
        curve = Curve(algorithm, eps, np.array(iterations), seeds)
        for column in CURVE_COLUMNS:
            values = np.array([[v[column] for v in by_iteration[i].values()] for i in iterations])
            curve.mean[column] = values.mean(axis=1)
            # ddof = 1 (the report's sample std); one seed has no spread to draw
            curve.std[column] = (values.std(axis=1, ddof=1) if seeds > 1
                                 else np.full(len(iterations), math.nan))  # fmt: skip
        curves.append(curve)
    return curves


@styled
def plot_curves(metrics_csv: str | Path, out_png: str | Path, *, title: str = "",
                vector: bool = False) -> Path:  # fmt: skip
    """The run's figure (module docstring) to ``out_png``; with ``vector`` its PDF and SVG
    beside it.  Returns the PNG's path."""
    curves = read_curves(metrics_csv)
    epsilons = sorted({c.epsilon for c in curves if math.isfinite(c.epsilon)}) or [math.nan]
    labels = list(dict.fromkeys(c.algorithm for c in curves))
    colours = {a: PALETTE[i % len(PALETTE)] for i, a in enumerate(labels)}
    fig, axes = pyplot().subplots(len(epsilons), 2, figsize=(7.4, 2.5 * len(epsilons) + 0.5),
                                  squeeze=False, sharex=True, sharey="col",
                                  layout="constrained")  # fmt: skip
    for row, eps in enumerate(epsilons):
        ax_acc, ax_loss = axes[row]
        # a non-private curve (no ε) is drawn in every row: the reference for each budget
        for curve in (c for c in curves if math.isnan(c.epsilon) or c.epsilon == eps):
            _draw(ax_acc, ax_loss, curve, colours[curve.algorithm])
        if math.isfinite(eps):
            for ax in (ax_acc, ax_loss):
                ax.set_title(f"ε = {eps:g}")
        ax_acc.set_ylabel("test accuracy")
        ax_loss.set_ylabel("test loss")
    losses = [c.mean["test_loss"] for c in curves]
    if losses and spans_decades(np.concatenate(losses)):
        for ax in axes[:, 1]:
            ax.set_yscale("log")
    for ax in axes[-1]:
        ax.set_xlabel("iteration")
    for ax in axes[:, 0]:
        ax.set_ylim(bottom=0)
    if any(c.has(WORST_NODE) for c in curves):
        _style_key(axes[0][0])
    legend_outside(fig, axes.ravel(), title=_legend_title(curves))
    if title:
        fig.suptitle(title)
    return save_figure(fig, Path(out_png), vector=vector)


def _draw(ax_acc, ax_loss, curve: Curve, colour: str) -> None:
    """The curve's mean lines (markers at the evaluations when they are few) and bands."""
    x = curve.iteration
    marker = "o" if len(x) <= 25 else None
    label = display_label(curve.algorithm)
    for ax, column, bounds in ((ax_acc, "test_accuracy", (0.0, 1.0)),
                               (ax_loss, "test_loss", (0.0, None))):  # fmt: skip
        ax.plot(x, curve.mean[column], color=colour, marker=marker, markersize=3, label=label)
        if curve.seeds > 1:
            mean, std = curve.mean[column], curve.std[column]
            band(ax, x, mean - std, mean + std, color=colour, floor=bounds[0], ceiling=bounds[1])
    if curve.has(WORST_NODE):
        ax_acc.plot(x, curve.mean[WORST_NODE], color=colour, linestyle=":", linewidth=1.2)


def _style_key(ax) -> None:
    """Legend entries for the line styles (grey: they hold for every colour)."""
    ax.plot([], [], color="0.35", label="average model")
    ax.plot([], [], color="0.35", linestyle=":", linewidth=1.2, label="worst node")


def _legend_title(curves: list[Curve]) -> str:
    seeds = sorted({c.seeds for c in curves})
    if seeds == [1]:
        return "1 seed"
    counts = "/".join(map(str, seeds))
    return f"mean of {counts} seeds\n(band: ± 1 std)"
