"""A training run folder's results: ``results.json`` (per-cell records and their mean over
seeds) and ``curves.png``, written the same way by ``dpdl run`` and by
:mod:`dpdl.training.trainer`."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
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

NODE_LOCAL_SUMMARY = ("node_local_accuracy_mean", "node_local_accuracy_worst",
                      "node_local_loss_mean")  # fmt: skip


@dataclass(frozen=True)
class RunRecord:
    """One cell's record: its entry of ``results.json`` (:meth:`to_dict`, the metrics rows
    left out there) and of a checkpointed run's ``finished.json`` (rows included).

    ``epsilon_target`` None for a non-private run; ``delta`` None there too;
    ``neighboring`` the relation every epsilon of the record is stated for ("replace-one" or
    "add-remove"; a record written before it was recorded reads as "add-remove");
    ``final`` the last metrics row (non-finite numbers as None) with the ledger's final
    epsilons; ``steps_done`` the engine's iteration at the end, ``steps_spent`` the
    ledger's (a diverged step is recorded before it runs); ``unaccounted_outputs`` what the
    run releases without accounting for it; ``node_sizes`` every node's training records J_i
    (public under replace-one; after a ``node_eval_share`` hold-out; None under add-remove,
    where J_i is secret, as are ``sample_rates`` and ``epsilon_per_node``); ``heterogeneity`` only
    for a library-made partition of a shipped public benchmark (``dpdl run``): node sizes, per-
    node label histograms and their source, never for a user's data; ``sampling`` "uniform" |
    "per-node", ``sample_rates`` every node's Poisson rate; ``epsilon_per_node`` every node's
    certified epsilon of the steps spent at its own rate (the largest is the run's epsilon, of
    the node at the schedule's rate; None for a non-private run), ``epsilon_per_node_method``
    how.  ``noise_mechanism`` names the noise of the private steps (the exact release of
    MATH.md §10); None for a non-private run.  ``noise_correlation`` how the nodes' noise is
    correlated (``{"name": "independent"}``, or ``{"name": "pairwise", "correlation_factor":
    f}``) and ``trust_model`` whom the ledger's ε protects against ("curious-neighbours":
    record-level against neighbours who know the pairwise secrets they share, so only the
    independent noise counts; "sec-ldp": an eavesdropper who knows no honest pair's secret,
    ``privacy.trust_model``; ``dpdl.accounting.correlated.TRUST_MODELS``); None for a
    non-private run or a record written before they existed.  ``communication``: every node's
    ``messages_per_node`` and ``bytes_per_node`` sent to other nodes in the run, as the
    runtime's mixer counted them (:class:`dpdl.engine.mixing.Traffic`; None where it does not).
    ``common_noise`` True for a run whose seeded streams it shares on purpose with every run
    of the same seed, nodes and model (research mode; None otherwise).
    """

    algorithm: str
    base_algorithm: str
    seed: int
    epsilon_target: float | None
    delta: float | None
    calibrated_with: str | None
    neighboring: str | None
    noise_entropy: str | None
    noise_mechanism: str | None
    private: bool | None
    status: str | None
    message: str | None
    steps: int | None
    steps_done: int | None
    sample_rate: float | None
    train_seconds: float | None
    final: dict[str, Any] | None
    certified_method: str | None
    steps_spent: int | None
    unaccounted_outputs: tuple[str, ...] | None
    ledger_epsilon_spent: float | None
    ledger_accountant: str | None
    schedule: dict[str, Any] | None
    node_sizes: tuple[int, ...] | None = None
    heterogeneity: dict[str, Any] | None = None
    sampling: str | None = None
    sample_rates: list[float] | None = None
    epsilon_per_node: list[float] | None = None
    epsilon_per_node_method: str | None = None
    noise_correlation: dict[str, Any] | None = None
    trust_model: str | None = None
    communication: dict[str, list[int]] | None = None
    common_noise: bool | None = None
    rows: tuple[dict[str, Any], ...] = ()

    def to_dict(self, rows: bool = True) -> dict[str, Any]:
        """The record as written, keys in this order (without ``rows`` when ``rows=False``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        for key in ("unaccounted_outputs", "node_sizes"):
            if out[key] is not None:
                out[key] = list(out[key])
        if rows:
            out["rows"] = list(self.rows)
        else:
            del out["rows"]
        return out

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> RunRecord:
        """A record read back (results.json, finished.json).  Entries it does not hold (a
        record of another experiment kind, or of an older dpdl) read as None; others are
        ignored."""
        values = {f.name: record.get(f.name) for f in dataclasses.fields(cls)}
        values["rows"] = tuple(record.get("rows") or ())
        # dpdl stated every epsilon under add/remove before it recorded the relation
        values["neighboring"] = record.get("neighboring") or "add-remove"
        for key in ("unaccounted_outputs", "node_sizes"):
            if values[key] is not None:
                values[key] = tuple(values[key])
        return cls(**values)

    def __getitem__(self, key: str) -> Any:
        """``record["steps"]``: reading it as its results.json entry, as before it had fields."""
        return self.to_dict()[key]


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
        # node_local_* only where a run evaluated per node (default summaries unchanged)
        node_local = [k for k in NODE_LOCAL_SUMMARY
                      if any(k in (c["final"] or {}) for c in members)]  # fmt: skip
        for key in (*SUMMARY_METRICS, *node_local):
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
    device: Any = None,
    vector_figures: bool = False,
) -> dict[str, Any]:
    """Write ``results.json`` (and, with ``plot_title``, ``curves.png`` from ``metrics.csv``,
    with ``vector_figures`` its PDF and SVG too), with the provenance block of this process
    (``device`` the one the cells ran on)."""
    from dpdl.training.provenance import PROVENANCE_KEY, provenance

    run_dir = Path(run_dir)
    results = {"run_dir": str(run_dir), "cells": cells, "summary": summarize(cells)}
    results |= extra or {}
    results.setdefault(PROVENANCE_KEY, provenance(device))
    path = run_dir / "results.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    if plot_title is not None:
        from dpdl.training.plots import plot_curves

        plot_curves(run_dir / "metrics.csv", run_dir / "curves.png", title=plot_title,
                    vector=vector_figures)
        results["plot"] = str(run_dir / "curves.png")
        path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results
