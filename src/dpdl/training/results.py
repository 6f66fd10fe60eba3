"""A training run folder's results: ``results.json`` (per-cell records and their mean over
seeds) and ``curves.png``, written the same way by ``dpdl run`` and by
:mod:`dpdl.training.trainer`."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

SUMMARY_METRICS = (
    "test_accuracy",
    "node_accuracy_mean",
    "node_accuracy_worst",
    "val_accuracy",
    "test_loss",
    "epsilon_clt",
    "epsilon_certified",
)


def sample_std(values) -> float:
    """The one standard deviation dpdl reports ("± std", ``*_std``): the sample standard
    deviation over seeds, ddof = 1.

    NaN for fewer than two values: it is undefined there, and 0 would claim a spread of none
    from a single seed.  The run folders' results.json and final.csv store that as null / an
    empty cell (``std_or_none``); the sweep report prints no "±" for it; tune.json keeps NaN,
    as it does for the mean of an incomplete point.
    """
    x = np.asarray(values, dtype=float)
    return float(x.std(ddof=1)) if x.size > 1 else math.nan


def std_or_none(values) -> float | None:
    """``sample_std`` for results.json and CSV files: None (null, an empty cell) where it is
    undefined."""
    std = sample_std(values)
    return None if math.isnan(std) else std


def summarize(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds of the final numbers, per (algorithm, epsilon target)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["algorithm"], cell["epsilon_target"]), []).append(cell)
    summary = []
    for (algorithm, eps), members in groups.items():
        entry: dict[str, Any] = {
            "algorithm": algorithm,
            "epsilon_target": eps,
            "seeds": [c["seed"] for c in members],
            "status": sorted({c["status"] for c in members}),
        }
        for key in SUMMARY_METRICS:
            vals = [c["final"].get(key) for c in members if c["status"] == "ok"]
            vals = [v for v in vals if v is not None]
            entry[key] = float(np.mean(vals)) if vals else None
            entry[f"{key}_std"] = std_or_none(vals)
        summary.append(entry)
    return summary


def write_results(
    run_dir: Path,
    cells: list[dict[str, Any]],
    *,
    plot_title: str | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write ``results.json`` (and, with ``plot_title``, ``curves.png`` from ``metrics.csv``)."""
    run_dir = Path(run_dir)
    results = {"run_dir": str(run_dir), "cells": cells, "summary": summarize(cells)}
    results |= extra or {}
    path = run_dir / "results.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    if plot_title is not None:
        from dpdl.training.plots import plot_curves

        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png", title=plot_title)
        results["plot"] = str(run_dir / "curves.png")
        path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results
