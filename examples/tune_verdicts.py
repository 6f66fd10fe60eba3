"""Issue 23's tables from a tuning folder (``dpdl tune --preset tune-table2``): the selection
grid of every candidate, the test seeds at the picks and at the untuned settings, and the
seed-paired verdicts of MATH.md §4's claims against the *tuned* baselines.

    dpdl tune --preset tune-table2 --output DIR --report     # tune.json of what DIR holds
    python examples/tune_verdicts.py DIR [--csv-prefix docs/results/tune-table2]

Writes PREFIX-selection.csv (one row per selection run: its validation accuracy) and
PREFIX-test.csv (one row per test run), and prints the Markdown tables of docs/RESULTS.md §5.
Every comparison pairs the test seeds (the same data split and initial model per seed) through
dpdl.experiments.paired.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

# (first, second, what the comparison answers); names are the tune preset's
TUNED_PAIRS = [
    ("dyn", "const", "Dyn-D2P > Const-D2P (tuned against tuned)"),
    ("dyn-c", "const", "Dyn[C]-D2P > Const-D2P"),
    ("dyn-mu", "const", "Dyn[μ]-D2P > Const-D2P"),
    ("dyn", "dyn-c", "Dyn-D2P > Dyn[C]-D2P"),
    ("dyn", "dyn-mu", "Dyn-D2P > Dyn[μ]-D2P"),
    ("dyn-c", "dyn-mu", "Dyn[C]-D2P > Dyn[μ]-D2P"),
    ("dyn-c", "const-lr-decay", "dynamic clipping beyond a clip-shaped step-size decay"),
    ("const-lr-decay", "const", "step-size decay alone against Const-D2P"),
    ("dyn", "const-lr-decay", "Dyn-D2P beyond a clip-shaped step-size decay"),
]
UNTUNED_PAIRS = [
    ("dyn", "const", "Dyn-D2P > Const-D2P, untuned (Table 2's settings)"),
    ("dyn-c", "const", "Dyn[C]-D2P > Const-D2P, untuned"),
    ("dyn-mu", "const", "Dyn[μ]-D2P > Const-D2P, untuned"),
]
MIXED_PAIRS = [
    (("const", "tuned"), ("const", "untuned"), "what tuning gives Const-D2P"),
    (("dyn", "tuned"), ("dyn", "untuned"), "what tuning gives Dyn-D2P"),
    (("dyn-c", "tuned"), ("dyn-c", "untuned"), "what tuning gives Dyn[C]-D2P"),
    (("dyn-mu", "tuned"), ("dyn-mu", "untuned"), "what tuning gives Dyn[μ]-D2P"),
    (("dyn", "tuned"), ("const", "untuned"), "Dyn-D2P tuned against the untuned baseline"),
    (("dyn", "untuned"), ("const", "tuned"), "Table 2's Dyn-D2P against the tuned baseline"),
    (("dyn-c", "untuned"), ("const", "tuned"), "Table 2's Dyn[C]-D2P against the tuned baseline"),
]
HEADLINES = [(0.39, "the paper's +39 % at ε = 0.3"), (0.168, "our earlier +16.8 % at ε = 0.3")]


def label(name: str, kind: str) -> str:
    return f"{name.removesuffix('-untuned')} ({kind})"


def test_rows(summary: dict) -> list[dict]:
    return [{"algorithm": label(t["name"], t["kind"]), "setting": "test seeds",
             "seed": t["seed"], "epsilon_target": float(t["epsilon"]), "status": t["status"],
             "test_accuracy": t["test_accuracy"], "epsilon_certified": t["epsilon_certified"],
             "settings": t["settings"]} for t in summary["tests"]]  # fmt: skip


def selection_table(name: str, entry: dict) -> list[str]:
    epsilons = list(entry["by_epsilon"])
    lines = [f"**{name}** ({entry['algorithm']}, {entry['points']} points"
             + (f"; fixed {entry['fixed']}" if entry["fixed"] else "") + ")", "",
             "| point | " + " | ".join(f"ε = {e}" for e in epsilons) + " |",
             "|---|" + "---|" * len(epsilons)]  # fmt: skip
    points = [row["point"] for row in entry["by_epsilon"][epsilons[0]]["table"]]
    for k, point in enumerate(points):
        cells = []
        for eps in epsilons:
            by = entry["by_epsilon"][eps]
            row = by["table"][k]
            text = "–" if not row["complete"] else f"{row['mean']:.3f} ± {row['std']:.3f}"
            cells.append(f"**{text}**" if by["pick"] == point else text)
        name_text = ", ".join(f"{key.rsplit('.', 1)[-1]} {value}" for key, value in point.items())
        lines.append(f"| {name_text} | " + " | ".join(cells) + " |")
    return lines + [""]


def comparison_lines(rows: list[dict]) -> list[str]:
    from dpdl.experiments.paired import gap_change, paired

    lines = ["| comparison | what it answers | ε | seeds | Δ (points) | 95 % interval | "
             "relative [95 %] | verdict |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def add(a: str, b: str, what: str) -> None:
        for c in paired(rows, a, b):
            low, high = c.relative_interval
            rel = (f"{100 * c.relative_mean:+.1f} % [{100 * low:+.1f}, {100 * high:+.1f}]"
                   if math.isfinite(low) else "–")  # fmt: skip
            lines.append(f"| {a} vs {b} | {what} | {c.epsilon:g} | {len(c.seeds)} | "
                         f"{100 * c.mean:+.1f} | [{100 * c.low:+.1f}, {100 * c.high:+.1f}] | "
                         f"{rel} | {c.verdict} |")  # fmt: skip

    for a, b, what in TUNED_PAIRS:
        add(label(a, "tuned"), label(b, "tuned"), what)
    for a, b, what in UNTUNED_PAIRS:
        add(label(a, "untuned"), label(b, "untuned"), what)
    for a, b, what in MIXED_PAIRS:
        add(label(*a), label(*b), what)
    lines += ["", "The gap as ε falls (per seed: the gap at ε = 0.3 minus the gap at ε = 1; "
              "above zero: it grows):", "",
              "| gap | seeds | change (points) | 95 % interval | verdict |",
              "|---|---|---|---|---|"]  # fmt: skip
    for kind in ("tuned", "untuned"):
        for a, b in (("dyn", "const"), ("dyn-c", "const"), ("dyn-mu", "const")):
            for c in gap_change(rows, label(a, kind), label(b, kind)):
                lines.append(f"| {label(a, kind)} − {label(b, kind)} | {len(c.seeds)} | "
                             f"{100 * c.mean:+.1f} | [{100 * c.low:+.1f}, {100 * c.high:+.1f}] "
                             f"| {c.verdict} |")  # fmt: skip
    return lines


def headline_lines(rows: list[dict]) -> list[str]:
    """Does a relative gain of Dyn-D2P over Const-D2P at ε = 0.3 lie inside the interval of
    the measured relative gains, above it or below it?"""
    from dpdl.experiments.paired import paired

    lines = []
    for dyn, baseline in (("tuned", "tuned"), ("untuned", "tuned"), ("tuned", "untuned"),
                          ("untuned", "untuned")):
        for c in paired(rows, label("dyn", dyn), label("const", baseline)):
            if c.epsilon != 0.3:
                continue
            low, high = c.relative_interval
            for gain, what in HEADLINES:
                if not math.isfinite(low):
                    verdict = "inconclusive"
                elif high < gain:
                    verdict = "does not hold (the interval lies below it)"
                elif low > gain:
                    verdict = "exceeded (the interval lies above it)"
                else:
                    verdict = "holds (inside the interval)"
                lines.append(f"- {what}, Dyn-D2P ({dyn}) against Const-D2P ({baseline}): measured "
                             f"{100 * c.relative_mean:+.1f} % [{100 * low:+.1f}, "
                             f"{100 * high:+.1f}] over {len(c.seeds)} seeds: "
                             f"{verdict}")  # fmt: skip
    return lines


def write_csvs(folder: Path, summary: dict, prefix: Path) -> None:
    from dpdl.experiments.tune import sweep_runs

    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{prefix}-selection.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["candidate", "algorithm", "point", "epsilon", "seed", "status",
                         "val_accuracy", "epsilon_certified", "picked"])  # fmt: skip
        for name, entry in summary["candidates"].items():
            for run in sweep_runs(folder / "select" / name, summary["metric"]):
                by = entry["by_epsilon"].get(f"{run['epsilon']:g}", {})
                final = all(row["complete"] for row in by.get("table", []))  # else no pick yet
                writer.writerow([name, entry["algorithm"], json.dumps(run["overrides"],
                                 sort_keys=True), run["epsilon"], run["seed"], run["status"],
                                 run["value"], run["epsilon_certified"],
                                 final and by.get("pick") == run["overrides"]])  # fmt: skip
    with open(f"{prefix}-test.csv", "w", newline="") as fh:
        fields = ["algorithm", "settings", "epsilon_target", "seed", "status", "test_accuracy",
                  "epsilon_certified"]  # fmt: skip
        writer = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(test_rows(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a tuning folder holding tune.json")
    parser.add_argument("--csv-prefix", type=Path, help="write PREFIX-selection.csv, -test.csv")
    args = parser.parse_args()
    summary = json.loads((args.folder / "tune.json").read_text())
    if args.csv_prefix:
        write_csvs(args.folder, summary, args.csv_prefix)
    print("## Selection (validation accuracy, mean ± std over the selection seeds; bold: the "
          "pick)\n")
    for name, entry in summary["candidates"].items():
        print("\n".join(selection_table(name, entry)))
    rows = test_rows(summary)
    if rows:
        from dpdl.experiments.paired import markdown_summary, summarize

        print("## Test seeds (test accuracy)\n")
        print(markdown_summary(summarize(rows)))
        print("\n## Seed-paired comparisons\n")
        print("\n".join(comparison_lines(rows)))
        print("\n## The headline\n")
        print("\n".join(headline_lines(rows)))


if __name__ == "__main__":
    main()
