"""Fetching and safely unpacking an archive (used for CIFAR-10's official tarball)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from pathlib import Path, PurePosixPath

from dpdl.errors import DatasetNotFound, DPDLError

CHUNK = 1 << 20


def file_md5(path: str | Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def download_file(url: str, destination: Path, md5: str, *, timeout: float = 60.0) -> Path:
    """Download ``url`` to ``destination`` (via a temporary file in the same folder, renamed
    only once its md5 matches), so an interrupted or tampered download never looks valid."""
    destination.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=destination.parent, suffix=".part")
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as response:
                    shutil.copyfileobj(response, out, CHUNK)
            except (urllib.error.URLError, OSError) as exc:
                raise DatasetNotFound(
                    f"could not download {url}: {exc}. If this machine is offline, fetch the "
                    f"file elsewhere and put it at {destination}"
                ) from exc
        actual = file_md5(temp_name)
        if actual != md5:
            raise DPDLError(
                f"download of {url} has md5 {actual}, expected {md5}; refusing to use it"
            )
        os.replace(temp_name, destination)
    finally:
        if os.path.exists(temp_name):
            os.unlink(temp_name)
    return destination


def safe_extract_tar(archive: Path, target: Path, *, allowed_prefix: str) -> None:
    """Extract only regular files and folders under ``allowed_prefix``; any absolute path,
    '..' component, link or device in the archive aborts the extraction before anything
    is written."""
    with tarfile.open(archive, "r:*") as tar:
        members = tar.getmembers()
        for member in members:
            parts = PurePosixPath(member.name).parts
            if (member.name.startswith(("/", "\\")) or ".." in parts
                    or not (member.isfile() or member.isdir())
                    or not parts or parts[0] != allowed_prefix):
                raise DPDLError(
                    f"refusing to extract {archive}: unsafe or unexpected member {member.name!r}"
                )
        # The "data" filter re-checks paths and strips permissions/ownership (PEP 706).
        tar.extractall(target, members=members, filter="data")
