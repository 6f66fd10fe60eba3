"""CIFAR-10 (Krizhevsky 2009) from the official python-pickle batches."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import numpy as np

from dpdl.data.dataset import Dataset
from dpdl.data.download import download_file, file_md5, safe_extract_tar
from dpdl.data.preprocessing import (
    PUBLIC_STATISTICS,
    histogram_mean_std,
    standardize_uint8_images,
)
from dpdl.errors import DatasetNotFound, DPDLError

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
TARBALL = "cifar-10-python.tar.gz"
MD5 = "c58f30108f718f92721af3b95e74349a"
NUM_CLASSES, CHANNELS, SIDE = 10, 3, 32
RECORD_BYTES = CHANNELS * SIDE * SIDE
HOW_TO_GET = (
    f"Set download = true under [data] in the config (download=True in Python) to fetch {URL} "
    f"(md5 {MD5}), or "
    f"download and extract that tarball yourself and pass the folder holding {FOLDER}/ with "
    "data_dir = \"FOLDER\" under [data] (data_dir=... in Python), or set $DPDL_DATA=FOLDER."
)

# The batches only reference numpy's array reconstruction; anything else is refused, so a
# malicious pickle cannot run code.
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"),
    ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
}


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")
        return super().find_class(module, name)


def read_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickle batch -> (uint8 images (N, 3, 32, 32), int64 labels (N,)), validated."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            batch = _RestrictedUnpickler(handle, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise DPDLError(f"cannot read CIFAR-10 batch {path}: {exc}") from exc
    if not isinstance(batch, dict):
        raise DPDLError(f"CIFAR-10 batch {path} is not a dict but {type(batch).__name__}")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise DPDLError(f"CIFAR-10 batch {path} lacks the b'data' or b'labels' entry")
    data = np.asarray(data)
    labels = np.asarray(labels, dtype=np.int64)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != RECORD_BYTES:
        raise DPDLError(
            f"CIFAR-10 batch {path}: b'data' must be uint8 of shape (N, {RECORD_BYTES}), "
            f"got {data.dtype} {data.shape}"
        )
    if labels.shape != (data.shape[0],):
        raise DPDLError(
            f"CIFAR-10 batch {path}: {data.shape[0]} images but labels of shape {labels.shape}"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise DPDLError(f"CIFAR-10 batch {path}: labels outside 0..9")
    # Row layout: 1024 red, 1024 green, 1024 blue values, each a row-major 32x32 plane.
    return data.reshape(-1, CHANNELS, SIDE, SIDE), labels


def candidate_dirs(data_dir: str | Path | None) -> list[Path]:
    """Folders searched for the batches: an explicit data_dir only (never silently replaced by
    another copy), else $DPDL_DATA; each also with cifar-10-batches-py/ appended."""
    roots: list[Path] = []
    env = os.environ.get("DPDL_DATA")
    if data_dir is not None:
        roots.append(Path(data_dir))
    elif env:
        roots.append(Path(env))
    return [d for root in roots for d in (root, root / FOLDER)]


def _has_batches(folder: Path) -> bool:
    return all((folder / name).is_file() for name in (*TRAIN_BATCHES, TEST_BATCH))


def download_cifar10(root: str | Path, *, url: str | None = None, md5: str | None = None) -> Path:
    """Fetch and verify the official tarball (``URL``, ``MD5`` unless given) into ``root`` and
    extract it there safely; returns the batch folder."""
    url, md5 = url or URL, md5 or MD5
    root = Path(root)
    archive = root / TARBALL
    if not (archive.is_file() and file_md5(archive) == md5):
        download_file(url, archive, md5)
    safe_extract_tar(archive, root, allowed_prefix=FOLDER)
    if not _has_batches(root / FOLDER):
        raise DPDLError(f"{archive} did not contain the expected CIFAR-10 batches")
    return root / FOLDER


def find_cifar10(data_dir: str | Path | None = None, download: bool = False) -> Path:
    searched = candidate_dirs(data_dir)
    for folder in searched:
        if _has_batches(folder):
            return folder
    if download:
        root = searched[0] if searched else Path.home() / ".cache" / "dpdl"
        return download_cifar10(root)
    where = ", ".join(str(d) for d in searched) or "no folder given"
    raise DatasetNotFound(f"CIFAR-10 batches not found (searched: {where}). {HOW_TO_GET}")


def load_cifar10(
    *, data_dir: str | Path | None = None, download: bool = False, seed: int = 0
) -> Dataset:
    """CIFAR-10 as (N, 3, 32, 32) float32, 50 000 train / 10 000 test, 10 classes.

    Pixels are scaled to [0, 1] and standardised per channel with the public test split's
    channel means and stds (exact values in ``info``; the training records are private).
    With ``download=True`` and no local copy, the official tarball is fetched into
    ``data_dir`` (else $DPDL_DATA, else ~/.cache/dpdl) and verified by md5. ``seed`` is unused.
    """
    folder = find_cifar10(data_dir, download)
    train = [read_batch(folder / name) for name in TRAIN_BATCHES]
    x_train_raw = np.concatenate([images for images, _ in train])
    y_train = np.concatenate([labels for _, labels in train])
    x_test_raw, y_test = read_batch(folder / TEST_BATCH)

    stats = [histogram_mean_std(x_test_raw[:, c]) for c in range(CHANNELS)]  # public split
    means = np.array([m for m, _ in stats])
    stds = np.array([s for _, s in stats])

    return Dataset(
        name="cifar10", task="classification",
        x_train=standardize_uint8_images(x_train_raw, means, stds), y_train=y_train,
        x_test=standardize_uint8_images(x_test_raw, means, stds), y_test=y_test,
        num_classes=NUM_CLASSES, input_shape=(CHANNELS, SIDE, SIDE),
        info={"preprocessing": f"pixels/255 then per-channel (x - mean)/std, {PUBLIC_STATISTICS}",
              "mean": means.tolist(), "std": stds.tolist(), "source": str(folder)},
    )
