"""The Ray executor of ``dpdl sweep --executor ray``: one Ray task per cell, on any machine.

Each cell is a Ray task that asks for one CPU (and one GPU when its device is ``cuda``), so
Ray places it wherever there is room. The task runs the cell in a scratch folder on its own
machine and returns the folder's files with the results; the driver
(:func:`dpdl.experiments.sweep.driver.commit_cell`) writes them into ``<cell>.partial`` and
renames it into place, so the sweep folder has one writer and no shared file system is needed.
This module imports only the executor contract, never the driver.

A worker that dies mid-cell (killed, out of memory, its machine lost) makes Ray run the cell
again, at most ``max_retries`` times; an exception raised by the experiment itself is not
retried (it would fail again) and is recorded as the cell's error, as with the local pool.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterator
from pathlib import Path

from dpdl.errors import DPDLError
from dpdl.experiments.sweep.contract import CellJob, CellOutcome, run_cell_into

DEFAULT_MAX_RETRIES = 2
INSTALL_HINT = "--executor ray needs Ray: pip install -e '.[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise DPDLError(INSTALL_HINT) from None
    return ray


def run_cell_remote(config: dict) -> CellOutcome:
    """Ray task: run one cell in a scratch folder and bring back every file it wrote."""
    with tempfile.TemporaryDirectory(prefix="dpdl-cell-") as scratch:
        root = Path(scratch)
        results, seconds = run_cell_into(config, root)
        files = {
            path.relative_to(root).as_posix(): path.read_bytes()
            for path in sorted(root.rglob("*"))
            if path.is_file()
        }
    return CellOutcome(results=results, seconds=seconds, workdir=scratch, files=files)


def cell_resources(job: CellJob) -> dict[str, float]:
    """What a cell asks Ray for: one CPU (cells run single-threaded), plus one GPU on cuda."""
    device = str(job.config.get("experiment", {}).get("device", "cpu"))
    if device.startswith("cuda:"):
        raise DPDLError(
            f"sweep cell {job.cell.cell_id}: experiment.device = {device!r}; under --executor "
            "ray a cell gets its GPU from Ray, so set experiment.device = 'cuda'"
        )
    return {"num_cpus": 1, "num_gpus": 1 if device == "cuda" else 0}


def _error_message(err: Exception, max_retries: int) -> str:
    ray = import_ray()
    if isinstance(err, ray.exceptions.RayTaskError) and err.cause is not None:
        return f"{type(err.cause).__name__}: {err.cause}"
    if isinstance(err, ray.exceptions.WorkerCrashedError):
        return (
            f"WorkerCrashedError: the worker running this cell died {max_retries + 1} time(s) "
            f"(--ray-max-retries {max_retries})"
        )
    return f"{type(err).__name__}: {err}"


class RayExecutor:
    """Cells as Ray tasks on the cluster at ``address`` (None: a fresh local Ray instance
    with ``local_cpus`` CPUs; an already connected driver, e.g. a notebook, is reused)."""

    def __init__(
        self,
        *,
        address: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        local_cpus: int = 1,
    ):
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise DPDLError(f"--ray-max-retries must be an integer ≥ 0, got {max_retries!r}")
        import_ray()
        self.address = address
        self.max_retries = max_retries
        self.local_cpus = local_cpus
        self._pending: dict = {}
        self._slots = 1

    @property
    def running(self) -> int:
        return min(len(self._pending), self._slots)

    def _connect(self) -> bool:
        """Connect to (or start) Ray unless already connected; True when this call did."""
        ray = import_ray()
        if ray.is_initialized():
            return False
        if self.address is None:
            options = {"address": "local", "num_cpus": self.local_cpus, "include_dashboard": False}
        else:
            options = {"address": self.address}
        try:
            ray.init(**options, logging_level=logging.WARNING)
        except ConnectionError as err:
            raise DPDLError(f"--ray-address {self.address!r}: {err}") from None
        return True

    def run(self, jobs: list[CellJob]) -> Iterator[tuple[CellJob, CellOutcome]]:
        resources = [cell_resources(job) for job in jobs]
        ray = import_ray()
        started = self._connect()
        try:
            self._slots = max(1, int(ray.cluster_resources().get("CPU", 1)))
            task = ray.remote(run_cell_remote)
            self._pending = {
                task.options(
                    **need, max_retries=self.max_retries, retry_exceptions=False
                ).remote(job.config): job
                for job, need in zip(jobs, resources, strict=True)
            }
            while self._pending:
                # a bounded wait hands control back to Python every second, so Ctrl-C (a
                # KeyboardInterrupt) is seen at once instead of when the next cell ends
                ready, _ = ray.wait(list(self._pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    job = self._pending.pop(ref)
                    try:
                        outcome = ray.get(ref)
                    except Exception as err:  # a failed cell must not stop the others
                        outcome = CellOutcome(error=_error_message(err, self.max_retries))
                    yield job, outcome
        finally:
            for ref in self._pending:
                ray.cancel(ref, force=True)
            self._pending = {}
            if started:
                ray.shutdown()
