"""Users' own per-node data: one local data set per node, of any size, in one stacked form.

Each node's data is an ``(inputs, targets)`` pair of tensors / arrays (anything
``numpy.asarray`` reads) or a ``torch.utils.data.Dataset`` whose items are ``(input, target)``.
:func:`stack_local_datasets` checks that every node's records have the same shape and kind
(a message names the node) and pads them into the simulator's ``(n, J_max, ...)`` arrays with
a validity mask, as :func:`dpdl.data.partition.stack_node_data` does for a split data set.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpdl.data.partition import stack_node_data
from dpdl.errors import DPDLError

__all__ = ["local_arrays", "stack_local_datasets"]


def _array(value, what: str) -> np.ndarray:
    import torch  # here, not at the top: `import dpdl.data` stays free of torch

    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    try:
        array = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise DPDLError(f"{what} is not an array: {err}") from None
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == np.bool_):
        raise DPDLError(f"{what} must be numeric, got dtype {array.dtype}")
    return array


def local_arrays(data, what: str = "node data") -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)`` numpy arrays of one local data set (a pair or a torch Dataset)."""
    import torch

    if isinstance(data, torch.utils.data.Dataset) and not isinstance(data, tuple | list):
        try:
            size = len(data)
        except TypeError:
            raise DPDLError(
                f"{what}: a Dataset needs a length (iterable datasets are not supported)"
            ) from None
        items = [data[i] for i in range(size)]
        if any(not isinstance(item, tuple | list) or len(item) != 2 for item in items[:1]):
            raise DPDLError(f"{what}: a Dataset's items must be (input, target) pairs")
        inputs = [_array(x, f"{what} input") for x, _ in items]
        targets = [_array(y, f"{what} target") for _, y in items]
        if len({x.shape for x in inputs}) > 1:
            raise DPDLError(f"{what}: the Dataset's inputs have different shapes")
        if not items:
            raise DPDLError(f"{what} has no records")
        return np.stack(inputs), np.stack(targets)
    if not isinstance(data, tuple | list) or len(data) != 2:
        raise DPDLError(
            f"{what} must be an (inputs, targets) pair or a torch Dataset, got "
            f"{type(data).__name__}"
        )
    x, y = _array(data[0], f"{what} inputs"), _array(data[1], f"{what} targets")
    if x.ndim == 0 or y.ndim == 0:
        raise DPDLError(f"{what}: inputs and targets need a leading record dimension")
    if len(x) != len(y):
        raise DPDLError(f"{what} has {len(x)} inputs but {len(y)} targets")
    return x, y


def stack_local_datasets(datasets: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad the nodes' local data sets into ``(X, Y, mask)`` (see the module docstring).

    Inputs become float32; integer targets stay integers (class indices), others float32.
    Refused: fewer than two nodes, an empty node, records whose shape or target kind differs
    from node 0's (non-finite values are refused by ``dpdl.engine.NodeData.from_arrays``, the
    one door of every run's data).
    """
    if not isinstance(datasets, Sequence) or isinstance(datasets, str | bytes):
        raise DPDLError(
            "the nodes' data must be a list with one local data set per node, got "
            f"{type(datasets).__name__}"
        )
    if len(datasets) < 2:
        raise DPDLError(f"decentralized training needs at least 2 nodes, got {len(datasets)}")
    xs, ys = [], []
    for i, data in enumerate(datasets):
        x, y = local_arrays(data, f"node {i}'s data")
        if len(x) == 0:
            raise DPDLError(f"node {i}'s data has no records (every node needs at least one)")
        if i > 0 and x.shape[1:] != xs[0].shape[1:]:
            raise DPDLError(
                f"node {i}'s inputs have record shape {x.shape[1:]} but node 0's have "
                f"{xs[0].shape[1:]}: every node's records must have the same shape"
            )
        if i > 0 and y.shape[1:] != ys[0].shape[1:]:
            raise DPDLError(
                f"node {i}'s targets have shape {y.shape[1:]} per record but node 0's have "
                f"{ys[0].shape[1:]}"
            )
        integer = np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_
        if i > 0 and integer != (np.issubdtype(ys[0].dtype, np.integer) or ys[0].dtype == np.bool_):
            raise DPDLError(
                f"node {i}'s targets are {y.dtype} but node 0's are {ys[0].dtype}: class "
                "indices (integers) on some nodes and real values on others"
            )
        xs.append(x.astype(np.float32, copy=False))
        ys.append(y.astype(np.int64 if integer else np.float32, copy=False))
    sizes = np.array([len(x) for x in xs])
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(xs))]
    return stack_node_data(np.concatenate(xs), np.concatenate(ys), parts)
