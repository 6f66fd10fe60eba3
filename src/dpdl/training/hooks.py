"""What a run does between its steps, as hooks of :func:`dpdl.training.loop.run_steps`:
evaluation (metrics rows, handed to the callbacks), the progress bar, and checkpoints."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpdl.accounting.ledger import PrivacyLedger
from dpdl.engine import checkpoint as checkpoints
from dpdl.training.callbacks import Evaluation, evaluation_of
from dpdl.training.evaluation import Evaluator
from dpdl.training.loop import RunState
from dpdl.training.plan import epsilon_spent
from dpdl.training.settings import PrivacySection

__all__ = [
    "CalibrationProgress", "CellCheckpointer", "Checkpoints", "Evaluations", "ProgressBar",
    "progress_bar",
]  # fmt: skip


def progress_bar(total: int | None, description: str, enabled: bool):
    """A tqdm bar on stderr, shown only when ``enabled`` and stderr is a terminal (tqdm's
    ``disable=None``): the one rule of every progress display of a run."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=description, disable=None if enabled else True,
                leave=False, dynamic_ncols=True)  # fmt: skip


def communication_means(engine) -> dict[str, float]:
    """The mean over nodes of what each sent so far (none when the mixer does not count)."""
    count = getattr(engine, "communication", None)  # an engine_factory's may not count
    sent = None if count is None else count()
    return {} if sent is None else {k: float(np.mean(v)) for k, v in sent.items()}


class Evaluations:
    """Evaluates the network's models at iteration 0, every ``every`` steps and (called by
    the trainer) at the end; every row goes to ``state.rows`` and to each callback."""

    def __init__(self, evaluator: Evaluator, privacy: PrivacySection, labels: dict[str, Any],
                 callbacks: list[Callable[[Evaluation], Any]], every: int, steps: int):  # fmt: skip
        self.evaluator, self.privacy, self.labels = evaluator, privacy, labels
        self.callbacks, self.every, self.steps = callbacks, every, steps

    def emit(self, state: RunState, row: dict[str, Any]) -> bool:
        """Hand the row to every callback; True when one of them returned True (stop)."""
        state.rows.append(row)
        evaluation = evaluation_of(row)
        answers = [callback(evaluation) for callback in self.callbacks]
        return any(answer is True for answer in answers)

    def evaluate(self, state: RunState, iteration: int, spent: tuple | None = None) -> None:
        """One row: the metrics of the engine's models now, with the epsilon spent so far
        (``spent``: the final one, else the ledger's at this evaluation point)."""
        eps_clt, eps_cert, method = spent or epsilon_spent(self.privacy, state.ledger, False)
        row = {
            "iteration": iteration, **self.labels, **self.evaluator.evaluate(state.engine),
            "epsilon_clt": eps_clt, "epsilon_certified": eps_cert,
            "epsilon_certified_method": method, **communication_means(state.engine),
        }  # fmt: skip
        asked = self.emit(state, row)
        # Callbacks run on the main process only: every process learns of a stop together.
        flag = torch.tensor([1.0 if asked else 0.0], device=state.engine.device)
        if float(state.engine.runtime.reduce_sum(flag)[0]) > 0 and iteration < self.steps:
            state.stop = f"stopped by a callback after step {iteration}"

    def on_start(self, state: RunState) -> None:
        if not state.resumed:  # a resumed run replayed its saved rows instead
            self.evaluate(state, 0)

    def on_step(self, state: RunState) -> None:
        if state.done % self.every == 0 and state.done < self.steps:
            self.evaluate(state, state.done)

    def on_end(self, state: RunState) -> None:
        pass


class ProgressBar:
    """A tqdm bar of the steps, with the accuracy and epsilon of the latest evaluation."""

    def __init__(self, total: int, description: str, enabled: bool):
        self.total, self.description, self.enabled = total, description, enabled
        self.bar = None

    def on_start(self, state: RunState) -> None:
        self.bar = progress_bar(self.total, self.description, self.enabled)
        if state.done:
            self.bar.update(state.done)

    def on_step(self, state: RunState) -> None:
        self.bar.update(1)
        row = state.rows[-1] if state.rows else None
        if row is not None and row["iteration"] == state.done:  # just evaluated
            self.bar.set_postfix(acc=f"{row['test_accuracy']:.3f}",
                                 eps=f"{row['epsilon_certified']:.3g}")  # fmt: skip

    def on_end(self, state: RunState) -> None:
        self.bar.close()


class CalibrationProgress:
    """``with CalibrationProgress(description, enabled) as shown:`` gives ``shown``, an
    ``on_iteration`` callback for the calibration (``dpdl.accounting.calibration``): a bar of
    the evaluations of epsilon with the latest one, shown as the steps' bar is."""

    def __init__(self, description: str, enabled: bool):
        self.description, self.enabled = description, enabled
        self.bar = None

    def __enter__(self) -> CalibrationProgress:
        self.bar = progress_bar(None, self.description, self.enabled)
        return self

    def __call__(self, iteration: int, total: int | None, epsilon: float) -> None:
        if total is None:  # one more evaluation (the last call repeats the answer's)
            self.bar.update(1)
        self.bar.set_postfix(eps=f"{epsilon:.4g}")

    def __exit__(self, *exc_info) -> None:
        self.bar.close()


@dataclass
class CellCheckpointer:
    """Where and how often a run saves its state, and the state to resume from (if any).

    Every process writes its own file (:func:`dpdl.engine.checkpoint.process_path` of
    ``path``) with its own nodes' state and what a resume needs besides (the ledger, the
    metrics rows, the run's settings digest): public numbers, the same on every rank."""

    path: Path
    every: int | None
    resume: dict[str, Any] | None = None

    def save(self, sim, ledger: PrivacyLedger | None, rows: list[dict[str, Any]],
             run_digest: str) -> None:  # fmt: skip
        checkpoints.save_atomic(
            checkpoints.process_path(self.path),
            {
                "engine": sim.state_dict(),
                "ledger": None if ledger is None else ledger.to_json(),
                "rows": json.dumps(rows),
                "run_digest": run_digest,
            },
        )


class Checkpoints:
    """Saves the run's state before the first step and every ``checkpointer.every`` steps
    (not after the last: a finished run has nothing to resume)."""

    def __init__(self, checkpointer: CellCheckpointer, run_digest: Callable[[], str], steps: int):
        self.checkpointer, self.run_digest, self.steps = checkpointer, run_digest, steps

    def _save(self, state: RunState) -> None:
        self.checkpointer.save(state.engine, state.ledger, state.rows, self.run_digest())

    def on_start(self, state: RunState) -> None:
        # Before the first step: a resume after a crash at any later step replays the very
        # noise already sent, never fresh noise for steps whose messages left the node.
        if not state.resumed and self.checkpointer.every:
            self._save(state)

    def on_step(self, state: RunState) -> None:
        every = self.checkpointer.every
        if every and state.done % every == 0 and state.done < self.steps:
            self._save(state)

    def on_end(self, state: RunState) -> None:
        pass
