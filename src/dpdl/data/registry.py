"""Data sets by name: the name -> loader table that ``load_dataset`` dispatches on.

It sits above the loaders (they import only :class:`~dpdl.data.dataset.Dataset`), so the
shipped sets are registered here, where the table is, with no import cycle.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dpdl.data.cifar10 import load_cifar10
from dpdl.data.csv_loader import load_csv_spec
from dpdl.data.dataset import Dataset
from dpdl.data.fashion_mnist import load_fashion_mnist
from dpdl.data.sklearn_sets import load_breast_cancer, load_diabetes, load_digits
from dpdl.errors import DPDLError

# name -> loader(data_dir, download, seed), in the order dataset_names() reports them
_LOADERS: dict[str, Callable[..., Dataset]] = {}


def register_loader(name: str, loader: Callable[..., Dataset]) -> None:
    _LOADERS[name] = loader


def dataset_names() -> tuple[str, ...]:
    return tuple(_LOADERS)


# The public benchmarks dpdl ships a loader for: a library-made partition of one of them is a
# function of public data and the public seed, so its per-node label histograms may be released.
_SHIPPED: dict[str, Callable[..., Dataset]] = {
    "digits": load_digits,
    "breast-cancer": load_breast_cancer,
    "diabetes": load_diabetes,
    "fashion-mnist": load_fashion_mnist,
    "cifar10": load_cifar10,
}
_ALIASES = {"fmnist": "fashion-mnist", "cifar-10": "cifar10"}
for _name, _loader in _SHIPPED.items():
    register_loader(_name, _loader)


def _key(name: str) -> str:
    key = name.strip().lower().replace("_", "-")
    return _ALIASES.get(key, key)


# The sets read from files anyone can replace: public only when what was read is the official
# content (SHA-256 of the decoded arrays, x_train, y_train, x_test, y_test in that order; for
# Fashion-MNIST that of the Debian package dataset-fashion-mnist, whose labels are the
# official 6000 / 1000 per class).  CIFAR-10 has none pinned: it is never taken for public.
FILE_BENCHMARKS = ("fashion-mnist", "cifar10")
OFFICIAL_CONTENT_SHA256 = {
    "fashion-mnist": "ca3ab2a37f845e1b8ae23cab1b51749a3011ba3bf1d9016176d75cbaabac376f",
}


def is_public_benchmark(name: str, dataset: Dataset | None = None) -> str | None:
    """The canonical name of ``name`` when it is a public benchmark loaded by dpdl's own
    loader (not a CSV file, not a loader a user registered, even under a shipped name) and,
    for a set read from files (:data:`FILE_BENCHMARKS`), when ``dataset`` holds the official
    content: a user's own files in that format are private data, whatever the name."""
    if not isinstance(name, str):
        return None
    key = _key(name)
    if key not in _SHIPPED or _LOADERS.get(key) is not _SHIPPED[key]:
        return None
    if key in FILE_BENCHMARKS:
        digest = None if dataset is None else dataset.info.get("content_sha256")
        if digest is None or digest != OFFICIAL_CONTENT_SHA256.get(key):
            return None
    return key


def load_dataset(
    name: str,
    *,
    data_dir: str | Path | None = None,
    download: bool = False,
    seed: int = 0,
) -> Dataset:
    """Load a data set by name: "digits", "fashion-mnist", "cifar10", "breast-cancer",
    "diabetes", or "csv:<path>[?option=value&...]" for a user CSV whose last column is the
    label (options: task, binarize, normalize_rows, test_fraction; see ``load_csv``), e.g.
    "csv:houses.csv?normalize_rows=true" for the OpenML 823 Housing set of MATH.md §6.

    ``seed`` fixes the train/test split of sets that ship without one (the scikit-learn sets,
    CSV files); ``data_dir`` and ``download`` matter for the sets read from disk.
    """
    if not isinstance(name, str):
        raise DPDLError(f"dataset name must be a string, got {name!r}")
    key = _key(name)
    if key.startswith("csv:"):
        return load_csv_spec(name.strip()[4:], seed=seed)
    if key not in _LOADERS:
        raise DPDLError(
            f"unknown dataset {name!r}; choose one of {', '.join(sorted(_LOADERS))} "
            "or 'csv:<path>'"
        )
    return _LOADERS[key](data_dir=data_dir, download=download, seed=seed)
