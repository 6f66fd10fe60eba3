import os

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_configure(config):
    import numpy as np

    np.seterr(all="warn")


@pytest.fixture
def rng():
    import numpy as np

    return np.random.default_rng(12345)
