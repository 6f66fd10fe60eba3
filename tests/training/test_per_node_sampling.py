"""``training.sampling = "per-node"`` through the trainer (issue 27, item 4): each node's rate
and certified epsilon in the record and results.json, the worst node's equal to the run's
epsilon (and to a uniform run's), the epoch rule, one-line refusals, calibration progress."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch
from dp_accounting import NeighboringRelation, dp_event
from dp_accounting.pld import pld_privacy_accountant
from torch import nn

import dpdl
from dpdl.errors import DPDLError
from dpdl.experiments.config import parse_config

SIZES = [30, 60, 240, 60, 120, 30]  # unequal nodes, some of a size
B, DELTA = 4, 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def nodes():
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    bounds = np.concatenate([[0], np.cumsum(SIZES)])
    return [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)], (x, y)


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 8), nn.Tanh(), nn.Linear(8, 10))


def trainer(nodes, **options):
    data, (x, y) = nodes
    settings = dict(algorithm="const-d2p", epsilon=2.0, delta=DELTA, batch_size=B, lr=0.3,
                    steps=20, eval_every=20, eval_data=(x[-200:], y[-200:]), entropy="seed",
                    topology="exp")  # fmt: skip
    return dpdl.DecentralizedTrainer(mlp(), data, **(settings | options))


def library_pld_epsilon(z: float, steps: int, q: float) -> float:
    reference = pld_privacy_accountant.PLDAccountant(
        NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)  # the default
    step = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
    reference.compose(dp_event.SelfComposedDpEvent(step, steps))
    return reference.get_epsilon(DELTA)


@pytest.fixture(scope="module")
def runs(nodes, tmp_path_factory):
    out = tmp_path_factory.mktemp("per-node")
    per_node = trainer(nodes, sampling="per-node", output_dir=out, run_name="r").fit()
    uniform = trainer(nodes).fit()
    return per_node, uniform, json.loads((out / "r" / "results.json").read_text())


def test_each_node_gets_its_own_rate_and_epsilon_the_worst_is_the_runs(runs):
    per_node, uniform, _ = runs
    record = per_node.record
    assert record.sampling == "per-node" and per_node.status == "ok"
    assert record.sample_rates == [B / j for j in SIZES]
    assert record.sample_rate == B / min(SIZES) == per_node.schedule.sample_rate
    epsilons = record.epsilon_per_node
    assert len(epsilons) == len(SIZES)
    # the worst node (the smallest) has the epsilon the run reports, a uniform run's too
    assert max(epsilons) == epsilons[0] == epsilons[5] == per_node.epsilon == uniform.epsilon
    assert per_node.epsilon <= 2.0 * (1 + 1e-9)
    # every node's, recomputed by dp_accounting's PLD at its own rate with the same multiplier
    (z,) = np.unique(per_node.schedule.noise_multipliers)
    for j_i, epsilon in zip(SIZES, epsilons, strict=True):
        assert epsilon == pytest.approx(library_pld_epsilon(float(z), 20, B / j_i), rel=2e-3)
    assert epsilons[2] < epsilons[4] < epsilons[1] == epsilons[3] < epsilons[0]
    assert record.epsilon_per_node_method == "pld-exact"


def test_uniform_sampling_reports_one_epsilon_for_every_node(runs):
    _, uniform, _ = runs
    record = uniform.record
    assert record.sampling == "uniform"
    assert record.sample_rates == [B / min(SIZES)] * len(SIZES)
    assert record.epsilon_per_node == [uniform.epsilon] * len(SIZES)


def test_results_json_carries_the_sampling_rates_and_epsilons(runs):
    per_node, _, results = runs
    (cell,) = results["cells"]
    assert cell["sampling"] == "per-node"
    assert cell["sample_rates"] == per_node.record.sample_rates
    assert cell["epsilon_per_node"] == per_node.record.epsilon_per_node
    assert max(cell["epsilon_per_node"]) == cell["final"]["epsilon_certified"]


def test_an_epoch_is_the_mean_node_size_over_b_with_per_node_sampling(nodes):
    per_node = trainer(nodes, steps=None, epochs=2, sampling="per-node")
    uniform = trainer(nodes, steps=None, epochs=2)
    assert per_node.steps == math.ceil(2 * sum(SIZES) / (len(SIZES) * B)) == 45
    assert uniform.steps == math.ceil(2 * min(SIZES) / B) == 15


def test_an_unknown_sampling_is_one_line_naming_it(nodes):
    with pytest.raises(DPDLError, match="sampling.*'fixed-size'") as excinfo:
        trainer(nodes, sampling="fixed-size")
    assert "\n" not in str(excinfo.value)
    with pytest.raises(DPDLError, match="training.sampling.*'fixed-size'") as excinfo:
        parse_config({"training": {"steps": 5, "sampling": "fixed-size"}})
    assert "\n" not in str(excinfo.value)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("terminal", [True, False])
def test_calibration_progress_shows_only_on_a_terminal(nodes, monkeypatch, terminal):
    stderr = Terminal() if terminal else io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    trainer(nodes, progress=True)
    assert ("calibrating const-d2p" in stderr.getvalue()) == terminal
