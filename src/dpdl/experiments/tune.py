"""Fair tuning: every algorithm, baselines included, gets the same budget on validation data.

A tune config is a ``decentralized`` run config (with ``data.validation_records``) plus a
``[tune]`` table::

    [tune]
    metric = "val_accuracy"          # final value on the validation records; larger is better
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
the same, or the comparison is not fair.  Choosing on validation records is outside the
per-run ε (docs/THREAT_MODEL.md): those records are declared public.
"""

from __future__ import annotations

import copy
import csv
import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from dpdl.errors import require
from dpdl.experiments.sweep.driver import finished_cells, run_sweep
from dpdl.experiments.sweep.grid import set_dotted
from dpdl.training.results import sample_std

TUNE_KEYS = {"metric", "selection_seeds", "test_seeds", "workers", "candidates", "baselines"}
CANDIDATE_KEYS = {"algorithm", "grid", "zip", "set"}
RULE = ("the largest mean {metric} over the selection seeds (a point with a failed or missing "
        "seed is never picked; ties: the first point in grid order)")  # fmt: skip

__all__ = ["run_tuning", "split_tune", "candidate_points", "sweep_runs", "tuning_summary",
           "write_report"]


# --------------------------------------------------------------------------- config
def split_tune(config: dict) -> tuple[dict, dict]:
    """The base config and the validated ``[tune]`` table (one-line errors naming the key)."""
    config = copy.deepcopy(config)
    tune = config.pop("tune", None)
    require(isinstance(tune, dict), "a tune config needs a [tune] table")
    unknown = set(tune) - TUNE_KEYS
    require(not unknown, f"unknown key(s) in [tune]: {', '.join(sorted(unknown))}")
    require(config.get("kind", "decentralized") == "decentralized",
            "tuning runs the decentralized kind (the Dyn-D2P family)")  # fmt: skip
    require("sweep" not in config, "a tune config has no [sweep] table: [tune] makes the grids")
    require(bool(config.get("data", {}).get("validation_records")),
            "tuning chooses on validation records: set data.validation_records")  # fmt: skip
    for key in ("selection_seeds", "test_seeds"):
        seeds = tune.get(key)
        require(isinstance(seeds, list) and seeds and all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds),
            f"tune.{key} must be a non-empty list of seeds, got {seeds!r}")  # fmt: skip
    require(not set(tune["selection_seeds"]) & set(tune["test_seeds"]),
            "tune.test_seeds must be fresh: they share seeds with tune.selection_seeds")
    tune.setdefault("metric", "val_accuracy")
    require(tune["metric"] in ("val_accuracy", "val_loss"),
            f"tune.metric must be val_accuracy or val_loss, got {tune['metric']!r}")
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
    return config, tune


def _check_candidate(name: str, cand: Any, *, needs_grid: bool) -> None:
    what = f"tune.{'candidates' if needs_grid else 'baselines'}.{name}"
    require(isinstance(cand, dict), f"{what} must be a table")
    unknown = set(cand) - CANDIDATE_KEYS
    require(not unknown, f"unknown key(s) in {what}: {', '.join(sorted(unknown))}")
    require(isinstance(cand.get("algorithm"), str), f"{what}.algorithm must name an algorithm")
    require(cand["algorithm"].partition("@")[0] != "sgp", f"{what}: sgp is not private")
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


def _with(base: dict, algorithm: str, settings: dict) -> dict:
    config = copy.deepcopy(base)
    set_dotted(config, "experiment.algorithms", [algorithm])
    for key, value in settings.items():
        set_dotted(config, key, value)
    return config


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
            })
    return out


def _number(value) -> float:
    return math.nan if value is None else float(value)


def pick(points: list[tuple], runs: list[dict], seeds: list[int], eps: float,
         metric: str) -> tuple[list[dict], int | None]:
    """Every point's validation numbers at ``eps`` and the index of the pick (see RULE)."""
    sign = 1.0 if metric == "val_accuracy" else -1.0
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
        result = run_sweep(_selection_sweep(base, tune, cand), out / "select" / name,
                           workers=workers, progress=progress, runner=pool)  # fmt: skip
        failed.update({f"select/{name}/{k}": v for k, v in result["failed"].items()})
        picks = _candidates({**tune, "candidates": {name: cand}}, out, metric, epsilons)
        run_tests(_pick_tests(picks))
    summary = tuning_summary(base, tune, out)
    summary["failed"] = failed
    _write(out, summary, tune)  # 4.
    return summary


def tuning_summary(base: dict, tune: dict, out: Path) -> dict[str, Any]:
    """What the folders under ``out`` hold so far: every candidate's grid points with their
    validation numbers and picks (2.), and the finished test runs (3.); a point or a test
    not run yet is reported as missing.  ``dpdl tune --report`` writes it for a running
    tuning."""
    metric = tune["metric"]
    summary: dict[str, Any] = {"rule": RULE.format(metric=metric), "metric": metric,
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
    return summary


def _candidates(tune: dict, out: Path, metric: str, epsilons=None) -> dict[str, Any]:
    """2. Every candidate's points at every ε, with the pick (None until one is complete)."""
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
    require((Path(out) / "select").is_dir(), f"{out} holds no tuning (no select/ folder)")
    summary = tuning_summary(base, tune, Path(out))
    _write(Path(out), summary, tune)
    return summary


def _write(out: Path, summary: dict, tune: dict) -> None:
    from dpdl.experiments.paired import markdown_comparisons, markdown_summary, paired, summarize

    out.mkdir(parents=True, exist_ok=True)
    (out / "tune.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    with (out / "selection.csv").open("w", newline="") as fh:
        writer = csv.writer(fh)
        seeds = [str(s) for s in tune["selection_seeds"]]
        writer.writerow(["candidate", "algorithm", "epsilon", "point", *[f"seed{s}" for s in
                         seeds], "mean", "std", "picked"])  # fmt: skip
        for name, entry in summary["candidates"].items():
            for eps, by in entry["by_epsilon"].items():
                for row in by["table"]:
                    writer.writerow([name, entry["algorithm"], eps, _point_text(row["point"]),
                                     *[row["values"][s] for s in seeds], row["mean"], row["std"],
                                     row["point"] == by["pick"]])  # fmt: skip
    fields = ["name", "kind", "algorithm", "settings", "seed", "epsilon", "status",
              "test_accuracy", "epsilon_certified", "neighboring"]  # fmt: skip
    with (out / "test.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=fields)
        writer.writeheader()
        writer.writerows(summary["tests"])
    # one "setting" for all: tuned and untuned runs are compared with each other too
    rows = [{"algorithm": f"{r['name']} ({r['kind']})", "setting": "test seeds", "seed": r["seed"],
             "epsilon_target": r["epsilon"], "status": r["status"],
             "test_accuracy": r["test_accuracy"], "epsilon_certified": r["epsilon_certified"]}
            for r in summary["tests"]]  # fmt: skip
    lines = ["# Tuning on validation data, then the test seeds", "",
             f"Rule: {summary['rule']}. Every candidate got {_budget(summary)} grid points "
             f"(selection seeds {tune['selection_seeds']}, test seeds {tune['test_seeds']}). "
             "Choosing on the validation records is outside the per-run ε: they are declared "
             "public (docs/THREAT_MODEL.md).", "", _progress(summary, tune), ""]  # fmt: skip
    for name, entry in summary["candidates"].items():
        grid = "; ".join(f"{k} ∈ {v}" for k, v in {**entry["grid"], **entry["zip"]}.items())
        fixed = ", ".join(f"{k} = {v}" for k, v in entry["fixed"].items())
        lines += [f"## {name}: {entry['algorithm']}", "",
                  f"Grid ({entry['points']} points): {grid}" + (f"; fixed: {fixed}" if fixed
                                                               else "") + (
                      " (zip: parallel lists)" if entry["zip"] else ""), "",
                  "| ε | point | mean | std | picked |", "|---|---|---|---|---|"]  # fmt: skip
        for eps, by in entry["by_epsilon"].items():
            for row in by["table"]:
                mark = "**yes**" if row["point"] == by["pick"] else ""
                lines.append(f"| {eps} | {_point_text(row['point'])} | {row['mean']:.4f} | "
                             f"{row['std']:.4f} | {mark} |")  # fmt: skip
        lines.append("")
    groups = summarize(rows)
    lines += ["## Test seeds at the picks (and the untuned baselines)", "",
              markdown_summary(groups), ""]  # fmt: skip
    names = [f"{n} (tuned)" for n in summary["candidates"]]
    names += [f"{n} (untuned)" for n in summary["baselines"]]
    comparisons = []
    for a, b in itertools.combinations(names, 2):
        comparisons += paired(rows, a, b, by="algorithm")
    if comparisons:
        lines += ["## Seed-paired comparisons (test accuracy, 95 % t-intervals)", "",
                  markdown_comparisons(comparisons), ""]  # fmt: skip
    (out / "tune.md").write_text("\n".join(lines) + "\n")


def _progress(summary: dict, tune: dict) -> str:
    """How much has run: selection runs per candidate and test runs, of all that will."""
    seeds, eps = len(tune["selection_seeds"]), len(summary["epsilons"])
    parts = []
    for name, entry in summary["candidates"].items():
        done = sum(v is not None for by in entry["by_epsilon"].values() for row in by["table"]
                   for v in row["values"].values())  # fmt: skip
        parts.append(f"{name} {done}/{entry['points'] * seeds * eps}")
    planned = (sum(1 for entry in summary["candidates"].values()
                   for by in entry["by_epsilon"].values() if by["pick"] is not None)
               + len(summary["baselines"]) * eps) * len(tune["test_seeds"])  # fmt: skip
    complete = all(row["complete"] for entry in summary["candidates"].values()
                   for by in entry["by_epsilon"].values() for row in by["table"])  # fmt: skip
    status = "" if complete else (" Selection is not finished: a pick is the best of the "
                                  "points complete so far, and may change.")  # fmt: skip
    return (f"Runs finished: selection {', '.join(parts)}; test {len(summary['tests'])} of "
            f"{planned} planned so far.{status}")


def _budget(summary: dict) -> int:
    sizes = {entry["points"] for entry in summary["candidates"].values()}
    return next(iter(sizes)) if len(sizes) == 1 else -1
