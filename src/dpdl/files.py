"""Files written safely, and figures saved with one-line errors (no torch here: the sweep
driver imports this)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from dpdl.errors import DPDLError


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


def png_path(path) -> Path:
    """``path`` as a Path, refused in one line unless it names a PNG file."""
    path = Path(path)
    if path.suffix.lower() != ".png":
        raise DPDLError(f"the drawing is a PNG file; got {str(path)!r}")
    return path


def save_png(figure, path: Path, dpi: int) -> Path:
    """Save a matplotlib ``figure`` to ``path`` (its folder made), a one-line error if not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=dpi)
    except OSError as err:
        raise DPDLError(f"cannot write {str(path)!r}: {err.strerror or err}") from None
    return path
