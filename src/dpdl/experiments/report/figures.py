"""The report's figures, one function each; every one saves a PNG and returns its Figure.

* accuracy against iteration per ε (always);
* final accuracy against ε (more than one ε);
* the ρ_c × ρ_μ heat-map of Dyn-D2P (both varied);
* final accuracy by topology and by number of nodes (varied in every run).

One colour per algorithm; its calibrations share it (an approximate accountant's, the CLT's,
dashed or hatched, certified solid).
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
    algorithm_rank,
    algorithms_of,
    contender,
    epsilons_of,
    mean_final_accuracy,
    natural_key,
    select,
    setting_label,
    settings_of,
)
from dpdl.experiments.report.render import Figure
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
        return cls({a: f"C{bases.index(a.partition('@')[0]) % 10}" for a in algorithms})

    @property
    def algorithms(self) -> list[str]:
        return list(self.colours)

    def line(self, algorithm: str) -> dict:
        dashed = approximate_accountant(algorithm.partition("@")[2])
        return {"color": self.colours[algorithm], "linestyle": "--" if dashed else "-"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _shown_settings(runs: list[CellRun]) -> tuple[list[tuple], str]:
    """The settings drawn, and the caption's note when some are left out."""
    settings = settings_of(runs)
    more = "" if len(settings) <= MAX_PANELS else f" (first {MAX_PANELS} of {len(settings)})"
    return settings[:MAX_PANELS], more


# --------------------------------------------------------------------------- the figures
def accuracy_vs_iteration(runs: list[CellRun], out_dir: Path, palette: Palette) -> Figure:
    """One column per ε, one row per setting: each algorithm's accuracy, mean over seeds."""
    plt = _pyplot()
    panels_eps = epsilons_of(runs) or [None]
    shown, more = _shown_settings(runs)
    several = len(settings_of(runs)) > 1
    fig, axes = plt.subplots(
        len(shown),
        len(panels_eps),
        figsize=(4.0 * len(panels_eps), 3.2 * len(shown)),
        squeeze=False,
        sharey=True,
    )
    for row, setting in enumerate(shown):
        for col, eps in enumerate(panels_eps):
            ax = axes[row][col]
            _plot_mean_curves(ax, runs, setting, eps, palette)
            title = f"ε = {eps:g}" if eps is not None else "accuracy"
            ax.set_title(title + (f"\n{setting_label(setting)}" if several else ""), fontsize=9)
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("test accuracy (average model)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return Figure(
        "Accuracy against iteration, per ε (mean over seeds; dashed: CLT calibration)" + more,
        _save(fig, out_dir / "accuracy_vs_iteration.png"),
    )


def _plot_mean_curves(ax, runs, setting, eps, palette: Palette) -> None:
    """Each algorithm's accuracy curve, averaged over seeds up to the shortest one."""
    for algorithm in palette.algorithms:
        curves = select(runs, setting=setting, algorithm=algorithm, epsilon=eps)
        if not curves:
            continue
        length = min(len(c.accuracy) for c in curves)
        acc = np.mean([c.accuracy[:length] for c in curves], axis=0)
        ax.plot(curves[0].iterations[:length], acc, label=algorithm, **palette.line(algorithm))


def accuracy_vs_epsilon(runs: list[CellRun], out_dir: Path, palette: Palette) -> Figure | None:
    """One panel per setting: final accuracy (mean ± std) against target ε, SGP as a line."""
    epsilons = epsilons_of(runs)
    if len(epsilons) < 2:
        return None
    plt = _pyplot()
    shown, more = _shown_settings(runs)
    fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.8), squeeze=False)
    for ax, setting in zip(axes[0], shown, strict=True):
        for algorithm in palette.algorithms:
            _plot_final_against_epsilon(ax, runs, setting, algorithm, epsilons, palette)
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
        ax.set_xlabel("target ε")
        ax.set_ylabel("final test accuracy")
        if len(settings_of(runs)) > 1:
            ax.set_title(setting_label(setting), fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return Figure(
        "Final accuracy against ε (mean ± std over seeds)" + more,
        _save(fig, out_dir / "accuracy_vs_epsilon.png"),
    )


def _plot_final_against_epsilon(ax, runs, setting, algorithm, epsilons, palette) -> None:
    if not algorithm_private(algorithm.partition("@")[0]):  # no ε: a horizontal line
        mean = mean_final_accuracy(runs, setting=setting, algorithm=algorithm)[0]
        ax.axhline(mean, color=palette.colours[algorithm], linestyle=":", label=algorithm)
        return
    stats = [
        mean_final_accuracy(runs, setting=setting, algorithm=algorithm, epsilon=e)
        for e in epsilons
    ]
    ax.errorbar(
        [e for e, s in zip(epsilons, stats, strict=True) if s[2]],
        [s[0] for s in stats if s[2]],
        yerr=[s[1] for s in stats if s[2]],
        marker="o",
        capsize=3,
        label=algorithm,
        **palette.line(algorithm),
    )


def _key_ending(runs: list[CellRun], leaf: str) -> str | None:
    """The first grid key that ends in ``leaf`` and varies across the runs."""
    for key in sorted({k for r in runs for k in r.overrides}):
        if key.rsplit(".", 1)[-1] == leaf and _varying(runs, key):
            return key
    return None


def _varying(runs: list[CellRun], key: str) -> bool:
    return len({str(r.overrides.get(key)) for r in runs}) > 1


def rho_heatmap(runs: list[CellRun], out_dir: Path) -> Figure | None:
    """One panel per label of a family with rivals (Dyn-D2P) and ε: mean final accuracy over
    the ρ_c × ρ_μ grid."""
    rho_c, rho_mu = _key_ending(runs, "rho_c"), _key_ending(runs, "rho_mu")
    dyn_labels = [a for a in algorithms_of(runs) if contender(a)]
    if not (rho_c and rho_mu and dyn_labels):
        return None
    plt = _pyplot()
    cs = sorted({float(r.overrides[rho_c]) for r in runs})
    ms = sorted({float(r.overrides[rho_mu]) for r in runs})
    panels = [(a, e) for a in dyn_labels for e in epsilons_of(runs) or [None]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), squeeze=False)
    for ax, (algorithm, eps) in zip(axes[0], panels, strict=True):
        grid = _mean_over_grid(select(runs, algorithm=algorithm, epsilon=eps), rho_c, cs,
                               rho_mu, ms)  # fmt: skip
        image = ax.imshow(grid, origin="lower", cmap="viridis")
        ax.set_xticks(range(len(ms)), [f"{m:g}" for m in ms])
        ax.set_yticks(range(len(cs)), [f"{c:g}" for c in cs])
        ax.set_xlabel("ρ_μ")
        ax.set_ylabel("ρ_c")
        ax.set_title(algorithm + (f", ε = {eps:g}" if eps is not None else ""), fontsize=9)
        for (i, j), value in np.ndenumerate(grid):
            if math.isfinite(value):
                ax.text(j, i, f"{100 * value:.1f}", ha="center", va="center", color="w")
        fig.colorbar(image, ax=ax, label="final accuracy")
    fig.tight_layout()
    caption = "Dyn-D2P accuracy over ρ_c × ρ_μ (mean over seeds)"
    return Figure(caption, _save(fig, out_dir / "rho.png"))


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


def accuracy_by(key: str, caption: str, runs: list[CellRun], path: Path,
                palette: Palette) -> Figure | None:
    """Bars of final accuracy (mean ± std) per value of grid key ``key``, one panel per ε;
    drawn when ``key`` varies and every run has it."""
    if not _varying(runs, key) or not all(key in r.overrides for r in runs):
        return None
    plt = _pyplot()
    values = sorted({str(r.overrides[key]) for r in runs}, key=natural_key)
    if key == "topology.name":
        values = sorted(values, key=_topology_rank)
    panels_eps = epsilons_of(runs) or [None]
    fig, axes = plt.subplots(
        1, len(panels_eps), figsize=(4.6 * len(panels_eps), 3.6), squeeze=False, sharey=True
    )
    width = 0.8 / max(len(palette.algorithms), 1)
    for ax, eps in zip(axes[0], panels_eps, strict=True):
        for a, algorithm in enumerate(palette.algorithms):
            chosen = select(runs, algorithm=algorithm, epsilon=eps)
            _draw_bars(ax, chosen, key, values, a * width, width, algorithm, palette)
        ax.set_xticks(np.arange(len(values)) + 0.4 - width / 2, values)
        ax.set_xlabel(key.rsplit(".", 1)[-1])
        ax.set_title(f"ε = {eps:g}" if eps is not None else "", fontsize=9)
    axes[0][0].set_ylabel("final test accuracy")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return Figure(caption + " (mean ± std over seeds)", _save(fig, path))


def _draw_bars(ax, runs, key: str, values: list[str], offset: float, width: float,
               algorithm: str, palette: Palette) -> None:
    """One algorithm's bars: mean ± std of the final accuracy of its runs at each value."""
    finals = [
        [r.final_accuracy for r in runs if str(r.overrides[key]) == v] or [np.nan]
        for v in values
    ]
    ax.bar(
        np.arange(len(values)) + offset,
        [np.mean(f) for f in finals],
        width,
        yerr=[sample_std(f) for f in finals],
        label=algorithm,
        color=palette.colours[algorithm],
        hatch="//" if approximate_accountant(algorithm.partition("@")[2]) else None,
    )
