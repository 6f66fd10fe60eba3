"""Seed-paired intervals: the one t-interval every verdict of dpdl uses (``dpdl paired``,
the report's claims, ``docs/RESULTS.md``)."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from dpdl.training.results import sample_std

__all__ = ["t_interval"]


def t_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """Mean and two-sided Student-t interval of ``values`` (NaN bounds for fewer than two)."""
    x = np.asarray(values, dtype=float)
    mean = float(x.mean()) if len(x) else math.nan
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * sample_std(x) / math.sqrt(len(x))
    return mean, mean - half, mean + half
