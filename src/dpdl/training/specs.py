"""The trainer's non-privacy settings, grouped beside its ``privacy=`` and ``training=``
sections: how a run is evaluated (:class:`EvaluationSpec`), what it writes
(:class:`OutputSpec`) and where and with what randomness it executes (:class:`ExecutionSpec`).

Each is a frozen dataclass that checks itself on construction (one-line ``DPDLError``\\ s
naming the value).  :class:`~dpdl.training.trainer.DecentralizedTrainer` takes them as
``evaluation=``, ``output=`` and ``execution=`` (an instance or a dict of its fields), and
every field also as a keyword of its own (``eval_data=``, ``output_dir=``, ``seed=`` ...),
which overrides the spec's (None leaves it), as the privacy and training fields do theirs:
:func:`build_spec`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpdl.algorithms.randomness import DEFAULT_ENTROPY, ENTROPY_MODES
from dpdl.engine.runtime import Runtime, make_runtime
from dpdl.engine.simulator import resolve_device
from dpdl.errors import DPDLError, require

__all__ = ["CALLBACKS_ON", "EvaluationSpec", "ExecutionSpec", "OutputSpec", "build_spec",
           "spec_fields"]  # fmt: skip

CALLBACKS_ON = ("main", "all")


@dataclass(frozen=True, eq=False)
class EvaluationSpec:
    """How a run is evaluated; everything here is evaluation data the user declares public.

    ``eval_data`` ``(inputs, targets)`` (test metrics), ``train_eval_data`` (the records of
    ``unsafe_train_metrics``; default: ``eval_train_samples`` of the nodes' own),
    ``validation_data`` (``val_loss``, ``val_accuracy``), ``node_eval_data`` (one set per node,
    or a function of the node index: ``node_local_*``), ``metric`` ``(outputs, targets) ->
    float | dict``, ``callbacks`` (callables receiving an
    :class:`~dpdl.training.callbacks.Evaluation`), ``callbacks_on`` ("main": the main process
    only, or "all"), ``gather_node_models`` (every node's model in the result, also in the
    distributed runtime)."""

    eval_data: Any = None
    train_eval_data: Any = None
    validation_data: Any = None
    node_eval_data: Any = None
    metric: Callable | None = None
    callbacks: Sequence[Callable[[Any], Any]] = ()
    callbacks_on: str = "main"
    gather_node_models: bool = False

    def __post_init__(self):
        object.__setattr__(self, "callbacks", tuple(self.callbacks))
        require(all(callable(c) for c in self.callbacks), "every callback must be a callable")
        require(self.callbacks_on in CALLBACKS_ON,
                f"callbacks_on must be 'main' or 'all', got {self.callbacks_on!r}")  # fmt: skip
        object.__setattr__(self, "gather_node_models", bool(self.gather_node_models))


@dataclass(frozen=True, eq=False)
class OutputSpec:
    """What a run writes: with ``output_dir`` a run folder there (``trainer.json``,
    ``metrics.csv``, ``results.json``, ``curves.png``, checkpoints), named ``run_name`` (else
    ``<name>-<UTC time>``); ``resume`` continues that folder's run; ``progress`` shows a bar;
    ``checkpoint`` a :class:`~dpdl.training.hooks.CellCheckpointer` of the caller's (the
    runner's cells) instead of the folder's own.  ``site``: the folder whose ledger across
    runs (:mod:`dpdl.training.site_ledger`) records this run before it trains (default
    ``output_dir``; None and no ``output_dir``: no record), ``site_run`` the run's name there
    (default its run folder's); ``vector_figures`` writes curves.png's PDF and SVG beside it
    (the PNG alone by default: every run writes it)."""

    output_dir: str | Path | None = None
    run_name: str | None = None
    name: str = "train"
    resume: bool = False
    progress: bool = False
    checkpoint: Any = None
    site: str | Path | None = None
    site_run: str | None = None
    vector_figures: bool = False

    def __post_init__(self):
        object.__setattr__(self, "vector_figures", bool(self.vector_figures))
        for where in ("output_dir", "site"):
            if getattr(self, where) is not None:
                object.__setattr__(self, where, Path(getattr(self, where)))
        require(
            not self.resume or (self.output_dir is not None and self.run_name is not None),
            "resume needs output_dir and the run_name of the run folder to continue",
        )
        object.__setattr__(self, "resume", bool(self.resume))


@dataclass(frozen=True, eq=False)
class ExecutionSpec:
    """Where a run executes and where its secret randomness comes from.

    ``device`` ("cpu", "cuda", "cuda:N", "auto"; resolved, and in the distributed runtime
    each local rank's own GPU), ``runtime`` (a name of :data:`dpdl.engine.runtime.RUNTIMES`,
    "simulator" or "distributed" (started by torchrun), or a
    :class:`~dpdl.engine.runtime.Runtime`; held as the runtime itself), ``entropy`` ("os",
    the default: secret noise; "seed": reproducible from ``seed``, a research setting),
    ``seed`` (public randomness: the split, the evaluation subsamples; the noise too with
    ``entropy="seed"``), ``engine_factory`` (builds the engine: a
    :class:`~dpdl.engine.simulator.Simulator` subclass or a function taking its arguments),
    ``common_noise`` (research mode, with ``entropy="seed"`` only: the seeded streams are
    keyed by the seed, the nodes and the model alone, so runs that differ in algorithm,
    privacy or training settings share their sampling and noise draws: common random numbers
    for the arms of a paired comparison, on purpose)."""

    device: str | torch.device = "cpu"
    runtime: str | Runtime = "simulator"
    entropy: str = DEFAULT_ENTROPY
    seed: int = 0
    engine_factory: Callable | None = None
    common_noise: bool = False

    def __post_init__(self):
        require(
            self.entropy in ENTROPY_MODES,
            f"unknown entropy {self.entropy!r}; use 'os' (secret, default) or 'seed'",
        )
        require(self.common_noise in (False, True) and (not self.common_noise
                                                         or self.entropy == "seed"),
                f"common_noise = {self.common_noise!r} shares seeded noise between runs: it "
                f"needs entropy = 'seed' (research mode), got entropy = {self.entropy!r}")
        runtime = make_runtime(self.runtime)
        seed = self.seed
        require(
            isinstance(seed, int | np.integer) and not isinstance(seed, bool) and seed >= 0,
            f"seed must be a non-negative integer, got {seed!r}",
        )
        require(self.engine_factory is None or callable(self.engine_factory),
                f"engine_factory must be a callable, got {self.engine_factory!r}")  # fmt: skip
        object.__setattr__(self, "runtime", runtime)
        object.__setattr__(self, "seed", int(seed))
        object.__setattr__(self, "device", runtime.local_device(resolve_device(self.device)))


def spec_fields(cls: type) -> tuple[str, ...]:
    """The field names of a spec class (the trainer's keywords for it)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def build_spec(cls: type, given: Any, overrides: dict[str, Any], what: str):
    """``given`` (a ``cls``, a dict of its fields, or None: the defaults) with each override
    that is not None, checked as one."""
    fields = spec_fields(cls)
    if given is None:
        base: dict[str, Any] = {}
    elif isinstance(given, cls):
        base = {name: getattr(given, name) for name in fields}
    elif isinstance(given, dict):
        base = dict(given)
    else:
        raise DPDLError(f"{what} must be {cls.__name__}(...) or a dict of its fields, got "
                        f"{type(given).__name__}")
    unknown = sorted(set(base) - set(fields))
    require(not unknown, f"unknown {what} option(s): {', '.join(unknown)}")
    return cls(**(base | {k: v for k, v in overrides.items() if v is not None}))
