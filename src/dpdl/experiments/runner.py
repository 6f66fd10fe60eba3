"""The ``decentralized`` experiment kind: train the Dyn-D2P family and SGP (MATH.md §2-4).

``run_experiment(config, output_dir)`` runs every cell (algorithm x seed x target epsilon; SGP
once per seed) of a config and writes one run folder::

    config.toml, config.json   the resolved config
    metrics.csv                one row per evaluation (see METRIC_COLUMNS)
    results.json               final numbers per cell, and the mean over seeds per algorithm
                               (each cell with its node sizes; for a split of a shipped public
                               benchmark also its per-node label histograms: heterogeneity)
    curves.png                 test accuracy and test loss against iteration, every algorithm
    label_distribution.png     per-node label counts of a public benchmark's split (first seed)

:func:`run_cell` runs one (algorithm, seed, epsilon) cell and is what a sweep may call: it
builds a :class:`dpdl.training.trainer.DecentralizedTrainer` from the config and the cell's
:class:`Workload` (the Python API's entry point), which owns the schedule, the ledger's
approval, the engine, the step loop, evaluation and checkpoints.  Nothing is written before
the config, the (first seed's) data, topology and model have been validated.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpdl.engine import checkpoint as checkpoints
from dpdl.engine.runtime import Runtime, make_runtime
from dpdl.engine.simulator import NodeData, Simulator, resolve_device
from dpdl.errors import DPDLError, require
from dpdl.experiments.config import RunConfig, parse_config
from dpdl.files import write_atomic
from dpdl.training.callbacks import NODE_LOCAL_COLUMNS, VAL_NODE_COLUMNS
from dpdl.training.plan import build_schedule, resolve_steps
from dpdl.training.results import RunRecord, write_results
from dpdl.training.run_folder import RunFolder, to_toml
from dpdl.training.settings import AlgorithmSpec, without_later_defaults
from dpdl.training.trainer import (
    METRIC_COLUMNS,
    UNACCOUNTED_TRAIN_LOSS,
    CellCheckpointer,
    CSVLogger,
    DecentralizedTrainer,
)

__all__ = [
    "METRIC_COLUMNS",
    "CellCheckpointer",
    "Workload",
    "apply_overrides",
    "build_schedule",
    "cell_trainer",
    "prepare_workload",
    "run_cell",
    "run_experiment",
    "to_toml",
]


# --------------------------------------------------------------------------- set-up
@dataclass
class Workload:
    """Everything a cell needs that does not depend on the algorithm: data, split, graph."""

    config: RunConfig
    seed: int
    node_data: NodeData
    topology: Any
    input_shape: tuple[int, ...]
    num_classes: int | None
    loss: str
    x_test: torch.Tensor
    y_test: torch.Tensor
    x_train_eval: torch.Tensor | None
    y_train_eval: torch.Tensor | None
    x_val: torch.Tensor | None
    y_val: torch.Tensor | None
    device: torch.device
    steps: int
    sample_rate: float
    records_per_node: list[int] = field(default_factory=list)
    # node i -> its own evaluation set (data.node_eval_file), read where node i is hosted
    node_eval: Any = None
    # node sizes and label histograms of a library-made split of a shipped public benchmark
    heterogeneity: dict[str, Any] | None = None


def prepare_workload(
    config: RunConfig,
    seed: int,
    device: torch.device | None = None,
    *,
    block: tuple[int, int] | None = None,
    rank: int = 0,
) -> Workload:
    """Load and split the data set, build the topology, resolve the number of steps.

    ``block`` = (first node, count): keep only those nodes' records (a process of the
    distributed runtime, ``rank``); with ``data.per_node`` only their files are read at all.
    ``steps``/``sample_rate``/``records_per_node`` are those of the kept nodes.
    """
    from dpdl.topology import make_topology

    cfg = config
    device = resolve_device(cfg.experiment.device) if device is None else device
    n = cfg.topology.nodes
    first, count = block or (0, n)
    topology = make_topology(cfg.topology.name, n, seed=cfg.topology.seed, **cfg.topology.params)
    if cfg.data.per_node:
        return _per_node_workload(cfg, seed, device, topology, first, count, rank)
    from dpdl.data import load_dataset, partition, stack_node_data, validation_split

    dataset = load_dataset(
        cfg.data.dataset, data_dir=cfg.data.data_dir, download=cfg.data.download, seed=seed
    )
    rng = np.random.default_rng(seed)
    x_train, y_train = dataset.x_train, dataset.y_train
    x_val = y_val = None
    v, cap = cfg.data.validation_records or 0, cfg.data.max_train_records
    if v:
        # Held out of the whole training split by a keyed hash of each record, never the
        # seed, and before max_train_records: every run on this data set, whatever its seed,
        # holds out the same records (issue 38). Parameters are chosen on them, never on test.
        require(cap is None or v < cap,
                f"data.validation_records = {v} leaves no training records of "
                f"data.max_train_records = {cap}")  # fmt: skip
        held, kept = validation_split(x_train, y_train, v)
        x_val, y_val = x_train[held], y_train[held]
        x_train, y_train = x_train[kept], y_train[kept]
    if cap is not None and cap - v < len(x_train):  # max_train_records counts both parts
        keep = np.sort(rng.choice(len(x_train), cap - v, replace=False))
        x_train, y_train = x_train[keep], y_train[keep]
    if len(x_train) < n:
        raise DPDLError(f"topology.nodes = {n} exceeds the {len(x_train)} training records")
    parts = partition(y_train, n, scheme=cfg.data.partition, alpha=cfg.data.alpha, seed=seed,
                      min_partition_size=cfg.data.min_partition_size,
                      shards_per_node=cfg.data.shards_per_node)
    X, Y, mask = stack_node_data(x_train, y_train, parts[first : first + count])
    node_data = NodeData.from_arrays(X, Y, mask, device=device, first_node=first)
    counts = _check_batch(cfg, node_data, seed, first)
    heterogeneity = _benchmark_heterogeneity(cfg, dataset, (x_train, y_train), parts, seed)

    classification = dataset.task == "classification"
    y_dtype = torch.int64 if classification else torch.float32
    x_test = torch.as_tensor(dataset.x_test, dtype=torch.float32, device=device)
    y_test = torch.as_tensor(dataset.y_test, dtype=y_dtype, device=device)
    if cfg.training.eval_test_samples is not None and cfg.training.eval_test_samples < len(x_test):
        pick = np.sort(rng.choice(len(x_test), cfg.training.eval_test_samples, replace=False))
        x_test, y_test = x_test[pick], y_test[pick]
    m = min(cfg.training.eval_train_samples, len(x_train))
    pick = np.sort(rng.choice(len(x_train), m, replace=False))
    pooled = block is None or count == n  # a sample of every node's records: one process only
    return Workload(
        config=cfg,
        seed=seed,
        node_data=node_data,
        topology=topology,
        input_shape=tuple(dataset.input_shape),
        num_classes=dataset.num_classes if classification else None,
        loss="cross_entropy" if classification else "squared_error",
        x_test=x_test,
        y_test=y_test,
        x_train_eval=torch.as_tensor(x_train[pick], dtype=torch.float32, device=device)
        if pooled else None,
        y_train_eval=torch.as_tensor(y_train[pick], dtype=y_dtype, device=device)
        if pooled else None,
        x_val=None if x_val is None else torch.as_tensor(x_val, dtype=torch.float32, device=device),
        y_val=None if y_val is None else torch.as_tensor(y_val, dtype=y_dtype, device=device),
        device=device,
        steps=_steps(cfg, counts),
        sample_rate=_sample_rate(cfg, counts),
        records_per_node=counts,
        heterogeneity=heterogeneity,
    )


def _benchmark_heterogeneity(cfg: RunConfig, dataset, train, parts, seed: int):
    """Every node's training size and label histogram when the split is the library's own
    partition of a shipped public benchmark (then a function of public data and the public
    seed, as released here); None for anything else (a CSV file, a user's loader or data:
    a histogram of those would be a noise-free statistic of private records), and None under
    privacy.neighboring = "add-remove" (node sizes are secret there: nothing size-dependent
    is released)."""
    from dpdl.data import held_out_mask, is_public_benchmark

    name = is_public_benchmark(cfg.data.dataset, dataset)
    if name is None or dataset.task != "classification" or cfg.privacy.neighboring == "add-remove":
        return None
    (x_train, y_train), share = train, cfg.training.node_eval_share
    # the records node i trains on: what the trainer keeps after its node_eval_share hold-out
    # (the same keyed hash of each record)
    training = [
        part[~held_out_mask(x_train[part], y_train[part], share, seed, i)] if share else part
        for i, part in enumerate(parts)
    ]
    histograms = [np.bincount(y_train[part], minlength=dataset.num_classes) for part in training]
    return {
        "node_sizes": [len(part) for part in training],
        "label_histograms": [h.tolist() for h in histograms],
        "source": f"partition of the public benchmark {name}",
    }


def _draw_label_distribution(folder: RunFolder, work: Workload) -> None:
    """label_distribution.png of the first seed's split (public benchmarks only)."""
    if work.heterogeneity is None:
        return
    from dpdl.data import plot_label_distribution

    data = work.config.data
    plot_label_distribution(
        work.heterogeneity["label_histograms"], folder / "label_distribution.png",
        title=f"{data.dataset}: {data.partition} split over {work.topology.n} nodes "
        f"(seed {work.seed})",
    )  # fmt: skip


def _steps(cfg: RunConfig, counts: list[int]) -> int:
    """The run's steps (``training.steps``, or its epochs under its sampling)."""
    training = cfg.training
    return resolve_steps(training.steps, training.epochs, counts, training.batch_size,
                         training.sampling, training.sample_rate)  # fmt: skip


def _sample_rate(cfg: RunConfig, counts: list[int]) -> float:
    """The rate the run's schedule is accounted at: ``training.sample_rate``, else b / J_min."""
    given = cfg.training.sample_rate
    return given if given is not None else cfg.training.batch_size / min(counts)


def _check_batch(cfg: RunConfig, node_data: NodeData, seed: int, first: int) -> list[int]:
    """The records each node trains on: after a ``node_eval_share`` hold-out (the trainer's
    keyed hash of each record), as the trainer counts them, so the workload's steps and
    sampling rate (``dpdl audit --config``'s mechanism) are the run's."""
    from dpdl.training.node_eval import held_out_masks

    counts = [int(c) for c in node_data.counts]
    share = cfg.training.node_eval_share
    if share:
        masks = held_out_masks(node_data, share, seed, first)
        counts = [c - int(mask.sum()) for c, mask in zip(counts, masks, strict=True)]
    b = cfg.training.batch_size
    if cfg.training.sample_rate is None and b > min(counts):
        raise DPDLError(
            f"training.batch_size = {b} exceeds the smallest local data set ({min(counts)})"
        )
    return counts


def _per_node_workload(cfg, seed, device, topology, first, count, rank) -> Workload:
    """A workload from per-node files (``data.per_node``): this process reads its own nodes'
    files only; the evaluation records are public (``data.eval_file`` or the test split of
    ``data.dataset``), and so are the record shape and the classes, read from them."""
    from dpdl.data import read_records, stack_local_datasets

    # a file for one node more than the topology has: its records would silently be left out
    beyond = node_file(cfg.data.per_node, cfg.topology.nodes, rank)
    require(not beyond.exists(),
            f"data.per_node: {str(beyond)!r} exists but topology.nodes = {cfg.topology.nodes} "
            f"(nodes 0..{cfg.topology.nodes - 1}): node {cfg.topology.nodes}'s records would "
            "be left out; set topology.nodes to the number of files")  # fmt: skip
    local = [read_records(node_file(cfg.data.per_node, i, rank), f"node {i}'s data file")
             for i in range(first, first + count)]  # fmt: skip
    X, Y, mask = stack_local_datasets(local, first_node=first, min_nodes=1)
    node_data = NodeData.from_arrays(X, Y, mask, device=device, first_node=first)
    counts = _check_batch(cfg, node_data, seed, first)
    if cfg.data.eval_file:
        x_test, y_test = read_records(node_file(cfg.data.eval_file, None, rank), "data.eval_file")
    else:
        from dpdl.data import load_dataset

        dataset = load_dataset(cfg.data.dataset, data_dir=cfg.data.data_dir,
                               download=cfg.data.download, seed=seed)  # fmt: skip
        x_test, y_test = dataset.x_test, dataset.y_test
    classification = np.issubdtype(np.asarray(y_test).dtype, np.integer)
    require(
        tuple(np.shape(x_test)[1:]) == tuple(X.shape[2:]),
        f"the evaluation records have shape {tuple(np.shape(x_test)[1:])} but the nodes' "
        f"{tuple(X.shape[2:])}",
    )
    y_dtype = torch.int64 if classification else torch.float32
    return Workload(
        config=cfg, seed=seed, node_data=node_data, topology=topology,
        input_shape=tuple(X.shape[2:]),
        num_classes=int(np.max(y_test)) + 1 if classification else None,
        loss="cross_entropy" if classification else "squared_error",
        x_test=torch.as_tensor(np.asarray(x_test), dtype=node_data.inputs.dtype, device=device),
        y_test=torch.as_tensor(np.asarray(y_test), dtype=y_dtype, device=device),
        x_train_eval=None, y_train_eval=None, **_validation_file(cfg, rank, node_data, device),
        device=device,
        steps=_steps(cfg, counts),
        sample_rate=_sample_rate(cfg, counts), records_per_node=counts,
        node_eval=None if cfg.data.node_eval_file is None else functools.partial(
            _node_eval_set, cfg.data.node_eval_file, rank),
    )  # fmt: skip


def _validation_file(cfg: RunConfig, rank: int, node_data: NodeData, device) -> dict:
    """x_val, y_val of ``data.validation_file`` (public records a tuning chooses on)."""
    if cfg.data.validation_file is None:
        return {"x_val": None, "y_val": None}
    from dpdl.data import read_records

    x, y = read_records(node_file(cfg.data.validation_file, None, rank), "data.validation_file")
    return {"x_val": torch.as_tensor(x, dtype=node_data.inputs.dtype, device=device),
            "y_val": torch.as_tensor(y, dtype=node_data.targets.dtype, device=device)}


def _node_eval_set(pattern: str, rank: int, node: int) -> tuple[np.ndarray, np.ndarray]:
    """Node ``node``'s own evaluation records (``data.node_eval_file``)."""
    from dpdl.data import read_records

    return read_records(node_file(pattern, node, rank), f"node {node}'s data.node_eval_file")


def node_file(pattern: str, node: int | None, rank: int) -> Path:
    """``pattern`` with ``{i}`` the node index, ``{rank}`` the process's rank and environment
    variables (``$VAR``) expanded."""
    text = os.path.expandvars(pattern)
    try:
        return Path(text.format(i=node, rank=rank) if node is not None else text.format(
            rank=rank))  # fmt: skip
    except (KeyError, IndexError, ValueError) as err:
        raise DPDLError(f"path pattern {pattern!r}: use {{i}} (node) and {{rank}} only: "
                        f"{err}") from None  # fmt: skip


def build_model(work: Workload) -> torch.nn.Module:
    """The cell's initial model x^0: the same for every algorithm of a seed (a fair comparison)."""
    from dpdl.models import make_model

    cfg = work.config
    return make_model(cfg.model.name, work.input_shape, work.num_classes, seed=work.seed,
                      **cfg.model.options)


def cell_trainer(
    work: Workload,
    algorithm: str | AlgorithmSpec,
    epsilon: float | None,
    *,
    progress: bool = False,
    on_row=None,
    simulator_factory=Simulator,
    checkpoint: CellCheckpointer | None = None,
    site: Path | None = None,
    site_run: str | None = None,
) -> DecentralizedTrainer:
    """The trainer of one cell, planned (steps, calibrated schedule, the ledger's approval)
    and not yet trained: what :func:`run_cell` fits, and where a tuner reads a cell's
    schedule without running it."""
    cfg = work.config
    spec = algorithm if isinstance(algorithm, AlgorithmSpec) else AlgorithmSpec.parse(algorithm)
    return DecentralizedTrainer(
        build_model(work), work.node_data, topology=work.topology, algorithm=spec,
        epsilon=epsilon, privacy=cfg.privacy.model_dump(exclude={"epsilon"}),
        training=cfg.training.model_dump(exclude={"checkpoint_every"}), loss=work.loss,
        eval_data=(work.x_test, work.y_test),
        train_eval_data=(work.x_train_eval, work.y_train_eval)
        if cfg.training.unsafe_train_metrics else None,
        validation_data=None if work.x_val is None else (work.x_val, work.y_val),
        node_eval_data=work.node_eval,
        callbacks=[] if on_row is None else [lambda evaluation: on_row(evaluation.row)],
        device=work.device, runtime=cfg.experiment.runtime, entropy=cfg.experiment.entropy,
        seed=work.seed, progress=progress, engine_factory=simulator_factory,
        common_noise=cfg.experiment.common_noise,
        checkpoint=checkpoint, site=site, site_run=site_run,
    )  # fmt: skip


def run_cell(
    work: Workload,
    algorithm: str | AlgorithmSpec,
    epsilon: float | None,
    *,
    progress: bool = True,
    on_row=None,
    simulator_factory=Simulator,
    checkpoint: CellCheckpointer | None = None,
    model_path: Path | None = None,
    site: Path | None = None,
    site_run: str | None = None,
) -> RunRecord:
    """Train one algorithm for one seed and target epsilon; returns the cell's record.
    With ``model_path`` the trained models are written there (:func:`save_trained_model`).

    ``on_row(row)`` is called with every metrics row as it is produced;
    ``simulator_factory`` builds the engine (a ``Simulator`` subclass, e.g. a test's; the
    config's runtime hosts the nodes, exchanges and mixes whichever it is).  A
    NaN/inf update stops the cell cleanly: the result has ``status = "diverged"`` and the
    message names the node and step.  ``checkpoint`` saves the cell's state every N steps
    and, when it carries a saved state, continues from it: the models, weights, generator
    states and the privacy ledger (the privacy already spent) come back exactly.
    """
    trainer = cell_trainer(work, algorithm, epsilon, progress=progress, on_row=on_row,
                           simulator_factory=simulator_factory, checkpoint=checkpoint,
                           site=site, site_run=site_run)  # fmt: skip
    result = trainer.fit()
    record = result.record
    if model_path is not None:
        save_trained_model(result, model_path, work.config)
    if work.heterogeneity is None:
        return record
    require(list(record.node_sizes) == work.heterogeneity["node_sizes"],
            "the label histograms count other node sizes than the trainer's")  # fmt: skip
    return dataclasses.replace(record, heterogeneity=work.heterogeneity)


def save_trained_model(result, path: Path, cfg: RunConfig) -> None:
    """The trained models as torch state dicts (``path``: the network average under
    ``"average"``, each node this process holds under ``"nodes"``) and beside them
    (``path`` with suffix .json) the config, the ε spent and what the file holds."""
    from dpdl.files import write_atomic

    path.parent.mkdir(parents=True, exist_ok=True)
    models = {"average": result.model.state_dict(),
              "nodes": {str(i): result.node_model(i).state_dict() for i in result.node_indices}}
    write_atomic(path, lambda fh: torch.save(models, fh), mode=0o644)
    record = result.record
    about = {"model_file": path.name, "algorithm": record.algorithm, "status": record.status,
             "epsilon_certified": _json_float(result.epsilon),
             "epsilon_clt": _json_float(result.epsilon_clt), "delta": result.delta,
             "neighboring": record.neighboring, "steps": record.steps_done,
             "nodes": result.node_indices, "config": cfg.model_dump(mode="json")}
    text = json.dumps(about, indent=2, default=str) + "\n"
    write_atomic(path.with_suffix(".json"), lambda fh: fh.write(text.encode()), mode=0o644)


def _json_float(value: float | None) -> float | None:
    return None if value is None or not np.isfinite(value) else float(value)


# --------------------------------------------------------------------------- whole run
def apply_overrides(
    config: dict[str, Any],
    *,
    seed: int | None = None,
    steps: int | None = None,
    device: str | None = None,
    runtime: str | None = None,
    entropy: str | None = None,
    vector_figures: bool | None = None,
) -> dict[str, Any]:
    """Command-line overrides (``dpdl run --seed/--steps/--device/...``) on a config dict."""
    out = json.loads(json.dumps(config))
    exp = out.setdefault("experiment", {})
    if seed is not None:
        exp["seed"] = seed
    if device is not None:
        exp["device"] = device
    if runtime is not None:
        exp["runtime"] = runtime
    if entropy is not None:
        exp["entropy"] = entropy
    if vector_figures is not None:
        exp["vector_figures"] = vector_figures
    if steps is not None:
        training = out.setdefault("training", {})
        training.pop("epochs", None)
        training["steps"] = steps
    return out


def run_experiment(
    config: dict[str, Any] | RunConfig,
    output_dir: str | Path,
    *,
    progress: bool = True,
    run_name: str | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run every cell of ``config`` and write one run folder under ``output_dir``.

    Returns ``{"run_dir", "cells": [per-cell results], "summary": [mean over seeds]}``
    (also written to ``results.json``).  ``run_name`` fixes the folder's name (default:
    ``<experiment.name>-<UTC timestamp>``).  With ``training.checkpoint_every`` the run keeps
    ``checkpoints/`` in its folder; ``resume=True`` continues the run folder
    ``output_dir/run_name`` from there: finished cells are kept, the cell in progress
    continues from its last checkpoint, and no privacy already spent is forgotten.
    """
    cfg = parse_config(config)
    launch = _launch(cfg, output_dir, progress=progress, run_name=run_name, resume=resume)
    # Nothing is written until validated: the config (above), the first seed's data set,
    # split and topology, and the model (a missing data set leaves no empty run folder).
    from dpdl.models import validate_model

    first_seed = cfg.experiment.seeds[0]
    workloads = {first_seed: launch.workload(cfg, first_seed)}
    validate_model(build_model(workloads[first_seed]))
    made_output = not Path(output_dir).exists()
    folder = _open_run_folder(cfg, output_dir, launch)
    try:
        return _run_cells(cfg, folder, launch, workloads)
    except DPDLError:
        # refused before any cell trained (a label, a delta, ... checked by the first cell's
        # trainer): a new run's folder holds nothing, and goes; the site's ledger says which
        # folders trained, and those always stay
        if launch.main_process and not launch.resume and not _trained_in(folder):
            shutil.rmtree(folder.path, ignore_errors=True)
            if made_output and not any(Path(output_dir).iterdir()):
                Path(output_dir).rmdir()
        raise


def _trained_in(folder: RunFolder) -> bool:
    """Whether any run of ``folder`` was recorded in its site's ledger (it trained)."""
    from dpdl.training.site_ledger import LEDGER_FILE

    ledger = folder.path.parent / LEDGER_FILE
    return ledger.is_file() and f'"run": "{folder.path.name}/' in ledger.read_text()


def _run_cells(cfg: RunConfig, folder: RunFolder, launch: _Launch,
               workloads: dict[int, Workload]) -> dict[str, Any]:  # fmt: skip
    """Every cell of ``cfg`` into ``folder`` (finished cells of a resume replayed)."""
    if launch.main_process:
        _draw_label_distribution(folder, workloads[cfg.experiment.seeds[0]])
    finished = _finished_cells(folder, launch)
    cells: list[dict[str, Any]] = []
    metrics = (CSVLogger(folder / "metrics.csv", columns=_metric_columns(cfg))
               if launch.main_process else None)  # fmt: skip
    try:
        for seed in cfg.experiment.seeds:
            work = workloads.pop(seed, None)
            for spec, eps in _cells_of_a_seed(cfg):
                key = _cell_key(spec, seed, eps)
                if key in finished:
                    cell = _replay(finished[key], metrics)
                else:
                    work = work or launch.workload(cfg, seed)
                    cell = _run_checkpointed_cell(work, spec, eps, key, folder, launch,
                                                  metrics, finished)  # fmt: skip
                if launch.main_process:
                    cells.append(cell.to_dict(rows=False))
    finally:
        if metrics is not None:
            metrics.close()
            write_results(folder.path, cells, device=launch.device)
    if not launch.main_process:
        return {"run_dir": str(folder.path), "cells": [], "summary": []}
    return write_results(folder.path, cells, plot_title=cfg.experiment.name,
                         device=launch.device,
                         vector_figures=cfg.experiment.vector_figures)  # fmt: skip


@dataclass
class _Launch:
    """How this process takes part in a run, as its ``runtime`` says: the block of nodes it
    hosts (all, or one rank's of the distributed runtime), whether it is the main process
    (which alone writes the run folder), and whether it continues the run folder
    ``run_name`` (``resume``)."""

    progress: bool
    run_name: str | None
    resume: bool
    simulator_factory: Any
    runtime: Runtime
    device: torch.device
    block: tuple[int, int]
    main_process: bool = True

    def workload(self, cfg: RunConfig, seed: int) -> Workload:
        return prepare_workload(cfg, seed, self.device, block=self.block, rank=self.runtime.rank)


def _launch(cfg: RunConfig, output_dir: str | Path, *, progress: bool, run_name: str | None,
            resume: bool) -> _Launch:
    """This process's part in the run; a resume is checked against the folder's config."""
    # In the distributed runtime one process per block of nodes (torchrun or `dpdl run
    # --procs R`): each loads and holds its own nodes only; the main process alone writes the
    # run folder, every process keeps its own checkpoints (dpdl.engine.distributed).
    runtime = make_runtime(cfg.experiment.runtime)
    device = runtime.local_device(resolve_device(cfg.experiment.device))
    block = runtime.hosted_block(cfg.topology.nodes, device)
    main_process = runtime.is_main_process()
    # Simulator is looked up here, not bound at import: it may be replaced (tests do).
    launch = _Launch(progress and main_process,
                     run_name or runtime.job_run_name(cfg.experiment.name), resume,
                     simulator_factory=Simulator, runtime=runtime, device=device, block=block,
                     main_process=main_process)  # fmt: skip
    if not resume and runtime.restarted() and launch.run_name:  # torchrun --max-restarts
        launch.resume = (Path(output_dir) / launch.run_name / "config.json").is_file()
    if launch.resume:
        run_dir = Path(output_dir) / str(launch.run_name)
        if launch.run_name is None or not (run_dir / "config.json").is_file():
            raise DPDLError(f"{run_dir} is not a dpdl run folder")
        if launch.main_process:
            _check_same_config(run_dir, cfg)
    return launch


def _open_run_folder(cfg: RunConfig, output_dir: str | Path, launch: _Launch) -> RunFolder:
    """The run's folder (every process agrees on its name); a new run writes its config
    there, and with checkpoints the config's digest, which a resume checks."""
    if launch.main_process:
        folder = RunFolder.create(output_dir, cfg.experiment.name, launch.run_name,
                                  exist_ok=launch.resume)  # fmt: skip
    # every process writes into the folder the main process named
    folder = RunFolder(Path(output_dir) / launch.runtime.from_main_process(
        folder.path.name if launch.main_process else None))  # fmt: skip
    if not launch.resume and launch.main_process:
        folder.write_config(cfg.model_dump(mode="json"), toml=True)
        if cfg.training.checkpoint_every:
            folder.checkpoints.mkdir(parents=True, exist_ok=True)
            (folder.checkpoints / CONFIG_DIGEST).write_text(_digest(folder / "config.json"))
    return folder


def _finished_cells(folder: RunFolder, launch: _Launch) -> dict[str, RunRecord | None]:
    """The cells a resumed run has finished (their records on the main process; the other
    ranks know only their keys, to skip the same cells)."""
    saved = _load_finished(folder.checkpoints) if launch.resume and launch.main_process else {}
    finished: dict[str, RunRecord | None] = {
        key: RunRecord.from_dict(record) for key, record in saved.items()}
    done = launch.runtime.from_main_process(sorted(finished))
    return finished or dict.fromkeys(done)


def _metric_columns(cfg: RunConfig) -> tuple[str, ...]:
    # node_local_* only with per-node evaluation: a default run's metrics.csv is unchanged
    node_local = (NODE_LOCAL_COLUMNS if cfg.training.node_eval_share or cfg.data.node_eval_file
                  else ())  # fmt: skip
    # val_node_* only with validation records (a run without keeps its columns)
    val_node = (VAL_NODE_COLUMNS if cfg.data.validation_records or cfg.data.validation_file
                else ())  # fmt: skip
    return METRIC_COLUMNS + node_local + val_node + (
        (UNACCOUNTED_TRAIN_LOSS,) if cfg.training.unsafe_train_metrics else ())  # fmt: skip


def _cells_of_a_seed(cfg: RunConfig):
    """(algorithm, target epsilon) of every cell of one seed, in the run's order (SGP has
    no target: it runs once)."""
    for spec in cfg.experiment.specs:
        for eps in cfg.privacy.epsilons if spec.private else [None]:
            yield spec, eps


def _replay(cell: RunRecord | None, metrics: CSVLogger | None) -> RunRecord | None:
    """A finished cell of a resumed run: its metric rows go to the new metrics.csv again."""
    if metrics is not None:
        for row in cell.rows:
            metrics.write_row(row)
    return cell


def _run_checkpointed_cell(work: Workload, spec: AlgorithmSpec, eps: float | None, key: str,
                           folder: RunFolder, launch: _Launch, metrics: CSVLogger | None,
                           finished: dict[str, RunRecord | None]) -> RunRecord:
    """Train one cell, continuing from its checkpoint on a resume; with checkpoints, the
    finished cell is recorded (``finished.json``) before its checkpoint is removed."""
    cfg = work.config
    ckpt = CellCheckpointer(folder.checkpoint(key), cfg.training.checkpoint_every)
    if launch.resume and _every_process_has(ckpt.path, launch.runtime):
        ckpt.resume = checkpoints.load_for_resume(ckpt.path)
    cell = run_cell(
        work, spec, eps, progress=launch.progress,
        on_row=None if metrics is None else metrics.write_row,
        simulator_factory=launch.simulator_factory, checkpoint=ckpt,
        model_path=folder.path / "models" / f"{key}.pt" if launch.main_process else None,
        # the site is the output folder the run folder was made in (a sweep's cell: its own)
        site=folder.path.parent, site_run=f"{folder.path.name}/{key}",
    )  # fmt: skip
    if cfg.training.checkpoint_every:
        if launch.main_process:
            finished[key] = cell
            _save_finished(folder.checkpoints, {k: r.to_dict() for k, r in finished.items()})
        checkpoints.remove(ckpt.path)
    return cell


def _every_process_has(path: Path, runtime: Runtime) -> bool:
    """Whether this process (every process, in the distributed runtime) has a checkpoint of
    ``path``; processes that disagree cannot resume together."""
    has = checkpoints.process_path(path).is_file()
    require(runtime.same_on_every_rank(int(has)),
            f"only some processes have a checkpoint of {path.name}: the job stopped while "
            "they were saving it; refusing to resume")  # fmt: skip
    return has


def _check_same_config(run_dir: Path, cfg: RunConfig) -> None:
    """A resume continues the run folder's own config: only where it runs (and whether its
    figure comes as vectors too) may differ."""
    # re-read through the config model: a setting added since (at its default) is no change
    saved = parse_config(json.loads((run_dir / "config.json").read_text())).model_dump(mode="json")
    now = cfg.model_dump(mode="json")
    for config in (saved, now):
        for key in ("runtime", "device", "vector_figures"):
            config.get("experiment", {}).pop(key, None)
        # a folder written before the optimiser settings existed holds none: at their
        # defaults they are that very run
        if isinstance(config.get("training"), dict):
            config["training"] = without_later_defaults(config["training"])
    if saved != now:
        raise DPDLError(f"{run_dir} was started with another config (config.json): refusing "
                        "to resume, which would re-send its noise under other settings")


def _cell_key(spec: AlgorithmSpec, seed: int, epsilon: float | None) -> str:
    eps = "none" if epsilon is None else f"{epsilon:g}"
    return f"{spec.name}-{spec.calibrate or 'default'}_seed{seed}_eps{eps}"


def _load_finished(state_dir: Path) -> dict[str, dict[str, Any]]:
    path = state_dir / "finished.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DPDLError(f"{path} is corrupt: {err}") from None


def _save_finished(state_dir: Path, finished: dict[str, dict[str, Any]]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(finished, default=str).encode()
    write_atomic(state_dir / "finished.json", lambda fh: fh.write(text))


CONFIG_DIGEST = "config.sha256"


def _digest(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def resume_run(run_dir: str | Path, *, progress: bool = True, **overrides) -> dict[str, Any]:
    """Continue the run folder ``run_dir`` from its checkpoints, with its saved config.

    Only where it runs may change (``runtime``, ``device``); anything that would change what
    it computes (seeds, steps, entropy) is refused.
    """
    run_dir = Path(run_dir)
    path = run_dir / "config.json"
    if not path.is_file():
        raise DPDLError(f"{run_dir} is not a dpdl run folder (no config.json)")
    changing = sorted(
        k for k, v in overrides.items() if v is not None and k not in ("runtime", "device")
    )
    if changing:
        raise DPDLError(
            f"--resume continues the saved config; it cannot change {', '.join(changing)}"
        )
    digest = run_dir / "checkpoints" / CONFIG_DIGEST
    if not digest.is_file():
        raise DPDLError(
            f"{run_dir} was not checkpointed (training.checkpoint_every unset): nothing to resume"
        )
    if digest.read_text().strip() != _digest(path):
        # A changed config would train other cells and orphan the privacy already spent.
        raise DPDLError(f"{path} changed since the run started: refusing to resume")
    config = apply_overrides(json.loads(path.read_text()), **overrides)
    return run_experiment(
        config, run_dir.parent, progress=progress, run_name=run_dir.name, resume=True
    )
