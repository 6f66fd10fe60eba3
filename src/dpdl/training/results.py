"""A training run folder's results: ``results.json`` (per-cell records and their mean over
seeds) and ``curves.png``, written the same way by ``dpdl run`` and by
:mod:`dpdl.training.trainer`."""

from __future__ import annotations

import json
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
            entry[f"{key}_std"] = float(np.std(vals)) if len(vals) > 1 else None
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
        from dpdl.experiments.plots import plot_curves

        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png", title=plot_title)
        results["plot"] = str(run_dir / "curves.png")
        path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results
