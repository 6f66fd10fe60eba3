"""engine: the stacked-tensor simulator (and, separately, the distributed runtime)."""

from dpdl.engine.simulator import NodeData, Simulator, accuracy, resolve_device, stack_params

__all__ = ["NodeData", "Simulator", "accuracy", "resolve_device", "stack_params"]
