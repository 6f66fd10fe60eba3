"""Per-run tables and seed-paired comparisons of a sweep (docs/RESULTS.md).

Runs of one seed share the data split and the initial model (public randomness), so the fair
test of "A beats B" pairs them by seed: the per-seed difference of final accuracies, its
mean and a two-sided 95 % Student-t interval.  A claim *held* when the interval lies above
zero, *did not hold* when it lies below, and is *inconclusive* otherwise (or with one seed).

    python -m dpdl.experiments.paired SWEEP_DIR [SWEEP_DIR ...] --csv OUT.csv [--pair A B]
        [--gap-change A B] [--metric M] [--by algorithm|setting] [--setting-keys KEY ...]
        [--algorithm LABEL ...] [--epsilon EPS ...] [--summary] [--markdown] [--plot PNG]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpdl.errors import require
from dpdl.experiments.intervals import t_interval
from dpdl.experiments.report import CellRun, collect_runs, declared_pairs, read_metrics

# What --metric may compare: final numbers of a run's metrics.csv, read into its row (a
# column the run did not write, e.g. val_* without validation records, reads as NaN and the
# run drops out of the comparison).  Per-node numbers: the nodes' own de-biased models on the
# test (node_*) or validation (val_node_*) records, their mean and their worst node.
PAIRED_METRICS = (
    "test_accuracy", "val_accuracy", "test_loss", "node_accuracy_mean", "node_accuracy_worst",
    "val_node_accuracy_mean", "val_node_accuracy_worst",
)  # fmt: skip
# what the mixer counted: the mean over nodes of the messages and bytes each sent in the run
COMMUNICATION_COLUMNS = ("messages_per_node", "bytes_per_node")
RUN_COLUMNS = (
    "algorithm", "seed", "epsilon_target", "calibration", "setting", "status", "steps",
    *PAIRED_METRICS, "epsilon_clt", "epsilon_certified", *COMMUNICATION_COLUMNS,
    "train_seconds",
)  # fmt: skip


def check_metric(metric: str) -> str:
    """``metric`` if --metric may compare it, else a one-line error naming the choices."""
    require(metric in PAIRED_METRICS,
            f"--metric {metric!r} is not a run's final number; choose one of "
            f"{', '.join(PAIRED_METRICS)}")  # fmt: skip
    return metric


def _short(key: str) -> str:
    return key.rsplit(".", 1)[-1]


def _setting_text(run: CellRun, setting_keys: tuple[str, ...] | None, configs: dict) -> str:
    """The grid point of ``run`` (its overrides), or, with ``setting_keys``, those keys' values
    read from the run's own config.json: the way to compare runs of different sweeps, whose
    grids name different keys. ``configs`` caches each run folder's config (several runs
    share one folder)."""
    if not setting_keys:
        return " ".join(f"{_short(k)}={v}" for k, v in run.setting)
    path = Path(run.extra["metrics_path"]).with_name("config.json")
    if path not in configs:
        configs[path] = json.loads(path.read_text())
    config = configs[path]
    parts = []
    for key in setting_keys:
        value: Any = config
        for part in key.split("."):
            require(
                isinstance(value, dict) and part in value,
                f"setting key {key!r} is not in {run.extra['metrics_path']}'s config.json",
            )
            value = value[part]
        parts.append(f"{_short(key)}={value}")
    return " ".join(parts)


def _final_metric(run: CellRun, metric: str, cache: dict) -> float:
    if metric == "test_accuracy":
        return run.final_accuracy
    if metric == "test_loss":
        return float(run.loss[-1])
    path = run.extra["metrics_path"]
    if path not in cache:
        cache[path] = read_metrics(Path(path))
    key = next(
        (k for k in cache[path] if k[0] == run.algorithm and k[1] == run.seed
         and (k[2] == run.epsilon_target or (math.isnan(k[2]) and math.isnan(run.epsilon_target)))),
        None,
    )  # fmt: skip
    values = cache[path].get(key, {}).get(metric) if key else None
    return float(values[-1]) if values else math.nan


def run_rows(sweep_dir: Path, setting_keys: tuple[str, ...] | None = None) -> list[dict]:
    """One row per run (algorithm x seed x target epsilon x setting) with its final numbers."""
    runs = collect_runs(Path(sweep_dir))
    cache: dict = {}
    configs: dict = {}
    rows = []
    for run in runs:
        rows.append(
            {
                "algorithm": run.algorithm,
                "seed": run.seed,
                "epsilon_target": run.epsilon_target,
                "calibration": run.calibration or (run.calibrated_with or ""),
                "setting": _setting_text(run, setting_keys, configs),
                "status": run.status,
                "steps": int(run.iterations[-1]),
                **{metric: _final_metric(run, metric, cache) for metric in PAIRED_METRICS},
                "epsilon_clt": run.epsilon_clt,
                "epsilon_certified": run.epsilon_certified,
                **{column: _final_metric(run, column, cache) for column in COMMUNICATION_COLUMNS},
                "train_seconds": run.extra["train_seconds"],
            }
        )
    return rows


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
    def relative_interval(self) -> tuple[float, float]:
        """The t-interval of the per-seed relative gains ``a / b - 1``."""
        rel = [r for r in self.relative if math.isfinite(r)]
        return t_interval(rel)[1:] if len(rel) == len(self.relative) else (math.nan, math.nan)

    @property
    def verdict(self) -> str:
        if len(self.seeds) < 2 or not (math.isfinite(self.low) and math.isfinite(self.high)):
            return "inconclusive"
        if self.low > 0:
            return "held"
        if self.high < 0:
            return "did not hold"
        return "inconclusive"


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
    check_metric(metric)
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


@dataclass(frozen=True)
class GroupSummary:
    """The runs of one (algorithm, setting, ε) over seeds."""

    algorithm: str
    setting: str
    epsilon: float
    seeds: tuple[str, ...]
    values: tuple[float, ...]
    mean: float
    low: float
    high: float
    epsilon_certified: float  # the largest certified ε any of the runs spent


def summarize(
    rows: list[dict], *, metric: str = "test_accuracy", confidence: float = 0.95
) -> list[GroupSummary]:
    """Mean and t-interval of ``metric`` per (algorithm, setting, target ε), finished runs only."""
    check_metric(metric)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        if row["status"] == "ok" and math.isfinite(float(row[metric])):
            eps = float(row["epsilon_target"])
            groups[(row["algorithm"], row["setting"], None if math.isnan(eps) else eps)].append(row)
    out = []
    for (algorithm, setting, eps), members in groups.items():
        members.sort(key=lambda r: r["seed"])
        values = [float(r[metric]) for r in members]
        mean, low, high = t_interval(values, confidence)
        spent = [float(r["epsilon_certified"]) for r in members]
        out.append(
            GroupSummary(algorithm, setting, math.nan if eps is None else eps,
                         tuple(r["seed"] for r in members), tuple(values), mean, low, high,
                         max(spent) if all(math.isfinite(x) for x in spent) else math.nan)
        )  # fmt: skip
    return out


def gap_change(
    rows: list[dict],
    a: str,
    b: str,
    *,
    metric: str = "test_accuracy",
    by: str = "algorithm",
    confidence: float = 0.95,
) -> list[PairedComparison]:
    """How the gap ``a - b`` changes as ε falls: per seed, the gap at the smallest target ε
    minus the gap at the largest, with its t-interval, per group holding both ε.  Above zero:
    the gap grows as ε falls.  ``epsilon`` of the result is the smallest ε."""
    by_group: dict[str, dict[float, dict[str, float]]] = defaultdict(dict)
    for c in paired(rows, a, b, metric=metric, by=by, confidence=confidence):
        by_group[c.setting][c.epsilon] = dict(zip(c.seeds, c.differences, strict=True))
    out = []
    for group, gaps in sorted(by_group.items()):
        if len(gaps) < 2:
            continue
        small, large = min(gaps), max(gaps)
        seeds = sorted(set(gaps[small]) & set(gaps[large]))
        if not seeds:
            continue
        diffs = [gaps[small][s] - gaps[large][s] for s in seeds]
        mean, low, high = t_interval(diffs, confidence)
        out.append(
            PairedComparison(f"{a} - {b} at eps={small:g}", f"at eps={large:g}", small, group,
                             tuple(seeds), tuple(diffs), (), mean, low, high, math.nan)
        )  # fmt: skip
    return out


def _points(x: float) -> str:
    return f"{100 * x:+.1f}"


def markdown_summary(groups: list[GroupSummary]) -> str:
    lines = [
        "| algorithm | setting | ε | seeds | mean (%) | 95 % t-interval | per seed (%) "
        "| certified ε |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in sorted(groups, key=lambda g: (g.setting, g.epsilon if g.epsilon == g.epsilon else -1,
                                           g.algorithm)):  # fmt: skip
        eps = "–" if math.isnan(g.epsilon) else f"{g.epsilon:g}"
        spent = "–" if math.isnan(g.epsilon_certified) else f"{g.epsilon_certified:.3f}"
        per_seed = ", ".join(f"{100 * v:.1f}" for v in g.values)
        interval = f"[{100 * g.low:.1f}, {100 * g.high:.1f}]" if math.isfinite(g.low) else "–"
        lines.append(
            f"| {g.algorithm} | {g.setting or '–'} | {eps} | {len(g.seeds)} | "
            f"{100 * g.mean:.1f} | {interval} | {per_seed} | {spent} |"
        )
    return "\n".join(lines)


def markdown_comparisons(comparisons: list[PairedComparison]) -> str:
    lines = [
        "| comparison | group | ε | seeds | Δ (points) | 95 % t-interval | relative "
        "(95 % t-interval) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in comparisons:
        relative = "–" if math.isnan(c.relative_mean) else f"{100 * c.relative_mean:+.1f} %"
        low, high = c.relative_interval
        if math.isfinite(low):
            relative += f" [{100 * low:+.1f}, {100 * high:+.1f}]"
        interval = f"[{_points(c.low)}, {_points(c.high)}]" if math.isfinite(c.low) else "–"
        lines.append(
            f"| {c.a} vs {c.b} | {c.setting or '–'} | {c.epsilon:g} | {len(c.seeds)} | "
            f"{_points(c.mean)} | {interval} | {relative} | {c.verdict} |"
        )
    return "\n".join(lines)


def plot_summary(groups: list[GroupSummary], path: Path, *, metric: str = "test_accuracy") -> Path:
    """One panel per setting on a shared scale, target ε along x: each algorithm's mean over
    seeds with its 95 % t-interval and every seed as a dot.  Points, not bars: the axis starts
    where the data do.  PNG (200 dpi) with its PDF and SVG (:mod:`dpdl.plotting`)."""
    from dpdl.plotting import PALETTE, paper_style

    require(bool(groups), "nothing to plot")
    with paper_style():
        return _plot_groups(groups, Path(path), metric, PALETTE)


def _setting_display(setting: str) -> str:
    """A row's setting ("name=ring nodes=16") as a figure says it ("ring, 16 nodes")."""
    from dpdl.experiments.report.grouping import KEY_NAMES

    parts = []
    for item in setting.split():
        key, _, value = item.partition("=")
        if key == "name":
            parts.append(value)
        elif key == "nodes":
            parts.append(f"{value} nodes")
        else:
            parts.append(f"{KEY_NAMES.get(key, key)} = {value}")
    return ", ".join(parts)


def _plot_groups(groups: list[GroupSummary], path: Path, metric: str, palette) -> Path:
    from dpdl.accounting.certified import approximate_accountant
    from dpdl.experiments.report.grouping import algorithm_rank, display_label
    from dpdl.plotting import legend_outside, pyplot, save_figure

    settings = sorted({g.setting for g in groups})
    epsilons = sorted({g.epsilon for g in groups if not math.isnan(g.epsilon)})
    slots = ["non-private"] * any(math.isnan(g.epsilon) for g in groups) + [
        f"ε = {e:g}" for e in epsilons]  # fmt: skip
    algorithms = sorted({g.algorithm for g in groups}, key=algorithm_rank)
    families = sorted({a.partition("@")[0] for a in algorithms}, key=algorithm_rank)
    width = 0.7 / len(algorithms)
    panel = max(2.6, 0.2 * len(slots) * len(algorithms))
    fig, axes = pyplot().subplots(1, len(settings), squeeze=False, sharey=True,
                                  figsize=(panel * len(settings) + 1.8, 2.8),
                                  layout="constrained")  # fmt: skip
    for ax, setting in zip(axes[0], settings, strict=True):
        for g in (g for g in groups if g.setting == setting):
            a = algorithms.index(g.algorithm)
            slot = "non-private" if math.isnan(g.epsilon) else f"ε = {g.epsilon:g}"
            x = slots.index(slot) + (a - (len(algorithms) - 1) / 2) * width
            # a family's colour; hollow for an approximate calibration (the CLT)
            name, _, calibration = g.algorithm.partition("@")
            colour = palette[families.index(name) % len(palette)]
            face = "white" if approximate_accountant(calibration) else colour
            err = None
            if math.isfinite(g.low):
                err = [[100 * (g.mean - g.low)], [100 * (g.high - g.mean)]]
            ax.errorbar([x], [100 * g.mean], yerr=err, fmt="o", capsize=2.5, color=colour,
                        markerfacecolor=face, label=display_label(g.algorithm))  # fmt: skip
            ax.plot([x] * len(g.values), [100 * v for v in g.values], ".", color=colour,
                    alpha=0.45, markersize=3)  # fmt: skip
        ax.set_xticks(range(len(slots)), slots)
        ax.grid(False, axis="x")
        if setting:
            ax.set_title(_setting_display(setting))
    axes[0][0].set_ylabel(f"{metric.replace('_', ' ')} (%)")
    legend_outside(fig, axes[0], title="mean, 95 % t-interval\n(dots: seeds)")
    return save_figure(fig, path)


def _pairs(args) -> list[tuple[str, str]]:
    """What to compare: ``--pair`` when given; else, comparing algorithms with nothing else
    asked (no --gap-change), the pairs the sweeps declared ([report] pairs, in order, each
    once); else none."""
    if args.pair or args.gap_change or args.by != "algorithm":
        return [tuple(pair) for pair in args.pair]
    pairs: list[tuple[str, str]] = []
    for sweep_dir in args.sweep_dirs:
        pairs += [p for p in declared_pairs(sweep_dir) or [] if p not in pairs]
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sweep_dirs", type=Path, nargs="+", metavar="SWEEP_DIR",
                        help="one or more sweep folders, read as one table")  # fmt: skip
    parser.add_argument("--csv", type=Path, help="write one row per run here")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("A", "B"),
                        help="compare A - B, paired by seed (repeat the flag); default: the "
                             "pairs the sweep's [report] table declares")  # fmt: skip
    parser.add_argument(
        "--gap-change", nargs=2, action="append", default=[], metavar=("A", "B"),
        help="does the gap A - B grow as epsilon falls (paired by seed)",
    )  # fmt: skip
    parser.add_argument("--metric", default="test_accuracy",
                        help=f"what to compare: one of {', '.join(PAIRED_METRICS)}")
    parser.add_argument("--by", default="algorithm", choices=("algorithm", "setting"),
                        help="what A and B name: two algorithms, or two settings")
    parser.add_argument("--setting-keys", nargs="+", metavar="KEY",
                        help="name each run's setting by these dotted config keys (read from "
                             "its config.json) instead of its sweep's grid")  # fmt: skip
    parser.add_argument("--algorithm", action="append", default=[], metavar="LABEL",
                        help="keep only these algorithms' runs (repeat the flag)")  # fmt: skip
    parser.add_argument("--epsilon", action="append", default=[], type=float, metavar="EPS",
                        help="keep only the runs of these target epsilons (repeat it)")  # fmt: skip
    parser.add_argument("--summary", action="store_true",
                        help="mean and t-interval per algorithm, setting and epsilon")
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="bar chart of the summary (mean, interval, seeds) to this file")
    args = parser.parse_args(argv)
    check_metric(args.metric)  # before any run folder is read
    require(args.plot is None or args.plot.suffix.lower() == ".png",
            f"--plot names the PNG (its PDF and SVG are written beside it), got "
            f"{str(args.plot)!r}")  # fmt: skip
    keys = tuple(args.setting_keys) if args.setting_keys else None
    rows = [row for d in args.sweep_dirs for row in run_rows(d, keys)]
    if args.algorithm:
        rows = [row for row in rows if row["algorithm"] in args.algorithm]
    if args.epsilon:
        rows = [row for row in rows
                if any(math.isclose(row["epsilon_target"], e) for e in args.epsilon)]  # fmt: skip
    require(bool(rows), "no run left after --algorithm / --epsilon")
    if args.csv:
        print(f"wrote {write_csv(rows, args.csv)} ({len(rows)} runs)")
    groups = summarize(rows, metric=args.metric) if args.plot or args.summary else []
    if args.plot:
        print(f"wrote {plot_summary(groups, args.plot, metric=args.metric)}")
    if args.summary:
        if args.markdown:
            print(markdown_summary(groups))
        else:
            for g in groups:
                print(f"{g.algorithm} [{g.setting or 'base'}] eps={g.epsilon:g}: "
                      f"{100 * g.mean:.2f} [{100 * g.low:.2f}, {100 * g.high:.2f}] "
                      f"({len(g.seeds)} seeds)")  # fmt: skip
    comparisons = [c for a, b in _pairs(args)
                   for c in paired(rows, a, b, metric=args.metric, by=args.by)]  # fmt: skip
    comparisons += [c for a, b in args.gap_change
                    for c in gap_change(rows, a, b, metric=args.metric, by=args.by)]  # fmt: skip
    if args.markdown and comparisons:
        if args.summary:
            print()  # two Markdown tables need a blank line between them
        print(markdown_comparisons(comparisons))
    elif comparisons:
        for c in comparisons:
            print(
                f"{c.a} - {c.b} [{c.setting or 'base'}] eps={c.epsilon:g}: "
                f"{_points(c.mean)} points [{_points(c.low)}, {_points(c.high)}] "
                f"(95 % t, {len(c.seeds)} seeds)"
                + ("" if math.isnan(c.relative_mean) else
                   f", relative {100 * c.relative_mean:+.1f} %")  # fmt: skip
                + f": {c.verdict}"
            )
    return 0


if __name__ == "__main__":
    import sys

    from dpdl.errors import DPDLError

    try:
        raise SystemExit(main())
    except DPDLError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
