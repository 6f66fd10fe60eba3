"""The in-memory data-set container shared by every loader, and the name -> loader registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpdl.errors import DPDLError

TASKS = ("classification", "regression")


@dataclass
class Dataset:
    """A train/test split held as numpy arrays.

    ``x_*`` are float32 of shape ``(N, *input_shape)``. ``y_*`` are int64 class indices for
    classification and float32 targets for regression. ``info`` records the preprocessing
    (e.g. the standardisation statistics) so results can be reproduced and reported.
    """

    name: str
    task: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int | None
    input_shape: tuple[int, ...]
    info: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise DPDLError(f"dataset task must be one of {TASKS}, got {self.task!r}")
        for split in ("train", "test"):
            x = getattr(self, f"x_{split}")
            y = getattr(self, f"y_{split}")
            if x.shape[0] != y.shape[0]:
                raise DPDLError(
                    f"dataset {self.name!r}: x_{split} has {x.shape[0]} records but y_{split} "
                    f"has {y.shape[0]}"
                )
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise DPDLError(
                    f"dataset {self.name!r}: x_{split} has record shape {tuple(x.shape[1:])}, "
                    f"expected input_shape {tuple(self.input_shape)}"
                )
        if self.task == "classification" and (self.num_classes is None or self.num_classes < 2):
            raise DPDLError(
                f"dataset {self.name!r}: a classification set needs num_classes >= 2, "
                f"got {self.num_classes!r}"
            )

    @property
    def num_train(self) -> int:
        return int(self.x_train.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.x_test.shape[0])

    def summary(self) -> dict:
        """A JSON-friendly description (sizes, shapes, preprocessing), without the arrays."""
        return {
            "name": self.name,
            "task": self.task,
            "num_train": self.num_train,
            "num_test": self.num_test,
            "num_classes": self.num_classes,
            "input_shape": list(self.input_shape),
            **{k: v for k, v in self.info.items() if _is_jsonable(v)},
        }


def _is_jsonable(value) -> bool:
    return isinstance(value, str | int | float | bool | list | tuple | dict) or value is None


# name -> loader(data_dir, download, seed). Filled in by dpdl.data.__init__ to avoid
# import cycles between the loader modules and this registry.
_LOADERS: dict[str, Callable[..., Dataset]] = {}


def register_loader(name: str, loader: Callable[..., Dataset]) -> None:
    _LOADERS[name] = loader


def dataset_names() -> tuple[str, ...]:
    return tuple(_LOADERS)


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
    "csv:houses.csv?normalize_rows=true" for the OpenML 823 Housing set of SPEC §6.

    ``seed`` fixes the train/test split of sets that ship without one (the scikit-learn sets,
    CSV files); ``data_dir`` and ``download`` matter for the sets read from disk.
    """
    if not isinstance(name, str):
        raise DPDLError(f"dataset name must be a string, got {name!r}")
    key = name.strip().lower().replace("_", "-")
    if key.startswith("csv:"):
        from dpdl.data.csv_loader import load_csv_spec

        return load_csv_spec(name.strip()[4:], seed=seed)
    aliases = {"fmnist": "fashion-mnist", "cifar-10": "cifar10"}
    key = aliases.get(key, key)
    if key not in _LOADERS:
        raise DPDLError(
            f"unknown dataset {name!r}; choose one of {', '.join(sorted(_LOADERS))} "
            "or 'csv:<path>'"
        )
    return _LOADERS[key](data_dir=data_dir, download=download, seed=seed)
