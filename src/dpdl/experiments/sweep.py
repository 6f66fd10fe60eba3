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

Where the cells run is the executor's business (:class:`LocalExecutor`, a process pool on this
machine, or :class:`dpdl.experiments.sweep_ray.RayExecutor`, Ray tasks on a cluster); this
process alone writes the sweep folder (:func:`commit_cell`).
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import os
import shutil
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import closing
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Protocol

from dpdl.errors import DPDLError
from dpdl.files import write_atomic

CELL_FILE = "cell.json"
SWEEP_FILE = "sweep.json"
_SWEEP_KEYS = {"grid", "workers", "zip"}


@dataclass(frozen=True)
class Cell:
    """One point of the grid: the overrides applied to the base config."""

    overrides: tuple[tuple[str, Any], ...]

    @property
    def cell_id(self) -> str:
        parts = [f"{key.rsplit('.', 1)[-1]}={_fmt(value)}" for key, value in self.overrides]
        readable = "_".join(parts) or "base"
        digest = hashlib.sha1(json.dumps(self.overrides, default=str).encode()).hexdigest()[:8]
        readable = "".join(c if c.isalnum() or c in "=._-" else "-" for c in readable)[:80]
        return f"{readable}_{digest}"

    def as_dict(self) -> dict[str, Any]:
        return dict(self.overrides)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        return "+".join(_fmt(v) for v in value)
    return str(value)


def set_dotted(config: dict, key: str, value: Any) -> None:
    """Set ``config["a"]["b"] = value`` for ``key = "a.b"``, creating tables as needed."""
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise DPDLError(f"sweep key {key!r}: {part!r} is not a table in the base config")
        node = child
    node[leaf] = value


def split_sweep(config: dict) -> tuple[dict, dict]:
    """Separate the ``[sweep]`` table from the base config and validate it."""
    config = copy.deepcopy(config)
    sweep = config.pop("sweep", None)
    if not isinstance(sweep, dict):
        raise DPDLError("a sweep config needs a [sweep] table with a [sweep.grid] of lists")
    unknown = set(sweep) - _SWEEP_KEYS
    if unknown:
        raise DPDLError(f"unknown key(s) in [sweep]: {', '.join(sorted(unknown))}")
    for name in ("grid", "zip"):
        table = sweep.get(name, {})
        if not isinstance(table, dict):
            raise DPDLError(f"[sweep.{name}] must be a table of dotted keys to lists")
        for key, values in table.items():
            if not isinstance(values, list) or not values:
                raise DPDLError(f"sweep.{name}.{key!r} must be a non-empty list")
    zipped = sweep.get("zip", {})
    if zipped and len({len(v) for v in zipped.values()}) != 1:
        raise DPDLError("all lists in [sweep.zip] must have the same length")
    workers = sweep.get("workers", 1)
    if not isinstance(workers, int) or workers < 1:
        raise DPDLError(f"sweep.workers must be a positive integer, got {workers!r}")
    return config, sweep


def expand_grid(sweep: dict) -> list[Cell]:
    """Cartesian product of ``[sweep.grid]``, times the parallel lists of ``[sweep.zip]``."""
    grid = sweep.get("grid", {})
    zipped = sweep.get("zip", {})
    keys = list(grid)
    zip_rows: list[list[tuple[str, Any]]] = [[]]
    if zipped:
        length = len(next(iter(zipped.values())))
        zip_rows = [[(k, v[i]) for k, v in zipped.items()] for i in range(length)]
    cells = []
    for values in itertools.product(*(grid[k] for k in keys)):
        for zrow in zip_rows:
            cells.append(Cell(tuple(zip(keys, values, strict=True)) + tuple(zrow)))
    return cells


def select_cells(cells: list[Cell], only: list[tuple[str, Any]]) -> list[Cell]:
    """The cells whose grid values match every (dotted key, value) of ``only``: the way to
    re-run one cell of a sweep exactly as the sweep ran it."""
    keys = {key for cell in cells for key, _ in cell.overrides}
    for key, value in only:
        if key not in keys:
            known = ", ".join(sorted(keys))
            raise DPDLError(f"--only {key}: not a grid key of this sweep ({known})")
        chosen = [cell for cell in cells if cell.as_dict().get(key) == value]
        if not chosen:
            values = sorted({_fmt(cell.as_dict()[key]) for cell in cells if key in cell.as_dict()})
            raise DPDLError(
                f"--only {key}={value!r} matches no cell; grid has {', '.join(values)}"
            )
        cells = chosen
    return cells


def cell_config(base: dict, cell: Cell) -> dict:
    config = copy.deepcopy(base)
    for key, value in cell.overrides:
        set_dotted(config, key, value)
    return config


def is_finished(cell_dir: Path) -> bool:
    return (cell_dir / CELL_FILE).is_file()


_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _init_worker() -> None:
    """One thread per worker (the workers are the parallelism), set before torch or numpy
    load, so a worker whose experiment never imports torch does not pay for importing it."""
    for name in _THREAD_VARIABLES:
        os.environ[name] = "1"


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


def _run_cell_local(config: dict, partial: str) -> tuple[Any, float]:
    """Pool worker: run one cell into its (fresh) ``<cell>.partial`` folder."""
    folder = Path(partial)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    return run_cell_into(config, folder)


class LocalExecutor:
    """A pool of ``workers`` single-threaded processes on this machine; each writes its cell
    straight into ``<cell>.partial`` (same file system as the driver)."""

    def __init__(self, workers: int, *, persistent: bool = False):
        self.workers = workers
        self._pending: dict = {}
        # persistent: one pool for every run() until close() (several sweeps, one start-up)
        self.persistent, self._pool = persistent, None

    @property
    def running(self) -> int:
        return min(len(self._pending), self.workers)

    def run(self, jobs: list[CellJob]) -> Iterator[tuple[CellJob, CellOutcome]]:
        pool = self._pool or ProcessPoolExecutor(
            max_workers=self.workers,
            mp_context=get_context("spawn"),  # fork + torch threads is unsafe; spawn is portable
            initializer=_init_worker,
        )
        if self.persistent:
            self._pool = pool
        try:
            self._pending = {
                pool.submit(_run_cell_local, job.config, str(partial_dir(job.final_dir))): job
                for job in jobs
            }
            while self._pending:
                finished, _ = wait(self._pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    job = self._pending.pop(future)
                    workdir = str(partial_dir(job.final_dir))
                    try:
                        results, seconds = future.result()
                    except Exception as err:  # a failed cell must not stop the others
                        yield job, CellOutcome(error=f"{type(err).__name__}: {err}")
                    else:
                        yield job, CellOutcome(results=results, seconds=seconds, workdir=workdir)
        except BaseException:
            self.close(pool)
            raise
        finally:
            self._pending = {}
            if not self.persistent:
                pool.shutdown(wait=True, cancel_futures=True)

    def close(self, pool=None) -> None:
        """Stop the workers (a persistent executor's pool, or ``pool``)."""
        pool = pool or self._pool
        self._pool = None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _relocated(value: Any, old: str, new: str) -> Any:
    """``value`` with every string path under ``old`` moved under ``new``."""
    if isinstance(value, str) and (value == old or value.startswith(old + os.sep)):
        return new + value[len(old) :]
    if isinstance(value, dict):
        return {k: _relocated(v, old, new) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_relocated(v, old, new) for v in value]
    return value


def commit_cell(job: CellJob, outcome: CellOutcome) -> dict:
    """Driver: put a finished cell in place — its files (if they came from elsewhere) and
    ``cell.json`` into ``<cell>.partial``, then one atomic rename to the cell's folder."""
    final = job.final_dir
    partial = partial_dir(final)
    if outcome.files is not None:
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
        root = partial.resolve()
        for name, content in outcome.files.items():
            target = (partial / name).resolve()
            if not target.is_relative_to(root):
                raise DPDLError(f"cell {job.cell.cell_id}: file {name!r} lies outside its folder")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
    record = {
        "overrides": job.cell.as_dict(),
        "results": _relocated(outcome.results, outcome.workdir, str(final))
        if outcome.workdir
        else outcome.results,
        "seconds": outcome.seconds,
    }
    text = json.dumps(record, indent=2, default=str).encode()
    write_atomic(partial / CELL_FILE, lambda fh: fh.write(text), mode=0o644)
    os.replace(partial, final)
    return record


EXECUTORS = ("local", "ray")


def make_executor(
    name: str,
    *,
    workers: int,
    ray_address: str | None = None,
    ray_max_retries: int | None = None,
) -> CellExecutor:
    """``local``: the process pool; ``ray``: one Ray task per cell (see sweep_ray)."""
    if name == "local":
        if ray_address is not None or ray_max_retries is not None:
            raise DPDLError("--ray-address and --ray-max-retries need --executor ray")
        return LocalExecutor(workers)
    if name == "ray":
        from dpdl.experiments.sweep_ray import DEFAULT_MAX_RETRIES, RayExecutor

        retries = DEFAULT_MAX_RETRIES if ray_max_retries is None else ray_max_retries
        return RayExecutor(address=ray_address, max_retries=retries, local_cpus=workers)
    raise DPDLError(f"unknown sweep executor {name!r}; choose one of {', '.join(EXECUTORS)}")


def run_sweep(
    config: dict,
    sweep_dir: Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    executor: str = "local",
    ray_address: str | None = None,
    ray_max_retries: int | None = None,
    only: list[tuple[str, Any]] | None = None,
    runner: Any = None,
) -> dict[str, Any]:
    """Run every unfinished cell of the sweep; return a summary {done, skipped, failed}.

    ``only`` (pairs of a dotted grid key and a value) restricts the sweep to the matching cells.

    ``executor`` says where the cells run: ``local`` (a process pool of ``workers``) or
    ``ray`` (Ray tasks on the cluster at ``ray_address``; a fresh local Ray instance with
    ``workers`` CPUs when None). Either way this process is the only writer of ``sweep_dir``.
    """
    base, sweep = split_sweep(config)
    cells = select_cells(expand_grid(sweep), only or [])
    workers = workers or sweep.get("workers", 1)
    if runner is None:  # else an executor the caller owns (several sweeps, one pool)
        runner = make_executor(
            executor, workers=workers, ray_address=ray_address, ray_max_retries=ray_max_retries
        )
    sweep_dir = Path(sweep_dir)
    cells_dir = sweep_dir / "cells"
    cells_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / SWEEP_FILE).write_text(
        json.dumps({"base": base, "sweep": sweep, "cells": [c.cell_id for c in cells]}, indent=2)
    )
    todo = [c for c in cells if not is_finished(cells_dir / c.cell_id)]
    # Refuse an invalid grid or override before any worker starts, not once per cell.
    from dpdl.experiments.registry import validate_experiment_config

    for cell in todo:
        try:
            validate_experiment_config(cell_config(base, cell))
        except DPDLError as err:
            raise DPDLError(f"sweep cell {cell.cell_id}: {err}") from None
    summary: dict[str, Any] = {
        "cells": len(cells),
        "skipped": len(cells) - len(todo),
        "done": 0,
        "failed": {},
    }
    if not todo:
        return summary
    jobs = [CellJob(cell, cell_config(base, cell), cells_dir / cell.cell_id) for cell in todo]
    bar = _progress_bar(len(cells), summary["skipped"], progress)
    try:
        with closing(runner.run(jobs)) as outcomes:
            for job, outcome in outcomes:
                if outcome.error is None:
                    commit_cell(job, outcome)
                    summary["done"] += 1
                else:
                    summary["failed"][job.cell.cell_id] = outcome.error
                if bar is not None:
                    bar.update(1)
                    counts = {"done": summary["done"], "running": runner.running}
                    bar.set_postfix({**counts, "failed": len(summary["failed"])})
    finally:
        if bar is not None:
            bar.close()
    return summary


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc="sweep", unit="cell")


def finished_cells(sweep_dir: Path) -> Iterable[tuple[Path, dict]]:
    """Each finished cell's folder and its ``cell.json`` record, in a stable order."""
    cells_dir = Path(sweep_dir) / "cells"
    if not cells_dir.is_dir():
        raise DPDLError(f"{sweep_dir} is not a sweep directory (no cells/ folder)")
    for cell_dir in sorted(cells_dir.iterdir()):
        if cell_dir.is_dir() and is_finished(cell_dir):
            yield cell_dir, json.loads((cell_dir / CELL_FILE).read_text())
