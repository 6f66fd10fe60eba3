"""The Dyn-D2P step (MATH.md §4, Algorithm 1 of seed 000) as small composable transforms.

Every tensor carries a leading *node* dimension: a model is a dict ``{name: (m, *shape)}`` of
the stacked parameters of m nodes (any contiguous block of nodes, or all n of them), the
push-sum weights are a vector ``w`` of shape (m,), and a node's local data is padded to
``(m, J_max, *input_shape)`` with a boolean mask of its real records.

One step, for every node i at once (the numbers are Algorithm 1's steps):

1. :func:`poisson_sample`     -- Poisson(p) batch S_i^k (may be empty);
2. :func:`per_record_grads`   -- g_ij = grad f_i(z_i^k; xi_j) at the de-biased z_i = x_i / w_i;
3. :func:`clip_per_record`    -- g_ij * min(1, C_k / ||g_ij||);
4. :func:`add_gaussian_noise` -- G_i = sum_j clipped g_ij + N(0, sigma_k^2 I), fresh per node
                                 and step, released exactly on a grid (MATH.md §10);
5. :func:`local_sgd_step`     -- x_i^{k+1/2} = x_i^k - gamma * G_i / b;
6. :func:`push_sum_mix`       -- x^{k+1} = P^k x^{k+1/2}, w^{k+1} = P^k w^k.

Steps 1-5 are :func:`local_update` (acts on any block of nodes: the distributed runtime calls
it on its rank's block), step 6 is the mixing; :func:`dyn_d2p_step` chains both.
:func:`local_update` is the composition sampling -> per-record clipping -> noise mechanism ->
update transforms, of a :class:`~dpdl.algorithms.step.LocalStep` (what stays fixed over a
run), :class:`~dpdl.algorithms.step.NodeRecords` (the nodes' data and streams) and
:class:`~dpdl.algorithms.step.StepArguments` (step k's C_k, sigma_k, gamma_k).  Step 5 takes the
node's update u_i^k = G_i / b (SGP: the mean gradient) through the update transforms of
:mod:`dpdl.algorithms.transforms` (MATH.md §4: :class:`~dpdl.algorithms.transforms.WeightDecay`
u + lambda z_i^k, :class:`~dpdl.algorithms.transforms.HeavyBall` m_i <- beta m_i + u, then the
step size gamma_k), post-processing of the noisy sum, so the accounting is unchanged.
When the transforms are the step size alone (Algorithm 1's step), :func:`local_update` runs
steps 2-5 as one pass over the models (:func:`_noisy_local_step`): the clipped sums
accumulate in the work buffer, the noise mechanism releases G_i from them and writes
x^k - (gamma / b) G_i over them; the same G_i as steps 3-5 one after the other (tests compare
the two).  Steps 2-3,
summed per node, are :func:`clipped_record_sums`: book-keeping clipping
(:mod:`dpdl.algorithms.per_sample`: no per-record gradient, no per-record weight copy) where
the model allows it, else steps 2-3 literally as above.
SGP (non-private) replaces 3-4 by the mean gradient over the sampled batch (zero when empty).

Randomness is per node: one secret stream per node (ChaCha20 under a 256-bit key,
:mod:`dpdl.algorithms.randomness`) draws, in this order each step, the node's J_i sampling
words and then (private algorithms only) its d noise words, so a node draws the same numbers
whichever process hosts it.  Reading the n streams is the one per-node loop of the step; all
arithmetic is batched over nodes.  On CPU the data-free half of the noise (the words and
their quantiles, nothing to do with the gradients) is computed on a worker thread while the
gradients are computed, which hides it when a core is free; the numbers are the same either
way.  The private step's noise is a pluggable :class:`NoiseMechanism`; the only certified one
is :data:`GAUSSIAN_RELEASE` (the audit plugs in broken ones to show it can tell).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from dpdl.algorithms.per_sample import (
    SENSITIVITY_MARGIN,
    Accumulator,
    book_keeping_plan,
    clipped_sums_by_node,
)
from dpdl.algorithms.randomness import SecretStream, derive_key
from dpdl.algorithms.step import (
    GAUSSIAN_RELEASE,
    LocalStep,
    NodeRecords,
    NoiseMechanism,
    StepArguments,
    StepBuffers,
)
from dpdl.algorithms.transforms import (
    State,
    apply_chain,
    apply_weight_decay,
    heavy_ball,
    keeps_state,
)
from dpdl.errors import DPDLError, require

Params = dict[str, torch.Tensor]

__all__ = [
    "NodeBatch",
    "LocalStep",
    "NodeRecords",
    "StepArguments",
    "StepBuffers",
    "LocalUpdateResult",
    "make_node_generators",
    "noisy_update",
    "SAMPLINGS",
    "node_sample_rates",
    "poisson_sample",
    "per_record_grads",
    "mean_batch_grads",
    "clip_factors",
    "clip_per_record",
    "clipped_record_sums",
    "sum_records",
    "NoiseMechanism",
    "GAUSSIAN_RELEASE",
    "add_gaussian_noise",
    "apply_weight_decay",
    "heavy_ball",
    "local_sgd_step",
    "push_sum_mix",
    "debias",
    "local_update",
    "check_private_noise",
    "dyn_d2p_step",
    "LOSSES",
]


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``F.cross_entropy(logits, target, reduction="none")`` for class indices (the trainer
    checks they lie in range), written as what it computes: the negated log-probability of
    the target class (nll_loss without class weights is exactly that gather), the same bits.
    Under ``vmap`` (every per-record gradient) F.cross_entropy's nll_loss is decomposed, and
    the decomposition's ``torch._check`` imports torch.fx's symbolic shapes and sympy: ~35 MB
    of a process's memory, added by the first step, for nothing this loss needs."""
    dim = 1 if logits.dim() >= 2 else 0  # the class dimension, as in F.cross_entropy
    picked = torch.log_softmax(logits, dim).gather(dim, target.long().unsqueeze(dim))
    return picked.squeeze(dim).neg()


def _squared_error(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return 0.5 * (pred.reshape(target.shape) - target).pow(2)


# How each node's Poisson rate is set (:func:`node_sample_rates`): "uniform" is the default.
SAMPLINGS = ("uniform", "per-node")

# Per-record losses: (batch, ...) predictions, (batch,) targets -> (batch,) losses.
LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cross_entropy": _cross_entropy,
    "squared_error": _squared_error,
}


def _loss_fn(loss):
    """A named loss of LOSSES, or a user's per-record callable (validated by the trainer)."""
    if callable(loss):
        return loss
    if loss not in LOSSES:
        raise DPDLError(f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)}")
    return LOSSES[loss]


# --------------------------------------------------------------------------- randomness
def make_node_generators(
    n_nodes: int,
    seed: int | bytes | None = None,
    *,
    first_node: int = 0,
    count: int | None = None,
    salts: Sequence[bytes] | None = None,
) -> list[SecretStream]:
    """One secret stream per node (:class:`~dpdl.algorithms.randomness.SecretStream`).

    ``seed=None`` (the secret default) keys every stream with 256 bits from ``os.urandom``.
    A root key (bytes, from :func:`dpdl.algorithms.randomness.stream_root`) or an int derives
    node i's key from the root, i and ``salts[i]`` (its data's fingerprint): reproducible
    noise, a research mode.  ``first_node``/``count`` return the streams of a contiguous block
    of nodes only; node i gets the same stream whichever block it belongs to.
    """
    require(n_nodes >= 1, f"n_nodes must be >= 1, got {n_nodes}")
    count = n_nodes - first_node if count is None else count
    require(
        0 <= first_node and first_node + count <= n_nodes and count >= 0,
        f"node block [{first_node}, {first_node + count}) is outside [0, {n_nodes})",
    )
    salts = [b""] * count if salts is None else list(salts)
    require(len(salts) == count, f"need one salt per node of the block: {len(salts)} for {count}")
    if seed is None:
        return [SecretStream() for _ in range(count)]
    if isinstance(seed, bytes):
        root = seed
    else:
        require(isinstance(seed, int | np.integer) and not isinstance(seed, bool),
                f"a node stream seed must be None, a root key (bytes) or an int, got "
                f"{type(seed).__name__}")  # fmt: skip
        root = derive_key("int root", int(seed))
    return [
        SecretStream(derive_key(root, "node", node, salt))
        for node, salt in zip(range(first_node, first_node + count), salts, strict=True)
    ]


# --------------------------------------------------------------------------- data
@dataclass
class NodeBatch:
    """The sampled records of m nodes, flat: inputs (R, ...), targets (R,), node (R,).

    ``node[r]`` is the (block-local) node that record r belongs to; R = sum_i |S_i^k| may be
    0.  Keeping the batch flat makes the per-record work proportional to the sampled count.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    node: torch.Tensor
    n_nodes: int

    @property
    def counts(self) -> torch.Tensor:
        return torch.bincount(self.node, minlength=self.n_nodes)

    @property
    def size(self) -> int:
        return int(self.node.shape[0])


def node_sample_rates(counts: Sequence[int], expected_batch_size: float,
                      sampling: str = "uniform") -> np.ndarray:  # fmt: skip
    """Every node's Poisson rate (float64, one per node of ``counts``).

    ``"uniform"``: p = b / J_min at every node (the smallest node's expected batch is b, a
    larger node's more); ``"per-node"``: q_i = b / J_i (an expected batch of b at every node).
    Either way the largest rate is b / J_min, the one the privacy schedule is accounted at.
    """
    require(sampling in SAMPLINGS,
            f"unknown sampling {sampling!r}; use one of {', '.join(SAMPLINGS)}")  # fmt: skip
    sizes = np.asarray(counts, dtype=np.float64)
    b = float(expected_batch_size)
    if sampling == "uniform":
        return np.full(sizes.size, b / float(np.min(sizes)))
    return b / sizes


def poisson_sample(
    inputs: torch.Tensor,
    targets: torch.Tensor,
    record_mask: torch.Tensor,
    sample_rate: float | Sequence[float],
    generators: Sequence[SecretStream],
) -> NodeBatch:
    """Step 1: each real record of node i joins S_i^k independently with probability q_i
    (exactly at most q_i: :meth:`~dpdl.algorithms.randomness.SecretStream.bernoulli`).

    ``sample_rate``: one rate for every node, or one per node (per-node sampling,
    :func:`node_sample_rates`).  ``inputs`` (m, J_max, ...), ``targets`` (m, J_max) and
    ``record_mask`` (m, J_max) are the padded local data sets.  Node i draws exactly J_i words
    from its own stream, so its draws do not depend on the padding, on the rate or on which
    nodes share its process.
    """
    m, j_max = record_mask.shape
    rates = np.asarray(sample_rate, dtype=np.float64)
    if rates.ndim == 0:
        rates = np.full(m, float(rates))
    require(rates.shape == (m,), f"need one sample rate per node: {rates.size} for {m}")
    require(bool(np.all((rates >= 0.0) & (rates <= 1.0))),
            f"sample_rate must lie in [0, 1], got {sample_rate}")  # fmt: skip
    require(len(generators) == m, f"need one generator per node: {len(generators)} for {m}")
    counts = record_mask.sum(dim=1).tolist()
    chosen = np.zeros((m, j_max), dtype=bool)  # padding is never sampled
    for i, (g, j_i) in enumerate(zip(generators, counts, strict=True)):
        chosen[i, : int(j_i)] = g.bernoulli(int(j_i), float(rates[i]))
    chosen_t = torch.from_numpy(chosen).to(record_mask.device)
    node, record = torch.nonzero(chosen_t & record_mask, as_tuple=True)
    return NodeBatch(inputs[node, record], targets[node, record], node, m)


# --------------------------------------------------------------------------- gradients
def per_record_grads(
    model: torch.nn.Module,
    params: Params,
    batch: NodeBatch,
    *,
    loss: str = "cross_entropy",
    buffers: Params | None = None,
) -> Params:
    """Step 2: g_r = grad of the loss of sampled record r at its node's ``params``.

    ``torch.func``: ``grad`` of a one-record ``functional_call``, ``vmap``-ed over the R
    sampled records of all nodes, each record with its node's parameters.  Returns
    ``{name: (R, *shape)}``.
    """
    loss_fn = _loss_fn(loss)
    buffers = buffers or {}

    def record_loss(p: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = functional_call(model, (p, buffers), (x.unsqueeze(0),))
        return loss_fn(out, y.unsqueeze(0)).sum()

    if batch.size == 0:
        return {name: p[:0] for name, p in params.items()}
    # index_select copies rows about 4x faster than advanced indexing p[batch.node] on CPU.
    at_record = {name: p.index_select(0, batch.node) for name, p in params.items()}
    return vmap(grad(record_loss), randomness="different")(at_record, batch.inputs, batch.targets)


def mean_batch_grads(
    model: torch.nn.Module,
    params: Params,
    batch: NodeBatch,
    *,
    loss: str = "cross_entropy",
    buffers: Params | None = None,
    out: Params | None = None,
    into: Accumulator | None = None,
) -> Params:
    """SGP's gradient: mean over node i's sampled batch (zero for an empty batch), (m, *shape).

    The 1/|S_i|-weighted sum of the records' gradients at their node's parameters.  Where
    book-keeping can read the model, one backward through the weight-shared batched forward of
    :func:`~dpdl.algorithms.per_sample.clipped_sums_by_node` without clipping (the
    private step's path, without its clip factors and noise); otherwise the records'
    gradients with the vmap of :func:`per_record_grads`, summed with ``index_add_``.
    ``out`` ({name: (m, *shape)}, overwritten) receives the gradients; ``into`` (an
    :class:`~dpdl.algorithms.per_sample.Accumulator`) adds them to its target instead.
    """
    loss_fn = _loss_fn(loss)
    into = Accumulator.zeros(out, params) if into is None else into
    if batch.size == 0:
        return into.finish()
    first = next(iter(params.values()))
    weights = 1.0 / batch.counts.clamp_min(1).to(first.dtype)[batch.node]
    plan = book_keeping_plan(model, tuple(batch.inputs.shape[1:]), params, batch.inputs.dtype)
    if not plan.problems and _node_batches_pay(batch) and not _couples_records(model):
        return _node_by_node_mean_grads(model, params, batch, loss_fn, buffers or {}, into)
    if not plan.problems:
        return clipped_sums_by_node(plan, model, params, batch, None, loss_fn=loss_fn,
                                    buffers=buffers, weights=weights, into=into)  # fmt: skip
    grads = per_record_grads(model, params, batch, loss=loss, buffers=buffers)
    return sum_records(grads, batch, weights, in_place=True, into=into)


# From this many sampled records per sampled node on, a plain forward and backward of each
# node's batch beats the batched (vmap) path on CPU (shallow CNN, one thread: equal at 4,
# 1.3x faster at 8, 1.5x at 16).
_RECORDS_PER_NODE_FOR_LOOP = 4


def _node_batches_pay(batch: NodeBatch) -> bool:
    counts = batch.counts
    return float(counts.sum()) >= _RECORDS_PER_NODE_FOR_LOOP * int((counts > 0).sum())


def _couples_records(model: torch.nn.Module) -> bool:
    """A batch-norm or instance-norm layer: its training-mode output for a record depends on
    the others in its batch, so node-by-node batches would not give the batched path's (one
    record at a time) gradient."""
    from torch.nn.modules.batchnorm import _NormBase

    return any(isinstance(module, _NormBase) for module in model.modules())


def _node_by_node_mean_grads(model, params, batch, loss_fn, buffers, into) -> Params:
    """SGP's gradient by plain autograd, one node at a time: the gradient of node i's mean
    loss over its sampled batch at its own parameters (no per-record isolation: SGP has no
    per-record bound to keep, and the model holds no layer that couples records)."""
    inputs, targets = batch.inputs, batch.targets
    if bool((batch.node[1:] < batch.node[:-1]).any()):  # each node's records side by side
        order = torch.argsort(batch.node, stable=True)
        inputs, targets = inputs[order], targets[order]
    starts = [0, *torch.cumsum(batch.counts, 0).tolist()]
    for i in range(batch.n_nodes):
        lo, hi = starts[i], starts[i + 1]
        if hi == lo:
            continue
        own = {name: p[i].detach().requires_grad_(True) for name, p in params.items()}
        with torch.enable_grad():
            out = functional_call(model, (own, buffers), (inputs[lo:hi],))
            loss = loss_fn(out, targets[lo:hi]).mean()
            grads = torch.autograd.grad(loss, list(own.values()))
        into.add_rows(i, i + 1, {name: g.unsqueeze(0) for name, g in zip(own, grads, strict=True)})
    return into.finish()


def _record_norms(grads: Params) -> torch.Tensor:
    """l2 norm of each record's whole gradient (all parameters together), shape (R,)."""
    # vector_norm reads each gradient once, without a squared temporary of its size.
    per_param = [torch.linalg.vector_norm(g.reshape(len(g), -1), dim=1) for g in grads.values()]
    return torch.linalg.vector_norm(torch.stack(per_param), dim=0)


def clip_factors(grads: Params, clip: float) -> torch.Tensor:
    """min(1, C_k (1 - 2^-12) / ||g_r||_2) for every record, shape (R,): the margin keeps the
    rounded contributions within C_k (``per_sample.SENSITIVITY_MARGIN``)."""
    require(math.isfinite(clip) and clip > 0, f"clip bound C_k must be positive, got {clip}")
    return (clip * SENSITIVITY_MARGIN / _record_norms(grads).clamp_min(1e-30)).clamp(max=1.0)


def clip_per_record(grads: Params, clip: float) -> Params:
    """Step 3: g_r * min(1, C_k / ||g_r||_2), the norm over all parameters of record r."""
    factors = clip_factors(grads, clip)
    return {name: g * factors.reshape(-1, *([1] * (g.dim() - 1))) for name, g in grads.items()}


def sum_records(
    grads: Params,
    batch: NodeBatch,
    factors: torch.Tensor | None = None,
    *,
    in_place: bool = False,
    out: Params | None = None,
    into: Accumulator | None = None,
) -> Params:
    """sum_{r in S_i} factor_r * g_r for every node i: (R, ...) -> (m, ...).

    ``factors`` (R,) folds the clipping into the sum.  ``in_place`` scales ``grads`` in place
    (a temporary the caller owns): one fewer gradient-sized allocation, which on CPU costs
    more than the arithmetic (fresh multi-megabyte blocks are page-faulted in every step).
    ``out`` ({name: (m, ...)}, overwritten) receives the sums instead of fresh tensors;
    ``into`` (an :class:`~dpdl.algorithms.per_sample.Accumulator`) adds them to its target.
    """
    if into is None:
        zeros = ({name: out[name].zero_() for name in grads} if out is not None else
                 {name: g.new_zeros((batch.n_nodes, *g.shape[1:])) for name, g in grads.items()})
        into = Accumulator(zeros)
    scaled = {}
    for name, g in grads.items():
        if factors is not None:
            shaped = factors.reshape(-1, *([1] * (g.dim() - 1))).to(g.dtype)
            g = g.mul_(shaped) if in_place else g * shaped
        scaled[name] = g
    into.add_at(batch.node, scaled)
    return into.finish()


CLIP_METHODS = ("auto", "per-record", "book-keeping")


def clipped_record_sums(
    model: torch.nn.Module,
    params: Params,
    batch: NodeBatch,
    clip: float,
    *,
    loss: str = "cross_entropy",
    buffers: Params | None = None,
    method: str = "auto",
    out: Params | None = None,
    into: Accumulator | None = None,
) -> Params:
    """Steps 2-3 summed per node: sum_{r in S_i} g_r min(1, C_k / ||g_r||_2), (m, *shape).

    ``method``: "per-record" takes every record's gradient at its own copy of its node's
    parameters (:func:`per_record_grads`, :func:`clip_factors`, :func:`sum_records`);
    "book-keeping" gets the norms and the clipped sums from each layer's inputs and output
    gradients with the node's parameters shared by its records (:mod:`dpdl.algorithms.
    per_sample`; same numbers to rounding, no per-record copy of the weights); "auto" takes
    book-keeping where the model's layers allow it (Linear, Conv2d, GroupNorm, LayerNorm), the
    per-record path otherwise.  ``out`` ({name: (m, *shape)}, overwritten) receives the sums;
    ``into`` (an :class:`~dpdl.algorithms.per_sample.Accumulator`) adds them to its target.
    """
    require(method in CLIP_METHODS, f"unknown clipping method {method!r}; choose one of "
            f"{', '.join(CLIP_METHODS)}")  # fmt: skip
    require(isinstance(clip, int | float) and math.isfinite(clip) and clip > 0,
            f"clip bound C_k must be a positive number, got {clip!r}")  # fmt: skip
    loss_fn = _loss_fn(loss)
    into = Accumulator.zeros(out, params, exact=True) if into is None else into
    if batch.size == 0:
        return into.finish()
    if method != "per-record":
        plan = book_keeping_plan(model, tuple(batch.inputs.shape[1:]), params,
                                 batch.inputs.dtype)
        require(
            method == "auto" or not plan.problems,
            f"book-keeping clipping cannot handle this model: {'; '.join(plan.problems)}",
        )
        if not plan.problems:
            return clipped_sums_by_node(
                plan, model, params, batch, clip, loss_fn=loss_fn, buffers=buffers, into=into
            )
    return _per_record_clipped_sums(model, params, batch, clip, loss, buffers, into)


def _per_record_clipped_sums(model, params, batch, clip, loss, buffers, into) -> Params:
    into.expect_records(int(batch.counts.max()))  # float64 beyond EXACT_RECORDS a node
    grads = per_record_grads(model, params, batch, loss=loss, buffers=buffers)
    norms = _record_norms(grads)
    factors = (clip * SENSITIVITY_MARGIN / norms.clamp_min(1e-30)).clamp(max=1.0)
    if not bool(norms.isfinite().all()):
        # A record whose gradient is not finite contributes nothing (norm 0 <= C).
        keep = norms.isfinite()
        factors = torch.where(keep, factors, torch.zeros_like(factors))
        for g in grads.values():
            g.nan_to_num_(0.0, 0.0, 0.0).mul_(keep.view(-1, *[1] * (g.dim() - 1)).to(g.dtype))
    return sum_records(grads, batch, factors, in_place=True, into=into)


def add_gaussian_noise(
    summed: Params,
    sigma: float,
    generators: Sequence[SecretStream],
    *,
    in_place: bool = False,
    mechanism: NoiseMechanism = GAUSSIAN_RELEASE,
) -> Params:
    """Step 4: node i's noisy sum G_i = round_g(sum_j clipped g_ij + sigma_k X_i), X_i ~
    N(0, I_d) fresh per node and step, exactly in law (:mod:`dpdl.algorithms.noise`).

    Node i draws its d words in one call on its own stream, in parameter order.  ``in_place``
    writes G into ``summed`` (a temporary the caller owns) instead of fresh tensors.
    """
    require(math.isfinite(sigma) and sigma > 0, f"noise std sigma_k must be > 0, got {sigma}")
    first = next(iter(summed.values()))
    m = first.shape[0]
    require(len(generators) == m, f"need one generator per node: {len(generators)} for {m}")
    if not in_place:
        summed = {name: s.clone() for name, s in summed.items()}
    d = sum(t[0].numel() for t in summed.values())
    noise = mechanism.start(generators, d, sigma, device=first.device)
    return mechanism.noisy_sums(noise, summed)


def local_sgd_step(
    params: Params, update: Params, lr: float, scale: float = 1.0, *, out: Params | None = None
) -> Params:
    """Step 5: x^{k+1/2} = x^k - lr * update / scale (scale = b for the private sum).

    ``out`` (may be ``update`` itself) receives x^{k+1/2} instead of fresh tensors.
    """
    if out is None:
        return {name: torch.add(p, update[name], alpha=-lr / scale) for name, p in params.items()}
    return {
        name: torch.add(p, update[name], alpha=-lr / scale, out=out[name])
        for name, p in params.items()
    }


# --------------------------------------------------------------------------- mixing
def push_sum_mix(
    params: Params,
    weights: torch.Tensor,
    mixing: np.ndarray | torch.Tensor | None = None,
    *,
    circulant: Sequence[tuple[int, float]] | None = None,
    out: Params | None = None,
) -> tuple[Params, torch.Tensor]:
    """Step 6: x^{k+1} = P^k x^{k+1/2}, w^{k+1} = P^k w^k over the node dimension.

    With ``circulant`` = [(offset s, weight)], P^k = sum weight * Shift_s where
    (Shift_s)[(i+s) mod n, i] = 1, i.e. node i+s receives from i: a ``torch.roll`` by s.
    Otherwise a batched product with the (n, n) column-stochastic matrix.  ``out`` ({name:
    (n, *shape)}, contiguous, not ``params`` itself) receives x^{k+1}: the simulator passes
    x^k's tensors, no longer needed, so a step allocates no n x d block.
    """
    if circulant is not None:

        def apply(t: torch.Tensor, dst: torch.Tensor | None = None) -> torch.Tensor:
            # mixed[(i + s) mod n] += weight * t[i], written slice by slice: no rolled copy
            # (the same arithmetic as torch.roll then add, one allocation fewer per offset)
            mixed = torch.empty_like(t) if dst is None else dst
            for k, (offset, weight) in enumerate(circulant):
                s = int(offset) % len(t)
                pairs = [(mixed, t)] if s == 0 else [(mixed[s:], t[:-s]), (mixed[:s], t[-s:])]
                for dst, src in pairs:
                    if k == 0:
                        torch.mul(src, weight, out=dst)
                    else:
                        dst.add_(src, alpha=weight)
            return mixed

        mixed = {name: apply(p, None if out is None else out[name]) for name, p in params.items()}
        return mixed, apply(weights)
    require(mixing is not None, "push_sum_mix needs a mixing matrix or a circulant form")
    P = torch.as_tensor(mixing, dtype=weights.dtype, device=weights.device)
    n = weights.shape[0]
    require(P.shape == (n, n), f"mixing matrix has shape {tuple(P.shape)}, expected ({n}, {n})")
    if out is None:
        mixed = {name: torch.einsum("ij,j...->i...", P.to(p.dtype), p)
                 for name, p in params.items()}  # fmt: skip
    else:
        mixed = {name: torch.mm(P.to(p.dtype), p.reshape(n, -1), out=out[name].view(n, -1))
                 .view_as(p) for name, p in params.items()}  # fmt: skip
    return mixed, P @ weights


def debias(params: Params, weights: torch.Tensor) -> Params:
    """z_i = x_i / w_i for every node (x itself while every w_i = 1, e.g. doubly stochastic P)."""
    if bool((weights == 1).all()):
        return params
    return {
        name: p / weights.reshape(-1, *([1] * (p.dim() - 1))).to(p.dtype)
        for name, p in params.items()
    }


# --------------------------------------------------------------------------- one step
_NOISE_WORKERS: dict[int, ThreadPoolExecutor] = {}  # process id -> its worker


def _noise_worker() -> ThreadPoolExecutor:
    """One lazily started worker thread per process for a step's side work (local_update: the
    noisy start, or SGP's copy of x^k), which needs no gradient.

    Keyed by process id: a forked child inherits the parent's executor but not its thread, and
    would wait forever on work submitted to it.
    """
    pid = os.getpid()
    if pid not in _NOISE_WORKERS:
        _NOISE_WORKERS.clear()
        _NOISE_WORKERS[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpdl-noise")
    return _NOISE_WORKERS[pid]


@dataclass
class LocalUpdateResult:
    params: Params  # x^{k+1/2}, (m, *shape)
    batch_sizes: torch.Tensor  # |S_i^k|, (m,)
    state: State = field(default_factory=dict)  # the update transforms' state after the step


def local_update(
    spec: LocalStep,
    params: Params,
    weights: torch.Tensor,
    records: NodeRecords,
    args: StepArguments,
    *,
    step: int,
    state: State | None = None,
    scratch: StepBuffers | None = None,
) -> LocalUpdateResult:
    """Steps 1-5 of Algorithm 1 for a contiguous block of nodes (``records.first_node`` the
    first), as the composition sampling -> per-record clipping -> noise mechanism -> update
    transforms (:mod:`dpdl.algorithms.step`); mixing is the engine's.

    ``spec`` holds what stays fixed over a run (model, loss, b, clip method, mechanism, the
    update transforms), ``records`` the nodes' padded data, streams and Poisson rates,
    ``args`` this step's C_k, σ_k and γ_k (``args.lr``, required here).  A private step (the
    clipped, noisy sum divided by b) needs ``sigma`` > 0: zero only with the explicit
    ``unsafe_zero_noise`` (for tests of the clipping; it is not private); otherwise SGP's mean
    gradient.  Gradients are taken at the de-biased z_i = x_i / w_i and applied to x_i.
    Raises DPDLError naming the node and step when a node's x^{k+1/2} is not finite (a record
    whose gradient is not finite contributes nothing to a private step).

    ``state`` is the transforms' state (None: their initial state, e.g. m = 0); the result
    carries the new one.  ``scratch`` (:class:`~dpdl.algorithms.step.StepBuffers`) lends the
    engine's work buffer (the result's parameters are its tensors: no fresh n x d
    allocations, whose page faults dominate large n on CPU) and noise buffers.
    When the transforms are a step size alone (:data:`~dpdl.algorithms.transforms.PLAIN`),
    steps 2-5 run as one pass over the models (:func:`_noisy_local_step`; SGP: x^k, then the
    mean gradients added with weight -γ_k): the same numbers as the stages one after the
    other, up to rounding (tests compare them).
    """
    _check_step(params, weights, records, args)
    scratch = StepBuffers() if scratch is None else scratch
    state = spec.transforms.init(params) if state is None else state
    batch = poisson_sample(records.inputs, records.targets, records.mask, records.sample_rate,
                           records.generators)  # fmt: skip
    at = debias(params, weights)
    fused = spec.transforms.plain_step_size(step, args.lr)
    if fused is not None and args.private:
        half = _noisy_local_step(spec, params, at, batch, records.generators, args,
                                 step_size=fused / spec.expected_batch_size, scratch=scratch)
    elif fused is not None:
        half = _sgp_local_step(spec, params, at, batch, lr=fused, work=scratch.work)
    else:
        update = _node_updates(spec, at, batch, records.generators, args, scratch)
        half, state = apply_chain(spec.transforms, params, update, state, at, step=step,
                                  lr=args.lr, out=scratch.work)  # fmt: skip
    # Checked on x^{k+1/2}, the message itself: a private update is finite by construction
    # (finite clipped sums plus noise), so only released values overflowing can trip this.
    _check_finite(half, step, records.first_node)
    return LocalUpdateResult(half, batch.counts, state)


def noisy_update(spec: LocalStep, params: Params, weights: torch.Tensor, records: NodeRecords,
                 args: StepArguments) -> Params:  # fmt: skip
    """A further release of a step (an algorithm's second noisy message): on a fresh Poisson
    sample of every node (its stream goes on), node i's u_i = (S_i + σ ξ_i) / b, its clipped
    gradient sum at z_i = x_i / w_i with the mechanism's exact noise (σ = ``args.sigma``); SGP's
    mean gradient for a non-private step.  The ledger records it as its own mechanism."""
    _check_step(params, weights, records, args)
    batch = poisson_sample(records.inputs, records.targets, records.mask, records.sample_rate,
                           records.generators)  # fmt: skip
    return _node_updates(spec, debias(params, weights), batch, records.generators, args,
                         StepBuffers())  # fmt: skip


def _check_step(params: Params, weights: torch.Tensor, records: NodeRecords,
                args: StepArguments) -> None:  # fmt: skip
    """Refuse, before anything is drawn, a private step without its C_k and σ_k, a step
    without γ_k, or models that do not hold the data's nodes."""
    if args.private:
        check_private_noise(args.sigma, args.unsafe_zero_noise)
        _check_clip(args.clip)
    require(args.lr is not None and math.isfinite(args.lr),
            f"a step needs a finite step size γ_k, got {args.lr}")  # fmt: skip
    m = records.n_nodes
    require(all(p.shape[0] == m for p in params.values()) and weights.shape == (m,),
            f"the models and push-sum weights must hold the data's {m} nodes, got rows "
            f"{sorted({p.shape[0] for p in params.values()})}, weights "
            f"{tuple(weights.shape)}")  # fmt: skip


def _node_updates(spec: LocalStep, at: Params, batch: NodeBatch,
                  generators: Sequence[SecretStream], args: StepArguments,
                  scratch: StepBuffers) -> Params:  # fmt: skip
    """Steps 2-4 as stages: node i's update u_i^k, into ``scratch.work`` if given: the
    released noisy sum of its clipped gradients over b (per-record clipping, then the noise
    mechanism), or SGP's mean gradient."""
    if args.private:
        update = _noisy_clipped_sum(spec, at, batch, generators, args, scratch)
        scale = spec.expected_batch_size
    else:
        update = mean_batch_grads(spec.model, at, batch, loss=spec.loss, buffers=spec.buffers,
                                  out=scratch.work)  # fmt: skip
        scale = 1.0
    # u_i^k itself (the /b folded into the step on the fused path: Algorithm 1's rounding)
    return {name: u.div_(scale) for name, u in update.items()}


def _like(params: Params, work: Params | None) -> Params:
    """``work`` (overwritten by the caller) or fresh tensors like ``params``.  ``work`` must not
    share memory with the models: the worker thread writes it while the gradients are taken
    at the models."""
    if work is None:
        return {name: torch.empty_like(p) for name, p in params.items()}
    require(not any(work[name].untyped_storage().data_ptr() == p.untyped_storage().data_ptr()
                    for name, p in params.items()),
            "the work buffer must not share memory with the models")  # fmt: skip
    return work


def _check_clip(clip: float | None) -> None:
    require(clip is not None, "a private step needs a clip bound C_k")
    require(math.isfinite(clip) and clip > 0, f"clip bound C_k must be positive, got {clip}")


def _noisy_local_step(spec: LocalStep, params: Params, at: Params, batch: NodeBatch,
                      generators: Sequence[SecretStream], args: StepArguments, *,
                      step_size: float, scratch: StepBuffers) -> Params:  # fmt: skip
    """Steps 2-5 in one pass over the models: x_i^{k+1/2} = x_i^k - (lr / b) G_i, G_i the
    released noisy sum (:func:`add_gaussian_noise`), into ``scratch.work`` (or fresh tensors).

    The noise's draw depends only on the streams (already past this step's uniforms), not on
    the gradients: on CPU a worker thread reads it, and zeroes the work buffer, while the
    gradients are computed (torch ops release the GIL); chunks done before it are held back
    until it is, and added in chunk order all the same.  The work buffer then holds the
    clipped sums S_i, and the mechanism turns them into the message in place."""
    mechanism, reuse = _mechanism_for(args.sigma, (spec.mechanism, scratch.noise))
    work = _like(params, scratch.work)
    first = next(iter(params.values()))
    d = sum(p[0].numel() for p in params.values())

    def start():
        for tensor in work.values():
            tensor.zero_()
        return mechanism.start(generators, d, args.sigma, device=first.device, reuse=reuse)

    pending = _run_beside(start, work)
    into = Accumulator(work, alpha=1.0, pending=pending, exact=True)
    try:
        sums = clipped_record_sums(spec.model, at, batch, args.clip, loss=spec.loss,
                                   buffers=spec.buffers, method=spec.clip_method,
                                   into=into)  # fmt: skip
    except BaseException:
        futures_wait([pending])  # never leave a generator (or work) in use after we return
        raise
    # sums is ``work`` itself, or its float64 widening (a node summed in several parts)
    return mechanism.noisy_step(pending.result(), params, sums, step_size, out=work)


def _sgp_local_step(spec: LocalStep, params: Params, at: Params, batch: NodeBatch, *,
                    lr: float, work: Params | None) -> Params:  # fmt: skip
    """SGP's steps 2 and 5 in one pass: x_i^{k+1/2} = x_i^k - lr * (mean gradient of node i's
    batch), into ``work``: a copy of x^k (on a worker thread on CPU, while the gradients are
    computed), then each chunk's weighted sums added with weight -lr."""
    work = _like(params, work)

    def start():
        for name, x in params.items():
            work[name].copy_(x)

    pending = _run_beside(start, work)
    try:
        return mean_batch_grads(spec.model, at, batch, loss=spec.loss, buffers=spec.buffers,
                                into=Accumulator(work, alpha=-lr, pending=pending))  # fmt: skip
    except BaseException:
        if pending is not None:
            futures_wait([pending])  # never leave work being written after we return
        raise


def _run_beside(job: Callable[[], object], work: Params) -> Future:
    """``job`` on the worker thread on CPU, or at once elsewhere: its future either way."""
    if next(iter(work.values())).device.type == "cpu":
        return _noise_worker().submit(job)
    done: Future = Future()
    done.set_result(job())
    return done


def _noisy_clipped_sum(spec: LocalStep, at: Params, batch: NodeBatch,
                       generators: Sequence[SecretStream], args: StepArguments,
                       scratch: StepBuffers) -> Params:  # fmt: skip
    """Steps 2-4 as stages: per-record clipping, then the noise mechanism: node i's released
    noisy sum G_i, into ``scratch.work`` if given (the noise drawn on a worker thread on CPU,
    as in :func:`_noisy_local_step`)."""
    mechanism, reuse = _mechanism_for(args.sigma, (spec.mechanism, scratch.noise))
    first = next(iter(at.values()))
    d = sum(p[0].numel() for p in at.values())
    pending = _run_beside(partial(mechanism.start, generators, d, args.sigma,
                                  device=first.device, reuse=reuse), at)  # fmt: skip
    try:
        clipped_sum = clipped_record_sums(
            spec.model, at, batch, args.clip, loss=spec.loss, buffers=spec.buffers,
            method=spec.clip_method, out=scratch.work,
        )  # fmt: skip
    except BaseException:
        futures_wait([pending])  # never leave a generator in use after we return
        raise
    return mechanism.noisy_sums(pending.result(), clipped_sum)


class _Noiseless:
    """sigma_k = 0, only with ``unsafe_zero_noise`` (tests of the clipping): not private."""

    name, certified = "none", False

    def start(self, generators, d, sigma, *, device=None, reuse=None):
        return None

    def noisy_sums(self, noise, sums: Params) -> Params:
        return sums

    def noisy_step(self, noise, x: Params, sums: Params, step_size: float,
                   out: Params) -> Params:  # fmt: skip
        return {name: torch.add(x[name], s, alpha=-step_size, out=out[name])
                for name, s in sums.items()}  # fmt: skip


def _mechanism_for(sigma: float, noise: tuple) -> tuple:
    """(mechanism, reusable draw): the noiseless stand-in when sigma_k = 0 (allowed only with
    ``unsafe_zero_noise``, checked by the caller)."""
    return (_Noiseless(), None) if sigma == 0 else noise


def check_private_noise(sigma: float | None, unsafe_zero_noise: bool = False) -> None:
    """A private step's sigma_k must be given and positive (finite); zero only when asked."""
    if sigma is None:
        raise DPDLError("a private step needs an explicit noise std sigma_k > 0, got none")
    ok = math.isfinite(sigma) and (sigma > 0 or (sigma == 0 and unsafe_zero_noise))
    require(ok, f"a private step needs noise std sigma_k > 0, got {sigma}")


def _check_finite(half: Params, step: int, first_node: int) -> None:
    """Raise NonFiniteUpdate naming the first node whose model x^{k+1/2} has a NaN or inf.

    Detection is one summation pass (a NaN or inf anywhere makes the sum non-finite); the
    per-node search runs only then (a sum of large finite values may overflow too).
    """
    if math.isfinite(float(sum(t.sum() for t in half.values()))):
        return
    finite = torch.stack([t.flatten(start_dim=1).isfinite().all(dim=1) for t in half.values()])
    bad = (~finite.all(dim=0)).nonzero()
    if len(bad):
        raise NonFiniteUpdate(first_node + int(bad[0, 0]), step)


class NonFiniteUpdate(DPDLError):
    """A node's model became NaN or infinite; training stops (the run keeps what it has)."""

    def __init__(self, node: int, step: int):
        self.node, self.step = node, step
        super().__init__(
            f"non-finite (NaN/inf) model at node {node} after step {step}: "
            "lower the learning rate or the clip bound"
        )


def dyn_d2p_step(
    spec: LocalStep,
    params: Params,
    weights: torch.Tensor,
    records: NodeRecords,
    args: StepArguments,
    *,
    step: int,
    mixing: np.ndarray | torch.Tensor | None = None,
    circulant: Sequence[tuple[int, float]] | None = None,
) -> tuple[Params, torch.Tensor, torch.Tensor]:
    """One iteration of Algorithm 1 for all n nodes: :func:`local_update`, then push-sum
    mixing (always: ``args.mix`` is the engine's).  Transforms that keep a state across steps
    (momentum) are refused: :func:`local_update` returns it, the engine keeps it.

    Returns (x^{k+1}, w^{k+1}, batch sizes |S_i^k|).
    """
    require(not keeps_state(spec.transforms.init(params)),
            "dyn_d2p_step keeps no update transform's state: call local_update (which "
            "returns it) and push_sum_mix")  # fmt: skip
    half = local_update(spec, params, weights, records, args, step=step)
    mixed, new_weights = push_sum_mix(half.params, weights, mixing, circulant=circulant)
    return mixed, new_weights, half.batch_sizes
