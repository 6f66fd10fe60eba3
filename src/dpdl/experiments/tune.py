"""Fair tuning: every algorithm, baselines included, gets the same budget on validation data.

A tune config is a ``decentralized`` run config (with ``data.validation_records``) plus a
``[tune]`` table::

    [tune]
    metric = "val_accuracy"          # final value on the validation records (TUNE_METRICS:
                                     # val_loss, val_node_accuracy_mean, val_node_accuracy_worst)
    selection_seeds = [0, 1, 2]
    test_seeds = [10, 11, 12, 13, 14]
    workers = 2
    [tune.candidates.const]          # a name: an algorithm and its grid (a [sweep]-like grid,
    algorithm = "const-d2p@pld"      # optionally a zip of parallel lists and fixed settings)
    grid = { "privacy.clip" = [0.25, 1.0], "training.lr" = [0.015, 0.03] }
    [tune.candidates.dyn]
    algorithm = "dyn-d2p@pld"
    grid = { "privacy.clip0" = [0.5, 1.0], "training.lr" = [0.015, 0.03] }
    set = { "privacy.rho_mu" = 2.0 }
    [tune.baselines.const-untuned]   # test-seed runs at fixed settings, reported beside
    algorithm = "const-d2p@pld"
    set = { "privacy.clip" = 1.0, "training.lr" = 0.03 }

:func:`run_tuning` then (baselines' test seeds first, then candidate by candidate, steps 1-3)

1. runs, for every candidate, its grid over the selection seeds (one resumable sweep per
   candidate, ``OUT/select/<name>/``; every cell trains at every ``privacy.epsilon``);
2. picks, per candidate and ε, the grid point with the largest mean ``metric`` over the
   selection seeds (a point with a failed or missing seed cannot be picked; ties go to the
   first point in grid order) -- the rule is stated in every output;
3. runs every pick, and every baseline, over the test seeds (``OUT/test/<name>-eps<ε>/``);
4. writes ``tune.json`` (grids, every point's validation numbers, the picks, the test runs),
   ``selection.csv`` (one row per candidate, ε and grid point), ``test.csv`` (one row per test
   run) and ``tune.md`` (the selection tables, which grid each candidate got, the test
   accuracy of each and the seed-paired comparisons).

Unequal grids are refused: the budget of every candidate (its number of grid points) must be
the same, or the comparison is not fair.

What it costs (docs/THREAT_MODEL.md): the validation records are declared public (no
guarantee for them) and are the same records for every seed (``dpdl.data.validation_split``),
so scoring a run on them costs nothing beyond that run's ε.  The picks, though, are functions
of every selection run, each trained on the private training records: the folder's releases
compose, and every report states their ε (``privacy``: one RDP composition of every released
run at the runs' δ, :mod:`dpdl.experiments.tune_private`).  ``selection = "private"`` in
``[tune]`` replaces steps 1-2 by Papernot & Steinke's random stopping, which releases per
candidate and ε only the best of a secret random number of runs::

    [tune]
    selection = "private"            # "public" (the default): steps 1-2 as above
    [tune.private]
    mean = 10                        # E[K] (or gamma, the stopping probability)
    eta = 1                          # K's shape: 1 geometric (the default), 0 logarithmic

Each of its runs is a grid point and a selection seed drawn uniformly, with fresh noise
(``experiment.entropy = "os"``); its ε (Theorem 2) enters ``privacy`` in place of the grid's.
"""

from __future__ import annotations

import copy
import csv
import hashlib
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from dpdl.accounting.schedules import algorithm_private
from dpdl.errors import require
from dpdl.experiments.registry import EXPERIMENT_KINDS, kind_of
from dpdl.experiments.sweep.driver import finished_cells, run_sweep
from dpdl.experiments.tune_private import (
    check_private,
    release_epsilon,
    run_curves,
    run_private_selection,
    selection_winner,
    with_settings,
)
from dpdl.training.provenance import PROVENANCE_KEY, provenance, provenance_lines
from dpdl.training.results import sample_std

# What a tuning may select on, each a final number on the validation records (never the
# test records, which would then no longer test the pick), with +1 where larger is better:
# the network-average model's accuracy and loss, and the nodes' own models' mean and worst
# accuracy (a decentralized run is only as good as its worst node).
TUNE_METRICS = {"val_accuracy": 1.0, "val_loss": -1.0, "val_node_accuracy_mean": 1.0,
                "val_node_accuracy_worst": 1.0}  # fmt: skip
TUNE_KEYS = {"metric", "selection_seeds", "test_seeds", "workers", "candidates", "baselines",
             "selection", "private"}  # fmt: skip
CANDIDATE_KEYS = {"algorithm", "grid", "zip", "set"}
SELECTIONS = ("public", "private")
RULE = ("the largest mean {metric} over the selection seeds (a point with a failed or missing "
        "seed is never picked; ties: the first point in grid order)")  # fmt: skip
PRIVATE_RULE = ("the best final {metric} among K ~ truncated negative binomial (eta = {eta:g}, "
                "gamma = {gamma:.4g}; E[K] = {mean:.3g}) runs, each at a uniformly drawn grid "
                "point and selection seed with fresh noise; only that run is released "
                "(Papernot & Steinke 2022)")  # fmt: skip

__all__ = ["run_tuning", "split_tune", "candidate_points", "sweep_runs", "tuning_summary",
           "write_report"]


# --------------------------------------------------------------------------- config
def _tuned_kinds() -> list[str]:
    return [name for name, kind in EXPERIMENT_KINDS.items() if kind.tunes]


def split_tune(config: dict) -> tuple[dict, dict]:
    """The base config and the validated ``[tune]`` table (one-line errors naming the key)."""
    config = copy.deepcopy(config)
    tune = config.pop("tune", None)
    require(isinstance(tune, dict), "a tune config needs a [tune] table")
    unknown = set(tune) - TUNE_KEYS
    require(not unknown, f"unknown key(s) in [tune]: {', '.join(sorted(unknown))}")
    kind = kind_of(config)
    require(kind.tunes, f"tuning runs a kind that tunes ({', '.join(_tuned_kinds())}; the "
                        f"Dyn-D2P family), not {kind.name!r}")  # fmt: skip
    require("sweep" not in config, "a tune config has no [sweep] table: [tune] makes the grids")
    data = config.get("data", {})
    require(bool(data.get("validation_records") or data.get("validation_file")),
            "tuning chooses on validation records: set data.validation_records (or, with "
            "data.per_node, data.validation_file)")  # fmt: skip
    for key in ("selection_seeds", "test_seeds"):
        seeds = tune.get(key)
        require(isinstance(seeds, list) and seeds and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds),
            f"tune.{key} must be a non-empty list of seeds, got {seeds!r}")  # fmt: skip
    require(not set(tune["selection_seeds"]) & set(tune["test_seeds"]),
            "tune.test_seeds must be fresh: they share seeds with tune.selection_seeds")
    tune.setdefault("metric", "val_accuracy")
    require(tune["metric"] in TUNE_METRICS,
            f"tune.metric must be one of {', '.join(TUNE_METRICS)} (measured on validation "
            f"records), got {tune['metric']!r}")  # fmt: skip
    candidates = tune.get("candidates")
    require(isinstance(candidates, dict) and candidates,
            "[tune.candidates] needs at least one named candidate")  # fmt: skip
    sizes = {}
    for name, cand in candidates.items():
        _check_candidate(name, cand, needs_grid=True)
        sizes[name] = len(candidate_points(cand))
    require(len(set(sizes.values())) == 1,
            "every candidate must get the same tuning budget: grid sizes "
            + ", ".join(f"{n} {s}" for n, s in sizes.items()))  # fmt: skip
    for name, cand in tune.get("baselines", {}).items():
        _check_candidate(name, cand, needs_grid=False)
        require(name not in candidates, f"tune.baselines.{name} is also a candidate")
    tune.setdefault("baselines", {})
    _check_selection(config, tune)
    return config, tune


def _check_selection(config: dict, tune: dict) -> None:
    """``tune.selection`` (public, the default, or private) and its ``[tune.private]``."""
    tune.setdefault("selection", "public")
    require(tune["selection"] in SELECTIONS,
            f"tune.selection must be public or private, got {tune['selection']!r}")  # fmt: skip
    if tune["selection"] == "private":
        tune["private"] = check_private(config, tune)
    else:
        require("private" not in tune, "[tune.private] goes with tune.selection = \"private\"")


def _check_candidate(name: str, cand: Any, *, needs_grid: bool) -> None:
    what = f"tune.{'candidates' if needs_grid else 'baselines'}.{name}"
    require(isinstance(cand, dict), f"{what} must be a table")
    unknown = set(cand) - CANDIDATE_KEYS
    require(not unknown, f"unknown key(s) in {what}: {', '.join(sorted(unknown))}")
    require(isinstance(cand.get("algorithm"), str), f"{what}.algorithm must name an algorithm")
    base = cand["algorithm"].partition("@")[0]
    require(algorithm_private(base), f"{what}: {base} is not private")
    if not needs_grid:
        require("grid" not in cand and "zip" not in cand,
                f"{what} runs at fixed settings: give them in set, not a grid")  # fmt: skip
    for table in ("grid", "zip"):
        for key, values in cand.get(table, {}).items():
            require(isinstance(values, list) and values,
                    f"{what}.{table}.{key} must be a non-empty list")  # fmt: skip
            require(key not in ("experiment.seed", "experiment.algorithms", "privacy.epsilon"),
                    f"{what}.{table}: {key} is set by the tuner, not tuned")  # fmt: skip
    lengths = {len(v) for v in cand.get("zip", {}).values()}
    require(len(lengths) <= 1, f"{what}.zip lists must have one length")


def candidate_points(cand: dict) -> list[tuple[tuple[str, Any], ...]]:
    """Every grid point of a candidate, in grid order: the product of ``grid`` times the
    rows of ``zip`` (as a sweep expands them), each a tuple of (dotted key, value)."""
    grid, zipped = cand.get("grid", {}), cand.get("zip", {})
    rows = [()]
    if zipped:
        length = len(next(iter(zipped.values())))
        rows = [tuple((k, v[i]) for k, v in zipped.items()) for i in range(length)]
    keys = list(grid)
    return [tuple(zip(keys, values, strict=True)) + row
            for values in itertools.product(*(grid[k] for k in keys)) for row in rows]


_with = with_settings


def _epsilons(base: dict) -> list[float]:
    eps = base.get("privacy", {}).get("epsilon", 1.0)
    return [float(e) for e in (eps if isinstance(eps, list) else [eps])]


# --------------------------------------------------------------------------- the phases
def _selection_sweep(base: dict, tune: dict, cand: dict) -> dict:
    config = _with(base, cand["algorithm"], cand.get("set", {}))
    grid = {**cand.get("grid", {}), "experiment.seed": list(tune["selection_seeds"])}
    config["sweep"] = {"grid": grid, **({"zip": cand["zip"]} if cand.get("zip") else {})}
    return config


def _test_sweep(base: dict, tune: dict, algorithm: str, settings: dict, eps: float) -> dict:
    config = _with(base, algorithm, {**settings, "privacy.epsilon": eps})
    config["sweep"] = {"grid": {"experiment.seed": list(tune["test_seeds"])}}
    return config


def sweep_runs(sweep_dir: Path, metric: str) -> list[dict]:
    """One entry per (cell, run) of a sweep folder: its overrides, seed, ε and numbers (none
    for a folder not started yet)."""
    out = []
    if not (Path(sweep_dir) / "cells").is_dir():
        return out
    for _, record in finished_cells(sweep_dir):
        overrides = record["overrides"]
        for cell in record["results"].get("cells", []):
            final = cell.get("final") or {}
            value = final.get(metric) if cell.get("status") == "ok" else None
            out.append({
                "overrides": {k: v for k, v in overrides.items() if k != "experiment.seed"},
                "seed": cell["seed"],
                "epsilon": float(cell["epsilon_target"]),
                "value": math.nan if value is None else float(value),
                "test_accuracy": _number(final.get("test_accuracy")),
                "epsilon_certified": _number(final.get("epsilon_certified")),
                # the relation ε is stated for (add/remove before dpdl recorded it)
                "neighboring": cell.get("neighboring") or "add-remove",
                "status": cell.get("status"),
                "schedule": _recorded_schedule(cell.get("schedule")),
            })
    return out


def _recorded_schedule(schedule: dict | None) -> list | None:
    """What a run recorded of its schedule: [steps, sample rate, first z, last z]."""
    keys = ("steps", "sample_rate", "noise_multiplier_first", "noise_multiplier_last")
    if not schedule or any(schedule.get(key) is None for key in keys):
        return None
    return [schedule[key] for key in keys]


def _number(value) -> float:
    return math.nan if value is None else float(value)


def pick(points: list[tuple], runs: list[dict], seeds: list[int], eps: float,
         metric: str) -> tuple[list[dict], int | None]:
    """Every point's validation numbers at ``eps`` and the index of the pick (see RULE)."""
    sign = TUNE_METRICS[metric]
    table, best = [], None
    for index, point in enumerate(points):
        settings = dict(point)
        values = {r["seed"]: r["value"] for r in runs
                  if r["overrides"] == settings and r["epsilon"] == eps}  # fmt: skip
        complete = all(s in values and math.isfinite(values[s]) for s in seeds)
        mean = float(np.mean([values[s] for s in seeds])) if complete else math.nan
        std = sample_std([values[s] for s in seeds]) if complete else math.nan
        table.append({"point": settings, "values": {str(s): values.get(s) for s in seeds},
                      "mean": mean, "std": std, "complete": complete})  # fmt: skip
        if complete and (best is None or sign * mean > sign * table[best]["mean"]):
            best = index
    return table, best


def run_tuning(config: dict, out: Path, *, workers: int | None = None,
               progress: bool = True) -> dict[str, Any]:
    """Selection sweeps, picks, test sweeps and the write-up (see the module doc); resumable:
    every sweep skips its finished cells, so a rerun continues where it stopped."""
    base, tune = split_tune(config)
    out = Path(out)
    metric, workers = tune["metric"], workers or tune.get("workers", 1)
    from dpdl.experiments.config import parse_config
    from dpdl.experiments.sweep.executors.local import LocalExecutor

    parse_config(base)  # the base is a valid run config before any process starts
    pool = LocalExecutor(workers, persistent=True)  # one set of workers for every sweep
    try:
        return _run_tuning(base, tune, out, metric, workers, progress, pool)
    finally:
        pool.close()


def _run_tuning(base, tune, out, metric, workers, progress, pool) -> dict[str, Any]:
    """The baselines' test seeds first (they need no selection), then each candidate's
    selection followed at once by its picks' test seeds: the verdicts of a long tuning arrive
    candidate by candidate.  The order changes no number (every run's noise comes from its
    own settings and seed)."""
    failed: dict[str, Any] = {}
    epsilons = _epsilons(base)

    def run_tests(plan: list[tuple]) -> None:
        for name, algorithm, settings, eps, _ in plan:
            folder = out / "test" / f"{name}-eps{eps:g}"  # 3. picks and baselines, test seeds
            result = run_sweep(_test_sweep(base, tune, algorithm, settings, eps), folder,
                               workers=workers, progress=progress, runner=pool)  # fmt: skip
            failed.update({f"test/{folder.name}/{k}": v for k, v in result["failed"].items()})

    run_tests(_baseline_tests(tune, epsilons))
    for name, cand in tune["candidates"].items():  # 1. selection, 2. its picks
        if tune["selection"] == "private":  # a beaten run's failure is not released either
            for eps in epsilons:
                _select_privately(base, tune, (name, cand), eps, out, progress, pool)
        else:
            result = run_sweep(_selection_sweep(base, tune, cand), out / "select" / name,
                               workers=workers, progress=progress, runner=pool)  # fmt: skip
            failed.update({f"select/{name}/{k}": v for k, v in result["failed"].items()})
        picks = _candidates({**tune, "candidates": {name: cand}}, out, metric, epsilons)
        run_tests(_pick_tests(picks))
    summary = tuning_summary(base, tune, out)
    summary["failed"] = failed
    _write(out, summary, tune)  # 4.
    return summary


def _private_folder(out: Path, name: str, eps: float) -> Path:
    return Path(out) / "private" / f"{name}-eps{eps:g}"


def _select_privately(base, tune, candidate: tuple[str, dict], eps: float, out: Path,
                      progress: bool, pool) -> dict:  # fmt: skip
    """1-2 of a private selection (tune_private.run_private_selection): each run a one-cell
    sweep in its own folder, scored by its final metric (a failed run scores -inf)."""
    name, cand = candidate
    points, metric = candidate_points(cand), tune["metric"]
    sign = TUNE_METRICS[metric]

    def run_one(point: int, seed: int, folder: Path) -> float:
        settings = {**cand.get("set", {}), **dict(points[point]), "privacy.epsilon": eps}
        config = _with(base, cand["algorithm"], settings)
        config["sweep"] = {"grid": {"experiment.seed": [seed]}}
        run_sweep(config, folder, workers=1, progress=progress, runner=pool)
        values = [run["value"] for run in sweep_runs(folder, metric)]
        return sign * values[0] if values and math.isfinite(values[0]) else -math.inf

    plan = [base, cand, eps, tune["selection_seeds"], tune["private"], tune["metric"]]
    digest = hashlib.sha256(json.dumps(plan, sort_keys=True, default=str).encode()).hexdigest()
    return run_private_selection(_private_folder(out, name, eps), len(points),
                                 tune["selection_seeds"], tune["private"], run_one,
                                 digest[:16])  # fmt: skip


def tuning_summary(base: dict, tune: dict, out: Path) -> dict[str, Any]:
    """What the folders under ``out`` hold so far: every candidate's grid points with their
    validation numbers and picks (2.), and the finished test runs (3.); a point or a test
    not run yet is reported as missing.  ``dpdl tune --report`` writes it for a running
    tuning."""
    metric = tune["metric"]
    rule = (RULE.format(metric=metric) if tune["selection"] == "public"
            else PRIVATE_RULE.format(metric=metric, **tune["private"]))  # fmt: skip
    summary: dict[str, Any] = {"rule": rule, "metric": metric, "selection": tune["selection"],
                               "private": tune.get("private"),
                               "epsilons": _epsilons(base), "failed": {},
                               "candidates": _candidates(tune, out, metric, _epsilons(base)),
                               "baselines": {name: {"algorithm": b["algorithm"],
                                                    "set": b.get("set", {})}
                                             for name, b in tune["baselines"].items()}}  # fmt: skip
    test_rows = []
    for name, algorithm, settings, eps, kind in _test_plan(summary["candidates"], tune,
                                                            summary["epsilons"]):  # fmt: skip
        folder = out / "test" / f"{name}-eps{eps:g}"
        for run in sweep_runs(folder, metric):
            test_rows.append({"name": name, "kind": kind, "algorithm": algorithm,
                              "settings": json.dumps(settings, sort_keys=True), **{
                                  k: run[k] for k in ("seed", "epsilon", "status",
                                                      "test_accuracy", "epsilon_certified",
                                                      "neighboring")}})
    summary["tests"] = test_rows
    summary["privacy"] = _release_privacy(base, tune, out, summary)
    return summary


def _released_runs(tune: dict, out: Path, summary: dict) -> tuple[list, list]:
    """(every run released as itself, each finished private selection's runs Q draws from)
    as (algorithm, settings, ε, seed, recorded schedule or None): a public selection
    releases every one of its runs."""
    runs = []
    for name, algorithm, settings, eps, _ in _test_plan(summary["candidates"], tune,
                                                         summary["epsilons"]):  # fmt: skip
        runs += [(algorithm, settings, r["epsilon"], r["seed"], r["schedule"])
                 for r in sweep_runs(out / "test" / f"{name}-eps{eps:g}", tune["metric"])]
    selections = []
    for name, cand in tune["candidates"].items():
        algorithm, fixed = cand["algorithm"], cand.get("set", {})
        if tune["selection"] == "public":
            runs += [(algorithm, {**fixed, **r["overrides"]}, r["epsilon"], r["seed"],
                      r["schedule"]) for r in sweep_runs(out / "select" / name, tune["metric"])]
            continue
        for eps_text, by in summary["candidates"][name]["by_epsilon"].items():
            if by["finished"]:  # every point and seed Q may draw: not run, planned
                selections.append([(algorithm, {**fixed, **dict(point)}, float(eps_text), seed,
                                    None) for point in candidate_points(cand)
                                   for seed in tune["selection_seeds"]])  # fmt: skip
    return runs, selections


def _release_privacy(base: dict, tune: dict, out: Path, summary: dict) -> dict[str, Any]:
    """The ε of everything ``out`` releases so far (tune_private.release_epsilon)."""
    from dpdl.experiments.config import parse_config

    runs, selections = _released_runs(tune, out, summary)
    cfg = parse_config(base)
    curves = run_curves(base, runs + [run for sel in selections for run in sel],
                        Path(out) / "privacy-cache.json")  # fmt: skip
    own, rest = curves[: len(runs)], curves[len(runs):]
    grouped = []
    for sel in selections:
        grouped.append((rest[: len(sel)], tune["private"]))
        rest = rest[len(sel):]
    result = release_epsilon(grouped, own, cfg.privacy.delta)
    result["entropy"] = cfg.experiment.entropy
    return result


def _candidates(tune: dict, out: Path, metric: str, epsilons=None) -> dict[str, Any]:
    """2. Every candidate's points at every ε, with the pick (None until one is complete)."""
    if tune.get("selection") == "private":
        return {name: _private_entry(name, cand, out, metric, epsilons)
                for name, cand in tune["candidates"].items()}  # fmt: skip
    out_candidates = {}
    for name, cand in tune["candidates"].items():
        points = candidate_points(cand)
        runs = sweep_runs(out / "select" / name, metric)
        entry = {"algorithm": cand["algorithm"], "fixed": cand.get("set", {}),
                 "grid": cand.get("grid", {}), "zip": cand.get("zip", {}),
                 "points": len(points), "by_epsilon": {}}  # fmt: skip
        for eps in epsilons or sorted({r["epsilon"] for r in runs}):
            table, best = pick(points, runs, tune["selection_seeds"], eps, metric)
            entry["by_epsilon"][f"{eps:g}"] = {
                "table": table,
                "pick": None if best is None else table[best]["point"],
            }
        out_candidates[name] = entry
    return out_candidates


def _private_entry(name: str, cand: dict, out: Path, metric: str, epsilons) -> dict:
    """2. of a private selection: per ε its winner (None while it runs) and nothing of the
    runs it beat; the pick is the winner's point unless the winner failed too."""
    points = candidate_points(cand)
    entry = {"algorithm": cand["algorithm"], "fixed": cand.get("set", {}),
             "grid": cand.get("grid", {}), "zip": cand.get("zip", {}),
             "points": len(points), "by_epsilon": {}}  # fmt: skip
    for eps in epsilons:
        folder = _private_folder(out, name, eps)
        winner = selection_winner(folder)
        by = {"finished": winner is not None, "pick": None, "winner": None}
        if winner is not None:
            (run, *_) = sweep_runs(folder / winner["folder"], metric) or [{}]
            by["winner"] = {"point": dict(points[winner["point"]]), "seed": winner["seed"],
                            "value": run.get("value", math.nan),
                            "test_accuracy": run.get("test_accuracy", math.nan),
                            "epsilon_certified": run.get("epsilon_certified", math.nan),
                            "folder": str(folder / winner["folder"])}  # fmt: skip
            if math.isfinite(by["winner"]["value"]):
                by["pick"] = by["winner"]["point"]
        entry["by_epsilon"][f"{eps:g}"] = by
    return entry


def _test_plan(candidates: dict, tune: dict, epsilons=None) -> list[tuple]:
    """(name, algorithm, settings, ε, "tuned" | "untuned") of every test sweep: each
    candidate's pick at each ε (once it has one), and every baseline."""
    every_eps = epsilons or sorted({float(e) for entry in candidates.values()
                                    for e in entry["by_epsilon"]})  # fmt: skip
    return _pick_tests(candidates) + _baseline_tests(tune, every_eps)


def _pick_tests(candidates: dict) -> list[tuple]:
    plan = []
    for name, entry in candidates.items():
        for eps_text, by in entry["by_epsilon"].items():
            if by["pick"] is not None:
                plan.append((name, entry["algorithm"], {**entry["fixed"], **by["pick"]},
                             float(eps_text), "tuned"))  # fmt: skip
    return plan


def _baseline_tests(tune: dict, epsilons: list[float]) -> list[tuple]:
    return [(name, base_line["algorithm"], base_line.get("set", {}), eps, "untuned")
            for name, base_line in tune["baselines"].items() for eps in epsilons]  # fmt: skip


# --------------------------------------------------------------------------- the write-up
def _point_text(point: dict) -> str:
    return " ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in point.items()) or "(base)"


def write_report(config: dict, out: Path) -> dict[str, Any]:
    """The report of what ``out`` holds so far (see :func:`tuning_summary`), runs nothing."""
    base, tune = split_tune(config)
    folder = "private" if tune["selection"] == "private" else "select"
    require((Path(out) / folder).is_dir(), f"{out} holds no tuning (no {folder}/ folder)")
    summary = tuning_summary(base, tune, Path(out))
    _write(Path(out), summary, tune)
    return summary


def _write(out: Path, summary: dict, tune: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    # the process writing the report; every run folder under out keeps its own
    summary.setdefault(PROVENANCE_KEY, provenance())
    (out / "tune.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    with (out / "selection.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerows(_selection_rows(summary, tune))
    fields = ["name", "kind", "algorithm", "settings", "seed", "epsilon", "status",
              "test_accuracy", "epsilon_certified", "neighboring"]  # fmt: skip
    with (out / "test.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(summary["tests"])
    private = summary["selection"] == "private"
    lines = _private_sections(summary, tune) if private else _public_sections(summary, tune)
    provenance_section = ["", "## Provenance (of this report)", "",
                          *(f"- {line}" for line in provenance_lines(summary[PROVENANCE_KEY]))]
    (out / "tune.md").write_text("\n".join(lines + _test_sections(summary) + provenance_section)
                                 + "\n")


def _selection_rows(summary: dict, tune: dict) -> list[list]:
    """selection.csv: every point's numbers (public), each selection's winner (private)."""
    if summary["selection"] == "private":
        rows = [["candidate", "algorithm", "epsilon", "point", "seed", "value", "picked"]]
        for name, entry in summary["candidates"].items():
            for eps, by in entry["by_epsilon"].items():
                if by["winner"] is not None:
                    won = by["winner"]
                    rows.append([name, entry["algorithm"], eps, _point_text(won["point"]),
                                 won["seed"], won["value"], by["pick"] is not None])  # fmt: skip
        return rows
    seeds = [str(s) for s in tune["selection_seeds"]]
    rows = [["candidate", "algorithm", "epsilon", "point", *[f"seed{s}" for s in seeds], "mean",
             "std", "picked"]]  # fmt: skip
    for name, entry in summary["candidates"].items():
        for eps, by in entry["by_epsilon"].items():
            rows += [[name, entry["algorithm"], eps, _point_text(row["point"]),
                      *[row["values"][s] for s in seeds], row["mean"], row["std"],
                      row["point"] == by["pick"]] for row in by["table"]]  # fmt: skip
    return rows


def _grid_line(entry: dict) -> str:
    grid = "; ".join(f"{k} ∈ {v}" for k, v in {**entry["grid"], **entry["zip"]}.items())
    fixed = ", ".join(f"{k} = {v}" for k, v in entry["fixed"].items())
    return (f"Grid ({entry['points']} points): {grid}" + (f"; fixed: {fixed}" if fixed else "")
            + (" (zip: parallel lists)" if entry["zip"] else ""))  # fmt: skip


def _public_sections(summary: dict, tune: dict) -> list[str]:
    """tune.md's head and selection tables of a public selection (the default)."""
    lines = ["# Tuning on validation data, then the test seeds", "",
             f"Selection: public (the default). Rule: {summary['rule']}. Every candidate got "
             f"{_budget(summary)} grid points (selection seeds {tune['selection_seeds']}, test "
             f"seeds {tune['test_seeds']}).", "", _privacy_text(summary), "",
             _progress(summary, tune), ""]  # fmt: skip
    for name, entry in summary["candidates"].items():
        lines += [f"## {name}: {entry['algorithm']}", "", _grid_line(entry), "",
                  "| ε | point | mean | std | picked |", "|---|---|---|---|---|"]  # fmt: skip
        for eps, by in entry["by_epsilon"].items():
            for row in by["table"]:
                mark = "**yes**" if row["point"] == by["pick"] else ""
                lines.append(f"| {eps} | {_point_text(row['point'])} | {row['mean']:.4f} | "
                             f"{row['std']:.4f} | {mark} |")  # fmt: skip
        lines.append("")
    return lines


def _private_sections(summary: dict, tune: dict) -> list[str]:
    """tune.md's head and winners of a private selection: nothing of the runs beaten."""
    privacy = summary["privacy"]
    lines = ["# Private selection on validation data, then the test seeds", "",
             f"Selection: private. Rule: {summary['rule']}. Every candidate got "
             f"{_budget(summary)} grid points (selection seeds {tune['selection_seeds']}, test "
             f"seeds {tune['test_seeds']}).", "", _privacy_text(summary), "",
             _progress(summary, tune), "",
             "| candidate | ε per run | pick | seed | validation | test accuracy | ε of one "
             "run (RDP) | ε of the selection |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    parts = iter(privacy["selections"])
    for name, entry in summary["candidates"].items():
        for eps, by in entry["by_epsilon"].items():
            won = by["winner"]
            if won is None:
                lines.append(f"| {name} | {eps} | (running) | | | | | |")
                continue
            part = next(parts)
            pick = "none: the winner failed" if by["pick"] is None else _point_text(by["pick"])
            lines.append(f"| {name} | {eps} | {pick} | {won['seed']} | {won['value']:.4f} | "
                         f"{won['test_accuracy']:.4f} | {part['epsilon_one_run']:.3f} | "
                         f"{part['epsilon_selection']:.3f} |")  # fmt: skip
    lines.append("")
    for name, entry in summary["candidates"].items():
        lines += [f"- {name} ({entry['algorithm']}): {_grid_line(entry)}"]
    return lines + [""]


def _privacy_text(summary: dict) -> str:
    """What the folder's releases cost the training records (tune_private.release_epsilon)."""
    privacy, metric = summary["privacy"], summary["metric"]
    seeded = (" With experiment.entropy = \"seed\" none of it is private against whoever knows "
              "the seed: the number is what OS entropy would give." if privacy["entropy"] ==
              "seed" else "")  # fmt: skip
    scored = (f"Scores ({metric}) are measured on the validation records: declared public (no "
              "guarantee for them), the same records for every seed and never trained on, so "
              "scoring costs nothing beyond each run's ε.")  # fmt: skip
    if summary["selection"] == "public":
        what = (f"The picks, though, are functions of every selection run: together with the "
                f"test runs this folder releases {privacy['runs']} runs of the training records, "
                "which compose to")  # fmt: skip
    else:
        what = ("Only each selection's winner is released (its beaten runs are deleted; K is in "
                "no output). The selections (Theorem 2) and the "
                f"{privacy['runs']} test runs compose to")  # fmt: skip
    return (f"Privacy: {scored} {what} **ε = {privacy['epsilon']:.3f} at δ = "
            f"{privacy['delta']:g}** for every training record (an RDP composition at the "
            f"runs' δ, add/remove one record; one run alone is ε = "
            f"{privacy['epsilon_one_run']:.3f} by the same accountant, its own reported ε may "
            f"be a tighter PLD bound).{seeded}")


def _test_sections(summary: dict) -> list[str]:
    from dpdl.experiments.paired import markdown_comparisons, markdown_summary, paired, summarize

    # one "setting" for all: tuned and untuned runs are compared with each other too
    rows = [{"algorithm": f"{r['name']} ({r['kind']})", "setting": "test seeds", "seed": r["seed"],
             "epsilon_target": r["epsilon"], "status": r["status"],
             "test_accuracy": r["test_accuracy"], "epsilon_certified": r["epsilon_certified"]}
            for r in summary["tests"]]  # fmt: skip
    lines = ["## Test seeds at the picks (and the untuned baselines)", "",
             markdown_summary(summarize(rows)), ""]  # fmt: skip
    names = [f"{n} (tuned)" for n in summary["candidates"]]
    names += [f"{n} (untuned)" for n in summary["baselines"]]
    comparisons = []
    for a, b in itertools.combinations(names, 2):
        comparisons += paired(rows, a, b, by="algorithm")
    if comparisons:
        lines += ["## Seed-paired comparisons (test accuracy, 95 % t-intervals)", "",
                  markdown_comparisons(comparisons), ""]  # fmt: skip
    return lines


def _progress(summary: dict, tune: dict) -> str:
    """How much has run: selection runs per candidate and test runs, of all that will."""
    seeds, eps = len(tune["selection_seeds"]), len(summary["epsilons"])
    private = summary["selection"] == "private"
    parts = []
    for name, entry in summary["candidates"].items():
        if private:  # a private selection's count of runs is secret: only whether it ended
            done = sum(by["finished"] for by in entry["by_epsilon"].values())
            parts.append(f"{name} {done}/{eps} finished")
            continue
        done = sum(v is not None for by in entry["by_epsilon"].values() for row in by["table"]
                   for v in row["values"].values())  # fmt: skip
        parts.append(f"{name} {done}/{entry['points'] * seeds * eps}")
    planned = (sum(1 for entry in summary["candidates"].values()
                   for by in entry["by_epsilon"].values() if by["pick"] is not None)
               + len(summary["baselines"]) * eps) * len(tune["test_seeds"])  # fmt: skip
    complete = all(by["finished"] if private else all(row["complete"] for row in by["table"])
                   for entry in summary["candidates"].values()
                   for by in entry["by_epsilon"].values())  # fmt: skip
    status = "" if complete else (" Selection is not finished: a pick is the best of the "
                                  "points complete so far, and may change.")  # fmt: skip
    if private and not complete:
        status = " A selection still running has no pick and releases nothing yet."
    return (f"Runs finished: selection {', '.join(parts)}; test {len(summary['tests'])} of "
            f"{planned} planned so far.{status}")


def _budget(summary: dict) -> int:
    sizes = {entry["points"] for entry in summary["candidates"].values()}
    return next(iter(sizes)) if len(sizes) == 1 else -1
