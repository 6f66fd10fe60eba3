"""The fdp-random-walk experiment kind and its presets."""

import csv
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

from dpdl.errors import DPDLError
from dpdl.experiments.registry import experiment_module, preset_path
from dpdl.extensions.fdp import experiment
from dpdl.extensions.fdp.accounting import (
    BoundSettings,
    pnfdp_epsilon_matrix,
    rdp_baseline_epsilon,
)
from dpdl.extensions.fdp.decor import RunOptions


def tiny_config(**privacy):
    return {
        "kind": "fdp-random-walk",
        "experiment": {"name": "tiny", "seeds": [0]},
        "data": {"dataset": "breast-cancer", "nodes": 8},
        "graph": {"topology": "hypercube"},
        "privacy": {"epsilons": [4.0], "steps": 80, "relative_slack": 2e-3, **privacy},
        "train": {"lr": 0.05, "batch_size": 8, "eval_every": 40, "include_non_private": True},
        "decor": {"enabled": True, "steps": 20, "sigma_cor": 5.0, "lr": 0.01},
    }


def test_tiny_run_writes_its_folder_and_meets_the_target(tmp_path):
    results = experiment.run_experiment(tiny_config(), tmp_path, progress=False)
    run_dir = Path(results["run_dir"])
    for name in results["files"]:
        assert (run_dir / name).stat().st_size > 0
    rows = {(r["algorithm"], r["accountant"]): r for r in results["table"]}
    sigma_f = rows[("random-walk", "pn-fdp")]["sigma"]
    sigma_rdp = rows[("random-walk", "rdp-baseline")]["sigma"]
    assert sigma_f < sigma_rdp
    assert rows[("decor", "fdp")]["sigma"] < rows[("decor", "rdp-simple")]["sigma"]
    assert ("random-walk", "non-private") in rows
    # the calibrated σ meets ε = 4 for every pair, certified, and the RDP σ for the baseline
    from dpdl.topology import make_topology

    walk = make_topology("hypercube", 8).mixing_matrix(0).T
    sensitivity = 2 * 2.0 / 8  # the default clip C = 2, b = 8
    eps = pnfdp_epsilon_matrix(walk, steps=80, sigma=sigma_f, delta=1e-5, bound=BoundSettings(
        sensitivity=sensitivity, relative_slack=2e-3)).epsilon
    assert np.nanmax(eps) <= 4.0 and np.nanmax(eps) > 3.99
    base = rdp_baseline_epsilon(walk, steps=80, sigma=sigma_rdp, delta=1e-5,
                                sensitivity=sensitivity).epsilon
    assert np.nanmax(base) <= 4.0 + 1e-9
    with (run_dir / "metrics.csv").open() as fh:
        metrics = list(csv.DictReader(fh))
    assert {m["algorithm"] for m in metrics} == {"random-walk", "decor"}
    assert json.loads((run_dir / "results.json").read_text())["compositions"] == 10


def test_decor_at_local_dp_has_no_secrets_and_the_closed_form_gaussian_noise(tmp_path):
    import math

    from dpdl.accounting.gdp import mu_from_epsilon_delta

    cfg = tiny_config()
    cfg["privacy"]["accountants"] = ["local"]
    cfg["decor"]["accountants"] = ["fdp", "local"]
    results = experiment.run_experiment(cfg, tmp_path, progress=False)
    rows = {(r["algorithm"], r["accountant"]): r for r in results["table"]}
    # every share alone, T = 20 releases of sensitivity 2C = 4 (the default C = 2):
    # mu = 4 sqrt(T) / sigma
    closed_form = 4 * math.sqrt(20) / mu_from_epsilon_delta(4.0, 1e-5)
    assert rows[("decor", "local")]["sigma"] == pytest.approx(closed_form, rel=1e-6)
    assert rows[("decor", "local")]["sigma"] >= closed_form * (1 - 1e-9)  # the safe side
    # the secrets buy DECOR less independent noise than local DP needs
    assert rows[("decor", "fdp")]["sigma"] < rows[("decor", "local")]["sigma"]
    with pytest.raises(DPDLError, match="decor.accountants"):
        experiment.parse_config({**cfg, "decor": {**cfg["decor"], "accountants": ["rdp"]}})


def test_an_interrupted_run_resumes_to_the_same_outputs(tmp_path, monkeypatch):
    cfg = tiny_config()
    cfg["experiment"] |= {"seeds": [0, 1], "entropy": "seed"}
    whole = experiment.run_experiment(cfg, tmp_path / "whole", progress=False)
    original, calls = experiment.random_walk_dp_sgd, {"n": 0}

    def dies_after_three(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(experiment, "random_walk_dp_sgd", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        experiment.run_experiment(cfg, tmp_path / "cut", progress=False)
    run_dir = next((tmp_path / "cut").iterdir())
    trained = []
    monkeypatch.setattr(experiment, "random_walk_dp_sgd",
                        lambda *a, **k: (trained.append(1), original(*a, **k))[1])
    resumed = experiment.resume_experiment(run_dir, progress=False)
    assert len(trained) == 4 * 2 - 3  # 3 accountants and non-private, 2 seeds, 3 were logged
    assert resumed["table"] == whole["table"]
    assert (run_dir / "metrics.csv").read_text() == (
        Path(whole["run_dir"]) / "metrics.csv").read_text()


def test_contribution_cap_and_walk_law():
    W = np.array([[0.2, 0.8, 0.0], [0.3, 0.3, 0.4], [0.0, 0.5, 0.5]])
    path = experiment.sample_walk(W, 60000, np.random.default_rng(0))
    counts = np.zeros((3, 3))
    np.add.at(counts, (path[:-1], path[1:]), 1)
    np.testing.assert_allclose(counts / counts.sum(axis=1, keepdims=True), W, atol=0.015)
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(3, 10, 2)), rng.integers(0, 2, size=(3, 10))
    out = experiment.random_walk_dp_sgd(W, x, y, num_classes=2, steps=90, lr=0.1, clip=1.0,
                                        sigma=1.0,
                                        visits=experiment.VisitSettings(batch_size=2, cap=5),
                                        options=RunOptions(seed=0))
    assert out["contributions"].max() <= 5


def test_config_errors_name_the_key(tmp_path):
    bad = tiny_config()
    bad["privacy"]["epsilon"] = 3
    with pytest.raises(DPDLError, match="privacy.epsilon: unknown key"):
        experiment.run_experiment(bad, tmp_path, progress=False)
    bad = tiny_config(accountants=["pn-fdp", "moments"])
    with pytest.raises(DPDLError, match="privacy.accountants"):
        experiment.parse_config(bad)
    with pytest.raises(DPDLError, match="--device"):
        experiment.apply_overrides(tiny_config(), device="cuda")
    over = experiment.apply_overrides(tiny_config(), seed=5, steps=160)
    assert over["experiment"]["seeds"] == [5] and over["privacy"]["steps"] == 160


def test_the_table_hop_form_reaches_the_calibration():
    # The table form's mu_t = sqrt(K) D / (sigma sqrt(t)) exceeds the lemma's, so it needs
    # more noise for the same epsilon; the run's sigma is the accountant's, called directly.
    from dpdl.extensions.fdp.accounting import calibrate_sigma_pnfdp
    from dpdl.topology import make_topology

    cfg = experiment.parse_config(tiny_config(hop_form="table", accountants=["pn-fdp"]))
    walk = make_topology("hypercube", 8).mixing_matrix(0).T
    sigmas = {
        form: experiment.calibrate_noise(
            "pn-fdp", walk, epsilon=4.0, sensitivity=0.25,
            cfg=cfg.privacy.model_copy(update={"hop_form": form}),
        )
        for form in ("lemma", "table")
    }  # fmt: skip
    assert sigmas["table"] > sigmas["lemma"]
    direct = calibrate_sigma_pnfdp(walk, steps=80, target_epsilon=4.0, delta=1e-5,
                                   bound=BoundSettings(sensitivity=0.25, relative_slack=2e-3,
                                                       hop_form="table"))
    assert sigmas["table"] == pytest.approx(direct, rel=1e-12)
    with pytest.raises(DPDLError, match="contraction = 0.5 needs hop_form = 'lemma'"):
        experiment.parse_config(tiny_config(hop_form="table", contraction=0.5))
    with pytest.raises(DPDLError, match="privacy.hop_form"):
        experiment.parse_config(tiny_config(hop_form="paper"))


@pytest.mark.parametrize("name", ["fdp-rw-logreg", "fdp-rw-digits", "fdp-rw-fashion-256",
                                  "fdp-rw-fashion-2048", "fdp-rw-fashion-mlp-256",
                                  "fdp-decor-figure3"])
def test_presets_validate_and_are_registered(name):
    config = tomllib.loads(preset_path(name).read_text())
    assert config["kind"] == "fdp-random-walk"
    assert experiment_module(config["kind"]) is experiment
    cfg = experiment.parse_config(config)
    assert cfg.privacy.steps // cfg.data.nodes >= 1


@pytest.mark.parametrize("change, named", [
    ({"privacy": {"clip": 1.0}}, "privacy.clip = 1"),
    ({"train": {"lr": 3.0}}, "train.lr = 3"),
    ({"data": {"normalize_rows": False}}, "normalize_rows"),
    ({"privacy": {"contraction": 0.5}}, "privacy.contraction = 0.5"),
    ({"train": {"model": "mlp"}, "decor": {"enabled": False}}, "not convex"),
])
def test_hidden_state_accountants_are_refused_where_the_hop_map_is_unproven(change, named):
    config = tiny_config()
    for section, values in change.items():
        config[section].update(values)
    with pytest.raises(DPDLError, match=named):
        experiment.parse_config(config)
    config["privacy"]["accountants"] = ["local"]  # local DP holds for any model
    assert experiment.parse_config(config).privacy.accountants == ["local"]


def test_the_default_config_is_certified_and_normalises_rows():
    cfg = experiment.parse_config({"kind": "fdp-random-walk"})
    assert experiment.hop_map_gap(cfg) is None
    assert all(experiment.certified(cfg, a) for a in experiment.ACCOUNTANTS)
    nodes = experiment._load_nodes(cfg)
    norms = np.linalg.norm(nodes["x"][nodes["mask"]].reshape(nodes["mask"].sum(), -1), axis=1)
    assert norms.max() <= 1 + 1e-12 and norms.min() > 1 - 1e-6  # R = 1 up to rounding
    assert np.linalg.norm(nodes["eval"][0], axis=1).max() <= 1 + 1e-12


def test_an_assumed_hop_map_runs_labelled_uncertified(tmp_path, capsys):
    config = tiny_config(assume_nonexpansive=True)
    config["train"].update({"model": "mlp", "hidden": 4, "lr": 0.5})
    config["decor"]["enabled"] = False
    results = experiment.run_experiment(config, tmp_path, progress=False)
    assert "no guarantee" in capsys.readouterr().err
    marks = {r["accountant"]: r["certified"] for r in results["table"]}
    assert marks == {"pn-fdp": False, "rdp-baseline": False, "local": True,
                     "non-private": None}  # no epsilon to certify
    assert any("visits only" in o for o in results["unaccounted_outputs"])
    assert "not convex" in results["hop_map"]["nonexpansive_gap"]
    # the network learned: non-private accuracy well above the majority class
    row = next(r for r in results["table"] if r["accountant"] == "non-private")
    assert row["accuracy_mean"] > 0.8


def test_the_assumption_label_changes_no_draw():
    from dpdl.training.settings import seeded_cell_name

    plain = experiment.parse_config(tiny_config())
    labelled = experiment.parse_config(tiny_config(assume_nonexpansive=True))
    names = [seeded_cell_name(c, "cell", experiment._GRID, (), experiment._LATER)
             for c in (plain, labelled)]
    assert names[0] == names[1]
    mlp = tiny_config()
    mlp["train"]["model"], mlp["privacy"]["accountants"] = "mlp", ["local"]
    mlp["decor"]["enabled"] = False
    assert seeded_cell_name(experiment.parse_config(mlp), "cell", experiment._GRID, (),
                            experiment._LATER) != names[0]
