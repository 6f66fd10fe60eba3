"""Run folders: where one run (``dpdl run``, a ``dpdl.train`` call with ``output_dir``, any
experiment kind) writes its settings, metrics, results and checkpoints."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

__all__ = ["make_run_dir"]


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
