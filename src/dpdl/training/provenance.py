"""Where a result came from: the ``provenance`` block of every results.json, sweep.json and
tune.json, and its lines in the reports.

A seeded run reproduces bit for bit only on the same code, the same library versions and the
same CPU instruction set (torch picks its kernels by :func:`torch.backends.cpu.
get_cpu_capability`; another machine's float rounding moves the last bits, RESULTS.md). So the
block records exactly those: the git commit of the dpdl source (and whether its tracked files
differed from it), the versions of dpdl, torch, numpy and dp_accounting, the command line, the
CPU capability (and any variable set to force other kernels) and the device.  Outside a git
checkout (an installed wheel) the commit is None, never an error.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

__all__ = ["PROVENANCE_KEY", "provenance", "provenance_lines"]

PROVENANCE_KEY = "provenance"
_PACKAGES = ("dpdl", "torch", "numpy", "dp-accounting")
# Variables that move the CPU kernels off the machine's own: torch's capability shows the
# first, but MKL's instruction set (the matrix products) changes the numbers too and torch
# does not report it (benchmarks/float_drift.py measured both; RESULTS.md).
KERNEL_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "MKL_CBWR",
                    "ONEDNN_MAX_CPU_ISA")  # fmt: skip


def _git(args: list[str], where: Path) -> str | None:
    """``git args`` run in ``where``; None when git is missing, fails or takes too long."""
    try:
        done = subprocess.run(["git", *args], cwd=where, capture_output=True, text=True,
                              timeout=10, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=1)
def _source_commit() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout the imported dpdl comes from; (None, None) outside one.

    Dirty means a tracked file differs from the commit; untracked files (run folders, notes)
    do not change what the code computes, so they do not count."""
    import dpdl

    where = Path(dpdl.__file__).resolve().parent
    commit = _git(["rev-parse", "HEAD"], where)
    if commit is None:
        return None, None
    status = _git(["status", "--porcelain", "--untracked-files=no"], where)
    return commit, None if status is None else bool(status)


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def provenance(device: Any = None) -> dict[str, Any]:
    """The provenance block: JSON-friendly, the same keys everywhere.

    ``device`` the device the run used (a ``torch.device`` or its name); None records "cpu"
    unless stated otherwise by the caller's config."""
    import torch

    commit, dirty = _source_commit()
    return {
        "git_commit": commit,
        "git_dirty": dirty,
        "versions": {name.replace("-", "_"): _version(name) for name in _PACKAGES},
        "python": platform.python_version(),
        "command": list(sys.argv),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "kernel_env": {name: os.environ[name] for name in KERNEL_VARIABLES if name in os.environ},
        "machine": platform.machine(),
        "device": str(device) if device is not None else "cpu",
        "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }


def provenance_lines(block: dict[str, Any] | None) -> list[str]:
    """The block as report lines ("key: value"); a result written before dpdl recorded its
    provenance says so instead of inventing one."""
    if not block:
        return ["provenance: not recorded (written by a dpdl before provenance was kept)"]
    commit = block.get("git_commit") or "not a git checkout"
    if block.get("git_dirty"):
        commit += " (tracked files modified)"
    versions = ", ".join(f"{k} {v}" for k, v in (block.get("versions") or {}).items())
    device = block.get("device")
    forced = ", ".join(f"{k}={v}" for k, v in (block.get("kernel_env") or {}).items())
    if block.get("cuda_device"):
        device = f"{device} ({block['cuda_device']})"
    return [
        f"commit: {commit}",
        f"versions: {versions}, python {block.get('python')}",
        f"command: {' '.join(block.get('command') or [])}",
        f"machine: {block.get('machine')}, CPU capability {block.get('cpu_capability')}, "
        f"device {device}" + (f", kernels forced by {forced}" if forced else ""),
    ]
