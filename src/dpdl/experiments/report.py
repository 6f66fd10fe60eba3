"""Reports of a sweep: Markdown and self-contained HTML with tables and figures (issue 5).

Reads every finished cell of a sweep directory (``cell.json`` for the grid point, and the
cell's ``metrics.csv``).  A *run* is one curve of a metrics file: one (algorithm, seed,
epsilon_target) triple, so a cell that trains several algorithms, seeds or target epsilons
yields several runs.  The target epsilon is read from the ``epsilon_target`` column, and
taken from the grid point only when the file has no such column.  Runs that differ only by
seed are repeats; the remaining grid keys (other than seed, algorithms and epsilon) form the
*setting* of a run.

It writes ``report.md`` with PNG figures beside it, and ``report.html`` with the same figures
embedded (base64), so it can be mailed as one file:

* accuracy table: final test accuracy of the average model, mean ± std over seeds, one row per
  (setting, ε), one column per algorithm label (``dyn-d2p@clt``: calibrated with the paper's
  CLT, SPEC §2), and the relative gain of Dyn-D2P over Const-D2P per calibration;
* privacy: for every run the ε of the CLT approximation beside the certified ε; and for the
  CLT-calibrated runs the certified ε they really spend against their target -- how much the
  paper's accounting understated privacy loss;
* the claims of SPEC §4 checked against the measured means;
* runs whose noise was derived from their seed (``noise_entropy = "seed"`` in results.json,
  the reproducible research mode) are named in a note under the introduction, and the
  per-run table has a noise column;
* figures: accuracy against iteration per ε, final accuracy against ε, the ρ_c × ρ_μ
  heat-map of Dyn-D2P, accuracy by topology and by number of nodes.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpdl.errors import DPDLError
from dpdl.experiments.sweep import finished_cells
from dpdl.training.settings import REPRODUCIBLE_NOISE_NOTE

ALGORITHM_ORDER = ("sgp", "const-d2p", "dyn-c-d2p", "dyn-mu-d2p", "dyn-d2p", "general")
CALIBRATION_ORDER = ("", "clt", "pld", "rdp")
_SEED_LEAVES = {"seed", "seeds"}
_NOT_A_SETTING = _SEED_LEAVES | {"algorithms", "epsilon"}
# Figures with one panel (or row of panels) per setting draw at most this many settings.
MAX_PANELS = 6


@dataclass
class CellRun:
    """One curve: an algorithm at one seed and target ε, in one cell of the sweep."""

    overrides: dict
    algorithm: str  # the label, e.g. "dyn-d2p@clt"
    seed: str
    epsilon_target: float  # NaN for non-private runs
    iterations: np.ndarray
    accuracy: np.ndarray
    loss: np.ndarray
    epsilon_clt: float
    epsilon_certified: float
    cell: str = ""
    calibrated_with: str | None = None
    status: str = "ok"  # "diverged": the runner stopped it on a NaN/inf update
    noise_entropy: str | None = None  # "os", "seed" (reproducible noise), None: not recorded
    extra: dict = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        return float(self.accuracy[-1])

    @property
    def base_algorithm(self) -> str:
        return self.algorithm.partition("@")[0]

    @property
    def calibration(self) -> str:
        """The calibrating accountant named in the label ("" when the label names none)."""
        return self.algorithm.partition("@")[2]

    @property
    def private(self) -> bool:
        return self.base_algorithm != "sgp"

    @property
    def setting(self) -> tuple:
        """The grid point without seed, algorithms and ε: runs of one setting are comparable."""
        return tuple(
            sorted(
                (k, str(v))
                for k, v in self.overrides.items()
                if k.rsplit(".", 1)[-1] not in _NOT_A_SETTING
            )
        )


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read_metrics(path: Path) -> dict[tuple[str, str, float], dict[str, list[float]]]:
    """metrics.csv -> {(algorithm, seed, epsilon_target): {column: values}} in file order.

    ``epsilon_target`` is NaN when the file has no such column or the run is not private.
    """
    curves: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            eps = _float(row.get("epsilon_target"))
            # NaN != NaN: key non-private runs with one canonical NaN-free marker.
            key = (row.get("algorithm", "?"), row.get("seed", "0"), eps if eps == eps else None)
            for column, value in row.items():
                if column not in ("algorithm", "seed", "epsilon_target"):
                    curves[key][column].append(_float(value))
    return {(a, s, math.nan if e is None else e): cols for (a, s, e), cols in curves.items()}


def _override_epsilon(overrides: dict) -> float:
    for key, value in overrides.items():
        if key.rsplit(".", 1)[-1] == "epsilon" and not isinstance(value, list):
            return _float(value)
    return math.nan


def _run_records(results_path: Path) -> dict[tuple[str, str, float], dict]:
    """(algorithm, seed, ε target) -> the runner's record of it in results.json."""
    try:
        results = json.loads(results_path.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for cell in results.get("cells", []) if isinstance(results, dict) else []:
        if isinstance(cell, dict) and "algorithm" in cell:
            eps = _float(cell.get("epsilon_target"))
            out[(str(cell["algorithm"]), str(cell.get("seed")), round(eps, 12))] = cell
    return out


def collect_runs(sweep_dir: Path) -> list[CellRun]:
    runs: list[CellRun] = []
    for cell_dir, record in finished_cells(sweep_dir):
        overrides = record.get("overrides", {})
        for metrics_path in sorted(cell_dir.rglob("metrics.csv")):
            records = _run_records(metrics_path.with_name("results.json"))
            for (algorithm, seed, eps), cols in read_metrics(metrics_path).items():
                if not cols.get("iteration"):
                    continue
                if math.isnan(eps) and algorithm.partition("@")[0] != "sgp":
                    eps = _override_epsilon(overrides)
                record_of_run = records.get((algorithm, seed, round(eps, 12)), {})
                calibration = record_of_run.get("calibrated_with")
                runs.append(
                    CellRun(
                        overrides=overrides,
                        algorithm=algorithm,
                        seed=seed,
                        epsilon_target=eps,
                        iterations=np.asarray(cols["iteration"]),
                        accuracy=np.asarray(cols.get("test_accuracy", [math.nan])),
                        loss=np.asarray(cols.get("test_loss", [math.nan])),
                        epsilon_clt=cols.get("epsilon_clt", [math.nan])[-1],
                        epsilon_certified=cols.get("epsilon_certified", [math.nan])[-1],
                        cell=cell_dir.name,
                        calibrated_with=calibration or algorithm.partition("@")[2] or None,
                        status=str(record_of_run.get("status", "ok")),
                        noise_entropy=record_of_run.get("noise_entropy"),
                        extra={
                            "metrics_path": str(metrics_path),
                            "train_seconds": _float(record_of_run.get("train_seconds")),
                        },
                    )
                )
    if not runs:
        raise DPDLError(f"{sweep_dir}: no finished cell with a metrics.csv; run the sweep first")
    return runs


# --------------------------------------------------------------------------- grouping
def _algorithm_rank(label: str) -> tuple[int, int, str]:
    name, _, calibration = label.partition("@")
    return (
        ALGORITHM_ORDER.index(name) if name in ALGORITHM_ORDER else 99,
        CALIBRATION_ORDER.index(calibration) if calibration in CALIBRATION_ORDER else 99,
        label,
    )


def _algorithms(runs: list[CellRun]) -> list[str]:
    """Algorithm labels grouped by calibration (SGP first), then in the paper's order."""
    labels = {r.algorithm for r in runs}
    return sorted(
        labels,
        key=lambda a: (a.partition("@")[0] != "sgp", _algorithm_rank(a)[1], _algorithm_rank(a)),
    )


def _label(setting: tuple) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in setting) or "base"


def _eps_text(eps: float) -> str:
    return "—" if math.isnan(eps) else f"{eps:g}"


def _mean_std(values: list[float]) -> tuple[float, float]:
    arr = np.asarray(values, dtype=float)
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def _settings(runs: list[CellRun]) -> list[tuple]:
    return sorted({r.setting for r in runs}, key=lambda s: [(k, _natural(v)) for k, v in s])


def _epsilons(runs: list[CellRun]) -> list[float]:
    return sorted({r.epsilon_target for r in runs if not math.isnan(r.epsilon_target)})


def _select(runs, *, setting=None, algorithm=None, epsilon=None) -> list[CellRun]:
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
    chosen = _select(runs, **filters)
    if not chosen:
        return math.nan, math.nan, 0
    mean, std = _mean_std([r.final_accuracy for r in chosen])
    return mean, std, len(chosen)


def _gain_pairs(algorithms: list[str]) -> list[tuple[str, str, str]]:
    """(calibration, dyn label, const label) for every calibration that has both."""
    pairs = []
    for calibration in sorted({a.partition("@")[2] for a in algorithms}, key=_calibration_rank):
        suffix = f"@{calibration}" if calibration else ""
        dyn, const = f"dyn-d2p{suffix}", f"const-d2p{suffix}"
        if dyn in algorithms and const in algorithms:
            pairs.append((calibration, dyn, const))
    return pairs


def _calibration_rank(calibration: str) -> int:
    return CALIBRATION_ORDER.index(calibration) if calibration in CALIBRATION_ORDER else 99


def relative_gain(dyn: float, const: float) -> float:
    """Dyn-D2P's accuracy relative to Const-D2P's, minus one (SPEC §4: +39 % at ε = 0.3)."""
    return dyn / const - 1 if const > 0 else math.nan


# --------------------------------------------------------------------------- tables
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
    gains: dict[tuple[str, str, float], float] = field(default_factory=dict)


def build_tables(runs: list[CellRun]) -> Tables:
    algorithms = _algorithms(runs)
    pairs = _gain_pairs(algorithms)
    epsilons = _epsilons(runs) or [math.nan]
    accuracy_header = ["setting", "ε", *algorithms] + [
        f"gain Dyn vs Const{f' ({c})' if c else ''}" for c, _, _ in pairs
    ]
    accuracy_rows, gains = [], {}
    for setting in _settings(runs):
        for eps in epsilons:
            filt = {"setting": setting, "epsilon": None if math.isnan(eps) else eps}
            row = [_label(setting), _eps_text(eps)]
            for algorithm in algorithms:
                mean, std, n = mean_final_accuracy(runs, algorithm=algorithm, **filt)
                row.append("—" if n == 0 else f"{100 * mean:.2f} ± {100 * std:.2f} (n={n})")
            for calibration, dyn, const in pairs:
                gain = relative_gain(
                    mean_final_accuracy(runs, algorithm=dyn, **filt)[0],
                    mean_final_accuracy(runs, algorithm=const, **filt)[0],
                )
                gains[(_label(setting), calibration, eps)] = gain
                row.append("—" if math.isnan(gain) else f"{100 * gain:+.1f} %")
            accuracy_rows.append(row)

    privacy_rows, understatement = [], []
    overspend, overspend_by_eps = [], defaultdict(list)
    private = sorted(
        (r for r in runs if r.private),
        key=lambda r: (r.cell, _algorithm_rank(r.algorithm), r.epsilon_target, _natural(r.seed)),
    )
    for r in private:
        ratio = r.epsilon_certified / r.epsilon_clt if r.epsilon_clt > 0 else math.nan
        spent = r.epsilon_certified / r.epsilon_target if r.epsilon_target > 0 else math.nan
        if math.isfinite(ratio):
            understatement.append(ratio)
        if r.calibrated_with == "clt" and math.isfinite(spent):
            overspend.append(spent)
            overspend_by_eps[r.epsilon_target].append(spent)
        privacy_rows.append(
            [
                r.cell,
                r.algorithm,
                str(r.seed),
                _eps_text(r.epsilon_target),
                f"{r.epsilon_clt:.4g}",
                f"{r.epsilon_certified:.4g}",
                f"{ratio:.2f}×" if math.isfinite(ratio) else "—",
                _noise_text(r.noise_entropy),
            ]
        )
    privacy_header = [
        "cell",
        "algorithm",
        "seed",
        "ε target",
        "ε CLT (approx.)",
        "ε certified",
        "certified / CLT",
        "noise",
    ]

    calibration_rows = []
    for algorithm in [a for a in algorithms if a.partition("@")[0] != "sgp"]:
        for eps in _epsilons(runs):
            chosen = _select(runs, algorithm=algorithm, epsilon=eps)
            if not chosen:
                continue
            clt = float(np.nanmean([r.epsilon_clt for r in chosen]))
            cert = np.asarray([r.epsilon_certified for r in chosen], dtype=float)
            calibrated = sorted({r.calibrated_with or "?" for r in chosen})
            calibration_rows.append(
                [
                    algorithm,
                    "/".join(calibrated),
                    f"{eps:g}",
                    f"{clt:.4g}",
                    f"{np.nanmean(cert):.4g} (max {np.nanmax(cert):.4g})",
                    f"{np.nanmax(cert) / eps:.2f}×",
                ]
            )
    calibration_header = [
        "algorithm",
        "calibrated with",
        "ε target",
        "ε CLT (mean)",
        "ε certified spent (mean, max)",
        "max certified / target",
    ]
    return Tables(
        accuracy_header,
        accuracy_rows,
        privacy_header,
        privacy_rows,
        understatement,
        calibration_header,
        calibration_rows,
        overspend,
        dict(overspend_by_eps),
        gains,
    )


# --------------------------------------------------------------------------- claims
def check_claims(runs: list[CellRun]) -> list[tuple[str, str]]:
    """The claims of SPEC §4 against the measured means: [(claim, verdict)]."""
    claims = []
    algorithms = _algorithms(runs)
    epsilons = _epsilons(runs)
    calibrations = sorted({r.calibration for r in runs if r.private}, key=_calibration_rank)
    for calibration in calibrations:
        suffix = f"@{calibration}" if calibration else ""
        name = f" ({calibration} calibration)" if calibration else ""
        dyn = f"dyn-d2p{suffix}"
        if dyn not in algorithms:
            continue
        for other in ("dyn-c-d2p", "dyn-mu-d2p", "const-d2p"):
            rival = f"{other}{suffix}"
            if rival not in algorithms:
                continue
            wins, total = 0, 0
            for setting in _settings(runs):
                for eps in epsilons:
                    a = mean_final_accuracy(runs, setting=setting, algorithm=dyn, epsilon=eps)[0]
                    b = mean_final_accuracy(runs, setting=setting, algorithm=rival, epsilon=eps)[0]
                    if math.isfinite(a) and math.isfinite(b):
                        total += 1
                        wins += a > b
            if total:
                verdict = "held" if wins == total else ("mixed" if wins else "did not hold")
                claims.append(
                    (
                        f"Dyn-D2P > {other} at equal ε{name}",
                        f"{verdict}: higher mean accuracy in {wins} of {total} (setting, ε)",
                    )
                )
        const = f"const-d2p{suffix}"
        if const in algorithms and len(epsilons) > 1:
            verdicts = []
            for setting in _settings(runs):
                gains = [
                    relative_gain(
                        mean_final_accuracy(runs, setting=setting, algorithm=dyn, epsilon=e)[0],
                        mean_final_accuracy(runs, setting=setting, algorithm=const, epsilon=e)[0],
                    )
                    for e in epsilons
                ]
                pts = [(e, g) for e, g in zip(epsilons, gains, strict=True) if math.isfinite(g)]
                if len(pts) > 1:
                    increasing_as_eps_falls = all(
                        g_lo >= g_hi for (_, g_lo), (_, g_hi) in zip(pts, pts[1:], strict=False)
                    )
                    verdicts.append(increasing_as_eps_falls)
                    text = ", ".join(f"ε={e:g}: {100 * g:+.1f} %" for e, g in pts)
            if verdicts:
                held = sum(verdicts)
                claims.append(
                    (
                        f"the Dyn-vs-Const gap grows as ε falls{name}",
                        ("held" if held == len(verdicts) else "did not hold")
                        + f" in {held} of {len(verdicts)} settings"
                        + (f" ({text})" if len(verdicts) == 1 else ""),
                    )
                )
    for key, order, claim in (
        ("topology.name", ["ring", "exp", "complete"], "accuracy ring < exponential < complete"),
        ("topology.nodes", None, "more nodes → better accuracy"),
    ):
        values = sorted({str(r.overrides[key]) for r in runs if key in r.overrides}, key=_natural)
        if order is not None:
            values = [v for v in order if v in values]
        if len(values) < 2:
            continue
        held, total = 0, 0
        for algorithm in [a for a in algorithms if a.partition("@")[0] != "sgp"]:
            for eps in epsilons or [None]:
                means = [
                    np.mean(
                        [
                            r.final_accuracy
                            for r in _select(runs, algorithm=algorithm, epsilon=eps)
                            if str(r.overrides.get(key)) == v
                        ]
                        or [np.nan]
                    )
                    for v in values
                ]
                if all(math.isfinite(m) for m in means):
                    total += 1
                    held += all(a < b for a, b in zip(means, means[1:], strict=False))
        if total:
            claims.append(
                (
                    claim,
                    ("held" if held == total else "did not hold" if held == 0 else "mixed")
                    + f": strictly increasing in {held} of {total} (algorithm, ε)",
                )
            )
    return claims


# --------------------------------------------------------------------------- figures
def _varying(runs: list[CellRun], key: str) -> bool:
    return len({str(r.overrides.get(key)) for r in runs}) > 1


def _key_ending(runs: list[CellRun], leaf: str) -> str | None:
    for key in sorted({k for r in runs for k in r.overrides}):
        if key.rsplit(".", 1)[-1] == leaf and _varying(runs, key):
            return key
    return None


def make_figures(runs: list[CellRun], out_dir: Path) -> list[tuple[str, Path]]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figures: list[tuple[str, Path]] = []
    algorithms = _algorithms(runs)
    epsilons = _epsilons(runs)
    panels_eps = epsilons or [None]
    settings = _settings(runs)
    shown = settings[:MAX_PANELS]
    more = "" if len(settings) <= MAX_PANELS else f" (first {MAX_PANELS} of {len(settings)})"
    # One colour per algorithm; its calibrations share it (CLT dashed/hatched, certified solid).
    bases = sorted({a.partition("@")[0] for a in algorithms}, key=_algorithm_rank)
    colours = {a: f"C{bases.index(a.partition('@')[0]) % 10}" for a in algorithms}

    def style(algorithm: str) -> dict:
        dashed = algorithm.partition("@")[2] == "clt"
        return {"color": colours[algorithm], "linestyle": "--" if dashed else "-"}

    # Accuracy against iteration: one column per ε, one row per setting.
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
            for algorithm in algorithms:
                curves = _select(runs, setting=setting, algorithm=algorithm, epsilon=eps)
                if not curves:
                    continue
                length = min(len(c.accuracy) for c in curves)
                acc = np.mean([c.accuracy[:length] for c in curves], axis=0)
                ax.plot(curves[0].iterations[:length], acc, label=algorithm, **style(algorithm))
            title = f"ε = {eps:g}" if eps is not None else "accuracy"
            ax.set_title(title + (f"\n{_label(setting)}" if len(settings) > 1 else ""), fontsize=9)
            ax.set_xlabel("iteration")
            ax.grid(alpha=0.3)
        axes[row][0].set_ylabel("test accuracy (average model)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    figures.append(
        (
            "Accuracy against iteration, per ε (mean over seeds; dashed: CLT calibration)" + more,
            _save(fig, out_dir / "accuracy_vs_iteration.png"),
        )
    )

    if len(epsilons) > 1:
        fig, axes = plt.subplots(1, len(shown), figsize=(5 * len(shown), 3.8), squeeze=False)
        for ax, setting in zip(axes[0], shown, strict=True):
            for algorithm in algorithms:
                if algorithm.partition("@")[0] == "sgp":
                    mean = mean_final_accuracy(runs, setting=setting, algorithm=algorithm)[0]
                    ax.axhline(mean, color=colours[algorithm], linestyle=":", label=algorithm)
                    continue
                stats = [
                    mean_final_accuracy(runs, setting=setting, algorithm=algorithm, epsilon=e)
                    for e in epsilons
                ]
                xs = [e for e, s in zip(epsilons, stats, strict=True) if s[2]]
                ax.errorbar(
                    xs,
                    [s[0] for s in stats if s[2]],
                    yerr=[s[1] for s in stats if s[2]],
                    marker="o",
                    capsize=3,
                    label=algorithm,
                    **style(algorithm),
                )
            ax.set_xscale("log")
            ax.minorticks_off()
            ax.set_xticks(epsilons, [f"{e:g}" for e in epsilons])
            ax.set_xlabel("target ε")
            ax.set_ylabel("final test accuracy")
            if len(settings) > 1:
                ax.set_title(_label(setting), fontsize=9)
            ax.grid(alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.tight_layout()
        figures.append(
            (
                "Final accuracy against ε (mean ± std over seeds)" + more,
                _save(fig, out_dir / "accuracy_vs_epsilon.png"),
            )
        )

    rho_c, rho_mu = _key_ending(runs, "rho_c"), _key_ending(runs, "rho_mu")
    dyn_labels = [a for a in algorithms if a.partition("@")[0] == "dyn-d2p"]
    if rho_c and rho_mu and dyn_labels:
        cs = sorted({float(r.overrides[rho_c]) for r in runs})
        ms = sorted({float(r.overrides[rho_mu]) for r in runs})
        panels = [(a, e) for a in dyn_labels for e in panels_eps]
        fig, axes = plt.subplots(1, len(panels), figsize=(4.6 * len(panels), 4), squeeze=False)
        for ax, (algorithm, eps) in zip(axes[0], panels, strict=True):
            grid = np.full((len(cs), len(ms)), np.nan)
            for i, c in enumerate(cs):
                for j, m in enumerate(ms):
                    vals = [
                        r.final_accuracy
                        for r in _select(runs, algorithm=algorithm, epsilon=eps)
                        if float(r.overrides[rho_c]) == c and float(r.overrides[rho_mu]) == m
                    ]
                    grid[i, j] = np.mean(vals) if vals else np.nan
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
        figures.append(
            ("Dyn-D2P accuracy over ρ_c × ρ_μ (mean over seeds)", _save(fig, out_dir / "rho.png"))
        )

    for key, title, name in (
        ("topology.name", "Final accuracy by topology", "topologies.png"),
        ("topology.nodes", "Final accuracy by number of nodes", "nodes.png"),
    ):
        if not _varying(runs, key) or not all(key in r.overrides for r in runs):
            continue
        values = sorted({str(r.overrides[key]) for r in runs}, key=_natural)
        if key == "topology.name":
            known = ["ring", "undirected-ring", "exp", "static-exp", "complete"]
            values = sorted(values, key=lambda v: known.index(v) if v in known else 99)
        fig, axes = plt.subplots(
            1, len(panels_eps), figsize=(4.6 * len(panels_eps), 3.6), squeeze=False, sharey=True
        )
        width = 0.8 / max(len(algorithms), 1)
        for ax, eps in zip(axes[0], panels_eps, strict=True):
            for a, algorithm in enumerate(algorithms):
                chosen = _select(runs, algorithm=algorithm, epsilon=eps)
                stats = [
                    [r.final_accuracy for r in chosen if str(r.overrides[key]) == v] or [np.nan]
                    for v in values
                ]
                ax.bar(
                    np.arange(len(values)) + a * width,
                    [np.mean(s) for s in stats],
                    width,
                    yerr=[np.std(s) for s in stats],
                    label=algorithm,
                    color=colours[algorithm],
                    hatch="//" if algorithm.partition("@")[2] == "clt" else None,
                )
            ax.set_xticks(np.arange(len(values)) + 0.4 - width / 2, values)
            ax.set_xlabel(key.rsplit(".", 1)[-1])
            ax.set_title(f"ε = {eps:g}" if eps is not None else "", fontsize=9)
        axes[0][0].set_ylabel("final test accuracy")
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        fig.tight_layout()
        figures.append((title + " (mean ± std over seeds)", _save(fig, out_dir / name)))
    return figures


def _natural(value: str):
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- writing
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


def _noise_text(entropy: str | None) -> str:
    return {"os": "secret (OS entropy)", "seed": "reproducible (entropy = seed)"}.get(
        entropy, "not recorded"
    )


def reproducible_noise_note(runs: list[CellRun]) -> str | None:
    """The sentence that marks runs whose noise was derived from their seed (None: no such run)."""
    seeded = [r for r in runs if r.noise_entropy == "seed"]
    if not seeded:
        return None
    cells = ", ".join(sorted({r.cell for r in seeded}))
    return f"{len(seeded)} of {len(runs)} runs (cells: {cells}) used {REPRODUCIBLE_NOISE_NOTE}."


def _understatement_sentence(ratios: list[float]) -> str:
    if not ratios:
        return "No private run reported both a CLT and a certified ε."
    worst, median = max(ratios), float(np.median(ratios))
    return (
        f"Across all private runs, the CLT approximation (the papers' accounting) understated ε "
        f"by a factor of up to {worst:.2f} (median {median:.2f}) relative to the certified "
        "accountant."
    )


def _overspend_sentence(tables: Tables) -> str:
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


def write_report(sweep_dir: Path, out_dir: Path | None = None) -> dict[str, Path]:
    sweep_dir = Path(sweep_dir)
    out_dir = Path(out_dir or sweep_dir / "report")
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = collect_runs(sweep_dir)
    tables = build_tables(runs)
    figures = make_figures(runs, out_dir)
    claims = check_claims(runs)
    steps = sorted({int(r.iterations[-1]) for r in runs})
    budget = f"{steps[0]} iterations" if len(steps) == 1 else f"{steps[0]}–{steps[-1]} iterations"
    understated = _understatement_sentence(tables.understatement)
    overspend = _overspend_sentence(tables)
    title = f"dpdl report — {sweep_dir.name}"
    intro = (
        f"{len(_settings(runs))} setting(s), {len(runs)} runs, {budget} per run. Final test "
        "accuracy of the network-average model, mean ± std over seeds (%). An algorithm "
        "suffixed @clt is calibrated with the paper's CLT approximation, @pld with the "
        "certified PLD accountant. Gain: relative accuracy of Dyn-D2P over Const-D2P under "
        "the same calibration."
    )
    stopped = [f"{r.cell}: {r.algorithm} seed {r.seed} ε {_eps_text(r.epsilon_target)}"
               for r in runs if r.status != "ok"]  # fmt: skip
    if stopped:
        intro += (
            f" {len(stopped)} run(s) diverged and count with their last evaluated accuracy: "
            + "; ".join(stopped)
            + "."
        )
    claim_rows = [[c, v] for c, v in claims]
    reproducible = reproducible_noise_note(runs)
    md = [
        f"# {title}",
        "",
        intro,
        "",
        *([f"**Note:** {reproducible}", ""] if reproducible else []),
        _markdown_table(tables.accuracy_header, tables.accuracy_rows),
        "",
        "## Privacy: what the CLT calibration really spends",
        "",
        overspend,
        "",
        _markdown_table(tables.calibration_header, tables.calibration_rows),
        "",
        "## The paper's claims (SPEC §4) in this sweep",
        "",
        _markdown_table(["claim", "verdict"], claim_rows) if claims else "No claim applies.",
        "",
        "## Figures",
        "",
    ]
    for caption, path in figures:
        md += [f"### {caption}", "", f"![{caption}]({path.name})", ""]
    md += [
        "## Every run: ε of the CLT approximation beside the certified ε",
        "",
        understated,
        "",
        _markdown_table(tables.privacy_header, tables.privacy_rows),
        "",
    ]
    md_path = out_dir / "report.md"
    md_path.write_text("\n".join(md))

    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title><style>body{{font-family:sans-serif;max-width:1400px;"
        "margin:2em auto}}table{border-collapse:collapse}td,th{border:1px solid #ccc;"
        "padding:4px 8px;text-align:right}th{background:#eee}img{max-width:100%}</style>"
        "</head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{html.escape(intro)}</p>",
        *([f"<p><strong>Note:</strong> {html.escape(reproducible)}</p>"] if reproducible else []),
        _html_table(tables.accuracy_header, tables.accuracy_rows),
        "<h2>Privacy: what the CLT calibration really spends</h2>",
        f"<p>{html.escape(overspend)}</p>",
        _html_table(tables.calibration_header, tables.calibration_rows),
        "<h2>The paper's claims (SPEC §4) in this sweep</h2>",
        _html_table(["claim", "verdict"], claim_rows) if claims else "<p>No claim applies.</p>",
        "<h2>Figures</h2>",
    ]
    for caption, path in figures:
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(
            f"<h3>{html.escape(caption)}</h3><img alt='{html.escape(caption)}' "
            f"src='data:image/png;base64,{data}'>"
        )
    parts += [
        "<h2>Every run: ε of the CLT approximation beside the certified ε</h2>",
        f"<p>{html.escape(understated)}</p>",
        _html_table(tables.privacy_header, tables.privacy_rows),
        "</body></html>",
    ]
    html_path = out_dir / "report.html"
    html_path.write_text("\n".join(parts))
    return {"markdown": md_path, "html": html_path}
