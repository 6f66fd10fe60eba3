"""The Dyn-D2P family (Algorithm 1 of the seed paper under each noise schedule) and SGP, its
non-private counterpart, registered like any plugin (:mod:`dpdl.algorithms.registry`): one
noisy release per step, one push-sum round, the schedule family of the same name."""

from __future__ import annotations

from dpdl.algorithms.registry import Algorithm, register_algorithm

__all__ = ["BUILTIN_ALGORITHMS", "ScheduleAlgorithm"]


class ScheduleAlgorithm(Algorithm):
    """Algorithm 1 with the noise schedule family ``name``."""

    def __init__(self, name: str, description: str):
        self.name, self.schedule, self.description = name, name, description


BUILTIN_ALGORITHMS = tuple(register_algorithm(ScheduleAlgorithm(name, text)) for name, text in (
    ("sgp", "stochastic gradient push, not private (no clipping, no noise)"),
    ("const-d2p", "constant clip bound and noise multiplier"),
    ("dyn-c-d2p", "decaying clip bound, constant multiplier"),
    ("dyn-mu-d2p", "constant clip bound, decaying privacy budget per step"),
    ("dyn-d2p", "decaying clip bound and per-step budget (the seed paper's Dyn-D2P)"),
    ("general", "any clip and noise shapes (Corollary 1)"),
))  # fmt: skip
