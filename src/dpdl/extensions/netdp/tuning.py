"""Step sizes chosen on validation records, the same budget for every approach (issue 28), and
the seed-paired comparisons of the approaches' test accuracy.

The paper tuned η "separately for each approach in [10⁻⁴, 2]" (seed 002, Figure 2).  Here
every approach (and the non-private baseline) gets the same grid ``tune.lr_grid`` at every ε;
each grid point trains over ``tune.selection_seeds`` (disjoint from the test seeds) and is
scored by its final accuracy on ``tune.validation_records`` records of the training split
that no user holds.  The pick follows dpdl's one selection rule
(:data:`dpdl.experiments.tune.RULE`); the test seeds then train at the picks.

Choosing η on those validation records is outside the per-run ε (docs/THREAT_MODEL.md): they
are declared public, as the test set is.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from dpdl.experiments.tune import RULE, pick

METRIC = "val_accuracy"

__all__ = ["METRIC", "select_step_sizes", "paired_comparisons", "rule_text"]


def rule_text() -> str:
    return RULE.format(metric=METRIC)


def select_step_sizes(cells: list[tuple[str, float | None]], grid: list[float],
                      seeds: list[int], train: Callable[[int, str, float | None, float], float],
                      say=lambda *_: None) -> dict[str, Any]:
    """Train every (approach, ε) cell at every grid point over the selection seeds
    (``train(seed, approach, eps, lr)`` returns the final validation accuracy); returns the
    table of every point and the pick of each cell."""
    points = [(("lr", lr),) for lr in grid]
    table, picks = [], []
    for approach, eps in cells:
        runs = []
        for lr in grid:
            for seed in seeds:
                value = train(seed, approach, eps, lr)
                runs.append({"overrides": {"lr": lr}, "epsilon": eps, "seed": seed,
                             "value": value})
            say(f"  select {approach:>11} eps={_label(eps):>6} lr={lr:<8g}: val acc "
                f"{np.mean([r['value'] for r in runs[-len(seeds):]]):.3f}")
        rows, best = pick(points, runs, seeds, eps, METRIC)
        for index, row in enumerate(rows):
            table.append({"approach": approach, "epsilon": eps, "lr": row["point"]["lr"],
                          "mean": row["mean"], "std": row["std"], "values": row["values"],
                          "picked": index == best})  # fmt: skip
        if best is None:
            picks.append({"approach": approach, "epsilon": eps, "lr": None})
        else:
            picks.append({"approach": approach, "epsilon": eps, "lr": grid[best],
                          "val_accuracy": rows[best]["mean"], "at_grid_edge":
                          best in (0, len(grid) - 1)})  # fmt: skip
    return {"rule": rule_text(), "metric": METRIC, "lr_grid": list(grid),
            "selection_seeds": list(seeds), "points": table, "picks": picks}


def _label(eps: float | None) -> str:
    return "-" if eps is None else f"{eps:g}"


#: The pairs the paper's Figure 2 compares (seed 002, Section 5): first minus second.
PAIRS = (("network", "central"), ("network", "local"), ("central", "local"))


def paired_comparisons(results: list[dict], metric: str = "test_accuracy") -> list[dict]:
    """For every ε and every pair of approaches run on the same seeds, the mean seed-by-seed
    difference of the final ``metric`` (first minus second) and its 95 % t-interval: dpdl's
    one seed pairing (:func:`dpdl.experiments.paired.paired`) on the cells' results."""
    from dpdl.experiments.paired import paired

    rows = [{"algorithm": r["approach"], "setting": "", "epsilon_target": r["epsilon"],
             "seed": r["seed"], "status": r["status"], metric: r[metric]}
            for r in results if r["epsilon"] is not None]  # fmt: skip
    out = []
    for first, second in PAIRS:
        for c in sorted(paired(rows, first, second, metric=metric), key=lambda c: c.epsilon):
            out.append({"epsilon": c.epsilon, "first": first, "second": second,
                        "metric": metric, "seeds": list(c.seeds),
                        "differences": list(c.differences), "mean": c.mean,
                        "low": None if math.isnan(c.low) else c.low,
                        "high": None if math.isnan(c.high) else c.high})  # fmt: skip
    return sorted(out, key=lambda c: c["epsilon"])
