"""``data.validation_records``' hold-out (issue 38): a function of the records alone."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from dpdl.data import VALIDATION_KEY, validation_split
from dpdl.errors import DPDLError


def records(n=500, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 3, 2)).astype(np.float32), rng.integers(0, 4, size=n)


def test_the_hold_out_is_the_smallest_keyed_hashes_by_hand():
    x, y = records()
    key = hashlib.blake2b(VALIDATION_KEY, digest_size=32).digest()
    hashes = [int.from_bytes(hashlib.blake2b(
        x[i].astype("<f4").tobytes() + np.float64(y[i]).astype("<f8").tobytes(),
        key=key, digest_size=8).digest(), "big") for i in range(len(x))]  # fmt: skip
    held, kept = validation_split(x, y, 40)
    assert held.tolist() == sorted(np.argsort(hashes, kind="stable")[:40].tolist())
    assert sorted(held.tolist() + kept.tolist()) == list(range(len(x)))


def test_it_follows_the_records_not_their_order_nor_their_dtypes():
    x, y = records()
    held, _ = validation_split(x, y, 40)
    order = np.random.default_rng(1).permutation(len(x))
    shuffled, _ = validation_split(x[order], y[order], 40)
    assert sorted(order[shuffled].tolist()) == held.tolist()
    wide, _ = validation_split(x.astype(np.float64), y.astype(np.int32), 40)
    assert wide.tolist() == held.tolist()
    # removing a training record leaves the hold-out as it was; removing a held-out one
    # moves exactly one training record (the next by hash) across
    gone = int(np.setdiff1d(np.arange(len(x)), held)[0])
    rest = np.delete(np.arange(len(x)), gone)
    after, _ = validation_split(x[rest], y[rest], 40)
    assert rest[after].tolist() == held.tolist()
    rest = np.delete(np.arange(len(x)), held[0])
    after, _ = validation_split(x[rest], y[rest], 40)
    assert len(set(rest[after].tolist()) - set(held.tolist())) == 1


@pytest.mark.parametrize("count", [0, 500, 501])
def test_a_hold_out_that_leaves_no_training_record_is_refused(count):
    x, y = records()
    with pytest.raises(DPDLError, match=f"validation_records = {count} leaves no training"):
        validation_split(x, y, count)
