"""The Python entry point (``dpdl.train`` / ``dpdl.DecentralizedTrainer``): users' own model,
data and graph; the same results as ``dpdl run``; everything validated before anything is
written, each refusal a one-line DPDLError."""

from __future__ import annotations

import csv
import json
import math
import tomllib
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.accounting.certified import compute_epsilon
from dpdl.cli import main
from dpdl.data import load_dataset, partition
from dpdl.errors import DPDLError
from dpdl.models import make_model
from dpdl.training.trainer import CSVLogger, Evaluation, TensorBoardLogger

NODES = 12


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    return train_test_split(x, y, test_size=0.25, random_state=0)


def uneven_split(x, y, nodes=NODES, seed=0):
    """Consecutive blocks of 40 to 120 records: unequal local data sets."""
    sizes = np.random.default_rng(seed).integers(40, 121, size=nodes)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    assert bounds[-1] <= len(x)
    return [(x[a:b], y[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def mlp(seed=0, hidden=16):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.Tanh(), nn.Linear(hidden, 10))


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# --------------------------------------------------------------------------- it trains
@pytest.fixture(scope="module")
def trained(digits):
    x_train, x_test, y_train, y_test = digits
    nodes = uneven_split(x_train, y_train)
    graph = nx.connected_watts_strogatz_graph(NODES, k=4, p=0.3, seed=0)
    seen: list[Evaluation] = []
    result = dpdl.train(
        mlp(), nodes, topology=graph, algorithm="dyn-d2p", epsilon=2.0, delta=1e-5,
        batch_size=8, lr=0.5, steps=60, eval_every=30, eval_data=(x_test, y_test),
        callbacks=[seen.append], entropy="seed", seed=0,
    )  # fmt: skip
    return result, seen, nodes, (x_test, y_test)


def test_user_model_on_user_data_beats_chance_within_budget(trained):
    result, seen, nodes, (x_test, y_test) = trained
    assert result.status == "ok"
    accuracy = result.history[-1]["test_accuracy"]
    assert accuracy > 0.2  # 10 classes: chance is 0.1 (replace-one: twice the sensitivity)
    # the certified epsilon spent, recomputed from the schedule's multipliers by the
    # accountant itself (PLD, exact), is within the target; the ledger agrees
    spent = compute_epsilon(
        "pld", result.schedule.noise_multipliers, result.schedule.sample_rate, 1e-5,
        neighboring="replace-one",  # a run's default relation
    ).epsilon
    assert result.epsilon == pytest.approx(spent, rel=1e-6)
    assert result.epsilon <= 2.0 * (1 + 1e-9)
    assert result.ledger.epsilon_spent() <= 2.0 * (1 + 1e-9)
    assert result.ledger.steps_taken == 60
    assert math.isfinite(result.epsilon_clt) and result.delta == 1e-5
    # p = b / J_min with the smallest local data set
    assert result.schedule.sample_rate == pytest.approx(8 / min(len(x) for x, _ in nodes))
    # callbacks saw every evaluation with the epsilon spent so far
    assert [e.iteration for e in seen] == [0, 30, 60]
    assert seen[0].epsilon_certified == 0.0 < seen[1].epsilon_certified < seen[2].epsilon_certified
    assert seen[-1].metrics["test_accuracy"] == accuracy


def test_result_models_are_the_trained_models(trained):
    result, _, _, (x_test, y_test) = trained
    with torch.no_grad():
        predicted = result.model(torch.as_tensor(x_test)).argmax(dim=1).numpy()
    assert np.mean(predicted == y_test) == pytest.approx(result.history[-1]["test_accuracy"])
    node_models = result.node_models
    assert len(node_models) == NODES and all(isinstance(m, nn.Module) for m in node_models)
    # the node models sit close to the average (consensus), but not on it
    flat = [torch.cat([p.flatten() for p in m.parameters()]) for m in node_models]
    average = torch.cat([p.flatten() for p in result.model.parameters()])
    assert all(not torch.equal(f, average) for f in flat)


# --------------------------------------------------------------------------- same as dpdl run
def test_api_and_dpdl_run_give_identical_metrics(tmp_path):
    config = {
        "experiment": {"name": "cli", "algorithms": ["dyn-d2p"], "seed": 0, "entropy": "seed"},
        "data": {"dataset": "digits"},
        "model": {"name": "logreg"},
        "topology": {"name": "exp", "nodes": 6},
        "training": {"steps": 12, "batch_size": 4, "lr": 0.3, "eval_every": 6},
        "privacy": {"epsilon": 2.0, "delta": 1e-4, "eval_blocks": 4, "calibration_blocks": 10},
    }  # fmt: skip
    path = tmp_path / "cli.toml"
    path.write_text(_toml(config))
    assert tomllib.loads(path.read_text()) == config
    assert main(["run", str(path), "--output", str(tmp_path / "cli"), "--no-progress"]) == 0
    (cli_dir,) = [p for p in (tmp_path / "cli").iterdir() if p.is_dir()]

    # The same through the API, with the data, split and model a user would build.
    data = load_dataset("digits", seed=0)
    parts = partition(data.y_train, 6, seed=0)
    result = dpdl.train(
        make_model("logreg", data.input_shape, data.num_classes, seed=0),
        [(data.x_train[p], data.y_train[p]) for p in parts],
        topology="exp", algorithm="dyn-d2p", epsilon=2.0, delta=1e-4, batch_size=4, lr=0.3,
        steps=12, eval_every=6, eval_blocks=4, calibration_blocks=10,
        eval_data=(data.x_test, data.y_test),
        entropy="seed", seed=0, output_dir=tmp_path / "api", run_name="api",
    )  # fmt: skip
    api_dir = tmp_path / "api" / "api"
    assert result.run_dir == api_dir
    assert (cli_dir / "metrics.csv").read_text() == (api_dir / "metrics.csv").read_text()
    rows = list(csv.DictReader((api_dir / "metrics.csv").open()))
    assert [r["iteration"] for r in rows] == ["0", "6", "12"]
    for name in ("results.json", "curves.png", "trainer.json"):
        assert (api_dir / name).is_file()


def _toml(config: dict) -> str:
    from dpdl.experiments.runner import to_toml

    return to_toml(config)


# --------------------------------------------------------------------------- fails closed
def test_a_missing_data_set_leaves_no_run_folder(tmp_path):
    config = {
        "data": {"dataset": "fashion-mnist", "data_dir": str(tmp_path / "nowhere")},
        "training": {"steps": 2},
    }
    path = tmp_path / "c.toml"
    path.write_text(_toml(config))
    out = tmp_path / "runs"
    assert main(["run", str(path), "--output", str(out), "--no-progress"]) == 2
    assert not out.exists() or not any(out.iterdir())


def test_nothing_is_written_when_the_api_refuses(tmp_path, digits):
    x_train, _, y_train, _ = digits
    model = nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8), nn.Linear(8, 10))
    with pytest.raises(DPDLError):
        dpdl.DecentralizedTrainer(
            model, uneven_split(x_train, y_train, nodes=3), steps=2, output_dir=tmp_path / "o"
        )
    assert not (tmp_path / "o").exists()


def test_batchnorm_is_refused_naming_the_layer_and_the_fix(digits):
    x_train, _, y_train, _ = digits
    model = nn.Sequential(nn.Linear(64, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 10))
    with pytest.raises(DPDLError) as excinfo:
        dpdl.DecentralizedTrainer(model, uneven_split(x_train, y_train, nodes=3), steps=2)
    message = one_line_error(excinfo)
    assert "'1'" in message and "BatchNorm1d" in message and "GroupNorm" in message
    norm = nn.InstanceNorm1d(1, track_running_stats=True)
    tracked = nn.Sequential(nn.Unflatten(1, (1, 64)), norm, nn.Flatten(), nn.Linear(64, 10))
    with pytest.raises(DPDLError, match="InstanceNorm1d"):
        dpdl.DecentralizedTrainer(tracked, uneven_split(x_train, y_train, nodes=3), steps=2)


def test_frozen_parameters_are_refused(digits):
    x_train, _, y_train, _ = digits
    model = mlp()
    model[0].weight.requires_grad_(False)
    with pytest.raises(DPDLError, match="'0.weight' is frozen") as excinfo:
        dpdl.DecentralizedTrainer(model, uneven_split(x_train, y_train, nodes=3), steps=2)
    one_line_error(excinfo)


def test_a_graph_that_is_not_strongly_connected_is_refused(digits):
    x_train, _, y_train, _ = digits
    path = nx.DiGraph(nx.path_graph(NODES, create_using=nx.DiGraph))  # 0 -> 1 -> ... -> 11
    assert nx.is_weakly_connected(path)
    with pytest.raises(DPDLError) as excinfo:
        dpdl.DecentralizedTrainer(mlp(), uneven_split(x_train, y_train), topology=path, steps=2)
    assert "not 1-strongly connected" in one_line_error(excinfo)
    two_islands = nx.disjoint_union(nx.cycle_graph(6), nx.cycle_graph(6))
    with pytest.raises(DPDLError, match="strongly connected"):
        dpdl.DecentralizedTrainer(
            mlp(), uneven_split(x_train, y_train), topology=two_islands, steps=2
        )


def test_nodes_whose_data_shapes_disagree_are_refused(digits):
    x_train, _, y_train, _ = digits
    nodes = uneven_split(x_train, y_train, nodes=3)
    nodes[2] = (nodes[2][0][:, :32], nodes[2][1])
    with pytest.raises(DPDLError) as excinfo:
        dpdl.DecentralizedTrainer(mlp(), nodes, steps=2)
    message = one_line_error(excinfo)
    assert "node 2" in message and "(32,)" in message and "(64,)" in message


def test_a_loss_that_is_not_per_record_is_refused(digits):
    x_train, _, y_train, _ = digits
    nodes = uneven_split(x_train, y_train, nodes=3)
    mean_loss = nn.CrossEntropyLoss()  # reduction="mean": one number for the whole batch
    with pytest.raises(DPDLError) as excinfo:
        dpdl.DecentralizedTrainer(mlp(), nodes, loss=mean_loss, steps=2)
    message = one_line_error(excinfo)
    assert "one value per record" in message and "reduction='none'" in message

    def two_per_record(out, y):
        return torch.stack([out.sum(1), out.sum(1)], dim=1)

    with pytest.raises(DPDLError, match="one value per record"):
        dpdl.DecentralizedTrainer(mlp(), nodes, loss=two_per_record, steps=2)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"lr": -1.0}, "lr"),
        ({"steps": None}, "exactly one of"),
        ({"algorithm": "dyn-dp"}, "unknown algorithm"),
        ({"entropy": "clock"}, "entropy"),
        ({"batch_size": 500.0}, "smallest local data set"),
        ({"topology": "ring", "topology_params": {"degree": 3}}, "no parameter .degree."),
        ({"loss": "hinge"}, "unknown loss"),
        ({"eval_data": (np.zeros((3, 8)), np.zeros(3))}, "record shape"),
        ({"resume": True}, "resume needs output_dir"),
    ],
)
def test_bad_settings_are_one_line_errors(digits, options, match):
    x_train, _, y_train, _ = digits
    settings = {"steps": 2} | options
    with pytest.raises(DPDLError, match=match) as excinfo:
        dpdl.DecentralizedTrainer(mlp(), uneven_split(x_train, y_train, nodes=3), **settings)
    one_line_error(excinfo)


# --------------------------------------------------------------------------- the other inputs
def test_callable_topology_datasets_callable_loss_and_loggers(tmp_path, digits):
    x_train, x_test, y_train, y_test = digits
    n = 4
    ring = np.zeros((n, n))
    for i in range(n):
        ring[i, i] = ring[(i + 1) % n, i] = 0.5  # i sends half of its mass to i + 1

    def mixing(k):  # alternate the ring and the complete graph
        return ring if k % 2 == 0 else np.full((n, n), 1 / n)

    datasets = [
        torch.utils.data.TensorDataset(torch.as_tensor(x), torch.as_tensor(y))
        for x, y in uneven_split(x_train, y_train, nodes=n)
    ]

    def per_record_ce(out, y):
        return nn.functional.cross_entropy(out, y, reduction="none")

    def top2(out, y):
        return {"top2": float((out.topk(2, dim=1).indices == y[:, None]).any(1).float().mean())}

    seen = []
    with CSVLogger(tmp_path / "log.csv") as logger:
        result = dpdl.train(
            mlp(), datasets, topology=mixing, topology_params={"period": 2},
            algorithm="const-d2p", epsilon=3.0, calibrate="rdp", certified_accountant="rdp",
            batch_size=4, lr=0.3, epochs=0.25, loss=per_record_ce, eval_every=5,
            eval_data=(x_test, y_test), metric=top2, callbacks=[logger, seen.append],
        )  # fmt: skip
    # epochs: ceil(0.25 * J_min / b) steps
    j_min = min(len(d) for d in datasets)
    assert result.record["steps"] == math.ceil(0.25 * j_min / 4)
    assert result.record["calibrated_with"] == "rdp" and result.epsilon <= 3.0 * (1 + 1e-9)
    rows = list(csv.DictReader((tmp_path / "log.csv").open()))
    assert len(rows) == len(seen) and rows[0]["iteration"] == "0"
    assert "top2" in rows[0] and all(0 <= float(r["top2"]) <= 1 for r in rows)
    # a callable loss has no built-in accuracy; the user's metric is there instead
    assert math.isnan(seen[-1].metrics["test_accuracy"]) and "top2" in seen[-1].metrics


def test_bad_mixing_function_is_refused(digits):
    x_train, _, y_train, _ = digits
    nodes = uneven_split(x_train, y_train, nodes=3)
    with pytest.raises(DPDLError, match="column 0 sums to"):
        dpdl.DecentralizedTrainer(mlp(), nodes, topology=lambda k: np.eye(3) * 0.5, steps=2)
    with pytest.raises(DPDLError, match="shape"):
        dpdl.DecentralizedTrainer(mlp(), nodes, topology=lambda k: np.eye(4), steps=2)


def test_the_period_of_a_mixing_function_is_found_or_asked_for():
    from dpdl.topology import from_mixing_function, make_topology

    exp = make_topology("exp", 8)  # one-peer exponential graph: period 3
    found = from_mixing_function(exp.mixing_matrix, 8)
    assert found.period == 3
    for k in range(6):
        assert np.array_equal(found.mixing_matrix(k), exp.mixing_matrix(k))
    assert from_mixing_function(lambda k: exp.mixing_matrix(0), 8).period == 1
    drifting = [make_topology("erdos-renyi", 8, seed=s, probability=0.6).mixing_matrix(0)
                for s in range(70)]  # fmt: skip
    with pytest.raises(DPDLError, match=r"does not repeat within k < 64: give its period"):
        from_mixing_function(lambda k: drifting[k], 8)
    assert from_mixing_function(lambda k: drifting[k], 8, period=5).period == 5


def test_tensorboard_logger(tmp_path):
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        with pytest.raises(DPDLError, match="pip install tensorboard"):
            TensorBoardLogger(tmp_path)
        return
    logger = TensorBoardLogger(tmp_path)
    logger(Evaluation(0, {"test_accuracy": 0.5}, 0.0, 0.0, {}))
    logger.close()
    assert any(Path(tmp_path).iterdir())


def test_resume_continues_an_interrupted_api_run_exactly(tmp_path, digits):
    x_train, x_test, y_train, y_test = digits
    nodes = uneven_split(x_train, y_train, nodes=4)
    settings = dict(
        algorithm="dyn-d2p", epsilon=2.0, calibrate="clt", certified_accountant="rdp",
        batch_size=4, lr=0.3, steps=12, eval_every=4, eval_data=(x_test, y_test),
        entropy="seed", seed=3, checkpoint_every=3, run_name="r",
    )  # fmt: skip
    full = dpdl.train(mlp(), nodes, output_dir=tmp_path / "full", **settings)

    class Crash(Exception):
        pass

    def crash_at_8(evaluation):
        if evaluation.iteration == 8:
            raise Crash

    with pytest.raises(Crash):
        dpdl.train(mlp(), nodes, output_dir=tmp_path / "cut", callbacks=[crash_at_8], **settings)
    assert (tmp_path / "cut" / "r" / "checkpoints" / "run.pt").is_file()
    resumed = dpdl.train(mlp(), nodes, output_dir=tmp_path / "cut", resume=True, **settings)
    # (as JSON: a NaN read back from the checkpoint is another NaN object, never equal)
    assert json.dumps(resumed.history) == json.dumps(full.history)
    assert resumed.ledger.steps_taken == 12
    assert (tmp_path / "cut" / "r" / "metrics.csv").read_text() == (
        tmp_path / "full" / "r" / "metrics.csv"
    ).read_text()
    with pytest.raises(DPDLError, match="other settings"):
        dpdl.train(mlp(), nodes, output_dir=tmp_path / "cut", resume=True, **settings | {"lr": 0.1})


def test_an_os_entropy_api_run_resumes_from_its_checkpointed_streams(tmp_path, digits):
    x_train, x_test, y_train, y_test = digits
    nodes = uneven_split(x_train, y_train, nodes=4)
    settings = dict(
        algorithm="const-d2p", epsilon=2.0, calibrate="clt", certified_accountant="rdp",
        batch_size=4, lr=0.3, steps=8, eval_every=4, checkpoint_every=2, run_name="r",
        output_dir=tmp_path, eval_data=(x_test, y_test),
    )  # fmt: skip

    def crash_at_4(evaluation):
        if evaluation.iteration == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dpdl.train(mlp(), nodes, callbacks=[crash_at_4], **settings)
    first = list(csv.DictReader((tmp_path / "r" / "metrics.csv").open()))
    resumed = dpdl.train(mlp(), nodes, resume=True, **settings)  # entropy "os" by default
    assert resumed.record["noise_entropy"] == "os"
    assert [row["iteration"] for row in resumed.history] == [0, 4, 8]
    assert resumed.ledger.steps_taken == 8
    assert float(first[1]["test_loss"]) == resumed.history[1]["test_loss"]  # step 4 replayed


def test_a_dropout_layer_kept_in_eval_mode_trains_and_nothing_draws_from_torchs_generator():
    """Dropout in train mode is refused (tests/privacy/test_model_state_attacks2.py); kept in
    eval mode it is the identity: the run trains, neither the checks, nor the steps, nor the
    evaluations draw from torch's global generator, and the evaluations, which switch the
    model to eval mode and back, leave the layer in eval mode (its global seed is moot)."""
    import copy

    import torch
    from sklearn.datasets import load_digits
    from torch import nn

    import dpdl

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Dropout(0.9), nn.Linear(32, 10))
    model[2].eval()
    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x[:400] / 16, dtype=torch.float32), torch.tensor(y[:400])
    data = [(x[i::4], y[i::4]) for i in range(4)]
    histories = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        before = torch.random.get_rng_state()
        result = dpdl.train(copy.deepcopy(model), data, topology="ring", epsilon=2.0, steps=4,
                            batch_size=4, lr=0.1, entropy="seed", progress=False,
                            eval_data=(x[:50], y[:50]), eval_every=2)  # fmt: skip
        assert torch.equal(torch.random.get_rng_state(), before)
        assert result.status == "ok" and not result.model[2].training and result.model.training
        histories.append([row["test_loss"] for row in result.history])
    assert histories[0] == histories[1]  # the run is the same whatever torch's global seed


def test_a_callback_that_returns_true_stops_the_run_and_epsilon_is_of_the_steps_taken():
    import torch
    from sklearn.datasets import load_digits

    import dpdl

    x, y = load_digits(return_X_y=True)
    x, y = torch.tensor(x[:400] / 16, dtype=torch.float32), torch.tensor(y[:400])
    data = [(x[i::4], y[i::4]) for i in range(4)]
    seen = []

    def stop_at_four(evaluation):
        seen.append(evaluation.iteration)
        return evaluation.iteration >= 4

    kwargs = dict(topology="ring", epsilon=2.0, steps=20, batch_size=4, lr=0.1,
                  entropy="seed", progress=False, eval_data=(x[:50], y[:50]), eval_every=2)
    stopped = dpdl.train(torch.nn.Linear(64, 10), data, callbacks=[stop_at_four], **kwargs)
    full = dpdl.train(torch.nn.Linear(64, 10), data, **kwargs)
    assert stopped.status == "stopped" and "after step 4" in stopped.message
    assert seen == [0, 2, 4] and stopped.ledger.steps_taken == 4
    assert stopped.epsilon < full.epsilon  # what was spent, not the planned budget
    assert stopped.epsilon == stopped.ledger.epsilon_spent()
