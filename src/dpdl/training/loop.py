"""The step loop of a run: before each private step the ledger records it, then the engine
takes it; everything else a run does between steps (progress, evaluation, checkpoints) is a
hook's :meth:`Hook.on_step`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from dpdl.accounting.ledger import PrivacyLedger
from dpdl.algorithms.dyn_d2p import NonFiniteUpdate
from dpdl.engine.simulator import Simulator
from dpdl.training.plan import RunPlan

__all__ = ["Hook", "RunState", "run_steps"]


@dataclass
class RunState:
    """What the loop and its hooks share.  ``done``: steps finished (a resumed run starts at
    its checkpoint's); ``resumed``: whether it continues a checkpoint."""

    engine: Simulator
    ledger: PrivacyLedger | None
    rows: list[dict[str, Any]] = field(default_factory=list)
    done: int = 0
    resumed: bool = False
    stop: str = ""  # why a hook ended the run early (a callback asked): "" runs on


class Hook(Protocol):
    def on_start(self, state: RunState) -> None: ...  # before the first step

    def on_step(self, state: RunState) -> None: ...  # after each step (``state.done``)

    def on_end(self, state: RunState) -> None: ...  # after the last step, or a divergence


def run_steps(plan: RunPlan, state: RunState, hooks: list[Hook]) -> tuple[str, str]:
    """Take the plan's steps from ``state.done`` on; returns (status, message): "ok",
    "stopped" when a hook set ``state.stop`` (a callback asked to stop), or "diverged" with
    where, when an update was not finite."""
    for hook in hooks:
        hook.on_start(state)
    try:
        for k in range(state.done, plan.steps):
            if plan.private:  # recorded before the step: a step that fails still counts
                state.ledger.record_step(plan.noise_multiplier(k))
            state.engine.step(plan.step_arguments(k))
            state.done = k + 1
            for hook in hooks:
                hook.on_step(state)
            if state.stop:
                return "stopped", state.stop
    except NonFiniteUpdate as err:
        return "diverged", str(err)
    finally:
        for hook in hooks:
            hook.on_end(state)
    return "ok", ""
