"""The validation split (``data.validation_records``): records held out of a training split
as declared-public validation data, the same records whatever the run's seed.

A record is a validation record when its keyed hash is among the ``count`` smallest of the
split's: BLAKE2b-64 under :data:`VALIDATION_KEY` (a public constant) of its features as
little-endian float32 and its target as float64, ties broken by position.  The split is
therefore a function of the data set alone: every run, sweep and tuning on the same data
holds out the same records, so no record is public validation data in one run and private
training data in another (issue 38; ``tune_validation_union.py`` found 50.1 % of
Fashion-MNIST's training split on both sides when the split followed the seed).  Adding or
removing one record moves at most one other record across (the one ranked ``count``).

The key is a constant, not a setting, on purpose: a second key would draw a second split of
the same data, and records would again be validation data in one study and training data in
another.
"""

from __future__ import annotations

import hashlib

import numpy as np

from dpdl.errors import require

__all__ = ["VALIDATION_KEY", "validation_split"]

#: The public key of the validation split's hash (documented in docs/THREAT_MODEL.md).
VALIDATION_KEY = b"dpdl validation split, issue 38"
_KEY = hashlib.blake2b(VALIDATION_KEY, digest_size=32).digest()


def record_hashes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each record's 64-bit keyed hash (uint64), from its canonical bytes."""
    # canonical bytes: a loader that hands float64 features or int32 labels splits alike
    features = np.ascontiguousarray(np.asarray(x).reshape(len(x), -1), dtype="<f4")
    targets = np.ascontiguousarray(np.asarray(y).reshape(len(y), -1), dtype="<f8")
    out = np.empty(len(features), dtype=np.uint64)
    for i in range(len(features)):
        digest = hashlib.blake2b(features[i].tobytes(), key=_KEY, digest_size=8)
        digest.update(targets[i].tobytes())
        out[i] = int.from_bytes(digest.digest(), "big")
    return out


def validation_split(x: np.ndarray, y: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """(held, kept): the sorted indices of the ``count`` validation records and of the rest."""
    require(len(x) == len(y), f"x has {len(x)} records but y has {len(y)}")
    require(0 < count < len(x),
            f"data.validation_records = {count} leaves no training records "
            f"(the training split holds {len(x)})")  # fmt: skip
    order = np.lexsort((np.arange(len(x)), record_hashes(x, y)))  # by hash, then position
    return np.sort(order[:count]), np.sort(order[count:])
