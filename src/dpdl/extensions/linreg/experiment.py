"""The ``linreg`` experiment kind: DP decentralized linear regression (MATH.md §5, seed 001).

A config (TOML, top-level ``kind = "linreg"``) has these tables; unknown keys are errors
naming the dotted key::

    [experiment]  name, seeds, entropy ("os": secret noise, the default; "seed": reproducible)
    [data]        dataset, nodes, partition, split_seed, row_clip (r), label_clip (r_y)
    [[topologies]] name, seed, degree (one table per graph; undirected graphs only)
    [algorithm]   steps (T), c_alpha, d_alpha, e_alpha, noise_offset (d_v), noise_exponent
                  (e_v), domain ("ball" | "box"), radius, record_every
    [privacy]     epsilons (targets), include_non_private

For every topology, target ε and seed it calibrates c_v so that the exact ε_T sum equals the
target (:func:`dpdl.extensions.linreg.accounting.calibrate_noise_scale`), runs the algorithm
and records
the test MSE, on the public test split, of what the nodes released: the projected noisy models
P_Ω(β♭_i(t)) they shared at every recorded t, and the final noisy estimate.  The paper's own
metric, ‖β_i(t) − β*‖ against the pooled least-squares β* of the clipped training records, is a
noise-free function of the private data: it is written only with
``experiment.unsafe_train_metrics = true``, under ``unaccounted_`` names.  The non-private
reference (no noise, no projection) runs once per topology and seed, labelled non-private.

Data-norm bounds are enforced, not assumed: feature rows are clipped to norm r and labels to
|y| ≤ r_y, giving δ_X = r√n_M and δ_y = r_y√n_M, and the run fails closed if any node's block
still exceeds the bounds (how many records were clipped is a statistic of the data: shown only
with ``unsafe_train_metrics``).

Outside the guarantee (stated, not hidden): the node sizes n_i, B_Ω and the clipping norms are
public; the loader standardises features and target with statistics of the public test split
(``dpdl.data.preprocessing``).  The guarantee is for one node's whole data set given those.
The paper's constants are loose (ℓ1 bounds, √(km)), so useful accuracy needs very large
pure-DP ε (see final.md).

The Laplace noise of every (topology, ε, seed) cell is its own secret stream
(:func:`dpdl.algorithms.randomness.numpy_secret_rng`, ChaCha20): OS entropy by default, derived
from the seed and the run's settings only with ``experiment.entropy = "seed"`` (recorded as
``noise_entropy`` in every cell and marked in ``final.md``).  The data split
(``data.split_seed``) is public.

Run folder: ``config.json`` (resolved), ``test_mse.csv`` (per recorded t: mean/worst node test
MSE of the shared models), ``final.csv`` and ``final.md`` (final test MSE against ε),
``results.json``, ``test_mse_vs_t.png`` (one panel per topology, one curve per ε) and
``test_mse_vs_epsilon.png``; with ``unsafe_train_metrics`` also ``unaccounted_errors.csv``
and ``unaccounted_node_errors.npz`` (‖β_i(t) − β*‖ for every node).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from dpdl.errors import DPDLError
from dpdl.extensions.linreg.accounting import (
    LinRegSensitivity,
    PowerDecay,
    calibrate_noise_scale,
    default_noise_shape,
    privacy_report,
)
from dpdl.extensions.linreg.algorithm import (
    Ball,
    Box,
    LocalProblems,
    clip_rows,
    enforce_data_bounds,
    omega_bound,
    run_linreg_replicas,
)
from dpdl.training.results import std_or_none
from dpdl.training.run_folder import RunFolder
from dpdl.training.settings import (
    REPRODUCIBLE_NOISE_NOTE,
    Epsilons,
    NoiseEntropy,
    seeded_cell_name,
    validate_config,
)
from dpdl.training.settings import ConfigSection as _Section

__all__ = ["LinRegConfig", "parse_linreg_config", "apply_overrides", "run_experiment"]

NON_PRIVATE = "non-private"


class ExperimentSection(_Section):
    name: str = "linreg"
    seeds: list[int] = Field(default_factory=lambda: [0])
    # Where the secret noise comes from: "os" (the default) or "seed" (reproducible research).
    entropy: NoiseEntropy = "os"
    # Also write the paper's utility metric, the distance to the pooled least-squares beta*
    # of the private training records, and how many records were clipped: noise-free
    # functions of the data, under unaccounted_ names.  For public benchmark data only.
    unsafe_train_metrics: bool = False

    @field_validator("seeds", mode="before")
    @classmethod
    def _seeds(cls, value):
        value = [value] if isinstance(value, int) else value
        if not value:
            raise ValueError("give at least one seed")
        return value


class DataSection(_Section):
    dataset: str = "diabetes"
    nodes: int = Field(10, ge=2)
    partition: Literal["iid"] = "iid"
    split_seed: int = 0
    row_clip: float = Field(3.0, gt=0, allow_inf_nan=False)
    label_clip: float = Field(3.0, gt=0, allow_inf_nan=False)


class TopologySpec(_Section):
    name: Literal["undirected-ring", "random-regular", "complete", "hypercube", "torus",
                  "erdos-renyi", "star"] = "undirected-ring"
    seed: int = 0
    degree: int | None = Field(None, ge=2)

    @property
    def label(self) -> str:
        return self.name if self.degree is None else f"{self.name}(d={self.degree})"


class AlgorithmSection(_Section):
    steps: int = Field(5000, ge=1)
    c_alpha: float = Field(0.1, gt=0, allow_inf_nan=False)
    d_alpha: float = Field(100.0, gt=0, allow_inf_nan=False)
    e_alpha: float = Field(0.5, ge=0, allow_inf_nan=False)
    noise_offset: float | None = Field(None, gt=0, allow_inf_nan=False)  # default d_alpha − 1
    noise_exponent: float | None = Field(None, ge=0, allow_inf_nan=False)  # default e_alpha
    domain: Literal["ball", "box"] = "ball"
    radius: float = Field(3.0, gt=0, allow_inf_nan=False)  # ball radius / box half-width
    record_every: int = Field(10, ge=1)

    @property
    def alpha(self) -> PowerDecay:
        return PowerDecay(self.c_alpha, self.d_alpha, self.e_alpha)

    @property
    def d_v(self) -> float:
        if self.noise_offset is not None:
            return self.noise_offset
        return default_noise_shape(self.alpha)[0]

    @property
    def e_v(self) -> float:
        return default_noise_shape(self.alpha)[1] if self.noise_exponent is None \
            else self.noise_exponent

    def make_domain(self, num_features: int) -> Ball | Box:
        if self.domain == "ball":
            return Ball(self.radius)
        return Box(-self.radius * np.ones(num_features), self.radius * np.ones(num_features))


class PrivacySection(_Section):
    epsilons: Epsilons = Field(default_factory=lambda: [1e7, 1e8, 1e9])
    # A non-private baseline is a noise-free function of the data: it runs only when asked.
    include_non_private: bool = False


class LinRegConfig(_Section):
    kind: Literal["linreg"] = "linreg"
    experiment: ExperimentSection = Field(default_factory=ExperimentSection)
    data: DataSection = Field(default_factory=DataSection)
    topologies: list[TopologySpec] = Field(default_factory=lambda: [TopologySpec()])
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    privacy: PrivacySection = Field(default_factory=PrivacySection)


def parse_linreg_config(config: dict[str, Any] | LinRegConfig) -> LinRegConfig:
    """Validate a ``linreg`` config; raises DPDLError naming every offending key."""
    return validate_config(LinRegConfig, config, "linreg config")


def apply_overrides(config: dict[str, Any], *, seed: int | None = None,
                    steps: int | None = None, device: str | None = None,
                    runtime: str | None = None,
                    entropy: str | None = None,
                    vector_figures: bool | None = None) -> dict[str, Any]:
    """``dpdl run`` flags: ``--seed`` (one seed), ``--steps`` (T) and ``--entropy``. The run is
    numpy on the CPU in one process, so ``--device`` other than cpu and ``--runtime`` other
    than simulator are refused."""
    if device not in (None, "cpu", "auto"):
        raise DPDLError(f"--device {device!r}: the linreg kind runs on the CPU (numpy)")
    if runtime not in (None, "simulator"):
        raise DPDLError(f"--runtime {runtime!r}: the linreg kind has no distributed runtime")
    if vector_figures:
        raise DPDLError("--vector-figures not supported for experiment kind 'linreg'")
    out = json.loads(json.dumps(config))
    if entropy is not None:
        out.setdefault("experiment", {})["entropy"] = entropy
    if seed is not None:
        out.setdefault("experiment", {})["seeds"] = [int(seed)]
    if steps is not None:
        out.setdefault("algorithm", {})["steps"] = int(steps)
    return out


# ------------------------------------------------------------------------------ workload
def _prepare_data(cfg: LinRegConfig, say) -> dict[str, Any]:
    """Load, clip (enforcing δ_X, δ_y) and split the training set; β* of the clipped data."""
    from dpdl.data import load_dataset, partition

    dataset = load_dataset(cfg.data.dataset, seed=cfg.data.split_seed)
    if dataset.task != "regression":
        raise DPDLError(f"data.dataset = {cfg.data.dataset!r} is a {dataset.task} data set; "
                        "linreg needs a regression one")
    x_train = np.asarray(dataset.x_train, dtype=np.float64).reshape(dataset.num_train, -1)
    y_train = np.asarray(dataset.y_train, dtype=np.float64)
    x_test, _ = clip_rows(
        np.asarray(dataset.x_test, dtype=np.float64).reshape(len(dataset.x_test), -1),
        cfg.data.row_clip)
    y_test = np.asarray(dataset.y_test, dtype=np.float64)
    parts = partition(y_train, cfg.data.nodes, scheme=cfg.data.partition,
                      seed=cfg.data.split_seed)
    bounded = enforce_data_bounds([x_train[p] for p in parts], [y_train[p] for p in parts],
                                  row_clip=cfg.data.row_clip, label_clip=cfg.data.label_clip)
    unsafe = cfg.experiment.unsafe_train_metrics
    bounds = (bounded.describe() if unsafe else  # how many were clipped is a statistic
              f"rows clipped to norm {cfg.data.row_clip:g} and labels to |y| <= "
              f"{cfg.data.label_clip:g}: delta_X = {bounded.delta_x:.4g}, delta_y = "
              f"{bounded.delta_y:.4g} (n_M = {bounded.max_local_records})")  # fmt: skip
    say(f"data: {cfg.data.dataset}, {sum(len(p) for p in parts)} training records over "
        f"{cfg.data.nodes} nodes, m = {x_train.shape[1]}; {bounds}")
    problems = LocalProblems.from_parts(bounded.x_parts, bounded.y_parts)
    return {
        "problems": problems,
        "beta_star": problems.pooled_solution(),
        "x_test": x_test,
        "y_test": y_test,
        "bounded": bounded,
        "records": int(sum(len(p) for p in parts)),
    }


def _mixing_matrix(spec: TopologySpec, nodes: int) -> np.ndarray:
    from dpdl.topology import make_topology

    params = {} if spec.degree is None else {"degree": spec.degree}
    topology = make_topology(spec.name, nodes, seed=spec.seed, **params)
    if topology.directed or topology.period != 1:
        raise DPDLError(f"topology {spec.name!r}: linreg needs a static undirected graph")
    return topology.mixing_matrix(0)


def _epsilon_label(eps: float | None) -> str:
    return NON_PRIVATE if eps is None else f"{eps:g}"


# Per-(topology, epsilon, seed) numbers of the final table: the first from what the nodes
# released (public test data), the unaccounted ones (unsafe_train_metrics) from the private
# data: distances to the pooled least-squares beta* of the training records.
FINAL_METRICS = ("final_test_mse_mean", "final_test_mse_worst")
UNACCOUNTED_METRICS = ("unaccounted_final_error_mean", "unaccounted_final_error_worst",
                       "unaccounted_final_relative_error_mean",
                       "unaccounted_released_error_mean")  # fmt: skip


def _test_mse(x_test: np.ndarray, y_test: np.ndarray, models: np.ndarray) -> np.ndarray:
    """Test MSE of every model in ``models`` (..., m): shape (...)."""
    residual = models @ x_test.T - y_test
    return np.mean(residual**2, axis=-1)


# ------------------------------------------------------------------------------ the run
def run_experiment(
    config: dict[str, Any] | LinRegConfig, output_dir: str | Path, *, progress: bool = True
) -> dict[str, Any]:
    """Run every (topology, ε, seed) cell of a ``linreg`` config; write one run folder.

    Returns the content of ``results.json``: the data facts, and per cell the privacy report
    (exact ε sum and the paper's closed form) and the test error of what the nodes released.
    """
    cfg = parse_linreg_config(config)
    say = print if progress else (lambda *_: None)
    plan = _plan(cfg, _prepare_data(cfg, say))
    folder = RunFolder.create(output_dir, cfg.experiment.name)
    folder.write_config(cfg.model_dump(mode="json"))
    gathered = _Gathered()
    for spec in cfg.topologies:
        _run_topology(plan, spec, gathered)
        for eps in plan.targets:
            finals = [c["final_test_mse_mean"] for c in gathered.cells
                      if c["topology"] == spec.label and c["epsilon_target"] == eps]
            say(f"{spec.label:>24}  eps = {_epsilon_label(eps):>11}  final test MSE "
                f"(node mean, seed mean) = {np.mean(finals):.4g}")
    results = _write_outputs(folder, plan, gathered)
    say((folder / "final.md").read_text())
    return results


@dataclass
class _Plan:
    """What every cell of a run shares: the bounded data, Ω, the sensitivity, the targets."""

    cfg: LinRegConfig
    data: dict[str, Any]
    domain: Ball | Box
    bound: float
    sensitivity: LinRegSensitivity
    targets: list[float | None]  # None: the non-private reference

    @property
    def beta_star_norm(self) -> float:
        return float(np.linalg.norm(self.data["beta_star"]))


def _plan(cfg: LinRegConfig, data: dict[str, Any]) -> _Plan:
    problems: LocalProblems = data["problems"]
    bounded, m = data["bounded"], problems.num_features
    domain = cfg.algorithm.make_domain(m)
    bound = omega_bound(domain, m)
    sensitivity = LinRegSensitivity(bounded.delta_x, bounded.delta_y, bound, m,
                                    bounded.max_local_records, problems.num_nodes)  # fmt: skip
    targets: list[float | None] = list(cfg.privacy.epsilons)
    if cfg.privacy.include_non_private:
        targets = [None, *targets]
    return _Plan(cfg, data, domain, bound, sensitivity, targets)


@dataclass
class _Gathered:
    """What the cells produce, gathered for the run folder."""

    cells: list[dict[str, Any]] = field(default_factory=list)
    curves: dict[tuple[str, str], list[np.ndarray]] = field(default_factory=dict)
    public_rows: list[list] = field(default_factory=list)
    # Only with unsafe_train_metrics: distances to beta* of the private data.
    unaccounted_rows: list[list] = field(default_factory=list)
    node_errors: dict[str, np.ndarray] = field(default_factory=dict)


def _run_topology(plan: _Plan, spec: TopologySpec, gathered: _Gathered) -> None:
    """Every (ε, seed) cell on one graph, in one vectorized loop over the replicas; each
    draws its noise from its own secret stream."""
    from dpdl.algorithms.randomness import numpy_secret_rng

    cfg, algo, data = plan.cfg, plan.cfg.algorithm, plan.data
    bounded = data["bounded"]
    mixing = _mixing_matrix(spec, data["problems"].num_nodes)
    noises = {eps: None if eps is None else calibrate_noise_scale(
        eps, plan.sensitivity, algo.alpha, algo.steps, noise_offset=algo.d_v,
        noise_exponent=algo.e_v) for eps in plan.targets}
    grid = [(eps, seed) for eps in plan.targets for seed in cfg.experiment.seeds]
    results = run_linreg_replicas(
        data["problems"], mixing, steps=algo.steps, alpha=algo.alpha,
        noises=[noises[eps] for eps, _ in grid], domain=plan.domain,
        seeds=[numpy_secret_rng(seed, cfg.experiment.entropy, seeded_cell_name(
            cfg, f"{spec.model_dump_json()}|{eps!r}",
            ("privacy.epsilons", "privacy.include_non_private", "topologies"),
            (*bounded.x_parts, *bounded.y_parts)))
            for eps, seed in grid],
        beta_star=data["beta_star"], record_every=algo.record_every)
    for (eps, seed), result in zip(grid, results, strict=True):
        _record_cell(plan, spec, eps, seed, noises[eps], result, gathered)


def _record_cell(plan: _Plan, spec: TopologySpec, eps: float | None, seed: int, noise,
                 result, gathered: _Gathered) -> None:
    """One cell's rows, curve and results entry: the test MSE of what was released."""
    algo = plan.cfg.algorithm
    report = None if noise is None else privacy_report(
        plan.sensitivity, algo.alpha, noise, algo.steps)
    label = _epsilon_label(eps)
    mse = _test_mse(plan.data["x_test"], plan.data["y_test"], result.shared)  # (len(t), k)
    gathered.public_rows += [[spec.label, label, seed, int(t), repr(float(a.mean())),
                              repr(float(a.max()))] for t, a in zip(result.steps, mse,
                                                                   strict=True)]  # fmt: skip
    gathered.curves.setdefault((spec.label, label), []).append(mse.mean(axis=1))
    cell = {
        "topology": spec.label,
        "epsilon_target": eps,
        "seed": seed,
        "noise_entropy": plan.cfg.experiment.entropy,
        "epsilon": None if report is None else report.epsilon,
        "epsilon_closed_form": None if report is None else report.epsilon_closed_form,
        "closed_form_violations": [] if report is None
        else list(report.closed_form_violations),
        "c_v": None if noise is None else noise.c,
        "noise_scale_final": None if noise is None else float(noise(algo.steps)),
        "final_test_mse_mean": float(mse[-1].mean()),
        "final_test_mse_worst": float(mse[-1].max()),
    }
    if plan.cfg.experiment.unsafe_train_metrics:
        cell |= _record_unaccounted(plan, f"{spec.label}|{label}|seed={seed}",
                                    [spec.label, label, seed], result, gathered)
    gathered.cells.append(cell)


def _record_unaccounted(plan: _Plan, key: str, row_start: list, result,
                        gathered: _Gathered) -> dict[str, float]:
    """The cell's distances to beta* (unsafe_train_metrics): rows, node errors, finals."""
    errors, norm = result.errors, plan.beta_star_norm
    gathered.unaccounted_rows += [
        [*row_start, int(t), repr(float(a.mean())), repr(float(a.max())),
         repr(float(a.mean()) / norm), repr(float(c))]
        for t, a, c in zip(result.steps, errors, result.consensus, strict=True)
    ]
    gathered.node_errors[key] = errors
    return {
        "unaccounted_final_error_mean": float(errors[-1].mean()),
        "unaccounted_final_error_worst": float(errors[-1].max()),
        "unaccounted_final_relative_error_mean": float(errors[-1].mean()) / norm,
        "unaccounted_released_error_mean": float(result.released_errors.mean()),
    }


def _write_outputs(folder: RunFolder, plan: _Plan, gathered: _Gathered) -> dict[str, Any]:
    """The tables, the plots and results.json; returns the results."""
    cfg, algo = plan.cfg, plan.cfg.algorithm
    unsafe = cfg.experiment.unsafe_train_metrics
    steps_axis = np.unique(np.append(np.arange(0, algo.steps + 1, algo.record_every),
                                     algo.steps))
    files = ["config.json", "test_mse.csv", "final.csv", "final.md", "test_mse_vs_t.png",
             "test_mse_vs_epsilon.png"]
    folder.write_csv("test_mse.csv", ["topology", "epsilon", "seed", "t", "test_mse_mean",
                                      "test_mse_worst"], gathered.public_rows)  # fmt: skip
    unaccounted = None
    if unsafe:
        unaccounted = _write_unaccounted(folder, plan, gathered, steps_axis)
        files += ["unaccounted_errors.csv", "unaccounted_node_errors.npz"]
    summary = _summary(gathered.cells)
    _write_tables(folder, summary, cfg.experiment.entropy, unsafe)
    _plot_test_mse_vs_t(folder / "test_mse_vs_t.png", gathered.curves, steps_axis, cfg)
    _plot_test_mse_vs_epsilon(folder / "test_mse_vs_epsilon.png", summary)
    results = _results(folder, plan, gathered.cells, summary, files)
    if unaccounted is not None:
        results["unaccounted"] = unaccounted
    folder.write_results(results)
    return results


def _write_unaccounted(folder: RunFolder, plan: _Plan, gathered: _Gathered,
                       steps_axis: np.ndarray) -> dict[str, Any]:
    """unaccounted_errors.csv and _node_errors.npz; returns results.json's ``unaccounted``."""
    data = plan.data
    beta_star, bounded = data["beta_star"], data["bounded"]
    folder.write_csv("unaccounted_errors.csv",
                     ["topology", "epsilon", "seed", "t", "error_mean", "error_worst",
                      "relative_error_mean", "consensus"], gathered.unaccounted_rows)  # fmt: skip
    np.savez_compressed(folder / "unaccounted_node_errors.npz", t=steps_axis,
                        **gathered.node_errors)
    return {
        "beta_star": beta_star.tolist(),
        "beta_star_norm": plan.beta_star_norm,
        "beta_star_in_omega": bool(plan.domain.contains(beta_star[None, :])[0]),
        "test_mse_beta_star": float(_test_mse(data["x_test"], data["y_test"], beta_star)),
        "rows_clipped": bounded.rows_clipped,
        "labels_clipped": bounded.labels_clipped,
    }


def _results(folder: RunFolder, plan: _Plan, cells: list[dict[str, Any]],
             summary: list[dict[str, Any]], files: list[str]) -> dict[str, Any]:
    """results.json, less the ``unaccounted`` block."""
    cfg, data = plan.cfg, plan.data
    bounded, problems = data["bounded"], data["problems"]
    return {
        "run_dir": str(folder.path),
        "kind": "linreg",
        "data": {
            "dataset": cfg.data.dataset,
            "records": data["records"],
            "nodes": problems.num_nodes,
            "features": problems.num_features,
            "max_local_records": bounded.max_local_records,
            "delta_x": bounded.delta_x,
            "delta_y": bounded.delta_y,
        },
        "omega_bound": plan.bound,
        "sensitivity": plan.sensitivity.to_dict(),
        "noise_entropy": cfg.experiment.entropy,
        "privacy_notion": "pure epsilon-DP under (delta_X, delta_y)-adjacency: one node's whole "
        "data set replaced (MATH.md §5); delta_X, delta_y are data-norm bounds, not the DP delta",
        "metrics": "test MSE, on the public test split, of what the nodes released: the "
        "projected noisy models they shared at each recorded t, and the final noisy estimate",
        "cells": cells,
        "final_table": summary,
        "unaccounted_outputs": [] if not cfg.experiment.unsafe_train_metrics else
        ["unaccounted_errors.csv", "unaccounted_node_errors.npz", "unaccounted", *
         UNACCOUNTED_METRICS],
        "files": files,
    }


def _summary(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and std over seeds of the final numbers, per (topology, ε target)."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for cell in cells:
        groups.setdefault((cell["topology"], cell["epsilon_target"]), []).append(cell)
    rows = []
    for (topology, eps), members in groups.items():
        row = {"topology": topology, "epsilon_target": eps, "seeds": len(members),
               "epsilon": members[0]["epsilon"],
               "epsilon_closed_form": members[0]["epsilon_closed_form"],
               "c_v": members[0]["c_v"], "noise_scale_final": members[0]["noise_scale_final"]}
        for key in (*FINAL_METRICS, *UNACCOUNTED_METRICS):
            if key not in members[0]:
                continue
            values = np.array([c[key] for c in members])
            row[key] = float(values.mean())
            row[f"{key}_std"] = std_or_none(values)
        rows.append(row)
    return rows


def _fmt(value, spec: str = ".4g") -> str:
    return "—" if value is None else format(value, spec)


def _write_tables(folder: RunFolder, summary: list[dict[str, Any]], entropy: str,
                  unsafe: bool) -> None:
    """final.csv (a missing number is an empty field) and final.md."""
    folder.write_records_csv("final.csv", [{k: ("" if v is None else v) for k, v in row.items()}
                                           for row in summary])
    lines = [
        "# DP decentralized linear regression: test error of the released models against ε",
        "",
        "Test MSE (public test split) of each node's released estimate P_Ω(β_i(T) + ω_i(T)), "
        "averaged over nodes, then mean ± std over seeds; ε is the exact sum (pure ε-DP, "
        "MATH.md §5), the closed form is the paper's bound.",
        "",
        *([f"**Note:** {REPRODUCIBLE_NOISE_NOTE}.", ""] if entropy == "seed" else []),
        *(["**Unaccounted:** the error columns are distances to the pooled least-squares β* "
           "of the private training records (experiment.unsafe_train_metrics): noise-free "
           "functions of the data, for research on public benchmark data only.", ""]
          if unsafe else []),
        "| topology | ε target | ε (sum) | ε (closed form) | c_v | v(T) | test MSE | worst node |"
        + (" ‖β_i − β*‖ (unaccounted) | relative | released |" if unsafe else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|---|---|" if unsafe else ""),
    ]
    for row in summary:
        line = (
            f"| {row['topology']} | {_epsilon_label(row['epsilon_target'])} "
            f"| {_fmt(row['epsilon'])} | {_fmt(row['epsilon_closed_form'])} "
            f"| {_fmt(row['c_v'])} | {_fmt(row['noise_scale_final'])} "
            f"| {row['final_test_mse_mean']:.4g} ± {_fmt(row['final_test_mse_mean_std'], '.2g')} "
            f"| {row['final_test_mse_worst']:.4g} |")
        if unsafe:
            line += (f" {row['unaccounted_final_error_mean']:.4g} ± "
                     f"{_fmt(row['unaccounted_final_error_mean_std'], '.2g')} "
                     f"| {row['unaccounted_final_relative_error_mean']:.3g} "
                     f"| {row['unaccounted_released_error_mean']:.4g} |")  # fmt: skip
        lines.append(line)
    (folder / "final.md").write_text("\n".join(lines) + "\n")


def _plot_test_mse_vs_t(path: Path, curves, steps_axis: np.ndarray, cfg: LinRegConfig) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [spec.label for spec in cfg.topologies]
    fig, axes = plt.subplots(1, len(labels), figsize=(5.5 * len(labels), 4.2), squeeze=False,
                             sharey=True)
    for ax, topology in zip(axes[0], labels, strict=True):
        for (topo, eps_label), runs in curves.items():
            if topo != topology:
                continue
            mean = np.mean(runs, axis=0)
            style = {"color": "black", "linestyle": "--"} if eps_label == NON_PRIVATE else {}
            ax.plot(steps_axis[1:], mean[1:], label=f"ε = {eps_label}"
                    if eps_label != NON_PRIVATE else NON_PRIVATE, **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("iteration t")
        ax.set_title(topology)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("test MSE of the shared models (mean over nodes)")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(f"{cfg.experiment.name}: {cfg.data.dataset}, {cfg.data.nodes} nodes")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _plot_test_mse_vs_epsilon(path: Path, summary) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    topologies = list(dict.fromkeys(row["topology"] for row in summary))
    for i, topology in enumerate(topologies):
        rows = [r for r in summary if r["topology"] == topology]
        private = sorted((r for r in rows if r["epsilon_target"] is not None),
                         key=lambda r: r["epsilon_target"])
        color = f"C{i}"
        if private:
            ax.errorbar([r["epsilon_target"] for r in private],
                        [r["final_test_mse_mean"] for r in private],
                        # None (one seed) -> NaN: no error bar
                        yerr=np.array([r["final_test_mse_mean_std"] for r in private],
                                      dtype=float),
                        marker="o", color=color, label=topology, capsize=3)
        for r in rows:
            if r["epsilon_target"] is None:
                ax.axhline(r["final_test_mse_mean"], color=color, linestyle="--",
                           label=f"{topology}, non-private")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("ε (pure DP, exact sum)")
    ax.set_ylabel("final test MSE of the released estimates (mean over nodes)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
