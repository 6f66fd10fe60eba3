"""engine: the stacked-tensor simulator (and, separately, the distributed runtime)."""

from dpdl.engine.simulator import (
    NodeData,
    Sampling,
    Simulator,
    StepOptions,
    accuracy,
    resolve_device,
    stack_params,
)

__all__ = ["NodeData", "Sampling", "Simulator", "StepOptions", "accuracy", "resolve_device",
           "stack_params"]
