"""The executor contract: what the driver hands an executor, and what it gets back.

Executors import this module and nothing else of the sweep, so the driver may choose among
them (``executors.make_executor``) without the import cycle a driver ↔ executor import makes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dpdl.experiments.sweep.grid import Cell


@dataclass(frozen=True)
class CellJob:
    """A cell to run: its full config and the folder it ends in."""

    cell: Cell
    config: dict
    final_dir: Path


@dataclass(frozen=True)
class CellOutcome:
    """What an executor hands back for one cell: a finished run, or the error that stopped it.

    ``workdir`` is the folder the run wrote into (the paths in ``results`` point there);
    ``files`` is that folder's content when it lies on another machine, else None (the run
    wrote straight into ``<cell>.partial``).
    """

    error: str | None = None
    results: Any = None
    seconds: float = 0.0
    workdir: str = ""
    files: dict[str, bytes] | None = None


class CellExecutor(Protocol):
    """Runs cells somewhere; :func:`run_sweep` does the rest (resume, commit, failures, bar)."""

    def run(self, jobs: list[CellJob]) -> Iterator[tuple[CellJob, CellOutcome]]:
        """Yield each job with its outcome as it finishes; closing the iterator early cancels
        the unfinished jobs."""
        ...

    @property
    def running(self) -> int:
        """Cells running now (for the progress bar)."""
        ...


def run_cell_into(config: dict, run_dir: Path) -> tuple[Any, float]:
    """Run one cell's experiment writing into ``run_dir``; its results and wall seconds."""
    from dpdl.experiments.registry import experiment_module

    start = time.time()
    results = experiment_module(config.get("kind")).run_experiment(config, run_dir, progress=False)
    return results, round(time.time() - start, 3)


def partial_dir(final_dir: Path) -> Path:
    """Where a cell is assembled before its one atomic rename to ``final_dir``."""
    return final_dir.with_name(final_dir.name + ".partial")
