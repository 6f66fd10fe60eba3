"""Issue 28, claim 4: the error of DP decentralized linear regression against t and ε_T for the
two step-size regimes of seed 001's Theorem 2, with the theorem's bound beside it.

    dpdl run --preset linreg-rates-1 --entropy seed --output runs/linreg
    dpdl run --preset linreg-rates-sqrt --entropy seed --output runs/linreg
    python examples/linreg_rates_figure.py runs/linreg/linreg-rates-1-* \
        runs/linreg/linreg-rates-sqrt-*

Writes ``docs/results/linreg-rates.csv`` (one row per run: rate, topology, ε, seed, final
distance of the nodes' models to β*, of the released models, and the test MSE) and
``docs/results/linreg-rates.png``.  Theorem 2 bounds Σ_i E‖β♭_i(t) − β*‖ by O(t) when
e_α = 1 and by O(exp(t^{1−e_α})) otherwise; the O hides a constant the paper does not give, so
the bound is drawn through the curves' mean at the first recorded t (25): its shape, not a
number.
"""

from __future__ import annotations

import argparse
import csv
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

OUT = Path("docs/results")


def _runs(folder: Path) -> tuple[dict, list[dict], list[dict]]:
    results = json.loads((folder / "results.json").read_text())
    with open(folder / "unaccounted_errors.csv") as fh:
        curves = list(csv.DictReader(fh))
    return json.loads((folder / "config.json").read_text()), results["cells"], curves


def _rate(config: dict) -> str:
    e = config["algorithm"]["e_alpha"]
    return "O(1/t)" if e == 1 else f"O(1/t^{e:g})"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs=2, help="the linreg-rates-1 and -sqrt folders")
    parser.add_argument("--topology", default="undirected-ring", help="the graph drawn")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, folder in zip(axes[:2], args.runs, strict=True):
        config, cells, curves = _runs(folder)
        rate, e = _rate(config), config["algorithm"]["e_alpha"]
        rows += [{"rate": rate, "topology": c["topology"],
                  "epsilon": "non-private" if c["epsilon_target"] is None else c["epsilon_target"],
                  "seed": c["seed"], "final_error_mean": c["unaccounted_final_error_mean"],
                  "final_released_error_mean": c["unaccounted_released_error_mean"],
                  "final_test_mse_mean": c["final_test_mse_mean"]} for c in cells]
        by_eps = defaultdict(lambda: defaultdict(list))
        for r in curves:
            if r["topology"] == args.topology:
                by_eps[r["epsilon"]][int(r["t"])].append(float(r["error_mean"]))
        for eps, series in by_eps.items():
            t = np.array(sorted(series))
            ax.plot(t[1:], [np.mean(series[s]) for s in t[1:]],
                    "k--" if eps == "non-private" else "-",
                    label=eps if eps == "non-private" else f"ε_T = {float(eps):.0e}")
        t = np.array(sorted(next(iter(by_eps.values()))))[1:]
        first = np.mean([np.mean(s[int(t[0])]) for s in by_eps.values()])
        shape = t if e == 1 else np.exp(t ** (1 - e))
        ax.plot(t, first * shape / shape[0], ":", color="red", lw=2,
                label="Theorem 2's bound (shape, through the mean at t = 25)")
        ax.set(xscale="log", yscale="log", xlabel="t", ylim=(1e-2, 1e3),
               ylabel="mean over nodes of ||β_i(t) − β*||",
               title=f"{rate} step size, {args.topology}")
        ax.legend(fontsize=7)
    for rate in sorted({r["rate"] for r in rows}):
        sel = [r for r in rows if r["rate"] == rate and r["topology"] == args.topology
               and r["epsilon"] != "non-private"]
        epsilons = sorted({r["epsilon"] for r in sel})
        axes[2].plot(epsilons, [np.mean([r["final_error_mean"] for r in sel
                                         if r["epsilon"] == e]) for e in epsilons],
                     "o-", label=rate)
    axes[2].set(xscale="log", yscale="log", xlabel="ε_T (pure DP, exact sum)",
                ylabel="final mean ||β_i(T) − β*||", title=f"error against ε_T, {args.topology}")
    axes[2].legend()
    fig.tight_layout()
    OUT.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT / "linreg-rates.png", dpi=110)
    with open(OUT / "linreg-rates.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {OUT / 'linreg-rates.png'} and {OUT / 'linreg-rates.csv'} ({len(rows)} runs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
