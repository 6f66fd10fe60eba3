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

__all__ = ["local_arrays", "read_records", "stack_local_datasets"]

NPZ_KEYS = (("x", "y"), ("inputs", "targets"))


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


def stack_local_datasets(
    datasets: Sequence, *, first_node: int = 0, min_nodes: int = 2
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pad the nodes' local data sets into ``(X, Y, mask)`` (see the module docstring).

    Integer inputs stay integers (int64: token ids, say, for a model that starts with
    ``nn.Embedding``), others become float32; integer targets stay integers (class indices),
    others float32.
    ``first_node`` is the index of ``datasets[0]`` in messages (a process's block of nodes);
    ``min_nodes`` the fewest accepted (a block may hold one node of a larger network).
    Refused: fewer than ``min_nodes`` nodes, an empty node, records whose shape, input kind
    (integer or real) or target kind differs from the first node's (non-finite values are refused by
    ``dpdl.engine.NodeData.from_arrays``, the one door of every run's data).
    """
    if not isinstance(datasets, Sequence) or isinstance(datasets, str | bytes):
        raise DPDLError(
            "the nodes' data must be a list with one local data set per node, got "
            f"{type(datasets).__name__}"
        )
    if len(datasets) < min_nodes:
        raise DPDLError(f"decentralized training needs at least 2 nodes, got {len(datasets)}")
    xs, ys = [], []
    for i, data in enumerate(datasets, start=first_node):
        x, y = local_arrays(data, f"node {i}'s data")
        if len(x) == 0:
            raise DPDLError(f"node {i}'s data has no records (every node needs at least one)")
        if xs and x.shape[1:] != xs[0].shape[1:]:
            raise DPDLError(
                f"node {i}'s inputs have record shape {x.shape[1:]} but node {first_node}'s have "
                f"{xs[0].shape[1:]}: every node's records must have the same shape"
            )
        if ys and y.shape[1:] != ys[0].shape[1:]:
            raise DPDLError(
                f"node {i}'s targets have shape {y.shape[1:]} per record but node "
                f"{first_node}'s have {ys[0].shape[1:]}"
            )
        integer = np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_
        if ys and integer != (np.issubdtype(ys[0].dtype, np.integer) or ys[0].dtype == np.bool_):
            raise DPDLError(
                f"node {i}'s targets are {y.dtype} but node {first_node}'s are {ys[0].dtype}: "
                "class indices (integers) on some nodes and real values on others"
            )
        integer_x = bool(np.issubdtype(x.dtype, np.integer))
        if xs and integer_x != np.issubdtype(xs[0].dtype, np.integer):
            raise DPDLError(
                f"node {i}'s inputs are {x.dtype} but node {first_node}'s are {xs[0].dtype}: "
                "integer records (token ids) on some nodes and real values on others"
            )
        xs.append(x.astype(np.int64 if integer_x else np.float32, copy=False))
        ys.append(y.astype(np.int64 if integer else np.float32, copy=False))
    sizes = np.array([len(x) for x in xs])
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    parts = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(xs))]
    return stack_node_data(np.concatenate(xs), np.concatenate(ys), parts)


def _npz_array(arrays, key: str, path, what: str) -> np.ndarray:
    """One array of an npz file, loaded without pickle: an object array (pickled Python
    objects, which could run code on loading) is refused in one line."""
    try:
        return arrays[key]
    except ValueError as err:
        if "Object arrays" not in str(err):
            raise
        raise DPDLError(f"{what} {str(path)!r}: array {key!r} holds Python objects (dtype "
                        "object), which dpdl does not unpickle; save numeric arrays") from None


def read_records(path, what: str = "data file") -> tuple[np.ndarray, np.ndarray]:
    """``(inputs, targets)`` of one file: ``.npz`` with arrays ``x``/``y`` (or ``inputs``/
    ``targets``), or ``.csv`` (comma-separated numbers, an optional header line, the target in
    the last column: integer-valued targets become class indices).  Read as they are: any
    preprocessing is the data owner's, with public constants."""
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise DPDLError(f"{what} {str(path)!r} does not exist")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as arrays:
            for x_key, y_key in NPZ_KEYS:
                if x_key in arrays and y_key in arrays:
                    return local_arrays((_npz_array(arrays, x_key, path, what),
                                         _npz_array(arrays, y_key, path, what)), what)
            raise DPDLError(f"{what} {str(path)!r} needs arrays named x and y (or inputs and "
                            f"targets), it has {sorted(arrays.files)}")  # fmt: skip
    if path.suffix == ".csv":
        lines = path.read_text().strip().splitlines()
        try:
            float(lines[0].split(",")[0])
        except (ValueError, IndexError):
            lines = lines[1:]  # a header
        try:
            table = np.array([[float(v) for v in line.split(",")] for line in lines])
        except ValueError as err:
            raise DPDLError(f"{what} {str(path)!r}: not a table of numbers: {err}") from None
        if table.ndim != 2 or table.shape[1] < 2 or not len(table):
            raise DPDLError(f"{what} {str(path)!r}: expected rows of features and a target")
        y = table[:, -1]
        y = y.astype(np.int64) if np.all(y == np.round(y)) else y.astype(np.float32)
        return local_arrays((table[:, :-1].astype(np.float32), y), what)
    raise DPDLError(f"{what} {str(path)!r}: use a .npz or a .csv file")
