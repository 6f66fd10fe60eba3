"""Algorithms by name: what a run's ``algorithm = "name(setting=value)@accountant"`` means.

An :class:`Algorithm` declares everything the rest of dpdl needs to run, account, audit and
report it, so that a researcher adds one in one file (``docs/EXTENDING.md``):

* ``name`` and ``schedule``: the noise schedule family whose clip bounds C_k and multipliers
  z_k it is calibrated with (``dpdl.accounting.schedules``: "const-d2p", "dyn-d2p", ...);
* ``Settings``: a pydantic model of its own settings, validated when the name is parsed and
  part of the run's label, so they key the seeded noise, the checkpoint digest and every
  output (two settings never share noise);
* :meth:`Algorithm.releases`: the noisy messages one step releases, each a Poisson-subsampled
  Gaussian on its own sample with multiplier ``z_k * noise_factor`` (the ledger records and
  composes one mechanism per release, :class:`dpdl.accounting.ledger.PrivacyLedger`);
* :meth:`Algorithm.rounds` and :meth:`Algorithm.view`: how many gossip rounds a step takes and
  what an observer sees of them (``dpdl gossip account``, ``dpdl audit --threat observer``);
* :meth:`Algorithm.step`: the step itself, written against the engine's
  :class:`StepContext` (sampling, clipping and the exact noise release, the update
  transforms, mixing of any tensors, per-node state the engine checkpoints).

The built-in Dyn-D2P family and SGP register through :func:`register_algorithm` like any
plugin.  Plugins load from the entry-point group ``dpdl.algorithms`` (an installed package
registers itself) and from ``DPDL_PLUGINS`` (a comma-separated list of modules or ``.py``
files), once, before a command parses its configuration.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from dpdl.errors import DPDLError, require

__all__ = [
    "ALGORITHM_REGISTRY",
    "Algorithm",
    "NoSettings",
    "PLUGIN_ENTRY_POINTS",
    "PLUGINS_VARIABLE",
    "Release",
    "StepContext",
    "View",
    "algorithm_digest",
    "algorithm_names",
    "get_algorithm",
    "load_plugins",
    "parse_settings",
    "register_algorithm",
    "resolve",
    "split_settings",
]

PLUGIN_ENTRY_POINTS = "dpdl.algorithms"
PLUGINS_VARIABLE = "DPDL_PLUGINS"
_NAME = re.compile(r"^[a-z][a-z0-9_-]*$")


class NoSettings(BaseModel):
    """An algorithm without settings of its own."""

    model_config = ConfigDict(frozen=True, extra="forbid")


@dataclass(frozen=True)
class Release:
    """One noisy message a step releases: ``name`` (for the ledger and outputs) and its
    multiplier relative to the schedule's, σ_r / Δ_r = ``noise_factor`` · z_k (Δ_r = C_k, the
    step's clip bound, for a clipped sum)."""

    name: str
    noise_factor: float = 1.0


@dataclass(frozen=True)
class View:
    """What an observer sees of one step: ``rounds`` gossip rounds of the model, the first
    with the step's contribution and fresh noise, the others only mixing (Muffliato) when
    ``fresh_noise_every_round`` is False.  ``exact`` False: the algorithm's messages are not
    one linear Gaussian stream (e.g. gradient tracking's two coupled streams); the observer
    accounting then states the local-DP bound of its releases, which always holds."""

    rounds: int = 1
    fresh_noise_every_round: bool = True
    exact: bool = True


class StepContext(Protocol):
    """What an algorithm's step is given by the engine (``dpdl.engine.simulator``)."""

    iteration: int  # k, the step being taken
    arguments: Any  # the plan's StepArguments: private, clip, sigma, lr, mix, mixing_round
    settings: BaseModel  # the algorithm's validated settings
    state: dict[str, Any]  # per-node tensors the algorithm keeps (checkpointed)

    def local_update(self) -> Any: ...  # the built-in sampling → clipping → noise → transforms

    def noisy_gradient(self, release: int) -> Any: ...  # a further release's noisy sum / b

    def mix(self, tensors: dict[str, Any], round_: int) -> dict[str, Any]: ...

    def mix_model(self, half: dict[str, Any], round_: int) -> None: ...

    def keep_model(self, half: dict[str, Any]) -> None: ...


class Algorithm:
    """Subclass and :func:`register_algorithm` an instance (see the module doc)."""

    name: ClassVar[str] = ""
    schedule: ClassVar[str] = "const-d2p"
    display: ClassVar[str] = ""
    description: ClassVar[str] = ""
    Settings: ClassVar[type[BaseModel]] = NoSettings

    @property
    def private(self) -> bool:
        """Whether it clips and adds noise: its schedule family's ``private``."""
        from dpdl.accounting.schedules import schedule_family

        return schedule_family(self.schedule).private

    def releases(self, settings: BaseModel) -> tuple[Release, ...]:
        return (Release("update"),)

    def schedule_releases(self, settings: BaseModel) -> dict[str, float] | None:
        """The releases as a schedule takes them ({name: noise factor},
        :func:`dpdl.accounting.schedules.make_schedule`): None for Algorithm 1's one release
        of factor 1."""
        releases = self.releases(settings)
        if len(releases) == 1 and releases[0].noise_factor == 1.0:
            return None
        return {r.name: r.noise_factor for r in releases}

    def rounds(self, settings: BaseModel) -> int:
        """Gossip rounds per (mixing) step."""
        return 1

    def view(self, settings: BaseModel) -> View:
        return View(rounds=self.rounds(settings))

    def init_state(self, context: StepContext) -> dict[str, Any]:
        """Per-node tensors (rows = the hosted nodes; nested dicts of tensors) the step keeps
        across steps."""
        return {}

    def step(self, context: StepContext) -> Any:
        """One step of every hosted node; returns the sampled batch sizes |S_i^k|.  The
        default is Algorithm 1's: the private local update, then one push-sum round."""
        half = context.local_update()
        if context.arguments.mix:
            context.mix_model(half.params, context.arguments.mixing_round)
        else:
            context.keep_model(half.params)
        return half.batch_sizes

    @property
    def builtin_step(self) -> bool:
        """Whether the step is Algorithm 1's (the engine then takes its fused path)."""
        return type(self).step is Algorithm.step and type(self).init_state is Algorithm.init_state

    def label(self) -> str:
        return self.display or self.name


ALGORITHM_REGISTRY: dict[str, Algorithm] = {}


def register_algorithm(algorithm: Algorithm, *, replace: bool = False) -> Algorithm:
    """Register ``algorithm`` under its ``name``; a second registration of a name is refused
    unless ``replace`` (a plugin cannot silently shadow a built-in)."""
    from dpdl.accounting.schedules import ALGORITHMS as SCHEDULES

    require(isinstance(algorithm, Algorithm),
            f"register_algorithm takes an Algorithm instance, got {algorithm!r}")  # fmt: skip
    name = algorithm.name
    require(isinstance(name, str) and bool(_NAME.match(name)),
            f"an algorithm's name must be lower-case letters, digits, '-' or '_', got {name!r}")
    require(algorithm.schedule in SCHEDULES,
            f"algorithm {name!r}: unknown schedule family {algorithm.schedule!r}; one of "
            f"{', '.join(SCHEDULES)}")  # fmt: skip
    require(replace or name not in ALGORITHM_REGISTRY or ALGORITHM_REGISTRY[name] is algorithm,
            f"an algorithm named {name!r} is already registered")  # fmt: skip
    require(issubclass(algorithm.Settings, BaseModel),
            f"algorithm {name!r}: Settings must be a pydantic model")  # fmt: skip
    _check_releases(algorithm, algorithm.releases(algorithm.Settings()))
    ALGORITHM_REGISTRY[name] = algorithm
    return algorithm


def get_algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; a registered schedule family without an algorithm of
    its name is Algorithm 1 under that schedule (registered on first use)."""
    from dpdl.accounting.schedules import ALGORITHMS as SCHEDULES

    load_plugins()
    algorithm = ALGORITHM_REGISTRY.get(name)
    if algorithm is None and name in SCHEDULES:
        from dpdl.algorithms.builtin import ScheduleAlgorithm

        algorithm = register_algorithm(ScheduleAlgorithm(name, SCHEDULES[name].description))
    if algorithm is None:
        raise DPDLError(f"unknown algorithm {name!r}; choose one of "
                        f"{', '.join(algorithm_names())}")  # fmt: skip
    return algorithm


def algorithm_names() -> tuple[str, ...]:
    """Every algorithm's name: the registered ones, and the schedule families'."""
    from dpdl.accounting.schedules import ALGORITHMS as SCHEDULES

    load_plugins()
    return tuple(dict.fromkeys([*ALGORITHM_REGISTRY, *SCHEDULES]))


def parse_settings(algorithm: Algorithm, given: dict[str, Any]) -> BaseModel:
    """The algorithm's settings from ``given`` (one line naming the value when invalid), with
    its releases at these settings checked: distinct names, factors > 0 (the ledger keys
    them by name)."""
    try:
        settings = algorithm.Settings(**given)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "settings"
        raise DPDLError(f"algorithm {algorithm.name!r}: {where}: {first['msg']} "
                        f"(got {first.get('input')!r})") from None
    _check_releases(algorithm, algorithm.releases(settings))
    return settings


def _check_releases(algorithm: Algorithm, releases) -> None:
    import math

    ok = (len(releases) >= 1 and len({r.name for r in releases}) == len(releases)
          and all(math.isfinite(r.noise_factor) and r.noise_factor > 0 for r in releases))
    require(ok, f"algorithm {algorithm.name!r}: its releases must be distinct names with "
                f"factors > 0, got {releases!r}")  # fmt: skip
    # the first release is the step's own local update, whose noise is the schedule's σ_k:
    # the engine never scales it, so a factor there would be recorded but not added
    require(releases[0].noise_factor == 1.0,
            f"algorithm {algorithm.name!r}: its first release ({releases[0].name!r}) is the "
            f"local update with the schedule's own noise; its factor must be 1, got "
            f"{releases[0].noise_factor!r} (declare a further release for other noise)")


def algorithm_digest(algorithm: Algorithm, settings: BaseModel) -> str:
    """SHA-256 of what an algorithm computes: its class's module, name and code (every
    method, its Settings' schema), and its releases and view at ``settings``: a plugin edited
    under the same name is another algorithm (its seeded noise and checkpoints its own)."""
    import hashlib
    import inspect
    import json

    cls = type(algorithm)
    digest = hashlib.sha256(b"dpdl algorithm v1")
    digest.update(f"{cls.__module__}.{cls.__qualname__};".encode())
    for klass in cls.__mro__:
        if klass in (Algorithm, object):
            continue
        try:
            digest.update(inspect.getsource(klass).encode())
        except (OSError, TypeError):  # no source (built in the REPL): its code objects
            for value in vars(klass).values():
                code = getattr(value, "__code__", None)
                if code is not None:
                    digest.update(code.co_code + repr(code.co_consts).encode())
    digest.update(json.dumps(algorithm.Settings.model_json_schema(), sort_keys=True).encode())
    digest.update(repr((algorithm.releases(settings), algorithm.view(settings),
                        algorithm.rounds(settings), algorithm.schedule)).encode())
    return digest.hexdigest()


def split_settings(head: str) -> tuple[str, dict[str, Any]]:
    """("name", {key: value}) of "name(key=value, ...)" (no accountant suffix): values are
    Python literals (numbers, strings, booleans), anything else a string."""
    import ast

    name, paren, rest = head.partition("(")
    if not paren:
        return name.strip(), {}
    require(rest.endswith(")"), f"algorithm {head!r}: write its settings name(key=value, ...)")
    given: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in rest[:-1].split(","))):
        key, eq, value = item.partition("=")
        require(bool(eq) and key.strip().isidentifier(),
                f"algorithm {head!r}: {item!r} is not key=value")  # fmt: skip
        try:
            given[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            given[key.strip()] = value.strip()
    return name.strip(), given


def resolve(text: str) -> tuple[Algorithm, BaseModel]:
    """The registered algorithm and its validated settings of "name(key=value, ...)" (an
    ``@accountant`` suffix is ignored here)."""
    name, given = split_settings(str(text).strip().lower().partition("@")[0])
    algorithm = get_algorithm(name)
    return algorithm, parse_settings(algorithm, given)


# ---------------------------------------------------------------------- plugins
_loaded: set[str] = set()


def load_plugins() -> None:
    """Import every plugin once: the entry points of ``dpdl.algorithms`` and the modules or
    ``.py`` files listed in ``DPDL_PLUGINS``.  A plugin that fails to import is one error
    naming it (never a silently missing algorithm)."""
    from importlib.metadata import entry_points

    _register_builtins()
    if "entry points" not in _loaded:  # the installed packages' metadata, read once
        _loaded.add("entry points")
        for entry in entry_points(group=PLUGIN_ENTRY_POINTS):
            _load_once(f"entry point {entry.name}", entry.load)
    for item in filter(None, (s.strip() for s in os.environ.get(PLUGINS_VARIABLE, "").split(","))):
        _load_once(item, lambda item=item: _import(item))


def _load_once(key: str, load) -> None:
    if key in _loaded:
        return
    _loaded.add(key)
    try:
        load()
    except DPDLError:
        raise
    except Exception as err:
        raise DPDLError(f"plugin {key}: {type(err).__name__}: {err}") from err


def _import(item: str) -> None:
    if item.endswith(".py"):
        path = Path(item).expanduser()
        require(path.is_file(), f"{PLUGINS_VARIABLE}: no plugin file {item!r}")
        module_name = f"dpdl_plugin_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    else:
        importlib.import_module(item)


def _register_builtins() -> None:
    if "builtins" not in _loaded:
        _loaded.add("builtins")
        from dpdl.algorithms import builtin  # noqa: F401  (registers the Dyn-D2P family)
