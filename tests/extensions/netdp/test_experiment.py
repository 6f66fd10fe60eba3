"""The netdp-logreg experiment: config validation, calibration soundness, run folder."""

import csv
import json
import math
import tomllib

import numpy as np
import pytest

from dpdl.accounting import gdp
from dpdl.errors import DPDLError
from dpdl.experiments.registry import experiment_module, preset_path
from dpdl.extensions.netdp import accounting as nd
from dpdl.extensions.netdp import experiment as ex


def small_config(**privacy):
    return {
        "kind": "netdp-logreg",
        "experiment": {"name": "t", "seeds": [0], "entropy": "seed"},  # fixed draws
        "algorithm": {"steps": 300, "eval_every": 100,
                      "lr": {"local": 0.001, "network": 0.001, "central": 0.001}},
        "privacy": {"epsilons": [10.0], "delta": 1e-6, "include_non_private": True, **privacy},
    }


def test_preset_is_valid_and_registered():
    with open(preset_path("netdp-logreg"), "rb") as fh:
        cfg = ex.parse_config(tomllib.load(fh))
    assert cfg.privacy.epsilons == [1.0, 10.0] and cfg.privacy.delta == 1e-6
    assert cfg.data.records_per_user == 8 and cfg.data.dataset == "breast-cancer"
    assert experiment_module("netdp-logreg") is ex


def test_users_hold_eight_unit_norm_records():
    data = ex.load_users(ex.parse_config(small_config()))
    assert data["x"].shape[1] == 8 and data["n"] == 455 // 8
    assert np.linalg.norm(data["x"], axis=-1).max() <= 1 + 1e-9
    assert set(np.unique(data["y"])) == {-1.0, 1.0}


def test_calibrations_reach_the_target(tmp_path):
    n, T, cap, eps, delta = 56, 300, 9, 2.0, 1e-6
    from dpdl.extensions.netdp.algorithm import sample_random_walk

    walk = sample_random_walk(n, T, seed=0)
    mask = nd.contribution_mask(walk, n, cap)
    kw = dict(n=n, steps=T, cap=cap, walk=walk, mask=mask, epsilon=eps, delta=delta, clip=1.0)
    local = ex.calibrate("local", **kw)
    network = ex.calibrate("network", **kw)
    # local: cap releases of sensitivity 2L = 2 -> mu = 2 sqrt(cap) / sigma
    assert gdp.epsilon_from_delta(delta, 2 * math.sqrt(cap) / local["sigma"]) == pytest.approx(
        eps, rel=1e-6)
    rep = nd.pairwise_privacy(walk, n, noise_multiplier=network["noise_multiplier"],
                              delta=delta, mechanism="sgd", contributes=mask)
    assert rep.worst == pytest.approx(eps, rel=1e-3)


def test_central_calibration_is_sound_against_dp_accounting_defaults():
    import dp_accounting as dpa
    from dp_accounting.rdp import RdpAccountant

    n, T, eps, delta = 56, 300, 2.0, 1e-6
    z = ex.central_noise_multiplier(n, T, eps, delta)
    acc = RdpAccountant(neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    acc.compose(dpa.SampledWithoutReplacementDpEvent(n, 1, dpa.GaussianDpEvent(z)), T)
    assert 0.97 * eps <= acc.get_epsilon(delta) <= eps
    # subsampling amplification: far less noise than a user seen at every one of its visits
    assert z < nd.local_noise_multiplier_for_target(math.ceil(T / n), eps, delta)


def test_run_writes_the_run_folder(tmp_path):
    out = experiment_module("netdp-logreg").run_experiment(small_config(), tmp_path,
                                                           progress=False)
    run_dir = tmp_path / out["run_dir"].split("/")[-1]
    for name in out["files"]:
        assert (run_dir / name).is_file(), name
    saved = json.loads((run_dir / "results.json").read_text())
    cells = {(c["approach"], c["epsilon"]): c for c in saved["cells"]}
    assert set(cells) == {("local", 10.0), ("network", 10.0), ("central", 10.0),
                          ("non-private", None)}
    for approach in ("local", "network"):
        assert cells[(approach, 10.0)]["max_contributions"] <= saved["cap"]
    with open(run_dir / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["step"] for r in rows} == {"0", "100", "200", "300"}
    assert all(0 <= float(r["test_accuracy"]) <= 1 for r in rows)
    assert cells[("non-private", None)]["test_accuracy"] > 0.85


def test_secret_walks_leave_no_walk_dependent_number_in_the_run_folder(tmp_path, monkeypatch):
    # The network sigma is calibrated on the sampled walk: with OS entropy it must not land in
    # any file (nor the contribution counts read off the walk); local sigma depends on the cap
    # only, so it is still recorded.
    calibrated = []
    real = ex.calibrate

    def recording(approach, **kw):
        calibrated.append((approach, real(approach, **kw)))
        return calibrated[-1][1]

    monkeypatch.setattr(ex, "calibrate", recording)
    config = small_config()
    config["experiment"]["entropy"] = "os"
    out = ex.run_experiment(config, tmp_path, progress=False)
    cells = {c["approach"]: c for c in out["cells"]}
    assert cells["network"]["sigma"] is None and cells["network"]["noise_multiplier"] is None
    assert cells["local"]["sigma"] == dict(calibrated)["local"]["sigma"]
    assert all(c["max_contributions"] is None for c in out["cells"])
    network = dict(calibrated)["network"]
    needles = {repr(network["sigma"]), repr(network["noise_multiplier"])}
    for path in (tmp_path / out["run_dir"].split("/")[-1]).rglob("*"):
        if path.suffix in (".json", ".csv"):
            text = path.read_text()
            assert not any(n in text for n in needles), path.name


@pytest.mark.parametrize(
    "patch, fragment",
    [
        ({"bogus": 1}, "bogus: unknown key"),
        ({"privacy": {"epsilons": [0.0]}}, "privacy.epsilons"),
        ({"privacy": {"approaches": ["trusted"]}}, "privacy.approaches"),
        ({"algorithm": {"steps": 0}}, "algorithm.steps"),
        ({"algorithm": {"lr": {"network": 100.0}}}, "exceeds 2/beta"),
        ({"algorithm": {"clip": 0.5}}, "below the loss's Lipschitz constant"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, patch, fragment):
    cfg = small_config()
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(cfg.get(key), dict):
            for k, v in value.items():
                if isinstance(v, dict):
                    cfg[key].setdefault(k, {}).update(v)
                else:
                    cfg[key][k] = v
        else:
            cfg[key] = value
    with pytest.raises(DPDLError, match=fragment):
        ex.run_experiment(cfg, tmp_path, progress=False)


def test_run_flags_override_seed_and_steps_and_refuse_the_rest():
    cfg = ex.apply_overrides(small_config(), seed=4, steps=50)
    parsed = ex.parse_config(cfg)
    assert parsed.experiment.seeds == [4] and parsed.algorithm.steps == 50
    with pytest.raises(DPDLError, match="--device not supported"):
        ex.apply_overrides(small_config(), device="cuda")


def test_a_binary_task_from_a_multi_class_set_with_unit_rows_and_a_user_cap():
    """Issue 28's data at scale: a multi-class set made binary (positive_classes), rows scaled
    to unit norm, the users capped; the labels follow the classes record by record."""
    from dpdl.data import load_dataset

    cfg = small_config()
    cfg["data"] = {"dataset": "digits", "positive_classes": [0, 1, 2, 3, 4],
                   "normalize_rows": True, "max_users": 20}  # fmt: skip
    data = ex.load_users(ex.parse_config(cfg))
    assert data["n"] == 20 and data["x"].shape == (20, 8, 64)
    np.testing.assert_allclose(np.linalg.norm(data["x"], axis=-1), 1.0, atol=1e-9)
    digits = load_dataset("digits", seed=0)
    want = np.where(np.isin(digits.y_test, [0, 1, 2, 3, 4]), 1.0, -1.0)
    np.testing.assert_array_equal(data["y_test"], want)
    assert set(np.unique(data["y"])) == {-1.0, 1.0}


@pytest.mark.parametrize(
    ("classes", "message"),
    [([12], r"\[12\] not among the 10 classes"), (list(range(10)), "every class")],
)
def test_bad_positive_classes_are_a_clear_error(classes, message):
    cfg = small_config()
    cfg["data"] = {"dataset": "digits", "positive_classes": classes}
    with pytest.raises(DPDLError, match=message):
        ex.load_users(ex.parse_config(cfg))
