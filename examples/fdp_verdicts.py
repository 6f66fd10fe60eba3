"""Seed-paired comparisons of an fdp-random-walk run folder's accountants (issue 28, claims
2 and 3): the final test accuracy of every (algorithm, accountant, ε, seed) cell, and for each
ε the mean seed-by-seed difference of the pairs below with its 95 % t-interval.

    python examples/fdp_verdicts.py RUN_DIR [--csv docs/results/NAME.csv]
        [--curves ALGORITHM EPSILON PNG]   # test loss against the iterations, per accountant

Every cell draws its own walk, batches and noise, so a pair's difference is of two
independent runs on the same data split; the interval is over the seeds.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

PAIRS = {"random-walk": [("pn-fdp", "rdp-baseline"), ("pn-fdp", "local"),
                         ("rdp-baseline", "local")],
         "decor": [("fdp", "rdp-simple"), ("fdp", "local"), ("rdp-simple", "local")]}


def final_cells(run: Path) -> list[dict]:
    last: dict[tuple, dict] = {}
    with open(run / "metrics.csv") as fh:
        for row in csv.DictReader(fh):
            key = (row["algorithm"], row["accountant"], row["epsilon"], int(row["seed"]))
            if key not in last or int(row["step"]) > int(last[key]["step"]):
                last[key] = row
    return [{"algorithm": a, "accountant": c, "epsilon": e, "seed": s,
             "sigma": float(r["sigma"]), "steps": int(r["step"]),
             "test_accuracy": float(r["accuracy"]), "test_loss": float(r["loss"])}
            for (a, c, e, s), r in sorted(last.items())]


def comparisons(cells: list[dict]) -> list[dict]:
    """The PAIRS of each algorithm at each ε, through dpdl's one seed pairing."""
    from dpdl.experiments.paired import paired

    rows = [{"algorithm": c["accountant"], "setting": c["algorithm"], "seed": c["seed"],
             "epsilon_target": float(c["epsilon"]), "status": "ok",
             "test_accuracy": c["test_accuracy"]} for c in cells if c["epsilon"]]
    out = []
    for algorithm, pairs in PAIRS.items():
        for first, second in pairs:
            out += [{"algorithm": algorithm, "epsilon": c.epsilon, "first": first,
                     "second": second, "seeds": len(c.seeds), "mean": c.mean, "low": c.low,
                     "high": c.high}
                    for c in paired(rows, first, second) if c.setting == algorithm]
    return sorted(out, key=lambda c: (list(PAIRS).index(c["algorithm"]), c["epsilon"],
                                      PAIRS[c["algorithm"]].index((c["first"], c["second"]))))


def plot_curves(run: Path, algorithm: str, epsilon: str, path: str,
                marks: dict | None = None) -> None:
    """Mean test loss (± one std over seeds) of the model (DECOR: the network average; the
    random walk: the token) against the iterations; accountants whose epsilon is not a
    guarantee (``marks``) are labelled so."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    series: dict[str, dict[int, list[float]]] = {}
    with open(run / "metrics.csv") as fh:
        for row in csv.DictReader(fh):
            if row["algorithm"] == algorithm and row["epsilon"] in (epsilon, ""):
                steps = series.setdefault(row["accountant"], {})
                steps.setdefault(int(row["step"]), []).append(float(row["loss"]))
    fig, ax = plt.subplots(figsize=(6, 4))
    for accountant, steps in series.items():
        t = np.array(sorted(steps))
        mean = np.array([np.mean(steps[s]) for s in t])
        std = np.array([np.std(steps[s]) for s in t])
        uncertified = (marks or {}).get((algorithm, accountant, epsilon)) is False
        ax.plot(t, mean, label=accountant + (" (not certified)" if uncertified else ""))
        ax.fill_between(t, mean - std, mean + std, alpha=0.2)
    ax.set(xlabel="iteration", ylabel="test loss of the " + (
        "network average" if algorithm == "decor" else "token's model"),
           title=f"{algorithm}, ε = {epsilon} (band: ± one std over seeds)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--csv", type=Path, help="write one row per run here")
    parser.add_argument("--curves", nargs=3, metavar=("ALGORITHM", "EPSILON", "PNG"))
    args = parser.parse_args(argv)
    cells = final_cells(args.run)
    table = json.loads((args.run / "results.json").read_text())["table"]
    # whether each row's epsilon is a guarantee (results.json since the hop-map gate; DECOR's
    # and older runs' rows carry no mark: "")
    marks = {(r["algorithm"], r["accountant"], str(r["epsilon"] or "")):
             r.get("certified", "") if r["epsilon"] else "" for r in table}  # non-private: ""
    for c in cells:
        c["certified"] = marks.get((c["algorithm"], c["accountant"], c["epsilon"]), "")
    if args.curves:
        plot_curves(args.run, *args.curves, marks=marks)
    if args.csv:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with open(args.csv, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(cells[0]))
            writer.writeheader()
            writer.writerows(cells)
    print("| algorithm | accountant | ε | σ | test accuracy (mean ± std over seeds) | certified |")
    print("|---|---|---|---|---|---|")
    for r in table:
        std = "n=1" if r["accuracy_std"] is None else f"{r['accuracy_std']:.3f}"
        print(f"| {r['algorithm']} | {r['accountant']} | {r['epsilon'] or '—'} | "
              f"{r['sigma']:.4g} | {r['accuracy_mean']:.3f} ± {std} | "
              f"{ {True: 'yes', False: 'NO'}.get(r.get('certified'), '') } |")
    print("\n| algorithm | ε | pair (first − second) | seeds | mean difference | 95 % interval "
          "| both certified |")
    print("|---|---|---|---|---|---|---|")
    for c in comparisons(cells):
        both = [marks.get((c["algorithm"], a, str(c["epsilon"])), "") for a in
                (c["first"], c["second"])]
        mark = "NO" if False in both else ("yes" if both == [True, True] else "")
        print(f"| {c['algorithm']} | {c['epsilon']} | {c['first']} − {c['second']} | "
              f"{c['seeds']} | {100 * c['mean']:+.1f} pts | [{100 * c['low']:+.1f}, "
              f"{100 * c['high']:+.1f}] | {mark} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
