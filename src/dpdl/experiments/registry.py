"""Experiment kinds: what ``dpdl run`` does with a config, by its top-level ``kind`` key.

A config file (TOML) names its kind; the default kind is the Dyn-D2P family on the simulator.
Every kind is one :class:`ExperimentKind` in the registry :data:`EXPERIMENT_KINDS`, which
names its modules by dotted path (strings: the core never imports an extension, and a kind
costs nothing until it runs). A kind's module exposes::

    run_experiment(config: dict, output_dir: pathlib.Path, *, progress: bool = True) -> dict

which validates ``config`` itself (unknown keys and invalid values are DPDLErrors naming the
key), writes its run folder under ``output_dir`` and returns the final results; optionally
``apply_overrides(config, **flags) -> dict`` (``dpdl run --seed/--steps/--entropy/...``) and
``resume_experiment(run_dir, *, progress) -> dict`` (``dpdl run --resume``).

A kind ships its presets in its own package's ``presets/`` folder (``NAME.toml``, each
config's ``kind`` that kind): the core's in ``dpdl/experiments/presets``, each extension's in
``dpdl/extensions/<name>/presets``. ``--preset NAME`` finds a name in any of them.
"""

from __future__ import annotations

import importlib
import importlib.util
import tomllib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from dpdl.errors import DPDLError, require

__all__ = [
    "DEFAULT_KIND",
    "EXPERIMENT_KINDS",
    "ExperimentKind",
    "PRESETS_DIR",
    "experiment_kind",
    "experiment_module",
    "kind_of",
    "load_config_file",
    "preset_description",
    "preset_names",
    "preset_path",
    "register_experiment_kind",
    "unregister_experiment_kind",
    "validate_experiment_config",
]

DEFAULT_KIND = "decentralized"


@dataclass(frozen=True)
class ExperimentKind:
    """One experiment kind: what ``dpdl run`` / ``sweep`` / ``tune`` / ``audit`` need of it.

    ``name``: the config's ``kind``. ``module``: the dotted path of the module with
    ``run_experiment`` (imported only when a run needs it). ``validator``: "module:function"
    that validates a config of this kind against its config model (a pydantic model;
    importable without torch, so a sweep checks every cell before it starts a worker); None:
    the kind validates when it runs. ``presets``: the package whose ``presets/`` folder holds
    its presets (None: it ships none). ``tunes``: ``dpdl tune`` runs it. ``audits``: ``dpdl
    audit --config`` reads its configs. ``distributed``: its runs go through the trainer's
    runtimes (``dpdl run --procs``, torchrun; ``--resume`` with ``--runtime``/``--device``).
    """

    name: str
    module: str
    validator: str | None = None
    presets: str | None = None
    tunes: bool = False
    audits: bool = False
    distributed: bool = False
    description: str = ""

    def load(self) -> ModuleType:
        """The kind's module (its ``run_experiment``), imported now."""
        return importlib.import_module(self.module)

    def run(self, config: dict, output_dir: Path, *, progress: bool = True) -> dict:
        """``run_experiment`` of the kind's module."""
        return self.load().run_experiment(config, output_dir, progress=progress)

    def validate(self, config: dict) -> Any:
        """The validated config (its config model) of ``config``; DPDLError naming the key.
        A kind without a validator returns None (it validates when it runs)."""
        if self.validator is None:
            return None
        module, _, function = self.validator.partition(":")
        return getattr(importlib.import_module(module), function)(config)

    def presets_dir(self) -> Path | None:
        """The folder of its presets, found without importing the package (only its
        parents); None when it ships none."""
        if self.presets is None:
            return None
        spec = importlib.util.find_spec(self.presets)
        require(spec is not None and spec.submodule_search_locations,
                f"experiment kind {self.name!r}: presets package {self.presets!r} not found")
        return Path(next(iter(spec.submodule_search_locations))) / "presets"


# name -> kind, in registration order. The shipped kinds:
EXPERIMENT_KINDS: dict[str, ExperimentKind] = {}


def register_experiment_kind(kind: ExperimentKind, *, replace: bool = False) -> ExperimentKind:
    """Add ``kind`` under ``kind.name`` (one call: ``dpdl run``, sweeps, ``--preset`` and
    ``--list-presets`` then know it)."""
    require(isinstance(kind, ExperimentKind),
            f"register an ExperimentKind, got {type(kind).__name__}")  # fmt: skip
    require(isinstance(kind.name, str) and kind.name.strip() == kind.name != "",
            f"an experiment kind needs a name, got {kind.name!r}")  # fmt: skip
    require(replace or kind.name not in EXPERIMENT_KINDS,
            f"experiment kind {kind.name!r} is already registered")  # fmt: skip
    EXPERIMENT_KINDS[kind.name] = kind
    return kind


def unregister_experiment_kind(name: str) -> ExperimentKind:
    """Remove (and return) the kind registered as ``name``."""
    require(name in EXPERIMENT_KINDS, f"experiment kind {name!r} is not registered")
    return EXPERIMENT_KINDS.pop(name)


for _kind in (
    ExperimentKind(
        DEFAULT_KIND, "dpdl.experiments.runner", "dpdl.experiments.config:parse_config",
        presets="dpdl.experiments", tunes=True, audits=True, distributed=True,
        description="Dyn-D2P family, SGP (MATH.md §4)"),
    ExperimentKind(
        "linreg", "dpdl.extensions.linreg.experiment",
        "dpdl.extensions.linreg.experiment:parse_linreg_config",
        presets="dpdl.extensions.linreg", description="DP decentralized linreg (MATH.md §5)"),
    ExperimentKind(
        "netdp-logreg", "dpdl.extensions.netdp.experiment",
        "dpdl.extensions.netdp.experiment:parse_config",
        presets="dpdl.extensions.netdp", description="network-DP token SGD (MATH.md §6)"),
    ExperimentKind(
        "fdp-random-walk", "dpdl.extensions.fdp.experiment",
        "dpdl.extensions.fdp.experiment:parse_config",
        presets="dpdl.extensions.fdp",
        description="PN-f-DP random-walk DP-SGD (MATH.md §7)"),
):  # fmt: skip
    register_experiment_kind(_kind)
del _kind


def experiment_kind(kind: str | None) -> ExperimentKind:
    """The kind called ``kind`` (None: the default). Besides the registered kinds, ``kind``
    may name a plugin module by its dotted import path (e.g. ``"mylab.experiments.custom"``)
    that exposes ``run_experiment``: a kind with no validator, presets or runtimes."""
    kind = kind or DEFAULT_KIND
    if kind in EXPERIMENT_KINDS:
        return EXPERIMENT_KINDS[kind]
    if "." in kind:
        return ExperimentKind(kind, kind, description="plugin module")
    raise DPDLError(
        f"unknown experiment kind {kind!r}; choose one of {', '.join(sorted(EXPERIMENT_KINDS))} "
        "or a plugin module path"
    )


def kind_of(config: dict) -> ExperimentKind:
    """The kind a config names (its top-level ``kind``; the default without one)."""
    return experiment_kind(config.get("kind"))


def validate_experiment_config(config: dict) -> None:
    """Raise DPDLError when ``config`` is invalid for its kind (plugin kinds: not checked)."""
    kind_of(config).validate(config)


def experiment_module(kind: str | None) -> ModuleType:
    """The module that runs experiments of ``kind`` (see :func:`experiment_kind`); a plugin
    module must import and expose ``run_experiment``."""
    chosen = experiment_kind(kind)
    if chosen.name in EXPERIMENT_KINDS:
        return chosen.load()
    try:
        module = chosen.load()
    except ImportError as err:
        raise DPDLError(f"experiment plugin {chosen.name!r} cannot be imported: {err}") from err
    if not callable(getattr(module, "run_experiment", None)):
        raise DPDLError(f"experiment plugin {chosen.name!r} has no run_experiment function")
    return module


# ----------------------------------------------------------------------------- presets
# The core kind's presets (each extension's are in its own package).
PRESETS_DIR = Path(__file__).with_name("presets")


def _presets() -> dict[str, Path]:
    """Every shipped preset: name -> file, over the kinds in registration order. Two kinds
    shipping one name is an error (``--preset`` would be ambiguous)."""
    found: dict[str, Path] = {}
    for kind in EXPERIMENT_KINDS.values():
        folder = kind.presets_dir()
        for path in sorted(folder.glob("*.toml")) if folder is not None else ():
            require(path.stem not in found,
                    f"preset {path.stem!r} is shipped twice: {found.get(path.stem)} and {path}")
            found[path.stem] = path
    return found


def preset_names() -> list[str]:
    return sorted(_presets())


def preset_path(name: str) -> Path:
    """The file of the shipped preset ``name`` (DPDLError naming the shipped ones)."""
    presets = _presets()
    if name not in presets:
        raise DPDLError(f"unknown preset {name!r}; shipped presets: {', '.join(sorted(presets))}")
    return presets[name]


def preset_description(name: str) -> str:
    """The first sentence of a preset's leading comment."""
    lines = []
    for line in preset_path(name).read_text().splitlines():
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
        path = preset_path(preset)
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError as err:
        raise DPDLError(f"config file {str(path)!r} does not exist") from err
    except tomllib.TOMLDecodeError as err:
        raise DPDLError(f"{path}: invalid TOML: {err}") from err
