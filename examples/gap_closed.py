"""The fraction of the local→central accuracy gap each arm of a `dpdl tune` folder closes
(issue 41), seed-paired: for test seed s, d_s = acc(arm) − acc(local) and D_s = acc(central) −
acc(local); the fraction is mean(d)/mean(D), with 95 % t-intervals on mean(d) and mean(D) and a
seed-paired bootstrap interval on the fraction (10 000 resamples of the seeds).

    python examples/gap_closed.py TUNE_DIR [--local local] [--central central] [--csv F]
        [--graph-suffix=-ring]

An arm whose name ends with a ``--graph-suffix`` (e.g. ``decor-sec-ldp-ring``) ran on another
graph and is compared with that graph's local DP (``local-ring``); central DP has no graph.

``--extension DIR``: a second `dpdl tune` folder that continued some arms' grids (candidate
``ARM-wide``, e.g. where a pick sat on the grid's edge).  Each arm is then tuned over the union
of its points: per ε, the better mean validation score of the two folders' picks (their
`tune.json`) decides whose test runs count; the picks are printed first.
"""

import argparse
import json
import re
from pathlib import Path

import numpy as np
from scipy import stats


def _accuracies(folder: Path, metric: str) -> dict[int, float]:
    out = {}
    for results in folder.glob("cells/*/*/results.json"):
        cell = json.loads(results.read_text())["cells"][0]
        out[int(cell["seed"])] = float(cell["final"][metric])
    return out


def _interval(x: np.ndarray) -> tuple[float, float, float]:
    half = stats.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / np.sqrt(x.size)
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("tune_dir", type=Path)
    parser.add_argument("--local", default="local")
    parser.add_argument("--central", default="central")
    parser.add_argument("--metric", default="test_accuracy")
    parser.add_argument("--csv", type=Path, help="write every (ε, arm, seed, metric) here")
    parser.add_argument("--extension", type=Path, help="a tune folder continuing some grids")
    parser.add_argument("--graph-suffix", action="append", default=[],
                        help="arms ending with it are compared with local + it (repeatable)")
    args = parser.parse_args()
    arms: dict[tuple[str, str], dict[int, float]] = {}
    for folder in sorted((args.tune_dir / "test").iterdir()):
        arm, eps = re.fullmatch(r"(.+)-eps(.+)", folder.name).groups()
        arms[arm, eps] = _accuracies(folder, args.metric)
    if args.extension is not None:
        _extend(arms, args.tune_dir, args.extension, args.metric)
    if args.csv:
        rows = [f"{eps},{arm},{seed},{value}" for (arm, eps), acc in sorted(arms.items())
                for seed, value in sorted(acc.items())]  # fmt: skip
        args.csv.write_text("\n".join([f"epsilon,arm,seed,{args.metric}", *rows]) + "\n")
    rng = np.random.default_rng(0)
    print("| ε | arm | accuracy | d = arm − local [95 %] | D = central − local [95 %] | "
          "gap closed d/D [95 % bootstrap] |")
    print("|---|---|---|---|---|---|")
    for eps in sorted({e for _, e in arms}, key=float):
        central = arms[args.central, eps]
        for arm in sorted({a for a, e in arms if e == eps}):
            suffix = next((x for x in args.graph_suffix if arm.endswith(x)), "")
            local = arms[args.local + suffix, eps]
            seeds = sorted(set(local) & set(central) & set(arms[arm, eps]))
            _row(eps, arm, arms[arm, eps], local, central, seeds, rng)


def _picks(tune_dir: Path) -> dict[tuple[str, str], tuple[dict, float]]:
    """(arm, ε) -> (pick, its mean validation score) from a tune folder's tune.json."""
    out = {}
    for arm, candidate in json.loads((tune_dir / "tune.json").read_text())["candidates"].items():
        for eps, selection in candidate["by_epsilon"].items():
            if selection["pick"] is not None:
                mean = max(row["mean"] for row in selection["table"] if row["complete"])
                out[arm, f"{float(eps):g}"] = (selection["pick"], mean)
    return out


def _extend(arms: dict, main: Path, extension: Path, metric: str) -> None:
    """Each ARM tuned over the union of its grid and ARM-wide's: the better pick's tests."""
    first, second = _picks(main), _picks(extension)
    print("| arm | ε | main grid's pick (val) | extension's pick (val) | counted |")
    print("|---|---|---|---|---|")
    for (arm, eps), (pick, mean) in sorted(first.items()):
        wide = second.get((arm + "-wide", eps))
        use = wide is not None and wide[1] > mean
        shown = "—" if wide is None else f"{wide[0]} ({wide[1]:.4f})"
        print(f"| {arm} | {eps} | {pick} ({mean:.4f}) | {shown} | "
              f"{'extension' if use else 'main'} |")
        if use:
            arms[arm, eps] = _accuracies(extension / "test" / f"{arm}-wide-eps{eps}", metric)
    print()


def _row(eps, arm, acc, local, central, seeds, rng) -> None:
    d = np.array([acc[s] - local[s] for s in seeds])
    D = np.array([central[s] - local[s] for s in seeds])
    boot = rng.integers(0, len(seeds), size=(10000, len(seeds)))
    ratios = d[boot].mean(axis=1) / D[boot].mean(axis=1)
    lo, hi = np.percentile(ratios, [2.5, 97.5])
    m, dl, dh = _interval(d)
    M, Dl, Dh = _interval(D)
    print(f"| {eps} | {arm} | {np.mean([acc[s] for s in seeds]):.3f} | {m:+.3f} "
          f"[{dl:+.3f}, {dh:+.3f}] | {M:+.3f} [{Dl:+.3f}, {Dh:+.3f}] | "
          f"{m / M:+.2f} [{lo:+.2f}, {hi:+.2f}] |")

if __name__ == "__main__":
    main()
