"""Files written safely (no torch here: the sweep driver imports this)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def write_atomic(path: Path, write: Callable[[BinaryIO], object], *, mode: int = 0o600) -> None:
    """Write ``path`` atomically: ``write(binary file)`` fills a temporary file created
    exclusively under a fresh random name beside it (``mkstemp``: O_CREAT | O_EXCL, so never a
    planted file or link), which is then renamed over ``path`` with permissions ``mode``."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
