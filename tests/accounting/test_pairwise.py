"""The one pairwise ε matrix: statistics over defined pairs only, the worst pair located."""

import numpy as np

from dpdl.accounting.pairwise import PairwiseEpsilon


def test_statistics_skip_the_undefined_diagonal_and_name_the_worst_pair():
    eps = np.array([[np.nan, 0.5, 2.0], [0.25, np.nan, 1.0], [0.75, 3.0, np.nan]])
    report = PairwiseEpsilon(epsilon=eps, delta=1e-5)
    defined = [0.5, 2.0, 0.25, 1.0, 0.75, 3.0]
    assert report.mean == sum(defined) / 6
    assert report.best == 0.25 and report.worst == 3.0
    assert report.worst_pair == (2, 1)  # u = 2's data in v = 1's view
