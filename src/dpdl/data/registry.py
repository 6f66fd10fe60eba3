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


def is_public_benchmark(name: str) -> str | None:
    """The canonical name of ``name`` when it is a public benchmark loaded by dpdl's own
    loader (not a CSV file, not a loader a user registered, even under a shipped name)."""
    if not isinstance(name, str):
        return None
    key = _key(name)
    return key if key in _SHIPPED and _LOADERS.get(key) is _SHIPPED[key] else None


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
