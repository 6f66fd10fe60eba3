import os
import sys
from pathlib import Path

import pytest

# Spawned worker processes (torch.multiprocessing, process pools) unpickle test functions by
# module name (tests.<area>.<module>): they need the repository root on their path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture
def one_thread():
    """One torch thread for the test (a module asks with pytestmark): the per-step work of
    tiny models is too fine-grained for intra-op threads (see dpdl run)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(12345)


@pytest.fixture
def os_keys(monkeypatch):
    """Every 256-bit key drawn from ``os.urandom`` during the test, in order."""
    from dpdl.algorithms import randomness

    drawn = []
    real = randomness.os.urandom

    def recording(k):
        value = real(k)
        if k == randomness.KEY_BYTES:
            drawn.append(value)
        return value

    monkeypatch.setattr(randomness.os, "urandom", recording)
    return drawn
