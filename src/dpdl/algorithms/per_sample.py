"""Per-node sums of clipped per-record gradients without a copy of the weights per record.

The plain way (:func:`dpdl.algorithms.dyn_d2p.per_record_grads`) gives every sampled record
its own copy of its node's parameters and ``vmap``-s ``grad`` over (parameters, record); at
b = 16 that is ~R x d floats copied and as many per-record gradients written, most of them for
the first fully connected layer.  Here instead (book-keeping clipping, Bu et al. 2023):

1. nodes are grouped by batch size and each chunk of nodes runs one ``vmap`` over nodes, with
   that node's (shared) parameters, of a ``vmap`` over its records, each a batch of one:
   records are isolated by construction (a model that mixes the records of a batch cannot
   make one record's contribution depend on another's), while the kernels stay batched;
   records are padded to the chunk's largest batch (padded records carry loss weight 0);
2. one backward gives, for every layer that holds parameters, its input ``a_r`` and the
   gradient ``g_r`` of record r's loss with respect to its output (zero "probe" tensors added
   to the outputs are what autograd differentiates);
3. each layer's per-record gradient comes from (a_r, g_r): for a linear layer on a vector it
   is the rank-one g_r a_r^T, whose norm is ||g_r|| ||a_r|| (no per-record gradient at all);
   for a linear layer on several positions and for a convolution, the per-record gradient
   P_r = sum_t g_rt a_rt^T itself (O x C k k for a convolution: the weight gradient of one
   grouped convolution with a group per record);
   GroupNorm / LayerNorm from the normalised input; for an embedding, the rows of the
   record's distinct tokens, each the sum of that token's output gradients (token ids are
   the records' int64 inputs);
4. the clip factors c_r = min(1, C / ||g_r||) weight one batched product per layer and node,
   sum_r c_r g_r a_r^T or sum_r c_r P_r, the node's clipped sum, with no second backward.

No Gram-matrix ("ghost") norms: a record's several positions may nearly cancel in float
arithmetic, and a norm computed one way from terms that are summed another way does not bound
what is summed (a record could then move its node's sum by far more than C, or erase the
other records by absorption).  Every term that enters a sum over records is a record's own
clipped contribution, of norm <= C.

Supported layers: the types registered in :mod:`dpdl.algorithms.per_sample_layers` (one
handler class per type: ``nn.Linear``, ``nn.Conv2d`` (zero padding), ``nn.GroupNorm``,
``nn.LayerNorm``, ``nn.Embedding``), each called once per forward and owning its own
parameters, which nothing outside the layer's own forward uses (a structural check: every
torch call of one forward is traced).  Any other model (another layer with parameters, a
layer called twice, tied or shared weights) uses the plain path: same numbers, slower.

Privacy never rests on the layer formulas being the true gradient: a record's contribution
is c_r times the per-layer terms built from its own (a_r, g_r), and c_r = min(1, C / norm of
those very terms), so every contribution has norm <= C and depends on that record alone, for
any model; a record whose terms are not finite contributes zero.
"""

from __future__ import annotations

import copy
import logging
import math
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.func import functional_call, vmap
from torch.overrides import TorchFunctionMode

from dpdl.algorithms.per_sample_layers import LAYERS, LayerTerms, RankOne, SparseRows

Params = dict[str, torch.Tensor]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

log = logging.getLogger(__name__)

# Clip bounds are applied at C (1 - 2^-12): the float32 arithmetic that forms a record's norm,
# scales its terms and sums them with the others' may move a sum by a few 2^-24 relative more
# than the exact C.  The worst case of a float32 sum of R terms moves it by 2 R^2 2^-24 C (an
# adversary can make it happen: records that round each other away), so no float32 sum of a
# private step covers more than EXACT_RECORDS records of one node, which the margin covers;
# longer sums go on in float64 (Accumulator(exact=True)), where it covers ~2^20 records
# (MATH.md §10.3; `dpdl audit --threat implementation` measures it).
SENSITIVITY_MARGIN = 1.0 - 2.0**-12
EXACT_RECORDS = 32

# Working memory one chunk of records may use, as the plan estimates it (each layer's input,
# output, probe and output gradient, and per-record gradients): bounds the peak whatever n and
# b are.  What the forward saves between layers (activations, pooling indices) is not
# counted: measured, a chunk takes ~2-3x the estimate (bench_floor.py --memory).
CHUNK_BYTES = 24 * 2**20
# Fixed cost of one chunk (a vmapped forward + backward + per-layer book-keeping) in units of
# multiply-adds of per-record work, for the grouping below (measured on one CPU core: ~1.5 ms
# of dispatch per chunk of the shallow CNN, ~7 records of its per-record work).
CHUNK_OVERHEAD_MACS = 6.0e7
# Cost of copying one parameter of a node for a unit of records (an index_select into fresh
# memory, page faults included), in the same multiply-add units.
COPY_MACS_PER_PARAMETER = 16.0


@dataclass
class _Plan:
    layers: list[LayerTerms]
    macs_per_record: float
    bytes_per_record: float
    problems: list[str] = field(default_factory=list)


_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _make_plan(model: nn.Module, record_shape: tuple[int, ...], params: Params,
               record_dtype: torch.dtype | None = None) -> _Plan:  # fmt: skip
    problems: list[str] = []
    every_use = list(model.named_parameters(remove_duplicate=False))
    if len(every_use) != len(dict(model.named_parameters())):
        problems.append("tied parameters")
    layers = _find_layers(model, params, problems)
    _trace(model, layers, record_shape, params, problems, record_dtype)
    macs = bytes_ = 0.0
    for layer in layers.values():
        n_in, n_out = math.prod(layer.in_shape), math.prod(layer.out_shape)
        bytes_ += 4.0 * (2 * n_in + 3 * n_out)  # saved input, output, probe + its gradient
        # whole numbers below 2**53: adding a layer's parts in one go changes no bit
        layer_macs, layer_bytes = layer.cost()
        macs += layer_macs
        bytes_ += layer_bytes
    itemsize = next(iter(params.values())).element_size() / 4.0
    return _Plan(list(layers.values()), max(macs, 1.0), itemsize * bytes_, problems=problems)


def _find_layers(
    model: nn.Module, params: Params, problems: list[str]
) -> dict[nn.Module, LayerTerms]:
    """{module: its handler} for every module that holds parameters and can be read; what
    cannot be read (an unregistered type, other parameters, a layer's own problem) goes to
    ``problems``."""
    layers: dict[nn.Module, LayerTerms] = {}
    covered: set[str] = set()
    for prefix, module in model.named_modules():
        own = [name for name, p in module.named_parameters(recurse=False) if p is not None]
        if not own:
            continue
        handler = LAYERS.get(type(module))
        if handler is None or not set(own) <= {"weight", "bias"}:
            problems.append(f"{prefix or 'model'} ({type(module).__name__})")
            continue
        full = {name: f"{prefix}.{name}" if prefix else name for name in own}
        layer = handler(module, full.get("weight"), full.get("bias"))
        why = layer.problem()
        if why is not None:
            problems.append(f"{prefix} ({why})")
            continue
        layers[module] = layer
        covered.update(full.values())
    if covered != set(params):
        problems.append("parameters outside the supported layers")
    return layers


def _trace(model, layers, record_shape, params: Params, problems: list[str],
           record_dtype: torch.dtype | None = None) -> None:  # fmt: skip
    """One forward of one record (zeros of ``record_dtype``, the parameters' when None: no
    one's data, and a valid index for token ids): sets each layer's input / output shape, and
    checks that each layer runs exactly once and its parameters are used nowhere else (its
    (a, g) would then miss part of their gradient).  It runs the user's code on a throw-away
    copy: whatever that forward leaves in a module stays in the copy."""
    clone = copy.deepcopy(model)
    twin = dict(zip(model.modules(), clone.modules(), strict=True))  # same order, same tree
    calls: dict[nn.Module, int] = {}

    def recorder(layer: LayerTerms):
        def record(module, args, out):
            calls[layer.module] = calls.get(layer.module, 0) + 1
            layer.in_shape = tuple(args[0].shape[1:])
            layer.out_shape = tuple(out.shape[1:])

        return record

    for module, layer in layers.items():  # hooks on the copy: they go with it
        twin[module].register_forward_hook(recorder(layer))
    one = {name: p[0] for name, p in params.items()}
    owner = {id(one[name]): twin[module] for module, layer in layers.items()
             for name in layer.params if name in one}  # fmt: skip
    uses = _OutsideUses(owner)
    uses.track(clone)
    with torch.no_grad(), uses:
        first = next(iter(one.values()))
        dummy = torch.zeros((1, *record_shape), dtype=record_dtype or first.dtype,
                            device=first.device)  # fmt: skip
        functional_call(clone, one, (dummy,))
    if any(calls.get(m, 0) != 1 for m in layers):
        problems.append("a layer is not called exactly once per forward")
    if uses.outside:
        problems.append(f"parameters used outside their layer ({', '.join(sorted(uses.outside))})")


class _OutsideUses(TorchFunctionMode):
    """Records every parameter that a tensor-producing torch call uses while the module being
    run is not the parameter's own layer (e.g. ``x @ self.fc.weight`` in a parent's forward):
    the layer's (input, output gradient) would then miss part of that parameter's gradient."""

    def __init__(self, owner: dict[int, nn.Module]):
        super().__init__()
        self.owner, self.stack, self.outside = owner, [], set()
        self._names: dict[nn.Module, str] = {}

    def track(self, model: nn.Module) -> list:
        handles = []
        for name, module in model.named_modules():
            self._names[module] = name or "model"
            handles.append(module.register_forward_pre_hook(self._enter))
            handles.append(module.register_forward_hook(self._leave))
        return handles

    def _enter(self, module, args) -> None:
        self.stack.append(module)

    def _leave(self, module, args, out) -> None:  # a hook returning a value replaces the output
        self.stack.pop()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.stack and _holds_tensor(out):
            for arg in _flat(args, kwargs):
                module = self.owner.get(id(arg))
                if module is not None and self.stack[-1] is not module:
                    self.outside.add(f"{self._names[module]} in {self._names[self.stack[-1]]}")
        return out


def _flat(args, kwargs):
    stack = [args, kwargs or {}]
    while stack:
        item = stack.pop()
        if isinstance(item, list | tuple):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, torch.Tensor):
            yield item


def _holds_tensor(value) -> bool:
    return any(True for _ in _flat(value, None))


def book_keeping_plan(model: nn.Module, record_shape: tuple[int, ...], params: Params,
                      record_dtype: torch.dtype | None = None) -> _Plan:  # fmt: skip
    """The model's layers as book-keeping sees them (cached per model, record shape and dtype
    (``record_dtype``: the inputs', e.g. int64 token ids; None: the parameters') and parameter
    shapes); ``plan.problems`` lists what rules book-keeping out."""
    per_model = _PLANS.setdefault(model, {})
    key = (record_shape, record_dtype,
           tuple((k, tuple(v.shape), v.dtype) for k, v in params.items()))  # fmt: skip
    if key not in per_model:
        per_model[key] = _make_plan(model, record_shape, params, record_dtype)
        if per_model[key].problems:
            log.debug("per-record gradient path for %s: %s", type(model).__name__,
                      "; ".join(per_model[key].problems))  # fmt: skip
    return per_model[key]


# --------------------------------------------------------------------------- one chunk
def _forward_backward(model, layers, params, buffers, loss_fn, inputs, targets, loss_weights):
    """Inputs a and output gradients g of every layer, each (m, B, *shape).

    Two nested ``vmap``s: over the m units (each with its node's parameters) and, inside, over
    the unit's B records, each a batch of one.  A record's forward therefore sees no other
    record -- whatever the model does across its batch (a mean, a norm over the batch) -- so
    its loss, and so its a and g, depend on that record alone, by construction.  With B = 1
    a unit is one record and the inner ``vmap`` is left out (the same numbers, ~15 % less
    time at b = 1, where most chunks are of one record per unit).
    """
    m, B = loss_weights.shape
    first = next(iter(params.values()))
    # Zero probes as stride-0 views of one zero: the gradient with respect to each view is the
    # layer's output gradient all the same, with no (m, B, *out_shape) zeros in memory (for a
    # convolution's output, as large as its activations).
    zero = torch.zeros((), dtype=first.dtype, device=first.device, requires_grad=True)
    probes = [zero.expand(m, *([B] if B > 1 else []), *layer.out_shape) for layer in layers]
    index = {layer.module: k for k, layer in enumerate(layers)}
    state: dict = {}

    def hook(module, args, out):
        k = index[module]
        state["acts"][k] = args[0]
        return out + state["probes"][k].unsqueeze(0)

    def record_loss(p, x, y, w, record_probes):
        state["acts"], state["probes"] = [None] * len(layers), record_probes
        out = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return (loss_fn(out, y.unsqueeze(0)) * w).sum(), tuple(a.squeeze(0) for a in state["acts"])

    handles = [layer.module.register_forward_hook(hook) for layer in layers]
    try:
        if B == 1:
            losses, acts = vmap(record_loss, randomness="different")(
                params, inputs[:, 0], targets[:, 0], loss_weights[:, 0], probes
            )
        else:
            unit_loss = vmap(record_loss, in_dims=(None, 0, 0, 0, 0), randomness="different")
            losses, acts = vmap(unit_loss, randomness="different")(
                params, inputs, targets, loss_weights, probes
            )
    finally:
        for handle in handles:
            handle.remove()
    out_grads = torch.autograd.grad(losses.sum(), probes)
    if B == 1:
        return [a.detach().unsqueeze(1) for a in acts], [g.unsqueeze(1) for g in out_grads]
    return [a.detach() for a in acts], list(out_grads)


@dataclass
class _Regroup:
    """Where a chunk's records go when several of its units belong to one node: node slot
    ``unit_node[u]`` of ``n_nodes``, and row ``rows[q]`` of a (n_nodes x most, ...) layout
    for the q-th real record (units in order, records in order within a unit)."""

    unit_node: torch.Tensor
    rows: torch.Tensor
    n_nodes: int
    most: int


def _weighted_sums(layer: LayerTerms, terms, factors: torch.Tensor, mask, regroup) -> Params:
    """sum_r factors[u, r] * (record r's gradient) per unit, or per node with ``regroup``."""
    if isinstance(terms, RankOne):
        return _rank_one_sums(layer, terms, factors, mask, regroup)
    if isinstance(terms, SparseRows):
        return _sparse_rows_sums(layer, terms, factors, regroup)
    m, B = factors.shape
    out = {}
    for key, per_record in terms.items():
        name = layer.weight if key == "weight" else layer.bias
        flat = per_record.reshape(m, B, -1)
        total = torch.bmm(factors.unsqueeze(1).to(flat.dtype), flat).squeeze(1)
        out[name] = _per_node(total, regroup).reshape(-1, *per_record.shape[1:])
    return out


def _per_node(total: torch.Tensor, regroup) -> torch.Tensor:
    """Per-unit sums (m, ...) as per-node sums: unchanged without ``regroup``, else the sums
    of each node's units."""
    if regroup is None:
        return total
    return total.new_zeros((regroup.n_nodes, *total.shape[1:])).index_add_(
        0, regroup.unit_node, total
    )


def _rank_one_sums(layer: LayerTerms, terms: RankOne, factors, mask, regroup) -> Params:
    """:func:`_weighted_sums` of rank-one gradients: no per-record gradient is formed."""
    m, B = factors.shape
    out = {}
    g2, a2, bias = terms
    gc = g2 * factors.reshape(m * B, 1, 1).to(g2.dtype)
    groups = m
    if regroup is not None:  # records of one node side by side: one product per node
        real = mask.reshape(-1).nonzero().squeeze(1)
        groups = regroup.n_nodes
        gc = _scatter_rows(gc.index_select(0, real), regroup)
        a2 = _scatter_rows(a2.index_select(0, real), regroup)
        bias = _scatter_rows((bias * factors.reshape(-1, 1)).index_select(0, real), regroup)
    # sum over records and positions of c_r g_rt a_rt^T, one product per unit / node
    weight = torch.bmm(
        gc.reshape(groups, -1, gc.shape[-1]).transpose(1, 2),
        a2.reshape(groups, -1, a2.shape[-1]),
    )
    out[layer.weight] = weight.reshape(groups, *layer.module.weight.shape)
    if layer.bias is not None:
        if regroup is not None:
            out[layer.bias] = bias.reshape(groups, -1, bias.shape[-1]).sum(1)
        else:
            out[layer.bias] = torch.bmm(factors.unsqueeze(1), bias.reshape(m, B, -1)).squeeze(1)
    return out


def _sparse_rows_sums(layer: LayerTerms, terms: SparseRows, factors, regroup) -> Params:
    """:func:`_weighted_sums` of gradients that touch a few rows of the weight each (an
    embedding's): each record's rows, times its factor, added into its unit's (or node's) rows
    of the weight; no record's dense gradient is formed."""
    m, B = factors.shape
    index, rows = terms
    shape = layer.module.weight.shape
    groups = m if regroup is None else regroup.n_nodes
    unit = torch.arange(m, device=index.device) if regroup is None else regroup.unit_node
    # row index[r, k] of record r's unit (node) in the (groups * rows of the weight) layout
    where = (unit.repeat_interleave(B)[:, None] * shape[0] + index).reshape(-1)
    weighted = rows * factors.reshape(m * B, *[1] * (rows.dim() - 1)).to(rows.dtype)
    total = rows.new_zeros((groups * shape[0], *shape[1:]))
    total.index_add_(0, where, weighted.reshape(-1, *shape[1:]))
    return {layer.weight: total.reshape(groups, *shape)}


def _scatter_rows(rows: torch.Tensor, regroup: _Regroup) -> torch.Tensor:
    """(records, ...) -> (n_nodes * most, ...), zero where a node has fewer records."""
    out = rows.new_zeros((regroup.n_nodes * regroup.most, *rows.shape[1:]))
    return out.index_copy_(0, regroup.rows, rows)


def _chunk_clipped_sums(
    plan, model, params, buffers, loss_fn, inputs, targets, mask, clip, regroup=None,
    record_weights=None,
):  # fmt: skip
    """Clipped sums of one chunk of m units, inputs (m, B, ...), mask (m, B) of real records:
    per unit, or per node with ``regroup``; with ``clip=None``, the ``record_weights`` (m, B)
    weighted sums, unclipped."""
    m, B = mask.shape
    # the loss weights (0 / 1) in the inputs' dtype, or the parameters' for integer records
    weight_dtype = (inputs if inputs.is_floating_point() else next(iter(params.values()))).dtype
    acts, out_grads = _forward_backward(
        model, plan.layers, params, buffers, loss_fn, inputs, targets, mask.to(weight_dtype)
    )
    with torch.no_grad():
        if clip is None:
            return _unclipped_sums(plan, acts, out_grads, record_weights, mask, regroup)
        sq, all_terms = _all_layer_terms(plan, acts, out_grads, m * B, mask.device)
        if clip is not None and not bool((sq.isfinite() & (sq >= 0)).all()):
            # A record whose gradient is not finite contributes nothing (a zero vector: norm
            # 0 <= C), whatever the others: its inputs and output gradients are zeroed.
            keep = sq.isfinite() & (sq >= 0)
            acts = [a.flatten(0, 1).mul(keep.view(-1, *[1] * (a.dim() - 2))).view_as(a)
                    .nan_to_num_(0.0, 0.0, 0.0) for a in acts]  # fmt: skip
            out_grads = [g.flatten(0, 1).mul(keep.view(-1, *[1] * (g.dim() - 2))).view_as(g)
                         .nan_to_num_(0.0, 0.0, 0.0) for g in out_grads]  # fmt: skip
            sq, all_terms = _all_layer_terms(plan, acts, out_grads, m * B, mask.device)
        factors = (clip * SENSITIVITY_MARGIN / sq.sqrt().clamp_min(1e-30)).clamp(max=1.0)
        factors = factors.reshape(m, B) * mask
        sums: Params = {}
        for layer, terms in zip(plan.layers, all_terms, strict=True):
            sums.update(_weighted_sums(layer, terms, factors, mask, regroup))
    return sums


def _unclipped_sums(plan, acts, out_grads, weights, mask, regroup) -> Params:
    """sum_r weights[u, r] * (record r's gradient) per unit (per node with ``regroup``): no
    norm is needed, so where every real record of a unit has one weight (SGP's 1 / |S_i|), a
    layer that can sum a unit's gradients directly (a convolution: one weight gradient per
    unit, not one per record) does, and the sum is scaled after."""
    m = weights.shape[0]
    unit = weights[:, :1]  # a unit's first slot is a real record
    uniform = bool((weights == unit * mask).all())
    sums: Params = {}
    for layer, a, g in zip(plan.layers, acts, out_grads, strict=True):
        direct = layer.unit_sums(a, g) if uniform else None
        if direct is None:
            _, terms = layer.terms(a.flatten(0, 1), g.flatten(0, 1))
            sums.update(_weighted_sums(layer, terms, weights.to(g.dtype), mask, regroup))
            continue
        for name, total in direct.items():
            scale = unit.to(total.dtype).view(m, *[1] * (total.dim() - 1))
            sums[name] = _per_node(total * scale, regroup)
    return sums


def _all_layer_terms(plan, acts, out_grads, records: int, device):
    """The per-record squared norms (summed over layers) and every layer's terms."""
    sq = torch.zeros(records, dtype=out_grads[0].dtype, device=device)
    all_terms = []
    for layer, a, g in zip(plan.layers, acts, out_grads, strict=True):
        layer_sq, terms = layer.terms(a.flatten(0, 1), g.flatten(0, 1))
        sq += layer_sq
        all_terms.append(terms)
    return sq, all_terms


# --------------------------------------------------------------------------- grouping
@dataclass
class Chunk:
    """One vmap over ``len(nodes)`` units: unit u holds ``lengths[u]`` consecutive sampled
    records of node ``nodes[u]`` starting at flat row ``starts[u]``, padded to ``batch``.
    ``view`` is (first, last + 1) when the units are nodes first..last in order, each with all
    its records: their parameters are a slice, not a copy."""

    nodes: list[int]
    starts: list[int]
    lengths: list[int]
    batch: int
    view: tuple[int, int] | None = None


def _split(counts: list[int], unit: int) -> list[tuple[int, int, int]]:
    """(node, first row, length) of every unit: each node's records in runs of ``unit``."""
    units, row = [], 0
    for node, c in enumerate(counts):
        for first in range(0, c, unit):
            units.append((node, row + first, min(unit, c - first)))
        row += c
    return units


def _grouped(units, macs_per_record, records_per_chunk, copy_macs):
    """Units sorted by length, cut into groups by dynamic programming over the distinct
    lengths (cost of a group: its chunks' overhead + units x longest x per-record work + the
    parameter copies), each group cut into chunks of at most ``records_per_chunk`` padded
    records.  Returns (cost, chunks)."""
    units = sorted(units, key=lambda u: (u[2], u[0], u[1]))
    sizes = sorted({u[2] for u in units})
    up_to = [sum(1 for u in units if u[2] <= s) for s in sizes]

    def cost(lo: int, hi: int) -> float:
        count = up_to[hi] - (up_to[lo - 1] if lo else 0)
        chunks = math.ceil(count / max(1, records_per_chunk // sizes[hi]))
        return chunks * CHUNK_OVERHEAD_MACS + count * (sizes[hi] * macs_per_record + copy_macs)

    best, cut = [0.0] * (len(sizes) + 1), [0] * (len(sizes) + 1)
    for hi in range(1, len(sizes) + 1):
        best[hi], cut[hi] = min((best[lo] + cost(lo, hi - 1), lo) for lo in range(hi))
    chunks, hi = [], len(sizes)
    while hi > 0:
        lo = cut[hi]
        group = units[(up_to[lo - 1] if lo else 0) : up_to[hi - 1]]
        batch = sizes[hi - 1]
        per_chunk = max(1, records_per_chunk // batch)
        for s in range(0, len(group), per_chunk):
            part = group[s : s + per_chunk]
            chunks.append(Chunk([u[0] for u in part], [u[1] for u in part],
                                [u[2] for u in part], batch))  # fmt: skip
        hi = lo
    return best[-1], chunks[::-1]


def _in_order(counts, macs_per_record, records_per_chunk):
    """Every node, in order, all its records in one unit: chunks are slices of the stacked
    parameters (no copy), padded to the chunk's largest batch.  Returns (cost, chunks)."""
    chunks, cost, node, row, m = [], 0.0, 0, 0, len(counts)
    while node < m:
        last, batch = node, max(counts[node], 1)
        while last + 1 < m and (last + 2 - node) * max(batch, counts[last + 1]) <= (
            records_per_chunk
        ):
            last += 1
            batch = max(batch, counts[last])
        rows = counts[node : last + 1]
        starts = [row + sum(rows[:k]) for k in range(len(rows))]
        chunks.append(Chunk(list(range(node, last + 1)), starts, rows, batch, (node, last + 1)))
        cost += CHUNK_OVERHEAD_MACS + len(rows) * batch * macs_per_record
        row += sum(rows)
        node = last + 1
    return cost, chunks


def plan_chunks(counts: list[int], macs_per_record: float, records_per_chunk: int,
                params_per_node: int = 0, max_unit: int | None = None) -> list[Chunk]:  # fmt: skip
    """The cheapest way found to cover every sampled record once.

    Candidates: the nodes in order (parameter slices, padded to the largest batch), or each
    node's records cut into units of U = 1, 2, 4, ... records (U = 1 is the per-record layout:
    no padding, one parameter copy per record), units grouped by length to pad little.  The
    cost model counts per-record work in multiply-adds, a chunk's fixed overhead and
    ``COPY_MACS_PER_PARAMETER`` per parameter copied.  ``max_unit`` bounds the records of one
    node in one unit (a private step's float32 sums: :data:`EXACT_RECORDS`).
    """
    if not any(counts):
        return []
    copy_macs = COPY_MACS_PER_PARAMETER * params_per_node
    cap = max(counts) if max_unit is None else max_unit
    best = (_in_order(counts, macs_per_record, records_per_chunk) if max(counts) <= cap
            else (math.inf, []))  # fmt: skip
    unit = 1
    while True:
        candidate = _grouped(_split(counts, unit), macs_per_record, records_per_chunk, copy_macs)
        if candidate[0] < best[0]:
            best = candidate
        if unit >= min(max(counts), cap):
            break
        unit = min(2 * unit, cap)
    return best[1]


def _regroup(chunk: Chunk, device) -> tuple[_Regroup, list[int]]:
    uniq = sorted(set(chunk.nodes))
    slot = {node: k for k, node in enumerate(uniq)}
    per_node = dict.fromkeys(uniq, 0)
    for node, length in zip(chunk.nodes, chunk.lengths, strict=True):
        per_node[node] += length
    most = max(per_node.values())
    filled = dict.fromkeys(uniq, 0)
    rows = []
    for node, length in zip(chunk.nodes, chunk.lengths, strict=True):
        rows += range(slot[node] * most + filled[node], slot[node] * most + filled[node] + length)
        filled[node] += length
    unit_node = torch.tensor([slot[node] for node in chunk.nodes], device=device)
    return _Regroup(unit_node, torch.tensor(rows, device=device), len(uniq), most), uniq


@dataclass
class _ChunkInputs:
    """One chunk's records laid out (units, B): the rows of the flat batch, the mask of real
    records, and the units' parameters (a slice of the stacked ones when the chunk is a run
    of whole nodes in order, else a copy per unit)."""

    chunk: Chunk
    rows: torch.Tensor
    mask: torch.Tensor
    params: Params


def _chunk_inputs(plan: _Plan, params: Params, batch, max_unit=None) -> Iterator[_ChunkInputs]:
    """The chunks laid out one at a time: a chunk's parameter copies (a node's d parameters
    per unit) exist only while that chunk runs, not every chunk's at once."""
    counts = batch.counts.tolist()
    records_per_chunk = max(1, int(CHUNK_BYTES // plan.bytes_per_record))
    d = sum(p[0].numel() for p in params.values())
    device = batch.node.device
    last_row = max(batch.size - 1, 0)
    for chunk in plan_chunks(counts, plan.macs_per_record, records_per_chunk, d, max_unit):
        slot = torch.arange(chunk.batch, device=device)
        lengths = torch.tensor(chunk.lengths, device=device)
        starts = torch.tensor(chunk.starts, device=device)
        rows = (starts[:, None] + torch.minimum(slot[None, :], lengths[:, None] - 1)).clamp(
            0, last_row
        )
        if chunk.view is not None:
            lo, hi = chunk.view
            unit_params = {name: p[lo:hi] for name, p in params.items()}
        else:
            idx = torch.tensor(chunk.nodes, device=device)
            unit_params = {name: p.index_select(0, idx) for name, p in params.items()}
        yield _ChunkInputs(chunk, rows, slot[None, :] < lengths[:, None], unit_params)
        del unit_params  # the caller's reference is the only one while the chunk runs


def zeroed_like(out: Params | None, params: Params) -> Params:
    """Per-node sums to accumulate into: ``out`` zeroed in place, or fresh zeros like
    ``params``."""
    if out is None:
        return {name: torch.zeros_like(p) for name, p in params.items()}
    return {name: out[name].zero_() for name in params}


class Accumulator:
    """Where per-node sums go: ``target[i] += alpha * sum_i`` for the nodes each part covers.

    The plain use collects sums in zeros (``alpha`` 1).  The fused local step (:mod:`dpdl.
    algorithms.dyn_d2p`) adds the clipped sums, times -lr / b, straight into x^k - (lr sigma /
    b) xi, which a worker thread may still be writing: ``pending`` (a future of that write)
    holds every part back until it is done, so the chunks keep running meanwhile;
    :meth:`finish` waits for it, re-raising its error, and adds what was held.

    ``exact`` (a private step's clipped sums): once told that some node sums more than
    :data:`EXACT_RECORDS` records (:meth:`expect_records`), the target moves to float64 (a
    copy; :meth:`finish` returns it), so no float32 rounding acts on more than EXACT_RECORDS
    records of a node: the float32 bound of a sum holds whatever its order and grouping, and
    the chunks keep every float32 part of a longer sum within EXACT_RECORDS (MATH.md §10.3).
    """

    def __init__(self, target: Params, alpha: float = 1.0, pending: Future | None = None,
                 exact: bool = False):  # fmt: skip
        self.target, self.alpha, self._pending = target, float(alpha), pending
        self._held: list[tuple[torch.Tensor | slice, Params]] = []
        self.exact, self._wide = exact, False

    @classmethod
    def zeros(cls, out: Params | None, params: Params, exact: bool = False) -> Accumulator:
        """Plain sums: ``out`` zeroed (or fresh zeros like ``params``), weight 1."""
        return cls(zeroed_like(out, params), exact=exact)

    def expect_records(self, most: int) -> None:
        """The most records one node's sum will cover: above EXACT_RECORDS, float64."""
        self._wide = self._wide or (self.exact and most > EXACT_RECORDS)

    def add_rows(self, lo: int, hi: int, sums: Params) -> None:
        """Nodes lo..hi-1 receive ``sums`` {name: (hi - lo, *shape)}."""
        self._add(slice(lo, hi), sums)

    def add_at(self, index: torch.Tensor, sums: Params) -> None:
        """Node ``index[r]`` receives row r of ``sums`` {name: (len(index), *shape)}."""
        self._add(index, sums)

    def _add(self, where: torch.Tensor | slice, sums: Params) -> None:
        self._held.append((where, sums))
        if self._pending is None or self._pending.done():
            self._flush()

    def _flush(self) -> None:
        if self._pending is not None:
            self._pending.result()  # the target is complete (or its writer's error is raised)
            self._pending = None
        first = next(iter(self.target.values()), None)
        if self._wide and first is not None and first.dtype != torch.float64:
            self.target = {name: t.to(torch.float64) for name, t in self.target.items()}
        for where, sums in self._held:
            for name, total in sums.items():
                target = self.target[name]
                if isinstance(where, slice):
                    target[where].add_(total, alpha=self.alpha)
                else:
                    target.index_add_(0, where, total.to(target.dtype), alpha=self.alpha)
        self._held.clear()

    def finish(self) -> Params:
        """The target, once everything (the worker's part included) is in it."""
        self._flush()
        return self.target


def clipped_sums_by_node(
    plan: _Plan, model, params, batch, clip, *, loss_fn, buffers=None, out=None, weights=None,
    into: Accumulator | None = None,
):  # fmt: skip
    """sum_{r in S_i} min(1, C / ||g_r||) g_r for every node i of ``batch`` (a
    :class:`dpdl.algorithms.dyn_d2p.NodeBatch`), {name: (m, *shape)}, into ``out`` if given,
    or added chunk by chunk through ``into`` (an :class:`Accumulator`; returns its target).

    ``clip=None`` with ``weights`` (R,) gives sum_{r in S_i} weights_r g_r instead, unclipped
    (SGP's mean gradient with weights 1 / |S_i|): the same batched forward and input-gradient
    backward as the private step, without per-record terms (each unit's weighted sum
    directly: no norm is needed), so the non-private step never costs more than the private
    one."""
    buffers = buffers or {}
    private = clip is not None
    into = Accumulator.zeros(out, params, exact=private) if into is None else into
    device = batch.node.device
    # a private step sums at most EXACT_RECORDS records of a node in float32: its units are no
    # longer, and two units of one node are never merged in float32 (the Accumulator adds them)
    max_unit = EXACT_RECORDS if private else None
    into.expect_records(int(batch.counts.max()) if batch.size else 0)
    for part in _chunk_inputs(plan, params, batch, max_unit):
        chunk, regroup = part.chunk, None
        if chunk.view is None:
            idx = torch.tensor(chunk.nodes, device=device)
            if len(set(chunk.nodes)) < len(chunk.nodes) and not private:
                regroup, uniq = _regroup(chunk, device)
                idx = torch.tensor(uniq, device=device)
        record_weights = None if weights is None else weights[part.rows] * part.mask
        sums = _chunk_clipped_sums(
            plan, model, part.params, buffers, loss_fn, batch.inputs[part.rows],
            batch.targets[part.rows], part.mask, clip, regroup, record_weights,
        )  # fmt: skip
        if chunk.view is not None:
            into.add_rows(chunk.view[0], chunk.view[1], sums)
        else:
            into.add_at(idx, sums)
        del part, sums  # freed before the next chunk's copies and terms are made
    return into.finish()
