"""Fashion-MNIST (Xiao et al. 2017) from its four IDX files, gzipped or not."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from dpdl.data.dataset import Dataset
from dpdl.data.idx import read_idx
from dpdl.data.preprocessing import (
    PUBLIC_STATISTICS,
    histogram_mean_std,
    standardize_uint8_images,
)
from dpdl.errors import DatasetNotFound, DPDLError

SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}
NUM_TRAIN, NUM_TEST, IMAGE_SIDE, NUM_CLASSES = 60_000, 10_000, 28, 10
HOW_TO_GET = (
    "On Debian/Ubuntu: `apt-get install dataset-fashion-mnist` (installs into "
    f"{SYSTEM_DIR}). Otherwise download the four files train-images-idx3-ubyte.gz, "
    "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz from "
    "the Zalando repository https://github.com/zalandoresearch/fashion-mnist (folder data/fashion) "
    "into one folder and name it in the config (data_dir = \"FOLDER\" under [data]), or set "
    "$DPDL_DATA=FOLDER."
)


def candidate_dirs(data_dir: str | Path | None) -> list[Path]:
    """Folders searched: an explicit data_dir (and data_dir/fashion-mnist) only -- a folder the
    user named is never silently replaced by another copy; otherwise $DPDL_DATA,
    $DPDL_DATA/fashion-mnist, then the Debian package's folder."""
    if data_dir is not None:
        return [Path(data_dir), Path(data_dir) / "fashion-mnist"]
    dirs: list[Path] = []
    env = os.environ.get("DPDL_DATA")
    if env:
        dirs += [Path(env), Path(env) / "fashion-mnist"]
    dirs.append(SYSTEM_DIR)
    return dirs


def _find_file(folder: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem, stem.replace("-idx", ".idx")):
        if (folder / name).is_file():
            return folder / name
    return None


def find_fashion_mnist(data_dir: str | Path | None = None) -> dict[str, Path]:
    """Paths of the four IDX files in the first folder holding all of them."""
    searched = candidate_dirs(data_dir)
    for folder in searched:
        found = {key: _find_file(folder, stem) for key, stem in FILES.items()}
        if all(found.values()):
            return found  # type: ignore[return-value]
    raise DatasetNotFound(
        "Fashion-MNIST IDX files not found (searched: "
        + ", ".join(str(d) for d in searched) + "). " + HOW_TO_GET
    )


def load_fashion_mnist(
    *, data_dir: str | Path | None = None, download: bool = False, seed: int = 0
) -> Dataset:
    """Fashion-MNIST as (N, 1, 28, 28) float32, 60 000 train / 10 000 test, 10 classes.

    Pixels are scaled to [0, 1] and then standardised with the scalar mean and std of the
    public *test* images (about 0.2868 and 0.3524; the exact values are in ``info``; the
    training images are the nodes' private records). ``seed``
    is unused: the data set ships with its own train/test split. There is no download:
    the files must be present (see the DatasetNotFound message).
    """
    try:
        paths = find_fashion_mnist(data_dir)
    except DatasetNotFound as exc:
        if download:
            raise DatasetNotFound(
                f"{exc} (download=True is not available for Fashion-MNIST: the mirrors' files "
                "have no checksum we could verify)"
            ) from None
        raise
    images = {k: read_idx(paths[k], expected_ndim=3) for k in ("x_train", "x_test")}
    labels = {k: read_idx(paths[k], expected_ndim=1) for k in ("y_train", "y_test")}
    for split in ("train", "test"):
        x, y = images[f"x_{split}"], labels[f"y_{split}"]
        if x.shape[1:] != (IMAGE_SIDE, IMAGE_SIDE) or x.dtype != np.uint8:
            raise DPDLError(
                f"{paths['x_' + split]}: expected uint8 images of shape (N, 28, 28), "
                f"got {x.dtype} {x.shape}"
            )
        if len(x) != len(y):
            raise DPDLError(
                f"Fashion-MNIST {split}: {len(x)} images but {len(y)} labels "
                f"({paths['x_' + split]}, {paths['y_' + split]})"
            )
        if y.size and (y.min() < 0 or y.max() >= NUM_CLASSES):
            raise DPDLError(f"{paths['y_' + split]}: labels outside 0..9")

    mean, std = histogram_mean_std(images["x_test"])  # public statistics (preprocessing.py)
    content = hashlib.sha256()
    for key in ("x_train", "y_train", "x_test", "y_test"):
        content.update((images if key[0] == "x" else labels)[key].tobytes())

    def to_float(x: np.ndarray) -> np.ndarray:
        return standardize_uint8_images(x[:, None, :, :], mean, std)

    return Dataset(
        name="fashion-mnist", task="classification",
        x_train=to_float(images["x_train"]), y_train=labels["y_train"].astype(np.int64),
        x_test=to_float(images["x_test"]), y_test=labels["y_test"].astype(np.int64),
        num_classes=NUM_CLASSES, input_shape=(1, IMAGE_SIDE, IMAGE_SIDE),
        info={"preprocessing": f"pixels/255 then (x - mean)/std with {PUBLIC_STATISTICS}",
              "mean": mean, "std": std, "source": str(paths["x_train"].parent),
              "content_sha256": content.hexdigest()},
    )
