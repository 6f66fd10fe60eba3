"""Per-node evaluation: every node's de-biased model z_i scored on that node's own evaluation
set, as users of Flower or decentralizepy expect.

The sets are evaluation data the user declares public, given one of two ways:

* ``node_eval_data=[(x_0, y_0), (x_1, y_1), ...]``: one set per node (checked like
  ``eval_data``: record shape, labels, non-empty; each message names the node);
* ``training.node_eval_share = s``: each record of a node is held out with probability s,
  decided by a keyed hash of the record itself and the public seed
  (:func:`dpdl.data.held_out_mask`) before anything trains, never by J_i or the record's
  slot: adding a record never changes which others are held out.  Those records are taken
  out of the node's training data (its size, the sampling rate b / J_min and the accounting
  use the rest), so they are never sampled; choosing the option is declaring them public.
  A node that holds out none scores NaN (left out of the mean and worst).

Only scores leave a process: in the distributed runtime each process scores its own nodes on
their own sets and the per-node means are gathered (:meth:`Simulator.node_scores`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from dpdl.engine.simulator import NodeData, Simulator
from dpdl.errors import DPDLError, require
from dpdl.training.inputs import check_eval_records, first_line, per_record_loss

__all__ = ["held_out_masks", "hold_out_node_eval", "node_eval_sets", "node_local_metrics"]


def held_out_masks(node_data: NodeData, share: float, seed: int,
                   first_node: int) -> list[np.ndarray]:  # fmt: skip
    """Per hosted node ``first_node ..``, which of its records ``node_eval_share = share``
    holds out (:func:`dpdl.data.held_out_mask`: a keyed hash of each record, whichever
    process hosts the node); refused (one line) where a node would keep none to train on."""
    from dpdl.data import held_out_mask

    masks = []
    for row, size in enumerate(node_data.counts.tolist()):
        x = node_data.inputs[row, :size].detach().cpu().numpy()
        y = node_data.targets[row, :size].detach().cpu().numpy()
        held = held_out_mask(x, y, share, seed, first_node + row)
        require(not held.all(), f"node {first_node + row}: node_eval_share = {share!r} holds "
                f"out all its {size} records; lower the share")  # fmt: skip
        masks.append(held)
    return masks


def hold_out_node_eval(node_data: NodeData, share: float, seed: int,
                       first_node: int) -> tuple[NodeData, NodeData]:  # fmt: skip
    """(the training records left, the held-out evaluation sets) of the hosted nodes
    ``first_node ..``: node i keeps its records in their order, minus those
    :func:`held_out_masks` holds out (a node's set may be empty)."""
    kept, held = [], []
    for row, mask in enumerate(held_out_masks(node_data, share, seed, first_node)):
        kept.append(_records(node_data, row, np.flatnonzero(~mask)))
        held.append(_records(node_data, row, np.flatnonzero(mask)))
    return _padded(kept), _padded(held)


def node_eval_sets(node_eval_data, n: int, first: int, count: int, *, node_data: NodeData,
                   loss, classes: int | None, device) -> NodeData:  # fmt: skip
    """The hosted nodes' sets of ``node_eval_data`` (a list of one ``(inputs, targets)`` set
    per node, or a function of the node index called for the hosted nodes only), each
    checked like ``eval_data``, padded as one (count, N_max, ...) block."""
    if callable(node_eval_data) and not isinstance(node_eval_data, Sequence):
        pairs = [(i, _called(node_eval_data, i)) for i in range(first, first + count)]
    else:
        require(
            isinstance(node_eval_data, Sequence) and not isinstance(node_eval_data, str | bytes),
            "node_eval_data must be a list with one (inputs, targets) set per node, got "
            f"{type(node_eval_data).__name__}",
        )
        require(len(node_eval_data) == n, f"node_eval_data has {len(node_eval_data)} sets but "
                f"the run has {n} nodes (one evaluation set per node)")  # fmt: skip
        pairs = [(i, node_eval_data[i]) for i in range(first, first + count)]
    record_shape = tuple(node_data.inputs.shape[2:])
    target_shape = tuple(node_data.targets.shape[2:])
    sets = []
    for i, pair in pairs:
        what = f"node_eval_data[{i}] (node {i}'s evaluation set)"
        x, y = check_eval_records(pair, what, record_shape=record_shape, loss=loss,
                                  classes=classes, record_dtype=node_data.inputs.dtype)  # fmt: skip
        require(tuple(y.shape[1:]) == target_shape, f"{what} has targets of shape "
                f"{tuple(y.shape[1:])} per record but the nodes' have {target_shape}")  # fmt: skip
        sets.append((x.to(device=device, dtype=node_data.inputs.dtype),
                     y.to(device=device, dtype=node_data.targets.dtype)))  # fmt: skip
    return _padded(sets)


def node_local_metrics(sim: Simulator, sets: NodeData, loss) -> dict[str, Any]:
    """The row entries of a per-node evaluation (``NODE_LOCAL_COLUMNS`` and, as lists of n
    numbers in node order, ``NODE_LOCAL_VECTORS``; accuracy for cross_entropy only)."""
    scores: dict[str, Callable] = {"loss": per_record_loss(loss)}
    if loss == "cross_entropy":
        scores["accuracy"] = _correct
    per_node = sim.node_scores(sets.inputs, sets.targets, sets.mask, scores)
    losses = per_node["loss"]
    row: dict[str, Any] = {"node_local_accuracy_mean": math.nan,
                           "node_local_accuracy_worst": math.nan}  # fmt: skip
    # a node with an empty set scores NaN (node_eval_share held none of its records out):
    # the mean and worst are those of the nodes that have one
    if "accuracy" in per_node:
        accuracies = per_node["accuracy"]
        row |= {"node_local_accuracy_mean": _nan_reduce(torch.nanmean, accuracies),
                "node_local_accuracy_worst": _nan_reduce(_nanmin, accuracies)}  # fmt: skip
    row |= {"node_local_loss_mean": _nan_reduce(torch.nanmean, losses),
            "node_local_loss_worst": _nan_reduce(_nanmax, losses)}  # fmt: skip
    if "accuracy" in per_node:
        row["node_local_accuracy"] = [float(v) for v in per_node["accuracy"]]
    row["node_local_loss"] = [float(v) for v in losses]
    return row


def _nanmin(values: torch.Tensor) -> torch.Tensor:
    return values[~values.isnan()].min()


def _nanmax(values: torch.Tensor) -> torch.Tensor:
    return values[~values.isnan()].max()


def _nan_reduce(reduce: Callable, values: torch.Tensor) -> float:
    """``reduce`` over the non-NaN entries; NaN when every entry is NaN."""
    values = torch.as_tensor(values)
    return math.nan if bool(values.isnan().all()) else float(reduce(values))


def _called(function, node: int):
    try:
        return function(node)
    except DPDLError:
        raise
    except Exception as err:
        raise DPDLError(
            f"the node_eval_data function failed for node {node}: "
            f"{type(err).__name__}: {first_line(err)}"
        ) from None


def _correct(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return (outputs.argmax(dim=-1) == targets).to(torch.float64)


def _records(node_data: NodeData, row: int, slots: np.ndarray):
    index = torch.as_tensor(slots, dtype=torch.int64, device=node_data.inputs.device)
    return node_data.inputs[row, index], node_data.targets[row, index]


def _padded(sets: list[tuple[torch.Tensor, torch.Tensor]]) -> NodeData:
    """One node's records per row, first in the row, zero padding after (NodeData's layout)."""
    sizes = [len(x) for x, _ in sets]
    longest = max(max(sizes), 1)  # every set empty (a tiny share): one slot of padding
    x0, y0 = sets[0]
    inputs = x0.new_zeros((len(sets), longest, *x0.shape[1:]))
    targets = y0.new_zeros((len(sets), longest, *y0.shape[1:]))
    for row, (x, y) in enumerate(sets):
        inputs[row, : len(x)], targets[row, : len(y)] = x, y
    mask = torch.arange(longest, device=inputs.device)[None, :] < torch.tensor(
        sizes, device=inputs.device)[:, None]  # fmt: skip
    return NodeData(inputs, targets, mask)
