"""The decentralized experiment runner and its config (``dpdl run``'s engine room)."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import tomllib

import pytest

from dpdl.accounting.gdp import mu_from_epsilon_delta
from dpdl.errors import DPDLError, PrivacyBudgetExceeded
from dpdl.experiments import runner
from dpdl.experiments.config import parse_config
from dpdl.experiments.registry import load_config_file, preset_names
from dpdl.training import trainer


def tiny_config(**training) -> dict:
    return {
        "kind": "decentralized",
        "experiment": {"name": "tiny", "algorithms": ["sgp", "const-d2p@clt", "dyn-d2p"]},
        "data": {"dataset": "digits", "max_train_records": 240},
        "model": {"name": "logreg"},
        "topology": {"name": "exp", "nodes": 6},
        "training": {"steps": 20, "batch_size": 8, "lr": 0.5, "eval_every": 10} | training,
        "privacy": {"epsilon": 2.0, "delta": 1e-4, "eval_blocks": 4, "calibration_blocks": 10},
    }


def read_rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    return runner.run_experiment(tiny_config(), out, progress=False, run_name="a"), out


def test_run_folder_contents(tiny_run):
    results, out = tiny_run
    run_dir = out / "a"
    assert results["run_dir"] == str(run_dir)
    for name in ("config.toml", "config.json", "metrics.csv", "results.json", "curves.png"):
        assert (run_dir / name).is_file(), name
    assert (run_dir / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = read_rows(run_dir / "metrics.csv")
    assert tuple(rows[0]) == runner.METRIC_COLUMNS
    # evaluations at 0, 10, 20 for each of the three algorithms
    assert [(r["algorithm"], int(r["iteration"])) for r in rows] == [
        (a, i) for a in ("sgp", "const-d2p@clt", "dyn-d2p") for i in (0, 10, 20)
    ]
    # the resolved config round-trips and equals the JSON copy
    resolved = json.loads((run_dir / "config.json").read_text())
    assert tomllib.loads((run_dir / "config.toml").read_text()) == _drop_none(resolved)
    assert parse_config(resolved).training.steps == 20
    on_disk = json.loads((run_dir / "results.json").read_text())
    assert [c["algorithm"] for c in on_disk["cells"]] == ["sgp", "const-d2p@clt", "dyn-d2p"]


def test_a_benchmark_run_records_node_sizes_and_label_histograms(tiny_run):
    """digits is a shipped public benchmark: its split's label histograms are released; they
    are numpy.bincount of the partition the run made (seed 0, 240 records kept)."""
    import numpy as np

    from dpdl.data import load_dataset, partition

    results, out = tiny_run
    data = load_dataset("digits", seed=0)
    keep = np.sort(np.random.default_rng(0).choice(len(data.x_train), 240, replace=False))
    y = data.y_train[keep]
    parts = partition(y, 6, seed=0)
    for cell in results["cells"]:
        het = cell["heterogeneity"]
        assert cell["node_sizes"] == het["node_sizes"] == [len(p) for p in parts]
        assert het["label_histograms"] == [np.bincount(y[p], minlength=10).tolist()
                                           for p in parts]  # fmt: skip
        assert not [k for k in cell["final"] if k.startswith("node_local")]
    assert (out / "a" / "label_distribution.png").is_file()


def _drop_none(d):
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    return d


def test_privacy_columns(tiny_run):
    results, out = tiny_run
    rows = read_rows(out / "a" / "metrics.csv")
    by_alg = {}
    for r in rows:
        by_alg.setdefault(r["algorithm"], []).append(r)
    assert all(math.isinf(float(r["epsilon_clt"])) for r in by_alg["sgp"])
    for alg in ("const-d2p@clt", "dyn-d2p"):
        clt = [float(r["epsilon_clt"]) for r in by_alg[alg]]
        cert = [float(r["epsilon_certified"]) for r in by_alg[alg]]
        assert clt[0] == cert[0] == 0.0
        assert clt == sorted(clt) and cert == sorted(cert)  # spent epsilon never falls
    cells = {c["algorithm"]: c for c in results["cells"]}
    # the CLT-calibrated cell spends exactly its target under the CLT (MATH.md §1.3, eq. 6)
    const = cells["const-d2p@clt"]
    assert const["final"]["epsilon_clt"] == pytest.approx(2.0, rel=1e-6)
    assert const["schedule"]["mu_tot"] == pytest.approx(mu_from_epsilon_delta(2.0, 1e-4))
    # the PLD-calibrated cell stays within its target under the certified accountant
    dyn = cells["dyn-d2p"]
    assert dyn["calibrated_with"] == "pld"
    assert dyn["final"]["epsilon_certified"] <= 2.0 * (1 + 1e-6)
    assert dyn["ledger_epsilon_spent"] <= 2.0 * (1 + 1e-6)
    for cell in results["cells"]:
        assert cell["status"] == "ok" and cell["steps_done"] == 20
        assert cell["sample_rate"] == pytest.approx(8 / 40)  # 240 records over 6 nodes
    # training helped: the non-private model is far above chance (10 classes)
    assert cells["sgp"]["final"]["test_accuracy"] > 0.5


def test_same_seed_same_metrics_and_seed_matters(tmp_path):
    cfg = tiny_config(steps=10, eval_every=5)
    cfg["experiment"] |= {"algorithms": ["dyn-d2p@clt"], "entropy": "seed"}
    runner.run_experiment(cfg, tmp_path, progress=False, run_name="one")
    runner.run_experiment(cfg, tmp_path, progress=False, run_name="two")
    cfg["experiment"]["seed"] = 1
    runner.run_experiment(cfg, tmp_path, progress=False, run_name="three")
    one, two, three = (read_rows(tmp_path / n / "metrics.csv") for n in ("one", "two", "three"))
    assert one == two
    assert [r["test_loss"] for r in one] != [r["test_loss"] for r in three]


def test_refuses_a_schedule_over_budget(tmp_path, monkeypatch):
    real = trainer.build_schedule

    def too_generous(privacy, spec, epsilon, steps, sample_rate, *progress):
        schedule = real(privacy, spec, 3 * epsilon, steps, sample_rate, *progress)
        return dataclasses.replace(schedule, epsilon_target=epsilon)  # claims the smaller eps

    monkeypatch.setattr(trainer, "build_schedule", too_generous)
    cfg = tiny_config()
    cfg["experiment"]["algorithms"] = ["const-d2p@clt"]
    with pytest.raises(PrivacyBudgetExceeded):
        runner.run_experiment(cfg, tmp_path, progress=False, run_name="r")
    assert not (tmp_path / "r").exists()  # nothing trained: the refused run leaves no folder


def test_divergence_stops_cleanly_naming_node_and_step(tmp_path):
    cfg = tiny_config(lr=1e38, steps=20)
    cfg["experiment"]["algorithms"] = ["sgp"]
    results = runner.run_experiment(cfg, tmp_path, progress=False, run_name="nan")
    (cell,) = results["cells"]
    assert cell["status"] == "diverged"
    assert "node" in cell["message"] and "step" in cell["message"]
    assert cell["steps_done"] < 20
    rows = read_rows(tmp_path / "nan" / "metrics.csv")
    assert rows and rows[0]["iteration"] == "0"
    assert json.loads((tmp_path / "nan" / "results.json").read_text())["cells"][0]["status"] == (
        "diverged"
    )


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"training": {"stepz": 3}}, "training.stepz"),
        ({"privacy": {"delta": 2.0}}, "privacy.delta"),
        ({"experiment": {"algorithms": ["dyn-dp"]}}, "experiment.algorithms"),
        ({"experiment": {"algorithms": ["sgp@clt"]}}, "experiment.algorithms"),
        ({"privacy": {"epsilon": [1.0, -1.0]}}, "privacy.epsilon"),
        ({"topology": {"nodes": 1}}, "topology.nodes"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_config_errors_name_the_key(patch, key):
    cfg = tiny_config()
    for section, value in patch.items():
        if isinstance(value, dict):
            cfg[section] = cfg.get(section, {}) | value
        else:
            cfg[section] = value
    with pytest.raises(DPDLError, match=key.replace(".", r"\.")):
        parse_config(cfg)


def test_steps_xor_epochs_and_overrides():
    cfg = tiny_config()
    cfg["training"]["epochs"] = 1.0
    with pytest.raises(DPDLError, match="exactly one of training.steps and training.epochs"):
        parse_config(cfg)
    del cfg["training"]["steps"]
    resolved = runner.apply_overrides(cfg, steps=7, seed=3, device="cpu")
    parsed = parse_config(resolved)
    got = (parsed.training.steps, parsed.training.epochs, parsed.experiment.seeds)
    assert got == (7, None, [3])
    assert cfg["training"]["epochs"] == 1.0  # the input is not modified


def test_presets_are_valid():
    assert {"default", "fashion-mnist"} <= set(preset_names())
    for name in ("default", "fashion-mnist"):
        cfg = parse_config(load_config_file(preset=name))
        assert cfg.topology.nodes == 20 and cfg.topology.name == "exp"
    fm = parse_config(load_config_file(preset="fashion-mnist"))
    assert (fm.model.name, fm.training.lr, fm.privacy.delta) == ("cnn", 0.03, 1e-4)
    assert fm.privacy.epsilons == [0.3, 1.0] and fm.training.batch_size == 1


def test_validation_records_are_held_out_of_training(tmp_path):
    cfg = tiny_config(steps=4, eval_every=2)
    cfg["experiment"]["algorithms"] = ["sgp"]
    cfg["data"]["validation_records"] = 40
    work = runner.prepare_workload(parse_config(cfg), seed=0)
    assert len(work.x_val) == 40 and 200 - 6 < sum(work.records_per_node) <= 200  # iid: equal parts
    train = {tuple(x.flatten().tolist()) for x in work.node_data.inputs[work.node_data.mask]}
    assert not any(tuple(x.flatten().tolist()) in train for x in work.x_val[:10])
    runner.run_experiment(cfg, tmp_path, progress=False, run_name="v")
    (row, *_) = read_rows(tmp_path / "v" / "metrics.csv")
    assert 0 <= float(row["val_accuracy"]) <= 1
    with pytest.raises(DPDLError, match="leaves no training records"):
        runner.prepare_workload(parse_config(cfg | {"data": cfg["data"] | {
            "validation_records": 240}}), seed=0)  # fmt: skip
