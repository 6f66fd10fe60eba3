"""Per-run tables and seed-paired comparisons of a sweep (docs/RESULTS.md).

Runs of one seed share the data split and the initial model (public randomness), so the fair
test of "A beats B" pairs them by seed: the per-seed difference of final accuracies, its
mean and a two-sided 95 % Student-t interval.  A claim *held* when the interval lies above
zero, *did not hold* when it lies below, and is *inconclusive* otherwise (or with one seed).

    python -m dpdl.experiments.paired SWEEP_DIR --csv OUT.csv [--pair A B] [--metric M]
        [--by algorithm|setting]
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from dpdl.errors import require
from dpdl.experiments.report import CellRun, collect_runs, read_metrics

RUN_COLUMNS = (
    "algorithm", "seed", "epsilon_target", "calibration", "setting", "status", "steps",
    "test_accuracy", "val_accuracy", "train_loss", "epsilon_clt", "epsilon_certified",
)  # fmt: skip


def _setting_text(run: CellRun) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in run.setting)


def _final_metric(run: CellRun, metric: str, cache: dict) -> float:
    if metric == "test_accuracy":
        return run.final_accuracy
    if metric == "train_loss":
        return float(run.loss[-1])
    path = run.extra.get("metrics_path")
    if path is None:
        return math.nan
    if path not in cache:
        cache[path] = read_metrics(Path(path))
    key = next(
        (k for k in cache[path] if k[0] == run.algorithm and k[1] == run.seed
         and (k[2] == run.epsilon_target or (math.isnan(k[2]) and math.isnan(run.epsilon_target)))),
        None,
    )  # fmt: skip
    values = cache[path].get(key, {}).get(metric) if key else None
    return float(values[-1]) if values else math.nan


def run_rows(sweep_dir: Path) -> list[dict]:
    """One row per run (algorithm x seed x target epsilon x setting) with its final numbers."""
    runs = collect_runs(Path(sweep_dir))
    _attach_metrics_paths(Path(sweep_dir), runs)
    cache: dict = {}
    rows = []
    for run in runs:
        rows.append(
            {
                "algorithm": run.algorithm,
                "seed": run.seed,
                "epsilon_target": run.epsilon_target,
                "calibration": run.calibration or (run.calibrated_with or ""),
                "setting": _setting_text(run),
                "status": run.status,
                "steps": int(run.iterations[-1]),
                "test_accuracy": run.final_accuracy,
                "val_accuracy": _final_metric(run, "val_accuracy", cache),
                "train_loss": float(run.loss[-1]),
                "epsilon_clt": run.epsilon_clt,
                "epsilon_certified": run.epsilon_certified,
            }
        )
    return rows


def _attach_metrics_paths(sweep_dir: Path, runs: list[CellRun]) -> None:
    by_cell = {}
    for run in runs:
        if run.cell not in by_cell:
            found = sorted((sweep_dir / "cells" / run.cell).rglob("metrics.csv"))
            by_cell[run.cell] = found[0] if found else None
        if by_cell[run.cell] is not None:
            run.extra["metrics_path"] = str(by_cell[run.cell])


def write_csv(rows: list[dict], path: Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=RUN_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v)
                             for k, v in row.items()})  # fmt: skip
    return path


@dataclass(frozen=True)
class PairedComparison:
    a: str
    b: str
    epsilon: float
    setting: str
    seeds: tuple[str, ...]
    differences: tuple[float, ...]  # a - b per seed (accuracy points)
    relative: tuple[float, ...]  # a / b - 1 per seed
    mean: float
    low: float
    high: float
    relative_mean: float

    @property
    def verdict(self) -> str:
        if len(self.seeds) < 2 or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "inconclusive"
        if self.low > 0:
            return "held"
        if self.high < 0:
            return "did not hold"
        return "inconclusive"


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval of ``values`` (NaN bounds for fewer than two)."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return mean, mean - half, mean + half


def paired(
    rows: list[dict],
    a: str,
    b: str,
    *,
    metric: str = "test_accuracy",
    by: str = "algorithm",
    confidence: float = 0.95,
) -> list[PairedComparison]:
    """``a`` against ``b`` (two values of the column ``by``: algorithms, or settings of one
    algorithm), paired by seed, for every (other column, epsilon) holding both."""
    require(by in ("algorithm", "setting"), f"pair by 'algorithm' or 'setting', not {by!r}")
    other = "setting" if by == "algorithm" else "algorithm"
    table: dict[tuple, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in rows:
        if row["status"] != "ok" or row[by] not in (a, b):
            continue
        eps = row["epsilon_target"]
        table[(row[other], eps)][row["seed"]][row[by]] = float(row[metric])
    out = []
    for (group, eps), seeds in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        both = sorted(s for s, v in seeds.items() if a in v and b in v and
                      all(math.isfinite(x) for x in v.values()))  # fmt: skip
        if not both:
            continue
        diffs = [seeds[s][a] - seeds[s][b] for s in both]
        rel = [seeds[s][a] / seeds[s][b] - 1 if seeds[s][b] > 0 else math.nan for s in both]
        mean, low, high = t_interval(diffs, confidence)
        out.append(
            PairedComparison(a, b, eps, group, tuple(both), tuple(diffs), tuple(rel),
                             mean, low, high, float(np.nanmean(rel)))  # fmt: skip
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--csv", type=Path, help="write one row per run here")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"))
    parser.add_argument("--metric", default="test_accuracy")
    parser.add_argument("--by", default="algorithm", choices=("algorithm", "setting"),
                        help="what A and B name: two algorithms, or two settings")
    args = parser.parse_args(argv)
    rows = run_rows(args.sweep_dir)
    if args.csv:
        print(f"wrote {write_csv(rows, args.csv)} ({len(rows)} runs)")
    for a, b in args.pair:
        for c in paired(rows, a, b, metric=args.metric, by=args.by):
            print(
                f"{a} - {b} [{c.setting or 'base'}] eps={c.epsilon:g}: {100 * c.mean:+.2f} points "
                f"[{100 * c.low:+.2f}, {100 * c.high:+.2f}] (95 % t, {len(c.seeds)} seeds), "
                f"relative {100 * c.relative_mean:+.1f} %: {c.verdict}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
