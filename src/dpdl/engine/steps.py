"""The engine's side of an algorithm's step (:class:`dpdl.algorithms.registry.StepContext`):
what a registered algorithm's :meth:`~dpdl.algorithms.registry.Algorithm.step` may do with
the hosted nodes, whichever runtime hosts them.

A step sees the models x_i^k and push-sum weights w_i^k, its per-node state (checkpointed by
the engine), and four operations: the built-in private local update (the step's first
release: sampling, per-record clipping, the exact noise release, the update transforms), a
further release's noisy gradient (a fresh Poisson sample and fresh noise of multiplier
``noise_factor`` times the schedule's, recorded by the ledger as its own mechanism), the
mixing of any tensors with a round's graph (the runtime's mixer: in memory, or messages
between processes), and the models' own mixing or keeping.  Each declared release may be made
at most once per step (a second draw is refused before anything is sampled): the ledger
records exactly one mechanism per declared release and step.  Python cannot stop a plugin
from reaching past this object into the engine; one that does is outside what dpdl
accounts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from dpdl.algorithms.dyn_d2p import Params
from dpdl.algorithms.step import StepArguments
from dpdl.algorithms.transforms import map_tensors, tree_structure
from dpdl.errors import require

__all__ = ["EngineStepContext", "copy_state", "state_to_device"]


class EngineStepContext:
    """One step of a registered algorithm on ``engine`` (a :class:`~dpdl.engine.simulator.
    Simulator`); ``arguments`` None while the algorithm's state is initialised."""

    def __init__(self, engine, arguments: StepArguments | None):
        self._engine = engine
        self.iteration = engine.iteration
        if arguments is not None and arguments.mixing_round is None:  # default: round k
            arguments = replace(arguments, mixing_round=self.iteration)
        self.arguments = arguments
        self.settings = engine.algorithm_settings
        self._releases = engine.algorithm.releases(self.settings)
        self._used: set[int] = set()  # the releases this step has made (each at most once)

    def _release(self, index: int) -> None:
        """Release ``index`` of this step, refused if already made: the ledger records one
        mechanism per declared release and step, so a second draw would go unaccounted."""
        require(self.arguments is not None, "the algorithm's state is being initialised: "
                "nothing may be released")  # fmt: skip
        require(index not in self._used,
                f"{self._engine.algorithm.name}: step {self.iteration} made release "
                f"{self._releases[index].name!r} twice; the ledger records each declared "
                "release once per step: declare another release for a further draw")
        self._used.add(index)

    @property
    def model(self) -> Params:
        """x_i^k of the hosted nodes, {name: (m, *shape)} (read-only by convention)."""
        return self._engine.params

    @property
    def weights(self) -> torch.Tensor:
        return self._engine.weights

    @property
    def state(self) -> dict[str, Any]:
        return self._engine.algorithm_state

    def local_update(self):
        """The step's first release: x^{k+1/2} (the engine's work buffer) and |S_i^k|."""
        self._release(0)
        return self._engine._local_update(self.iteration, self.arguments)

    def noisy_gradient(self, release: int) -> Params:
        """Release ``release`` (1, 2, ...: the algorithm's ``releases()`` order) of this step:
        (S_i + factor σ_k ξ) / b on a fresh Poisson sample at z_i = x_i / w_i, noise exactly
        released (MATH.md §10); SGP's mean gradient for a non-private step."""
        require(0 < release < len(self._releases),
                f"release {release} is not one of this algorithm's further releases "
                f"(1..{len(self._releases) - 1})")  # fmt: skip
        self._release(release)
        args = self.arguments
        if args.private:
            args = replace(args, sigma=args.sigma * self._releases[release].noise_factor)
        return self._engine.noisy_update(self.iteration, args)

    def mix(self, tensors: Params, round_: int) -> Params:
        """Σ_j P^r_ij t_j for any {name: (m, *shape)} tensors, with round ``round_``'s graph
        (the weights are not touched: push-sum's are mixed with the models)."""
        mixed, _ = self._engine.mixer.mix(tensors, self._engine.weights.clone(), round_,
                                          step=self.iteration)  # fmt: skip
        return mixed

    def mix_model(self, half: Params | None, round_: int) -> None:
        """One push-sum round of the models: of x^{k+1/2} (``half``, the local update's), or,
        with None, of the current models again (a round without fresh noise)."""
        engine = self._engine
        if half is not None:
            engine.params, engine.weights = engine.mixer.mix(
                half, engine.weights, round_, step=self.iteration, out=engine.params)
            return
        previous = engine.params
        engine.params, engine.weights = engine.mixer.mix(
            previous, engine.weights, round_, step=self.iteration, out=engine.work_buffer())
        engine._work = previous  # x before this round is no longer needed: the next buffer

    def keep_model(self, half: Params) -> None:
        """No round this step: x^{k+1} = x^{k+1/2}."""
        self._engine._keep_local(half)


def copy_state(state: Any, device: str | torch.device = "cpu") -> Any:
    """A copy of an algorithm's state (nested dicts of tensors) on ``device``."""
    return map_tensors(lambda t: t.detach().to(device, copy=True), state)


def state_to_device(saved: Any, like: Any, device) -> Any:
    """``saved`` checked against the freshly initialised ``like`` (same keys, shapes and
    dtypes), copied onto ``device``: a checkpoint of another algorithm or setting is refused."""
    require(tree_structure(saved) == tree_structure(like),
            "the checkpoint's algorithm state does not match this algorithm's")  # fmt: skip
    return map_tensors(lambda t: t.to(device, copy=True), saved)
