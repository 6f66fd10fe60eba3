"""Run folders: where one run (``dpdl run``, a ``dpdl.train`` call with ``output_dir``, any
experiment kind) writes its settings, metrics, results and checkpoints.

:class:`RunFolder` is the one writer every experiment kind uses, so that the same file is
written the same way whichever kind writes it: JSON with two-space indents and a final
newline, CSV through :mod:`csv` with ``newline=""``, the resolved config as ``config.json``
(and ``config.toml`` where a kind keeps one), checkpoints under ``checkpoints/``."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["CellLog", "RunFolder", "make_run_dir", "resume_in_folder", "to_toml"]


def make_run_dir(
    output_dir: str | Path, name: str, run_name: str | None = None, *, exist_ok: bool = False
) -> Path:
    """Create and return a run folder: ``output_dir/run_name`` when named, else a fresh
    ``output_dir/<name>-<UTC timestamp>`` (with ``-1``, ``-2``... if that exists)."""
    output_dir = Path(output_dir)
    if run_name is not None:
        run_dir = output_dir / run_name
        run_dir.mkdir(parents=True, exist_ok=True)
        return run_dir
    base = output_dir / f"{name}-{datetime.now(UTC).strftime('%Y%m%d-%H%M%S')}"
    run_dir, i = base, 1
    while run_dir.exists():
        run_dir, i = Path(f"{base}-{i}"), i + 1
    run_dir.mkdir(parents=True, exist_ok=exist_ok)
    return run_dir


@dataclass(frozen=True)
class RunFolder:
    """One run's folder and the files in it (``folder / "name"`` is a path inside it)."""

    path: Path

    @classmethod
    def create(cls, output_dir: str | Path, name: str, run_name: str | None = None, *,
               exist_ok: bool = False) -> RunFolder:
        """A new run folder (see :func:`make_run_dir`)."""
        return cls(make_run_dir(output_dir, name, run_name, exist_ok=exist_ok))

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    def write_json(self, name: str, data: Any) -> Path:
        path = self.path / name
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path

    def write_config(self, resolved: Mapping[str, Any], *, toml: bool = False) -> None:
        """The resolved config as ``config.json``; with ``toml`` also as ``config.toml``
        (a file ``dpdl run`` reads back)."""
        self.write_json("config.json", resolved)
        if toml:
            (self.path / "config.toml").write_text(to_toml(dict(resolved)))

    def write_csv(self, name: str, header: Sequence[str], rows: Iterable[Sequence]) -> Path:
        """A CSV of plain rows under ``header``."""
        path = self.path / name
        with path.open("w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(header)
            writer.writerows(rows)
        return path

    def write_records_csv(self, name: str, records: Sequence[Mapping[str, Any]],
                          fieldnames: Sequence[str] | None = None) -> Path:
        """A CSV of dict rows; the columns are ``fieldnames``, else the first row's keys."""
        path = self.path / name
        with path.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(fieldnames or records[0]))
            writer.writeheader()
            writer.writerows(records)
        return path

    def write_results(self, results: Mapping[str, Any]) -> Path:
        """``results.json``, with this process's provenance block unless it holds one."""
        from dpdl.training.provenance import PROVENANCE_KEY, provenance

        return self.write_json("results.json", {PROVENANCE_KEY: provenance()} | dict(results))

    @property
    def checkpoints(self) -> Path:
        """The folder of the run's checkpoints (not created here)."""
        return self.path / "checkpoints"

    def checkpoint(self, key: str) -> Path:
        """Where the checkpoint of the cell ``key`` is kept."""
        return self.checkpoints / f"{key}.pt"


def to_toml(data: dict[str, Any]) -> str:
    """A small TOML writer for the resolved config (tables of scalars, lists and dicts)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(f"cannot write {v!r} as TOML")

    top = [
        f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None
    ]
    lines = top + [""]
    for section, table in data.items():
        if isinstance(table, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {value(v)}" for k, v in table.items() if v is not None]
            lines.append("")
    return "\n".join(lines)


class CellLog:
    """The finished cells of a run folder, one JSON line each, appended as each finishes, so
    that an interrupted run resumes without training them again (the numpy kinds'
    ``dpdl run --resume``). Each line holds only what the run writes anyway (a validation
    score, a cell's result and curve). The first line is a digest of the run's settings: a
    log written for other settings is refused, never mixed in."""

    FILE = "cells.jsonl"

    def __init__(self, path: Path, settings: Mapping[str, Any]):
        from dpdl.algorithms.randomness import settings_digest

        self.path, self.done = Path(path), {}
        digest = settings_digest(settings)
        if not self.path.is_file():
            self.path.write_text(json.dumps({"settings_digest": digest}) + "\n")
            return
        lines = [json.loads(line) for line in self.path.read_text().splitlines()
                 if line.strip()]  # fmt: skip
        if not lines or lines[0].get("settings_digest") != digest:
            from dpdl.errors import DPDLError

            raise DPDLError(f"{self.path} was written for other settings than "
                            f"{self.path.parent / 'config.json'}: refusing to resume")
        self.done = {json.dumps(entry["key"]): entry["value"] for entry in lines[1:]}

    def get_or_run(self, key: Sequence, compute):
        """The logged value of ``key``, else ``compute()``, logged before it is returned."""
        name = json.dumps(list(key))
        if name not in self.done:
            self.done[name] = compute()
            with open(self.path, "a") as fh:
                fh.write(json.dumps({"key": list(key), "value": self.done[name]}) + "\n")
        return self.done[name]


def resume_in_folder(run_dir: str | Path, run_experiment, *, progress: bool = True) -> Any:
    """Continue the run folder ``run_dir`` of a kind that keeps a :class:`CellLog`: its
    ``run_experiment`` is called again with the saved ``config.json``, in the same folder."""
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not path.is_file():
        from dpdl.errors import DPDLError

        raise DPDLError(f"{run_dir} is not a dpdl run folder (no config.json)")
    return run_experiment(json.loads(path.read_text()), run_dir.parent, progress=progress,
                          run_name=run_dir.name, resume=True)
