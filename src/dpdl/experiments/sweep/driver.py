"""The sweep driver: run a grid's unfinished cells through an executor, resumably.

Every cell runs in its own folder ``SWEEP_DIR/cells/<cell-id>/``, assembled in
``<cell-id>.partial/`` and renamed into place only when it has finished, with ``cell.json``
(overrides and results) inside. This process alone writes the sweep folder
(:func:`commit_cell`); the executors only run cells (:mod:`dpdl.experiments.sweep.contract`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

from dpdl.errors import DPDLError
from dpdl.experiments.comparisons import REPORT_TABLE, split_report
from dpdl.experiments.sweep.contract import CellJob, CellOutcome, partial_dir
from dpdl.experiments.sweep.executors import make_executor
from dpdl.experiments.sweep.grid import cell_config, expand_grid, select_cells, split_sweep
from dpdl.files import write_atomic
from dpdl.training.provenance import PROVENANCE_KEY, provenance

CELL_FILE = "cell.json"
SWEEP_FILE = "sweep.json"
FAILED_SUFFIX = ".failed.json"  # cells/<cell-id>.failed.json: the last failure of a cell


def _configured_device(config: dict) -> str | None:
    """The device a config asks for (its cells record the one they resolved to)."""
    return (config.get("experiment") or {}).get("device")


def failure_record_path(cell_dir: Path) -> Path:
    """Where the driver records why the cell in ``cell_dir`` failed (beside its folder)."""
    return cell_dir.with_name(cell_dir.name + FAILED_SUFFIX)


def is_finished(cell_dir: Path) -> bool:
    return (cell_dir / CELL_FILE).is_file()


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
            from dpdl.training.site_ledger import remove_keeping_ledger

            # an earlier attempt's runs trained on the records: they stay in the site's ledger
            remove_keeping_ledger(partial, partial.parent.parent)  # the sweep folder
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
    base, pairs = split_report(base, sweep)  # the report's, never a cell's
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
        json.dumps({"base": base, "sweep": sweep, "cells": [c.cell_id for c in cells],
                    **({REPORT_TABLE: {"pairs": pairs}} if pairs else {}),
                    PROVENANCE_KEY: provenance(_configured_device(base))}, indent=2)
    )
    todo = [c for c in cells if not is_finished(cells_dir / c.cell_id)]
    _refuse_invalid_cells(base, todo)
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
        _run_jobs(runner, jobs, summary, bar)
    finally:
        if bar is not None:
            bar.close()
    return summary


def _refuse_invalid_cells(base: dict, todo: list) -> None:
    """Refuse an invalid grid or override before any worker starts, not once per cell."""
    from dpdl.experiments.registry import validate_experiment_config

    for cell in todo:
        try:
            validate_experiment_config(cell_config(base, cell))
        except DPDLError as err:
            raise DPDLError(f"sweep cell {cell.cell_id}: {err}") from None


def _run_jobs(runner, jobs: list[CellJob], summary: dict[str, Any], bar) -> None:
    """Commit each cell as the executor hands it back; count it in ``summary`` and the bar."""
    with closing(runner.run(jobs)) as outcomes:
        for job, outcome in outcomes:
            if outcome.error is None:
                commit_cell(job, outcome)
                failure_record_path(job.final_dir).unlink(missing_ok=True)
                summary["done"] += 1
            else:
                record_failure(job, outcome.error)
                summary["failed"][job.cell.cell_id] = outcome.error
            if bar is not None:
                bar.update(1)
                counts = {"done": summary["done"], "running": runner.running}
                bar.set_postfix({**counts, "failed": len(summary["failed"])})


def record_failure(job: CellJob, error: str) -> None:
    """Driver: keep a failed cell's overrides and error, for the report (a rerun retries it)."""
    text = json.dumps({"overrides": job.cell.as_dict(), "error": error}, indent=2, default=str)
    path = failure_record_path(job.final_dir)
    write_atomic(path, lambda fh: fh.write(text.encode()), mode=0o644)


def failed_cells(sweep_dir: Path) -> list[tuple[str, dict]]:
    """Each cell that failed and has not finished since: its id and its failure record
    ({"overrides", "error"}), in a stable order."""
    cells_dir = Path(sweep_dir) / "cells"
    failed = []
    for path in sorted(cells_dir.glob("*" + FAILED_SUFFIX)) if cells_dir.is_dir() else []:
        cell_id = path.name[: -len(FAILED_SUFFIX)]
        if not is_finished(cells_dir / cell_id):
            failed.append((cell_id, json.loads(path.read_text())))
    return failed


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    # disable=None: off when stderr is not a terminal (a log file gets no bar redraws)
    return tqdm(total=total, initial=initial, desc="sweep", unit="cell", disable=None)


def declared_pairs(sweep_dir: Path) -> list[tuple[str, str]] | None:
    """The comparison pairs the sweep's ``[report]`` table declared (None: none declared, or a
    sweep.json written before dpdl kept them): :mod:`dpdl.experiments.comparisons`."""
    try:
        record = json.loads((Path(sweep_dir) / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return None
    pairs = (record.get(REPORT_TABLE) or {}).get("pairs") if isinstance(record, dict) else None
    return [(a, b) for a, b in pairs] if pairs else None


def finished_cells(sweep_dir: Path) -> Iterable[tuple[Path, dict]]:
    """Each finished cell's folder and its ``cell.json`` record, in a stable order."""
    cells_dir = Path(sweep_dir) / "cells"
    if not cells_dir.is_dir():
        raise DPDLError(f"{sweep_dir} is not a sweep directory (no cells/ folder)")
    for cell_dir in sorted(cells_dir.iterdir()):
        if cell_dir.is_dir() and is_finished(cell_dir):
            yield cell_dir, json.loads((cell_dir / CELL_FILE).read_text())
