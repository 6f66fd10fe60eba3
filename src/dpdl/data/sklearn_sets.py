"""Small real data sets shipped inside scikit-learn (no download): digits, breast cancer,
diabetes. Each gets a deterministic seeded 80/20 split; preprocessing uses statistics of the
public test split only (``dpdl.data.preprocessing``)."""

from __future__ import annotations

import numpy as np

from dpdl.data.dataset import Dataset
from dpdl.data.preprocessing import (
    PUBLIC_STATISTICS,
    l2_normalize_rows,
    seeded_split,
    standardize,
)

TEST_FRACTION = 0.2


def load_digits(*, data_dir=None, download: bool = False, seed: int = 0) -> Dataset:
    """8x8 hand-written digits (1797 images, 10 classes) as (N, 1, 8, 8).

    Pixels (0..16) are scaled to [0, 1], then standardised with the scalar mean/std of the
    public test split, the same recipe as Fashion-MNIST so the CNN sees comparable inputs.
    """
    from sklearn.datasets import load_digits as sk_load_digits

    bunch = sk_load_digits()
    images = (bunch.images.astype(np.float64) / 16.0)[:, None, :, :]
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = seeded_split(len(labels), TEST_FRACTION, seed, stratify=labels)
    x_train, x_test, mean, std = standardize(images[train_idx], images[test_idx], axis=None)
    return Dataset(
        name="digits", task="classification",
        x_train=x_train, y_train=labels[train_idx], x_test=x_test, y_test=labels[test_idx],
        num_classes=10, input_shape=(1, 8, 8),
        info={"preprocessing": f"pixels/16 then (x - mean)/std with {PUBLIC_STATISTICS}",
              "mean": float(mean), "std": float(std), "split_seed": int(seed),
              "test_fraction": TEST_FRACTION},
    )


def load_breast_cancer(*, data_dir=None, download: bool = False, seed: int = 0) -> Dataset:
    """Wisconsin breast cancer (569 records, 30 features, binary) as (N, 30).

    MATH.md §6 preprocessing: standardise every feature (public test-split statistics), then scale
    each row to unit L2 norm so the logistic loss is 1-Lipschitz.
    """
    from sklearn.datasets import load_breast_cancer as sk_load

    bunch = sk_load()
    features = bunch.data.astype(np.float64)
    labels = bunch.target.astype(np.int64)
    train_idx, test_idx = seeded_split(len(labels), TEST_FRACTION, seed, stratify=labels)
    x_train, x_test, _, _ = standardize(features[train_idx], features[test_idx], axis=0)
    return Dataset(
        name="breast-cancer", task="classification",
        x_train=l2_normalize_rows(x_train), y_train=labels[train_idx],
        x_test=l2_normalize_rows(x_test), y_test=labels[test_idx],
        num_classes=2, input_shape=(features.shape[1],),
        info={"preprocessing": f"per-feature standardisation ({PUBLIC_STATISTICS}), "
                               "then each row L2-normalised (MATH.md §6)",
              "split_seed": int(seed), "test_fraction": TEST_FRACTION},
    )


def load_diabetes(*, data_dir=None, download: bool = False, seed: int = 0) -> Dataset:
    """Diabetes progression (442 records, 10 features, regression) as (N, 10).

    Features are standardised with the public test split's statistics, and so is the target
    (its mean and std are in ``info`` to convert predictions back to disease-progression units).
    """
    from sklearn.datasets import load_diabetes as sk_load

    bunch = sk_load(scaled=False)
    features = bunch.data.astype(np.float64)
    target = bunch.target.astype(np.float64)
    train_idx, test_idx = seeded_split(len(target), TEST_FRACTION, seed)
    x_train, x_test, _, _ = standardize(features[train_idx], features[test_idx], axis=0)
    y_train, y_test, y_mean, y_std = standardize(target[train_idx], target[test_idx], axis=0)
    return Dataset(
        name="diabetes", task="regression",
        x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
        num_classes=None, input_shape=(features.shape[1],),
        info={"preprocessing": f"features and target standardised with {PUBLIC_STATISTICS}",
              "target_mean": float(y_mean), "target_std": float(y_std),
              "split_seed": int(seed), "test_fraction": TEST_FRACTION},
    )
