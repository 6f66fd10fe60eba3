"""One entry point for private decentralized training: :class:`DecentralizedTrainer`, :func:`train`.

Bring any ``torch.nn.Module`` and one local data set per node; the trainer validates
everything (model, data, topology, loss, settings, privacy budget) before it writes or trains
anything, then runs the Dyn-D2P family (or SGP) on the simulator or the distributed runtime::

    import dpdl
    result = dpdl.train(model, [(x0, y0), (x1, y1), ...], topology=graph,
                        algorithm="dyn-d2p", epsilon=1.0, delta=1e-5, steps=500, lr=0.1,
                        batch_size=8, eval_data=(x_test, y_test), entropy="os")
    result.model          # the network-average model (an nn.Module)
    result.epsilon        # certified epsilon spent (PLD/RDP), result.epsilon_clt beside it

``dpdl run`` goes through the same class (:func:`dpdl.experiments.runner.run_cell` builds a
trainer from a config), so the schedule, the ledger's approval of the whole schedule
(``PrivacyBudgetExceeded`` before any step), the step loop, evaluation, checkpoints/resume and
both runtimes are one code path.

Privacy is fail-closed: before a private run trains, a :class:`PrivacyLedger` under the
schedule's calibrating accountant must approve the whole schedule, and every step is recorded
in it before it runs.  The epsilon reported at each evaluation is the CLT approximation (the
paper's accountant; it may understate epsilon, SPEC §2) and a certified PLD (or RDP) upper
bound; at evaluation points the PLD bound is the cheap blocked one, for the final row the
exact composition (``final_mode``).
"""

from __future__ import annotations

import copy
import csv
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpdl.accounting.certified import accountant_options, epsilon_report
from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import (
    PrivacySchedule,
    make_schedule,
)
from dpdl.algorithms.dyn_d2p import LOSSES, NodeBatch, NonFiniteUpdate, per_record_grads
from dpdl.algorithms.randomness import (
    DEFAULT_ENTROPY,
    ENTROPY_MODES,
    settings_digest,
    stream_root,
)
from dpdl.engine import checkpoint as checkpoints
from dpdl.engine.simulator import NodeData, Simulator, accuracy, resolve_device, stack_params
from dpdl.errors import DPDLError, require
from dpdl.training.settings import (
    AlgorithmSpec,
    PrivacySection,
    TrainingSection,
    validate_config,
)

RUNTIMES = ("simulator", "distributed")

METRIC_COLUMNS = (
    "iteration",
    "algorithm",
    "seed",
    "epsilon_target",
    "test_loss",
    "test_accuracy",
    "node_accuracy_mean",
    "node_accuracy_worst",
    "val_loss",
    "val_accuracy",
    "epsilon_clt",
    "epsilon_certified",
)
# The training loss on the nodes' own records is a noise-free function of private data: it is
# computed only with unsafe_train_metrics=True, under this name wherever it goes.
UNACCOUNTED_TRAIN_LOSS = "unaccounted_train_loss"
# The defaults of a config's [privacy] and [training] tables: one source for both entry points.
_PRIVACY = {name: f.default for name, f in PrivacySection.model_fields.items()}
_TRAINING = {name: f.default for name, f in TrainingSection.model_fields.items()}

# Privacy settings that only change how the epsilon spent is reported, and the training
# settings that shape training (the others say how it is evaluated or saved).
_REPORTING_PRIVACY = ("certified_accountant", "eval_blocks", "final_mode", "final_blocks")
_TRAINING_SHAPING = ("steps", "epochs", "batch_size", "lr", "lr_decay")

# Row entries that describe the evaluation rather than measure the model.
_ROW_LABELS = ("iteration", "algorithm", "seed", "epsilon_target", "epsilon_certified_method")

__all__ = [
    "METRIC_COLUMNS",
    "UNACCOUNTED_TRAIN_LOSS",
    "CSVLogger",
    "CellCheckpointer",
    "DecentralizedTrainer",
    "Evaluation",
    "TensorBoardLogger",
    "TrainingResult",
    "approve_schedule",
    "build_schedule",
    "noise_root",
    "resolve_steps",
    "train",
]


# --------------------------------------------------------------------------- randomness
def noise_root(entropy: str, seed: int, settings: dict[str, Any]) -> bytes | None:
    """The root of one run's secret per-node streams (Poisson sampling and noise).

    The one place where it is decided, for ``dpdl run`` and the Python API alike
    (:mod:`dpdl.algorithms.randomness`): ``entropy="os"`` (the default) gives None, every
    node's stream keyed from the operating system; ``"seed"`` derives it from ``seed`` and the
    run's ``settings`` (:meth:`DecentralizedTrainer.stream_settings`: everything that shapes
    training), so runs that differ in any of them never share noise.
    """
    return stream_root(entropy, seed, settings)


# --------------------------------------------------------------------------- schedule, ledger
def resolve_steps(steps: int | None, epochs: float | None, j_min: int, batch_size: float) -> int:
    """``steps``, or ``epochs`` in steps: one epoch = J_min / b steps (each record is sampled
    once per epoch on average)."""
    if steps is not None:
        return steps
    return max(1, math.ceil(epochs * j_min / batch_size))


def build_schedule(
    privacy: PrivacySection,
    spec: AlgorithmSpec,
    epsilon: float | None,
    steps: int,
    sample_rate: float,
) -> PrivacySchedule:
    """The calibrated privacy schedule of one run (SPEC §2)."""
    calibrate = spec.calibrate or privacy.calibrate
    return make_schedule(
        spec.name,
        epsilon=None if spec.name == "sgp" else epsilon,
        delta=privacy.delta,
        steps=steps,
        sample_rate=sample_rate,
        clip=privacy.clip,
        clip0=privacy.clip0,
        rho_c=privacy.rho_c,
        rho_mu=privacy.rho_mu,
        calibrate=calibrate,
        blocks=privacy.calibration_blocks if calibrate == "pld" else None,
    )


def approve_schedule(privacy: PrivacySection, schedule: PrivacySchedule) -> PrivacyLedger:
    """A ledger that has approved the whole schedule (else ``PrivacyBudgetExceeded``): the
    schedule is held to the accountant it was calibrated with (blocks included)."""
    return PrivacyLedger.for_schedule(schedule)


def _spent(privacy: PrivacySection, ledger: PrivacyLedger | None, final: bool):
    """(CLT epsilon, certified epsilon, certified method) of the steps the ledger recorded:
    every epsilon a run reports is the ledger's, of what was actually sent.  At evaluation
    points the certified bound is the cheap blocked one, for the final report ``final_mode``."""
    if ledger is None:
        return math.inf, math.inf, "none"
    if ledger.steps_taken == 0:
        return 0.0, 0.0, "no-steps"
    multipliers, p, delta = ledger.recorded_multipliers, ledger.sample_rate, ledger.delta
    clt = epsilon_report("clt", multipliers, p, delta).epsilon
    accountant = privacy.certified_accountant
    if accountant == "pld":
        if final and privacy.final_mode == "auto":
            options = accountant_options("pld", multipliers)
        elif final and privacy.final_mode == "exact":
            options = {"mode": "exact"}
        else:
            options = {
                "mode": "blocked",
                "blocks": privacy.final_blocks if final else privacy.eval_blocks,
            }
    else:
        options = {}
    report = epsilon_report(accountant, multipliers, p, delta, **options)
    return float(clt), float(report.epsilon), report.method


# --------------------------------------------------------------------------- callbacks
@dataclass(frozen=True)
class Evaluation:
    """What every callback receives at each evaluation (iteration 0, every ``eval_every``
    steps, and the end): the metrics of the network-average model and the epsilon spent."""

    iteration: int
    metrics: dict[str, float]
    epsilon_certified: float
    epsilon_clt: float
    row: dict[str, Any]  # the whole metrics row (as in metrics.csv)


class CSVLogger:
    """Writes one row per evaluation to a CSV file (``metrics.csv`` of a run folder).

    ``columns`` default: :data:`METRIC_COLUMNS` followed by the user's metrics.
    """

    def __init__(self, path: str | Path, columns: Sequence[str] | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("w", newline="")
        self._writer: csv.DictWriter | None = None
        if columns is not None:
            self._start(tuple(columns))

    def _start(self, columns: tuple[str, ...]) -> None:
        self._writer = csv.DictWriter(self._fh, fieldnames=columns, extrasaction="ignore")
        self._writer.writeheader()
        self._fh.flush()

    def write_row(self, row: dict[str, Any]) -> None:
        if self._writer is None:
            extra = tuple(k for k in row if k not in METRIC_COLUMNS and k not in _ROW_LABELS)
            self._start(METRIC_COLUMNS + extra)
        self._writer.writerow({k: _csv_value(row.get(k)) for k in self._writer.fieldnames})
        self._fh.flush()

    def __call__(self, evaluation: Evaluation) -> None:
        self.write_row(evaluation.row)

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> CSVLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class TensorBoardLogger:
    """Writes every evaluation's metrics and epsilons as TensorBoard scalars.

    Needs the optional ``tensorboard`` package (``pip install tensorboard``).
    """

    def __init__(self, log_dir: str | Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise DPDLError(
                "TensorBoardLogger needs the tensorboard package: pip install tensorboard"
            ) from None
        self.writer = SummaryWriter(log_dir=str(log_dir))

    def __call__(self, evaluation: Evaluation) -> None:
        scalars = evaluation.metrics | {
            "epsilon_certified": evaluation.epsilon_certified,
            "epsilon_clt": evaluation.epsilon_clt,
        }
        for name, value in scalars.items():
            if math.isfinite(value):
                self.writer.add_scalar(name, value, evaluation.iteration)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


def _csv_value(v):
    if isinstance(v, float):
        return repr(v)
    return v


# --------------------------------------------------------------------------- checkpoints
@dataclass
class CellCheckpointer:
    """Where and how often a run saves its state, and the state to resume from (if any).

    Every process writes its own file (:func:`dpdl.engine.checkpoint.process_path` of
    ``path``) with its own nodes' state and what a resume needs besides (the ledger, the
    metrics rows, the run's settings digest): public numbers, the same on every rank."""

    path: Path
    every: int | None
    resume: dict[str, Any] | None = None

    def save(self, sim, ledger: PrivacyLedger | None, rows: list[dict[str, Any]],
             run_digest: str) -> None:  # fmt: skip
        checkpoints.save_atomic(
            checkpoints.process_path(self.path),
            {
                "engine": checkpoints.capture(sim),
                "ledger": None if ledger is None else ledger.to_json(),
                "rows": json.dumps(rows),
                "run_digest": run_digest,
            },
        )


# --------------------------------------------------------------------------- result
@dataclass
class TrainingResult:
    """The outcome of :meth:`DecentralizedTrainer.fit`.

    ``model``: the network-average model x̄ = Σ x_i / Σ w_i as an ``nn.Module``;
    ``node_models``: every node's de-biased model z_i = x_i / w_i; ``ledger``: the privacy
    ledger of the steps taken (None for SGP); ``epsilon``: the certified epsilon spent
    (PLD/RDP, ``inf`` for SGP) and ``epsilon_clt`` the CLT approximation beside it;
    ``history``: one metrics row per evaluation; ``record``: the run's entry of
    ``results.json``; ``status`` "ok" or "diverged" (``message`` says where).
    """

    model: nn.Module
    ledger: PrivacyLedger | None
    epsilon: float
    epsilon_clt: float
    delta: float | None
    history: list[dict[str, Any]]
    schedule: PrivacySchedule
    status: str
    message: str
    record: dict[str, Any]
    run_dir: Path | None = None
    node_indices: list[int] = field(default_factory=list)
    _template: nn.Module | None = field(default=None, repr=False)
    _node_params: dict[str, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def node_models(self) -> list[nn.Module]:
        """The de-biased models of the nodes in :attr:`node_indices`: every node with the
        simulator; in the distributed runtime this process's own nodes, or every node when
        the trainer was built with ``gather_node_models=True``."""
        return [self.node_model(i) for i in self.node_indices]

    def node_model(self, i: int) -> nn.Module:
        """Node ``i``'s model (``i`` a node index, one of :attr:`node_indices`)."""
        require(i in self.node_indices, f"node {i}'s model is not held by this process "
                "(gather_node_models=True gathers every node's)")  # fmt: skip
        row = self.node_indices.index(i)
        return _module_with(self._template, {k: v[row] for k, v in self._node_params.items()})


def _module_with(template: nn.Module, params: dict[str, torch.Tensor]) -> nn.Module:
    module = copy.deepcopy(template)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])
    return module


def _code_fingerprint(fn) -> Any:
    """A stable description of a Python callable's code (nested code objects included, never
    their memory addresses); the qualified name of anything without Python code."""
    import types

    def describe(code: types.CodeType) -> list:
        consts = [describe(c) if isinstance(c, types.CodeType) else repr(c)
                  for c in code.co_consts]  # fmt: skip
        return [code.co_code.hex(), consts, list(code.co_names)]

    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None and callable(fn):  # a callable object: its class's __call__
        code = getattr(type(fn).__dict__.get("__call__"), "__code__", None)
    if code is None:
        return getattr(fn, "__qualname__", type(fn).__qualname__)
    return describe(code)


def _all_true(flag: bool, runtime: str) -> bool:
    """``flag`` on every rank (distributed runtime), else ``flag``."""
    if runtime != "distributed":
        return flag
    from dpdl.engine import distributed

    return not distributed.ranks_that_failed(not flag)


def _parameters_digest(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, p in model.state_dict().items():
        digest.update(name.encode())
        digest.update(p.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def _json_number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# --------------------------------------------------------------------------- the trainer
def _check_eval_labels(y: torch.Tensor, what: str, classes: int) -> None:
    """Evaluation labels are class indices of the model's outputs, checked before the run (a
    bad one would stop it at the first evaluation with a raw IndexError)."""
    if y.is_floating_point():
        require(bool(torch.all(y == torch.round(y))),
                f"{what} has real-valued labels; the cross_entropy loss needs class indices")
    bad = (y < 0) | (y >= classes)
    if bool(bad.any()):
        raise DPDLError(f"{what} has labels outside 0..{classes - 1} (the model's {classes} "
                        f"outputs), e.g. {int(y[bad][0])}")  # fmt: skip


class DecentralizedTrainer:
    """Private decentralized training of any model on the nodes' own data (see the module doc).

    Parameters (keyword-only after ``model`` and ``data``):

    * ``model``: an ``nn.Module`` (refused: BatchNorm and other layers that mix records);
      every node starts from its parameters.
    * ``data``: one local data set per node: ``(inputs, targets)`` tensors/arrays or a
      ``torch.utils.data.Dataset`` of ``(input, target)`` items; sizes may differ.
    * ``topology``: a name of :data:`dpdl.topology.TOPOLOGIES` (with ``topology_params``), a
      :class:`dpdl.topology.Topology`, a ``networkx`` graph (node i = the i-th of
      ``graph.nodes``) or a function ``k -> P^k`` (``topology_params={"period": m}``).
    * ``algorithm`` (a name of ``dpdl.accounting.schedules.ALGORITHMS``, optionally
      ``"name@clt|pld|rdp"``), ``epsilon``, ``delta``, ``calibrate``, ``clip``, ``clip0``,
      ``rho_c``, ``rho_mu``; accounting: ``certified_accountant``, ``eval_blocks``,
      ``final_mode``, ``final_blocks``, ``calibration_blocks`` (as in a config's [privacy]).
    * ``batch_size`` (expected b), ``lr`` (γ), ``steps`` or ``epochs``, ``loss``: a name of
      ``LOSSES`` or a callable ``(outputs, targets) -> (batch,)`` per-record losses.
    * ``eval_data`` ``(inputs, targets)``, ``validation_data`` (held-out records to choose
      parameters on: ``val_loss``, ``val_accuracy``): evaluation data the user declares
      public (metrics on them are released as they are); ``metric``
      ``(outputs, targets) -> float | dict``, ``eval_every``,
      ``eval_test_samples``/``eval_node_samples``, ``callbacks``: callables receiving an
      :class:`Evaluation`.  Nothing computed from the nodes' training records leaves the
      trainer without noise; ``unsafe_train_metrics=True`` adds the noise-free training loss
      on ``train_eval_data`` (default: ``eval_train_samples`` of the nodes' records) as
      ``unaccounted_train_loss`` wherever it goes (for debugging, never for real data).
    * ``device``, ``runtime`` ("simulator" | "distributed": started by torchrun),
      ``entropy`` ("os", the default: secret noise; "seed": reproducible from ``seed``),
      ``secure_noise`` (CSPRNG streams and the hardened Gaussian sampler; entropy "os").
    * ``output_dir``: write a run folder there (``metrics.csv``, ``results.json``,
      ``curves.png``, ``trainer.json``), ``run_name``, ``checkpoint_every``, ``resume``.

    Everything is validated on construction and nothing is written before :meth:`fit`.
    """

    def __init__(
        self,
        model: nn.Module,
        data: Sequence | NodeData,
        *,
        topology: Any = "exp",
        topology_params: dict[str, Any] | None = None,
        algorithm: str | AlgorithmSpec = "dyn-d2p",
        epsilon: float | None = 1.0,
        delta: float = _PRIVACY["delta"],
        calibrate: str = _PRIVACY["calibrate"],
        clip: float = _PRIVACY["clip"],
        clip0: float | None = _PRIVACY["clip0"],
        rho_c: float = _PRIVACY["rho_c"],
        rho_mu: float = _PRIVACY["rho_mu"],
        certified_accountant: str = _PRIVACY["certified_accountant"],
        eval_blocks: int = _PRIVACY["eval_blocks"],
        final_mode: str = _PRIVACY["final_mode"],
        final_blocks: int = _PRIVACY["final_blocks"],
        calibration_blocks: int | None = _PRIVACY["calibration_blocks"],
        secure_noise: bool = _PRIVACY["secure_noise"],
        batch_size: float = _TRAINING["batch_size"],
        lr: float = _TRAINING["lr"],
        lr_decay: float = _TRAINING["lr_decay"],
        steps: int | None = None,
        epochs: float | None = None,
        loss: str | Callable = "cross_entropy",
        eval_data: Any = None,
        train_eval_data: Any = None,
        validation_data: Any = None,
        metric: Callable | None = None,
        eval_every: int = _TRAINING["eval_every"],
        eval_train_samples: int = _TRAINING["eval_train_samples"],
        unsafe_train_metrics: bool = _TRAINING["unsafe_train_metrics"],
        eval_test_samples: int | None = _TRAINING["eval_test_samples"],
        eval_node_samples: int = _TRAINING["eval_node_samples"],
        callbacks: Sequence[Callable[[Evaluation], Any]] = (),
        callbacks_on: str = "main",
        nodes: int | None = None,
        gather_node_models: bool = False,
        device: str | torch.device = "cpu",
        runtime: str = "simulator",
        entropy: str = DEFAULT_ENTROPY,
        seed: int = 0,
        output_dir: str | Path | None = None,
        run_name: str | None = None,
        name: str = "train",
        checkpoint_every: int | None = None,
        resume: bool = False,
        progress: bool = False,
        engine_factory: Callable[..., Simulator] | None = None,
        checkpoint: CellCheckpointer | None = None,
    ):
        # --- settings (the same validators as a config's [privacy] and [training] tables)
        try:
            self.spec = (
                algorithm
                if isinstance(algorithm, AlgorithmSpec)
                else AlgorithmSpec.parse(algorithm)
            )
        except ValueError as err:
            raise DPDLError(str(err)) from None
        private = self.spec.name != "sgp"
        require(
            not private or epsilon is not None,
            f"algorithm {self.spec.label!r} is private and needs a target epsilon",
        )
        self.privacy = validate_config(
            PrivacySection,
            dict(
                epsilon=epsilon if private else 1.0, delta=delta, calibrate=calibrate, clip=clip,
                clip0=clip0, rho_c=rho_c, rho_mu=rho_mu, certified_accountant=certified_accountant,
                eval_blocks=eval_blocks, final_mode=final_mode, final_blocks=final_blocks,
                calibration_blocks=calibration_blocks, secure_noise=secure_noise,
            ),
            "privacy settings",
        )  # fmt: skip
        self.training = validate_config(
            TrainingSection,
            dict(
                steps=steps, epochs=epochs, batch_size=batch_size, lr=lr, lr_decay=lr_decay,
                eval_every=eval_every,
                eval_train_samples=eval_train_samples, eval_test_samples=eval_test_samples,
                unsafe_train_metrics=unsafe_train_metrics,
                eval_node_samples=eval_node_samples, checkpoint_every=checkpoint_every,
            ),
            "training settings",
        )  # fmt: skip
        self.epsilon = float(epsilon) if private else None
        require(
            entropy in ENTROPY_MODES,
            f"unknown entropy {entropy!r}; use 'os' (secret, default) or 'seed'",
        )
        require(
            not (self.privacy.secure_noise and entropy != "os"),
            f"secure_noise draws its keys from the OS: it needs entropy 'os', got {entropy!r}",
        )
        require(runtime in RUNTIMES, f"runtime must be one of {RUNTIMES}, got {runtime!r}")
        require(
            isinstance(seed, int | np.integer) and not isinstance(seed, bool) and seed >= 0,
            f"seed must be a non-negative integer, got {seed!r}",
        )
        self.entropy, self.runtime, self.seed = entropy, runtime, int(seed)
        require(
            not resume or (output_dir is not None and run_name is not None),
            "resume needs output_dir and the run_name of the run folder to continue",
        )
        self.device = resolve_device(device)
        if runtime == "distributed":
            from dpdl.engine import distributed

            self.device = distributed.local_device(self.device)
        self.callbacks = list(callbacks)
        require(all(callable(c) for c in self.callbacks), "every callback must be a callable")
        require(callbacks_on in ("main", "all"),
                f"callbacks_on must be 'main' or 'all', got {callbacks_on!r}")  # fmt: skip
        self.callbacks_on, self.gather_node_models = callbacks_on, bool(gather_node_models)
        require(not (self.training.unsafe_train_metrics and runtime == "distributed"),
                "unsafe_train_metrics needs every node's records in one process: not with the "
                "distributed runtime")  # fmt: skip
        self.output_dir = None if output_dir is None else Path(output_dir)
        self.run_name, self.name, self.resume = run_name, name, bool(resume)
        self.progress, self.checkpoint = progress, checkpoint
        self.engine_factory = engine_factory
        self._run_digest: str | None = None

        # --- model, data, topology, loss
        from dpdl.models import validate_model

        self.model = validate_model(model)
        n = _node_count(data, topology, nodes)
        self.topology = _as_topology(topology, n, topology_params or {}, self.seed)
        self.first_node, hosted = self._hosted_block(n)
        self.loss = _check_loss(loss)
        # Every process loads, checks and probes only the nodes it hosts; in the distributed
        # runtime all ranks then agree that every rank passed (no record crosses a rank).
        self._agree(lambda: self._load_and_probe(data, n, hosted))
        counts = self._all_counts([int(c) for c in self.node_data.counts])
        self.records_per_node = counts

        # --- steps, sampling, schedule, and the ledger's approval of all of it
        b = self.training.batch_size
        require(
            b <= min(counts),
            f"batch_size = {b:g} exceeds the smallest local data set (node "
            f"{int(np.argmin(counts))} has {min(counts)} records)",
        )
        self.sample_rate = b / min(counts)
        self.steps = resolve_steps(self.training.steps, self.training.epochs, min(counts), b)
        self.schedule = build_schedule(
            self.privacy, self.spec, self.epsilon, self.steps, self.sample_rate
        )
        self.ledger = (
            approve_schedule(self.privacy, self.schedule) if self.schedule.private else None
        )

        # --- evaluation
        self.metric = metric
        self._eval = self._evaluation_sets(eval_data, train_eval_data, validation_data)
        self._probe_metric()

    # ------------------------------------------------------------------ validation
    def _hosted_block(self, n: int) -> tuple[int, int]:
        """(first node, count) of the nodes this process hosts: all, or the rank's block."""
        if self.runtime != "distributed":
            return 0, n
        from dpdl.engine import distributed
        from dpdl.engine.comm import block_bounds

        rank, world = distributed.init_from_environment(self.device)
        lo, hi = block_bounds(n, world, rank)
        return lo, hi - lo

    def _agree(self, check: Callable[[], None]) -> None:
        """Run ``check``; in the distributed runtime every rank learns whether every rank
        passed: a refusal stops all of them, each rank's own message staying on its rank
        (it may name its data)."""
        if self.runtime != "distributed":
            check()
            return
        from dpdl.engine import distributed

        error = None
        try:
            check()
        except DPDLError as err:
            error = err
        failed = distributed.ranks_that_failed(error is not None)
        if error is not None:
            raise error
        if failed:
            raise DPDLError(f"rank {failed[0]} refused its nodes' data or the model (its own "
                            "message is on its output)")  # fmt: skip

    def _all_counts(self, local: list[int]) -> list[int]:
        """Every node's size (public by the threat model): gathered in the distributed runtime."""
        if self.runtime != "distributed":
            return local
        from dpdl.engine import distributed

        return distributed.all_node_counts(local, self.topology.n)

    def _load_and_probe(self, data, n: int, hosted: int) -> None:
        self.node_data = _local_node_data(data, n, self.first_node, hosted, self.device)
        self._probe_model()

    def _probe_model(self) -> None:
        """Run the model and the loss on a few of the first hosted node's records, one record
        at a time."""
        count = min(3, int(self.node_data.counts[0]))
        x = self.node_data.inputs[0, :count].to(self.device)
        y = self.node_data.targets[0, :count].to(self.device)
        self.model.to(self.device)
        try:
            with torch.no_grad():
                out = self.model(x)
        except Exception as err:
            raise DPDLError(
                f"the model cannot take node {self.first_node}'s records of shape "
                f"{tuple(x.shape[1:])}: {type(err).__name__}: {_first_line(err)}"
            ) from None
        try:
            values = _per_record_loss(self.loss)(out, y)
        except Exception as err:
            raise DPDLError(
                f"loss {_loss_name(self.loss)!r} fails on the model's outputs {tuple(out.shape)} "
                f"and targets {tuple(y.shape)}: {type(err).__name__}: {_first_line(err)}"
            ) from None
        if not isinstance(values, torch.Tensor) or tuple(values.shape) != (count,):
            shape = tuple(values.shape) if isinstance(values, torch.Tensor) else type(values)
            raise DPDLError(
                f"loss {_loss_name(self.loss)!r} must return one value per record (shape "
                f"({count},) for {count} records), got {shape}; use reduction='none'"
            )
        self._check_records_independent()
        if self.loss == "cross_entropy":
            self._classes = int(out.shape[-1])
            self._check_class_labels(self._classes)
        params = stack_params(self.model, 1, self.device)
        batch = NodeBatch(x, y, torch.zeros(count, dtype=torch.int64, device=self.device), 1)
        buffers = {k: b.to(self.device) for k, b in self.model.named_buffers()}
        try:
            per_record_grads(self.model, params, batch, loss=self.loss, buffers=buffers)
        except Exception as err:
            raise DPDLError(
                "per-record gradients of this model cannot be computed with torch.func "
                f"(vmap over records): {type(err).__name__}: {_first_line(err)}"
            ) from None

    def _check_class_labels(self, classes: int) -> None:
        """Every node's labels are class indices the model can score, checked for all records
        before anything runs: a bad label found mid-run would stop the run at the first step
        that samples it, which would tell when that record was sampled."""
        targets, mask = self.node_data.targets, self.node_data.mask
        require(not targets.is_floating_point(),
                "the cross_entropy loss needs integer class labels, got real-valued targets")
        bad = (((targets < 0) | (targets >= classes)) & mask).any(dim=1).nonzero()
        if len(bad):
            node = int(bad[0])
            values = targets[node][mask[node]]
            wrong = values[(values < 0) | (values >= classes)]
            raise DPDLError(f"node {self.first_node + node} has labels outside 0..{classes - 1} "
                            f"(the model's {classes} outputs), e.g. {int(wrong[0])}")  # fmt: skip

    def _check_records_independent(self) -> None:
        """Refuse a model whose output for one record depends on the other records of its
        batch (a mean or norm over the batch, like BatchNorm's).  Training never lets records
        meet (each is its own batch of one under vmap, so privacy holds regardless), but such
        a model would be trained on something other than what it computes when evaluated."""
        x = self.node_data.inputs[self.node_data.mask][:4].to(self.device)
        if len(x) < 2:
            return
        was_training = self.model.training
        self.model.eval()  # dropout off: the same record gives the same output
        try:
            with torch.no_grad():
                together = self.model(x)
                alone = torch.cat([self.model(x[i : i + 1]) for i in range(len(x))])
        finally:
            self.model.train(was_training)
        scale = float(alone.abs().max()) + 1e-6
        require(
            tuple(together.shape) == tuple(alone.shape)
            and float((together - alone).abs().max()) <= 1e-4 * scale,
            "the model's output for a record depends on the other records of its batch (a "
            "statistic over the batch, as in BatchNorm): per-record privacy needs a model "
            "that treats records independently (use GroupNorm or LayerNorm)",
        )

    def _evaluation_sets(self, eval_data, train_eval_data, validation_data) -> dict[str, Any]:
        rng = np.random.default_rng(self.seed)
        record_shape = tuple(self.node_data.inputs.shape[2:])
        target_dtype = self.node_data.targets.dtype

        def tensors(pair, what, limit):
            from dpdl.data import local_arrays

            x, y = (
                (pair[0], pair[1])
                if all(isinstance(t, torch.Tensor) for t in pair[:2])
                else (torch.as_tensor(a) for a in local_arrays(pair, what))
            )
            require(len(x) == len(y), f"{what} has {len(x)} inputs but {len(y)} targets")
            require(len(x) > 0, f"{what} has no records")
            require(
                tuple(x.shape[1:]) == record_shape,
                f"{what} has record shape {tuple(x.shape[1:])} but the nodes' records have "
                f"{record_shape}",
            )
            if self.loss == "cross_entropy" and getattr(self, "_classes", None):
                _check_eval_labels(y, what, self._classes)
            if limit is not None and limit < len(x):
                pick = torch.as_tensor(np.sort(rng.choice(len(x), limit, replace=False)))
                x, y = x[pick.to(x.device)], y[pick.to(y.device)]
            x = x.to(device=self.device, dtype=torch.float32)
            return x, y.to(device=self.device, dtype=target_dtype)

        sets = {"x_train": None, "y_train": None, "x_test": None, "y_test": None}
        if self.training.unsafe_train_metrics:
            if train_eval_data is None:  # a sample of the nodes' own records
                mask = self.node_data.mask
                train_eval_data = (self.node_data.inputs[mask], self.node_data.targets[mask])
            sets["x_train"], sets["y_train"] = tensors(
                train_eval_data, "train_eval_data", self.training.eval_train_samples
            )
        else:
            require(
                train_eval_data is None,
                "train_eval_data is evaluated without noise: pass unsafe_train_metrics=True "
                "to release unaccounted training metrics, or give public records as "
                "eval_data / validation_data",
            )
        if eval_data is not None:
            sets["x_test"], sets["y_test"] = tensors(
                eval_data, "eval_data", self.training.eval_test_samples
            )
        sets["x_val"], sets["y_val"] = (
            (None, None)
            if validation_data is None
            else tensors(validation_data, "validation_data", None)
        )
        return sets

    def _probe_metric(self) -> None:
        if self.metric is None:
            return
        require(callable(self.metric), "metric must be a callable (outputs, targets) -> float")
        require(self._eval["x_test"] is not None, "a metric needs eval_data to evaluate on")
        with torch.no_grad():
            out = self.model(self._eval["x_test"][:4])
        self._metric_values(out, self._eval["y_test"][:4])

    def _metric_values(self, outputs, targets) -> dict[str, float]:
        try:
            value = self.metric(outputs, targets)
        except Exception as err:
            raise DPDLError(f"the metric function failed: {type(err).__name__}: {err}") from None
        values = value if isinstance(value, dict) else {"metric": value}
        try:
            return {str(k): float(v) for k, v in values.items()}
        except (TypeError, ValueError):
            raise DPDLError(
                f"the metric function must return a number or a dict of numbers, got {value!r}"
            ) from None

    # ------------------------------------------------------------------ evaluation
    def _held_out_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> float:
        if self.loss == "cross_entropy":
            # the fused mean: the same bits as runs before the trainer existed
            return float(torch.nn.functional.cross_entropy(outputs, targets))
        return float(_per_record_loss(self.loss)(outputs, targets).mean())

    def _evaluate(self, sim: Simulator) -> dict[str, float]:
        sets, nan = self._eval, math.nan
        classification = self.loss == "cross_entropy"
        row = {}
        if sets["x_train"] is not None:  # unsafe_train_metrics: labelled as unaccounted
            row[UNACCOUNTED_TRAIN_LOSS] = sim.average_loss(sets["x_train"], sets["y_train"])
        row |= dict.fromkeys(
            ("test_loss", "test_accuracy", "node_accuracy_mean", "node_accuracy_worst",
             "val_loss", "val_accuracy"), nan,
        )  # fmt: skip
        if sets["x_val"] is not None:
            val_out = sim.predict_average(sets["x_val"])
            row["val_loss"] = self._held_out_loss(val_out, sets["y_val"])
            if classification:
                row["val_accuracy"] = float(accuracy(val_out, sets["y_val"]))
        if sets["x_test"] is None:
            return row
        out = sim.predict_average(sets["x_test"])
        row["test_loss"] = self._held_out_loss(out, sets["y_test"])
        if classification:
            nodes = slice(0, min(self.training.eval_node_samples, len(sets["x_test"])))
            node_acc = sim.node_accuracies(sets["x_test"][nodes], sets["y_test"][nodes])
            row |= {
                "test_accuracy": float(accuracy(out, sets["y_test"])),
                "node_accuracy_mean": float(node_acc.mean()),
                "node_accuracy_worst": float(node_acc.min()),
            }
        if self.metric is not None:
            row |= self._metric_values(out, sets["y_test"])
        return row

    # ------------------------------------------------------------------ training
    def _factory(self) -> Callable[..., Simulator]:
        if self.engine_factory is not None:
            return self.engine_factory
        if self.runtime == "distributed":
            from dpdl.engine.distributed import DistributedSimulator

            return DistributedSimulator
        return Simulator

    def _engine(self) -> tuple[Simulator, bool]:
        main_process = True
        if self.runtime == "distributed":
            from dpdl.engine import distributed

            distributed.init_from_environment(self.device)
            main_process = distributed.is_main_process()
        secure = self.privacy.secure_noise
        # The sampling and noise streams are secret and the run's own (dpdl.algorithms.randomness).
        root = noise_root(self.entropy, self.seed, self.stream_settings())
        sim = self._factory()(
            self.model, self.node_data, self.topology, lr=self.training.lr,
            expected_batch_size=self.training.batch_size, seed=root, device=self.device,
            loss=self.loss, secure_noise=secure,
        )  # fmt: skip
        del root  # the generators hold the secret now; nothing else should
        require(
            math.isclose(sim.sample_rate, self.schedule.sample_rate),
            f"engine samples at p = {sim.sample_rate} but the schedule is accounted at "
            f"p = {self.schedule.sample_rate}",
        )
        return sim, main_process

    def _open_run_folder(self, main_process: bool):
        """The run folder of a standalone run (``output_dir``): its CSV logger, checkpointer.

        In the distributed runtime the main process writes the run folder; every process
        keeps its own checkpoint file in the folder's ``checkpoints/`` on its own machine
        (:func:`dpdl.engine.checkpoint.process_path`).  Under torchrun the folder is named
        after the job (``TORCHELASTIC_RUN_ID``) unless ``run_name`` says otherwise, so a job
        restarted by ``--max-restarts`` resumes from its checkpoints by itself.
        """
        from dpdl.training.run_folder import make_run_dir

        run_name, resume = self.run_name, self.resume
        if self.runtime == "distributed":
            from dpdl.engine import distributed

            run_name = run_name or distributed.job_run_name(self.name)
        if main_process:
            run_dir = make_run_dir(self.output_dir, self.name, run_name, exist_ok=True)
        if self.runtime == "distributed":
            run_name = distributed.from_main_process(run_dir.name if main_process else None)
            run_dir = Path(self.output_dir) / run_name
            if not resume and distributed.restarted():
                resume = _all_true(checkpoints.process_path(run_dir / "checkpoints" / "run.pt")
                                   .is_file(), self.runtime)  # fmt: skip
        settings = json.dumps(self.describe(), indent=2, default=str) + "\n"
        settings_path = run_dir / "trainer.json"
        state_path = run_dir / "checkpoints" / "run.pt"
        if resume:
            if main_process:
                require(
                    settings_path.is_file() and settings_path.read_text() == settings,
                    f"{run_dir} was started with other settings (trainer.json): refusing to "
                    "resume",
                )
            self._agree(lambda: require(checkpoints.process_path(state_path).is_file(),
                                        f"{run_dir} has no checkpoint to resume from"))
        else:
            self._agree(lambda: require(
                not checkpoints.process_path(state_path).exists() and not (
                    main_process and settings_path.exists()),
                f"{run_dir} holds a run: resume it or choose another run_name"))  # fmt: skip
        if main_process:
            settings_path.write_text(settings)
        checkpoint = self.checkpoint or CellCheckpointer(state_path, self.training.checkpoint_every)
        if resume and checkpoint.resume is None:
            checkpoint.resume = checkpoints.load_for_resume(state_path)
        logger = CSVLogger(run_dir / "metrics.csv") if main_process else None
        return run_dir, logger, checkpoint

    def describe(self) -> dict[str, Any]:
        """The run's settings, JSON-friendly (written to ``trainer.json``; no data, no secret)."""
        from dpdl.models import num_params

        return {
            "algorithm": self.spec.label,
            "epsilon": self.epsilon,
            "privacy": self.privacy.model_dump(mode="json", exclude={"epsilon"}),
            "training": self.training.model_dump(mode="json"),
            "steps": self.steps,
            "sample_rate": self.sample_rate,
            "topology": self.topology.describe(),
            "records_per_node": self.records_per_node,
            "model": {"class": type(self.model).__name__, "parameters": num_params(self.model)},
            "loss": _loss_name(self.loss),
            "entropy": self.entropy,
            "seed": self.seed if self.entropy == "seed" else None,
            "runtime": self.runtime,
        }

    def step_sizes(self) -> np.ndarray:
        """γ_k = lr · lr_decay^(−k/K) for k < K (the constant lr when lr_decay = 1)."""
        k = np.arange(self.steps)
        return self.training.lr * self.training.lr_decay ** (-k / self.steps)

    def run_digest(self) -> str:
        """SHA-256 of :meth:`stream_settings` and the schedule's clip bounds and noise stds: a
        checkpoint records it, and a resume by any other run is refused."""
        if self._run_digest is None:
            digest = hashlib.sha256(settings_digest(self.stream_settings()).encode())
            for values in (self.schedule.clip, self.schedule.sigma):
                if values is not None:
                    digest.update(np.ascontiguousarray(values, dtype=np.float64).tobytes())
            self._run_digest = digest.hexdigest()
        return self._run_digest

    def stream_settings(self) -> dict[str, Any]:
        """What a seeded run's streams are derived from: every setting that shapes training
        (not where it runs, how it is evaluated or how often it saves), the initial model's
        parameters and what it computes, the loss, and the seed.  The data enter per node
        (their fingerprints)."""
        settings = self.describe()
        settings["privacy"] = {k: v for k, v in settings["privacy"].items()
                               if k not in _REPORTING_PRIVACY}  # fmt: skip
        settings["training"] = {k: v for k, v in settings["training"].items()
                                if k in _TRAINING_SHAPING}  # fmt: skip
        settings["model"]["initial"] = _parameters_digest(self.model)
        settings["model"]["computes"] = self._behaviour_digest()
        settings["seed"] = self.seed
        for where in ("runtime", "entropy"):
            settings.pop(where)
        return settings

    def _behaviour_digest(self) -> str:
        """SHA-256 of what the model and the loss compute, as code: the module tree and the
        code of every module class's ``forward``, and the loss's code.  Two models (or
        losses) of one class and parameters that compute different things (a relu for a
        tanh, another lambda) thus get other streams; unlike outputs, code does not depend
        on the device or the thread count."""
        classes = sorted({type(m) for m in self.model.modules()}, key=lambda c: c.__qualname__)
        forwards = [_code_fingerprint(getattr(c, "forward", None)) for c in classes]
        loss = self.loss if isinstance(self.loss, str) else _code_fingerprint(self.loss)
        return settings_digest([repr(self.model), forwards, loss])

    def fit(self) -> TrainingResult:
        """Train; returns a :class:`TrainingResult` (see there).  With ``output_dir``, the run
        folder is written as it goes (metrics.csv row by row, results.json at the end).  In
        the distributed runtime the callbacks run on the main process only, unless
        ``callbacks_on="all"``."""
        sim, main_process = self._engine()
        callbacks = list(self.callbacks) if main_process or self.callbacks_on == "all" else []
        run_dir, logger, checkpoint = None, None, self.checkpoint
        if self.output_dir is not None:
            run_dir, logger, checkpoint = self._open_run_folder(main_process)
            if logger is not None:
                callbacks.insert(0, logger)
        try:
            result = self._train(sim, callbacks, checkpoint, main_process)
        finally:
            if logger is not None:
                logger.close()
        if run_dir is not None:
            if main_process:
                from dpdl.training.results import write_results

                cell = {k: v for k, v in result.record.items() if k != "rows"}
                write_results(run_dir, [cell], plot_title=self.name)
            if result.status == "ok" and checkpoint is not None:
                checkpoints.remove(checkpoint.path)  # finished: nothing left to resume
            result.run_dir = run_dir
        return result

    def _train(self, sim: Simulator, callbacks, checkpoint: CellCheckpointer | None,
               main_process: bool = True):  # fmt: skip
        spec, schedule, ledger, privacy = self.spec, self.schedule, self.ledger, self.privacy
        rows: list[dict[str, Any]] = []
        eps_target = self.epsilon

        def emit(row: dict[str, Any]) -> None:
            rows.append(row)
            evaluation = Evaluation(
                iteration=row["iteration"],
                metrics={k: v for k, v in row.items() if k not in _ROW_LABELS
                         and k not in ("epsilon_clt", "epsilon_certified")},
                epsilon_certified=row["epsilon_certified"],
                epsilon_clt=row["epsilon_clt"],
                row=row,
            )  # fmt: skip
            for callback in callbacks:
                callback(evaluation)

        def record(iteration: int, spent: tuple | None = None) -> dict[str, Any]:
            eps_clt, eps_cert, method = spent or _spent(privacy, ledger, final=False)
            row = {
                "iteration": iteration, "algorithm": spec.label, "seed": self.seed,
                "epsilon_target": math.nan if eps_target is None else eps_target,
                **self._evaluate(sim), "epsilon_clt": eps_clt, "epsilon_certified": eps_cert,
                "epsilon_certified_method": method,
            }  # fmt: skip
            emit(row)
            return row

        from tqdm.auto import tqdm

        label = spec.label + ("" if eps_target is None else f" eps={eps_target:g}")
        bar = tqdm(
            total=self.steps,
            desc=f"{label} seed={self.seed}",
            disable=None if self.progress and main_process else True,
            leave=False,
            dynamic_ncols=True,
        )
        status, message = "ok", ""
        started = time.perf_counter()
        first_step = 0
        if checkpoint is not None and checkpoint.resume is not None:
            saved = checkpoint.resume
            # Replayed steps re-send the noise already sent: only the very same run may do so
            # (another clip bound or schedule would release the difference without noise).
            require(
                saved.get("run_digest") == self.run_digest(),
                f"checkpoint {checkpoint.path} was saved by a run with other settings (clip, "
                "schedule, model, seed or topology): resuming would re-send its noise under "
                "them; refusing",
            )
            checkpoints.restore(sim, saved["engine"])
            if self.runtime == "distributed":
                from dpdl.engine import distributed

                require(distributed.same_on_every_rank(sim.iteration),
                        "the processes' checkpoints are at different steps (the job stopped "
                        "while one was saving): refusing to resume")  # fmt: skip
            if ledger is not None:
                # The saved ledger, not a fresh one: the steps already spent stay spent.  It must
                # describe this very run (same p, δ, budget, accountant) and this very iteration.
                restored = PrivacyLedger.from_json(saved["ledger"])
                same = (
                    (restored.sample_rate, restored.delta, restored.accountant)
                    == (ledger.sample_rate, ledger.delta, ledger.accountant)
                    and restored.epsilon_budget <= ledger.epsilon_budget
                    and restored.steps_taken == sim.iteration
                )
                require(same, f"checkpoint {checkpoint.path} does not belong to this cell")
                ledger = restored
            first_step = sim.iteration
            for row in json.loads(saved["rows"]):
                emit(row)
            bar.update(first_step)
        else:
            record(0)
            if checkpoint is not None and checkpoint.every:
                # Before the first step: a resume after a crash at any later step replays the very
                # noise already sent, never fresh noise for steps whose messages left the node.
                checkpoint.save(sim, ledger, rows, self.run_digest())
        every = self.training.eval_every
        save_every = checkpoint.every if checkpoint is not None else None
        try:
            z, lrs = schedule.noise_multipliers, self.step_sizes()
            for k in range(first_step, self.steps):
                if schedule.private:
                    ledger.record_step(float(z[k]))
                    sim.step(private=True, clip=float(schedule.clip[k]),
                             sigma=float(schedule.sigma[k]), lr=float(lrs[k]))  # fmt: skip
                else:
                    sim.step(private=False, lr=float(lrs[k]))
                bar.update(1)
                done = k + 1
                if done % every == 0 and done < self.steps:
                    row = record(done)
                    bar.set_postfix(
                        acc=f"{row['test_accuracy']:.3f}", eps=f"{row['epsilon_certified']:.3g}"
                    )
                if save_every and done % save_every == 0 and done < self.steps:
                    checkpoint.save(sim, ledger, rows, self.run_digest())
        except NonFiniteUpdate as err:
            status, message = "diverged", str(err)
        finally:
            bar.close()
        seconds = time.perf_counter() - started
        # The epsilon of every step the ledger recorded (a step is recorded before it starts,
        # so a diverged step counts): what a halted run reports too, never a stale row's.
        spent = _spent(privacy, ledger, final=True)
        if status == "ok":
            if not sim.all_finite():
                status, message = "diverged", f"non-finite parameters after step {self.steps - 1}"
            else:
                record(self.steps, spent)
        eps_clt, eps_cert, method = spent
        final_row = rows[-1] | {"epsilon_clt": eps_clt, "epsilon_certified": eps_cert}
        unaccounted = [UNACCOUNTED_TRAIN_LOSS] if self.training.unsafe_train_metrics else []
        if not schedule.private:  # a non-private baseline: everything it releases
            unaccounted = ["model", "metrics", *unaccounted]
        cell = {
            "algorithm": spec.label,
            "base_algorithm": spec.name,
            "seed": self.seed,
            "epsilon_target": eps_target,
            "delta": privacy.delta if schedule.private else None,
            "calibrated_with": schedule.calibrated_with,
            "noise_entropy": self.entropy,
            "secure_noise": privacy.secure_noise,
            "private": schedule.private,
            "status": status,
            "message": message,
            "steps": self.steps,
            "steps_done": sim.iteration,
            "sample_rate": self.sample_rate,
            "train_seconds": seconds,
            "final": {
                k: _json_number(v)
                for k, v in final_row.items()
                if k not in ("algorithm", "seed", "epsilon_target", "epsilon_certified_method")
            },
            "certified_method": method,
            "steps_spent": None if ledger is None else ledger.steps_taken,
            "unaccounted_outputs": unaccounted,
            "ledger_epsilon_spent": None if ledger is None else ledger.epsilon_spent(),
            "ledger_accountant": None if ledger is None else ledger.accountant,
            "schedule": schedule.to_dict(),
            "rows": rows,
        }
        return TrainingResult(
            model=_module_with(self.model, sim.average_params()),
            ledger=ledger,
            epsilon=eps_cert,
            epsilon_clt=eps_clt,
            delta=privacy.delta if schedule.private else None,
            history=rows,
            schedule=schedule,
            status=status,
            message=message,
            record=cell,
            _template=self.model,
            _node_params=sim.gather_debiased_params() if self.gather_node_models
            else sim.debiased_params(),
            node_indices=list(range(self.topology.n)) if self.gather_node_models
            else list(range(self.first_node, self.first_node + self.node_data.n_nodes)),
        )


def train(model: nn.Module, data: Sequence | NodeData, **options: Any) -> TrainingResult:
    """``DecentralizedTrainer(model, data, **options).fit()``."""
    return DecentralizedTrainer(model, data, **options).fit()


# --------------------------------------------------------------------------- helpers
def _node_count(data, topology, nodes: int | None) -> int:
    """How many nodes the run has: ``nodes``, else what the topology or the data say."""
    import networkx as nx

    from dpdl.topology import Topology

    if nodes is not None:
        require(isinstance(nodes, int) and not isinstance(nodes, bool) and nodes >= 2,
                f"nodes must be an integer >= 2, got {nodes!r}")  # fmt: skip
        return nodes
    if isinstance(topology, Topology):
        return int(topology.n)
    if isinstance(topology, nx.Graph):
        return int(topology.number_of_nodes())
    if isinstance(data, NodeData):
        return data.n_nodes
    if isinstance(data, Sequence) and not isinstance(data, str | bytes):
        return len(data)
    raise DPDLError("with data given as a function of the node index, say how many nodes there "
                    "are: nodes=N, or a topology that knows (a Topology or networkx graph)")


def _local_node_data(data, n: int, first: int, count: int, device) -> NodeData:
    """The padded data of nodes first .. first + count - 1 only: from a NodeData of every node
    (or of just those), a sequence of one data set per node, or a function of the node index
    called for those nodes alone (the distributed runtime's parties keep their own data)."""
    from dpdl.data import stack_local_datasets

    if isinstance(data, NodeData):
        if data.n_nodes == count:
            return data
        require(data.n_nodes == n, f"the node data hold {data.n_nodes} nodes, the run has {n}")
        return data.block(first, count)
    if callable(data) and not isinstance(data, Sequence):
        local = []
        for i in range(first, first + count):
            try:
                local.append(data(i))
            except DPDLError:
                raise
            except Exception as err:
                raise DPDLError(f"the data function failed for node {i}: {type(err).__name__}: "
                                f"{_first_line(err)}") from None  # fmt: skip
    else:
        require(isinstance(data, Sequence) and not isinstance(data, str | bytes),
                "data must be a list with one local data set per node, a function of the node "
                f"index, or NodeData; got {type(data).__name__}")  # fmt: skip
        require(len(data) == n, f"the data list has {len(data)} nodes, the topology {n}")
        local = list(data[first : first + count])
    X, Y, mask = stack_local_datasets(local, first_node=first, min_nodes=1 if count < n else 2)
    return NodeData.from_arrays(X, Y, mask, device=device, first_node=first)


def _as_topology(topology, n: int, params: dict[str, Any], seed: int):
    from dpdl.topology import Topology, from_mixing_function, from_networkx, make_topology

    if isinstance(topology, str):
        return make_topology(topology, n, seed=seed, **params)
    if isinstance(topology, Topology):
        require(not params, "topology_params apply to a topology given by name or function only")
        require(
            topology.n == n,
            f"topology {topology.name!r} has {topology.n} nodes but the data is split over {n}",
        )
        return topology
    try:
        import networkx as nx
    except ImportError:  # pragma: no cover - networkx is a dependency
        nx = None
    if nx is not None and isinstance(topology, nx.Graph):
        require(not params, "topology_params do not apply to a networkx graph")
        require(
            topology.number_of_nodes() == n,
            f"the networkx graph has {topology.number_of_nodes()} nodes but the data is split "
            f"over {n}",
        )
        return from_networkx(topology)
    if callable(topology):
        unknown = sorted(set(params) - {"period"})
        require(not unknown, f"a mixing-matrix function takes only topology_params 'period', "
                             f"not {unknown}")  # fmt: skip
        return from_mixing_function(topology, n, period=params.get("period"))
    raise DPDLError(
        "topology must be a name, a dpdl Topology, a networkx graph or a function k -> P^k; "
        f"got {type(topology).__name__}"
    )


def _check_loss(loss):
    if callable(loss):
        return loss
    require(
        isinstance(loss, str) and loss in LOSSES,
        f"unknown loss {loss!r}; choose one of {', '.join(LOSSES)} or give a callable "
        "(outputs, targets) -> per-record losses",
    )
    return loss


def _per_record_loss(loss):
    return loss if callable(loss) else LOSSES[loss]


def _loss_name(loss) -> str:
    return loss if isinstance(loss, str) else getattr(loss, "__qualname__", repr(loss))


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else ""
