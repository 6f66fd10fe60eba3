"""Experiment kinds: what ``dpdl run`` does with a config, by its top-level ``kind`` key.

A config file (TOML) names its kind; the default kind is the Dyn-D2P family on the simulator.
Each kind's module exposes::

    run_experiment(config: dict, output_dir: pathlib.Path, *, progress: bool = True) -> dict

which validates ``config`` itself (unknown keys and invalid values are DPDLErrors naming the
key), writes its run folder under ``output_dir`` and returns the final results.
"""

from __future__ import annotations

import importlib

from dpdl.errors import DPDLError

DEFAULT_KIND = "decentralized"

EXPERIMENT_KINDS: dict[str, str] = {
    "decentralized": "dpdl.experiments.runner",  # Dyn-D2P family, SGP (SPEC §4)
    "linreg": "dpdl.experiments.linreg",  # DP decentralized linear regression (SPEC §5)
    "netdp-logreg": "dpdl.experiments.netdp",  # network-DP token SGD (SPEC §6)
    "fdp-random-walk": "dpdl.experiments.fdp",  # PN-f-DP random-walk DP-SGD (SPEC §7)
}


def experiment_module(kind: str | None):
    kind = kind or DEFAULT_KIND
    if kind not in EXPERIMENT_KINDS:
        raise DPDLError(
            f"unknown experiment kind {kind!r}; choose one of {', '.join(sorted(EXPERIMENT_KINDS))}"
        )
    return importlib.import_module(EXPERIMENT_KINDS[kind])
