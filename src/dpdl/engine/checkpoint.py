"""Checkpoints of a training run: everything needed to continue exactly where it stopped.

A checkpoint holds the hosted nodes' models x_i, push-sum weights w_i and (with momentum)
momentum buffers m_i, their secret stream states (so the resumed run draws the very numbers it
would have drawn), a SHA-256 fingerprint of every hosted node's data (a resume on changed data
is refused: it would re-send the same noise on other records), the iteration, the privacy
ledger (steps spent are never forgotten), the metrics rows written so far and the run's
settings digest.  Files are written atomically (a temporary file created exclusively, then
``os.replace``): a crash while saving leaves the previous checkpoint intact.

The simulator writes one file.  In the distributed runtime every process writes its own,
:func:`process_path` (``run.rank<R>.pt`` beside ``run.pt``), with its own nodes only: no rank
ever receives another rank's models, secrets or fingerprints, and a process resumes from its
own file, on its own machine (no shared file system needed).  Stream states are the secret
that protects the data (they replay every node's batches and noise): checkpoint files are
created owner-only (0600); treat them like the model and the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dpdl.errors import DPDLError
from dpdl.files import write_atomic

CHECKPOINT_VERSION = 3  # 3: one file per process, with its own nodes only


def _rank() -> int | None:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def process_path(path: Path) -> Path:
    """This process's checkpoint file for ``path``: ``path`` itself in a single process,
    ``<stem>.rank<R><suffix>`` beside it for rank R of the distributed runtime."""
    path, rank = Path(path), _rank()
    return path if rank is None else path.with_name(f"{path.stem}.rank{rank}{path.suffix}")


def load_for_resume(path: Path) -> dict[str, Any]:
    """This process's checkpoint of ``path``."""
    return load(process_path(path))


def remove(path: Path) -> None:
    """Delete this process's checkpoint of a finished cell."""
    process_path(path).unlink(missing_ok=True)


def check_fingerprints(saved: list[str] | None, current: list[bytes], first_node: int) -> None:
    """Refuse to resume on data other than the checkpoint's: the resumed steps would re-send
    the noise already sent, on other records, and release the difference without noise."""
    if saved is None or len(saved) != len(current):
        raise DPDLError("checkpoint holds no fingerprint of this process's nodes' data: "
                        "refusing to resume")  # fmt: skip
    for offset, (was, now) in enumerate(zip(saved, current, strict=True)):
        if was != now.hex():
            raise DPDLError(
                f"node {first_node + offset}'s data differ from the checkpoint's (SHA-256): "
                "refusing to resume, which would re-send its noise on other data"
            )


def save_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically, readable and writable by its owner only."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, lambda fh: torch.save({"version": CHECKPOINT_VERSION, **payload}, fh))


def load(path: Path) -> dict[str, Any]:
    try:
        payload = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as err:
        raise DPDLError(f"checkpoint {str(path)!r} does not exist") from err
    except Exception as err:  # a truncated or foreign file: refuse it, never guess
        raise DPDLError(f"checkpoint {str(path)!r} cannot be read: {err}") from err
    if not isinstance(payload, dict) or payload.get("version") != CHECKPOINT_VERSION:
        raise DPDLError(f"checkpoint {str(path)!r} has an unsupported format")
    return payload
