"""algorithms: the algorithms as small composable, pure transformations.

Submodules are imported on demand (``dpdl.algorithms.dyn_d2p`` needs torch; others may not).
"""

from __future__ import annotations

import importlib

_DYN_D2P_NAMES = ("dyn_d2p_step", "local_update", "push_sum_mix", "make_node_generators")


def __getattr__(name: str):
    if name in _DYN_D2P_NAMES:
        return getattr(importlib.import_module("dpdl.algorithms.dyn_d2p"), name)
    raise AttributeError(f"module 'dpdl.algorithms' has no attribute {name!r}")
