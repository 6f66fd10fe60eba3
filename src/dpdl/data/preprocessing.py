"""Standardisation shared by the loaders, with statistics of the public split only.

The training records are private (each node's data); a mean or std computed over them, pooled,
would be a noise-free function of every node's records applied to every record (and, in a
real deployment, nobody could even compute it).  The loaders therefore standardise with the
statistics of the *test split*, which the threat model declares public evaluation data
(docs/THREAT_MODEL.md), and say so in ``Dataset.info``.
"""

from __future__ import annotations

import numpy as np

from dpdl.errors import DPDLError

PUBLIC_STATISTICS = "statistics of the public test split"


def standardize(
    x_train: np.ndarray, x_test: np.ndarray, axis: int | tuple[int, ...] | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Subtract the mean and divide by the std of the public ``x_test``, reduced over ``axis``,
    from both splits (never a statistic of the private ``x_train``).

    Constant features (std 0) are only centred, so they become 0 instead of NaN.
    Returns float32 ``(x_train, x_test, mean, std)``.
    """
    x_public = np.asarray(x_test, dtype=np.float64)
    mean = x_public.mean(axis=axis, keepdims=True)
    std = x_public.std(axis=axis, keepdims=True)
    std = np.where(std > 0, std, 1.0)
    x_train_std = ((np.asarray(x_train, dtype=np.float64) - mean) / std).astype(np.float32)
    x_test_std = ((x_public - mean) / std).astype(np.float32)
    return x_train_std, x_test_std, mean.squeeze(), std.squeeze()


def l2_normalize_rows(x: np.ndarray) -> np.ndarray:
    """Scale each record to unit L2 norm (all-zero records stay zero), MATH.md §6 preprocessing:
    with ||x|| <= 1 the logistic loss is 1-Lipschitz in the weights."""
    flat = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    norms = np.linalg.norm(flat, axis=1, keepdims=True)
    flat = flat / np.where(norms > 0, norms, 1.0)
    return flat.reshape(np.shape(x)).astype(np.float32)


def seeded_split(
    n_records: int, test_fraction: float, seed: int, stratify: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays (train, test) of a deterministic, optionally stratified, shuffled split."""
    if not 0.0 < test_fraction < 1.0:
        raise DPDLError(f"test_fraction must lie in (0, 1), got {test_fraction!r}")
    from sklearn.model_selection import train_test_split

    indices = np.arange(n_records)
    try:
        train_idx, test_idx = train_test_split(
            indices, test_size=test_fraction, random_state=int(seed), shuffle=True,
            stratify=stratify,
        )
    except ValueError as exc:  # e.g. a class with a single record cannot be stratified
        raise DPDLError(f"cannot split {n_records} records (test_fraction={test_fraction}): "
                        f"{exc}") from exc
    return np.sort(train_idx), np.sort(test_idx)


def histogram_mean_std(pixels: np.ndarray) -> tuple[float, float]:
    """Exact mean and std of uint8 pixels scaled to [0, 1], from a 256-bin histogram (no
    float copy of the whole image set)."""
    counts = np.bincount(np.asarray(pixels, dtype=np.uint8).ravel(), minlength=256)
    counts = counts.astype(np.float64)
    levels = np.arange(256) / 255.0
    mean = float(counts @ levels / counts.sum())
    std = float(np.sqrt(counts @ (levels - mean) ** 2 / counts.sum()))
    return mean, std


def standardize_uint8_images(
    images: np.ndarray, means: np.ndarray, stds: np.ndarray, chunk: int = 4096
) -> np.ndarray:
    """(N, C, H, W) uint8 -> float32 ((x/255) - mean_c) / std_c via a per-channel lookup
    table, in chunks so the intp index copy numpy makes stays small."""
    means = np.broadcast_to(np.asarray(means, dtype=np.float64), (images.shape[1],))
    stds = np.broadcast_to(np.asarray(stds, dtype=np.float64), (images.shape[1],))
    levels = np.arange(256) / 255.0
    stds = np.where(stds > 0, stds, 1.0)  # a constant channel is only centred, as standardize
    lookups = ((levels[None, :] - means[:, None]) / stds[:, None])
    lookups = lookups.astype(np.float32)
    out = np.empty(images.shape, dtype=np.float32)
    for start in range(0, len(images), chunk):
        block = images[start : start + chunk]
        for channel in range(images.shape[1]):
            out[start : start + chunk, channel] = lookups[channel][block[:, channel]]
    return out
