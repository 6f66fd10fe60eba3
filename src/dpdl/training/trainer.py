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
paper's accountant; it may understate epsilon, MATH.md §2) and a certified PLD (or RDP) upper
bound; at evaluation points the PLD bound is the cheap blocked one, for the final row the
exact composition (``final_mode``).
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import PrivacySchedule
from dpdl.algorithms.builtin import ScheduleAlgorithm
from dpdl.algorithms.dyn_d2p import GAUSSIAN_RELEASE
from dpdl.algorithms.randomness import settings_digest
from dpdl.algorithms.registry import algorithm_digest
from dpdl.algorithms.transforms import sgd
from dpdl.engine import checkpoint as checkpoints
from dpdl.engine.runtime import require_share_carrier
from dpdl.engine.simulator import NodeData, Sampling, Simulator, StepOptions
from dpdl.errors import DPDLError, require
from dpdl.training import inputs
from dpdl.training.callbacks import (
    METRIC_COLUMNS,
    UNACCOUNTED_TRAIN_LOSS,
    CSVLogger,
    Evaluation,
    TensorBoardLogger,
)
from dpdl.training.evaluation import Evaluator
from dpdl.training.fingerprints import (
    behaviour_digest,
    mixing_digest,
    parameters_digest,
    state_digest,
)
from dpdl.training.hooks import (
    CalibrationProgress,
    CellCheckpointer,
    Checkpoints,
    Evaluations,
    ProgressBar,
)
from dpdl.training.loop import RunState, run_steps
from dpdl.training.node_eval import hold_out_node_eval, node_eval_sets
from dpdl.training.plan import (
    RunPlan,
    approve_schedule,
    build_schedule,
    epsilon_per_node,
    epsilon_spent,
    node_rates,
    noise_root,
    resolve_steps,
    trust_noise_factor,
)
from dpdl.training.results import RunRecord
from dpdl.training.settings import (
    LATER_PRIVACY_DEFAULTS,
    REPORTING_PRIVACY,
    SHAPING_TRAINING,
    AlgorithmSpec,
    PrivacySection,
    TrainingSection,
    check_neighboring,
    with_overrides,
    without_later_defaults,
)
from dpdl.training.specs import (
    EvaluationSpec,
    ExecutionSpec,
    OutputSpec,
    build_spec,
    spec_fields,
)

# The keywords that set one field of a spec (eval_data=, output_dir=, seed= ...), and the
# trainer's own keywords that are neither a spec's nor a section's.
_SPECS = {"evaluation": EvaluationSpec, "output": OutputSpec, "execution": ExecutionSpec}
_SPEC_KEYWORDS = {what: spec_fields(cls) for what, cls in _SPECS.items()}
_PROBLEM_KEYWORDS = {"loss": "cross_entropy", "topology_params": None, "nodes": None}

# The facade's own names and those a caller of it needs.  The plan's functions
# (build_schedule, approve_schedule, noise_root, resolve_steps) are importable from here as
# before, but belong to dpdl.training.plan.
__all__ = [
    "METRIC_COLUMNS",
    "UNACCOUNTED_TRAIN_LOSS",
    "CSVLogger",
    "CellCheckpointer",
    "DecentralizedTrainer",
    "Evaluation",
    "EvaluationSpec",
    "ExecutionSpec",
    "OutputSpec",
    "RunRecord",
    "TensorBoardLogger",
    "TrainingResult",
    "train",
]


# --------------------------------------------------------------------------- result
@dataclass
class TrainingResult:
    """The outcome of :meth:`DecentralizedTrainer.fit`.

    ``model``: the network-average model x̄ = Σ x_i / Σ w_i as an ``nn.Module``;
    ``node_models``: every node's de-biased model z_i = x_i / w_i (each a copy of the initial
    module, never run, with the trained parameters: its buffers and attributes are the
    initial ones, since only the parameters carry noise); ``ledger``: the privacy
    ledger of the steps taken (None for SGP); ``epsilon``: the certified epsilon spent
    (PLD/RDP, ``inf`` for SGP) and ``epsilon_clt`` the CLT approximation beside it;
    ``history``: one metrics row per evaluation; ``record``: the run's :class:`RunRecord`
    (its entry of ``results.json``); ``status`` "ok", "stopped" (a callback returned True;
    ``epsilon`` is that of the steps taken) or "diverged" (``message`` says where).
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
    record: RunRecord
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
    """A copy of ``template`` (the initial module, never run) with ``params``: what the noisy
    updates produced, and nothing a forward could have left in a module."""
    module = copy.deepcopy(template)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(params[name])
    return module


def _communication(engine) -> dict[str, list[int]] | None:
    """What every node sent (an engine_factory's engine may not count it)."""
    count = getattr(engine, "communication", None)
    return None if count is None else count()


def _json_number(v):
    if isinstance(v, list):  # a per-node vector (node_local_*)
        return [_json_number(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# --------------------------------------------------------------------------- the trainer
# A node this many times smaller than the median one drives the common rate b / J_min: warned.
SMALL_NODE_FACTOR = 4


class SmallNodeWarning(UserWarning):
    """One node is so small that it sets every node's sampling rate (uniform sampling)."""


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
      ``"name@clt|pld|rdp"``) and ``epsilon``, its target (default 1.0).
    * ``privacy``: a :class:`PrivacySection` or a dict of one (a config's [privacy] table, but
      its target epsilon, which is ``epsilon``): ``delta``, ``neighboring`` (the relation
      every epsilon is stated and calibrated for: "replace-one", the default, node sizes
      public and released; or "add-remove", node sizes secret: needs ``steps`` and
      ``sample_rate`` and releases nothing size-dependent), ``calibrate``, ``clip``,
      ``clip0``, ``rho_c``, ``rho_mu``; accounting: ``certified_accountant``,
      ``eval_blocks``, ``final_mode``, ``final_blocks``, ``calibration_blocks``.
    * ``training``: a :class:`TrainingSection` or a dict of one (a config's [training]):
      ``batch_size`` (expected b), ``sampling`` ("uniform": every node at b / J_min;
      "per-node": node i at b / J_i, each node's epsilon in ``record.epsilon_per_node``),
      ``sample_rate`` (q at every node, a hyper-parameter; the sum is still divided by b),
      ``lr`` (γ), ``lr_decay``, ``steps`` or ``epochs``,
      ``momentum`` (heavy-ball β ∈ [0, 1)), ``weight_decay`` (λ ≥ 0), ``local_steps`` (H:
      gossip every H-th step; see MATH.md §4), ``eval_every``,
      ``eval_test_samples``/``eval_node_samples``, ``node_eval_share``,
      ``unsafe_train_metrics``,
      ``eval_train_samples``, ``checkpoint_every``.
    * Every field of either may be given as a keyword of its own, which overrides it
      (``delta=1e-5``, ``steps=500``); None leaves the section's value (else its default).
      Giving ``steps`` or ``epochs`` replaces both.
    * ``loss`` (keyword): a name of ``LOSSES`` or a callable ``(outputs, targets) ->
      (batch,)`` per-record losses (default "cross_entropy"); ``topology_params`` (keyword):
      the named topology's parameters; ``nodes`` (keyword): the number of nodes when
      ``data`` is a function of the node index.
    * ``evaluation``: an :class:`EvaluationSpec` (or a dict of one), ``output``: an
      :class:`OutputSpec`, ``execution``: an :class:`ExecutionSpec` (:mod:`dpdl.training.
      specs`).  Each field of theirs may be given as a keyword of its own, which overrides
      it (None leaves it), as a section's: ``eval_data=``, ``output_dir=``, ``seed=`` ...
    * ``eval_data`` ``(inputs, targets)``, ``validation_data`` (held-out records to choose
      parameters on: ``val_loss``, ``val_accuracy``): evaluation data the user declares
      public (metrics on them are released as they are); ``node_eval_data``
      ``[(x_0, y_0), ...]`` (or a function of the node index): one evaluation set per node,
      on which node i's de-biased model z_i is scored (``node_local_accuracy`` /
      ``node_local_loss`` vectors in the rows, their mean and worst as ``node_local_*``),
      also evaluation data the user declares public, released as scores; or
      ``node_eval_share=s``: each record is held out with probability s by a keyed hash of
      the record (never trained on; choosing it declares them public); ``metric``
      ``(outputs, targets) -> float | dict``, ``callbacks``: callables receiving an
      :class:`Evaluation`.  Nothing computed from the nodes' training records leaves the
      trainer without noise; ``unsafe_train_metrics=True`` adds the noise-free training loss
      on ``train_eval_data`` (default: ``eval_train_samples`` of the nodes' records) as
      ``unaccounted_train_loss`` wherever it goes (for debugging, never for real data).
      ``callbacks_on`` ("main" | "all"), ``gather_node_models``: the evaluation spec's.
    * ``device``, ``runtime`` ("simulator" | "distributed": started by torchrun; or a
      :class:`dpdl.engine.runtime.Runtime`), ``entropy`` ("os", the default: secret noise;
      "seed": reproducible from ``seed``), ``seed``, ``engine_factory``: the execution
      spec's.
    * ``output_dir``: write a run folder there (``metrics.csv``, ``results.json``,
      ``curves.png``, ``trainer.json``), ``run_name``, ``name``, ``resume``, ``progress``,
      ``checkpoint``: the output spec's.

    Everything is validated on construction and nothing is written before :meth:`fit`.
    """

    def __init__(
        self,
        model: nn.Module,
        data: Sequence | NodeData,
        *,
        topology: Any = "exp",
        algorithm: str | AlgorithmSpec = "dyn-d2p",
        epsilon: float | None = 1.0,
        privacy: PrivacySection | dict[str, Any] | None = None,
        training: TrainingSection | dict[str, Any] | None = None,
        evaluation: EvaluationSpec | dict[str, Any] | None = None,
        output: OutputSpec | dict[str, Any] | None = None,
        execution: ExecutionSpec | dict[str, Any] | None = None,
        **options: Any,
    ):
        # the keywords of a spec's fields, and loss / topology_params / nodes, out of options:
        # what is left are the sections' fields (or unknown, refused by _settings)
        given = {what: {k: options.pop(k) for k in fields if k in options}
                 for what, fields in _SPEC_KEYWORDS.items()}  # fmt: skip
        problem = {k: options.pop(k, default) for k, default in _PROBLEM_KEYWORDS.items()}
        self._settings(algorithm, epsilon, privacy, training, options)
        self.execution: ExecutionSpec = build_spec(ExecutionSpec, execution, given["execution"],
                                                   "execution")  # fmt: skip
        self.output: OutputSpec = build_spec(OutputSpec, output, given["output"], "output")
        self.evaluation: EvaluationSpec = build_spec(EvaluationSpec, evaluation,
                                                     given["evaluation"], "evaluation")
        self._options()
        self._run_digest: str | None = None
        require(self.evaluation.node_eval_data is None or not self.training.node_eval_share,
                "give node_eval_data (one set per node) or training.node_eval_share (each "
                "node holds out a share of its records), not both")  # fmt: skip
        self._inputs(model, data, topology, problem["topology_params"] or {}, problem["nodes"],
                     problem["loss"])  # fmt: skip
        self._plan()
        # Each process checks its own nodes' sets (they differ per rank): all agree after.
        self.runtime.agree(lambda: self._build_evaluator(self.evaluation))

    # ------------------------------------------------------------------ validation
    def _settings(self, algorithm, epsilon, privacy, training, settings: dict[str, Any]) -> None:
        """The algorithm, its target epsilon and the privacy and training settings (the same
        validators as a config's [privacy] and [training] tables)."""
        try:
            self.spec = (
                algorithm
                if isinstance(algorithm, AlgorithmSpec)
                else AlgorithmSpec.parse(algorithm)
            )
        except ValueError as err:
            raise DPDLError(str(err)) from None
        private = self.spec.private
        require(
            not private or epsilon is not None,
            f"algorithm {self.spec.label!r} is private and needs a target epsilon",
        )
        unknown = sorted(set(settings) - set(PrivacySection.model_fields)
                         - set(TrainingSection.model_fields) - {"epsilon"})  # fmt: skip
        require(not unknown, f"unknown trainer option(s): {', '.join(unknown)}")
        require(not _sets(privacy, "epsilon"), "the target epsilon is the trainer's epsilon=, "
                "not privacy's epsilon (a config's may list several; a trainer trains one)")
        self.privacy = with_overrides(
            PrivacySection, privacy,
            {k: v for k, v in settings.items() if k in PrivacySection.model_fields}
            | {"epsilon": epsilon if private else 1.0}, "privacy settings",
        )  # fmt: skip
        if settings.get("steps") is not None or settings.get("epochs") is not None:
            training = _without(training, ("steps", "epochs"))
        self.training = with_overrides(
            TrainingSection, training,
            {k: v for k, v in settings.items() if k in TrainingSection.model_fields},
            "training settings",
        )  # fmt: skip
        check_neighboring(self.privacy, self.training)
        correlation = self.privacy.noise_correlation
        require(not correlation.pairwise_keys or private,
                f"privacy.correlation = {correlation.name!r} correlates the noise of private "
                f"steps, and {self.spec.label!r} is not private")  # fmt: skip
        self.epsilon = float(epsilon) if private else None

    def _options(self) -> None:
        """The execution spec's values the trainer reads everywhere, and what the runtime
        cannot do."""
        execution = self.execution
        self.runtime, self.device = execution.runtime, execution.device
        self.entropy, self.seed = execution.entropy, execution.seed
        require(not self.training.unsafe_train_metrics or self.runtime.holds_every_record,
                "unsafe_train_metrics needs every node's records in one process: not with the "
                f"{self.runtime.name} runtime")  # fmt: skip

    def _inputs(self, model, data, topology, topology_params, nodes, loss) -> None:
        """The model, topology, loss and the hosted nodes' data, each checked."""
        from dpdl.models.validation import throwaway_copy, validate_model

        # The user's module is never run nor moved: the engine trains a copy of it, and the
        # released models are made from a second copy that no forward ever ran on (its
        # buffers and attributes the initial ones, whatever the engine's copy went through).
        self.model = throwaway_copy(validate_model(model), self.device)
        self._template = throwaway_copy(self.model)
        n = inputs.node_count(data, topology, nodes)
        self.topology = inputs.as_topology(topology, n, topology_params, self.seed)
        self.first_node, hosted = self.runtime.hosted_block(n, self.device)
        self.loss = inputs.check_loss(loss)
        # Every process loads, checks and probes only the nodes it hosts; in the distributed
        # runtime all ranks then agree that every rank passed (no record crosses a rank).
        self.runtime.agree(lambda: self._load_and_probe(data, n, hosted))
        # Every node's size: public under replace-one (gathered, used, released); under
        # add-remove secret, so never gathered across processes nor released (None).
        self.records_per_node = (
            None if self._sizes_secret
            else self.runtime.all_node_counts([int(c) for c in self.node_data.counts], n)
        )  # fmt: skip

    def _load_and_probe(self, data, n: int, hosted: int) -> None:
        self.node_data = inputs.local_node_data(data, n, self.first_node, hosted, self.device)
        self._classes = inputs.probe_model(self.model, self.node_data, self.loss, self.device,
                                           self.first_node)  # fmt: skip
        self._held_out = None
        if self.training.node_eval_share:
            # Before anything else sees the sizes: the held-out records are no training
            # records (never sampled; J_i, b / J_min and the accounting use the rest).
            self.node_data, self._held_out = hold_out_node_eval(
                self.node_data, self.training.node_eval_share, self.seed, self.first_node
            )

    def _build_evaluator(self, spec: EvaluationSpec) -> None:
        from dpdl.models.validation import throwaway_copy

        node_sets = self._held_out
        if spec.node_eval_data is not None:
            node_sets = node_eval_sets(spec.node_eval_data, self.topology.n, self.first_node,
                                       self.node_data.n_nodes, node_data=self.node_data,
                                       loss=self.loss, classes=self._classes,
                                       device=self.device)  # fmt: skip
        self.evaluator = Evaluator.build(
            throwaway_copy(self.model), spec, node_data=self.node_data, training=self.training,
            loss=self.loss, classes=self._classes, seed=self.seed, device=self.device,
            node_sets=node_sets,
        )  # fmt: skip

    def _plan(self) -> None:
        """Steps, sampling, schedule, and the ledger's approval of all of it."""
        counts, training = self.records_per_node, self.training
        b, sampling = training.batch_size, training.sampling
        require(
            training.sample_rate is not None or b <= min(counts),
            f"batch_size = {b:g} exceeds the smallest local data set (node "
            f"{int(np.argmin(counts or [0]))} has {min(counts or [0])} records)",
        )
        self._check_small_nodes()
        # Every node's own rate; the schedule is accounted at the largest (b / J_min, or the
        # sample_rate given).
        self.sample_rates, self.sample_rate = node_rates(training, self.topology.n, counts)
        self.steps = resolve_steps(training.steps, training.epochs, counts, b, sampling,
                                   training.sample_rate)  # fmt: skip
        shown = self.output.progress and self.runtime.is_main_process()
        with CalibrationProgress(f"calibrating {self.spec.label}", shown) as progress:
            self._check_trust_model()
            trust = trust_noise_factor(self.privacy, self.topology,
                                       -(-self.steps // training.local_steps))
            self.schedule = build_schedule(
                self.privacy, self.spec, self.epsilon, self.steps, self.sample_rate, progress,
                trust,
            )
        # per-node rates (and epsilons) only where they can differ: never under add-remove,
        # whose one rate is a hyper-parameter
        rates = None if self._sizes_secret else self.sample_rates
        self.ledger = (
            approve_schedule(self.privacy, self.schedule, rates)
            if self.schedule.private else None
        )  # fmt: skip
        self.plan = RunPlan.of(self.schedule, self.training)

    def _check_small_nodes(self) -> None:
        """δ below 1/J_min (refused: a δ that large allows publishing a whole record of the
        smallest node), and a warning naming a node so small that it drives the common rate
        b / J_min far above the others'.  Under add-remove only the hosted nodes' own sizes
        are read (they stay on this process)."""
        counts = self.records_per_node or [int(c) for c in self.node_data.counts]
        first = 0 if self.records_per_node else self.first_node
        smallest = int(np.argmin(counts))
        j_min = int(counts[smallest])
        if self.spec.private:
            require(self.privacy.delta < 1.0 / j_min,
                    f"privacy.delta = {self.privacy.delta:g} is not below 1/J_min = 1/{j_min} "
                    f"(node {first + smallest} has {j_min} records): such a delta allows "
                    "releasing a whole record; take delta well below 1/J_min")  # fmt: skip
        training = self.training
        median = float(np.median(counts))
        if (training.sampling == "uniform" and training.sample_rate is None
                and j_min * SMALL_NODE_FACTOR <= median):
            b = training.batch_size
            warnings.warn(
                f"node {first + smallest} has {j_min} records (median {median:g}): it sets "
                f"every node's sampling rate to b / J_min = {b:g}/{j_min} = {b / j_min:.3g}; "
                "consider training.sampling = \"per-node\" or leaving that node out",
                SmallNodeWarning, stacklevel=3)  # fmt: skip

    def _check_trust_model(self) -> None:
        """Zero-sum shares need a runtime whose mixer carries them.  Sec-LDP needs every honest
        pair's secret unknown to the eavesdropper: refused where
        the edge keys follow from a seed, or where the public keys cross processes without
        end-to-end authentication (a relay or a man in the middle could substitute its own)."""
        require_share_carrier(self.privacy.noise_correlation, self.runtime)
        if self.privacy.trust_model != "sec-ldp":
            return
        require(self.entropy == "os",
                f"trust_model 'sec-ldp' needs secret edge keys: entropy {self.entropy!r} "
                "derives them from the seed")  # fmt: skip
        require(self.runtime.name == "simulator",
                f"trust_model 'sec-ldp' needs authenticated public keys; the "
                f"{self.runtime.name} runtime exchanges them unauthenticated end to end: "
                "run it in one process, or claim 'curious-neighbours'")  # fmt: skip

    @property
    def _sizes_secret(self) -> bool:
        """Whether the node sizes are secret (add-remove): nothing size-dependent leaves."""
        return self.privacy.neighboring == "add-remove"

    # ------------------------------------------------------------------ training
    def _engine(self) -> tuple[Simulator, bool]:
        """The engine of the hosted nodes, on the run's runtime (which hosts, exchanges and
        mixes), and whether this is the main process."""
        # The sampling and noise streams are secret and the run's own (dpdl.algorithms.randomness).
        # A runtime may keep the root itself (the consortium's: a restarted party must draw
        # the very noise it already sent, never fresh noise over the same records).
        kept = getattr(self.runtime, "stream_root", None)
        root = (kept or noise_root)(self.entropy, self.seed, self._noise_settings())
        # a rate given as a hyper-parameter: the engine reads no node's size for it
        sampling = Sampling(self.training.sampling, self.training.sample_rate)
        sim = (self.execution.engine_factory or Simulator)(
            self.model, self.node_data, self.topology, lr=self.training.lr,
            expected_batch_size=self.training.batch_size, seed=root, device=self.device,
            options=StepOptions(loss=self.loss, correlation=self.privacy.noise_correlation),
            transforms=sgd(momentum=self.training.momentum,
                           weight_decay=self.training.weight_decay),
            sampling=sampling, runtime=self.runtime,
        )  # fmt: skip
        del root  # the generators hold the secret now; nothing else should
        sim.use_algorithm(self.spec.algorithm, self.spec.algorithm_settings)
        require(
            math.isclose(sim.sample_rate, self.schedule.sample_rate)
            and np.array_equal(sim.sample_rates, self.sample_rates),
            f"engine samples at p = {sim.sample_rate} (nodes {sim.sample_rates.tolist()}) but "
            f"the schedule is accounted at p = {self.schedule.sample_rate} (nodes "
            f"{self.sample_rates.tolist()})",
        )
        return sim, self.runtime.is_main_process()

    def _open_run_folder(self, main_process: bool):
        """The run folder of a standalone run (``output_dir``): its CSV logger, checkpointer.

        In the distributed runtime the main process writes the run folder; every process
        keeps its own checkpoint file in the folder's ``checkpoints/`` on its own machine
        (:func:`dpdl.engine.checkpoint.process_path`).  Under torchrun the folder is named
        after the job (``TORCHELASTIC_RUN_ID``) unless ``run_name`` says otherwise, so a job
        restarted by ``--max-restarts`` resumes from its checkpoints by itself.
        """
        from dpdl.training.run_folder import make_run_dir

        output, runtime = self.output, self.runtime
        run_name, resume = output.run_name or runtime.job_run_name(output.name), output.resume
        if main_process:
            run_dir = make_run_dir(output.output_dir, output.name, run_name, exist_ok=True)
        # every process writes into the folder the main process named
        run_dir = output.output_dir / runtime.from_main_process(run_dir.name if main_process
                                                                else None)  # fmt: skip
        if not resume and runtime.restarted():
            resume = runtime.all_true(checkpoints.process_path(run_dir / "checkpoints" /
                                                               "run.pt").is_file())  # fmt: skip
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
            runtime.agree(lambda: require(checkpoints.process_path(state_path).is_file(),
                                          f"{run_dir} has no checkpoint to resume from"))
        else:
            runtime.agree(lambda: require(
                not checkpoints.process_path(state_path).exists() and not (
                    main_process and settings_path.exists()),
                f"{run_dir} holds a run: resume it or choose another run_name"))  # fmt: skip
        if main_process:
            settings_path.write_text(settings)
        checkpoint = output.checkpoint or CellCheckpointer(state_path,
                                                           self.training.checkpoint_every)
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
            # the noise correlation appears only when set: a default run is as before
            "privacy": without_later_defaults(self.privacy.model_dump(
                mode="json", exclude={"epsilon"}), LATER_PRIVACY_DEFAULTS),
            # settings added since the first runs appear only when set: a default run's
            # trainer.json is as before (a resume compares it as text)
            "training": without_later_defaults(self.training.model_dump(mode="json")),
            "steps": self.steps,
            "sample_rate": self.sample_rate,
            "topology": self.topology.describe(),
            "records_per_node": self.records_per_node,
            "model": {"class": type(self.model).__name__, "parameters": num_params(self.model)},
            "loss": inputs.loss_name(self.loss),
            "entropy": self.entropy,
            "seed": self.seed if self.entropy == "seed" else None,
            "runtime": self.runtime.name,
        }

    def step_sizes(self) -> np.ndarray:
        """γ_k = lr · lr_decay^(−k/K) for k < K (the constant lr when lr_decay = 1)."""
        return self.plan.step_sizes

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
        parameters, its whole state and code, the loss, the mixing matrices of the rounds
        the run uses, and the seed.  The data enter per node (their fingerprints)."""
        settings = self.describe()
        settings["privacy"] = {k: v for k, v in settings["privacy"].items()
                               if k not in REPORTING_PRIVACY}  # fmt: skip
        settings["training"] = {k: v for k, v in settings["training"].items()
                                if k in SHAPING_TRAINING}  # fmt: skip
        settings["model"]["initial"] = parameters_digest(self._template)
        settings["model"]["computes"] = behaviour_digest(self._template, self.loss)
        # the whole state and code (every attribute of every submodule, the loss) and the
        # mixing matrices themselves: describe() leaves out what makes two such runs differ
        settings["model"]["state"] = state_digest(self._template, self.loss)
        algorithm, algorithm_settings = self.spec.algorithm, self.spec.algorithm_settings
        # the gossip rounds the run uses: R per step for an algorithm of R rounds
        rounds = self.steps * algorithm.rounds(algorithm_settings)
        settings["topology"]["mixing"] = mixing_digest(self.topology, rounds)
        if not isinstance(algorithm, ScheduleAlgorithm):  # a plugin: its code keys it too
            settings["algorithm_code"] = algorithm_digest(algorithm, algorithm_settings)
        settings["seed"] = self.seed
        for where in ("runtime", "entropy"):
            settings.pop(where)
        return settings

    def _noise_settings(self) -> dict[str, Any]:
        """What the seeded streams are keyed by: :meth:`stream_settings`, or with
        ``common_noise`` (research mode) only what every arm of a comparison shares (the
        number of nodes, the model and the seed; the data enter per node), so that arms of
        other algorithms, privacy or training settings draw the same streams."""
        settings = self.stream_settings()
        if not self.execution.common_noise:
            return settings
        return {"common_noise": True, "nodes": self.topology.n, "model": settings["model"],
                "seed": self.seed}  # fmt: skip

    def fit(self) -> TrainingResult:
        """Train; returns a :class:`TrainingResult` (see there).  With ``output_dir``, the run
        folder is written as it goes (metrics.csv row by row, results.json at the end).  In
        the distributed runtime the callbacks run on the main process only, unless
        ``callbacks_on="all"``."""
        sim, main_process = self._engine()
        evaluation = self.evaluation
        callbacks = (list(evaluation.callbacks) if main_process or evaluation.callbacks_on == "all"
                     else [])  # fmt: skip
        run_dir, logger, checkpoint = None, None, self.output.checkpoint
        if self.output.output_dir is not None:
            run_dir, logger, checkpoint = self._open_run_folder(main_process)
            if logger is not None:
                callbacks.insert(0, logger)
        self._record_at_site(run_dir, checkpoint)
        try:
            result = self._train(sim, callbacks, checkpoint, main_process)
        finally:
            if logger is not None:
                logger.close()
        if run_dir is not None:
            if main_process:
                from dpdl.training.results import write_results

                write_results(run_dir, [result.record.to_dict(rows=False)],
                              plot_title=self.output.name, device=self.device,
                              vector_figures=self.output.vector_figures)  # fmt: skip
            if checkpoint is not None:
                # finished, stopped or diverged: nothing left to resume (a diverged run would
                # replay the same noise into the same divergence), and the file holds every
                # hosted node's secret stream keys, so it must not outlive the run
                checkpoints.remove(checkpoint.path)
            result.run_dir = run_dir
        return result

    def _record_at_site(self, run_dir: Path | None, checkpoint) -> None:
        """Before anything trains or is sent: this run in its site's ledger across runs (fsync'd,
        so a crash still counts it).  A run resumed from its own checkpoint continues the
        release already recorded and is not counted again."""
        from dpdl.training import site_ledger

        site = self.output.site or self.output.output_dir
        if site is None or (checkpoint is not None and checkpoint.resume is not None):
            return
        first, count = self.first_node, self.node_data.n_nodes
        run = self.output.site_run or (run_dir.name if run_dir is not None else self.output.name)
        entry = site_ledger.entry_for(
            run, self.run_digest(), site_ledger.record_set_fingerprint(self.node_data),
            int(sum(int(c) for c in self.node_data.counts)), self.schedule,
            float(np.max(self.sample_rates[first : first + count])))  # fmt: skip
        site_ledger.append_entry(site, entry)

    def _train(self, sim: Simulator, callbacks, checkpoint: CellCheckpointer | None,
               main_process: bool = True) -> TrainingResult:  # fmt: skip
        """The step loop with its hooks: evaluation (the callbacks' rows), the progress bar
        and checkpoints; a resumed run first restores the engine, the ledger and its rows."""
        started = time.perf_counter()
        state = RunState(sim, self.ledger)
        evaluations = Evaluations(self.evaluator, self.privacy, self._row_labels(), callbacks,
                                  self.training.eval_every, self.steps)  # fmt: skip
        if checkpoint is not None and checkpoint.resume is not None:
            self._resume(state, checkpoint, evaluations)
        label = self.spec.label + ("" if self.epsilon is None else f" eps={self.epsilon:g}")
        hooks = [evaluations, ProgressBar(self.steps, f"{label} seed={self.seed}",
                                          self.output.progress and main_process)]  # fmt: skip
        if checkpoint is not None:
            hooks.append(Checkpoints(checkpoint, self.run_digest, self.steps))
        status, message = run_steps(self.plan, state, hooks)
        seconds = time.perf_counter() - started
        # The epsilon of every step the ledger recorded (a step is recorded before it starts,
        # so a diverged step counts): what a halted run reports too, never a stale row's.
        spent = epsilon_spent(self.privacy, state.ledger, final=True)
        if status == "ok":
            if not sim.all_finite():
                status, message = "diverged", f"non-finite parameters after step {self.steps - 1}"
            else:
                evaluations.evaluate(state, self.steps, spent)
        record = self._record(state, status, message, seconds, spent)
        return self._result(state, record, spent)

    def _row_labels(self) -> dict[str, Any]:
        """What every metrics row of this run starts with (after its iteration)."""
        return {"algorithm": self.spec.label, "seed": self.seed,
                "epsilon_target": math.nan if self.epsilon is None else self.epsilon}  # fmt: skip

    def _resume(self, state: RunState, checkpoint: CellCheckpointer,
                evaluations: Evaluations) -> None:  # fmt: skip
        """Continue the checkpoint's run: its engine state and ledger come back, and its rows
        are handed to the callbacks again (a run folder's metrics.csv is written anew)."""
        saved = checkpoint.resume
        # Replayed steps re-send the noise already sent: only the very same run may do so
        # (another clip bound or schedule would release the difference without noise).
        require(
            saved.get("run_digest") == self.run_digest(),
            f"checkpoint {checkpoint.path} was saved by a run with other settings (clip, "
            "schedule, model, seed or topology): resuming would re-send its noise under "
            "them; refusing",
        )
        state.engine.load_state_dict(saved["engine"])
        require(self.runtime.same_on_every_rank(state.engine.iteration),
                "the processes' checkpoints are at different steps (the job stopped "
                "while one was saving): refusing to resume")  # fmt: skip
        if state.ledger is not None:
            state.ledger = self._restored_ledger(saved["ledger"], state.engine.iteration,
                                                 checkpoint.path)  # fmt: skip
        state.done, state.resumed = state.engine.iteration, True
        for row in json.loads(saved["rows"]):
            evaluations.emit(state, row)

    def _restored_ledger(self, saved: str, iteration: int, path: Path) -> PrivacyLedger:
        """The saved ledger, not a fresh one: the steps already spent stay spent.  It must
        describe this very run (same p, node rates, δ, budget, accountant) and this very
        iteration; a ledger saved without node rates (before they were kept) sampled
        uniformly at p."""
        restored, ledger = PrivacyLedger.from_json(saved), self.ledger
        saved_rates = restored.node_sample_rates
        if saved_rates is None and ledger.node_sample_rates is not None:
            saved_rates = np.full(len(self.sample_rates), restored.sample_rate)
        same_rates = (saved_rates is None and ledger.node_sample_rates is None) or (
            saved_rates is not None and ledger.node_sample_rates is not None
            and np.array_equal(saved_rates, ledger.node_sample_rates))  # fmt: skip
        same = (
            (restored.sample_rate, restored.delta, restored.accountant, restored.neighboring,
             restored.releases)
            == (ledger.sample_rate, ledger.delta, ledger.accountant, ledger.neighboring,
                ledger.releases)
            and same_rates
            and restored.epsilon_budget <= ledger.epsilon_budget
            and restored.steps_taken == iteration
        )
        require(same, f"checkpoint {path} does not belong to this cell")
        restored.node_sample_rates = saved_rates
        return restored

    def _record(self, state: RunState, status: str, message: str, seconds: float,
                spent: tuple) -> RunRecord:  # fmt: skip
        schedule, ledger, private = self.schedule, state.ledger, self.schedule.private
        eps_clt, eps_cert, method = spent
        per_node, per_node_method = epsilon_per_node(self.privacy, ledger)
        final_row = state.rows[-1] | {"epsilon_clt": eps_clt, "epsilon_certified": eps_cert,
                                      "neighboring": self.privacy.neighboring}  # fmt: skip
        unaccounted = [UNACCOUNTED_TRAIN_LOSS] if self.training.unsafe_train_metrics else []
        if self.training.node_eval_share:  # scores of records held out of the nodes' data
            unaccounted.append("node_local_metrics")
        if not private:  # a non-private baseline: everything it releases
            unaccounted = ["model", "metrics", *unaccounted]
        return RunRecord(
            algorithm=self.spec.label, base_algorithm=self.spec.name, seed=self.seed,
            epsilon_target=self.epsilon, delta=self.privacy.delta if private else None,
            calibrated_with=schedule.calibrated_with, neighboring=self.privacy.neighboring,
            noise_entropy=self.entropy,
            noise_mechanism=GAUSSIAN_RELEASE.name if private else None, private=private,
            noise_correlation=self.privacy.noise_correlation.describe() if private else None,
            trust_model=self.privacy.trust_model if private else None,
            status=status,
            message=message, steps=self.steps, steps_done=state.engine.iteration,
            sample_rate=self.sample_rate, train_seconds=seconds,
            final={k: _json_number(v) for k, v in final_row.items()
                   if k not in ("algorithm", "seed", "epsilon_target", "epsilon_certified_method")},
            certified_method=method,
            steps_spent=None if ledger is None else ledger.steps_taken,
            unaccounted_outputs=tuple(unaccounted),
            ledger_epsilon_spent=None if ledger is None else ledger.epsilon_spent(),
            ledger_accountant=None if ledger is None else ledger.accountant,
            schedule=schedule.to_dict(),
            # under add-remove J_i is secret: neither the sizes nor per-node rates are released
            node_sizes=None if self._sizes_secret else tuple(self.records_per_node),
            sampling=self.training.sampling,
            sample_rates=None if self._sizes_secret else self.sample_rates.tolist(),
            epsilon_per_node=per_node, epsilon_per_node_method=per_node_method,
            communication=_communication(state.engine),
            common_noise=True if self.execution.common_noise else None, rows=tuple(state.rows),
        )  # fmt: skip

    def _result(self, state: RunState, record: RunRecord, spent: tuple) -> TrainingResult:
        sim, (eps_clt, eps_cert, _) = state.engine, spent
        if self.evaluation.gather_node_models:
            node_params, nodes = sim.gather_debiased_params(), list(range(self.topology.n))
        else:
            first, count = self.first_node, self.node_data.n_nodes
            node_params, nodes = sim.debiased_params(), list(range(first, first + count))
        return TrainingResult(
            model=_module_with(self._template, sim.average_params()), ledger=state.ledger,
            epsilon=eps_cert, epsilon_clt=eps_clt, delta=record.delta, history=state.rows,
            schedule=self.schedule, status=record.status, message=record.message,
            record=record, _template=self._template, _node_params=node_params,
            node_indices=nodes,
        )  # fmt: skip


def train(model: nn.Module, data: Sequence | NodeData, **options: Any) -> TrainingResult:
    """``DecentralizedTrainer(model, data, **options).fit()``."""
    return DecentralizedTrainer(model, data, **options).fit()


def _sets(settings, key: str) -> bool:
    """Whether the settings given (a section or a dict) set ``key`` themselves."""
    if isinstance(settings, dict):
        return key in settings
    return key in getattr(settings, "model_fields_set", ())


def _without(settings, keys: tuple[str, ...]):
    """The settings given (a section or a dict) without ``keys`` (anything else unchanged)."""
    if isinstance(settings, TrainingSection | PrivacySection):
        settings = settings.model_dump()
    if not isinstance(settings, dict):
        return settings
    return {k: v for k, v in settings.items() if k not in keys}
