"""The in-memory data-set container shared by every loader.

It imports no loader: the loaders import it, and the name -> loader table that
``load_dataset`` dispatches on lives in :mod:`dpdl.data.registry`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
