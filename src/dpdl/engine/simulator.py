"""Single-process simulator of n push-sum nodes (MATH.md §4) with stacked tensors.

Every node's model lives in one dict of stacked parameters ``{name: (n, *shape)}``, its
push-sum weight in ``w`` (n,), its local data in padded ``(n, J_max, ...)`` tensors.  A step
runs :func:`dpdl.algorithms.dyn_d2p.local_update` on all nodes at once and mixes with a roll
(circulant graphs) or a batched matrix product -- never a Python loop over nodes (the only
per-node loop is the read of each node's own secret stream).  Which nodes a process hosts,
how processes exchange and how nodes mix is its :class:`~dpdl.engine.runtime.Runtime`'s:
one ``step`` serves every runtime.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from dpdl.algorithms.correlated import (
    INDEPENDENT,
    CorrelatedStep,
    NoiseCorrelation,
    undirected_neighbours,
)
from dpdl.algorithms.dyn_d2p import (
    CLIP_METHODS,
    GAUSSIAN_RELEASE,
    LOSSES,
    NoiseMechanism,
    Params,
    debias,
    local_update,
    make_node_generators,
    node_sample_rates,
    noisy_update,
)
from dpdl.algorithms.noise import NoiseDraw
from dpdl.algorithms.pairwise import HostedKeys
from dpdl.algorithms.step import LocalStep, NodeRecords, StepArguments, StepBuffers
from dpdl.algorithms.transforms import (
    LEGACY_STATE_KEYS,
    Chain,
    State,
    sgd,
    state_to_load,
    state_to_save,
)
from dpdl.engine.runtime import LocalRuntime, Runtime
from dpdl.engine.steps import EngineStepContext, copy_state, state_to_device
from dpdl.errors import DPDLError, require
from dpdl.models.validation import refuse_stateful

__all__ = ["NodeData", "Sampling", "Simulator", "StepOptions", "record_dtype", "stack_params",
           "resolve_device"]


@dataclass(frozen=True)
class StepOptions:
    """How the engine's local step computes: ``loss`` (a name of ``dyn_d2p.LOSSES`` or a
    per-record callable), ``clip_method`` (``"auto"``, ``"book-keeping"``, ``"per-record"``;
    :func:`dpdl.algorithms.dyn_d2p.clipped_record_sums`) and the noise ``mechanism``
    (:data:`~dpdl.algorithms.dyn_d2p.GAUSSIAN_RELEASE`, the only certified one; others are
    the audit's deliberately broken samplers), and how the nodes' noise is ``correlation``
    (:mod:`dpdl.algorithms.correlated`: independent, the default, or DECOR's pairwise-
    cancelling secrets).  Checked by :class:`Simulator`."""

    loss: str | Callable = "cross_entropy"
    clip_method: str = "auto"
    mechanism: NoiseMechanism = GAUSSIAN_RELEASE
    correlation: NoiseCorrelation = INDEPENDENT


@dataclass(frozen=True)
class Sampling:
    """How nodes draw their Poisson batches: ``kind`` ``"uniform"`` (every node at the
    accounted rate) or ``"per-node"`` (node i at b / J_i); ``rate`` a given rate for every node
    (uniform only; None: b / J_min from the nodes' sizes).  Checked by :class:`Simulator`."""

    kind: str = "uniform"
    rate: float | None = None


def resolve_device(device: str | torch.device) -> torch.device:
    """``"cpu"``, ``"cuda"`` (``"cuda:N"``) or ``"auto"``; refuses CUDA when it is absent."""
    name = str(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(name)
    except RuntimeError as err:
        raise DPDLError(f"unknown device {name!r}; use cpu, cuda or auto") from err
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise DPDLError(f"device {name!r} requested but CUDA is not available")
    require(dev.type in ("cpu", "cuda"), f"unsupported device {name!r}; use cpu, cuda or auto")
    return dev


@dataclass
class NodeData:
    """Padded local data sets: inputs (n, J_max, ...), targets (n, J_max), mask (n, J_max).

    The record dtype is the inputs': float32, or int64 where the inputs are integers (token
    ids for a model whose first layer is ``nn.Embedding``); every part of a run that makes or
    takes records (the model probes, evaluation sets) reads it from ``inputs.dtype``."""

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor

    @classmethod
    def from_arrays(
        cls, inputs, targets, mask, device: str | torch.device = "cpu", *, first_node: int = 0
    ) -> NodeData:
        """Refuses non-finite values and padding before records; messages name nodes from
        ``first_node`` (a process's block of nodes)."""
        x_np = np.asarray(inputs)
        x = torch.as_tensor(x_np, dtype=record_dtype(x_np.dtype), device=device)
        y_np = np.asarray(targets)
        y_dtype = torch.int64 if np.issubdtype(y_np.dtype, np.integer) else torch.float32
        y = torch.as_tensor(y_np, dtype=y_dtype, device=device)
        mask_t = torch.as_tensor(np.asarray(mask), dtype=torch.bool, device=device)
        require(
            x.shape[:2] == mask_t.shape and y.shape[:2] == mask_t.shape,
            f"node data shapes disagree: inputs {tuple(x.shape)}, targets {tuple(y.shape)}, "
            f"mask {tuple(mask_t.shape)}",
        )
        counts = mask_t.sum(dim=1)
        require(bool((counts > 0).all()), "every node needs at least one local record")
        for what, values in (("inputs", x), ("targets", y)):
            if values.is_floating_point():
                finite = values.reshape(values.shape[0], values.shape[1], -1).isfinite().all(-1)
                bad = (~finite & mask_t).any(dim=1).nonzero()
                node = first_node + (int(bad[0]) if len(bad) else 0)
                require(len(bad) == 0, f"node {node}'s {what} contain NaN or infinite values")
        # poisson_sample draws node i's uniforms for its first J_i slots: real records first.
        prefix = torch.arange(mask_t.shape[1], device=mask_t.device) < counts[:, None]
        require(
            bool((mask_t == prefix).all()),
            "node data must hold each node's real records first (mask rows of ones, then zeros)",
        )
        return cls(x, y, mask_t)

    @property
    def n_nodes(self) -> int:
        return int(self.mask.shape[0])

    @property
    def counts(self) -> torch.Tensor:
        return self.mask.sum(dim=1)

    def block(self, first: int, count: int) -> NodeData:
        sl = slice(first, first + count)
        return NodeData(self.inputs[sl], self.targets[sl], self.mask[sl])

    def fingerprints(self, first: int = 0, count: int | None = None) -> list[bytes]:
        """SHA-256 of each node's real records (inputs, targets, their shapes and dtypes), for
        nodes ``first .. first + count - 1``: a resume on other data is refused with it, and a
        seeded stream is keyed with it.  Secret like the data (it confirms a guess of them)."""
        count = self.n_nodes - first if count is None else count
        sizes = self.counts.tolist()
        out = []
        for i in range(first, first + count):
            digest = hashlib.sha256(b"dpdl node data v1")
            for part in (self.inputs[i, : sizes[i]], self.targets[i, : sizes[i]]):
                array = part.detach().cpu().contiguous().numpy()
                digest.update(f"{array.dtype.str}{array.shape}".encode())
                digest.update(array.tobytes())
            out.append(digest.digest())
        return out


def record_dtype(dtype) -> torch.dtype:
    """The dtype records of numpy ``dtype`` are kept in: int64 for integers (indices, e.g.
    token ids), float32 for anything else (booleans included, as before integers were kept)."""
    return torch.int64 if np.issubdtype(np.dtype(dtype), np.integer) else torch.float32


def stack_params(model: torch.nn.Module, n_nodes: int, device: torch.device) -> Params:
    """x_i^0 = the model's initial parameters, identical on every node: {name: (n, *shape)}."""
    return {
        name: p.detach().to(device).unsqueeze(0).repeat(n_nodes, *([1] * p.dim())).contiguous()
        for name, p in model.named_parameters()
    }


class Simulator:
    """n push-sum nodes training one model architecture with the Dyn-D2P family.

    ``sample_rate`` p = b / J_min is the rate the privacy schedule is accounted at, the largest
    of ``sample_rates``, every node's own rate: with ``sampling="uniform"`` (the default; a
    :class:`Sampling` or its ``kind``) every
    node samples at p, so a node with more than J_min records has a larger expected batch than
    b; with ``"per-node"`` node i samples at q_i = b / J_i, an expected batch of b everywhere.
    Either way the noisy sum is divided by b (MATH.md §4 step 5).  A rate given
    (``Sampling(rate=...)``, a hyper-parameter, privacy.neighboring = "add-remove") is every
    node's rate instead, and no node's size is read or exchanged for it.  The per-node
    sampling and noise streams are secret: ``seed=None`` (the default) keys them from OS
    entropy; a root key (bytes, :func:`dpdl.algorithms.randomness.stream_root`) or an int
    derives them, with each node's data fingerprint, reproducibly (a research choice, see
    :mod:`dpdl.algorithms.randomness`).  Every private step's noise is released exactly
    (:data:`~dpdl.algorithms.dyn_d2p.GAUSSIAN_RELEASE`, MATH.md §10); ``options.mechanism``
    replaces it only for the audit's deliberately broken samplers.
    A model whose state (buffers, Python attributes and class data attributes of any
    submodule) or whose loss's state changes across a forward, or whose forward draws from a
    process-wide random generator (dropout), is refused
    (:func:`dpdl.models.validation.refuse_stateful`, on a copy, every way the engine runs it).
    ``options.clip_method`` (a :class:`StepOptions`, with ``options.loss``) chooses how
    per-record clipped sums are computed (``"auto"``,
    ``"book-keeping"``, ``"per-record"``; see :func:`dpdl.algorithms.dyn_d2p.
    clipped_record_sums`): the numbers agree to rounding.

    ``data`` holds the nodes this process hosts (:attr:`node_block`, the ``runtime``'s
    :meth:`~dpdl.engine.runtime.Runtime.hosted_block`): all of the topology's nodes with the
    default :class:`~dpdl.engine.runtime.LocalRuntime`; a block in the distributed runtime,
    which exchanges only what every process needs (node sizes, public) and reductions of the
    models.  ``params``/``weights``/``generators`` are those of the hosted nodes; the
    runtime's :meth:`~dpdl.engine.runtime.Runtime.mixer` (:attr:`mixer`) mixes them.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        data: NodeData,
        topology,
        *,
        lr: float,
        expected_batch_size: float = 1.0,
        seed: int | bytes | None = None,
        device: str | torch.device = "cpu",
        options: StepOptions | None = None,
        transforms: Chain | None = None,
        sampling: str | Sampling = "uniform",
        runtime: Runtime | None = None,
    ):
        options = StepOptions() if options is None else options
        loss, noise_mechanism, clip_method = options.loss, options.mechanism, options.clip_method
        sampling = Sampling(sampling) if isinstance(sampling, str) else sampling
        sampling, sample_rate = sampling.kind, sampling.rate
        require(lr > 0 and np.isfinite(lr), f"learning rate must be positive, got {lr}")
        require(
            expected_batch_size > 0,
            f"expected batch size b must be positive, got {expected_batch_size}",
        )
        require(
            callable(loss) or loss in LOSSES,
            f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)} or a per-record callable",
        )
        require(
            clip_method in CLIP_METHODS,
            f"unknown clipping method {clip_method!r}; choose one of {', '.join(CLIP_METHODS)}",
        )
        self.clip_method = clip_method
        self.device = resolve_device(device)
        self.model = model.to(self.device)
        self.n = int(topology.n)
        self.topology = topology
        self.runtime: Runtime = LocalRuntime() if runtime is None else runtime
        self._block = self.runtime.hosted_block(self.n, self.device)
        first, count = self.node_block
        require(
            data.n_nodes == count,
            f"topology has {self.n} nodes but the data is split over {data.n_nodes}"
            if count == self.n else
            f"this process hosts nodes {first}..{first + count - 1} but was given data for "
            f"{data.n_nodes} nodes",
        )  # fmt: skip
        self.data = NodeData(
            data.inputs.to(self.device), data.targets.to(self.device), data.mask.to(self.device)
        )
        # The engine runs the model once per chunk of the hosted nodes' sampled records: state
        # a forward (or the loss) changes, or a draw from a process-wide generator, would
        # couple those nodes (and state would keep a noise-free statistic of them).
        refuse_stateful(self.model, tuple(self.data.inputs.shape[2:]), self.device,
                        loss=loss if callable(loss) else LOSSES[loss],
                        target_like=self.data.targets.new_zeros(self.data.targets.shape[2:]),
                        dtype=self.data.inputs.dtype)
        self.lr = float(lr)
        self.expected_batch_size = float(expected_batch_size)
        self.sampling = sampling
        if sample_rate is None:
            # Every node's size (public), hence every node's rate; the largest is b / J_min.
            self.node_counts = self.runtime.all_node_counts([int(c) for c in self.data.counts],
                                                            self.n)  # fmt: skip
            j_min = min(self.node_counts)
            require(
                expected_batch_size <= j_min,
                f"expected batch size b = {expected_batch_size} exceeds the smallest local "
                f"data set (J_min = {j_min})",
            )
            self.sample_rates = node_sample_rates(self.node_counts, self.expected_batch_size,
                                                  sampling)  # fmt: skip
        else:  # a rate given as a hyper-parameter: no node's size is read or exchanged
            require(0 < sample_rate <= 1 and sampling == "uniform",
                    f"a given sample_rate must lie in (0, 1] with uniform sampling, got "
                    f"{sample_rate!r} ({sampling})")  # fmt: skip
            self.node_counts = None
            self.sample_rates = np.full(self.n, float(sample_rate))
        self.sample_rate = float(self.sample_rates.max())  # the accounted rate (b / J_min)
        self.loss = loss
        self.buffers = {name: b.to(self.device) for name, b in model.named_buffers()}
        self.params = stack_params(model, count, self.device)
        self.weights = torch.ones(count, dtype=torch.float64, device=self.device)
        self.use_transforms(sgd() if transforms is None else transforms)
        self.noise_mechanism = noise_mechanism
        self.correlation = options.correlation
        require(not self.correlation.pairwise_keys or noise_mechanism is GAUSSIAN_RELEASE,
                f"noise correlation {self.correlation.name!r} releases with the exact "
                f"Gaussian release only, not {getattr(noise_mechanism, 'name', noise_mechanism)!r}")
        self._fingerprints: list[bytes] | None = None
        # Seeded streams are keyed with the node's data too: other data, other noise.
        self.generators = make_node_generators(
            self.n, seed, first_node=first, count=count,
            salts=None if seed is None else self.data_fingerprints,
        )  # fmt: skip
        # Pairwise secrets (DECOR): each hosted node's X25519 key pair, drawn here (OS keys,
        # or derived from the same root as its stream); only public keys are exchanged.
        self.pairwise: HostedKeys | None = None
        if self.correlation.pairwise_keys:
            self.pairwise = HostedKeys(first, count, root=seed,
                                       salts=None if seed is None else self.data_fingerprints)
            self._exchange_public_keys()
        self.iteration = 0
        self.mixer = self.runtime.mixer(topology, self._block, self.device)
        require(not getattr(self.correlation, "needs_channel", False) or count == self.n
                or callable(getattr(self.mixer, "exchange", None)),
                f"noise correlation {self.correlation.name!r} hands private shares to the nodes "
                f"of other processes; this runtime's mixer ({type(self.mixer).__name__}) cannot "
                "carry them (the simulator and the distributed runtime can)")  # fmt: skip
        self._noise_buffer: NoiseDraw | None = None  # the noise's buffers, refilled each step
        self._work: Params | None = None  # the step's update, then x^{k+1/2}; never exposed
        self.use_algorithm(None, None)  # Algorithm 1's step, until a registered one is given

    def _exchange_public_keys(self) -> None:
        """Every node's X25519 public key, gathered over the runtime (a collective in the
        distributed runtime: every rank calls it at the same point); private keys stay."""
        own = torch.tensor([list(key) for key in self.pairwise.own_publics], dtype=torch.uint8,
                           device=self.device).reshape(-1, 32)  # fmt: skip
        every = self._gather_nodes(own).cpu()
        self.pairwise.learn_publics([bytes(row.tolist()) for row in every])

    def _step_mechanism(self, k: int, mixing_round: int | None, clip: float | None = None):
        """The noise mechanism of step ``k``: the engine's, as the correlation makes it for
        that step (its pairs: the undirected graph of the step's gossip round; ``clip``, the
        step's bound, which a correlated centre's norm is held to)."""
        if self.pairwise is None:
            return self.correlation.at_step(self.noise_mechanism, None)
        round_k = k if mixing_round is None else mixing_round
        first, count = self.node_block
        neighbours = undirected_neighbours(self.topology.mixing_matrix(round_k),
                                           range(first, first + count))  # fmt: skip
        channel = self.mixer if count < self.n else None
        return self.correlation.at_step(self.noise_mechanism, CorrelatedStep(
            k, round_k, first, neighbours, self.pairwise, channel, self._traffic, clip))

    @property
    def node_block(self) -> tuple[int, int]:
        """(first node, count) of the nodes this process hosts (all of them in one process)."""
        return self._block

    @property
    def hosted_sample_rates(self) -> np.ndarray:
        """The hosted nodes' own Poisson rates (what their sampling draws with)."""
        first, count = self.node_block
        return self.sample_rates[first : first + count]

    def _gather_nodes(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every node's rows of a (hosted nodes, ...) tensor, in node order."""
        return self.runtime.gather_nodes(tensor, self.n)

    @property
    def data_fingerprints(self) -> list[bytes]:
        """:meth:`NodeData.fingerprints` of this process's nodes (computed once)."""
        if self._fingerprints is None:
            self._fingerprints = self.data.fingerprints()
        return self._fingerprints

    # ------------------------------------------------------------------ stepping
    def step(self, args: StepArguments | None = None, /, **keywords) -> torch.Tensor:
        """One iteration for every node; returns the sampled batch sizes |S_i^k| (n,).

        ``args`` (:class:`~dpdl.algorithms.step.StepArguments`, ``RunPlan.step_arguments``),
        or its fields as keywords (``private``, ``clip``, ``sigma``, ...).  A private step
        needs ``sigma`` > 0 (``unsafe_zero_noise=True`` allows 0, for tests).  ``lr`` is this
        step's γ_k (default: the simulator's constant ``lr``).  ``mix=False`` is a local step
        (x^{k+1} = x^{k+1/2}, w unchanged: no message is sent); a mixing step gossips with
        the graph of ``mixing_round`` (default: the iteration k), through the runtime's
        :attr:`mixer` (in memory, or point-to-point messages between processes).
        """
        args = StepArguments.given(args, keywords)
        k = self.iteration
        self.runtime.before_step(k)
        if self.algorithm is not None:  # a registered algorithm's own step
            sizes = self.algorithm.step(EngineStepContext(self, args.with_lr(self.lr)))
            self.iteration += 1
            return sizes
        half = self._local_update(k, args)
        if args.mix:
            # x^k is not needed once x^{k+1/2} is in the work buffer: x^{k+1} may overwrite it
            round_k = k if args.mixing_round is None else args.mixing_round
            self.params, self.weights = self.mixer.mix(half.params, self.weights, round_k,
                                                       step=k, out=self.params)  # fmt: skip
        else:
            self._keep_local(half.params)
        self.iteration += 1
        return half.batch_sizes

    def _local_update(self, k: int, args: StepArguments):
        """Steps 1-5 for the hosted nodes (:func:`~dpdl.algorithms.dyn_d2p.local_update`), with
        this engine's buffers (the noise's, refilled every step, and the work buffer) and its
        nodes' state of the update transforms, which it keeps."""
        if args.private and self._noise_buffer is None:
            d = sum(p[0].numel() for p in self.params.values())
            self._noise_buffer = NoiseDraw.empty(len(self.generators), d, self.device)
        if self._work is None:
            self._work = {name: torch.empty_like(p) for name, p in self.params.items()}
        spec = self._local_step(self._step_mechanism(k, args.mixing_round, args.clip))
        records = NodeRecords(self.data.inputs, self.data.targets, self.data.mask,
                              self.generators, self.hosted_sample_rates,
                              first_node=self.node_block[0])  # fmt: skip
        result = local_update(spec, self.params, self.weights, records, args.with_lr(self.lr),
                              step=k, state=self.transform_state,
                              scratch=StepBuffers(self._work, self._noise_buffer))  # fmt: skip
        self.transform_state = result.state
        return result

    def noisy_update(self, k: int, args: StepArguments) -> Params:
        """A further release of step ``k`` (an algorithm's second message): u_i on a fresh
        Poisson sample of the hosted nodes (:func:`~dpdl.algorithms.dyn_d2p.noisy_update`),
        with the engine's own mechanism: a correlation (DECOR) shapes the step's first
        release alone, which reads each edge's stream of the step once."""
        records = NodeRecords(self.data.inputs, self.data.targets, self.data.mask,
                              self.generators, self.hosted_sample_rates,
                              first_node=self.node_block[0])  # fmt: skip
        return noisy_update(self._local_step(), self.params, self.weights, records,
                            args.with_lr(self.lr))  # fmt: skip

    def work_buffer(self) -> Params:
        """The step's scratch tensors shaped like the models (never the models themselves)."""
        if self._work is None:
            self._work = {name: torch.empty_like(p) for name, p in self.params.items()}
        return self._work

    def _local_step(self, mechanism: NoiseMechanism | None = None) -> LocalStep:
        return LocalStep(self.model, loss=self.loss, buffers=self.buffers,
                         expected_batch_size=self.expected_batch_size,
                         clip_method=self.clip_method,
                         mechanism=self.noise_mechanism if mechanism is None else mechanism,
                         transforms=self.transforms)  # fmt: skip

    def use_algorithm(self, algorithm, settings) -> None:
        """Take every later step with a registered algorithm's own step
        (:mod:`dpdl.algorithms.registry`; None: Algorithm 1's), from its initial state."""
        self.algorithm = None if algorithm is None or algorithm.builtin_step else algorithm
        self.algorithm_settings = settings
        self.algorithm_state = ({} if self.algorithm is None else
                                self.algorithm.init_state(EngineStepContext(self, None)))

    def use_transforms(self, transforms: Chain) -> None:
        """The update transforms of every later step (:mod:`dpdl.algorithms.transforms`;
        the constructor's ``transforms``, default ``sgd()``), from their initial
        state: each hosted node's own rows (never sent: only x^{k+1/2} is), kept by the engine
        across steps and in its checkpoints whatever the transforms."""
        self.transforms = transforms
        self.transform_state: State = transforms.init(self.params)

    @property
    def momentum_buffer(self) -> Params | None:
        """The heavy ball's m_i of the hosted nodes (None without momentum)."""
        return self.transform_state.get("momentum") or None

    def _keep_local(self, half: Params) -> None:
        """A step without mixing: x^{k+1} = x^{k+1/2}.  Those are the work buffer's tensors:
        they become the models, and x^k's tensors (no longer needed) the next work buffer."""
        self.params, self._work = half, self.params

    def mix_only(self) -> None:
        """A gossip round without gradients (push-sum consensus)."""
        k = self.iteration
        if self._work is None:
            self._work = {name: torch.empty_like(p) for name, p in self.params.items()}
        mixed, self.weights = self.mixer.mix(self.params, self.weights, k, step=k,
                                             out=self._work)  # fmt: skip
        self.params, self._work = mixed, self.params
        self.iteration += 1

    # ------------------------------------------------------------------ models
    def debiased_params(self) -> Params:
        """z_i = x_i / w_i of the hosted nodes, (m, *shape)."""
        return debias(self.params, self.weights)

    def gather_debiased_params(self) -> Params:
        """z_i of every node, (n, *shape): a gather of every node's model in the distributed
        runtime, done only when asked for (``gather_node_models``)."""
        return {k: self._gather_nodes(v) for k, v in self.debiased_params().items()}

    def average_params(self) -> Params:
        """The network average x-bar = sum_i x_i / sum_i w_i (one model, no node dim): a
        reduction of the hosted nodes' sums, never a gather of their models."""
        total = self.runtime.reduce_sum(self.weights.sum())
        return {name: self.runtime.reduce_sum(p.sum(dim=0)) / total.to(p.dtype)
                for name, p in self.params.items()}  # fmt: skip

    def all_finite(self) -> bool:
        finite = all(bool(p.isfinite().all()) for p in self.params.values())
        flag = torch.tensor(float(not finite), device=self.device)
        return bool(self.runtime.reduce_sum(flag) == 0)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """The hosted nodes' state: models, push-sum weights, the update transforms' state
        (only when one keeps any, e.g. momentum), secret stream states (the secret:
        owner-only files), data fingerprints."""
        first, _ = self.node_block
        return {
            "iteration": self.iteration,
            "first_node": first,
            "params": {k: v.detach().to("cpu", copy=True) for k, v in self.params.items()},
            "weights": self.weights.detach().cpu(),
            "generators": [g.get_state() for g in self.generators],
            "data_fingerprints": [f.hex() for f in self.data_fingerprints],
        } | self._transforms_checkpoint() | (
            {"algorithm_state": copy_state(self.algorithm_state)} if self.algorithm_state else {}
        ) | self._pairwise_checkpoint() | (
            {"traffic": self._traffic.state_dict()} if self._traffic is not None else {})

    def _pairwise_checkpoint(self) -> dict:
        """``{"pairwise_keys": [...]}``: the hosted nodes' X25519 private keys (uint8), so a
        resume replays the same pairwise secrets; no entry without pairwise keys."""
        if self.pairwise is None:
            return {}
        return {"pairwise_keys": [torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()
                                  for raw in self.pairwise.state()]}  # fmt: skip

    def _transforms_checkpoint(self) -> dict:
        """``{"transforms": {name: state}}``, a copy of each transform's non-empty state (it
        changes in place every step); no entry when none keeps any, so a plain run's
        checkpoint is what it was before the transforms existed."""
        saved = state_to_save(self.transform_state)
        return {"transforms": saved} if saved else {}

    def load_state_dict(self, state: dict) -> None:
        """Put :meth:`state_dict` back, refusing another model, block or data."""
        from dpdl.engine.checkpoint import check_fingerprints

        first, count = self.node_block
        if set(state["params"]) != set(self.params) or any(
            state["params"][k].shape != self.params[k].shape for k in self.params
        ):
            raise DPDLError("checkpoint does not match the model: parameter names or shapes "
                            "differ (or another number of nodes per process)")  # fmt: skip
        if state.get("first_node", 0) != first or state["weights"].shape != (count,):
            raise DPDLError(
                f"checkpoint holds nodes {state.get('first_node', 0)}.."
                f"{state.get('first_node', 0) + state['weights'].shape[0] - 1}, this process "
                f"hosts {first}..{first + count - 1}: resume with the same number of processes"
            )
        check_fingerprints(state.get("data_fingerprints"), self.data_fingerprints, first)
        require(self.pairwise is None or "pairwise_keys" in state,
                "the checkpoint holds no pairwise keys: it was not saved by a run with noise "
                f"correlation {self.correlation.name!r}")  # fmt: skip
        # checked before anything is replaced; copies (updated in place every step)
        transform_state = state_to_load(self.transform_state, _saved_transforms(state),
                                        self.device)  # fmt: skip
        algorithm_state = state_to_device(state.get("algorithm_state", {}),
                                          self.algorithm_state, self.device)  # fmt: skip
        # copies: the engine updates its parameters in place, never the caller's state
        self.params = {k: v.to(self.device, copy=True) for k, v in state["params"].items()}
        self.weights = state["weights"].to(self.device)
        for g, s in zip(self.generators, state["generators"], strict=True):
            g.set_state(s.clone())  # set_state needs a tensor that owns its storage
        if self.pairwise is not None:
            self.pairwise.load_state([bytes(t.to(torch.uint8).cpu().numpy().tobytes())
                                      for t in state["pairwise_keys"]])  # fmt: skip
            self._exchange_public_keys()
        self.iteration = int(state["iteration"])
        self.transform_state = transform_state
        self.algorithm_state = algorithm_state
        if self._traffic is not None and "traffic" in state:  # a checkpoint from before
            self._traffic.load_state_dict(state["traffic"])  # counts restart otherwise

    @property
    def _traffic(self):
        return getattr(self.mixer, "traffic", None)

    def communication(self) -> dict[str, list[int]] | None:
        """Messages and bytes every node has sent to other nodes so far, in node order
        (gathered over processes; see :class:`dpdl.engine.mixing.Traffic`); None when the
        runtime's mixer does not count them."""
        if self._traffic is None:
            return None
        sent = torch.stack([torch.as_tensor(self._traffic.messages),
                            torch.as_tensor(self._traffic.bytes)], dim=1).to(self.device)
        every = self._gather_nodes(sent).cpu()
        return {"messages_per_node": every[:, 0].tolist(), "bytes_per_node": every[:, 1].tolist()}

    # ------------------------------------------------------------------ evaluation
    def _records_per_forward(self, cuda: int, cpu: int) -> int:
        # On a CPU, small batches keep a forward's activations in cache: the shallow CNN
        # scores 10000 records in 2.3 s at 256 against 4.8 s at 4096 (same bits, one thread)
        return cpu if self.device.type == "cpu" else cuda

    @torch.no_grad()
    def predict_average(self, inputs: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        chunk = chunk or self._records_per_forward(cuda=4096, cpu=256)
        params = self.average_params()
        with evaluation_mode(self.model):
            outs = [
                functional_call(self.model, (params, self.buffers), (inputs[i : i + chunk],))
                for i in range(0, inputs.shape[0], chunk)
            ]
        return torch.cat(outs)

    @torch.no_grad()
    def predict_nodes(self, inputs: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """Outputs of every hosted node's de-biased model on shared inputs: (m, N, ...)."""
        chunk = chunk or self._records_per_forward(cuda=1024, cpu=64)  # x m models each
        params = self.debiased_params()

        def forward(p, x):
            return functional_call(self.model, (p, self.buffers), (x,))

        batched = vmap(forward, in_dims=(0, None))
        with evaluation_mode(self.model):
            return torch.cat(
                [batched(params, inputs[i : i + chunk]) for i in range(0, inputs.shape[0], chunk)],
                dim=1,
            )

    def node_accuracies(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Accuracy of every node's de-biased model on shared public inputs, (n,): each
        process scores its own nodes; only the scores are gathered."""
        return self._gather_nodes(accuracy(self.predict_nodes(inputs), targets))

    @torch.no_grad()
    def predict_own_inputs(self, inputs: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        """Outputs of every hosted node's de-biased model on that node's own inputs:
        ``inputs`` (m, N, ...) -> (m, N, ...) (row i through node i's model only)."""
        chunk = chunk or self._records_per_forward(cuda=1024, cpu=64)
        params = self.debiased_params()

        def forward(p, x):
            return functional_call(self.model, (p, self.buffers), (x,))

        batched = vmap(forward, in_dims=(0, 0))
        with evaluation_mode(self.model):
            outs = [batched(params, inputs[:, i : i + chunk])
                    for i in range(0, inputs.shape[1], chunk)]  # fmt: skip
            return torch.cat(outs, dim=1)

    @torch.no_grad()
    def node_scores(self, inputs: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor,
                    scores: dict[str, Callable]) -> dict[str, torch.Tensor]:  # fmt: skip
        """Each node's mean per-record score on its own (public) evaluation records, (n,) per
        score: ``inputs`` (m, N, ...), ``targets`` (m, N, ...), ``mask`` (m, N) the hosted
        nodes' padded sets, ``scores`` name -> (outputs, targets) -> (records,).  Each process
        scores its own nodes on their own sets; only the (n,) means are gathered."""
        out = self.predict_own_inputs(inputs)
        m, size = mask.shape
        flat_out = out.reshape(m * size, *out.shape[2:])
        flat_targets = targets.reshape(m * size, *targets.shape[2:])
        counts = mask.sum(dim=1).to(torch.float64)
        means = {}
        for name, score in scores.items():
            values = score(flat_out, flat_targets).reshape(m, size).to(torch.float64)
            # where, not a product: a padding slot's score may be NaN and must not count
            values = torch.where(mask, values, torch.zeros_like(values))
            means[name] = self._gather_nodes(values.sum(dim=1) / counts)
        return means

    def average_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        out = self.predict_average(inputs)
        loss = self.loss if callable(self.loss) else LOSSES[self.loss]
        return float(loss(out, targets).mean())


def _saved_transforms(state: dict) -> dict:
    """A checkpoint's update transform state: its "transforms" entry, or, in one written
    before the transforms were generic, the heavy ball's buffers under "momentum"."""
    if "transforms" in state:
        return state["transforms"]
    return {name: state[key] for key, name in LEGACY_STATE_KEYS.items() if key in state}


@contextlib.contextmanager
def evaluation_mode(model: nn.Module):
    """The model in eval mode (dropout off: a score of the model, not of one random mask),
    every module back in its own mode after (``model.train(flag)`` would set them all alike,
    and turn on a layer the user keeps in eval mode so that training draws nothing)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Fraction correct along the last-but-one dim: outputs (..., N, C), targets (N,)."""
    return (outputs.argmax(dim=-1) == targets).to(torch.float64).mean(dim=-1)
