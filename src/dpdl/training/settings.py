"""Settings of a training run, shared by the trainer, ``dpdl run``'s configs and every
experiment kind: the privacy and training tables, an algorithm's name and calibration, and the
one validator that turns a dict into settings with one-line errors naming each dotted key.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dpdl.accounting.certified import ACCOUNTANTS, accountant_names
from dpdl.accounting.schedules import (
    ALGORITHMS,
    DEFAULT_CLIP,
    DEFAULT_RHO_C,
    DEFAULT_RHO_MU,
    ScheduleFamily,
    schedule_family,
)
from dpdl.accounting.validators import ADD_REMOVE, DEFAULT_NEIGHBORING
from dpdl.errors import DPDLError, require

# The accountants a run may calibrate with: the registry itself (a name registered later is
# accepted too).
CALIBRATIONS = ACCOUNTANTS

__all__ = [
    "CALIBRATIONS",
    "AlgorithmSpec",
    "ConfigSection",
    "Epsilons",
    "NoiseEntropy",
    "LATER_PRIVACY_DEFAULTS",
    "LATER_SETTING_DEFAULTS",
    "PrivacySection",
    "REPORTING_PRIVACY",
    "REPRODUCIBLE_NOISE_NOTE",
    "SHAPING_TRAINING",
    "TrainingSection",
    "check_neighboring",
    "display_label",
    "seeded_cell_name",
    "validate_config",
    "with_overrides",
    "without_later_defaults",
]


class ConfigSection(BaseModel):
    """A table of a config (any experiment kind): unknown keys are errors."""

    # Infinite or NaN numbers are refused everywhere (epochs = inf would run forever).
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


_Section = ConfigSection


# The largest target epsilon of a private training run (privacy.epsilon).
MAX_EPSILON = 100.0


def _positive_finite(value: float) -> float:
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"every epsilon must be a finite number > 0, got {value!r}")
    return value


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, int | float) and not isinstance(value, bool) else value


# A non-empty list of target epsilons, each finite and positive (a single number is a list of
# one, so a sweep may set it per cell); shared by the kinds' configs.
Epsilons = Annotated[
    list[Annotated[float, AfterValidator(_positive_finite)]],
    Field(min_length=1),
    BeforeValidator(_as_list),
]

# Where a kind's secret randomness comes from (dpdl.algorithms.randomness): "os" (secret, the
# default) or "seed" (reproducible noise, an explicit research choice); shared by the kinds.
NoiseEntropy = Literal["os", "seed"]
def seeded_cell_name(
    config: BaseModel, cell: str, grid: tuple[str, ...] = (), data: Any = (),
    later: dict[str, Any] | None = None,
) -> str:
    """What a numpy kind's seeded stream of one cell is derived from (with the seed): the cell's
    own name, a digest of the training ``data`` arrays, and a digest of every setting of the
    run but the ``experiment`` table and the dotted ``grid`` keys whose value the cell names, so
    runs that differ in any other setting (a step size, a clip bound) or in the data never
    share noise. ``later`` maps dotted keys of settings added since the first runs to the value
    that reproduces the earlier behaviour: left out at that value, so earlier runs keep their
    noise."""
    from dpdl.algorithms.randomness import array_digest, settings_digest

    settings = config.model_dump(mode="json")
    settings.pop("experiment", None)
    later = later or {}
    for key in (*grid, *later):
        *parents, leaf = key.split(".")
        table = settings
        for parent in parents:
            table = table.get(parent, {})
        if key in grid or table.get(leaf) == later[key]:
            table.pop(leaf, None)
    return f"{settings_digest(settings)}|{array_digest(*data)}|{cell}"


# How every written report marks a run whose noise is derived from its seed.
REPRODUCIBLE_NOISE_NOTE = (
    "reproducible noise (entropy = seed): anyone who knows the seed can rebuild and remove the "
    "noise; a research setting, never for real data"
)


class AlgorithmSpec(BaseModel):
    """``name`` of a registered algorithm (:mod:`dpdl.algorithms.registry`), its own
    ``settings`` (validated by the algorithm; ``(key, value)`` pairs, the non-default ones)
    and ``calibrate`` a registered accountant (ACCOUNTANTS; None: privacy.calibrate).
    Written ``"name(key=value, ...)@accountant"``; the label lists the settings, so two
    settings of one algorithm never share a run's label, its seeded noise or its
    checkpoints.  Its schedule family (:attr:`family`) is the algorithm's ``schedule``."""

    model_config = ConfigDict(frozen=True)
    name: str
    calibrate: str | None = None
    settings: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def parse(cls, text: str) -> AlgorithmSpec:
        from dpdl.algorithms.registry import get_algorithm, split_settings

        head, _, calibrate = str(text).strip().lower().partition("@")
        try:
            name, given = split_settings(head)
        except DPDLError as err:
            raise ValueError(f"{err} (in {text!r})") from None
        try:
            algorithm = get_algorithm(name)
        except DPDLError as err:
            raise ValueError(f"{err} (in {text!r})") from None
        if calibrate and calibrate not in ACCOUNTANTS:
            raise ValueError(
                f"unknown calibration {calibrate!r} in {text!r}; use one of {accountant_names()}"
            )
        if not algorithm.private and calibrate:
            raise ValueError(f"{text!r}: {name} is not private and takes no calibration")
        try:
            settings = _parse_settings(algorithm, given)
        except DPDLError as err:
            raise ValueError(str(err)) from None
        return cls(name=name, calibrate=calibrate or None, settings=settings)

    @property
    def algorithm(self):
        from dpdl.algorithms.registry import get_algorithm

        return get_algorithm(self.name)

    @property
    def algorithm_settings(self) -> BaseModel:
        from dpdl.algorithms.registry import parse_settings

        return parse_settings(self.algorithm, dict(self.settings))

    @property
    def family(self) -> ScheduleFamily:
        """Its algorithm's registered schedule family."""
        return schedule_family(self.algorithm.schedule)

    @property
    def private(self) -> bool:
        """Whether it clips and adds noise (its family's ``private``)."""
        return self.family.private

    @property
    def label(self) -> str:
        shown = ", ".join(f"{k}={v!r}" for k, v in self.settings)
        name = f"{self.name}({shown})" if shown else self.name
        return name if self.calibrate is None else f"{name}@{self.calibrate}"


def display_label(label: str) -> str:
    """An algorithm label as the registries name it: "dyn-d2p@pld" -> "Dyn-D2P (PLD)"; a name
    not registered in this process stays as it is."""
    name, _, calibration = label.partition("@")
    family = ALGORITHMS.get(name)
    text = family.display if family is not None else name
    if calibration:
        accountant = ACCOUNTANTS.get(calibration)
        text += f" ({accountant.display if accountant is not None else calibration})"
    return text


def _parse_settings(algorithm, given: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """The validated settings that differ from the algorithm's defaults, sorted by key: one
    canonical form for equal settings however they were written."""
    from dpdl.algorithms.registry import parse_settings

    values = parse_settings(algorithm, given).model_dump()
    defaults = algorithm.Settings().model_dump()
    return tuple(sorted((k, v) for k, v in values.items() if v != defaults.get(k)))


# Metadata of a setting (a field's json_schema_extra), from which the lists below derive:
# SHAPES: a training setting that shapes training (the others say how it is evaluated or
# saved): it enters a seeded run's stream settings (the noise key) and the checkpoint digest.
# LATER: a setting added since the first runs (the optimiser's: Algorithm 1 itself at its
# default; per-node evaluation off; uniform sampling): at its default a run describes itself
# without it (trainer.json, the settings digest that keys seeded noise and checkpoints, a
# resume's config check), so it is the very run it was before the setting existed: same
# digests, same noise, and its run folders still resume.  node_eval_share is LATER but does
# not SHAPE: the records it holds out change the data, which enter the streams by their
# fingerprints; a run holding them out is the run on the rest alone.
# REPORTING: a privacy setting that only changes how the epsilon spent is reported.
_SHAPES, _LATER, _REPORTING = "shapes_training", "later_setting", "reporting_only"


def _marked(*marks: str) -> dict[str, bool]:
    return dict.fromkeys(marks, True)


class TrainingSection(_Section):
    steps: int | None = Field(None, ge=1, json_schema_extra=_marked(_SHAPES))
    # One epoch: "uniform" J_min / b steps, "per-node" mean(J_i) / b (dpdl.training.plan).
    epochs: float | None = Field(None, gt=0, json_schema_extra=_marked(_SHAPES))
    # The expected batch b: of the smallest node ("uniform", every node at rate b / J_min), or
    # of every node ("per-node", node i at q_i = b / J_i; dpdl.algorithms.dyn_d2p.SAMPLINGS).
    # The privacy schedule is calibrated at b / J_min, the largest rate, either way.
    batch_size: float = Field(1.0, gt=0, json_schema_extra=_marked(_SHAPES))
    sampling: Literal["uniform", "per-node"] = Field(
        "uniform", json_schema_extra=_marked(_SHAPES, _LATER))
    # The Poisson rate q of every node, given as a hyper-parameter (None: b / J_min, read off
    # the node sizes).  The noisy sum is still divided by batch_size b, a public constant.
    # privacy.neighboring = "add-remove" needs it (check_neighboring).  (It reaches the noise
    # key as the run's sample_rate, not as a training setting.)
    sample_rate: float | None = Field(None, gt=0, le=1, json_schema_extra=_marked(_LATER))
    lr: float = Field(0.03, gt=0, json_schema_extra=_marked(_SHAPES))
    # Step-size decay: gamma_k = lr * lr_decay^(-k/K), shaped like Dyn[C]'s clip decay
    # C0 rho_c^(-k/K) (1: constant).  Const-D2P with lr_decay = rho_c has Dyn[C]-D2P's
    # effective step gamma_k C_k and Const's noise multiplier: it isolates step-size scheduling.
    lr_decay: float = Field(1.0, ge=1, json_schema_extra=_marked(_SHAPES))
    # Optimiser (MATH.md §4, "Momentum, weight decay, local steps"): heavy-ball momentum beta
    # and weight decay lambda act on each node's released update u_i^k, post-processing of the
    # noisy sum (the accounting is unchanged); nodes gossip every local_steps-th step only,
    # every step (local ones too) a subsampled Gaussian step in the ledger.  The defaults
    # (0, 0, 1) are Algorithm 1 exactly.
    momentum: float = Field(0.0, ge=0, lt=1, json_schema_extra=_marked(_SHAPES, _LATER))
    weight_decay: float = Field(0.0, ge=0, json_schema_extra=_marked(_SHAPES, _LATER))
    local_steps: int = Field(1, ge=1, json_schema_extra=_marked(_SHAPES, _LATER))
    eval_every: int = Field(50, ge=1)
    # The training loss on the nodes' own records is a noise-free function of private data:
    # only with unsafe_train_metrics = true is it computed (on this many records) and released,
    # as the column unaccounted_train_loss.  For debugging; never for real data.
    eval_train_samples: int = Field(1000, ge=1)
    unsafe_train_metrics: bool = False
    eval_test_samples: int | None = Field(None, ge=1)
    eval_node_samples: int = Field(1000, ge=1)
    # Per-node evaluation (0: off): each record of a node is held out with probability share,
    # decided by a keyed hash of the record itself (dpdl.data.held_out_mask: a public key of
    # the seed, the node's index and the record's bytes), never by J_i or the record's slot,
    # so adding a record never changes which others are held out.  Those records are never
    # trained on (node sizes, the sampling rate and the accounting use the rest); choosing the
    # option declares them public: their scores (node_local_*) are released as they are.
    node_eval_share: float = Field(0.0, ge=0, lt=1, json_schema_extra=_marked(_LATER))
    # Save a checkpoint (models, push-sum weights, generator states, privacy ledger) every
    # this many steps; `dpdl run --resume RUN_DIR` continues from the last one.
    checkpoint_every: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _steps_or_epochs(self) -> TrainingSection:
        if (self.steps is None) == (self.epochs is None):
            raise ValueError("set exactly one of training.steps and training.epochs")
        if self.sample_rate is not None and self.sampling == "per-node":
            raise ValueError("training.sample_rate fixes one rate for every node: not with "
                             "training.sampling = 'per-node' (rates b / J_i)")  # fmt: skip
        return self


class PrivacySection(_Section):
    epsilon: float | list[float] = 1.0
    delta: float = Field(1e-4, gt=0, lt=1)
    # The neighbouring relation every epsilon is stated (and sigma calibrated) for (MATH.md
    # Conventions, THREAT_MODEL "Adjacency"): "replace-one" (default: node sizes J_i are
    # public and released) or "add-remove" (J_i secret: needs training.steps and
    # training.sample_rate, releases nothing size-dependent; check_neighboring).
    neighboring: Literal["replace-one", "add-remove"] = DEFAULT_NEIGHBORING
    # A registered accountant's name (dpdl.accounting.certified.ACCOUNTANTS: clt, pld, rdp, ...)
    calibrate: str = "pld"
    clip: float = Field(DEFAULT_CLIP, gt=0)
    clip0: float | None = Field(None, gt=0)
    rho_c: float = Field(DEFAULT_RHO_C, ge=1)
    rho_mu: float = Field(DEFAULT_RHO_MU, ge=1)
    # A registered certified accountant's name (pld, rdp, ...)
    certified_accountant: str = Field("pld", json_schema_extra=_marked(_REPORTING))
    # Certified epsilon at evaluation points: PLD blocked upper bound with this many blocks.
    eval_blocks: int = Field(20, ge=1, json_schema_extra=_marked(_REPORTING))
    # Certified epsilon of the whole run: "auto" (exact composition, or for a schedule with
    # many distinct multipliers the binned PLD bound: within 0.1 % of exact, with its lower
    # companion), "exact", or "blocked" (final_blocks blocks by count, looser).
    final_mode: Literal["auto", "exact", "blocked"] = Field(
        "auto", json_schema_extra=_marked(_REPORTING))
    final_blocks: int = Field(1000, ge=1, json_schema_extra=_marked(_REPORTING))
    # Blocks of a blocked PLD/RDP calibration and ledger; None (default): the accountant's own
    # choice, i.e. exact or, for many distinct multipliers, the binned PLD bound.
    calibration_blocks: int | None = Field(None, ge=1)
    # How the nodes' noise is correlated (dpdl.algorithms.correlated.CORRELATIONS, issue 41):
    # "independent" (every node's own noise) or "pairwise" (DECOR's pairwise secrets
    # s_ij = -s_ji of std correlation_factor·σ_k on every edge of the step's graph,
    # cancelling in the network's sum, on top of the independent σ_k; the noise model of the
    # same name in dpdl.accounting.correlated).  The ledger accounts σ_k alone: the guarantee
    # against curious neighbours who know the secrets they share.
    correlation: str = Field("independent", json_schema_extra=_marked(_LATER))
    # f = σ_pair / σ_k: correlated noise's only (required there).
    correlation_factor: float | None = Field(None, gt=0, json_schema_extra=_marked(_LATER))
    # Whom the run's ε is calibrated against (docs/THREAT_MODEL.md, MATH.md §9.4):
    # "curious-neighbours" (default: every neighbour colluding, knowing every secret it
    # shares; only σ_k protects: record-level local DP) or "sec-ldp" (Allouah et al.'s
    # eavesdropper who knows no honest pair's secret; pairwise noise only, where the ledger
    # records z_k / √q, q the worst [(I + f² L_t)⁻¹]_ii: dpdl.accounting.correlated).
    trust_model: Literal["curious-neighbours", "sec-ldp"] = Field(
        "curious-neighbours", json_schema_extra=_marked(_LATER))

    @field_validator("correlation")
    @classmethod
    def _correlation_name(cls, value: str) -> str:
        from dpdl.algorithms.correlated import CORRELATIONS

        if value not in CORRELATIONS:
            raise ValueError(f"unknown noise correlation {value!r}; choose one of "
                             f"{', '.join(CORRELATIONS)}")  # fmt: skip
        return value

    @model_validator(mode="after")
    def _correlation(self) -> PrivacySection:
        from dpdl.algorithms.correlated import make_correlation

        try:
            make_correlation(self.correlation, self.correlation_factor)
        except DPDLError as err:
            raise ValueError(str(err)) from None
        if self.trust_model == "sec-ldp" and self.correlation != "pairwise":
            raise ValueError(
                f"trust_model 'sec-ldp' needs correlation 'pairwise' (got {self.correlation!r}): "
                "only DECOR's pairwise secrets protect against the eavesdropper beyond local "
                "DP, which 'curious-neighbours' states")
        return self

    @property
    def noise_correlation(self):
        """The correlation these settings name (:mod:`dpdl.algorithms.correlated`)."""
        from dpdl.algorithms.correlated import make_correlation

        return make_correlation(self.correlation, self.correlation_factor)

    @field_validator("calibrate")
    @classmethod
    def _calibrate(cls, value: str) -> str:
        if value not in ACCOUNTANTS:
            raise ValueError(f"unknown accountant {value!r}; use one of {accountant_names()}")
        return value

    @field_validator("certified_accountant")
    @classmethod
    def _certified_accountant(cls, value: str) -> str:
        certified = tuple(name for name in ACCOUNTANTS if ACCOUNTANTS[name].certified)
        if value not in certified:
            raise ValueError(f"{value!r} is not a certified accountant; use one of {certified}")
        return value

    @field_validator("epsilon")
    @classmethod
    def _epsilon(cls, value: float | list[float]) -> float | list[float]:
        values = value if isinstance(value, list) else [value]
        if not values or any(not (math.isfinite(v) and v > 0) for v in values):
            raise ValueError(f"epsilon must be positive and finite, got {value}")
        # refused here, not minutes later when the calibration's privacy-loss grid outgrows
        # memory: beyond it a likelihood ratio of e^epsilon protects nothing
        huge = [v for v in values if v > MAX_EPSILON]
        if huge:
            raise ValueError(f"epsilon {huge[0]:g} is above {MAX_EPSILON:g}, which protects "
                             "nothing (e^epsilon); for a non-private baseline use the "
                             "algorithm sgp")  # fmt: skip
        return value

    @property
    def epsilons(self) -> list[float]:
        return self.epsilon if isinstance(self.epsilon, list) else [self.epsilon]


def _fields_marked(section: type[BaseModel], mark: str) -> tuple[str, ...]:
    """The fields of ``section`` whose metadata carry ``mark``, in declaration order."""
    return tuple(name for name, field in section.model_fields.items()
                 if isinstance(field.json_schema_extra, dict)
                 and field.json_schema_extra.get(mark))  # fmt: skip


# Derived from the fields' metadata (above): the training settings that shape training, the
# privacy settings that only report, and the later settings with the default at which a run
# describes itself without them.
SHAPING_TRAINING: tuple[str, ...] = _fields_marked(TrainingSection, _SHAPES)
REPORTING_PRIVACY: tuple[str, ...] = _fields_marked(PrivacySection, _REPORTING)
LATER_SETTING_DEFAULTS: dict[str, Any] = {
    name: TrainingSection.model_fields[name].default
    for name in _fields_marked(TrainingSection, _LATER)
}
LATER_PRIVACY_DEFAULTS: dict[str, Any] = {
    name: PrivacySection.model_fields[name].default
    for name in _fields_marked(PrivacySection, _LATER)
}


def without_later_defaults(table: dict[str, Any],
                           later: dict[str, Any] = LATER_SETTING_DEFAULTS) -> dict[str, Any]:
    """A [training] table (a dict; or another table with its ``later`` defaults, e.g. the
    [privacy] table with LATER_PRIVACY_DEFAULTS) without the settings added since the first
    runs (the optimiser's, per-node evaluation, the noise correlation) at their default."""
    return {k: v for k, v in table.items() if k not in later or v != later[k]}


# Keys that once existed: a config that still sets one is told what became of it.
REMOVED_KEYS = {
    "secure_noise": "removed: every private step's noise is now exact in law, a stronger "
                    "guarantee than the hardened sampler gave (docs/MATH.md §10); delete the key",
}


# What the add/remove relation refuses: (the test on the training settings, what it would
# read off J_i and what to give instead).  Under add/remove J_i differs between them, so q, K
# and b must be fixed without looking at it (THREAT_MODEL "What is assumed public").
_ADD_REMOVE_REFUSES: tuple[tuple[Any, str], ...] = (
    (lambda t: t.epochs is not None,
     "training.epochs reads the steps off the node sizes; give training.steps"),
    (lambda t: t.sample_rate is None,
     "without training.sample_rate the rate is b / J_min; give training.sample_rate (q)"),
    (lambda t: t.sampling == "per-node",
     "training.sampling = 'per-node' samples at b / J_i; use 'uniform' with training.sample_rate"),
)  # fmt: skip


def check_neighboring(privacy: PrivacySection, training: TrainingSection) -> None:
    """Refuse (one line) settings whose outputs would tell neighbouring data sets apart under
    ``privacy.neighboring``."""
    if privacy.neighboring != ADD_REMOVE:
        return
    for refused, why in _ADD_REMOVE_REFUSES:
        require(not refused(training),
                f"privacy.neighboring = 'add-remove' keeps node sizes secret, but {why}")


def _describe(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "config"
        if e["type"] == "extra_forbidden" and e["loc"] and e["loc"][-1] in REMOVED_KEYS:
            parts.append(f"{key}: {REMOVED_KEYS[e['loc'][-1]]}")
        elif e["type"] == "extra_forbidden":
            parts.append(f"{key}: unknown key")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            parts.append(f"{key}: {msg} (got {e.get('input')!r})")
    return "; ".join(parts)


M = TypeVar("M", bound=BaseModel)


def validate_config(model: type[M], config: dict[str, Any] | M, what: str = "config") -> M:
    """Validate a config dict against a pydantic model of any experiment kind.

    Raises DPDLError naming every offending dotted key ("training.lr: ...", "foo: unknown key").
    """
    if isinstance(config, model):
        return config
    if not isinstance(config, dict):
        raise DPDLError(f"a config must be a table/dict, got {type(config).__name__}")
    try:
        return model.model_validate(config)
    except ValidationError as err:
        raise DPDLError(f"invalid {what}: {_describe(err)}") from None




def with_overrides(model: type[M], given: M | dict[str, Any] | None, overrides: dict[str, Any],
                   what: str) -> M:  # fmt: skip
    """``given`` (settings, a dict of them, or None: the defaults) with each override that is
    not None, validated as one: errors name the offending key as :func:`validate_config`'s."""
    if isinstance(given, model):
        base = given.model_dump()
    elif given is None or isinstance(given, dict):
        base = dict(given or {})
    else:
        raise DPDLError(f"{what} must be a {model.__name__} or a dict, got {type(given).__name__}")
    return validate_config(model, base | {k: v for k, v in overrides.items() if v is not None},
                           what)  # fmt: skip
