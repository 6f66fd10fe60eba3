"""The checks a trainer makes of what it is given, before it writes or trains anything: the
number of nodes, each node's data (only the hosted nodes' are ever loaded), the topology, the
loss, and the model probed on a throw-away copy with synthetic records (outputs, per-record
losses, records treated independently, per-record gradients under torch.func, no state
changed by a forward), and the class labels of every record in range."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from dpdl.algorithms.dyn_d2p import LOSSES, NodeBatch, per_record_grads
from dpdl.engine.simulator import NodeData, evaluation_mode, stack_params
from dpdl.errors import DPDLError, require
from dpdl.models.state import module_state
from dpdl.models.validation import (
    refuse_state_changes,
    refuse_stateful,
    synthetic_records,
    throwaway_copy,
)

__all__ = [
    "as_topology",
    "check_eval_labels",
    "check_eval_records",
    "check_loss",
    "first_line",
    "local_node_data",
    "loss_name",
    "node_count",
    "per_record_loss",
    "probe_model",
]


def node_count(data, topology, nodes: int | None) -> int:
    """How many nodes the run has: ``nodes``, else what the topology or the data say."""
    import networkx as nx

    from dpdl.topology import Topology

    if nodes is not None:
        require(isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 2,
                f"nodes must be an integer >= 2, got {nodes!r}")  # fmt: skip
        return nodes
    if isinstance(topology, Topology):
        return int(topology.n)
    if isinstance(topology, nx.Graph):
        return int(topology.number_of_nodes())
    if isinstance(data, NodeData):
        return data.n_nodes
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return len(data)
    raise DPDLError("with data given as a function of the node index, say how many nodes there "
                    "are: nodes=N, or a topology that knows (a Topology or networkx graph)")


def local_node_data(data, n: int, first: int, count: int, device) -> NodeData:
    """The padded data of nodes first .. first + count - 1 only: from a NodeData of every node
    (or of just those), a sequence of one data set per node, or a function of the node index
    called for those nodes alone (the distributed runtime's parties keep their own data)."""
    from dpdl.data import stack_local_datasets

    if isinstance(data, NodeData):
        if data.n_nodes == count:
            return data
        require(data.n_nodes == n, f"the node data hold {data.n_nodes} nodes, the run has {n}")
        return data.block(first, count)
    if callable(data) and not isinstance(data, Sequence):
        local = []
        for i in range(first, first + count):
            try:
                local.append(data(i))
            except DPDLError:
                raise
            except Exception as err:
                raise DPDLError(f"the data function failed for node {i}: {type(err).__name__}: "
                                f"{first_line(err)}") from None  # fmt: skip
    else:
        require(isinstance(data, Sequence) and not isinstance(data, str | bytes),
                "data must be a list with one local data set per node, a function of the node "
                f"index, or NodeData; got {type(data).__name__}")  # fmt: skip
        require(len(data) == n, f"the data list has {len(data)} nodes, the topology {n}")
        local = list(data[first : first + count])
    # one node only as a block of a larger network, or as the central topology (n = 1)
    X, Y, mask = stack_local_datasets(local, first_node=first,
                                      min_nodes=1 if count < n or n == 1 else 2)
    return NodeData.from_arrays(X, Y, mask, device=device, first_node=first)


def as_topology(topology, n: int, params: dict[str, Any], seed: int):
    from dpdl.topology import Topology, from_mixing_function, from_networkx, make_topology

    if isinstance(topology, str):
        return make_topology(topology, n, seed=seed, **params)
    if isinstance(topology, Topology):
        require(not params, "topology_params apply to a topology given by name or function only")
        require(
            topology.n == n,
            f"topology {topology.name!r} has {topology.n} nodes but the data is split over {n}",
        )
        return topology
    try:
        import networkx as nx
    except ImportError:  # pragma: no cover - networkx is a dependency
        nx = None
    if nx is not None and isinstance(topology, nx.Graph):
        require(not params, "topology_params do not apply to a networkx graph")
        require(
            topology.number_of_nodes() == n,
            f"the networkx graph has {topology.number_of_nodes()} nodes but the data is split "
            f"over {n}",
        )
        return from_networkx(topology)
    if callable(topology):
        unknown = sorted(set(params) - {"period"})
        require(not unknown, f"a mixing-matrix function takes only topology_params 'period', "
                             f"not {unknown}")  # fmt: skip
        return from_mixing_function(topology, n, period=params.get("period"))
    raise DPDLError(
        "topology must be a name, a dpdl Topology, a networkx graph or a function k -> P^k; "
        f"got {type(topology).__name__}"
    )


def check_loss(loss):
    if callable(loss):
        return loss
    require(
        isinstance(loss, str) and loss in LOSSES,
        f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)} or give a callable "
        "(outputs, targets) -> per-record losses",
    )
    return loss


def per_record_loss(loss):
    return loss if callable(loss) else LOSSES[loss]


def loss_name(loss) -> str:
    if isinstance(loss, str):
        return loss
    name = getattr(loss, "__qualname__", None)
    if name is None:
        text = repr(loss)
        # an object's default repr holds its memory address, another in every process: a
        # seeded run's keys (and its trainer.json) would then never be reproduced
        name = type(loss).__qualname__ if " at 0x" in text else text
    return name


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


def check_eval_records(pair, what: str, *, record_shape: tuple[int, ...], loss,
                       classes: int | None,
                       record_dtype: torch.dtype = torch.float32,
                       ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(inputs, targets)`` tensors of one evaluation set (a pair or a torch Dataset): as many
    targets as inputs, at least one record, the nodes' record shape, whole-number inputs where
    the nodes' records are integers (``record_dtype``: token ids), and for cross_entropy
    class labels the model scores.  Left where they are (device, dtype)."""
    from dpdl.data import local_arrays

    x, y = (
        (pair[0], pair[1])
        if isinstance(pair, tuple | list) and len(pair) == 2
        and all(isinstance(t, torch.Tensor) for t in pair)
        else (torch.as_tensor(a) for a in local_arrays(pair, what))
    )  # fmt: skip
    require(len(x) == len(y), f"{what} has {len(x)} inputs but {len(y)} targets")
    require(len(x) > 0, f"{what} has no records")
    for part, name in ((x, "inputs"), (y, "targets")):
        # a NaN would make every loss NaN while the accuracy still prints as a number
        if part.is_floating_point():
            finite = torch.isfinite(part.reshape(len(part), -1)).all(dim=1)
            if not bool(finite.all()):
                raise DPDLError(f"{what} has non-finite {name} (NaN or inf), first at record "
                                f"{int(torch.nonzero(~finite)[0, 0])}")  # fmt: skip
    require(
        tuple(x.shape[1:]) == record_shape,
        f"{what} has record shape {tuple(x.shape[1:])} but the nodes' records have {record_shape}",
    )
    if not record_dtype.is_floating_point and x.is_floating_point():
        require(bool(torch.all(x == torch.round(x))),
                f"{what} has real-valued inputs but the nodes' records are integers (token "
                "ids)")  # fmt: skip
    if loss == "cross_entropy" and classes:
        check_eval_labels(y, what, classes)
    return x, y


def check_eval_labels(y: torch.Tensor, what: str, classes: int) -> None:
    """Evaluation labels are class indices of the model's outputs, checked before the run (a
    bad one would stop it at the first evaluation with a raw IndexError)."""
    if y.is_floating_point():
        require(bool(torch.all(y == torch.round(y))),
                f"{what} has real-valued labels; the cross_entropy loss needs class indices")
    bad = (y < 0) | (y >= classes)
    if bool(bad.any()):
        raise DPDLError(f"{what} has labels outside 0..{classes - 1} (the model's {classes} "
                        f"outputs), e.g. {int(y[bad][0])}")  # fmt: skip



def probe_model(model: nn.Module, node_data: NodeData, loss, device,
                first_node: int) -> int | None:  # fmt: skip
    """Probe a throw-away copy of the model, on synthetic records of the nodes' record shape
    (never on their records: a forward may keep what it sees in the module), with the loss:
    outputs, per-record losses, records treated independently, per-record gradients under
    torch.func, and no state changed by any of these forwards nor by a plain one in train or
    eval mode, every way the engine runs it, nor any draw from a process-wide random generator
    (:func:`~dpdl.models.validation.refuse_stateful`, the loss's state too).  Then every
    hosted node's labels (cross_entropy: class indices the model scores).  Returns the
    number of classes the model scores (cross_entropy), else None."""
    record_shape, dtype = tuple(node_data.inputs.shape[2:]), node_data.inputs.dtype
    target_like = node_data.targets.new_zeros(node_data.targets.shape[2:])
    # also: the model takes such records
    refuse_stateful(model, record_shape, device, loss=per_record_loss(loss),
                    target_like=target_like, dtype=dtype)  # fmt: skip
    probe = throwaway_copy(model, device)  # in its own modes: those it trains in
    before = module_state(probe)
    count = 3
    x = synthetic_records(record_shape, count, device, dtype)
    # zeros: a class every classifier scores, a value every regression target can take
    y = torch.zeros((count, *target_like.shape), dtype=target_like.dtype, device=device)
    with torch.no_grad():
        out = probe(x)
    _check_per_record_losses(loss, out, y, count)
    _check_records_independent(probe, record_shape, device, dtype)
    params = stack_params(probe, 1, device)
    batch = NodeBatch(x, y, torch.zeros(count, dtype=torch.int64, device=device), 1)
    buffers = dict(probe.named_buffers())
    try:
        per_record_grads(probe, params, batch, loss=loss, buffers=buffers)
    except Exception as err:
        raise DPDLError(
            "per-record gradients of this model cannot be computed with torch.func "
            f"(vmap over records): {type(err).__name__}: {first_line(err)}"
        ) from None
    refuse_state_changes(before, probe, "the probe's forwards")
    classes = None
    if loss == "cross_entropy":
        classes = int(out.shape[-1])
        _check_class_labels(node_data, classes, first_node)
    return classes


def _check_per_record_losses(loss, out: torch.Tensor, y: torch.Tensor, count: int) -> None:
    try:
        values = per_record_loss(loss)(out, y)
    except Exception as err:
        raise DPDLError(
            f"loss {loss_name(loss)!r} fails on the model's outputs {tuple(out.shape)} "
            f"and targets {tuple(y.shape)}: {type(err).__name__}: {first_line(err)}"
        ) from None
    if not isinstance(values, torch.Tensor) or tuple(values.shape) != (count,):
        shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values)
        raise DPDLError(
            f"loss {loss_name(loss)!r} must return one value per record (shape "
            f"({count},) for {count} records), got {shape}; use reduction='none'"
        )


def _check_class_labels(node_data: NodeData, classes: int, first_node: int) -> None:
    """Every node's labels are class indices the model can score, checked for all records
    before anything runs: a bad label found mid-run would stop the run at the first step
    that samples it, which would tell when that record was sampled."""
    targets, mask = node_data.targets, node_data.mask
    require(not targets.is_floating_point(),
            "the cross_entropy loss needs integer class labels, got real-valued targets")
    bad = (((targets < 0) | (targets >= classes)) & mask).any(dim=1).nonzero()
    if len(bad):
        node = int(bad[0])
        values = targets[node][mask[node]]
        wrong = values[(values < 0) | (values >= classes)]
        raise DPDLError(f"node {first_node + node} has labels outside 0..{classes - 1} "
                        f"(the model's {classes} outputs), e.g. {int(wrong[0])}")  # fmt: skip


def _check_records_independent(model: nn.Module, record_shape: tuple[int, ...], device,
                               dtype: torch.dtype = torch.float32) -> None:  # fmt: skip
    """Refuse a model whose output for one record depends on the other records of its
    batch (a mean or norm over the batch, like BatchNorm's).  Training never lets records
    meet (each is its own batch of one under vmap, so privacy holds regardless), but such
    a model would be trained on something other than what it computes when evaluated.
    Distinct synthetic records show such a statistic as well as real ones would."""
    x = synthetic_records(record_shape, 4, device, dtype)
    with evaluation_mode(model), torch.no_grad():  # dropout off: a record, one output
        together = model(x)
        alone = torch.cat([model(x[i : i + 1]) for i in range(len(x))])
    scale = float(alone.abs().max()) + 1e-6
    require(
        tuple(together.shape) == tuple(alone.shape)
        and float((together - alone).abs().max()) <= 1e-4 * scale,
        "the model's output for a record depends on the other records of its batch (a "
        "statistic over the batch, as in BatchNorm): per-record privacy needs a model "
        "that treats records independently (use GroupNorm or LayerNorm)",
    )
