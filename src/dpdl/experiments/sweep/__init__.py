"""Sweeps: run a grid of configurations in parallel worker processes, resumably.

A sweep file is an ordinary run config (any experiment kind) with a ``[sweep]`` table::

    [sweep]
    workers = 2
    [sweep.grid]                 # cartesian product of dotted config keys
    "privacy.epsilon" = [0.3, 1.0]
    "experiment.seed" = [0, 1, 2]

Every cell is the base config with its overrides applied; it runs in its own folder
``SWEEP_DIR/cells/<cell-id>/``. A cell is written into ``<cell-id>.partial/`` and renamed into
place only when it has finished, with ``cell.json`` (overrides and results) inside, so:

* an interrupted sweep never loses a finished cell and never leaves a half cell that looks
  finished;
* running the sweep again skips every finished cell (resumable).

The modules, each importing only those before it: ``grid`` (the ``[sweep]`` table as cells),
``contract`` (what an executor is handed and hands back), ``executors`` (``local``, a process
pool on this machine; ``ray``, Ray tasks on a cluster, imported only when chosen, so Ray stays
optional) and ``driver`` (:func:`run_sweep`, the only writer of the sweep folder).
"""

from dpdl.experiments.sweep.contract import CellExecutor, CellJob, CellOutcome, run_cell_into
from dpdl.experiments.sweep.driver import (
    CELL_FILE,
    SWEEP_FILE,
    commit_cell,
    failed_cells,
    finished_cells,
    is_finished,
    run_sweep,
)
from dpdl.experiments.sweep.executors import EXECUTORS, make_executor
from dpdl.experiments.sweep.executors.local import LocalExecutor
from dpdl.experiments.sweep.grid import (
    Cell,
    cell_config,
    expand_grid,
    select_cells,
    set_dotted,
    split_sweep,
)

__all__ = [
    "CELL_FILE",
    "EXECUTORS",
    "SWEEP_FILE",
    "Cell",
    "CellExecutor",
    "CellJob",
    "CellOutcome",
    "LocalExecutor",
    "cell_config",
    "commit_cell",
    "expand_grid",
    "failed_cells",
    "finished_cells",
    "is_finished",
    "make_executor",
    "run_cell_into",
    "run_sweep",
    "select_cells",
    "set_dotted",
    "split_sweep",
]
