"""dpdl: differentially private decentralized learning.

Architecture (data flows one way)::

    config -> data + topology + privacy schedule -> engine -> results -> report

* ``dpdl.accounting``  pure math (numpy/scipy/dp_accounting, no torch): GDP, schedules,
  certified PLD/RDP accountants, calibration, the privacy ledger, gossip view accounting.
* ``dpdl.topology``    graphs and their (column-stochastic) mixing matrices.
* ``dpdl.algorithms``  the algorithms as small composable transformations.
* ``dpdl.engine``      the stacked-tensor simulator and the torch.distributed runtime.
* ``dpdl.data`` / ``dpdl.models``  loaders and models.
* ``dpdl.training``    settings, the run folder's results and the trainer: the one training
  entry point (``dpdl.train`` / ``dpdl.DecentralizedTrainer``) that ``dpdl run``, sweeps and
  users' own code go through.
* ``dpdl.experiments`` configs, runs over cells, sweeps, tuning and reports.
* ``dpdl.extensions``  the other papers' algorithms, each with its accounting, algorithm,
  experiment kind and command: ``netdp`` (network DP), ``fdp`` (PN-f-DP, DECOR), ``linreg``.
* ``dpdl.audit``       empirical audits and reconstruction attacks.
"""

from types import ModuleType as _ModuleType

from dpdl.errors import DPDLError

__version__ = "0.1.0"
__all__ = [
    "Algorithm",
    "DPDLError",
    "DecentralizedTrainer",
    "EvaluationSpec",
    "ExecutionSpec",
    "OutputSpec",
    "Release",
    "TrainingResult",
    "View",
    "__version__",
    "register_algorithm",
    "train",
]

# the trainer and its grouped settings (beside dpdl.training.settings' sections)
_TRAINER_EXPORTS = ("DecentralizedTrainer", "EvaluationSpec", "ExecutionSpec", "OutputSpec",
                    "TrainingResult", "train")  # fmt: skip
# The algorithm plugin API (dpdl.algorithms.registry; docs/EXTENDING.md).
_PLUGIN_EXPORTS = ("Algorithm", "Release", "View", "register_algorithm")


def __getattr__(name: str):
    # Imported on first use: `import dpdl` (and the accounting) stays free of torch.
    if name in _TRAINER_EXPORTS:
        from dpdl.training import trainer

        return getattr(trainer, name)
    if name in _PLUGIN_EXPORTS:
        from dpdl.algorithms import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'dpdl' has no attribute {name!r}")


def __dir__() -> list[str]:
    # The public API (and the subpackages already imported), not the module's private helpers.
    submodules = [
        name
        for name, value in globals().items()
        if not name.startswith("_") and isinstance(value, _ModuleType)
    ]
    dunders = [name for name in globals() if name.startswith("__") and name.endswith("__")]
    return sorted(set(__all__) | set(submodules) | set(dunders))
