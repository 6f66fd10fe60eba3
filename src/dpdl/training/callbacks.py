"""What a user's callback receives at each evaluation (:class:`Evaluation`), the metrics row's
columns, and the two loggers shipped with dpdl: :class:`CSVLogger` (``metrics.csv``) and
:class:`TensorBoardLogger`."""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpdl.errors import DPDLError

METRIC_COLUMNS = (
    "iteration",
    "algorithm",
    "seed",
    "epsilon_target",
    "test_loss",
    "test_accuracy",
    "node_accuracy_mean",
    "node_accuracy_worst",
    "val_loss",
    "val_accuracy",
    "epsilon_clt",
    "epsilon_certified",
    # what the mixer counted so far: the mean over nodes of the messages each node sent to
    # other nodes and of their bytes (every node's own count: results.json's communication)
    "messages_per_node",
    "bytes_per_node",
)
# Per-node evaluation (node_eval_data / training.node_eval_share): each node's de-biased model
# on its own evaluation set.  Present in a row only when it is configured (default rows, and
# the default metrics.csv, are unchanged); the accuracies are NaN for a loss other than
# cross_entropy.  The per-node vectors go in the rows (history, results.json's final row),
# never in metrics.csv or Evaluation.metrics (one number per metric there).
NODE_LOCAL_COLUMNS = (
    "node_local_accuracy_mean",
    "node_local_accuracy_worst",
    "node_local_loss_mean",
    "node_local_loss_worst",
)
NODE_LOCAL_VECTORS = ("node_local_accuracy", "node_local_loss")
# the nodes' own models on the validation records (a run with validation data, cross-entropy)
VAL_NODE_COLUMNS = ("val_node_accuracy_mean", "val_node_accuracy_worst")
# The training loss on the nodes' own records is a noise-free function of private data: it is
# computed only with unsafe_train_metrics=True, under this name wherever it goes.
UNACCOUNTED_TRAIN_LOSS = "unaccounted_train_loss"

# Row entries that describe the evaluation rather than measure the model.
ROW_LABELS = ("iteration", "algorithm", "seed", "epsilon_target", "epsilon_certified_method")

__all__ = [
    "METRIC_COLUMNS",
    "NODE_LOCAL_COLUMNS",
    "NODE_LOCAL_VECTORS",
    "ROW_LABELS",
    "UNACCOUNTED_TRAIN_LOSS",
    "VAL_NODE_COLUMNS",
    "CSVLogger",
    "Evaluation",
    "TensorBoardLogger",
    "evaluation_of",
]


@dataclass(frozen=True)
class Evaluation:
    """What every callback receives at each evaluation (iteration 0, every ``eval_every``
    steps, and the end): the metrics of the network-average model and the epsilon spent
    (``row`` holds the per-node vectors of a per-node evaluation too)."""

    iteration: int
    metrics: dict[str, float]
    epsilon_certified: float
    epsilon_clt: float
    row: dict[str, Any]  # the whole metrics row (as in metrics.csv)


class CSVLogger:
    """Writes one row per evaluation to a CSV file (``metrics.csv`` of a run folder).

    ``columns`` default: :data:`METRIC_COLUMNS` followed by the user's metrics.
    """

    def __init__(self, path: str | Path, columns: Sequence[str] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("w", newline="")
        self._writer: csv.DictWriter | None = None
        if columns is not None:
            self._start(tuple(columns))

    def _start(self, columns: tuple[str, ...]) -> None:
        self._writer = csv.DictWriter(self._fh, fieldnames=columns, extrasaction="ignore")
        self._writer.writeheader()
        self._fh.flush()

    def write_row(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            extra = tuple(k for k in row if k not in METRIC_COLUMNS and k not in ROW_LABELS
                          and k not in NODE_LOCAL_VECTORS)  # fmt: skip
            self._start(METRIC_COLUMNS + extra)
        self._writer.writerow({k: _csv_value(row.get(k)) for k in self._writer.fieldnames})
        self._fh.flush()

    def __call__(self, evaluation: Evaluation) -> None:
        self.write_row(evaluation.row)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> CSVLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TensorBoardLogger:
    """Writes every evaluation's metrics and epsilons as TensorBoard scalars.

    Needs the optional ``tensorboard`` package (``pip install tensorboard``).
    """

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise DPDLError(
                "TensorBoardLogger needs the tensorboard package: pip install tensorboard"
            ) from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def __call__(self, evaluation: Evaluation) -> None:
        scalars = evaluation.metrics | {
            "epsilon_certified": evaluation.epsilon_certified,
            "epsilon_clt": evaluation.epsilon_clt,
        }
        for name, value in scalars.items():
            if math.isfinite(value):
                self.writer.add_scalar(name, value, evaluation.iteration)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _csv_value(v):
    if isinstance(v, float):
        return repr(v)
    return v


def evaluation_of(row: dict[str, Any]) -> Evaluation:
    """The :class:`Evaluation` of one metrics row."""
    return Evaluation(
        iteration=row["iteration"],
        metrics={k: v for k, v in row.items() if k not in ROW_LABELS
                 and k not in ("epsilon_clt", "epsilon_certified", *NODE_LOCAL_VECTORS)},
        epsilon_certified=row["epsilon_certified"],
        epsilon_clt=row["epsilon_clt"],
        row=row,
    )  # fmt: skip
