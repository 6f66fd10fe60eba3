"""Where a run executes: the seam between the trainer and the processes that host the nodes.

A :class:`Runtime` answers everything that differs between one process holding every node
and several processes each holding a block of them, so that neither the trainer
(:mod:`dpdl.training.trainer`), the runner nor the engine asks which runtime it is in:

* **hosting**: which contiguous block of nodes this process hosts (:meth:`hosted_block`) and
  the device it drives (:meth:`local_device`);
* **agreement**: every process learns whether every process's check passed (:meth:`agree`,
  :meth:`all_true`, :meth:`same_on_every_rank`), so a refusal stops all of them;
* **collectives**: every node's size (:meth:`all_node_counts`, public), sums over the
  processes (:meth:`reduce_sum`: the network average is never a gather of models) and
  per-node values in node order (:meth:`gather_nodes`);
* **the main process**, which alone speaks and writes the run folder
  (:meth:`is_main_process`), and what it decided (:meth:`from_main_process`);
* **per-job files**: a run folder's name that survives a restart of the job
  (:meth:`job_run_name`), whether this is such a restart (:meth:`restarted`);
* **mixing**: the engine's :class:`~dpdl.engine.mixing.Mixer` (:meth:`mixer`) and a hook
  before each step (:meth:`before_step`: the distributed runtime's fault injection);
* optionally ``stream_root(entropy, seed, settings) -> bytes | None``: the root of the run's
  secret streams, when the runtime keeps it (the consortium's, so that a restarted party
  draws the noise it already sent); without it, :func:`dpdl.training.plan.noise_root`.

:class:`LocalRuntime` (``"simulator"``) is every node in this process;
:class:`dpdl.engine.distributed.TorchDistributedRuntime` (``"distributed"``) one block per
``torch.distributed`` rank.  :data:`RUNTIMES` names them (``experiment.runtime``, the trainer's
``runtime=``) by module path, as the experiment kinds are named: a runtime of one's own is a
class with these methods, registered with :func:`register_runtime` or handed to the trainer
as an instance.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import torch

from dpdl.engine.mixing import InMemoryMixer, Mixer
from dpdl.errors import DPDLError, require

__all__ = ["RUNTIMES", "LocalRuntime", "Runtime", "make_runtime", "register_runtime",
           "require_share_carrier"]


@runtime_checkable
class Runtime(Protocol):
    """What a process needs to know about the others (see the module doc)."""

    name: str  # recorded in trainer.json ("runtime")
    holds_every_record: bool  # one process holds every node's records
    # its mixer can hand a node's private per-edge shares to its neighbours (zero-sum noise)
    carries_private_shares: bool

    @property
    def rank(self) -> int:
        """This process's index among the processes (0 alone)."""
        ...

    def local_device(self, device: torch.device) -> torch.device:
        """The device this process drives, given the one asked for."""
        ...

    def hosted_block(self, n_nodes: int, device: torch.device) -> tuple[int, int]:
        """(first node, count) of the nodes this process hosts (joins the processes)."""
        ...

    def is_main_process(self) -> bool: ...

    def agree(self, check: Callable[[], None]) -> None:
        """Run ``check``; raise on every process when it raised (DPDLError) on any."""
        ...

    def all_true(self, flag: bool) -> bool:
        """Whether ``flag`` holds on every process."""
        ...

    def same_on_every_rank(self, value: int) -> bool: ...

    def all_node_counts(self, local: list[int], n_nodes: int) -> list[int]:
        """Every node's record count, from each process's hosted nodes' counts."""
        ...

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of ``tensor`` over the processes (a new tensor or ``tensor`` itself)."""
        ...

    def gather_nodes(self, tensor: torch.Tensor, n_nodes: int) -> torch.Tensor:
        """Every node's rows of a (hosted nodes, ...) tensor, in node order."""
        ...

    def from_main_process(self, value: Any) -> Any:
        """The main process's JSON-able ``value`` on every process."""
        ...

    def job_run_name(self, name: str) -> str | None:
        """A run folder name the job keeps across its restarts (None: the main one picks)."""
        ...

    def restarted(self) -> bool:
        """Whether the job was restarted after a failure (its run folder then resumes)."""
        ...

    def mixer(self, topology, block: tuple[int, int], device: torch.device) -> Mixer:
        """The engine's mixer of the hosted ``block`` of ``topology``'s nodes."""
        ...

    def before_step(self, step: int) -> None:
        """Called by the engine before each step (a hook: nothing to do here)."""
        ...


class LocalRuntime:
    """Every node in this one process: nothing is exchanged, every check is this process's."""

    name = "simulator"
    holds_every_record = True
    carries_private_shares = True  # in memory
    rank = 0

    def local_device(self, device: torch.device) -> torch.device:
        return device

    def hosted_block(self, n_nodes: int, device: torch.device) -> tuple[int, int]:
        return 0, n_nodes

    def is_main_process(self) -> bool:
        return True

    def agree(self, check: Callable[[], None]) -> None:
        check()

    def all_true(self, flag: bool) -> bool:
        return flag

    def same_on_every_rank(self, value: int) -> bool:
        return True

    def all_node_counts(self, local: list[int], n_nodes: int) -> list[int]:
        return local

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather_nodes(self, tensor: torch.Tensor, n_nodes: int) -> torch.Tensor:
        return tensor

    def from_main_process(self, value: Any) -> Any:
        return value

    def job_run_name(self, name: str) -> str | None:
        return None

    def restarted(self) -> bool:
        return False

    def mixer(self, topology, block: tuple[int, int], device: torch.device) -> Mixer:
        return InMemoryMixer(topology, device)

    def before_step(self, step: int) -> None:
        pass


# name -> "module:Class" (imported when asked for: the distributed runtime's module is not
# loaded by a run that does not use it)
RUNTIMES: dict[str, str] = {
    "simulator": "dpdl.engine.runtime:LocalRuntime",
    "distributed": "dpdl.engine.distributed:TorchDistributedRuntime",
    # one party of a consortium (started by `dpdl run --consortium FILE --party NAME`)
    "consortium": "dpdl.engine.consortium.runtime:ConsortiumRuntime",
}


def require_share_carrier(correlation, runtime) -> None:
    """Refuse, in one line, a noise correlation whose shares travel point to point (zero-sum)
    on a runtime (an instance or its class) whose mixer cannot carry them."""
    require(not getattr(correlation, "needs_channel", False)
            or getattr(runtime, "carries_private_shares", False),
            f"privacy.correlation = {correlation.name!r} hands each neighbour a private share; "
            f"the {runtime.name} runtime cannot carry them (the simulator and the distributed "
            "runtime can)")  # fmt: skip


def register_runtime(name: str, target: str | type) -> None:
    """Make ``name`` a runtime (``"package.module:Class"`` or a class with no arguments)."""
    require(isinstance(name, str) and name, f"a runtime needs a name, got {name!r}")
    RUNTIMES[name] = target


def make_runtime(runtime: str | Runtime) -> Runtime:
    """The runtime named ``runtime`` (a name of :data:`RUNTIMES`), or ``runtime`` itself."""
    if not isinstance(runtime, str):
        require(isinstance(runtime, Runtime),
                f"runtime must be one of {tuple(RUNTIMES)} or a Runtime, got {runtime!r}")
        return runtime
    require(runtime in RUNTIMES, f"runtime must be one of {tuple(RUNTIMES)}, got {runtime!r}")
    target = RUNTIMES[runtime]
    if isinstance(target, str):
        module, _, attr = target.partition(":")
        try:
            target = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise DPDLError(f"runtime {runtime!r}: cannot load {RUNTIMES[runtime]}: "
                            f"{err}") from None
    return target()
