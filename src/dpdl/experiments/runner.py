"""The ``decentralized`` experiment kind: train the Dyn-D2P family and SGP (SPEC §2-4).

``run_experiment(config, output_dir)`` runs every cell (algorithm x seed x target epsilon; SGP
once per seed) of a config and writes one run folder::

    config.toml, config.json   the resolved config
    metrics.csv                one row per evaluation (see METRIC_COLUMNS)
    results.json               final numbers per cell, and the mean over seeds per algorithm
    curves.png                 accuracy and training loss against iteration, every algorithm

:func:`run_cell` runs one (algorithm, seed, epsilon) cell and is what a sweep may call.

Privacy is fail-closed: before a private cell trains, a :class:`PrivacyLedger` under the
schedule's calibrating accountant must approve the whole schedule (else
``PrivacyBudgetExceeded`` and nothing trains), and every step is recorded in it before it
runs.  The epsilon reported at each evaluation is the CLT approximation (the paper's
accountant; it may understate epsilon, SPEC §2) and a certified PLD (or RDP) upper bound;
at evaluation points the PLD bound is the cheap blocked one, for the final row the exact
composition (``privacy.final_mode``).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpdl.accounting.calibration import accountant_options
from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import PrivacySchedule, make_schedule
from dpdl.algorithms.dyn_d2p import NonFiniteUpdate
from dpdl.algorithms.randomness import cell_noise_root
from dpdl.engine import checkpoint as checkpoints
from dpdl.engine.simulator import NodeData, Simulator, accuracy, resolve_device
from dpdl.errors import DPDLError, require
from dpdl.experiments.config import AlgorithmSpec, RunConfig, parse_config
from dpdl.experiments.registry import make_run_dir

ROUNDOFF_TOLERANCE = 1e-12

METRIC_COLUMNS = (
    "iteration",
    "algorithm",
    "seed",
    "epsilon_target",
    "train_loss",
    "test_loss",
    "test_accuracy",
    "node_accuracy_mean",
    "node_accuracy_worst",
    "val_loss",
    "val_accuracy",
    "epsilon_clt",
    "epsilon_certified",
)

__all__ = [
    "METRIC_COLUMNS",
    "Workload",
    "apply_overrides",
    "prepare_workload",
    "run_cell",
    "run_experiment",
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
    x_train_eval: torch.Tensor
    y_train_eval: torch.Tensor
    node_eval: slice
    x_val: torch.Tensor | None
    y_val: torch.Tensor | None
    device: torch.device
    steps: int
    sample_rate: float
    records_per_node: list[int] = field(default_factory=list)


def prepare_workload(config: RunConfig, seed: int, device: torch.device | None = None) -> Workload:
    """Load and split the data set, build the topology, resolve the number of steps."""
    from dpdl.data import load_dataset, partition, stack_node_data
    from dpdl.topology import make_topology

    cfg = config
    device = resolve_device(cfg.experiment.device) if device is None else device
    dataset = load_dataset(
        cfg.data.dataset, data_dir=cfg.data.data_dir, download=cfg.data.download, seed=seed
    )
    rng = np.random.default_rng(seed)
    x_train, y_train = dataset.x_train, dataset.y_train
    if cfg.data.max_train_records is not None and cfg.data.max_train_records < len(x_train):
        keep = np.sort(rng.choice(len(x_train), cfg.data.max_train_records, replace=False))
        x_train, y_train = x_train[keep], y_train[keep]
    x_val = y_val = None
    if cfg.data.validation_records:
        # Held out of the training set before the split (public randomness): parameters are
        # chosen on it, never on the test set.
        v = cfg.data.validation_records
        require(v < len(x_train), f"data.validation_records = {v} leaves no training records")
        order = rng.permutation(len(x_train))
        held, kept = np.sort(order[:v]), np.sort(order[v:])
        x_val, y_val = x_train[held], y_train[held]
        x_train, y_train = x_train[kept], y_train[kept]
    n = cfg.topology.nodes
    if len(x_train) < n:
        raise DPDLError(f"topology.nodes = {n} exceeds the {len(x_train)} training records")
    parts = partition(y_train, n, scheme=cfg.data.partition, alpha=cfg.data.alpha, seed=seed)
    X, Y, mask = stack_node_data(x_train, y_train, parts)
    node_data = NodeData.from_arrays(X, Y, mask, device=device)
    topology = make_topology(cfg.topology.name, n, seed=cfg.topology.seed, **cfg.topology.params)
    counts = [int(c) for c in node_data.counts]
    b = cfg.training.batch_size
    if b > min(counts):
        raise DPDLError(
            f"training.batch_size = {b} exceeds the smallest local data set ({min(counts)})"
        )
    sample_rate = b / min(counts)
    if cfg.training.steps is not None:
        steps = cfg.training.steps
    else:  # one epoch = J_min / b steps: each record is sampled once per epoch on average
        steps = max(1, math.ceil(cfg.training.epochs * min(counts) / b))

    classification = dataset.task == "classification"
    y_dtype = torch.int64 if classification else torch.float32
    x_test = torch.as_tensor(dataset.x_test, dtype=torch.float32, device=device)
    y_test = torch.as_tensor(dataset.y_test, dtype=y_dtype, device=device)
    if cfg.training.eval_test_samples is not None and cfg.training.eval_test_samples < len(x_test):
        pick = np.sort(rng.choice(len(x_test), cfg.training.eval_test_samples, replace=False))
        x_test, y_test = x_test[pick], y_test[pick]
    m = min(cfg.training.eval_train_samples, len(x_train))
    pick = np.sort(rng.choice(len(x_train), m, replace=False))
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
        x_train_eval=torch.as_tensor(x_train[pick], dtype=torch.float32, device=device),
        y_train_eval=torch.as_tensor(y_train[pick], dtype=y_dtype, device=device),
        node_eval=slice(0, min(cfg.training.eval_node_samples, len(x_test))),
        x_val=None if x_val is None else torch.as_tensor(x_val, dtype=torch.float32, device=device),
        y_val=None if y_val is None else torch.as_tensor(y_val, dtype=y_dtype, device=device),
        device=device,
        steps=steps,
        sample_rate=sample_rate,
        records_per_node=counts,
    )


def build_schedule(
    config: RunConfig, spec: AlgorithmSpec, epsilon: float | None, steps: int, sample_rate: float
) -> PrivacySchedule:
    """The calibrated privacy schedule of one cell (SPEC §2)."""
    p = config.privacy
    calibrate = spec.calibrate or p.calibrate
    return make_schedule(
        spec.name,
        epsilon=None if spec.name == "sgp" else epsilon,
        delta=p.delta,
        steps=steps,
        sample_rate=sample_rate,
        clip=p.clip,
        clip0=p.clip0,
        rho_c=p.rho_c,
        rho_mu=p.rho_mu,
        calibrate=calibrate,
        blocks=p.calibration_blocks if calibrate == "pld" else None,
    )


def _ledger_for(config: RunConfig, schedule: PrivacySchedule) -> PrivacyLedger:
    accountant = schedule.calibrated_with or config.privacy.calibrate
    blocks = config.privacy.calibration_blocks if accountant == "pld" else None
    # A closed-form (CLT) calibration lands on the target up to float round-off (~1e-16
    # relative); allow 1e-12 of it so an exact calibration is not refused.  Anything larger is.
    budget = schedule.epsilon_target * (1 + ROUNDOFF_TOLERANCE)
    ledger = PrivacyLedger(schedule.sample_rate, schedule.delta, budget, accountant, blocks=blocks)
    ledger.plan(schedule.noise_multipliers)  # raises PrivacyBudgetExceeded: nothing trains
    return ledger


# --------------------------------------------------------------------------- evaluation
def _epsilons(config: RunConfig, schedule: PrivacySchedule, steps_done: int, final: bool):
    if not schedule.private:
        return math.inf, math.inf, "none"
    if steps_done == 0:
        return 0.0, 0.0, "no-steps"
    clt = schedule.epsilon("clt", steps=steps_done).epsilon
    p = config.privacy
    accountant = p.certified_accountant
    if accountant == "pld":
        if final and p.final_mode == "auto":
            options = accountant_options("pld", schedule.noise_multipliers[:steps_done])
        elif final and p.final_mode == "exact":
            options = {"mode": "exact"}
        else:
            options = {"mode": "blocked", "blocks": p.final_blocks if final else p.eval_blocks}
    else:
        options = {}
    report = schedule.epsilon(accountant, steps=steps_done, **options)
    return float(clt), float(report.epsilon), report.method


def _held_out_loss(out: torch.Tensor, y: torch.Tensor, loss: str) -> float:
    if loss == "cross_entropy":
        return float(torch.nn.functional.cross_entropy(out, y))
    return float(0.5 * (out.reshape(y.shape) - y).pow(2).mean())


def _evaluate(sim: Simulator, work: Workload) -> dict[str, float]:
    out = sim.predict_average(work.x_test)
    row = {
        "train_loss": sim.average_loss(work.x_train_eval, work.y_train_eval),
        "test_loss": _held_out_loss(out, work.y_test, work.loss),
        "val_loss": math.nan,
        "val_accuracy": math.nan,
    }
    if work.x_val is not None:
        val_out = sim.predict_average(work.x_val)
        row["val_loss"] = _held_out_loss(val_out, work.y_val, work.loss)
        if work.loss == "cross_entropy":
            row["val_accuracy"] = float(accuracy(val_out, work.y_val))
    if work.loss == "cross_entropy":
        node_out = sim.predict_nodes(work.x_test[work.node_eval])
        node_acc = accuracy(node_out, work.y_test[work.node_eval])
        row |= {
            "test_accuracy": float(accuracy(out, work.y_test)),
            "node_accuracy_mean": float(node_acc.mean()),
            "node_accuracy_worst": float(node_acc.min()),
        }
    else:
        row |= {
            "test_accuracy": math.nan,
            "node_accuracy_mean": math.nan,
            "node_accuracy_worst": math.nan,
        }
    return row


# --------------------------------------------------------------------------- one cell
@dataclass
class CellCheckpointer:
    """Where and how often a cell saves its state, and the state to resume from (if any)."""

    path: Path
    every: int | None
    write: bool  # the main process writes; the other ranks only join the gather
    resume: dict[str, Any] | None = None

    def save(self, sim, ledger: PrivacyLedger | None, rows: list[dict[str, Any]]) -> None:
        state = checkpoints.capture(sim)  # collective in the distributed runtime
        shard = state.pop("rank_generators", None)
        if shard is not None:  # every rank keeps its own nodes' secret streams, locally
            checkpoints.save_atomic(checkpoints.shard_path(self.path, shard["rank"]), shard)
        if self.write:
            checkpoints.save_atomic(
                self.path,
                {
                    "engine": state,
                    "ledger": None if ledger is None else ledger.to_json(),
                    "rows": json.dumps(rows),
                },
            )


def run_cell(
    work: Workload,
    algorithm: str | AlgorithmSpec,
    epsilon: float | None,
    *,
    progress: bool = True,
    on_row=None,
    simulator_factory=Simulator,
    checkpoint: CellCheckpointer | None = None,
) -> dict[str, Any]:
    """Train one algorithm for one seed and target epsilon; returns the cell's results.

    ``on_row(row)`` is called with every metrics row as it is produced;
    ``simulator_factory`` builds the engine (the distributed runtime passes its own).  A
    NaN/inf update stops the cell cleanly: the result has ``status = "diverged"`` and the
    message names the node and step.  ``checkpoint`` saves the cell's state every N steps
    and, when it carries a saved state, continues from it: the models, weights, generator
    states and the privacy ledger (the privacy already spent) come back exactly.
    """
    from dpdl.models import make_model

    cfg = work.config
    spec = algorithm if isinstance(algorithm, AlgorithmSpec) else AlgorithmSpec.parse(algorithm)
    schedule = build_schedule(cfg, spec, epsilon, work.steps, work.sample_rate)
    ledger = _ledger_for(cfg, schedule) if schedule.private else None
    # The same initial model x^0 for every algorithm of a seed (a fair comparison): public.
    model = make_model(cfg.model.name, work.input_shape, work.num_classes, seed=work.seed)
    # The sampling and noise streams are secret and the cell's own (dpdl.algorithms.randomness).
    secure = cfg.privacy.secure_noise
    noise_root = None if secure else cell_noise_root(
        cfg.experiment.entropy, work.seed, f"{spec.label}|{epsilon!r}"
    )
    sim = simulator_factory(
        model, work.node_data, work.topology, lr=cfg.training.lr,
        expected_batch_size=cfg.training.batch_size, seed=noise_root, device=work.device,
        loss=work.loss, secure_noise=secure,
    )  # fmt: skip
    del noise_root  # the generators hold the secret now; nothing else should
    require(
        math.isclose(sim.sample_rate, schedule.sample_rate),
        f"engine samples at p = {sim.sample_rate} but the schedule is accounted at "
        f"p = {schedule.sample_rate}",
    )
    rows: list[dict[str, Any]] = []
    eps_target = None if spec.name == "sgp" else epsilon

    def record(iteration: int, final: bool = False) -> dict[str, Any]:
        eps_clt, eps_cert, method = _epsilons(cfg, schedule, iteration, final)
        row = {
            "iteration": iteration, "algorithm": spec.label, "seed": work.seed,
            "epsilon_target": math.nan if eps_target is None else eps_target,
            **_evaluate(sim, work), "epsilon_clt": eps_clt, "epsilon_certified": eps_cert,
            "epsilon_certified_method": method,
        }  # fmt: skip
        rows.append(row)
        if on_row is not None:
            on_row(row)
        return row

    from tqdm.auto import tqdm

    label = spec.label + ("" if eps_target is None else f" eps={eps_target:g}")
    bar = tqdm(
        total=work.steps,
        desc=f"{label} seed={work.seed}",
        disable=None if progress else True,
        leave=False,
        dynamic_ncols=True,
    )
    status, message = "ok", ""
    started = time.perf_counter()
    first_step = 0
    if checkpoint is not None and checkpoint.resume is not None:
        saved = checkpoint.resume
        checkpoints.restore(sim, saved["engine"])
        if ledger is not None:
            # The saved ledger, not a fresh one: the steps already spent stay spent.  It must
            # describe this very cell (same p, δ, budget, accountant) and this very iteration.
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
            rows.append(row)
            if on_row is not None:
                on_row(row)
        bar.update(first_step)
    else:
        record(0)
        if checkpoint is not None and checkpoint.every:
            # Before the first step: a resume after a crash at any later step replays the very
            # noise already sent, never fresh noise for steps whose messages left the node.
            checkpoint.save(sim, ledger, rows)
    every = cfg.training.eval_every
    save_every = checkpoint.every if checkpoint is not None else None
    try:
        z = schedule.noise_multipliers
        for k in range(first_step, work.steps):
            if schedule.private:
                ledger.record_step(float(z[k]))
                sim.step(private=True, clip=float(schedule.clip[k]), sigma=float(schedule.sigma[k]))
            else:
                sim.step(private=False)
            bar.update(1)
            done = k + 1
            if done % every == 0 and done < work.steps:
                row = record(done)
                bar.set_postfix(
                    loss=f"{row['train_loss']:.3f}",
                    acc=f"{row['test_accuracy']:.3f}",
                    eps=f"{row['epsilon_clt']:.3g}",
                )
            if save_every and done % save_every == 0 and done < work.steps:
                checkpoint.save(sim, ledger, rows)
    except NonFiniteUpdate as err:
        status, message = "diverged", str(err)
    finally:
        bar.close()
    seconds = time.perf_counter() - started
    if status == "ok":
        if not sim.all_finite():
            status, message = "diverged", f"non-finite parameters after step {work.steps - 1}"
        else:
            record(work.steps, final=True)
    final_row = rows[-1]
    return {
        "algorithm": spec.label,
        "base_algorithm": spec.name,
        "seed": work.seed,
        "epsilon_target": eps_target,
        "delta": cfg.privacy.delta if schedule.private else None,
        "calibrated_with": schedule.calibrated_with,
        "noise_entropy": cfg.experiment.entropy,
        "secure_noise": secure,
        "status": status,
        "message": message,
        "steps": work.steps,
        "steps_done": sim.iteration,
        "sample_rate": work.sample_rate,
        "train_seconds": seconds,
        "final": {
            k: _json_number(v)
            for k, v in final_row.items()
            if k not in ("algorithm", "seed", "epsilon_target", "epsilon_certified_method")
        },
        "certified_method": final_row["epsilon_certified_method"],
        "ledger_epsilon_spent": None if ledger is None else ledger.epsilon_spent(),
        "ledger_accountant": None if ledger is None else ledger.accountant,
        "schedule": schedule.to_dict(),
        "rows": rows,
    }


def _json_number(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# --------------------------------------------------------------------------- whole run
def apply_overrides(
    config: dict[str, Any],
    *,
    seed: int | None = None,
    steps: int | None = None,
    device: str | None = None,
    runtime: str | None = None,
    entropy: str | None = None,
    secure_noise: bool | None = None,
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
    if secure_noise is not None:
        out.setdefault("privacy", {})["secure_noise"] = secure_noise
    if steps is not None:
        training = out.setdefault("training", {})
        training.pop("epochs", None)
        training["steps"] = steps
    return out



def _write_config(run_dir: Path, cfg: RunConfig) -> None:
    resolved = cfg.model_dump(mode="json")
    (run_dir / "config.json").write_text(json.dumps(resolved, indent=2) + "\n")
    (run_dir / "config.toml").write_text(to_toml(resolved))


def to_toml(data: dict[str, Any]) -> str:
    """A small TOML writer for the resolved config (tables of scalars, lists and dicts)."""

    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {value(x)}" for k, x in v.items()) + "}"
        raise TypeError(f"cannot write {v!r} as TOML")

    top = [
        f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict) and v is not None
    ]
    lines = top + [""]
    for section, table in data.items():
        if isinstance(table, dict):
            lines.append(f"[{section}]")
            lines += [f"{k} = {value(v)}" for k, v in table.items() if v is not None]
            lines.append("")
    return "\n".join(lines)


def _summary(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds of the final numbers, per (algorithm, epsilon target)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["algorithm"], cell["epsilon_target"]), []).append(cell)
    summary = []
    for (algorithm, eps), members in groups.items():
        entry: dict[str, Any] = {
            "algorithm": algorithm,
            "epsilon_target": eps,
            "seeds": [c["seed"] for c in members],
            "status": sorted({c["status"] for c in members}),
        }
        for key in (
            "test_accuracy",
            "node_accuracy_mean",
            "node_accuracy_worst",
            "val_accuracy",
            "train_loss",
            "epsilon_clt",
            "epsilon_certified",
        ):
            vals = [c["final"].get(key) for c in members if c["status"] == "ok"]
            vals = [v for v in vals if v is not None]
            entry[key] = float(np.mean(vals)) if vals else None
            entry[f"{key}_std"] = float(np.std(vals)) if len(vals) > 1 else None
        summary.append(entry)
    return summary


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
    if resume:
        if run_name is None or not (Path(output_dir) / run_name / "config.json").is_file():
            raise DPDLError(f"{Path(output_dir) / str(run_name)} is not a dpdl run folder")
    state_dir = Path(output_dir) / run_name / "checkpoints" if run_name else None
    factory, device, main_process = Simulator, None, True
    if cfg.experiment.runtime == "distributed":
        # One process per block of nodes (torchrun or `dpdl run --procs R`); rank 0 writes the
        # run folder, the other ranks a scratch folder (dpdl.engine.distributed).
        from dpdl.engine import distributed

        device = distributed.local_device(resolve_device(cfg.experiment.device))
        distributed.init_from_environment(device)
        factory = distributed.DistributedSimulator
        main_process = distributed.is_main_process()
        if state_dir is None:
            # Every rank checkpoints its secret shard beside rank 0's checkpoint (the folder a
            # resume reads), not in its own scratch folder: rank 0 names the run folder.
            name = make_run_dir(output_dir, cfg.experiment.name).name if main_process else None
            name = distributed.from_main_process(name)
            state_dir = Path(output_dir) / name / "checkpoints"
            run_name = name if main_process else None
        output_dir = distributed.worker_output_dir(Path(output_dir))
        progress = progress and main_process
    run_dir = make_run_dir(output_dir, cfg.experiment.name, run_name, exist_ok=resume)
    state_dir = state_dir or run_dir / "checkpoints"
    if not resume:
        _write_config(run_dir, cfg)
        if main_process and cfg.training.checkpoint_every:
            state_dir.mkdir(parents=True, exist_ok=True)
            (state_dir / CONFIG_DIGEST).write_text(_digest(run_dir / "config.json"))
    finished = _load_finished(state_dir) if resume else {}
    cells: list[dict[str, Any]] = []
    metrics_path = run_dir / "metrics.csv"
    with metrics_path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=METRIC_COLUMNS, extrasaction="ignore")
        writer.writeheader()

        def on_row(row):
            writer.writerow({k: _csv_value(row[k]) for k in METRIC_COLUMNS})
            fh.flush()

        try:
            for seed in cfg.experiment.seeds:
                work = None
                for spec in cfg.experiment.specs:
                    epsilons = [None] if spec.name == "sgp" else cfg.privacy.epsilons
                    for eps in epsilons:
                        key = _cell_key(spec, seed, eps)
                        if key in finished:
                            cell = finished[key]
                            for row in cell["rows"]:
                                on_row(row)
                        else:
                            work = work or prepare_workload(cfg, seed, device)
                            ckpt = CellCheckpointer(
                                state_dir / f"{key}.pt", cfg.training.checkpoint_every,
                                write=main_process,
                            )  # fmt: skip
                            if resume and ckpt.path.is_file():
                                ckpt.resume = checkpoints.load_for_resume(ckpt.path, factory)
                            cell = run_cell(
                                work, spec, eps, progress=progress, on_row=on_row,
                                simulator_factory=factory, checkpoint=ckpt,
                            )  # fmt: skip
                            if cfg.training.checkpoint_every:
                                if main_process:
                                    finished[key] = cell
                                    _save_finished(state_dir, finished)
                                checkpoints.remove(ckpt.path)
                        cells.append({k: v for k, v in cell.items() if k != "rows"})
        finally:
            results = {"run_dir": str(run_dir), "cells": cells, "summary": _summary(cells)}
            (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    from dpdl.experiments.plots import plot_curves

    plot_curves(metrics_path, run_dir / "curves.png", title=cfg.experiment.name)
    results["plot"] = str(run_dir / "curves.png")
    (run_dir / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    return results


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
    tmp = state_dir / "finished.json.tmp"
    tmp.write_text(json.dumps(finished, default=str))
    os.replace(tmp, state_dir / "finished.json")


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


def _csv_value(v):
    if isinstance(v, float):
        return repr(v)
    return v
