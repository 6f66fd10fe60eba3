"""Experiment kinds: what ``dpdl run`` does with a config, by its top-level ``kind`` key.

A config file (TOML) names its kind; the default kind is the Dyn-D2P family on the simulator.
Each kind's module exposes::

    run_experiment(config: dict, output_dir: pathlib.Path, *, progress: bool = True) -> dict

which validates ``config`` itself (unknown keys and invalid values are DPDLErrors naming the
key), writes its run folder under ``output_dir`` and returns the final results.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

from dpdl.errors import DPDLError

DEFAULT_KIND = "decentralized"

EXPERIMENT_KINDS: dict[str, str] = {
    "decentralized": "dpdl.experiments.runner",  # Dyn-D2P family, SGP (MATH.md §4)
    "linreg": "dpdl.extensions.linreg.experiment",  # DP decentralized linreg (MATH.md §5)
    "netdp-logreg": "dpdl.extensions.netdp.experiment",  # network-DP token SGD (MATH.md §6)
    "fdp-random-walk": "dpdl.extensions.fdp.experiment",  # PN-f-DP random-walk DP-SGD (MATH.md §7)
}


# Each shipped kind's config validator ("module:function"), importable without torch so that a
# sweep can check every cell's config before it starts any worker.
CONFIG_VALIDATORS: dict[str, str] = {
    "decentralized": "dpdl.experiments.config:parse_config",
    "linreg": "dpdl.extensions.linreg.experiment:parse_linreg_config",
    "netdp-logreg": "dpdl.extensions.netdp.experiment:parse_config",
    "fdp-random-walk": "dpdl.extensions.fdp.experiment:parse_config",
}


def validate_experiment_config(config: dict) -> None:
    """Raise DPDLError when ``config`` is invalid for its kind (plugin kinds: not checked)."""
    target = CONFIG_VALIDATORS.get(config.get("kind") or DEFAULT_KIND)
    if target is not None:
        module, function = target.split(":")
        getattr(importlib.import_module(module), function)(config)


def experiment_module(kind: str | None):
    """The module that runs experiments of ``kind``.

    Besides the shipped kinds, ``kind`` may name a plugin module by its dotted import path
    (e.g. ``"mylab.experiments.custom"``) that exposes ``run_experiment``.
    """
    kind = kind or DEFAULT_KIND
    if kind in EXPERIMENT_KINDS:
        return importlib.import_module(EXPERIMENT_KINDS[kind])
    if "." in kind:
        try:
            module = importlib.import_module(kind)
        except ImportError as err:
            raise DPDLError(f"experiment plugin {kind!r} cannot be imported: {err}") from err
        if not callable(getattr(module, "run_experiment", None)):
            raise DPDLError(f"experiment plugin {kind!r} has no run_experiment function")
        return module
    raise DPDLError(
        f"unknown experiment kind {kind!r}; choose one of {', '.join(sorted(EXPERIMENT_KINDS))} "
        "or a plugin module path"
    )


PRESETS_DIR = Path(__file__).with_name("presets")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS_DIR.glob("*.toml"))


def preset_description(name: str) -> str:
    """The first sentence of a preset's leading comment."""
    lines = []
    for line in (PRESETS_DIR / f"{name}.toml").read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    text = " ".join(lines)
    end = text.find(". ")
    return text if end < 0 else text[: end + 1]


def load_config_file(path: str | Path | None = None, *, preset: str | None = None) -> dict:
    """Read a TOML config from a file or a shipped preset; errors name the file and the problem."""
    if (path is None) == (preset is None):
        raise DPDLError("give either a config file or --preset NAME (not both)")
    if preset is not None:
        path = PRESETS_DIR / f"{preset}.toml"
        if not path.is_file():
            raise DPDLError(
                f"unknown preset {preset!r}; shipped presets: {', '.join(preset_names())}"
            )
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as err:
        raise DPDLError(f"config file {str(path)!r} does not exist") from err
    except tomllib.TOMLDecodeError as err:
        raise DPDLError(f"{path}: invalid TOML: {err}") from err
