"""Private selection for ``dpdl tune`` (``tune.selection = "private"``) and the privacy of what
a tuning releases, both in one accounting (:mod:`dpdl.accounting.selection`).

Private selection is Papernot & Steinke's random stopping (ICLR 2022): per candidate and
ε, draw K ~ D_{η,γ} (a truncated negative binomial; η = 1 the geometric distribution) and
K runs, each at a grid point and a selection seed drawn uniformly and with fresh noise; keep
only the run with the best final validation score.  K, the plan of runs and the best so far
live in ``state.json`` (owner-only, like a checkpoint's keys) until the selection ends; every
beaten run's folder is deleted as soon as it is beaten, run folders are named by random
tokens, and what remains is the winner's folder and ``{"winner": ...}``.  A rerun resumes
the plan: K is never drawn twice.  The score is computed on the validation records, which
are declared public and never trained on (``data.validation_records``); each run is the
mechanism Q of the paper (its noisy messages, and all it outputs, post-processing of them),
so the selection's ε covers the training records for the winner's every output.

:func:`release_epsilon` states the ε of everything a tuning folder releases, as one RDP
composition at the runs' δ: a private selection contributes Theorem 2's curve (Q: the
pointwise maximum over its grid points and seeds of a run's curve), every other run released
(a public selection's every run, the test runs, the baselines) its own curve.  A run's curve
is that of its schedule as the trainer plans it, computed without training.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpdl.accounting.selection import (
    SELECTION_ORDERS,
    best_of_rdp,
    check_distribution,
    draw_repetitions,
    expected_repetitions,
    gamma_for_mean,
    rdp_epsilon_at,
    schedule_rdp,
)
from dpdl.errors import require
from dpdl.experiments.sweep.grid import set_dotted
from dpdl.files import write_atomic

PRIVATE_KEYS = {"eta", "gamma", "mean"}
STATE = "state.json"

__all__ = ["check_private", "release_epsilon", "run_curves", "run_private_selection",
           "with_settings"]  # fmt: skip


def with_settings(base: dict, algorithm: str, settings: dict) -> dict:
    """``base`` running ``algorithm`` with the dotted ``settings`` applied."""
    config = copy.deepcopy(base)
    set_dotted(config, "experiment.algorithms", [algorithm])
    for key, value in settings.items():
        set_dotted(config, key, value)
    return config


def check_private(config: dict, tune: dict) -> dict[str, float]:
    """The validated ``[tune.private]`` table: {eta, gamma, mean} of the number of runs."""
    table = tune.get("private", {})
    require(isinstance(table, dict), f"tune.private must be a table, got {table!r}")
    unknown = set(table) - PRIVATE_KEYS
    require(not unknown, f"unknown key(s) in [tune.private]: {', '.join(sorted(unknown))}")
    require(("gamma" in table) != ("mean" in table),
            "tune.private needs exactly one of gamma (the stopping probability) and mean "
            f"(the expected number of runs), got {sorted(table) or 'neither'}")  # fmt: skip
    eta = table.get("eta", 1.0)
    check_distribution(eta, 0.5)
    gamma = table["gamma"] if "gamma" in table else gamma_for_mean(eta, table["mean"])
    eta, gamma = check_distribution(eta, gamma)
    entropy = config.get("experiment", {}).get("entropy", "os")
    require(entropy == "os",
            "tune.selection = \"private\" draws its number of runs and every run's noise in "
            f"secret: it needs experiment.entropy = \"os\", got {entropy!r}")  # fmt: skip
    return {"eta": eta, "gamma": gamma, "mean": expected_repetitions(eta, gamma)}


# --------------------------------------------------------------------------- the selection
def _save(folder: Path, state: dict) -> None:
    text = json.dumps(state).encode()
    write_atomic(folder / STATE, lambda fh: fh.write(text), mode=0o600)


def _draw_plan(points: int, seeds: list[int], private: dict) -> dict:
    """K and each run's (grid point, seed, folder token), from the OS's randomness."""
    rng = secrets.SystemRandom()
    k = draw_repetitions(private["eta"], private["gamma"], rng.random())
    runs = [[rng.randrange(points), rng.choice(seeds), secrets.token_hex(8)] for _ in range(k)]
    return {"runs": runs, "next": 0, "best": None}


def _keep_only(folder: Path, keep: str) -> None:
    from dpdl.training.site_ledger import LEDGER_FILE, remove_keeping_ledger

    for child in folder.iterdir():
        if child.name in (keep, STATE, LEDGER_FILE) or child.name.startswith(f".{STATE}."):
            continue
        # the losing runs' files go, their privacy does not: the site's ledger keeps them
        # (kept on the site: the number of runs K is the selection's secret)
        remove_keeping_ledger(child, folder)


def _plan(folder: Path, points: int, seeds: list[int], private: dict, digest: str) -> dict:
    """The selection's state in ``folder``: drawn and saved before its first run (so that a
    crash never redraws K), else read back, if it was planned for the same ``digest``."""
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    if not (folder / STATE).is_file():
        _save(folder, {**_draw_plan(points, seeds, private), "digest": digest})
    state = json.loads((folder / STATE).read_text())
    require(state.get("digest", "") == digest,
            f"{folder} holds a private selection planned under other settings (grid, seeds, "
            "distribution or base config): resuming it would mix two selections; use another "
            "--output")  # fmt: skip
    return state


def run_private_selection(folder: Path, points: int, seeds: list[int], private: dict,
                          run_one: Callable[[int, int, Path], float],
                          digest: str = "") -> dict:  # fmt: skip
    """Run (or resume) one random-stopping selection in ``folder``; returns the winner
    {point (index), seed, folder (its token)}.  ``run_one(point, seed, run_folder)`` trains one
    run there and returns its score, larger is better (-inf for a failed run).  ``digest``
    names the settings the plan is for: a resume under others is refused."""
    folder = Path(folder)
    state = _plan(folder, points, seeds, private, digest)
    if "winner" in state:
        return state["winner"]
    while state["next"] < len(state["runs"]):
        point, seed, token = state["runs"][state["next"]]
        score = run_one(point, seed, folder / token)
        best = state["best"]
        if best is None or score > best["score"]:  # a tie keeps the earlier run
            state["best"] = {"point": point, "seed": seed, "folder": token, "score": score}
        state["next"] += 1
        _save(folder, state)
        _keep_only(folder, state["best"]["folder"])
    winner = {key: state["best"][key] for key in ("point", "seed", "folder")}
    _save(folder, {"winner": winner, "digest": digest})  # K, the plan and the scores are gone
    return winner


def selection_winner(folder: Path) -> dict | None:
    """The winner of a finished selection in ``folder``, None while it runs (or before)."""
    path = Path(folder) / STATE
    state = json.loads(path.read_text()) if path.is_file() else {}
    return state.get("winner")


# --------------------------------------------------------------------------- the accounting
def run_curves(base: dict, runs: list[tuple], cache_path: Path) -> list[np.ndarray]:
    """The RDP curve (at ``SELECTION_ORDERS``) of each run (algorithm, settings, ε, seed,
    recorded): a finished run's from what it ``recorded`` of its schedule ([steps, rate,
    first z, last z]; no data needed), any other's from its schedule as the trainer plans it
    (a seed's data loaded once); cached in ``cache_path``."""
    cache_path = Path(cache_path)
    cache = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
    digest = hashlib.sha256(json.dumps([base, SELECTION_ORDERS.tolist()], sort_keys=True,
                                       default=str).encode()).hexdigest()[:16]  # fmt: skip
    keys = [json.dumps([digest, *run], sort_keys=True, default=str) for run in runs]
    missing = sorted({i for i, key in enumerate(keys) if key not in cache},
                     key=lambda i: runs[i][3])  # by seed: one data set in memory at a time
    by_sizes: dict[str, list[float]] = {}
    work = None
    for i in missing:
        if runs[i][4] is not None:
            cache[keys[i]] = _recorded_curve(base, runs[i], by_sizes)
        else:
            work = _curve_into(cache, by_sizes, base, runs[i], keys[i], work)
    if missing:
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(cache).encode()
        write_atomic(cache_path, lambda fh: fh.write(text), mode=0o644)
    return [np.asarray(cache[key], dtype=float) for key in keys]


def _curve_into(cache, by_sizes, base, run, key, work):
    """Compute one run's curve into ``cache``; returns the workload it used (for the next
    run of the same seed).  The schedule is a function of the settings and the node sizes
    (the trainer's plan), so runs of other seeds with the same sizes share it."""
    from dpdl.experiments.runner import cell_trainer, prepare_workload

    algorithm, settings, eps, seed, _ = run
    cfg = _cell(base, run)
    data = json.dumps([cfg.data.model_dump(), cfg.topology.model_dump(), seed], default=str)
    if work is None or work[0] != data:
        work = (data, prepare_workload(cfg, seed))
    planned = dataclasses.replace(work[1], config=cfg)
    sizes = json.dumps([algorithm, settings, eps, planned.records_per_node], sort_keys=True,
                       default=str)  # fmt: skip
    if sizes not in by_sizes:
        schedule = cell_trainer(planned, cfg.experiment.specs[0], eps).schedule
        # every mechanism of the run: one per release per step (gradient tracking: two)
        by_sizes[sizes] = schedule_rdp(schedule.release_multipliers, schedule.sample_rate,
                                       neighboring=schedule.neighboring).tolist()  # fmt: skip
    cache[key] = by_sizes[sizes]
    return work


def _cell(base: dict, run: tuple):
    from dpdl.experiments.config import parse_config

    algorithm, settings, eps, seed, _ = run
    return parse_config(with_settings(base, algorithm, {
        **settings, "privacy.epsilon": eps, "experiment.seed": seed,
        "experiment.runtime": "simulator"}))  # fmt: skip


def _recorded_curve(base: dict, run: tuple, memo: dict) -> list[float]:
    """A finished run's curve from its record: z constant at the recorded value when its
    first and last agree (the schedules of MATH.md §2 are monotone), else its schedule
    rebuilt from its settings at the recorded steps and rate, checked against the record."""
    from dpdl.training.plan import build_schedule

    steps, rate, first, last = run[4]
    key = json.dumps([run[0], run[1], run[2], run[4]], sort_keys=True, default=str)
    if key in memo:
        return memo[key]
    cfg = _cell(base, run)
    if first == last:
        z = np.full(int(steps), float(first))
    else:
        z = build_schedule(cfg.privacy, cfg.experiment.specs[0], run[2], int(steps),
                           float(rate)).noise_multipliers  # fmt: skip
        require(np.allclose([z[0], z[-1]], [first, last], rtol=1e-6, atol=0),
                f"a run of {run[0]} at {run[1]} (ε {run[2]:g}, seed {run[3]}) recorded noise "
                f"multipliers {first:.6g} .. {last:.6g}, its settings now plan {z[0]:.6g} .. "
                f"{z[-1]:.6g}: its ε cannot be restated")  # fmt: skip
    spec = cfg.experiment.specs[0]
    factors = [r.noise_factor for r in spec.algorithm.releases(spec.algorithm_settings)]
    z = np.outer(z, factors).ravel()  # every release of every step
    memo[key] = schedule_rdp(z, float(rate), neighboring=cfg.privacy.neighboring).tolist()
    return memo[key]


def release_epsilon(selections: list[tuple[list[np.ndarray], dict]],
                    runs: list[np.ndarray], delta: float) -> dict[str, Any]:  # fmt: skip
    """The ε at ``delta`` of releasing every private selection (the curves of its grid
    points and seeds, and its {eta, gamma}) and every other run (its curve), composed."""
    orders = SELECTION_ORDERS
    total = np.zeros(orders.size)
    parts = []
    for curves, private in selections:
        q = np.max(np.vstack(curves), axis=0)  # a random point and seed: their maximum
        curve = best_of_rdp(orders, q, private["eta"], private["gamma"])
        parts.append({"epsilon_one_run": rdp_epsilon_at(orders, q, delta)[0],
                      "epsilon_selection": rdp_epsilon_at(orders, curve, delta)[0]})  # fmt: skip
        total += curve
    for curve in runs:
        total += curve
    epsilon, order = rdp_epsilon_at(orders, total, delta)
    # one run alone by the same accountant: RDP is loose at small sampling rates, so this,
    # not the run's own (PLD) ε, is what the composition should be read against
    alone = [rdp_epsilon_at(orders, curve, delta)[0] for curve in runs]
    alone += [part["epsilon_one_run"] for part in parts]
    return {"epsilon": epsilon, "delta": delta, "order": order, "selections": parts,
            "runs": len(runs), "epsilon_one_run": max(alone, default=0.0),
            "accountant": "rdp"}  # fmt: skip
