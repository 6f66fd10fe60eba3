"""algorithms: the algorithms as small composable, pure transformations.

Submodules are imported on demand (``dpdl.algorithms.dyn_d2p`` needs torch; others may not).
"""

from __future__ import annotations

import importlib

_LAZY = {
    **dict.fromkeys(("dyn_d2p_step", "local_update", "push_sum_mix", "make_node_generators"),
                    "dpdl.algorithms.dyn_d2p"),
    **dict.fromkeys(("LocalStep", "NodeRecords", "StepArguments", "StepBuffers"),
                    "dpdl.algorithms.step"),
    **dict.fromkeys(("UpdateTransform", "WeightDecay", "HeavyBall", "StepSize", "chain", "sgd"),
                    "dpdl.algorithms.transforms"),
}  # fmt: skip


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dpdl.algorithms' has no attribute {name!r}")
