"""Issue 38, Major 3: the neighbouring relation must match what a run releases.

Two attacks of the adversarial review (``../shared/attacks/``), adapted to the API:

* ``adjacency_replace.py``: a run releases its node sizes J_i (``node_sizes``, the rate
  b / J_min, steps from ``epochs``), so two runs whose node 0 differs by one record are told
  apart with certainty under add/remove.  Now the default relation is replace-one, and the
  run's ε is dp_accounting's REPLACE_ONE PLD ε of its schedule; under add/remove nothing
  size-dependent leaves the run.
* ``nodeeval_membership.py``: ``node_eval_share`` drew the held-out records from J_i by slot,
  and row 0 scores them on the public x⁰, so adding a record to node 0 changed which other
  records were held out and row 0's ``node_local_loss`` told the worlds apart.  Now each record
  is held out by a keyed hash of itself: the other records' side never changes.

Both end-to-end tests fail on the code before the fix (its ε is add/remove; its hold-out
moves with J_0).
"""

from __future__ import annotations

import json

import dp_accounting as dpa
import numpy as np
import pytest
import torch
from dp_accounting import NeighboringRelation
from dp_accounting.pld import pld_privacy_accountant

import dpdl
from dpdl.data import load_dataset
from dpdl.models import make_model

pytestmark = pytest.mark.usefixtures("one_thread")


def worlds():
    """(D' without the target, D with it appended to node 0): two nodes of 20 records."""
    g = torch.Generator().manual_seed(1)
    data = [(torch.rand(20, 8, generator=g), torch.randint(0, 3, (20,), generator=g))
            for _ in range(2)]  # fmt: skip
    target = (torch.rand(1, 8, generator=g), torch.randint(0, 3, (1,), generator=g))
    with_target = [(torch.cat([data[0][0], target[0]]), torch.cat([data[0][1], target[1]])),
                   data[1]]  # fmt: skip
    return data, with_target


def replace_one_epsilon(z: float, q: float, steps: int, delta: float) -> float:
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), steps)
    return accountant.get_epsilon(delta)


def train(data, **options):
    torch.manual_seed(0)
    settings = dict(topology="ring", algorithm="const-d2p", epsilon=1.0, delta=1e-5, steps=2,
                    batch_size=2, lr=0.1, clip=1.0)  # fmt: skip
    return dpdl.train(torch.nn.Linear(8, 3), data, **(settings | options))


# ------------------------------------------------------------------ adjacency_replace.py
def test_default_run_states_the_replace_one_epsilon_of_what_it_releases():
    """The run releases J_0 (20 or 21): only replace-one keeps it fixed, and the ε it states
    is dp_accounting's REPLACE_ONE PLD ε of its own schedule (within the PLD grid)."""
    without, with_target = worlds()
    for data, sizes in ((without, [20, 20]), (with_target, [21, 20])):
        result = train(data)
        assert list(result.record.node_sizes) == sizes  # released: the worlds differ here
        z = float(result.schedule.noise_multipliers[0])
        assert np.all(result.schedule.noise_multipliers == z)
        reference = replace_one_epsilon(z, result.record.sample_rate, result.record.steps, 1e-5)
        assert result.epsilon == pytest.approx(reference, abs=1e-3)
        assert result.epsilon <= 1.0  # calibrated for replace-one: the target holds there
        assert result.record.neighboring == "replace-one"
        assert result.record.schedule["neighboring"] == "replace-one"


def _released(run_dir) -> dict:
    """Everything the run folder holds, less the noisy numbers and the wall-clock time."""
    results = json.loads((run_dir / "results.json").read_text())
    (cell,) = results["cells"]
    drop = {"final", "train_seconds"}
    return {
        "trainer.json": (run_dir / "trainer.json").read_text(),
        "cell": {k: v for k, v in cell.items() if k not in drop},
        "epsilons": {k: cell["final"][k] for k in ("epsilon_clt", "epsilon_certified")},
        "metrics header": (run_dir / "metrics.csv").read_text().splitlines()[0],
    }


def test_under_add_remove_no_output_depends_on_the_node_sizes(tmp_path):
    """Under add/remove q and K are hyper-parameters and nothing size-dependent is released:
    the two worlds' run folders agree in everything but the noisy numbers."""
    without, with_target = worlds()
    released = []
    for name, data in (("without", without), ("with", with_target)):
        result = train(data, neighboring="add-remove", sample_rate=0.1, output_dir=tmp_path,
                       run_name=name, node_eval_share=0.25, eval_every=1)  # fmt: skip
        record = result.record
        assert record.neighboring == "add-remove"
        assert record.node_sizes is None and record.sample_rates is None
        assert record.epsilon_per_node is None and record.sample_rate == 0.1
        released.append(_released(tmp_path / name))
    assert released[0] == released[1]
    assert '"neighboring": "add-remove"' in released[0]["trainer.json"]
    assert released[0]["cell"]["node_sizes"] is None


@pytest.mark.parametrize(("setting", "words"), [
    ({"epochs": 1, "sample_rate": 0.1}, "training.epochs reads the steps off the node sizes"),
    ({"steps": 2}, "without training.sample_rate the rate is b / J_min"),
])  # fmt: skip
def test_add_remove_refuses_size_dependent_settings_before_anything_runs(tmp_path, setting,
                                                                        words):  # fmt: skip
    without, _ = worlds()
    options = dict(topology="ring", algorithm="const-d2p", epsilon=1.0, batch_size=2,
                   neighboring="add-remove", output_dir=tmp_path)  # fmt: skip
    with pytest.raises(dpdl.DPDLError) as excinfo:
        dpdl.DecentralizedTrainer(torch.nn.Linear(8, 3), without, **(options | setting))
    assert words in str(excinfo.value) and "\n" not in str(excinfo.value)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ nodeeval_membership.py
SHARE, SEED = 0.2, 0


def _digits():
    data = load_dataset("digits", seed=0)
    x = torch.tensor(data.x_train[:60], dtype=torch.float32)
    y = torch.tensor(data.y_train[:60], dtype=torch.int64)
    return x, y


def _model():
    torch.manual_seed(0)
    return make_model("logreg", (1, 8, 8), 10)


def _trained_target(x, y) -> int:
    """A record of x[20:30] that the hold-out trains on when it joins node 0 (the attack's
    target is a training record: one the run's ε claims to cover)."""
    held_out_mask = getattr(dpdl.data, "held_out_mask", None)
    if held_out_mask is None:  # the code before the fix: the script's own target (slot 20)
        return 20
    for candidate in range(20, 30):
        if not held_out_mask(x[candidate : candidate + 1], y[candidate : candidate + 1], SHARE,
                             SEED, 0)[0]:  # fmt: skip
            return candidate
    raise AssertionError("no candidate target is trained on")  # pragma: no cover


def _row0_loss(node0, node1, eval_data) -> float:
    result = dpdl.train(_model(), [node0, node1], topology="ring", algorithm="const-d2p",
                        epsilon=1.0, delta=1e-5, steps=2, batch_size=2, lr=0.1, clip=1.0,
                        eval_every=1, node_eval_share=SHARE, seed=SEED,
                        eval_data=eval_data)  # fmt: skip
    row0 = result.history[0]
    assert row0["iteration"] == 0 and result.record.private
    return row0["node_local_loss"][0]


def test_adding_a_training_record_leaves_the_other_records_hold_out_as_it_was():
    """Row 0 scores node 0's held-out records on the public x⁰: a noise-free function of which
    records they are.  Adding the target (trained on) to node 0 must not change that set, so
    the released row-0 loss is the same in both worlds: the attacker's two predictions
    coincide and it guesses at chance."""
    x, y = _digits()
    others, node1, eval_data = (x[:20], y[:20]), (x[30:50], y[30:50]), (x[50:60], y[50:60])
    t = _trained_target(x, y)
    with_target = (torch.cat([others[0], x[t : t + 1]]), torch.cat([others[1], y[t : t + 1]]))
    released_without = _row0_loss(others, node1, eval_data)
    released_with = _row0_loss(with_target, node1, eval_data)
    assert released_with == released_without


def test_each_record_is_held_out_by_a_keyed_hash_of_itself_alone():
    from dpdl.data import held_out_mask

    x, y = _digits()
    base = held_out_mask(x[:40], y[:40], SHARE, SEED, 0)
    assert 0 < base.sum() < 40  # about SHARE of them
    # adding, removing or reordering records never moves another record's side
    assert np.array_equal(held_out_mask(x[:41], y[:41], SHARE, SEED, 0)[:40], base)
    assert np.array_equal(held_out_mask(x[1:40], y[1:40], SHARE, SEED, 0), base[1:])
    order = np.random.default_rng(0).permutation(40)
    assert np.array_equal(held_out_mask(x[order], y[order], SHARE, SEED, 0), base[order])
    # the key: another seed or node decides afresh
    assert not np.array_equal(held_out_mask(x[:40], y[:40], SHARE, SEED + 1, 0), base)
    assert not np.array_equal(held_out_mask(x[:40], y[:40], SHARE, SEED, 1), base)


# ------------------------------------------------------------------ dpdl run configs
def _config(**privacy_and_training):
    training = {"steps": 2, "batch_size": 2, "lr": 0.3, "eval_every": 2}
    training |= privacy_and_training.pop("training", {})
    return {
        "kind": "decentralized",
        "experiment": {"name": "rel", "algorithms": ["const-d2p"], "entropy": "seed"},
        "data": {"dataset": "digits"}, "model": {"name": "logreg"},
        "topology": {"name": "ring", "nodes": 4}, "training": training,
        "privacy": {"epsilon": 2.0, "delta": 1e-4} | privacy_and_training,
    }  # fmt: skip


def test_a_config_under_add_remove_is_refused_before_a_folder_exists(tmp_path):
    from dpdl.experiments import runner

    config = _config(neighboring="add-remove", training={"steps": None, "epochs": 1,
                                                         "sample_rate": 0.05})  # fmt: skip
    with pytest.raises(dpdl.DPDLError) as excinfo:
        runner.run_experiment(config, tmp_path, progress=False)
    assert "training.epochs reads the steps off the node sizes" in str(excinfo.value)
    assert "\n" not in str(excinfo.value) and list(tmp_path.iterdir()) == []


def test_a_config_run_under_add_remove_releases_no_size(tmp_path):
    from dpdl.experiments import runner

    config = _config(neighboring="add-remove", training={"sample_rate": 0.05,
                                                         "node_eval_share": 0.1})  # fmt: skip
    (cell,) = runner.run_experiment(config, tmp_path, progress=False, run_name="r")["cells"]
    assert cell["neighboring"] == "add-remove" and cell["schedule"]["neighboring"] == "add-remove"
    assert cell["node_sizes"] is None and cell["heterogeneity"] is None
    assert cell["sample_rates"] is None and cell["sample_rate"] == 0.05
    assert not (tmp_path / "r" / "label_distribution.png").exists()
    # the default relation releases them, and says so
    (cell,) = runner.run_experiment(_config(), tmp_path, progress=False, run_name="d")["cells"]
    assert cell["neighboring"] == cell["final"]["neighboring"] == "replace-one"
    assert len(cell["node_sizes"]) == 4
    assert cell["heterogeneity"]["node_sizes"] == cell["node_sizes"]
