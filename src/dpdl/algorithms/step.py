"""What one local step is made of and what it is given (MATH.md §4), as small dataclasses.

A node's local step is the composition (JAX-Privacy's ``DPExecutionPlan``, optax's chains)

    sampling -> per-record clipping -> noise mechanism -> update transforms

(communication, the mixing of the messages, stays in the engine).  :class:`LocalStep` names
its parts that stay fixed over a run (the model and its per-record loss, b, how clipped sums
are computed, the noise mechanism, the update transforms of :mod:`dpdl.algorithms.
transforms`); :class:`NodeRecords` the hosted nodes' data and secret streams, which sampling
reads; :class:`StepArguments` what step k is given (``RunPlan.step_arguments(k)``: the
mechanism's C_k and σ_k, γ_k, whether and on which graph it gossips); :class:`StepBuffers`
the engine's reusable buffers.  :func:`dpdl.algorithms.dyn_d2p.local_update` runs it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from dpdl.algorithms.noise import GaussianRelease, NoiseDraw
from dpdl.algorithms.randomness import SecretStream
from dpdl.algorithms.transforms import PLAIN, Chain
from dpdl.errors import DPDLError

Params = dict[str, torch.Tensor]

__all__ = [
    "NoiseMechanism",
    "GAUSSIAN_RELEASE",
    "StepArguments",
    "LocalStep",
    "NodeRecords",
    "StepBuffers",
]


class NoiseMechanism(Protocol):
    """What a private step's noise is (:class:`~dpdl.algorithms.noise.GaussianRelease`):
    ``start`` draws it, data-free, ``noisy_sums`` turns clipped sums into the released noisy
    sums G, ``noisy_step`` writes the message x - step_size·G."""

    name: str
    certified: bool

    def start(self, generators, d: int, sigma: float, *, device=None, reuse=None): ...

    def noisy_sums(self, noise, sums: Params) -> Params: ...

    def noisy_step(self, noise, x: Params, sums: Params, step_size: float,
                   out: Params) -> Params: ...  # fmt: skip


#: The mechanism of every private step (MATH.md §10).
GAUSSIAN_RELEASE = GaussianRelease()


@dataclass(frozen=True)
class StepArguments:
    """What one step is given (``RunPlan.step_arguments(k)``; ``Simulator.step`` takes it, or
    the same fields as keywords).

    ``private``: the clipped, noisy sum (clip bound C_k = ``clip``, noise std σ_k =
    ``sigma`` > 0; ``unsafe_zero_noise`` allows σ_k = 0, for tests of the clipping: not
    private), else SGP's mean gradient.  ``lr``: the step size γ_k (None: the engine's
    constant).  ``mix``: whether the step ends with a gossip round (False: a local step,
    nothing sent), on the graph of ``mixing_round`` (None: the iteration k)."""

    private: bool
    clip: float | None = None
    sigma: float | None = None
    lr: float | None = None
    mix: bool = True
    mixing_round: int | None = None
    unsafe_zero_noise: bool = False

    @classmethod
    def given(cls, args: StepArguments | None, keywords: Mapping[str, Any]) -> StepArguments:
        """``args``, or the arguments named by ``keywords`` (the keyword form of a step);
        refuses both at once, or an ``args`` that is not a StepArguments."""
        if args is None:
            try:
                return cls(**keywords)
            except TypeError as err:
                raise DPDLError(f"bad step arguments {sorted(keywords)}: {err}") from None
        if keywords or not isinstance(args, cls):
            raise DPDLError("a step takes one StepArguments or its fields as keywords, not "
                            f"{type(args).__name__} and {sorted(keywords)}")  # fmt: skip
        return args

    def with_lr(self, lr: float) -> StepArguments:
        """These arguments with γ_k = ``lr`` where none was given."""
        return self if self.lr is not None else dataclasses.replace(self, lr=float(lr))


@dataclass(frozen=True)
class LocalStep:
    """The parts of a node's local step that stay fixed over a run.

    ``model`` and ``loss`` (a name of ``dyn_d2p.LOSSES`` or a per-record callable) with the
    model's constant ``buffers`` define the per-record gradients; ``expected_batch_size`` b
    divides the noisy sum (u = G / b); ``clip_method`` picks how the clipped sums are computed
    (``dyn_d2p.clipped_record_sums``); ``mechanism`` is the noise (:data:`GAUSSIAN_RELEASE`,
    the only certified one); ``transforms`` the update transforms (a
    :class:`~dpdl.algorithms.transforms.Chain`; :data:`~dpdl.algorithms.transforms.PLAIN`, a
    step size alone, is Algorithm 1's step and takes the fused path)."""

    model: torch.nn.Module
    loss: str | Callable = "cross_entropy"
    buffers: Params | None = None
    expected_batch_size: float = 1.0
    clip_method: str = "auto"
    mechanism: NoiseMechanism = GAUSSIAN_RELEASE
    transforms: Chain = PLAIN


@dataclass(frozen=True)
class NodeRecords:
    """The hosted nodes' local data, padded, and their secret streams: ``inputs`` (m, J_max,
    ...), ``targets`` (m, J_max), ``mask`` (m, J_max) of the real records (first in each
    row), one stream per node in ``generators``; ``sample_rate`` one Poisson rate or one per
    node; ``first_node`` the global index of the block's first node (for messages)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    generators: Sequence[SecretStream]
    sample_rate: float | Sequence[float]
    first_node: int = 0

    @property
    def n_nodes(self) -> int:
        return int(self.mask.shape[0])


@dataclass
class StepBuffers:
    """An engine's buffers, reused across steps: ``work`` ({name: (m, *shape)}, overwritten;
    must not share memory with the models) holds the update and then x^{k+1/2}, which the
    step returns; ``noise`` (a :class:`~dpdl.algorithms.noise.NoiseDraw` of (m, d)) is
    refilled with the step's noise.  Either None: fresh tensors."""

    work: Params | None = None
    noise: NoiseDraw | None = None
