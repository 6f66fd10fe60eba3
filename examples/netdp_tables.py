"""The tables of docs/results/netdp.md from a netdp-logreg run folder (issue 28, claim 1): the
selection table of every step size, the test accuracy at the picks, and the seed-paired
comparisons of the approaches (``results.json["comparisons"]``).

    python examples/netdp_tables.py RUN_DIR [--csv docs/results/netdp-figure2.csv]

The CSV has one row per test run: approach, ε, seed, step size, σ, final test accuracy and loss.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def _eps(value) -> str:
    return "—" if value in (None, "-", "") else f"{float(value):g}"


def selection_table(run: Path) -> str:
    with open(run / "selection.csv") as fh:
        rows = list(csv.DictReader(fh))
    grid = sorted({float(r["lr"]) for r in rows})
    cells = defaultdict(dict)
    for r in rows:
        mark = "**" if r["picked"] == "True" else ""
        cells[(r["approach"], _eps(r["epsilon"]))][float(r["lr"])] = (
            f"{mark}{float(r['val_accuracy_mean']):.3f}{mark}")
    lines = ["| approach | ε | " + " | ".join(f"{g:g}" for g in grid) + " |",
             "|---|---|" + "---|" * len(grid)]
    for (approach, eps), by_lr in cells.items():
        lines.append(f"| {approach} | {eps} | "
                     + " | ".join(by_lr.get(g, "") for g in grid) + " |")
    return "\n".join(lines)


def test_table(results: dict) -> str:
    groups = defaultdict(list)
    for c in results["cells"]:
        groups[(c["approach"], c["epsilon"])].append(c)
    lines = ["| approach | ε | η (picked) | σ | test accuracy | test loss | seeds |",
             "|---|---|---|---|---|---|---|"]
    for (approach, eps), cs in groups.items():
        acc = [c["test_accuracy"] for c in cs]
        sigma = cs[0]["sigma"]
        lines.append(f"| {approach} | {_eps(eps)} | {cs[0]['lr']:g} | "
                     f"{'withheld' if sigma is None else f'{sigma:.4g}'} | "
                     f"{np.mean(acc):.3f} ± {np.std(acc, ddof=1):.3f} | "
                     f"{np.mean([c['test_loss'] for c in cs]):.4g} | {len(cs)} |")
    return "\n".join(lines)


def comparison_table(results: dict) -> str:
    lines = ["| ε | first − second | mean (points) | 95 % interval | per seed |",
             "|---|---|---|---|---|"]
    for c in results["comparisons"]:
        lines.append(f"| {c['epsilon']:g} | {c['first']} − {c['second']} | "
                     f"{100 * c['mean']:+.1f} | [{100 * c['low']:+.1f}, {100 * c['high']:+.1f}] | "
                     + ", ".join(f"{100 * d:+.1f}" for d in c["differences"]) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args(argv)
    results = json.loads((args.run / "results.json").read_text())
    if args.csv:
        fields = ["approach", "epsilon", "seed", "lr", "sigma", "test_accuracy", "test_loss"]
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows({k: c[k] for k in fields} for c in results["cells"])
    if (args.run / "selection.csv").exists():
        print("Selection (mean final validation accuracy over the selection seeds; bold: the "
              "pick)\n")
        print(selection_table(args.run), "\n")
    print(test_table(results), "\n")
    print(comparison_table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
