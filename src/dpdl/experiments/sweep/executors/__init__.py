"""Where a sweep's cells run: ``local`` (:mod:`.local`, a process pool on this machine) or
``ray`` (:mod:`.ray`, one Ray task per cell on a cluster). Each imports only the contract."""

from __future__ import annotations

from dpdl.errors import DPDLError
from dpdl.experiments.sweep.contract import CellExecutor
from dpdl.experiments.sweep.executors.local import LocalExecutor

EXECUTORS = ("local", "ray")


def make_executor(
    name: str,
    *,
    workers: int,
    ray_address: str | None = None,
    ray_max_retries: int | None = None,
) -> CellExecutor:
    """``local``: the process pool; ``ray``: one Ray task per cell (see :mod:`.ray`)."""
    if name == "local":
        if ray_address is not None or ray_max_retries is not None:
            raise DPDLError("--ray-address and --ray-max-retries need --executor ray")
        return LocalExecutor(workers)
    if name == "ray":
        # Ray is optional: its executor is imported only when chosen
        from dpdl.experiments.sweep.executors.ray import DEFAULT_MAX_RETRIES, RayExecutor

        retries = DEFAULT_MAX_RETRIES if ray_max_retries is None else ray_max_retries
        return RayExecutor(address=ray_address, max_retries=retries, local_cpus=workers)
    raise DPDLError(f"unknown sweep executor {name!r}; choose one of {', '.join(EXECUTORS)}")
