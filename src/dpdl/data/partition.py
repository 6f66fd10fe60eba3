"""Splitting a training set across nodes, and stacking per-node data for the simulator."""

from __future__ import annotations

import hashlib
import math

import numpy as np

from dpdl.errors import DPDLError

SCHEMES = ("iid", "dirichlet", "shards")
# Flower's DirichletPartitioner redraws at most this many times to meet min_partition_size.
MAX_DIRICHLET_TRIES = 10


def _check_nodes(n_records: int, n_nodes) -> int:
    if isinstance(n_nodes, bool) or not isinstance(n_nodes, int | np.integer):
        raise DPDLError(f"n_nodes must be an integer, got {n_nodes!r}")
    n_nodes = int(n_nodes)
    if n_nodes < 1:
        raise DPDLError(f"n_nodes must be >= 1, got {n_nodes}")
    if n_nodes > n_records:
        raise DPDLError(
            f"cannot split {n_records} records over n_nodes={n_nodes}: more nodes than records"
        )
    return n_nodes


def partition(
    y: np.ndarray,
    n_nodes: int,
    *,
    scheme: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    min_records_per_node: int | None = None,
    min_partition_size: int | None = None,
    shards_per_node: int = 2,
) -> list[np.ndarray]:
    """Split record indices ``0..len(y)-1`` into ``n_nodes`` disjoint, sorted index arrays.

    ``scheme="iid"`` (the MATH.md §4 setting, "data shuffled and split evenly"): a seeded
    shuffle cut into equal parts of ⌊N/n⌋ records each; the N mod n records that land last
    in the shuffle are dropped, so every node has exactly the same size.

    ``scheme="dirichlet"``: label-skewed non-IID split. First ``min_records_per_node`` records
    drawn uniformly at random are reserved for every node (default min(10, ⌊N/n⌋); so no
    node is ever empty, which would leave it with nothing to learn from); then, for each
    class c, a share vector q_c ~ Dirichlet(alpha·1_n) over nodes is drawn and the remaining
    records of class c are dealt to nodes by a multinomial with probabilities q_c. Smaller
    ``alpha`` means more skew; every record is assigned. Labels must be integer class indices.

    ``min_partition_size`` gives Flower's semantics instead (``flwr_datasets``'
    ``DirichletPartitioner``): no reserved records, so α alone shapes every node's labels;
    each class is cut by its Dirichlet shares, and the whole draw is repeated (at most
    ``MAX_DIRICHLET_TRIES`` times) until every node holds at least that many records.

    ``scheme="shards"`` (McMahan et al. 2017's pathological split): the records sorted by
    label are cut into ``n_nodes · shards_per_node`` equal shards and every node gets
    ``shards_per_node`` of them at random, so it sees about that many classes.
    """
    labels = np.asarray(y)
    if labels.ndim != 1:
        raise DPDLError(f"partition needs a 1-D label array, got shape {labels.shape}")
    n_records = labels.shape[0]
    n_nodes = _check_nodes(n_records, n_nodes)
    rng = np.random.default_rng(seed)

    if scheme == "iid":
        per_node = n_records // n_nodes
        shuffled = rng.permutation(n_records)[: per_node * n_nodes]
        return [np.sort(part) for part in shuffled.reshape(n_nodes, per_node)]

    if scheme not in SCHEMES:
        raise DPDLError(f"unknown partition scheme {scheme!r}; choose one of {SCHEMES}")
    if not (np.issubdtype(labels.dtype, np.integer) or labels.dtype == np.bool_):
        raise DPDLError(
            "the dirichlet partition splits by class label and needs integer labels, "
            f"got dtype {labels.dtype} (use scheme='iid' for regression targets)"
        )
    if scheme == "shards":
        return _shards(labels, n_nodes, shards_per_node, rng)
    if not (np.isfinite(alpha) and alpha > 0):
        raise DPDLError(f"dirichlet alpha must be a positive number, got {alpha!r}")
    if min_partition_size is not None:
        if min_records_per_node is not None:
            raise DPDLError("give min_partition_size (Flower's semantics) or "
                            "min_records_per_node (reserved records), not both")
        return _dirichlet_flower(labels, n_nodes, float(alpha), min_partition_size, rng)
    if min_records_per_node is None:
        min_records_per_node = min(10, n_records // n_nodes)
    if isinstance(min_records_per_node, bool) or int(min_records_per_node) != min_records_per_node \
            or min_records_per_node < 0:
        raise DPDLError(
            f"min_records_per_node must be a non-negative integer, got {min_records_per_node!r}"
        )
    min_records_per_node = int(min_records_per_node)
    if min_records_per_node * n_nodes > n_records:
        raise DPDLError(
            f"cannot give each of n_nodes={n_nodes} at least min_records_per_node="
            f"{min_records_per_node} records: only {n_records} records "
            f"(at most {n_records // n_nodes} per node)"
        )

    shuffled = rng.permutation(n_records)
    n_reserved = min_records_per_node * n_nodes
    reserved_idx = shuffled[:n_reserved]
    reserved_node = np.repeat(np.arange(n_nodes), min_records_per_node)

    rest = shuffled[n_reserved:]
    # Sorting the remaining records by label makes each class a contiguous block; within
    # block c the first node_counts[c, 0] records go to node 0, the next node_counts[c, 1]
    # to node 1, and so on.
    order = np.argsort(labels[rest], kind="stable")
    rest_sorted = rest[order]
    _, class_counts = np.unique(labels[rest], return_counts=True)
    shares = rng.dirichlet(np.full(n_nodes, float(alpha)), size=len(class_counts))
    node_counts = rng.multinomial(class_counts, shares)  # (classes, nodes)
    rest_node = np.repeat(np.tile(np.arange(n_nodes), len(class_counts)), node_counts.ravel())

    all_idx = np.concatenate([reserved_idx, rest_sorted])
    all_node = np.concatenate([reserved_node, rest_node])
    by_node = np.argsort(all_node, kind="stable")
    sizes = np.bincount(all_node, minlength=n_nodes)
    return [np.sort(part) for part in np.split(all_idx[by_node], np.cumsum(sizes)[:-1])]


def _dirichlet_flower(labels, n_nodes, alpha, min_size, rng) -> list[np.ndarray]:
    if isinstance(min_size, bool) or not isinstance(min_size, int | np.integer) or min_size < 0:
        raise DPDLError(f"min_partition_size must be a non-negative integer, got {min_size!r}")
    classes = np.unique(labels)
    for _ in range(MAX_DIRICHLET_TRIES):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_nodes)]
        for c in classes:
            members = rng.permutation(np.flatnonzero(labels == c))
            shares = rng.dirichlet(np.full(n_nodes, alpha))
            cuts = (np.cumsum(shares)[:-1] * members.size).astype(int)
            for node, piece in enumerate(np.split(members, cuts)):
                parts[node].append(piece)
        result = [np.sort(np.concatenate(p)) for p in parts]
        if min(len(p) for p in result) >= min_size:
            return result
    raise DPDLError(
        f"no Dirichlet(alpha={alpha:g}) draw in {MAX_DIRICHLET_TRIES} gave every one of "
        f"{n_nodes} nodes min_partition_size={min_size} records; lower it or raise alpha"
    )


def _shards(labels, n_nodes, shards_per_node, rng) -> list[np.ndarray]:
    if isinstance(shards_per_node, bool) or not isinstance(shards_per_node, int | np.integer) \
            or shards_per_node < 1:
        raise DPDLError(f"shards_per_node must be a positive integer, got {shards_per_node!r}")
    n_shards = n_nodes * int(shards_per_node)
    if n_shards > labels.shape[0]:
        raise DPDLError(f"cannot cut {labels.shape[0]} records into {n_shards} shards")
    shuffled = rng.permutation(labels.shape[0])  # ties within a class in random order
    by_label = shuffled[np.argsort(labels[shuffled], kind="stable")]
    size = labels.shape[0] // n_shards  # the remainder (last in label order) is dropped
    shards = by_label[: size * n_shards].reshape(n_shards, size)
    owner = rng.permutation(n_shards).reshape(n_nodes, int(shards_per_node))
    return [np.sort(shards[row].ravel()) for row in owner]


def label_distribution(y: np.ndarray, parts: list[np.ndarray], num_classes: int) -> np.ndarray:
    """(n_nodes, num_classes) matrix of per-node class frequencies (rows sum to 1; an empty
    node's row is all zeros). Useful to report how skewed a partition is."""
    labels = np.asarray(y)
    sizes = np.array([len(p) for p in parts])
    node_of = np.repeat(np.arange(len(parts)), sizes)
    flat = np.concatenate(parts).astype(np.int64) if len(parts) else np.zeros(0, np.int64)
    counts = np.zeros((len(parts), num_classes))
    np.add.at(counts, (node_of, labels[flat]), 1.0)
    return counts / np.maximum(sizes, 1)[:, None]


def held_out_mask(inputs, targets, share: float, seed: int, node: int) -> np.ndarray:
    """Which of node ``node``'s records ``node_eval_share = share`` holds out as the node's own
    evaluation set: a boolean per record, each decided by a keyed hash of the record alone.

    Record r is held out iff the first 8 bytes of SHA-256("dpdl node_eval_share" ‖ seed ‖
    node ‖ r's bytes), read as an unsigned integer, lie below ⌊share · 2⁶⁴⌋: a hash keyed by
    the public seed, r's bytes its input as little-endian float32 and its target as float64.
    Neither the node's size J_i nor the record's slot enters, so adding or removing one record
    never changes which *other* records are held out (a hold-out drawn from J_i did:
    ``nodeeval_membership``); about share · J_i records are held out (possibly none), and
    every process (and the config path's label histograms) picks the same ones.
    ``inputs`` (J, ...) and ``targets`` (J, ...): numpy arrays or CPU tensors.
    """
    if not 0 < share < 1:
        raise DPDLError(f"node_eval_share must lie strictly between 0 and 1, got {share!r}")
    x = np.ascontiguousarray(np.asarray(inputs), dtype="<f4")
    y = np.ascontiguousarray(np.asarray(targets), dtype="<f8")
    if len(x) != len(y):
        raise DPDLError(f"node {node} has {len(x)} inputs but {len(y)} targets")
    key = hashlib.sha256(b"dpdl node_eval_share" + int(seed).to_bytes(16, "little", signed=True))
    key.update(int(node).to_bytes(8, "little"))
    threshold = math.floor(share * 2.0**64)
    rows_x, rows_y = x.reshape(len(x), -1), y.reshape(len(y), -1)
    held = np.zeros(len(x), dtype=bool)
    for r in range(len(x)):
        digest = key.copy()
        digest.update(rows_x[r].tobytes())
        digest.update(rows_y[r].tobytes())
        held[r] = int.from_bytes(digest.digest()[:8], "little") < threshold
    return held


def stack_node_data(x, y, parts: list[np.ndarray]):
    """Gather each node's records into zero-padded stacked arrays for the simulator.

    Returns ``(X, Y, mask)`` with X of shape ``(n, J_max, *x.shape[1:])``, Y of shape
    ``(n, J_max, *y.shape[1:])`` and a boolean ``mask`` of shape ``(n, J_max)`` that is True
    exactly on real records (node i's first ``len(parts[i])`` slots, in ``parts[i]`` order).
    ``x`` and ``y`` may be numpy arrays or torch tensors; the outputs are of the same kind.
    """
    if len(parts) == 0:
        raise DPDLError("stack_node_data needs at least one node part, got an empty list")
    n_records = len(x)
    if len(y) != n_records:
        raise DPDLError(f"x has {n_records} records but y has {len(y)}")
    index_arrays = [np.asarray(p, dtype=np.int64).reshape(-1) for p in parts]
    sizes = np.array([len(p) for p in index_arrays], dtype=np.int64)
    flat = np.concatenate(index_arrays)
    if flat.size and (flat.min() < 0 or flat.max() >= n_records):
        bad = flat[(flat < 0) | (flat >= n_records)][0]
        raise DPDLError(f"partition index {bad} is out of range for {n_records} records")
    n_nodes, j_max = len(parts), int(sizes.max())
    node_of = np.repeat(np.arange(n_nodes), sizes)
    slot_of = np.arange(flat.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    mask = np.zeros((n_nodes, j_max), dtype=bool)
    mask[node_of, slot_of] = True

    import torch  # imported here: `import dpdl.data` stays free of torch

    if isinstance(x, torch.Tensor):
        flat_t = torch.from_numpy(flat).to(x.device)
        rows, cols = torch.from_numpy(node_of), torch.from_numpy(slot_of)
        x_stacked = x.new_zeros((n_nodes, j_max, *x.shape[1:]))
        x_stacked[rows, cols] = x[flat_t]
        y_t = y if isinstance(y, torch.Tensor) else torch.as_tensor(np.asarray(y))
        y_stacked = y_t.new_zeros((n_nodes, j_max, *y_t.shape[1:]))
        y_stacked[rows, cols] = y_t[flat_t.to(y_t.device)]
        return x_stacked, y_stacked, torch.from_numpy(mask).to(x.device)

    x_arr, y_arr = np.asarray(x), np.asarray(y)
    x_stacked = np.zeros((n_nodes, j_max, *x_arr.shape[1:]), dtype=x_arr.dtype)
    y_stacked = np.zeros((n_nodes, j_max, *y_arr.shape[1:]), dtype=y_arr.dtype)
    x_stacked[node_of, slot_of] = x_arr[flat]
    y_stacked[node_of, slot_of] = y_arr[flat]
    return x_stacked, y_stacked, mask
