"""The Dyn-D2P family (Algorithm 1 of the seed paper under each noise schedule) and SGP, its
non-private counterpart, registered like any plugin (:mod:`dpdl.algorithms.registry`): one
noisy release per step, one push-sum round, the schedule family of the same name."""

from __future__ import annotations

from dpdl.accounting.schedules import ALGORITHMS as SCHEDULES
from dpdl.algorithms.registry import Algorithm, register_algorithm

__all__ = ["BUILTIN_ALGORITHMS", "ScheduleAlgorithm"]


class ScheduleAlgorithm(Algorithm):
    """Algorithm 1 with the noise schedule family ``name``."""

    def __init__(self, name: str, description: str):
        self.name, self.schedule, self.description = name, name, description


# Every schedule family registered by now (the built-in ones); a family registered later
# becomes an algorithm on first use (registry.get_algorithm).
BUILTIN_ALGORITHMS = tuple(register_algorithm(ScheduleAlgorithm(name, family.description))
                           for name, family in SCHEDULES.items())  # fmt: skip
