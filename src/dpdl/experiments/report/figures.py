"""The report's figures, one function each; every one saves a PNG with its PDF and SVG
(:func:`dpdl.plotting.save_figure`) and returns its Figure.

* accuracy against iteration per ε (always), the spread over seeds as a band;
* final accuracy against ε (more than one ε);
* the ρ_c × ρ_μ heat-map of Dyn-D2P (both varied);
* final accuracy by topology and by number of nodes (varied in every run).

One colour per algorithm; its calibrations share it (an approximate accountant's, the CLT's,
dashed or hollow, certified solid).  Algorithms and settings are named as the registries name
them ("Dyn-D2P (PLD)", "complete topology"); compared panels share their axes.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpdl.accounting.certified import approximate_accountant
from dpdl.accounting.schedules import algorithm_private
from dpdl.experiments.report.collect import CellRun
from dpdl.experiments.report.grouping import (
    KEY_NAMES,
    algorithm_rank,
    algorithms_of,
    contender,
    display_label,
    epsilons_of,
    key_display,
    mean_final_accuracy,
    natural_key,
    select,
    setting_display,
    settings_of,
)
from dpdl.experiments.report.render import Figure
from dpdl.plotting import PALETTE, band, legend_outside, pyplot, save_figure, styled
from dpdl.training.results import sample_std

# Figures with one panel (or row of panels) per setting draw at most this many settings.
MAX_PANELS = 6
# grid key, caption, file: the bar charts of final accuracy by one grid key
BAR_CHARTS = (
    ("topology.name", "Final accuracy by topology", "topologies.png"),
    ("topology.nodes", "Final accuracy by number of nodes", "nodes.png"),
)
TOPOLOGY_ORDER = ["ring", "undirected-ring", "exp", "static-exp", "complete"]


def make_figures(runs: list[CellRun], out_dir: Path) -> list[Figure]:
    palette = Palette.of(algorithms_of(runs))
    figures = [
        accuracy_vs_iteration(runs, out_dir, palette),
        accuracy_vs_epsilon(runs, out_dir, palette),
        rho_heatmap(runs, out_dir),
        *(accuracy_by(key, caption, runs, out_dir / name, palette)
          for key, caption, name in BAR_CHARTS),
    ]  # fmt: skip
    return [f for f in figures if f is not None]


@dataclass
class Palette:
    """Colours and line styles of the algorithm labels, in the report's order."""

    colours: dict[str, str]  # algorithm label -> matplotlib colour

    @classmethod
    def of(cls, algorithms: list[str]) -> Palette:
        bases = sorted({a.partition("@")[0] for a in algorithms}, key=algorithm_rank)
        return cls({a: PALETTE[bases.index(a.partition("@")[0]) % len(PALETTE)]
                    for a in algorithms})  # fmt: skip

    @property
    def algorithms(self) -> list[str]:
        return list(self.colours)

    def line(self, algorithm: str) -> dict:
        dashed = approximate_accountant(algorithm.partition("@")[2])
        return {"color": self.colours[algorithm], "linestyle": "--" if dashed else "-",
                "label": display_label(algorithm)}  # fmt: skip


def _shown_settings(runs: list[CellRun]) -> tuple[list[tuple], str]:
    """The settings drawn, and the caption's note when some are left out."""
    settings = settings_of(runs)
    more = "" if len(settings) <= MAX_PANELS else f" (first {MAX_PANELS} of {len(settings)})"
    return settings[:MAX_PANELS], more


# --------------------------------------------------------------------------- the figures
def _panels(rows: int, cols: int, *, width: float = 3.0, height: float = 2.3):
    """A grid of panels on shared axes (compared settings read off one scale), laid out so
    that a legend outside them has its room."""
    plt = pyplot()
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols + 1.8, height * rows + 0.3),
                             squeeze=False, sharex=True, sharey=True,
                             layout="constrained")  # fmt: skip
    return fig, axes


@styled
def accuracy_vs_iteration(runs: list[CellRun], out_dir: Path, palette: Palette) -> Figure:
    """One column per ε, one row per setting: each algorithm's accuracy, mean over seeds with
    a band of ± one standard deviation (cut to [0, 1])."""
    panels_eps = epsilons_of(runs) or [None]
    shown, more = _shown_settings(runs)
    several = len(settings_of(runs)) > 1
    fig, axes = _panels(len(shown), len(panels_eps))
    for row, setting in enumerate(shown):
        for col, eps in enumerate(panels_eps):
            ax = axes[row][col]
            _plot_mean_curves(ax, runs, setting, eps, palette)
            title = f"ε = {eps:g}" if eps is not None else ""
            if several:
                title = f"{title}, {setting_display(setting)}" if title else setting_display(
                    setting)
            ax.set_title(title)
        axes[row][0].set_ylabel("test accuracy")
    for ax in axes[-1]:
        ax.set_xlabel("iteration")
    legend_outside(fig, axes.ravel())
    return Figure(
        "Test accuracy of the average model against iteration, per ε (mean over seeds, band: "
        "± one std; dashed: CLT calibration)" + more,
        save_figure(fig, out_dir / "accuracy_vs_iteration.png"),
    )


def _plot_mean_curves(ax, runs, setting, eps, palette: Palette) -> None:
    """Each algorithm's accuracy curve, averaged over seeds up to the shortest one, and the
    ± std band where there are two seeds or more."""
    for algorithm in palette.algorithms:
        curves = select(runs, setting=setting, algorithm=algorithm, epsilon=eps)
        if not curves:
            continue
        length = min(len(c.accuracy) for c in curves)
        values = np.array([c.accuracy[:length] for c in curves])
        x, acc = curves[0].iterations[:length], values.mean(axis=0)
        ax.plot(x, acc, **palette.line(algorithm))
        if len(curves) > 1:
            std = values.std(axis=0, ddof=1)
            band(ax, x, acc - std, acc + std, color=palette.colours[algorithm], floor=0.0,
                 ceiling=1.0)  # fmt: skip


@styled
def accuracy_vs_epsilon(runs: list[CellRun], out_dir: Path, palette: Palette) -> Figure | None:
    """One panel per setting: final accuracy (mean ± std) against target ε, SGP as a line."""
    epsilons = epsilons_of(runs)
    if len(epsilons) < 2:
        return None
    shown, more = _shown_settings(runs)
    fig, axes = _panels(1, len(shown), width=3.2, height=2.6)
    for ax, setting in zip(axes[0], shown, strict=True):
        for algorithm in palette.algorithms:
            _plot_final_against_epsilon(ax, runs, setting, algorithm, epsilons, palette)
        ax.set_xscale("log")  # targets are chosen by factors (0.3, 1, 3, ...)
        ax.minorticks_off()
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.set_xlabel("target ε")
        if len(settings_of(runs)) > 1:
            ax.set_title(setting_display(setting))
    axes[0][0].set_ylabel("final test accuracy")
    legend_outside(fig, axes.ravel())
    return Figure(
        "Final test accuracy against ε (mean over seeds, bars: ± one std, cut to [0, 1]; "
        "dotted: non-private)" + more,
        save_figure(fig, out_dir / "accuracy_vs_epsilon.png"),
    )


def _plot_final_against_epsilon(ax, runs, setting, algorithm, epsilons, palette) -> None:
    if not algorithm_private(algorithm.partition("@")[0]):  # no ε: a horizontal line
        mean = mean_final_accuracy(runs, setting=setting, algorithm=algorithm)[0]
        ax.axhline(mean, color=palette.colours[algorithm], linestyle=":",
                   label=display_label(algorithm))  # fmt: skip
        return
    stats = [
        mean_final_accuracy(runs, setting=setting, algorithm=algorithm, epsilon=e)
        for e in epsilons
    ]
    kept = [(e, m, sd) for e, (m, sd, count) in zip(epsilons, stats, strict=True) if count]
    if not kept:
        return
    x, mean, std = (np.array(v, dtype=float) for v in zip(*kept, strict=True))
    std = np.nan_to_num(std)  # one seed: no spread to draw
    # the bars stop at the bounds an accuracy cannot cross
    low, high = mean - np.maximum(mean - std, 0.0), np.minimum(mean + std, 1.0) - mean
    ax.errorbar(x, mean, yerr=[low, high], marker="o", capsize=2.5, **palette.line(algorithm))


def _key_ending(runs: list[CellRun], leaf: str) -> str | None:
    """The first grid key that ends in ``leaf`` and varies across the runs."""
    for key in sorted({k for r in runs for k in r.overrides}):
        if key.rsplit(".", 1)[-1] == leaf and _varying(runs, key):
            return key
    return None


def _varying(runs: list[CellRun], key: str) -> bool:
    return len({str(r.overrides.get(key)) for r in runs}) > 1


@styled
def rho_heatmap(runs: list[CellRun], out_dir: Path) -> Figure | None:
    """One panel per label of a family with rivals (Dyn-D2P) and ε: mean final accuracy over
    the ρ_c × ρ_μ grid."""
    rho_c, rho_mu = _key_ending(runs, "rho_c"), _key_ending(runs, "rho_mu")
    dyn_labels = [a for a in algorithms_of(runs) if contender(a)]
    if not (rho_c and rho_mu and dyn_labels):
        return None
    plt = pyplot()
    cs = sorted({float(r.overrides[rho_c]) for r in runs})
    ms = sorted({float(r.overrides[rho_mu]) for r in runs})
    panels = [(a, e) for a in dyn_labels for e in epsilons_of(runs) or [None]]
    fig, axes = plt.subplots(1, len(panels), figsize=(2.6 * len(panels) + 1.0, 2.6),
                             squeeze=False, layout="constrained")  # fmt: skip
    grids = [100 * _mean_over_grid(select(runs, algorithm=algorithm, epsilon=eps), rho_c, cs,
                                   rho_mu, ms) for algorithm, eps in panels]  # fmt: skip
    finite = np.concatenate([g[np.isfinite(g)] for g in grids])
    # one colour scale for every panel: the same colour is the same accuracy everywhere
    scale = {"vmin": float(finite.min()), "vmax": float(finite.max())} if finite.size else {}
    middle = (scale["vmin"] + scale["vmax"]) / 2 if scale else 0.0
    for ax, (algorithm, eps), grid in zip(axes[0], panels, grids, strict=True):
        image = ax.imshow(grid, origin="lower", cmap="viridis", aspect="auto", **scale)
        ax.set_xticks(range(len(ms)), [f"{m:g}" for m in ms])
        ax.set_yticks(range(len(cs)), [f"{c:g}" for c in cs])
        ax.set_xlabel(KEY_NAMES["rho_mu"])
        ax.set_ylabel(KEY_NAMES["rho_c"])
        ax.grid(False)
        ax.set_title(display_label(algorithm) + (f", ε = {eps:g}" if eps is not None else ""))
        for (i, j), value in np.ndenumerate(grid):
            if math.isfinite(value):  # dark text on the bright end of viridis
                ax.text(j, i, f"{value:.1f}", ha="center", va="center", fontsize=8,
                        color="k" if value > middle else "w")  # fmt: skip
    fig.colorbar(image, ax=list(axes[0]), label="final test accuracy (%)", shrink=0.9)
    caption = "Final test accuracy over ρ_c × ρ_μ (mean over seeds, in %)"
    return Figure(caption, save_figure(fig, out_dir / "rho.png"))


def _mean_over_grid(runs, row_key: str, rows: list, col_key: str, cols: list) -> np.ndarray:
    """Mean final accuracy of the runs at each (row, column) grid point; NaN where none."""
    grid = np.full((len(rows), len(cols)), np.nan)
    for (i, row), (j, col) in itertools.product(enumerate(rows), enumerate(cols)):
        vals = [
            r.final_accuracy
            for r in runs
            if float(r.overrides[row_key]) == row and float(r.overrides[col_key]) == col
        ]
        grid[i, j] = np.mean(vals) if vals else np.nan
    return grid


def _topology_rank(name: str) -> int:
    return TOPOLOGY_ORDER.index(name) if name in TOPOLOGY_ORDER else 99


@styled
def accuracy_by(key: str, caption: str, runs: list[CellRun], path: Path,
                palette: Palette) -> Figure | None:
    """Final accuracy (mean ± std, each seed a dot) per value of grid key ``key``, one panel
    per ε on a shared scale; drawn when ``key`` varies and every run has it.  Points, not
    bars: the axis can then start where the data do without a bar's length misleading."""
    if not _varying(runs, key) or not all(key in r.overrides for r in runs):
        return None
    values = sorted({str(r.overrides[key]) for r in runs}, key=natural_key)
    if key == "topology.name":
        values = sorted(values, key=_topology_rank)
    panels_eps = epsilons_of(runs) or [None]
    fig, axes = _panels(1, len(panels_eps), width=max(2.6, 0.7 * len(values)), height=2.6)
    width = 0.7 / max(len(palette.algorithms), 1)
    for ax, eps in zip(axes[0], panels_eps, strict=True):
        for a, algorithm in enumerate(palette.algorithms):
            chosen = select(runs, algorithm=algorithm, epsilon=eps)
            offset = (a - (len(palette.algorithms) - 1) / 2) * width
            _draw_points(ax, chosen, key, values, offset, algorithm, palette)
        ax.set_xticks(np.arange(len(values)), values)
        ax.set_xlabel(key_display(key))
        ax.set_title(f"ε = {eps:g}" if eps is not None else "")
        ax.grid(False, axis="x")
    axes[0][0].set_ylabel("final test accuracy")
    legend_outside(fig, axes.ravel())
    return Figure(caption + " (mean ± std over seeds; dots: seeds)", save_figure(fig, path))


def _draw_points(ax, runs, key: str, values: list[str], offset: float, algorithm: str,
                 palette: Palette) -> None:  # fmt: skip
    """One algorithm's mean ± std (cut to [0, 1]) of the final accuracy at each value, and
    every seed's as a small dot; hollow for an approximate calibration (the CLT)."""
    finals = [[r.final_accuracy for r in runs if str(r.overrides[key]) == v] for v in values]
    x = np.arange(len(values)) + offset
    mean = np.array([np.mean(f) if f else np.nan for f in finals])
    std = np.nan_to_num([sample_std(f) if f else np.nan for f in finals])
    colour = palette.colours[algorithm]
    hollow = approximate_accountant(algorithm.partition("@")[2])
    ax.errorbar(x, mean, yerr=[mean - np.maximum(mean - std, 0), np.minimum(mean + std, 1) - mean],
                fmt="o", color=colour, capsize=2.5, label=display_label(algorithm),
                markerfacecolor="white" if hollow else colour)  # fmt: skip
    for xi, f in zip(x, finals, strict=True):
        ax.plot([xi] * len(f), f, ".", color=colour, alpha=0.45, markersize=3)
