"""The ``netdp-logreg`` experiment: logistic regression with local, network and centralized
DP-SGD along a random walk (MATH.md §6, seed 002 Section 5 / Figure 2).

Every user holds ``records_per_user`` records (8 in the paper) and, when it holds the token,
takes a projected gradient step on its whole local data set (A4). User-level replace-one
adjacency: the clipped gradient (norm ≤ L) has sensitivity 2L. Each approach gets its own noise
σ for the target (ε, δ):

* ``local``: every noisy gradient is seen; a user contributes at most cap = ⌈cT/n⌉ times, so
  the cap Gaussian releases compose exactly (GDP): σ = 2L √cap / μ(ε, δ). Past the cap a user
  forwards the token untouched.
* ``network``: the walk is sampled first (it is data independent), then σ is the smallest
  noise making *every* pair (u, v) (ε, δ)-DP on that walk by the empirical accountant
  (privacy amplification by iteration, ``dpdl.extensions.netdp.accounting.pairwise_costs``,
  which needs
  η ≤ 2/β with β = max‖x‖²/4, and clipping that never bites, clip ≥ L = max‖x‖, so every
  step is a contraction; both are enforced). Past the cap a user adds noise only.
* ``central``: a trusted curator runs DP-SGD on one uniformly drawn user per step (sampling
  without replacement of 1 out of n, replace-one), accounted by ``dp_accounting``'s RDP
  accountant and calibrated with its ``calibrate_dp_mechanism``.

Secret randomness: every (approach, ε, seed) cell draws its own walk (or, for ``central``, its
users), and its own noise, from a secret stream
(:func:`dpdl.algorithms.randomness.numpy_secret_rng`): OS entropy by default, derived from the
seed only with ``experiment.entropy = "seed"`` (recorded as ``noise_entropy``).  The network
calibration reads its cell's realised walk in memory; the walk is never written.

Data: scikit-learn's breast-cancer set with the paper's preprocessing (standardise, then each
row to unit L2 norm; ``dpdl.data``), or a user-supplied CSV such as OpenML 823 (binarised UCI
Housing) through ``data.csv``; a binary task from a multi-class set with
``data.positive_classes`` (and ``data.normalize_rows``). Run folder: ``config.json``,
``metrics.csv`` (test accuracy and loss against steps for every approach, ε, seed),
``results.json`` (with the seed-paired ``comparisons`` of the approaches), ``curves.png``.

A ``[tune]`` table (``lr_grid``, ``selection_seeds``, ``validation_records``) first chooses
every approach's step size at every ε on validation records no user holds, over the same grid
(:mod:`dpdl.extensions.netdp.tuning`); the picks replace ``algorithm.lr`` for the test seeds,
and ``selection.csv`` and ``results.json["tuning"]`` say what every grid point scored.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, field_validator, model_serializer

from dpdl.errors import DPDLError
from dpdl.plotting import PALETTE, band, legend_outside, pyplot, save_figure, spans_decades, styled
from dpdl.training.results import std_or_none
from dpdl.training.run_folder import CellLog, RunFolder, resume_in_folder
from dpdl.training.settings import ConfigSection as _Section
from dpdl.training.settings import (
    Epsilons,
    NoiseEntropy,
    seeded_cell_name,
    validate_config,
)

APPROACHES = ("local", "network", "central")
NON_PRIVATE = "non-private"


class ExperimentSection(_Section):
    name: str = "netdp-logreg"
    seeds: list[int] = Field(default_factory=lambda: [0])
    # Where the secret walk and noise come from: "os" (default) or "seed" (reproducible).
    entropy: NoiseEntropy = "os"

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, value):
        if not value:
            raise ValueError("give at least one seed")
        return value


class DataSection(_Section):
    dataset: str = "breast-cancer"
    csv: str | None = None  # e.g. the OpenML 823 (binarised Housing) CSV
    binarize: str | float | None = None  # for a numeric CSV label, e.g. "median"
    records_per_user: int = Field(8, ge=1)
    split_seed: int = 0
    # A binary task from a multi-class set (e.g. Fashion-MNIST, issue 28): label +1 for these
    # classes, -1 for the others.
    positive_classes: list[int] | None = Field(None, min_length=1)
    # Every record (train and test) scaled to unit L2 norm: a per-record map of public form,
    # what the 1-Lipschitz loss needs (MATH.md §6) for sets that are not normalised.
    normalize_rows: bool = False
    max_users: int | None = Field(None, ge=2)  # keep the first of the seeded shuffle's users

    @model_serializer(mode="wrap")
    def _without_later_defaults(self, handler):
        # the settings added since the first runs are left out at their defaults: the seeded
        # cells' names digest the dump, so earlier runs keep their noise and their folders
        dumped = handler(self)
        for key, default in _LATER_DATA_DEFAULTS.items():
            if dumped.get(key, default) == default:
                dumped.pop(key, None)
        return dumped


_LATER_DATA_DEFAULTS = {"positive_classes": None, "normalize_rows": False, "max_users": None}


class StepSizes(_Section):
    local: float = Field(0.05, gt=0)
    network: float = Field(0.5, gt=0)
    central: float = Field(0.5, gt=0)
    non_private: float = Field(1.0, gt=0)


class AlgorithmSection(_Section):
    steps: int = Field(2000, ge=1)
    cap_factor: float = Field(1.5, gt=0)  # c in the cap ceil(c T / n)
    clip: float = Field(1.0, gt=0)  # L
    radius: float | None = Field(None, gt=0)  # W = l2 ball; None = R^d
    eval_every: int = Field(100, ge=1)
    lr: StepSizes = Field(default_factory=StepSizes)


class PrivacySection(_Section):
    epsilons: Epsilons = Field(default_factory=lambda: [1.0, 10.0])
    delta: float = Field(1e-6, gt=0, lt=1)
    approaches: list[str] = Field(default_factory=lambda: list(APPROACHES))
    # A non-private baseline is a noise-free function of the data: it runs only when asked.
    include_non_private: bool = False

    @field_validator("approaches")
    @classmethod
    def _approaches(cls, value):
        bad = [a for a in value if a not in APPROACHES]
        if bad or not value:
            raise ValueError(f"approaches must be a non-empty subset of {APPROACHES}")
        return value


class TuneSection(_Section):
    """Step sizes chosen on validation records (``dpdl.extensions.netdp.tuning``): every
    approach gets this grid at every ε; the picks replace ``algorithm.lr`` for the test seeds
    (``experiment.seeds``)."""

    lr_grid: list[float] = Field(min_length=2)
    selection_seeds: list[int] = Field(min_length=1)
    # records of the training split that no user holds, declared public (THREAT_MODEL)
    validation_records: int = Field(ge=1)

    @field_validator("lr_grid")
    @classmethod
    def _grid(cls, value):
        bad = [v for v in value if not (math.isfinite(v) and v > 0)]
        if bad:
            raise ValueError(f"every step size must be finite and > 0, got {bad}")
        if len(set(value)) != len(value):
            raise ValueError(f"step sizes repeat in {value}")
        return value


class NetDPLogRegConfig(_Section):
    kind: str = "netdp-logreg"
    experiment: ExperimentSection = Field(default_factory=ExperimentSection)
    data: DataSection = Field(default_factory=DataSection)
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    privacy: PrivacySection = Field(default_factory=PrivacySection)
    tune: TuneSection | None = None

    @model_serializer(mode="wrap")
    def _without_tune_when_off(self, handler):
        dumped = handler(self)  # untuned configs dump as before: their cells keep their noise
        if dumped.get("tune") is None:
            dumped.pop("tune", None)
        return dumped

    @field_validator("kind")
    @classmethod
    def _kind(cls, value):
        if value != "netdp-logreg":
            raise ValueError("kind must be 'netdp-logreg'")
        return value


def parse_config(config: dict[str, Any] | NetDPLogRegConfig) -> NetDPLogRegConfig:
    """Validate a ``netdp-logreg`` config; raises DPDLError naming every offending key."""
    cfg = validate_config(NetDPLogRegConfig, config, "netdp-logreg config")
    if cfg.tune is not None:
        shared = sorted(set(cfg.tune.selection_seeds) & set(cfg.experiment.seeds))
        if shared:
            raise DPDLError(f"tune.selection_seeds and experiment.seeds share {shared}: the "
                            "test seeds must be fresh")
    return cfg


# ------------------------------------------------------------------------------ data and model
def load_users(cfg: NetDPLogRegConfig) -> dict[str, Any]:
    """Users' data (n, J, d) with labels in {−1, +1}, and the test set; rows have norm ≤ 1."""
    from dpdl.data import load_dataset

    if cfg.data.csv is not None:
        from dpdl.data.csv_loader import load_csv

        ds = load_csv(cfg.data.csv, seed=cfg.data.split_seed, task="classification",
                      binarize=cfg.data.binarize, normalize_rows=True)
    else:
        ds = load_dataset(cfg.data.dataset, seed=cfg.data.split_seed)
    ds = _binary_task(ds, cfg.data.positive_classes)
    if ds.task != "classification" or ds.num_classes != 2:
        raise DPDLError(f"data: netdp-logreg needs a binary classification set, got "
                        f"{ds.name!r} ({ds.task}, {ds.num_classes} classes)")
    x = np.asarray(ds.x_train, dtype=float).reshape(len(ds.y_train), -1)
    x_test = np.asarray(ds.x_test, dtype=float).reshape(len(ds.y_test), -1)
    if cfg.data.normalize_rows:
        x, x_test = (rows / np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-300)
                     for rows in (x, x_test))  # fmt: skip
    norms = np.linalg.norm(np.vstack([x, x_test]), axis=1)
    if norms.max() > 1 + 1e-6:  # the 1-Lipschitz claim (L = 1) relies on it: fail closed
        raise DPDLError(f"data: rows must have L2 norm <= 1 (got {norms.max():.4g}); "
                        "normalise rows (MATH.md §6)")
    # float32 storage leaves norms of 1 + 1e-8: bring them back inside the unit ball
    x = x / np.maximum(1.0, np.linalg.norm(x, axis=1, keepdims=True))
    x_test = x_test / np.maximum(1.0, np.linalg.norm(x_test, axis=1, keepdims=True))
    J = cfg.data.records_per_user
    held = 0 if cfg.tune is None else cfg.tune.validation_records  # no user holds these
    n = (len(ds.y_train) - held) // J
    if cfg.data.max_users is not None:
        n = min(n, cfg.data.max_users)
    if n < 2:
        raise DPDLError(f"data.records_per_user = {J} leaves fewer than 2 users"
                        + (f" beside tune.validation_records = {held}" if held else ""))
    shuffled = np.random.default_rng(cfg.data.split_seed).permutation(len(ds.y_train))
    order, validation = shuffled[held: held + n * J], shuffled[:held]
    signs = lambda labels: np.where(np.asarray(labels) == 1, 1.0, -1.0)  # noqa: E731
    return {
        "x": x[order].reshape(n, J, -1), "y": signs(ds.y_train)[order].reshape(n, J),
        "x_test": x_test, "y_test": signs(ds.y_test),
        "x_val": x[validation], "y_val": signs(ds.y_train)[validation],
        "n": n, "dim": x.shape[1], "name": ds.name,
        # the domain's constants (every record, a replaced user's too, has norm <= 1, which
        # is enforced above), not the realised records': the contraction argument needs the
        # replaced user's steps to contract as well
        "smoothness": 0.25,
    }


def _binary_task(ds, positive: list[int] | None):
    """``ds`` with labels 1 for the ``positive`` classes and 0 for the rest (as it is when
    None); one-line errors for classes the set does not have or a split with one side empty."""
    if positive is None:
        return ds
    if ds.task != "classification" or not ds.num_classes:
        raise DPDLError(f"data.positive_classes needs a classification set, got {ds.name!r}")
    bad = [c for c in positive if not 0 <= c < ds.num_classes]
    if bad:
        raise DPDLError(f"data.positive_classes: {bad} not among the {ds.num_classes} classes "
                        f"of {ds.name!r} (0..{ds.num_classes - 1})")  # fmt: skip
    if len(set(positive)) == ds.num_classes:
        raise DPDLError("data.positive_classes holds every class: no negative records left")
    from dataclasses import replace

    to_binary = lambda y: np.isin(y, positive).astype(np.int64)  # noqa: E731
    return replace(ds, y_train=to_binary(ds.y_train), y_test=to_binary(ds.y_test),
                   num_classes=2, name=f"{ds.name} (classes {sorted(set(positive))} vs rest)")


def _logistic_loss(w, x, y) -> float:
    return float(np.mean(np.logaddexp(0.0, -y * (x @ w))))


def _user_gradient(data):
    x_all, y_all = data["x"], data["y"]

    def gradient(w: np.ndarray, u: int) -> np.ndarray:
        x, y = x_all[u], y_all[u]
        margin = y * (x @ w)
        # d/dw log(1 + e^{-m}) = -y x σ(-m); expit via tanh keeps it stable
        weight = 0.5 * (1 - np.tanh(margin / 2))
        return -(x * (y * weight)[:, None]).mean(axis=0)

    return gradient


def _evaluator(data, split: str = "test"):
    """Metrics on public records only (``test``, or ``val`` for the step-size selection): the
    users' training records are private, and a training loss would be a noise-free function of
    them."""
    x_eval, y_eval = data[f"x_{split}"], data[f"y_{split}"]

    def evaluate(w: np.ndarray) -> dict:
        return {
            f"{split}_accuracy": float(np.mean(np.sign(x_eval @ w + 1e-300) == y_eval)),
            f"{split}_loss": _logistic_loss(w, x_eval, y_eval),
        }

    return evaluate


# ------------------------------------------------------------------------------ calibration
#: Rényi orders for the centralized accountant: a short grid keeps calibration to ~10
#: evaluations of a second or less; fewer orders can only overstate ε (sound).
CENTRAL_ORDERS = (1.25, 1.5, 1.75, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 96,
                  128, 256)


def central_epsilon(noise_multiplier: float, n: int, steps: int, delta: float) -> float:
    """ε of centralized DP-SGD with one uniformly drawn user per step (sampling without
    replacement of 1 out of n, replace-one adjacency; z = σ/(2L)), via dp_accounting's RDP."""
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    accountant = RdpAccountant(list(CENTRAL_ORDERS),
                               neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    with np.errstate(under="ignore"):  # tiny terms of the RDP series underflow harmlessly
        accountant.compose(dpa.SelfComposedDpEvent(
            dpa.SampledWithoutReplacementDpEvent(n, 1, dpa.GaussianDpEvent(noise_multiplier)),
            steps))
        return float(accountant.get_epsilon(delta))


def central_noise_multiplier(n: int, steps: int, epsilon: float, delta: float) -> float:
    """Smallest z with ``central_epsilon`` ≤ ε (evaluated: the safe side of the root)."""
    from dpdl.accounting.calibration import calibrate_safe

    return calibrate_safe(lambda z: central_epsilon(z, n, steps, delta), epsilon, (0.05, 50.0),
                          xtol=1e-9)


def calibrate(approach: str, *, n: int, steps: int, cap: int, walk, mask, epsilon: float,
              delta: float, clip: float) -> dict:
    """σ (gradient units) and its accounting for one approach at (ε, δ)."""
    from dpdl.extensions.netdp import accounting as nd

    if approach == "local":
        z = nd.local_noise_multiplier_for_target(cap, epsilon, delta)
        method = f"GDP, {cap} Gaussian releases per user (cap)"
    elif approach == "network":
        z = nd.noise_multiplier_for_target(walk, n, epsilon, delta, mechanism="sgd",
                                           contributes=mask, final_view=True)
        method = "worst pair of the sampled walk, amplification by iteration (RDP)"
    else:
        z = central_noise_multiplier(n, steps, epsilon, delta)
        method = "RDP, sampling 1 of n without replacement, replace-one (dp_accounting)"
    return {"noise_multiplier": z, "sigma": 2 * clip * z, "accounting": method}


# ------------------------------------------------------------------------------ the run

def run_experiment(
    config: dict[str, Any] | NetDPLogRegConfig, output_dir: str | Path, *, progress: bool = True,
    run_name: str | None = None, resume: bool = False,
) -> dict[str, Any]:
    """Train every (approach, ε, seed) cell and write one run folder; returns results.json.
    With a ``[tune]`` table the step sizes are first chosen on validation records. Every
    finished cell is logged in ``cells.jsonl``; ``resume=True`` (see :func:`resume_experiment`)
    reuses the logged cells of the folder ``output_dir/run_name`` instead of training them."""
    from dpdl.extensions.netdp import accounting as nd

    cfg = parse_config(config)
    say = print if progress else (lambda *_: None)
    data = load_users(cfg)
    n, T = data["n"], cfg.algorithm.steps
    cap = nd.contribution_cap(cfg.algorithm.cap_factor, T, n)
    _check_network_accounting_holds(cfg, data)
    say(f"netdp-logreg: {data['name']}, n = {n} users x {cfg.data.records_per_user} records, "
        f"d = {data['dim']}, T = {T}, cap = {cap}")
    cells = [(a, e) for a in cfg.privacy.approaches for e in cfg.privacy.epsilons]
    if cfg.privacy.include_non_private:
        cells.append((NON_PRIVATE, None))
    folder = RunFolder.create(output_dir, cfg.experiment.name, run_name, exist_ok=resume)
    if not resume:
        folder.write_config(cfg.model_dump())
    log = CellLog(folder / CellLog.FILE, cfg.model_dump(mode="json"))
    trainer = _CellTrainer(cfg, data, cap)
    tuning = None if cfg.tune is None else _select(cfg, trainer, cells, folder, say, log)
    picked = {} if tuning is None else {(p["approach"], p["epsilon"]): p["lr"]
                                        for p in tuning["picks"]}  # fmt: skip
    rows, results = [], []
    for seed in cfg.experiment.seeds:
        for approach, eps in cells:
            lr = picked.get((approach, eps), getattr(cfg.algorithm.lr, _field(approach)))
            result, history = log.get_or_run(("test", seed, approach, eps, lr), partial(
                _tested, cfg, trainer, seed, approach, eps, lr))  # fmt: skip
            label = NON_PRIVATE if eps is None else f"{eps:g}"
            rows += [{"approach": approach, "epsilon": label, "seed": seed, **point}
                     for point in history]  # fmt: skip
            results.append(result)
            sigma_text = "withheld" if result["sigma"] is None else f"{result['sigma']:.4g}"
            say(f"  seed {seed} {approach:>11} eps={label:>6}: sigma = {sigma_text}, "
                f"test acc {result['test_accuracy']:.3f}, test loss {result['test_loss']:.4f}")
    return _write_outputs(folder, cfg, data, cap, rows, results, tuning)


def _tested(cfg, trainer: _CellTrainer, seed: int, approach: str, eps, lr: float):
    noise, run = trainer.train(seed, approach, eps, lr)
    return _cell_result(cfg, seed, approach, eps, lr, noise, run), run.history


def resume_experiment(run_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """Continue an interrupted ``netdp-logreg`` run folder with its saved ``config.json``:
    the cells in its ``cells.jsonl`` are reused, the others are trained."""
    return resume_in_folder(run_dir, run_experiment, progress=progress)


def _field(approach: str) -> str:
    return approach.replace("-", "_")


def _select(cfg: NetDPLogRegConfig, trainer: _CellTrainer, cells, folder: RunFolder,
            say, log: CellLog) -> dict[str, Any]:
    """The step sizes chosen on the validation records; writes ``selection.csv``."""
    from dpdl.extensions.netdp.tuning import select_step_sizes

    tune = cfg.tune
    say(f"selecting step sizes: {len(tune.lr_grid)} per approach and epsilon, seeds "
        f"{tune.selection_seeds}, {tune.validation_records} validation records")

    def final_validation_accuracy(seed, approach, eps, lr) -> float:
        def train() -> float:
            _, run = trainer.train(seed, approach, eps, lr, split="val", tag="select")
            return run.history[-1]["val_accuracy"]

        return log.get_or_run(("select", seed, approach, eps, lr), train)

    tuning = select_step_sizes(cells, tune.lr_grid, tune.selection_seeds,
                               final_validation_accuracy, say)
    folder.write_records_csv("selection.csv", [
        {"approach": p["approach"], "epsilon": "-" if p["epsilon"] is None else p["epsilon"],
         "lr": p["lr"], "val_accuracy_mean": p["mean"], "val_accuracy_std": p["std"],
         "picked": p["picked"]} for p in tuning["points"]])  # fmt: skip
    tuning["validation_records"] = tune.validation_records
    return tuning


class _CellTrainer:
    """Trains one (approach, ε, seed) cell at a step size: its walk and noise from the cell's
    secret stream. Local and central noise do not depend on the walk: calibrated once."""

    def __init__(self, cfg: NetDPLogRegConfig, data: dict[str, Any], cap: int):
        self.cfg, self.data, self.cap = cfg, data, cap
        self.gradient = _user_gradient(data)
        self.evaluators = {"test": _evaluator(data, "test")}
        if cfg.tune is not None:
            self.evaluators["val"] = _evaluator(data, "val")
        self.walk_free: dict[tuple, dict] = {}

    def train(self, seed: int, approach: str, eps: float | None, lr: float, *,
              split: str = "test", tag: str = ""):
        """The noise and the run (the walk is not returned)."""
        from dpdl.algorithms.randomness import numpy_secret_rng
        from dpdl.extensions.netdp import accounting as nd
        from dpdl.extensions.netdp.algorithm import (
            CapPolicy,
            Evaluation,
            random_walk_sgd,
            sample_random_walk,
        )

        cfg, data, alg = self.cfg, self.data, self.cfg.algorithm
        n, T = data["n"], alg.steps
        # a tuned run's cells differ by their step size: they never share noise
        name = f"{approach}|{eps!r}" + ("" if cfg.tune is None else f"|lr={lr!r}|{tag}")
        secret = numpy_secret_rng(seed, cfg.experiment.entropy, seeded_cell_name(
            cfg, name,
            ("privacy.epsilons", "privacy.approaches", "privacy.include_non_private"),
            (data["x"], data["y"])))
        if approach in ("central", NON_PRIVATE):  # one uniformly drawn user per step
            walk = secret.integers(0, n, size=T)
        else:
            walk = sample_random_walk(n, T, seed=secret)
        mask = nd.contribution_mask(walk, n, self.cap)
        noise = self._noise(approach, eps, walk, mask)
        run = random_walk_sgd(
            self.gradient, np.zeros(data["dim"]), walk, lr=lr, sigma=noise["sigma"],
            clip=alg.clip, n=n,
            cap=CapPolicy(contributes=mask if approach in ("local", "network") else None,
                          model="local" if approach == "local" else "network"),
            radius=alg.radius, seed=secret,
            evaluation=Evaluation(self.evaluators[split], alg.eval_every),
            unsafe_zero_noise=approach == NON_PRIVATE)  # the non-private baseline
        return noise, run

    def _noise(self, approach: str, eps: float | None, walk, mask) -> dict:
        if approach == NON_PRIVATE:
            return {"noise_multiplier": 0.0, "sigma": 0.0, "accounting": "none"}
        if approach != "network" and (approach, eps) in self.walk_free:
            return self.walk_free[(approach, eps)]
        noise = calibrate(approach, n=self.data["n"], steps=self.cfg.algorithm.steps,
                          cap=self.cap, walk=walk, mask=mask, epsilon=eps,
                          delta=self.cfg.privacy.delta, clip=self.cfg.algorithm.clip)
        if approach != "network":
            self.walk_free[(approach, eps)] = noise
        return noise


def _check_network_accounting_holds(cfg: NetDPLogRegConfig, data: dict[str, Any]) -> None:
    """Amplification by iteration needs every step to be a contraction: η ≤ 2/β, and a clip
    that never bites (clip ≥ L)."""
    alg, limit = cfg.algorithm, 2 / data["smoothness"]
    if "network" in cfg.privacy.approaches and alg.lr.network > limit:
        raise DPDLError(f"algorithm.lr.network = {alg.lr.network} exceeds 2/beta = "
                        f"{limit:.4g}: steps are no longer contractions and "
                        "the network-DP accounting (amplification by iteration) does not hold")
    too_large = [] if cfg.tune is None else [lr for lr in cfg.tune.lr_grid if lr > limit]
    if "network" in cfg.privacy.approaches and too_large:  # any point may be network's pick
        raise DPDLError(f"tune.lr_grid: {too_large} exceed 2/beta = {limit:.4g}, where the "
                        "network-DP accounting (amplification by iteration) no longer holds")
    lipschitz = math.sqrt(4 * data["smoothness"])  # the domain's max ||x||: the loss's L
    if "network" in cfg.privacy.approaches and alg.clip < lipschitz - 1e-12:
        raise DPDLError(f"algorithm.clip = {alg.clip} is below the loss's Lipschitz constant "
                        f"{lipschitz:.4g}: clipped steps need not be contractions, so the "
                        "network-DP accounting (amplification by iteration) does not hold")


def _cell_result(cfg: NetDPLogRegConfig, seed: int, approach: str, eps: float | None,
                 lr: float, noise: dict, run) -> dict[str, Any]:
    """The cell's entry of results.json."""
    entropy = cfg.experiment.entropy
    # The network sigma is calibrated on the sampled walk and the contribution count is
    # read off it: with secret walks, recording either would tell a reader about the
    # walk, so they are withheld (a reproducible-noise run may show them).
    walk_secret = entropy == "os"
    shown = dict(noise)
    if walk_secret and approach == "network":
        shown |= {"sigma": None, "noise_multiplier": None}
    contributions = None if walk_secret else int(run.contributions.max())
    final = run.history[-1]
    return {"algorithm": approach if eps is None else f"{approach} DP-SGD",
            "status": "ok", "approach": approach, "epsilon": eps,
            "seed": seed, "noise_entropy": entropy, "lr": lr,
            **shown, "max_contributions": contributions,
            **{k: v for k, v in final.items() if k != "step"}}


def _write_outputs(folder: RunFolder, cfg: NetDPLogRegConfig, data: dict[str, Any], cap: int,
                   rows: list[dict], results: list[dict],
                   tuning: dict[str, Any] | None = None) -> dict[str, Any]:
    """metrics.csv, curves.png and results.json (with ``selection.csv`` and the picks when
    tuned, and the seed-paired comparisons); returns the results."""
    from dpdl.extensions.netdp.tuning import paired_comparisons

    folder.write_records_csv("metrics.csv", rows)
    extra: dict[str, Any] = {"comparisons": paired_comparisons(results)}
    if tuning is not None:
        extra["tuning"] = tuning
    out = {
        "kind": "netdp-logreg", "run_dir": str(folder.path), "dataset": data["name"],
        "users": data["n"], "records_per_user": cfg.data.records_per_user, "dim": data["dim"],
        "steps": cfg.algorithm.steps, "cap": cap, "delta": cfg.privacy.delta,
        "noise_entropy": cfg.experiment.entropy,
        "cells": results,
        "summary": _summary(results), **extra,
        "files": ["config.json", "metrics.csv", "results.json", "curves.png", CellLog.FILE,
                  *(["selection.csv"] if tuning is not None else [])],
    }
    _plot_curves(folder / "curves.png", rows, cfg)
    folder.write_results(out)
    return out


def _summary(results: list[dict]) -> list[dict]:
    """One row per (approach, ε), in the shape ``dpdl run`` prints (``algorithm``,
    ``epsilon_target``, ``test_accuracy`` ± std); ``epsilon_certified`` is the target that the
    calibration guarantees (GDP / worst pair of the walk / RDP — all certified)."""
    groups: dict[tuple, list[dict]] = {}
    for r in results:
        groups.setdefault((r["approach"], r["epsilon"]), []).append(r)
    return [
        {"algorithm": f"{a} DP-SGD" if e is not None else a, "approach": a,
         "epsilon_target": e, "epsilon_certified": e,
         "sigma": (None if any(r["sigma"] is None for r in rs)
                   else float(np.mean([r["sigma"] for r in rs]))),
         "test_accuracy": float(np.mean([r["test_accuracy"] for r in rs])),
         "test_accuracy_std": std_or_none([r["test_accuracy"] for r in rs]),
         "test_loss": float(np.mean([r["test_loss"] for r in rs])),
         "status": []}
        for (a, e), rs in groups.items()
    ]


def apply_overrides(config: dict[str, Any], **overrides) -> dict[str, Any]:
    """``dpdl run`` flags: ``seed`` (a single seed), ``steps`` (T) and ``entropy``; others
    (``--device``, ``--runtime``) are refused."""
    import copy

    unsupported = sorted(k for k, v in overrides.items()
                         if v is not None and k not in ("seed", "steps", "entropy"))
    if unsupported:
        flags = ", ".join("--" + k.replace("_", "-") for k in unsupported)
        raise DPDLError(f"{flags} not supported for experiment kind 'netdp-logreg' (it runs "
                        "on numpy, in one process)")
    config = copy.deepcopy(config)
    if overrides.get("entropy") is not None:
        config.setdefault("experiment", {})["entropy"] = overrides["entropy"]
    if overrides.get("seed") is not None:
        config.setdefault("experiment", {})["seeds"] = [int(overrides["seed"])]
    if overrides.get("steps") is not None:
        config.setdefault("algorithm", {})["steps"] = int(overrides["steps"])
    return config


@styled
def _plot_curves(path: Path, rows: list[dict], cfg: NetDPLogRegConfig) -> None:
    """Test accuracy and loss against step, one column per ε on shared axes: each approach's
    mean over seeds and a ± std band cut at the bounds (accuracy in [0, 1], loss above 0);
    the loss on a log axis when the approaches' losses span orders of magnitude."""
    labels = [f"{e:g}" for e in cfg.privacy.epsilons]
    fig, axes = pyplot().subplots(2, len(labels), figsize=(3.0 * len(labels) + 1.8, 4.6),
                                  squeeze=False, sharex=True, sharey="row",
                                  layout="constrained")  # fmt: skip
    losses = []
    for col, label in enumerate(labels):
        for colour, approach in zip(PALETTE, [*cfg.privacy.approaches, NON_PRIVATE],
                                    strict=False):  # fmt: skip
            sel = [r for r in rows if r["approach"] == approach
                   and (r["epsilon"] == label or approach == NON_PRIVATE)]
            if sel:
                losses += _draw_approach(axes[:, col], sel, approach, colour)
        axes[0, col].set_title(f"ε = {label}, δ = {cfg.privacy.delta:g}")
        axes[1, col].set_xlabel("step")
    axes[0, 0].set_ylabel("test accuracy")
    axes[1, 0].set_ylabel("test loss")
    if spans_decades(losses):
        axes[1, 0].set_yscale("log")  # shared: every loss panel
    legend_outside(fig, axes.ravel())
    save_figure(fig, path)


def _draw_approach(axes, sel: list[dict], approach: str, colour: str) -> list[float]:
    """One approach's mean curves and bands (accuracy above, loss below); its mean losses."""
    steps = sorted({r["step"] for r in sel})
    means = []
    for ax, metric, bounds in zip(axes, ("test_accuracy", "test_loss"),
                                  ((0.0, 1.0), (0.0, None)), strict=True):  # fmt: skip
        values = [[r[metric] for r in sel if r["step"] == s] for s in steps]
        mean = np.array([np.mean(v) for v in values])
        std = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in values])
        style = {"color": "k", "linestyle": "--"} if approach == NON_PRIVATE else {"color": colour}
        ax.plot(steps, mean, label=approach, **style)
        band(ax, steps, mean - std, mean + std, color=style["color"], floor=bounds[0],
             ceiling=bounds[1])  # fmt: skip
        means = list(mean)
    return means
