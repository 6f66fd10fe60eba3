"""Reading a sweep: every finished cell's ``metrics.csv`` becomes runs, one per curve.

A *run* is one (algorithm, seed, epsilon_target) curve of a metrics file, so a cell that
trains several algorithms, seeds or target epsilons yields several runs.  The target epsilon
is read from the ``epsilon_target`` column, and taken from the grid point only when the file
has no such column.  The runner's record of a run in the ``results.json`` beside the metrics
adds how it was calibrated, whether it diverged and where its noise came from.
"""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpdl.accounting.schedules import algorithm_private
from dpdl.errors import DPDLError
from dpdl.experiments.sweep.driver import failed_cells, finished_cells
from dpdl.training.provenance import PROVENANCE_KEY
from dpdl.training.results import RunRecord

_SEED_LEAVES = {"seed", "seeds"}
COMMUNICATION = ("messages_per_node", "bytes_per_node")
NODE_ACCURACY = ("node_accuracy_mean", "node_accuracy_worst")
_NOT_A_SETTING = _SEED_LEAVES | {"algorithms", "epsilon"}


@dataclass
class CellRun:
    """One curve: an algorithm at one seed and target ε, in one cell of the sweep."""

    overrides: dict
    algorithm: str  # the label, e.g. "dyn-d2p@clt"
    seed: str
    epsilon_target: float  # NaN for non-private runs
    iterations: np.ndarray
    accuracy: np.ndarray
    loss: np.ndarray
    epsilon_clt: float
    epsilon_certified: float
    cell: str = ""
    calibrated_with: str | None = None
    status: str = "ok"  # "diverged": the runner stopped it on a NaN/inf update
    noise_entropy: str | None = None  # "os", "seed" (reproducible noise), None: not recorded
    # the relation its ε is stated for; a run recorded before dpdl named it was add/remove
    neighboring: str = "add-remove"
    extra: dict = field(default_factory=dict)

    @property
    def final_accuracy(self) -> float:
        return float(self.accuracy[-1])

    @property
    def base_algorithm(self) -> str:
        return self.algorithm.partition("@")[0]

    @property
    def calibration(self) -> str:
        """The calibrating accountant named in the label ("" when the label names none)."""
        return self.algorithm.partition("@")[2]

    @property
    def private(self) -> bool:
        return algorithm_private(self.base_algorithm)

    @property
    def setting(self) -> tuple:
        """The grid point without seed, algorithms and ε: runs of one setting are comparable."""
        return tuple(
            sorted(
                (k, str(v))
                for k, v in self.overrides.items()
                if k.rsplit(".", 1)[-1] not in _NOT_A_SETTING
            )
        )


def as_float(value) -> float:
    """``value`` as a float; NaN for what is not a number (an empty cell, None)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def read_metrics(path: Path) -> dict[tuple[str, str, float], dict[str, list[float]]]:
    """metrics.csv -> {(algorithm, seed, epsilon_target): {column: values}} in file order.

    ``epsilon_target`` is NaN when the file has no such column or the run is not private.
    """
    curves: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            eps = as_float(row.get("epsilon_target"))
            # NaN != NaN: key non-private runs with one canonical NaN-free marker.
            key = (row.get("algorithm", "?"), row.get("seed", "0"), eps if eps == eps else None)
            for column, value in row.items():
                if column not in ("algorithm", "seed", "epsilon_target"):
                    curves[key][column].append(as_float(value))
    return {(a, s, math.nan if e is None else e): cols for (a, s, e), cols in curves.items()}


def _override_epsilon(overrides: dict) -> float:
    for key, value in overrides.items():
        if key.rsplit(".", 1)[-1] == "epsilon" and not isinstance(value, list):
            return as_float(value)
    return math.nan


def _run_records(results_path: Path) -> dict[tuple[str, str, float], RunRecord]:
    """(algorithm, seed, ε target) -> the runner's record of it in results.json."""
    try:
        results = json.loads(results_path.read_text())
    except (OSError, ValueError):
        return {}
    out = {}
    for cell in results.get("cells", []) if isinstance(results, dict) else []:
        if isinstance(cell, dict) and "algorithm" in cell:
            record = RunRecord.from_dict(cell)
            eps = as_float(record.epsilon_target)
            out[(str(record.algorithm), str(record.seed), round(eps, 12))] = record
    return out


def read_provenance(results_path: Path) -> dict | None:
    """The provenance block of a results.json (None: not recorded, or no such file)."""
    try:
        results = json.loads(Path(results_path).read_text())
    except (OSError, ValueError):
        return None
    return results.get(PROVENANCE_KEY) if isinstance(results, dict) else None


def collect_runs(sweep_dir: Path) -> list[CellRun]:
    """Every curve of every finished cell of ``sweep_dir`` (an error when there is none)."""
    runs: list[CellRun] = []
    for cell_dir, record in finished_cells(sweep_dir):
        overrides = record.get("overrides", {})
        for metrics_path in sorted(cell_dir.rglob("metrics.csv")):
            runs += _runs_of_file(metrics_path, overrides, cell_dir.name)
    if not runs:
        failed = len(failed_cells(sweep_dir))
        why = f" ({failed} cell(s) failed)" if failed else ""
        raise DPDLError(
            f"{sweep_dir}: no finished cell with a metrics.csv{why}; run the sweep first"
        )
    return runs


@dataclass(frozen=True)
class FailedCell:
    """A cell of the sweep that failed (and has not finished since)."""

    cell: str
    overrides: dict
    error: str  # the first line of the error that stopped it

    @property
    def settings_text(self) -> str:
        return ", ".join(f"{key}={value}" for key, value in self.overrides.items())


def collect_failures(sweep_dir: Path) -> list[FailedCell]:
    """The failed cells of ``sweep_dir``, as the sweep driver recorded them."""
    return [
        FailedCell(cell, record.get("overrides", {}), _first_line(record.get("error")))
        for cell, record in failed_cells(sweep_dir)
    ]


def _first_line(error) -> str:
    lines = str(error or "").strip().splitlines()
    return lines[0] if lines else "(no error recorded)"


def _runs_of_file(metrics_path: Path, overrides: dict, cell: str) -> list[CellRun]:
    records = _run_records(metrics_path.with_name("results.json"))
    origin = read_provenance(metrics_path.with_name("results.json"))
    runs = []
    for (algorithm, seed, eps), cols in read_metrics(metrics_path).items():
        if not cols.get("iteration"):
            continue
        if math.isnan(eps) and algorithm_private(algorithm.partition("@")[0]):
            eps = _override_epsilon(overrides)
        record = records.get((algorithm, seed, round(eps, 12)))
        calibration = (record and record.calibrated_with) or algorithm.partition("@")[2] or None
        runs.append(
            CellRun(
                overrides=overrides,
                algorithm=algorithm,
                seed=seed,
                epsilon_target=eps,
                iterations=np.asarray(cols["iteration"]),
                accuracy=np.asarray(cols.get("test_accuracy", [math.nan])),
                loss=np.asarray(cols.get("test_loss", [math.nan])),
                epsilon_clt=cols.get("epsilon_clt", [math.nan])[-1],
                epsilon_certified=cols.get("epsilon_certified", [math.nan])[-1],
                cell=cell,
                calibrated_with=calibration,
                status="ok" if record is None or record.status is None else str(record.status),
                noise_entropy=record and record.noise_entropy,
                neighboring=(record and record.neighboring) or "add-remove",
                extra={
                    "metrics_path": str(metrics_path),
                    "train_seconds": as_float(record and record.train_seconds),
                    PROVENANCE_KEY: origin,
                    "common_noise": bool(record and record.common_noise),
                    # what the mixer counted in the whole run, mean over nodes (NaN: not kept)
                    **{key: cols.get(key, [math.nan])[-1] for key in COMMUNICATION},
                    # the nodes' own de-biased models on the test records, final row
                    **{key: cols.get(key, [math.nan])[-1] for key in NODE_ACCURACY},
                },
            )
        )
    return runs
