"""Fair tuning (issue 23): equal budgets, picks on validation data by the stated rule, test
seeds at the picks, resumable, and the step-size-decay baseline."""

from __future__ import annotations

import copy
import csv
import json
import math
import shutil

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from dpdl.accounting.selection import SELECTION_ORDERS
from dpdl.errors import DPDLError
from dpdl.experiments.sweep import finished_cells
from dpdl.experiments.tune import candidate_points, pick, run_tuning, split_tune, write_report
from dpdl.training.provenance import provenance

BASE = {
    "kind": "decentralized",
    "experiment": {"name": "tune", "seed": 0, "entropy": "seed"},
    "data": {"dataset": "digits", "max_train_records": 300, "validation_records": 60},
    "model": {"name": "logreg"},
    "topology": {"name": "exp", "nodes": 4},
    # add/remove with a given rate: the relation dp_accounting's Poisson RDP is stated for,
    # so its composition is the reference of the tuning's epsilon below
    "training": {"steps": 6, "batch_size": 4, "lr": 0.3, "eval_every": 100,
                 "sample_rate": 0.06},
    "privacy": {"epsilon": [2.0, 4.0], "calibrate": "clt", "certified_accountant": "rdp",
                "neighboring": "add-remove"},
}
TUNE = {
    "selection_seeds": [0, 1],
    "test_seeds": [5, 6],
    "workers": 1,
    "candidates": {
        "const": {"algorithm": "const-d2p", "grid": {"privacy.clip": [0.2, 1.0]}},
        "const-lr-decay": {"algorithm": "const-d2p", "grid": {"training.lr_decay": [1.0, 4.0]}},
    },
    "baselines": {"const-untuned": {"algorithm": "const-d2p", "set": {"privacy.clip": 1.0}}},
}


def config(**tune):
    return {**copy.deepcopy(BASE), "tune": copy.deepcopy(TUNE) | tune}


def test_unequal_budgets_and_bad_tables_are_refused():
    bad = config()
    bad["tune"]["candidates"]["const"]["grid"]["privacy.clip"] = [0.2, 0.5, 1.0]
    with pytest.raises(DPDLError, match="same tuning budget: grid sizes const 3"):
        split_tune(bad)
    with pytest.raises(DPDLError, match="test_seeds must be fresh"):
        split_tune(config(test_seeds=[1, 7]))
    no_val = config()
    del no_val["data"]["validation_records"]
    with pytest.raises(DPDLError, match="validation_records"):
        split_tune(no_val)
    with pytest.raises(DPDLError, match="tune.metric must be one of .*'node_accuracy_worst'"):
        split_tune(config(metric="node_accuracy_worst"))  # test records: never selected on
    assert split_tune(config(metric="val_node_accuracy_worst"))[1]["metric"] == (
        "val_node_accuracy_worst")
    seeded = config()
    seeded["tune"]["candidates"]["const"]["grid"]["experiment.seed"] = [3]
    with pytest.raises(DPDLError, match="set by the tuner"):
        split_tune(seeded)


def test_grid_points_are_the_product_times_the_zip():
    cand = {"grid": {"a.x": [1, 2], "a.y": [3]}, "zip": {"b.p": [4, 5], "b.q": [6, 7]}}
    points = candidate_points(cand)
    assert points == [(("a.x", 1), ("a.y", 3), ("b.p", 4), ("b.q", 6)),
                      (("a.x", 1), ("a.y", 3), ("b.p", 5), ("b.q", 7)),
                      (("a.x", 2), ("a.y", 3), ("b.p", 4), ("b.q", 6)),
                      (("a.x", 2), ("a.y", 3), ("b.p", 5), ("b.q", 7))]  # fmt: skip


def test_the_pick_is_the_best_complete_mean_ties_to_the_first():
    points = [(("k", 1),), (("k", 2),), (("k", 3),), (("k", 4),)]
    runs = [{"overrides": {"k": k}, "seed": s, "epsilon": 1.0, "value": v}
            for k, s, v in [(1, 0, 0.5), (1, 1, 0.7), (2, 0, 0.6), (2, 1, 0.6),
                            (3, 0, 0.9), (3, 1, math.nan), (4, 0, 0.9)]]  # fmt: skip
    table, best = pick(points, runs, [0, 1], 1.0, "val_accuracy")
    assert best == 0  # 0.6 == 0.6: the first; 3 failed a seed, 4 misses one
    assert [row["complete"] for row in table] == [True, True, False, False]
    _, lowest = pick(points, runs, [0, 1], 1.0, "val_loss")
    assert lowest == 0
    two = [{"overrides": {"k": k}, "seed": s, "epsilon": 1.0, "value": v}
           for k, s, v in [(1, 0, 0.5), (1, 1, 0.6), (2, 0, 0.7), (2, 1, 0.8)]]  # fmt: skip
    # a node's accuracy: larger is better (as val_accuracy), a loss: smaller
    assert pick(points[:2], two, [0, 1], 1.0, "val_node_accuracy_worst")[1] == 1
    assert pick(points[:2], two, [0, 1], 1.0, "val_loss")[1] == 0


def test_tuning_runs_selection_picks_and_tests_and_resumes(tmp_path):
    summary = run_tuning(config(), tmp_path, progress=False)
    assert summary["failed"] == {}
    for name in ("const", "const-lr-decay"):
        entry = summary["candidates"][name]
        assert entry["points"] == 2
        for eps in ("2", "4"):
            by = entry["by_epsilon"][eps]
            means = [row["mean"] for row in by["table"]]
            assert all(np.isfinite(means))
            # the pick is the best mean of the selection seeds' own validation accuracies
            assert by["pick"] == by["table"][int(np.argmax(means))]["point"]
            row = by["table"][int(np.argmax(means))]
            assert row["mean"] == pytest.approx(np.mean([v for v in row["values"].values()]))
    # the validation numbers are the selection cells' own final val_accuracy
    (cell_dir, record), *_ = list(finished_cells(tmp_path / "select" / "const"))
    run = record["results"]["cells"][0]
    point = {k: v for k, v in record["overrides"].items() if k != "experiment.seed"}
    by = summary["candidates"]["const"]["by_epsilon"][f"{run['epsilon_target']:g}"]
    row = next(r for r in by["table"] if r["point"] == point)
    assert row["values"][str(run["seed"])] == run["final"]["val_accuracy"]
    # test seeds at the picks, and the untuned baseline, for both epsilons
    tests = summary["tests"]
    assert {(t["name"], t["epsilon"], t["seed"]) for t in tests} == {
        (n, e, s) for n in ("const", "const-lr-decay", "const-untuned") for e in (2.0, 4.0)
        for s in (5, 6)}  # fmt: skip
    assert {t["kind"] for t in tests if t["name"] == "const-untuned"} == {"untuned"}
    # the pick's settings are what the test runs were given
    test_dir = tmp_path / "test" / "const-eps2"
    (_, rec), *_ = list(finished_cells(test_dir))
    saved = json.loads(next(test_dir.rglob("config.json")).read_text())
    assert saved["privacy"]["clip"] == summary["candidates"]["const"]["by_epsilon"]["2"]["pick"][
        "privacy.clip"]
    assert saved["privacy"]["epsilon"] == 2.0 and saved["experiment"]["seed"] in (5, 6)
    md = (tmp_path / "tune.md").read_text()
    assert "Grid (2 points)" in md and "const-untuned (untuned)" in md and "**yes**" in md
    # where it came from (issue 43): the block of this process, and its lines in tune.md
    assert json.loads((tmp_path / "tune.json").read_text())["provenance"] == provenance()
    assert "## Provenance" in md and "cpu_capability" not in md
    assert f"CPU capability {provenance()['cpu_capability']}" in md
    # the picks look at every selection run: the report states the composition of every run
    # the folder releases (here by dp_accounting alone, from each run's recorded schedule)
    privacy = summary["privacy"]
    assert privacy["runs"] == 2 * 2 * 2 * 2 + 3 * 2 * 2  # selection + test runs
    composed = rdp.RdpAccountant(list(SELECTION_ORDERS))
    for cell in tmp_path.glob("*/*/cells/*/cell.json"):
        for run in json.loads(cell.read_text())["results"]["cells"]:
            plan = run["schedule"]
            step = dp_event.PoissonSampledDpEvent(
                plan["sample_rate"], dp_event.GaussianDpEvent(plan["noise_multiplier_first"]))
            composed.compose(step, plan["steps"])
    assert privacy["epsilon"] == pytest.approx(composed.get_epsilon(1e-4), rel=1e-9)
    assert "Selection: public (the default)" in md and f"ε = {privacy['epsilon']:.3f}" in md
    with (tmp_path / "selection.csv").open() as fh:
        assert len(list(csv.DictReader(fh))) == 2 * 2 * 2  # candidates x eps x points
    # a rerun finds every cell finished and gives the same picks
    again = run_tuning(config(), tmp_path, progress=False)
    assert again["candidates"] == summary["candidates"]
    # the report of what is on disk (dpdl tune --report) is the run's own summary ...
    report = write_report(config(), tmp_path)
    assert report["candidates"] == summary["candidates"] and report["tests"] == summary["tests"]
    # ... and, of a tuning cut short, says what is missing and picks nothing it cannot
    shutil.rmtree(tmp_path / "test")
    shutil.rmtree(tmp_path / "select" / "const-lr-decay")
    partial = write_report(config(), tmp_path)
    assert partial["candidates"]["const"] == summary["candidates"]["const"]
    for by in partial["candidates"]["const-lr-decay"]["by_epsilon"].values():
        assert by["pick"] is None and not any(row["complete"] for row in by["table"])
    assert partial["tests"] == []
    assert "| nan |" in (tmp_path / "tune.md").read_text()
    with pytest.raises(DPDLError, match="holds no tuning"):
        write_report(config(), tmp_path / "nowhere")


def test_lr_decay_is_the_clip_shaped_step_size():
    import torch

    import dpdl

    rng = np.random.default_rng(0)
    nodes = [(rng.normal(size=(8, 4)).astype(np.float32), rng.integers(0, 3, size=8))
             for _ in range(3)]  # fmt: skip
    torch.manual_seed(0)
    trainer = dpdl.DecentralizedTrainer(torch.nn.Linear(4, 3), nodes, algorithm="const-d2p",
                                        epsilon=1.0, steps=10, batch_size=2, lr=0.3,
                                        lr_decay=4.0)  # fmt: skip
    k = np.arange(10)
    np.testing.assert_allclose(trainer.step_sizes(), 0.3 * 4.0 ** (-k / 10))
    dyn_c = dpdl.DecentralizedTrainer(torch.nn.Linear(4, 3), nodes, algorithm="dyn-c-d2p",
                                      epsilon=1.0, steps=10, batch_size=2, lr=0.3, clip0=1.0,
                                      rho_c=4.0)  # fmt: skip
    # the same effective step gamma_k C_k as Dyn[C]-D2P, with Const's noise multiplier
    np.testing.assert_allclose(trainer.step_sizes() * trainer.schedule.clip,
                               dyn_c.step_sizes() * dyn_c.schedule.clip, rtol=1e-12)
    z = trainer.schedule.noise_multipliers
    assert np.allclose(z, z[0])
    with pytest.raises(DPDLError, match="lr_decay"):
        dpdl.DecentralizedTrainer(torch.nn.Linear(4, 3), nodes, epsilon=1.0, steps=10,
                                  batch_size=2, lr_decay=0.5)  # fmt: skip


def test_the_tune_table2_preset_gives_every_algorithm_twelve_points():
    from dpdl.experiments.config import parse_config
    from dpdl.experiments.registry import load_config_file
    from dpdl.experiments.sweep import cell_config, expand_grid, split_sweep
    from dpdl.experiments.tune import _selection_sweep, _test_sweep

    base, tune = split_tune(load_config_file(preset="tune-table2"))
    assert set(tune["candidates"]) == {"const", "const-lr-decay", "dyn-c", "dyn-mu", "dyn"}
    assert {len(candidate_points(c)) for c in tune["candidates"].values()} == {12}
    assert base["data"]["validation_records"] == 5000 and base["privacy"]["epsilon"] == [0.3, 1]
    for cand in tune["candidates"].values():
        b, sweep = split_sweep(_selection_sweep(base, tune, cand))
        cells = expand_grid(sweep)
        assert len(cells) == 12 * 3
        for cell in cells:
            cfg = parse_config(cell_config(b, cell))
            assert cfg.experiment.algorithms == [cand["algorithm"]]
    for _name, line in tune["baselines"].items():
        b, sweep = split_sweep(_test_sweep(base, tune, line["algorithm"], line["set"], 0.3))
        assert len(expand_grid(sweep)) == 5
        parse_config(cell_config(b, expand_grid(sweep)[0]))


def test_baselines_test_first_then_each_candidate_tests_as_soon_as_it_is_selected(
        tmp_path, monkeypatch):
    import dpdl.experiments.tune as tune_module

    folders, real_run_sweep = [], tune_module.run_sweep

    def recording_run_sweep(config, folder, **kwargs):
        folders.append(folder.relative_to(tmp_path).as_posix())
        return real_run_sweep(config, folder, **kwargs)

    monkeypatch.setattr(tune_module, "run_sweep", recording_run_sweep)
    cheap = config(selection_seeds=[0], test_seeds=[5])
    cheap["privacy"]["epsilon"] = 2.0
    summary = run_tuning(cheap, tmp_path, progress=False)
    assert folders == ["test/const-untuned-eps2", "select/const", "test/const-eps2",
                       "select/const-lr-decay", "test/const-lr-decay-eps2"]
    # every test cell is the run's own: the summary finds each, at the pick it was given
    assert {(t["name"], t["seed"]) for t in summary["tests"]} == {
        ("const-untuned", 5), ("const", 5), ("const-lr-decay", 5)}
