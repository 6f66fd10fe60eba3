"""Reports of a sweep: Markdown and self-contained HTML with tables and figures.

Reads every finished cell of a sweep directory (``cell.json`` for the grid point and the
cell's ``metrics.csv``), groups cells that differ only by seed, and writes

* ``report.md`` with PNG figures beside it, and
* ``report.html`` with the same figures embedded (base64), so it can be mailed as one file.

Tables: final test accuracy of the average model, mean ± std over seeds, per algorithm; the
relative gain of Dyn-D2P over Const-D2P; and for every cell the ε under the CLT (the papers'
approximation) beside the certified ε, with how much the CLT understated it.
"""

from __future__ import annotations

import base64
import csv
import html
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpdl.errors import DPDLError
from dpdl.experiments.sweep import finished_cells

ALGORITHM_ORDER = ("sgp", "const-d2p", "dyn-c-d2p", "dyn-mu-d2p", "dyn-d2p", "general")
_SEED_LEAVES = {"seed", "seeds"}


@dataclass
class CellRun:
    """One algorithm's curve in one cell."""

    overrides: dict
    algorithm: str
    seed: int | str
    iterations: np.ndarray
    accuracy: np.ndarray
    loss: np.ndarray
    epsilon_clt: float
    epsilon_certified: float
    extra: dict = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        return float(self.accuracy[-1])


def _float(value: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read_metrics(path: Path) -> dict[tuple[str, str], dict[str, list[float]]]:
    """metrics.csv -> {(algorithm, seed): {column: values}} in file order."""
    curves: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            key = (row.get("algorithm", "?"), row.get("seed", "0"))
            for column, value in row.items():
                if column not in ("algorithm", "seed"):
                    curves[key][column].append(_float(value))
    return curves


def collect_runs(sweep_dir: Path) -> list[CellRun]:
    runs: list[CellRun] = []
    for cell_dir, record in finished_cells(sweep_dir):
        for metrics_path in sorted(cell_dir.rglob("metrics.csv")):
            for (algorithm, seed), cols in read_metrics(metrics_path).items():
                if not cols.get("iteration"):
                    continue
                runs.append(
                    CellRun(
                        overrides=record.get("overrides", {}),
                        algorithm=algorithm,
                        seed=seed,
                        iterations=np.asarray(cols["iteration"]),
                        accuracy=np.asarray(cols.get("test_accuracy", [math.nan])),
                        loss=np.asarray(cols.get("train_loss", [math.nan])),
                        epsilon_clt=cols.get("epsilon_clt", [math.nan])[-1],
                        epsilon_certified=cols.get("epsilon_certified", [math.nan])[-1],
                    )
                )
    if not runs:
        raise DPDLError(f"{sweep_dir}: no finished cell with a metrics.csv; run the sweep first")
    return runs


def _group_key(run: CellRun) -> tuple:
    """The grid point without the seed: cells that differ only by seed are repeats."""
    return tuple(
        sorted(
            (k, str(v))
            for k, v in run.overrides.items()
            if k.rsplit(".", 1)[-1] not in _SEED_LEAVES
        )
    )


def _algorithm_rank(name: str) -> tuple[int, str]:
    return (ALGORITHM_ORDER.index(name) if name in ALGORITHM_ORDER else 99, name)


def _label(group: tuple) -> str:
    return (
        ", ".join(
            f"{k.rsplit('.', 1)[-1]}={v}" for k, v in group if k.rsplit(".", 1)[-1] != "algorithms"
        )
        or "base"
    )


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


@dataclass
class Tables:
    accuracy_header: list[str]
    accuracy_rows: list[list[str]]
    privacy_header: list[str]
    privacy_rows: list[list[str]]
    understatement: list[float]


def build_tables(runs: list[CellRun]) -> Tables:
    by_group: dict[tuple, dict[str, list[CellRun]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        by_group[_group_key(run)][run.algorithm].append(run)
    algorithms = sorted({r.algorithm for r in runs}, key=_algorithm_rank)
    show_gain = "dyn-d2p" in algorithms and "const-d2p" in algorithms
    accuracy_header = ["setting", *algorithms] + (["gain Dyn vs Const"] if show_gain else [])
    accuracy_rows = []
    privacy_rows = []
    understatement = []
    for group in sorted(by_group, key=_label):
        row = [_label(group)]
        means = {}
        for algorithm in algorithms:
            cell_runs = by_group[group].get(algorithm, [])
            if not cell_runs:
                row.append("—")
                continue
            mean, std = _mean_std([r.final_accuracy for r in cell_runs])
            means[algorithm] = mean
            row.append(f"{100 * mean:.2f} ± {100 * std:.2f} (n={len(cell_runs)})")
            eps_clt = float(np.nanmean([r.epsilon_clt for r in cell_runs]))
            eps_cert = float(np.nanmean([r.epsilon_certified for r in cell_runs]))
            if algorithm != "sgp" and math.isfinite(eps_cert):
                ratio = eps_cert / eps_clt if eps_clt > 0 else math.nan
                if math.isfinite(ratio):
                    understatement.append(ratio)
                privacy_rows.append(
                    [
                        _label(group),
                        algorithm,
                        f"{eps_clt:.4g}",
                        f"{eps_cert:.4g}",
                        f"{ratio:.2f}×" if math.isfinite(ratio) else "—",
                    ]
                )
        if show_gain:
            if "dyn-d2p" in means and means.get("const-d2p", 0) > 0:
                gain = means["dyn-d2p"] / means["const-d2p"] - 1
                row.append(f"{100 * gain:+.1f} %")
            else:
                row.append("—")
        accuracy_rows.append(row)
    privacy_header = ["setting", "algorithm", "ε CLT (approx.)", "ε certified", "certified / CLT"]
    return Tables(accuracy_header, accuracy_rows, privacy_header, privacy_rows, understatement)


def _varying(runs: list[CellRun], leaf: str) -> str | None:
    """The override key ending in ``leaf`` that takes more than one value, if any."""
    for key in {k for r in runs for k in r.overrides}:
        if key.rsplit(".", 1)[-1] == leaf and len({str(r.overrides.get(key)) for r in runs}) > 1:
            return key
    return None


def make_figures(runs: list[CellRun], out_dir: Path) -> list[tuple[str, Path]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[tuple[str, Path]] = []
    algorithms = sorted({r.algorithm for r in runs}, key=_algorithm_rank)
    eps_key = _varying(runs, "epsilon")

    # Accuracy against iteration, one panel per epsilon (or one panel).
    eps_values = sorted({r.overrides.get(eps_key) for r in runs}, key=float) if eps_key else [None]
    fig, axes = plt.subplots(
        1, len(eps_values), figsize=(4.2 * len(eps_values), 3.4), squeeze=False
    )
    for ax, eps in zip(axes[0], eps_values, strict=True):
        for algorithm in algorithms:
            curves = [
                r
                for r in runs
                if r.algorithm == algorithm and (eps_key is None or r.overrides.get(eps_key) == eps)
            ]
            if not curves:
                continue
            length = min(len(c.accuracy) for c in curves)
            acc = np.mean([c.accuracy[:length] for c in curves], axis=0)
            ax.plot(curves[0].iterations[:length], acc, label=algorithm)
        ax.set_title(f"ε = {eps}" if eps is not None else "accuracy")
        ax.set_xlabel("iteration")
        ax.set_ylabel("test accuracy (average model)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    figures.append(
        ("Accuracy against iteration", _save(fig, out_dir / "accuracy_vs_iteration.png"))
    )

    if eps_key:
        fig, ax = plt.subplots(figsize=(5, 3.6))
        for algorithm in algorithms:
            points = defaultdict(list)
            for r in runs:
                if r.algorithm == algorithm:
                    points[float(r.overrides[eps_key])].append(r.final_accuracy)
            xs = sorted(points)
            ax.errorbar(
                xs,
                [np.mean(points[x]) for x in xs],
                yerr=[np.std(points[x]) for x in xs],
                marker="o",
                capsize=3,
                label=algorithm,
            )
        ax.set_xscale("log")
        ax.set_xlabel("ε")
        ax.set_ylabel("final test accuracy")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        figures.append(
            ("Final accuracy against ε", _save(fig, out_dir / "accuracy_vs_epsilon.png"))
        )

    rho_c, rho_mu = _varying(runs, "rho_c"), _varying(runs, "rho_mu")
    if rho_c and rho_mu:
        cs = sorted({float(r.overrides[rho_c]) for r in runs})
        ms = sorted({float(r.overrides[rho_mu]) for r in runs})
        grid = np.full((len(cs), len(ms)), np.nan)
        for i, c in enumerate(cs):
            for j, m in enumerate(ms):
                vals = [
                    r.final_accuracy
                    for r in runs
                    if r.algorithm == "dyn-d2p"
                    and float(r.overrides[rho_c]) == c
                    and float(r.overrides[rho_mu]) == m
                ]
                if vals:
                    grid[i, j] = np.mean(vals)
        fig, ax = plt.subplots(figsize=(4.8, 4))
        image = ax.imshow(grid, origin="lower", cmap="viridis")
        ax.set_xticks(range(len(ms)), [f"{m:g}" for m in ms])
        ax.set_yticks(range(len(cs)), [f"{c:g}" for c in cs])
        ax.set_xlabel("ρ_μ")
        ax.set_ylabel("ρ_c")
        for (i, j), value in np.ndenumerate(grid):
            if math.isfinite(value):
                ax.text(j, i, f"{100 * value:.1f}", ha="center", va="center", color="w", fontsize=8)
        fig.colorbar(image, ax=ax, label="Dyn-D2P final accuracy")
        fig.tight_layout()
        figures.append(("Dyn-D2P accuracy over ρ_c × ρ_μ", _save(fig, out_dir / "rho_heatmap.png")))

    for leaf, title, name in (
        ("name", "Final accuracy by topology", "topologies.png"),
        ("topology", "Final accuracy by topology", "topologies.png"),
        ("nodes", "Final accuracy by number of nodes", "nodes.png"),
    ):
        key = _varying(runs, leaf)
        if not key or key == eps_key:
            continue
        values = sorted({str(r.overrides[key]) for r in runs}, key=_natural)
        fig, ax = plt.subplots(figsize=(5, 3.6))
        width = 0.8 / max(len(algorithms), 1)
        for a, algorithm in enumerate(algorithms):
            means = [
                np.mean(
                    [
                        r.final_accuracy
                        for r in runs
                        if r.algorithm == algorithm and str(r.overrides[key]) == v
                    ]
                    or [np.nan]
                )
                for v in values
            ]
            ax.bar(np.arange(len(values)) + a * width, means, width, label=algorithm)
        ax.set_xticks(np.arange(len(values)) + 0.4 - width / 2, values)
        ax.set_ylabel("final test accuracy")
        ax.legend(fontsize=8)
        fig.tight_layout()
        figures.append((title, _save(fig, out_dir / name)))
    return figures


def _natural(value: str):
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _understatement_sentence(ratios: list[float]) -> str:
    if not ratios:
        return "No private cell reported both a CLT and a certified ε."
    worst, median = max(ratios), float(np.median(ratios))
    return (
        f"The CLT approximation (the papers' accounting) understated ε by a factor of up to "
        f"{worst:.2f} (median {median:.2f}) relative to the certified accountant."
    )


def write_report(sweep_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir or sweep_dir / "report")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = collect_runs(sweep_dir)
    tables = build_tables(runs)
    figures = make_figures(runs, out_dir)
    sentence = _understatement_sentence(tables.understatement)
    title = f"dpdl report — {sweep_dir.name}"
    md = [
        f"# {title}",
        "",
        f"{len({_group_key(r) for r in runs})} settings, {len(runs)} runs "
        "(final test accuracy of the network-average model, mean ± std over seeds, %).",
        "",
        _markdown_table(tables.accuracy_header, tables.accuracy_rows),
        "",
        "## Privacy: CLT approximation against the certified accountant",
        "",
        sentence,
        "",
        _markdown_table(tables.privacy_header, tables.privacy_rows),
        "",
        "## Figures",
        "",
    ]
    for caption, path in figures:
        md += [f"### {caption}", "", f"![{caption}]({path.name})", ""]
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(md))

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:1100px;"
        "margin:2em auto}}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:right}th{background:#eee}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        "<p>Final test accuracy of the network-average model, mean ± std over seeds (%).</p>",
        _html_table(tables.accuracy_header, tables.accuracy_rows),
        "<h2>Privacy: CLT approximation against the certified accountant</h2>",
        f"<p>{html.escape(sentence)}</p>",
        _html_table(tables.privacy_header, tables.privacy_rows),
        "<h2>Figures</h2>",
    ]
    for caption, path in figures:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(
            f"<h3>{html.escape(caption)}</h3><img alt='{html.escape(caption)}' "
            f"src='data:image/png;base64,{data}'>"
        )
    parts.append("</body></html>")
    html_path = out_dir / "report.html"
    html_path.write_text("\n".join(parts))
    return {"markdown": md_path, "html": html_path}
