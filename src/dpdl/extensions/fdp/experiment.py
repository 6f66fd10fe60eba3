"""The "fdp-random-walk" experiment kind: random-walk DP-SGD under PN-f-DP (MATH.md §7).

For every target ε the noise σ is calibrated with each accountant so that the worst ordered
pair (i → j) of the graph meets (ε, δ):

* ``pn-fdp`` — the certified PN-f-DP bound (revealed-mixture,
  :mod:`dpdl.extensions.fdp.accounting`),
* ``rdp-baseline`` — the pairwise RDP bound of Cyffers et al. 2024 (MATH.md §7),
* ``local`` — no amplification by the walk: each of the ⌊T/n⌋ contributions is seen as is
  (G_{√(k K_loc)·Δ/σ}),

then the training run is repeated with each σ, for every seed. Optionally DECOR is run with
σ calibrated by DECOR's own RDP conversion and by Sec-f-LDP for the same ε.

Secret randomness: the walk, the batches, the noise (and DECOR's pairwise secrets) of every
(algorithm, accountant, ε, seed) cell come from the cell's own secret stream
(:func:`dpdl.algorithms.randomness.numpy_secret_rng`): OS entropy by default, derived from the
seed only with ``experiment.entropy = "seed"`` (recorded as ``noise_entropy``).  Two cells
never share noise, so the accuracy gap between accountants is a difference of means over
seeds, not of one shared walk.

Random-walk DP-SGD: one token (a softmax-regression model) walks with the row-stochastic
W = Pᵀ of the topology; the holder takes K_loc steps θ ← θ − η(ḡ + N(0, σ²I)), ḡ the mean of
b per-record gradients each clipped to C (fixed-size batch, no subsampling amplification is
claimed), so the replace-one sensitivity of ḡ is Δ = 2C/b. A node past its ⌊T/n⌋
contributions only adds noise (the contribution cap that the accounting assumes).

Writes ``config.json``, ``metrics.csv`` (evaluations along training), ``results.json``,
``noise_accuracy.png`` and ``pairwise_epsilon.png`` under one run folder.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from dpdl.algorithms.randomness import secret_rng
from dpdl.errors import DPDLError, require
from dpdl.extensions.fdp.decor import RunOptions
from dpdl.extensions.fdp.models import MODEL_CLASSES, MODELS, make_model
from dpdl.training.results import std_or_none
from dpdl.training.run_folder import CellLog, RunFolder, resume_in_folder
from dpdl.training.settings import ConfigSection as _Section
from dpdl.training.settings import (
    Epsilons,
    NoiseEntropy,
    seeded_cell_name,
    validate_config,
)

ACCOUNTANTS = ("pn-fdp", "rdp-baseline", "local")
# The accountants that are amplification by iteration: they need a non-expansive hop map.
HIDDEN_STATE_ACCOUNTANTS = ("pn-fdp", "rdp-baseline")
KIND = "fdp-random-walk"


# The settings a cell names itself (seeded streams: dpdl.experiments.config.seeded_cell_name).
# privacy.assume_nonexpansive labels the epsilons and changes no draw.
_GRID = ("privacy.epsilons", "privacy.accountants", "train.include_non_private",
         "decor.accountants", "privacy.assume_nonexpansive")
# Settings added since the first runs, at the value that behaves as before they existed.
_LATER = {"data.normalize_rows": False, "train.model": "softmax", "train.hidden": 64,
          "train.init_seed": 0}


def _data(nodes: dict) -> tuple:
    return nodes["x"], nodes["y"], nodes["mask"]


class ExperimentSection(_Section):
    name: str = "fdp-random-walk"
    seeds: list[int] = Field(default_factory=lambda: [0])
    # Where the secret walk, batches and noise come from: "os" (default) or "seed".
    entropy: NoiseEntropy = "os"

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value):
        if not value or any(s < 0 for s in value):
            raise ValueError("give at least one seed, all >= 0")
        return value


class DataSection(_Section):
    dataset: str = "breast-cancer"
    data_dir: str | None = None
    nodes: int = Field(16, ge=2)
    split_seed: int = 0
    # Every record (train and test) scaled to unit L2 norm, a per-record map of public form:
    # the public bound R = 1 that proves softmax regression's hop map non-expansive.
    normalize_rows: bool = True


class GraphSection(_Section):
    topology: str = "hypercube"
    params: dict[str, Any] = Field(default_factory=dict)


class PrivacySection(_Section):
    epsilons: Epsilons = Field(default_factory=lambda: [1.0, 3.0, 10.0])
    delta: float = Field(1e-5, gt=0, lt=1)
    steps: int = Field(1600, ge=1)
    local_steps: int = Field(1, ge=1)
    # 2 = sqrt(2(R^2+1)) at R = 1: softmax regression's largest gradient, so the clip never
    # acts (what the hop-map proof needs; dpdl.extensions.fdp.models)
    clip: float = Field(2.0, gt=0)
    contraction: float = Field(1.0, gt=0, le=1)
    accountants: list[str] = Field(default_factory=lambda: list(ACCOUNTANTS))
    relative_slack: float = Field(1e-3, gt=0, lt=0.1)
    # The per-hop mu_t of the PN-f-DP bound (MATH.md §7): "lemma" is Lemma 4.3 of seed 003,
    # "table" the form of the script behind the paper's Table 3 (no contraction).
    hop_form: Literal["lemma", "table"] = "lemma"
    # Take the non-expansive hop map that pn-fdp and rdp-baseline rest on as given when it
    # is not proven (a neural network, an active clip): reproduces a paper's setting, and
    # those accountants' epsilon is then no guarantee (marked certified = false).
    assume_nonexpansive: bool = False

    @model_validator(mode="after")
    def _table_form_has_no_contraction(self):
        if self.hop_form == "table" and self.contraction != 1.0:
            raise ValueError(f"contraction = {self.contraction} needs hop_form = 'lemma' "
                             "(the table form has no contraction)")
        return self

    @field_validator("accountants")
    @classmethod
    def _accountants(cls, value):
        bad = [a for a in value if a not in ACCOUNTANTS]
        if bad or not value:
            raise ValueError(f"accountants must be a non-empty subset of {ACCOUNTANTS}")
        return value


class TrainSection(_Section):
    lr: float = Field(0.1, gt=0)
    batch_size: int = Field(8, ge=1)
    eval_every: int = Field(200, ge=1)
    # A non-private baseline is a noise-free function of the data: it runs only when asked.
    include_non_private: bool = False
    # The token's model (dpdl.extensions.fdp.models): softmax regression, or one hidden ReLU
    # layer of `hidden` units initialised from the public `init_seed`.
    model: Literal[MODELS] = "softmax"
    hidden: int = Field(64, ge=1)
    init_seed: int = Field(0, ge=0)


DECOR_RUNS = ("rdp-simple", "fdp", "local")


class DecorSection(_Section):
    enabled: bool = False
    sigma_cor: float = Field(10.0, ge=0)
    steps: int = Field(500, ge=1)
    lr: float = Field(0.05, gt=0)
    batch_size: int = Field(8, ge=1)
    # How σ is calibrated: DECOR's RDP conversion, Sec-f-LDP, or "local" (no secrets,
    # σ_cor = 0: every share alone is (ε, δ)-DP, composed exactly in GDP; seed 003 Figure 3)
    accountants: list[str] = Field(default_factory=lambda: ["rdp-simple", "fdp"])

    @field_validator("accountants")
    @classmethod
    def _accountants(cls, value):
        bad = [a for a in value if a not in DECOR_RUNS]
        if bad or not value or len(set(value)) != len(value):
            raise ValueError(f"decor.accountants must be distinct names from {DECOR_RUNS}, "
                             f"got {value}")
        return value


class FdpRandomWalkConfig(_Section):
    kind: str = KIND
    experiment: ExperimentSection = Field(default_factory=ExperimentSection)
    data: DataSection = Field(default_factory=DataSection)
    graph: GraphSection = Field(default_factory=GraphSection)
    privacy: PrivacySection = Field(default_factory=PrivacySection)
    train: TrainSection = Field(default_factory=TrainSection)
    decor: DecorSection = Field(default_factory=DecorSection)

    @field_validator("kind")
    @classmethod
    def _kind(cls, value):
        if value != KIND:
            raise ValueError(f"kind must be {KIND!r}")
        return value

    @model_validator(mode="after")
    def _accountants_hold_for_the_model(self):
        if self.decor.enabled and self.train.model != "softmax":
            raise ValueError(f"DECOR runs softmax regression only, got train.model = "
                             f"{self.train.model!r}; set decor.enabled = false")
        gap = hop_map_gap(self)
        if gap is not None and not self.privacy.assume_nonexpansive:
            raise ValueError(
                f"privacy.accountants {hidden_state_accountants(self)} need a non-expansive "
                f"hop map (amplification by iteration), not proven here: {gap}; use "
                "accountants = ['local'], or set privacy.assume_nonexpansive = true to "
                "reproduce a paper's setting (its epsilon is then no guarantee)")
        return self


def hidden_state_accountants(cfg: FdpRandomWalkConfig) -> list[str]:
    """The run's accountants that are amplification by iteration (HIDDEN_STATE_ACCOUNTANTS)."""
    return [a for a in cfg.privacy.accountants if a in HIDDEN_STATE_ACCOUNTANTS]


def hop_map_gap(cfg: FdpRandomWalkConfig) -> str | None:
    """Why the hop map that pn-fdp and rdp-baseline need is not proven non-expansive for
    this config (None: proven, or no such accountant is asked for)."""
    if not hidden_state_accountants(cfg):
        return None
    if cfg.privacy.contraction < 1:
        return (f"privacy.contraction = {cfg.privacy.contraction:g} < 1 needs a strongly "
                "convex loss, and the token's model has no such term")
    return MODEL_CLASSES[cfg.train.model].hop_map_gap(
        lr=cfg.train.lr, clip=cfg.privacy.clip,
        row_norm=1.0 if cfg.data.normalize_rows else None)


def certified(cfg: FdpRandomWalkConfig, accountant: str) -> bool:
    """Whether ``accountant``'s epsilon is a guarantee for this run."""
    return accountant not in HIDDEN_STATE_ACCOUNTANTS or hop_map_gap(cfg) is None


def parse_config(config: dict[str, Any] | FdpRandomWalkConfig) -> FdpRandomWalkConfig:
    """Validate a config; raises DPDLError naming every offending key."""
    return validate_config(FdpRandomWalkConfig, config, f"{KIND} config")


def apply_overrides(config: dict, **overrides) -> dict:
    """``dpdl run`` flags: --seed replaces the seeds, --steps the walk length T, --entropy
    the source of the secret randomness; others (--device, --runtime) are refused."""
    config = json.loads(json.dumps(config))
    unsupported = sorted(k for k, v in overrides.items()
                         if v is not None and k not in ("seed", "steps", "entropy"))
    if unsupported:
        flags = ", ".join("--" + k.replace("_", "-") for k in unsupported)
        raise DPDLError(f"{flags} not supported for experiment kind {KIND!r}")
    if overrides.get("entropy") is not None:
        config.setdefault("experiment", {})["entropy"] = overrides["entropy"]
    if overrides.get("seed") is not None:
        config.setdefault("experiment", {})["seeds"] = [int(overrides["seed"])]
    if overrides.get("steps") is not None:
        config.setdefault("privacy", {})["steps"] = int(overrides["steps"])
    return config


def walk_matrix_of(topology) -> np.ndarray:
    """The row-stochastic walk matrix W = Pᵀ of a static topology (P column-stochastic)."""
    require(topology.period == 1,
            f"topology {topology.name!r} is time-varying (period {topology.period}); "
            "the random-walk accounting needs a static graph")
    return np.ascontiguousarray(topology.mixing_matrix(0).T)


def sample_walk(walk: np.ndarray, steps: int, rng: np.random.Generator) -> np.ndarray:
    """Token holders h_0..h_{T-1}: h_0 uniform, then h_{t+1} ~ W[h_t, ·]."""
    n = walk.shape[0]
    cumulative = np.cumsum(walk, axis=1)
    cumulative[:, -1] = 1.0
    uniforms = rng.random(steps)
    path = np.empty(steps, dtype=np.int64)
    path[0] = rng.integers(n)
    for t in range(1, steps):  # a Markov chain is sequential by nature
        path[t] = np.searchsorted(cumulative[path[t - 1]], uniforms[t], side="right")
    return np.minimum(path, n - 1)


_DEFAULT_RUN_OPTIONS = RunOptions()


@dataclass(frozen=True)
class VisitSettings:
    """What the token holder does at each visit of :func:`random_walk_dp_sgd`: ``local_steps``
    noisy updates on batches of ``batch_size`` records, for at most ``cap`` contributing
    visits per node (None: uncapped; later visits only add noise)."""

    batch_size: int
    local_steps: int = 1
    cap: int | None = None


def random_walk_dp_sgd(walk: np.ndarray, x_nodes: np.ndarray, y_nodes: np.ndarray, *,
                       num_classes: int, steps: int, lr: float, clip: float, sigma: float,
                       visits: VisitSettings, mask: np.ndarray | None = None, model=None,
                       options: RunOptions = _DEFAULT_RUN_OPTIONS) -> dict:
    """Random-walk DP-SGD (MATH.md §7) on stacked node data; returns the final model, the
    evaluation history and the contribution count of every node.

    The walk, batches and noise are secret: ``options.seed`` is a Generator/SeedSequence (a
    cell's stream), None (OS entropy) or an int (reproducible).  ``sigma`` must be > 0; the
    noise-free baseline needs ``options.unsafe_zero_noise`` and is not private.  ``model`` is
    one of :mod:`dpdl.extensions.fdp.models` (None: softmax regression).  This function does
    not check the hop map: a pn-fdp or rdp-baseline σ covers it only where the step is
    non-expansive (:func:`hop_map_gap`, which the experiment's config enforces)."""
    from dpdl.algorithms.noise import release_numpy
    from dpdl.algorithms.randomness import check_noise_std
    from dpdl.extensions.fdp.decor import sample_batches

    batch_size, local_steps, cap = visits.batch_size, visits.local_steps, visits.cap
    seed, eval_every, eval_data = options.seed, options.eval_every, options.eval_data
    sigma = check_noise_std(sigma, options.unsafe_zero_noise)

    n = walk.shape[0]
    x_nodes = np.asarray(x_nodes, dtype=np.float64).reshape(n, x_nodes.shape[1], -1)
    mask = np.ones(y_nodes.shape, dtype=bool) if mask is None else mask
    if model is None:
        model = make_model("softmax", features=x_nodes.shape[2], classes=num_classes)
    rng = secret_rng(seed)
    path = sample_walk(walk, steps, rng)
    theta = model.initial()
    contributions = np.zeros(n, dtype=np.int64)
    history = []
    visits_iter = path
    if options.progress:
        from tqdm import tqdm

        visits_iter = tqdm(path, desc="random walk", leave=False, disable=None)
    for t, holder in enumerate(visits_iter):
        contributes = cap is None or contributions[holder] < cap
        contributions[holder] += int(contributes)
        for _ in range(local_steps):
            # the noisy gradient released exactly, round_g(gradient + σN) (MATH.md §10)
            if contributes:
                batch = sample_batches(mask[holder:holder + 1], batch_size, rng)[0]
                step = model.clipped_mean_gradient(theta, x_nodes[holder, batch],
                                                   y_nodes[holder, batch], clip)
            else:
                step = np.zeros_like(theta)
            theta = theta - lr * release_numpy(step, sigma, rng)
        if eval_data is not None and eval_every and ((t + 1) % eval_every == 0 or t + 1 == steps):
            loss, accuracy = model.loss_accuracy(theta, *eval_data)
            history.append({"step": t + 1, "loss": loss, "accuracy": accuracy})
    return {"theta": theta, "history": history, "contributions": contributions}


def calibrate_noise(accountant: str, walk: np.ndarray, *, epsilon: float, cfg: PrivacySection,
                    sensitivity: float) -> float:
    """σ that makes the worst pair meet (ε, δ) under ``accountant`` (pn-fdp and rdp-baseline:
    for a non-expansive hop map, which the caller must ensure: :func:`hop_map_gap`)."""
    from dpdl.accounting.gdp import mu_from_epsilon_delta
    from dpdl.extensions.fdp import accounting as fdp

    n = walk.shape[0]
    if accountant == "pn-fdp":
        return fdp.calibrate_sigma_pnfdp(
            walk, steps=cfg.steps, target_epsilon=epsilon, delta=cfg.delta,
            bound=fdp.BoundSettings(sensitivity=sensitivity, local_steps=cfg.local_steps,
                                    contraction=cfg.contraction,
                                    relative_slack=cfg.relative_slack, hop_form=cfg.hop_form))
    if accountant == "rdp-baseline":
        return fdp.calibrate_sigma_rdp_baseline(
            walk, steps=cfg.steps, target_epsilon=epsilon, delta=cfg.delta,
            sensitivity=sensitivity * math.sqrt(cfg.local_steps))
    k = fdp.composition_count(n, cfg.steps)
    return math.sqrt(k * cfg.local_steps) * sensitivity / mu_from_epsilon_delta(epsilon, cfg.delta)


def _load_nodes(cfg: FdpRandomWalkConfig) -> dict:
    from dpdl.data import load_dataset, partition, stack_node_data

    data = load_dataset(cfg.data.dataset, data_dir=cfg.data.data_dir, seed=cfg.data.split_seed)
    require(data.task == "classification",
            f"dataset {cfg.data.dataset!r} is not a classification task")
    x_train = data.x_train.reshape(len(data.x_train), -1).astype(np.float64)
    x_test = data.x_test.reshape(len(data.x_test), -1).astype(np.float64)
    if cfg.data.normalize_rows:  # the norm bound R = 1 the hop-map proof uses
        x_train, x_test = _unit_rows(x_train), _unit_rows(x_test)
    parts = partition(data.y_train, cfg.data.nodes, scheme="iid", seed=cfg.data.split_seed)
    # unnormalised runs stack the loader's arrays as before: the seeded streams digest them
    x, y, mask = stack_node_data(x_train if cfg.data.normalize_rows else data.x_train,
                                 data.y_train, parts)
    smallest = int(mask.sum(axis=1).min())
    require(cfg.train.batch_size <= smallest,
            f"train.batch_size={cfg.train.batch_size} exceeds the smallest node ({smallest})")
    num_classes = int(data.num_classes)
    model = make_model(cfg.train.model, features=x_train.shape[1], classes=num_classes,
                       hidden=cfg.train.hidden, init_seed=cfg.train.init_seed)
    return {"name": data.name, "x": x, "y": y, "mask": mask, "eval": (x_test, data.y_test),
            "num_classes": num_classes, "model": model}


def _unit_rows(rows: np.ndarray) -> np.ndarray:
    """Each record scaled to L2 norm 1 (zero records stay zero), then nudged inside the unit
    ball, so no rounding leaves a norm above the R = 1 the proof assumes."""
    from dpdl.data.preprocessing import l2_normalize_rows

    rows = l2_normalize_rows(rows).astype(np.float64)
    return rows / np.maximum(1.0, np.linalg.norm(rows, axis=1, keepdims=True))


def run_experiment(config: dict, output_dir: Path, *, progress: bool = True,
                   run_name: str | None = None, resume: bool = False) -> dict:
    """Calibrate σ per (ε, accountant), train, and write the run folder (see module doc).
    Every calibration and finished (cell, seed) is logged in ``cells.jsonl``; ``resume=True``
    (see :func:`resume_experiment`) reuses those of the folder ``output_dir/run_name``."""
    from dpdl.extensions.fdp import accounting as fdp
    from dpdl.topology import make_topology

    cfg = parse_config(config)
    _warn_if_assumed(cfg)
    topology = make_topology(cfg.graph.topology, cfg.data.nodes, seed=cfg.data.split_seed,
                             **cfg.graph.params)
    walk = walk_matrix_of(topology)
    nodes = _load_nodes(cfg)
    cap = fdp.composition_count(cfg.data.nodes, cfg.privacy.steps)
    sensitivity = 2 * cfg.privacy.clip / cfg.train.batch_size
    folder = RunFolder.create(Path(output_dir), cfg.experiment.name, run_name, exist_ok=resume)
    if not resume:
        folder.write_config(cfg.model_dump())
    log = CellLog(folder / CellLog.FILE, cfg.model_dump(mode="json"))
    cells = _calibrated_cells(cfg, walk, sensitivity, log)
    metric_rows: list[dict] = []
    table = _run_random_walk(cfg, walk, nodes, cells, cap, metric_rows, log, progress=progress)
    if cfg.decor.enabled:
        table += _run_decor(cfg, topology, nodes, metric_rows, cfg.experiment.entropy, log)
    return _write_outputs(folder, cfg, topology, walk, nodes, cells, cap=cap,
                          sensitivity=sensitivity, metric_rows=metric_rows, table=table)


def _warn_if_assumed(cfg: FdpRandomWalkConfig) -> None:
    """One line on stderr when an accountant's epsilon rests on an assumed hop map."""
    import sys

    gap = hop_map_gap(cfg)
    if gap is not None:
        print(f"warning: privacy.assume_nonexpansive = true: {gap}, so the pn-fdp and "
              "rdp-baseline epsilons are no guarantee (results mark them certified = false)",
              file=sys.stderr)


def resume_experiment(run_dir: str | Path, *, progress: bool = True) -> dict:
    """Continue an interrupted run folder with its saved ``config.json``: the calibrations
    and (cell, seed) runs in its ``cells.jsonl`` are reused, the others computed."""
    return resume_in_folder(run_dir, run_experiment, progress=progress)


def _calibrated_cells(cfg: FdpRandomWalkConfig, walk: np.ndarray, sensitivity: float,
                      log: CellLog) -> list[tuple[str, float | None, float]]:
    """(accountant, target ε, σ) of every random-walk cell; the non-private one last."""
    cells: list[tuple[str, float | None, float]] = []
    for epsilon in cfg.privacy.epsilons:
        for accountant in cfg.privacy.accountants:
            sigma = log.get_or_run(("sigma", accountant, epsilon), partial(
                calibrate_noise, accountant, walk, epsilon=epsilon, cfg=cfg.privacy,
                sensitivity=sensitivity))  # fmt: skip
            cells.append((accountant, epsilon, sigma))
    if cfg.train.include_non_private:
        cells.append(("non-private", None, 0.0))
    return cells


def _run_random_walk(cfg: FdpRandomWalkConfig, walk: np.ndarray, nodes: dict, cells: list,
                     cap: int, metric_rows: list, log: CellLog, *,
                     progress: bool) -> list[dict]:
    """Train every cell for every seed; appends the metric rows, returns the table rows."""
    entropy, table = cfg.experiment.entropy, []
    iterator = cells
    if progress:
        from tqdm import tqdm

        # disable=None: off outside a terminal, so logs keep no bar
        iterator = tqdm(cells, desc=cfg.experiment.name, leave=False, disable=None)
    for accountant, epsilon, sigma in iterator:
        finals = []
        for seed in cfg.experiment.seeds:
            history = log.get_or_run(("random-walk", accountant, epsilon, seed), partial(
                _random_walk_history, cfg, walk, nodes, accountant, epsilon, sigma, cap, seed))
            for h in history:
                metric_rows.append({"algorithm": "random-walk", "accountant": accountant,
                                    "epsilon": epsilon, "sigma": sigma, "seed": seed, **h})
            finals.append(history[-1])
        table.append({**_table_row("random-walk", accountant, epsilon, sigma, finals, entropy),
                      # the non-private baseline has no epsilon to certify
                      "certified": None if epsilon is None else certified(cfg, accountant)})
    return table


def _random_walk_history(cfg: FdpRandomWalkConfig, walk: np.ndarray, nodes: dict,
                         accountant: str, epsilon: float | None, sigma: float, cap: int,
                         seed: int) -> list[dict]:
    """One random-walk cell and seed, on the cell's own secret stream; its evaluation history
    (``epsilon`` None: the non-private baseline, uncapped)."""
    from dpdl.algorithms.randomness import numpy_secret_rng

    privacy, cell = cfg.privacy, f"random-walk|{accountant}|{epsilon!r}"
    out = random_walk_dp_sgd(
        walk, nodes["x"], nodes["y"], mask=nodes["mask"], num_classes=nodes["num_classes"],
        steps=privacy.steps, lr=cfg.train.lr, clip=privacy.clip, sigma=sigma,
        visits=VisitSettings(batch_size=cfg.train.batch_size, local_steps=privacy.local_steps,
                             cap=cap if epsilon is not None else None),
        model=nodes["model"],
        options=RunOptions(
            seed=numpy_secret_rng(seed, cfg.experiment.entropy,
                                  seeded_cell_name(cfg, cell, _GRID, _data(nodes), _LATER)),
            eval_every=cfg.train.eval_every, eval_data=nodes["eval"],
            unsafe_zero_noise=epsilon is None))  # the non-private baseline
    return _plain(out["history"])


METRIC_FIELDS = ("algorithm", "accountant", "epsilon", "sigma", "seed", "step", "loss",
                 "accuracy")  # fmt: skip


def _write_outputs(folder: RunFolder, cfg: FdpRandomWalkConfig, topology, walk: np.ndarray,
                   nodes: dict, cells: list, *, cap: int, sensitivity: float,
                   metric_rows: list, table: list) -> dict:
    """metrics.csv, the plots and results.json (with the pairwise-ε summary); returns it."""
    from dpdl.extensions.fdp import accounting as fdp

    privacy = cfg.privacy
    # the heat map shows the pairwise ε at the σ calibrated for the first target ε listed
    shown_sigma = next((s for a, _, s in cells if a == "pn-fdp"),
                       next(s for _, e, s in cells if e is not None))
    report = fdp.pnfdp_epsilon_matrix(
        walk, steps=privacy.steps, sigma=shown_sigma, delta=privacy.delta,
        bound=fdp.BoundSettings(sensitivity=sensitivity, local_steps=privacy.local_steps,
                                contraction=privacy.contraction,
                                relative_slack=privacy.relative_slack,
                                hop_form=privacy.hop_form))
    folder.write_records_csv("metrics.csv", metric_rows, METRIC_FIELDS)
    results = {
        "kind": KIND, "run_dir": str(folder.path), "dataset": nodes["name"],
        "topology": topology.name, "nodes": cfg.data.nodes, "steps": privacy.steps,
        "compositions": cap, "sensitivity": sensitivity, "delta": privacy.delta,
        "noise_entropy": cfg.experiment.entropy, "model": cfg.train.model,
        "hop_map": {"nonexpansive_gap": hop_map_gap(cfg),
                    "assumed": cfg.privacy.assume_nonexpansive},
        # pn-fdp and rdp-baseline bound what each node sees of the token at its visits; the
        # evaluations of the token at other times are a simulation view (THREAT_MODEL)
        "unaccounted_outputs": _unaccounted_outputs(cfg),
        "table": table, "pairwise": report.summary(),
        "files": ["config.json", "metrics.csv", "results.json", "noise_accuracy.png",
                  "pairwise_epsilon.png", CellLog.FILE],
    }
    _plot_noise_accuracy(folder / "noise_accuracy.png", table, cfg)
    _plot_matrix(folder / "pairwise_epsilon.png", report.epsilon,
                 f"PN-f-DP ε, {topology.name} n={cfg.data.nodes}, σ={report.sigma:.3g}"
                 + ("" if certified(cfg, "pn-fdp") else " (hop map assumed: no guarantee)"))
    folder.write_results(results)
    return results


def _unaccounted_outputs(cfg: FdpRandomWalkConfig) -> list[str]:
    """What this run writes that no accountant's epsilon covers."""
    hidden = hidden_state_accountants(cfg)
    out = []
    if hidden:
        out.append(f"the {'/'.join(hidden)} epsilons cover each node's views of the token at "
                   "its visits only: metrics.csv and the table's accuracies evaluate the "
                   "token every train.eval_every steps and at the end")
    if cfg.train.include_non_private:
        out.append("the non-private baseline (no noise) and its evaluations")
    return out


def _table_row(algorithm: str, accountant: str, epsilon, sigma: float, finals: list,
               entropy: str) -> dict:
    accuracies = np.array([f["accuracy"] for f in finals])
    return {"algorithm": algorithm, "accountant": accountant, "epsilon": epsilon, "sigma": sigma,
            "noise_entropy": entropy,
            "accuracy_mean": float(accuracies.mean()), "accuracy_std": std_or_none(accuracies),
            "loss_mean": float(np.mean([f["loss"] for f in finals]))}


def _plain(history: list[dict]) -> list[dict]:
    """An evaluation history as plain JSON numbers (the cell log's form)."""
    return [{k: (int(v) if k == "step" else float(v)) for k, v in h.items()} for h in history]


def _run_decor(cfg: FdpRandomWalkConfig, topology, nodes: dict, metric_rows: list,
               entropy: str, log: CellLog) -> list:
    """DECOR with σ from its RDP conversion, from Sec-f-LDP, and (``local``) without secrets
    at local DP, for each ε."""
    from dpdl.extensions.fdp.accounting import calibrate_sigma_decor

    require(not topology.directed, f"DECOR needs an undirected topology, got {topology.name!r}")
    W = topology.mixing_matrix(0)
    rows = []
    for epsilon in cfg.privacy.epsilons:
        for accountant in cfg.decor.accountants:
            # local DP: no secrets, and σ_cor = 0 makes the Sec-f-LDP bound exactly GDP
            sigma_cor = 0.0 if accountant == "local" else cfg.decor.sigma_cor
            sigma = log.get_or_run(("decor-sigma", accountant, epsilon), partial(
                calibrate_sigma_decor, W, sigma_cor=sigma_cor, target_epsilon=epsilon,
                steps=cfg.decor.steps, delta=cfg.privacy.delta, clip=cfg.privacy.clip,
                accountant="fdp" if accountant == "local" else accountant))  # fmt: skip
            finals = []
            for seed in cfg.experiment.seeds:
                history = log.get_or_run(("decor", accountant, epsilon, seed), partial(
                    _decor_history, cfg, W, nodes, f"decor|{accountant}|{epsilon!r}", sigma,
                    sigma_cor, seed))  # fmt: skip
                for h in history:
                    metric_rows.append({"algorithm": "decor", "accountant": accountant,
                                        "epsilon": epsilon, "sigma": sigma, "seed": seed, **h})
                finals.append(history[-1])
            rows.append(_table_row("decor", accountant, epsilon, sigma, finals, entropy))
    return rows


def _decor_history(cfg: FdpRandomWalkConfig, W: np.ndarray, nodes: dict, cell: str,
                   sigma: float, sigma_cor: float, seed: int) -> list[dict]:
    """One DECOR cell and seed, on the cell's own secret stream; its evaluation history."""
    from dpdl.algorithms.randomness import numpy_secret_rng
    from dpdl.extensions.fdp.decor import run_decor

    out = run_decor(W, nodes["x"], nodes["y"], mask=nodes["mask"],
                    num_classes=nodes["num_classes"], steps=cfg.decor.steps, lr=cfg.decor.lr,
                    clip=cfg.privacy.clip, sigma=sigma, sigma_cor=sigma_cor,
                    batch_size=cfg.decor.batch_size, options=RunOptions(
                        seed=numpy_secret_rng(seed, cfg.experiment.entropy, seeded_cell_name(
                            cfg, cell, _GRID, _data(nodes), _LATER)),
                        eval_every=cfg.train.eval_every, eval_data=nodes["eval"]))
    return _plain(out.history)


def _plot_noise_accuracy(path: Path, table: list[dict], cfg: FdpRandomWalkConfig) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, (ax_noise, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    keys = sorted({(r["algorithm"], r["accountant"]) for r in table if r["epsilon"] is not None})
    for algorithm, accountant in keys:
        rows = sorted((r for r in table if (r["algorithm"], r["accountant"]) == (algorithm,
                                                                                 accountant)),
                      key=lambda r: r["epsilon"])
        eps = [r["epsilon"] for r in rows]
        label = f"{algorithm} / {accountant}" + (
            "" if rows[0].get("certified", True) else " (assumed hop map: no guarantee)")
        ax_noise.plot(eps, [r["sigma"] for r in rows], marker="o", label=label)
        ax_acc.errorbar(eps, [r["accuracy_mean"] for r in rows],
                        # None (one seed) -> NaN: no error bar
                        yerr=np.array([r["accuracy_std"] for r in rows], dtype=float),
                        marker="o", label=label)
    for r in table:
        if r["epsilon"] is None:
            ax_acc.axhline(r["accuracy_mean"], color="grey", linestyle=":", label="non-private")
    ax_noise.set_xscale("log")
    ax_noise.set_yscale("log")
    ax_noise.set_xlabel(f"target ε (δ = {cfg.privacy.delta:g}), worst pair")
    ax_noise.set_ylabel("calibrated noise σ")
    ax_acc.set_xscale("log")
    ax_acc.set_xlabel("target ε")
    ax_acc.set_ylabel("test accuracy")
    ax_noise.legend(fontsize="small")
    ax_acc.legend(fontsize="small")
    fig.suptitle(f"{cfg.experiment.name}: {cfg.data.dataset}, {cfg.graph.topology} "
                 f"n={cfg.data.nodes}, T={cfg.privacy.steps}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_matrix(path: Path, matrix: np.ndarray, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    image = ax.imshow(matrix, cmap="viridis")
    fig.colorbar(image, ax=ax, label="ε (certified upper bound)")
    ax.set_xlabel("observer j")
    ax.set_ylabel("source i")
    ax.set_title(title, fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
