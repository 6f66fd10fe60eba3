"""The local executor of ``dpdl sweep``: a process pool on this machine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from dpdl.experiments.sweep.contract import CellJob, CellOutcome, partial_dir, run_cell_into

_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def _init_worker() -> None:
    """One thread per worker (the workers are the parallelism), set before torch or numpy
    load, so a worker whose experiment never imports torch does not pay for importing it."""
    for name in _THREAD_VARIABLES:
        os.environ[name] = "1"


def _run_cell_local(config: dict, partial: str) -> tuple[Any, float]:
    """Pool worker: run one cell into its (fresh) ``<cell>.partial`` folder."""
    folder = Path(partial)
    if folder.exists():
        from dpdl.training.site_ledger import remove_keeping_ledger

        # an earlier attempt's runs trained on the records: they stay in the site's ledger
        remove_keeping_ledger(folder, folder.parent.parent)  # the sweep folder
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
                    yield job, _outcome(future, str(partial_dir(job.final_dir)))
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


def _outcome(future, workdir: str) -> CellOutcome:
    """A finished future as the contract's outcome; the run wrote into ``workdir``."""
    try:
        results, seconds = future.result()
    except Exception as err:  # a failed cell must not stop the others
        return CellOutcome(error=f"{type(err).__name__}: {err}")
    return CellOutcome(results=results, seconds=seconds, workdir=workdir)
