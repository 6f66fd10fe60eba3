"""Generic CSV loader for user-supplied tables (e.g. the OpenML 823 Housing CSV of MATH.md §6):
numeric feature columns, the label in the last column."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from dpdl.data.dataset import Dataset
from dpdl.data.preprocessing import (
    PUBLIC_STATISTICS,
    l2_normalize_rows,
    seeded_split,
    standardize,
)
from dpdl.errors import DatasetNotFound, DPDLError

MAX_CLASSES_AUTO = 20


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_table(path: Path) -> tuple[list[str] | None, list[list[str]]]:
    with open(path, newline="") as handle:
        sample = handle.read(8192)
        handle.seek(0)
        try:
            dialect = csv.Sniffer().sniff(sample, delimiters=",;\t")
        except csv.Error:
            dialect = csv.excel
        rows = [[cell.strip() for cell in row] for row in csv.reader(handle, dialect)
                if row and any(cell.strip() for cell in row)]
    if not rows:
        raise DPDLError(f"CSV file {path} is empty")
    header = None
    if not all(_is_number(cell) for cell in rows[0][:-1]) or not rows[0][:-1]:
        header, rows = rows[0], rows[1:]
    if len(rows) < 2:
        raise DPDLError(f"CSV file {path} needs at least 2 data rows, found {len(rows)}")
    width = len(header) if header else len(rows[0])
    if width < 2:
        raise DPDLError(f"CSV file {path} needs at least one feature column and a label column")
    for line, row in enumerate(rows, start=2 if header else 1):
        if len(row) != width:
            raise DPDLError(f"CSV file {path}, line {line}: {len(row)} columns, expected {width}")
    return header, rows


def load_csv(
    path: str | Path,
    *,
    seed: int = 0,
    task: str | None = None,
    binarize: str | float | None = None,
    test_fraction: float = 0.2,
    normalize_rows: bool = False,
    name: str | None = None,
) -> Dataset:
    """Load a CSV (header optional, ``,`` ``;`` or tab separated) whose last column is the label.

    Features are standardised with the public test split's statistics (seeded split,
    stratified for classification); ``normalize_rows=True`` then scales each row to unit
    norm (MATH.md §6).
    ``binarize`` turns a numeric label into classes {0, 1}: ``"median"`` thresholds at the
    test split's median (label > median -> 1), a number thresholds there. ``task`` defaults to
    classification when the label is non-numeric or has at most 20 distinct integer values,
    otherwise regression. Non-numeric labels are mapped to 0..K-1 in sorted order.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFound(f"CSV file {path} not found")
    header, rows = _read_table(path)
    table = np.array(rows, dtype=object)
    feature_cells, label_cells = table[:, :-1], table[:, -1]
    try:
        features = feature_cells.astype(np.float64)
    except ValueError:
        bad_row, bad_col = next(
            (r, c) for r in range(feature_cells.shape[0]) for c in range(feature_cells.shape[1])
            if not _is_number(feature_cells[r, c])
        )
        column = header[bad_col] if header else f"column {bad_col + 1}"
        raise DPDLError(
            f"CSV file {path}: non-numeric feature {feature_cells[bad_row, bad_col]!r} in "
            f"{column}, data row {bad_row + 1}"
        ) from None
    if not np.all(np.isfinite(features)):
        raise DPDLError(f"CSV file {path}: features contain NaN or infinite values")

    numeric_label = all(_is_number(v) for v in label_cells)
    label_values = label_cells.astype(np.float64) if numeric_label else None
    if binarize is not None:
        if label_values is None:
            raise DPDLError(f"CSV file {path}: binarize={binarize!r} needs a numeric label")
        if task not in (None, "classification"):
            raise DPDLError(f"binarize={binarize!r} makes a classification task, not {task!r}")
        task = "classification"
    if task is None:
        integral = label_values is not None and np.all(label_values == np.round(label_values))
        few = len(np.unique(label_cells)) <= MAX_CLASSES_AUTO
        task = "classification" if (label_values is None or (integral and few)) else "regression"
    if task not in ("classification", "regression"):
        raise DPDLError(f"task must be 'classification' or 'regression', got {task!r}")
    if task == "regression" and label_values is None:
        raise DPDLError(f"CSV file {path}: a regression task needs a numeric label column")

    class_names = None
    if task == "classification" and binarize is None:
        keys = label_values if label_values is not None else label_cells.astype(str)
        class_names, labels = np.unique(keys, return_inverse=True)
        labels = labels.astype(np.int64)
        stratify = labels
    else:
        labels, stratify = label_values, None
    train_idx, test_idx = seeded_split(len(rows), test_fraction, seed, stratify=stratify)

    info: dict = {"source": str(path), "split_seed": int(seed), "test_fraction": test_fraction,
                  "preprocessing": f"features standardised with {PUBLIC_STATISTICS}"
                  + (", rows L2-normalised" if normalize_rows else "")}
    if binarize is not None:
        if binarize == "median":
            threshold = float(np.median(label_values[test_idx]))  # the public split's
        elif isinstance(binarize, int | float) and not isinstance(binarize, bool):
            threshold = float(binarize)
        else:
            raise DPDLError(f"binarize must be 'median' or a number, got {binarize!r}")
        labels = (label_values > threshold).astype(np.int64)
        info["binarize_threshold"] = threshold
        num_classes = 2
        if len(np.unique(labels[train_idx])) < 2:
            raise DPDLError(f"binarize={binarize!r} leaves a single class in the training set")
    elif task == "classification":
        num_classes = max(2, len(class_names))
        info["classes"] = [str(c) for c in class_names]
    else:
        num_classes = None
        labels = labels.astype(np.float32)

    x_train, x_test, _, _ = standardize(features[train_idx], features[test_idx], axis=0)
    if normalize_rows:
        x_train, x_test = l2_normalize_rows(x_train), l2_normalize_rows(x_test)
    if header:
        info["features"] = header[:-1]
    return Dataset(
        name=name or path.stem, task=task,
        x_train=x_train, y_train=labels[train_idx], x_test=x_test, y_test=labels[test_idx],
        num_classes=num_classes, input_shape=(features.shape[1],), info=info,
    )


def load_csv_spec(spec: str, *, seed: int = 0) -> Dataset:
    """``load_csv`` from a "<path>[?key=value&...]" string (what follows "csv:" in a data-set
    name), so a config file can name a CSV and its options in one string."""
    path, _, query = spec.partition("?")
    options: dict = {}
    for item in filter(None, query.split("&")):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep:
            raise DPDLError(f"CSV option {item!r} must look like key=value")
        if key == "normalize_rows":
            if value.lower() not in ("1", "0", "true", "false", "yes", "no"):
                raise DPDLError(f"normalize_rows must be true or false, got {value!r}")
            options[key] = value.lower() in ("1", "true", "yes")
        elif key == "binarize":
            options[key] = value if value == "median" else _number(key, value)
        elif key == "test_fraction":
            options[key] = _number(key, value)
        elif key == "task":
            options[key] = value
        else:
            raise DPDLError(
                f"unknown CSV option {key!r}; use task, binarize, normalize_rows, test_fraction"
            )
    return load_csv(path, seed=seed, **options)


def _number(key: str, value: str) -> float:
    if not _is_number(value):
        raise DPDLError(f"CSV option {key} must be a number, got {value!r}")
    return float(value)
