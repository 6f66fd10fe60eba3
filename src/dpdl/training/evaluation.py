"""Evaluation of a run's models on the public records the user declared (``eval_data``,
``validation_data``, each node's own set: ``node_eval_data`` / ``node_eval_share``), and,
only with ``unsafe_train_metrics``, the noise-free loss on training records (released as
``unaccounted_train_loss``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from dpdl.engine.simulator import NodeData, Simulator, accuracy
from dpdl.errors import DPDLError, require
from dpdl.training.callbacks import UNACCOUNTED_TRAIN_LOSS
from dpdl.training.inputs import check_eval_records, per_record_loss
from dpdl.training.node_eval import node_local_metrics
from dpdl.training.settings import TrainingSection
from dpdl.training.specs import EvaluationSpec

__all__ = ["Evaluator"]

_HELD_OUT = ("test_loss", "test_accuracy", "node_accuracy_mean", "node_accuracy_worst",
             "val_loss", "val_accuracy")  # fmt: skip


class Evaluator:
    """Computes one metrics row (without its labels and epsilons) of an engine's models."""

    def __init__(self, loss, metric: Callable | None, sets: dict[str, Any], node_samples: int,
                 node_sets: NodeData | None = None):  # fmt: skip
        self.loss, self.metric, self.sets, self.node_samples = loss, metric, sets, node_samples
        self.node_sets = node_sets  # the hosted nodes' own evaluation sets (node_eval)

    @classmethod
    def build(cls, model: nn.Module, spec: EvaluationSpec, *, node_data: NodeData,
              training: TrainingSection, loss, classes: int | None, seed: int, device,
              node_sets: NodeData | None = None) -> Evaluator:  # fmt: skip
        """Check and pick the evaluation records of ``spec`` (public randomness of ``seed``),
        then probe its ``metric`` on a few of them.  ``node_sets``: the hosted nodes' own
        evaluation sets (:mod:`dpdl.training.node_eval`), scored as ``node_local_*``."""
        sets = _evaluation_sets(spec.eval_data, spec.train_eval_data, spec.validation_data,
                                node_data=node_data, training=training, loss=loss,
                                classes=classes, seed=seed, device=device)  # fmt: skip
        evaluator = cls(loss, spec.metric, sets, training.eval_node_samples, node_sets)
        evaluator._probe_metric(model)
        return evaluator

    def _probe_metric(self, model: nn.Module) -> None:
        if self.metric is None:
            return
        require(callable(self.metric), "metric must be a callable (outputs, targets) -> float")
        require(self.sets["x_test"] is not None, "a metric needs eval_data to evaluate on")
        with torch.no_grad():
            out = model(self.sets["x_test"][:4])
        self._metric_values(out, self.sets["y_test"][:4])

    def _metric_values(self, outputs, targets) -> dict[str, float]:
        try:
            value = self.metric(outputs, targets)
        except Exception as err:
            raise DPDLError(f"the metric function failed: {type(err).__name__}: {err}") from None
        values = value if isinstance(value, dict) else {"metric": value}
        try:
            return {str(k): float(v) for k, v in values.items()}
        except (TypeError, ValueError):
            raise DPDLError(
                f"the metric function must return a number or a dict of numbers, got {value!r}"
            ) from None

    def _held_out_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> float:
        if self.loss == "cross_entropy":
            # the fused mean: the same bits as runs before the trainer existed
            return float(torch.nn.functional.cross_entropy(outputs, targets))
        return float(per_record_loss(self.loss)(outputs, targets).mean())

    def evaluate(self, sim: Simulator) -> dict[str, float]:
        sets = self.sets
        row = {}
        if sets["x_train"] is not None:  # unsafe_train_metrics: labelled as unaccounted
            row[UNACCOUNTED_TRAIN_LOSS] = sim.average_loss(sets["x_train"], sets["y_train"])
        row |= dict.fromkeys(_HELD_OUT, math.nan)
        if sets["x_val"] is not None:
            row |= self._validation(sim)
        if sets["x_test"] is not None:
            row |= self._test(sim)
        if self.node_sets is not None:
            row |= node_local_metrics(sim, self.node_sets, self.loss)
        return row

    def _validation(self, sim: Simulator) -> dict[str, float]:
        out = sim.predict_average(self.sets["x_val"])
        x, y = self.sets["x_val"], self.sets["y_val"]
        row = {"val_loss": self._held_out_loss(out, y)}
        if self.loss == "cross_entropy":
            row["val_accuracy"] = float(accuracy(out, y))
            # the nodes' own models on validation records: what a tuning may select on
            # (the node_accuracy_* of the test records may not be chosen by)
            row |= _node_accuracies(sim, x, y, self.node_samples, "val_node_accuracy")
        return row

    def _test(self, sim: Simulator) -> dict[str, float]:
        x, y = self.sets["x_test"], self.sets["y_test"]
        out = sim.predict_average(x)
        row = {"test_loss": self._held_out_loss(out, y)}
        if self.loss == "cross_entropy":
            row["test_accuracy"] = float(accuracy(out, y))
            row |= _node_accuracies(sim, x, y, self.node_samples, "node_accuracy")
        if self.metric is not None:
            row |= self._metric_values(out, y)
        return row


def _node_accuracies(sim: Simulator, x, y, samples: int, prefix: str) -> dict[str, float]:
    """Every node's de-biased model on the first ``samples`` records: their mean and worst."""
    nodes = slice(0, min(samples, len(x)))
    node_acc = sim.node_accuracies(x[nodes], y[nodes])
    return {f"{prefix}_mean": float(node_acc.mean()), f"{prefix}_worst": float(node_acc.min())}


def _evaluation_sets(eval_data, train_eval_data, validation_data, *, node_data: NodeData,
                     training: TrainingSection, loss, classes: int | None, seed: int,
                     device) -> dict[str, Any]:  # fmt: skip
    rng = np.random.default_rng(seed)
    record_shape = tuple(node_data.inputs.shape[2:])
    target_dtype, record_dtype = node_data.targets.dtype, node_data.inputs.dtype

    def tensors(pair, what, limit):
        x, y = check_eval_records(pair, what, record_shape=record_shape, loss=loss,
                                  classes=classes, record_dtype=record_dtype)  # fmt: skip
        if limit is not None and limit < len(x):
            pick = torch.as_tensor(np.sort(rng.choice(len(x), limit, replace=False)))
            x, y = x[pick.to(x.device)], y[pick.to(y.device)]
        x = x.to(device=device, dtype=record_dtype)
        return x, y.to(device=device, dtype=target_dtype)

    sets = {"x_train": None, "y_train": None, "x_test": None, "y_test": None}
    if training.unsafe_train_metrics:
        if train_eval_data is None:  # a sample of the nodes' own records
            mask = node_data.mask
            train_eval_data = (node_data.inputs[mask], node_data.targets[mask])
        sets["x_train"], sets["y_train"] = tensors(
            train_eval_data, "train_eval_data", training.eval_train_samples
        )
    else:
        require(
            train_eval_data is None,
            "train_eval_data is evaluated without noise: pass unsafe_train_metrics=True "
            "to release unaccounted training metrics, or give public records as "
            "eval_data / validation_data",
        )
    if eval_data is not None:
        sets["x_test"], sets["y_test"] = tensors(eval_data, "eval_data", training.eval_test_samples)
    sets["x_val"], sets["y_val"] = (
        (None, None) if validation_data is None
        else tensors(validation_data, "validation_data", None)
    )  # fmt: skip
    return sets
