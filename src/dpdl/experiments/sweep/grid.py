"""A sweep's ``[sweep]`` table as cells: validating it, expanding the grid, naming each cell.

Pure data (no files, no processes): what the driver runs and what ``dpdl tune`` and the
presets' tests expand without running anything.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
from dataclasses import dataclass
from typing import Any

from dpdl.errors import DPDLError

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
