"""Issue 39's silent or late cases, each refused upfront in one line naming the value (or
warned, naming the node), and a refused run leaves no run folder behind."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.data import read_records
from dpdl.errors import DPDLError
from dpdl.experiments.runner import run_experiment
from dpdl.training.trainer import SmallNodeWarning

pytestmark = pytest.mark.usefixtures("one_thread")

SIZES = (20, 16, 12, 3)


def nodes(sizes=SIZES, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 2, n)) for n in sizes]


def trainer(data, **options):
    torch.manual_seed(0)
    settings = {"topology": "ring", "epsilon": 1.0, "delta": 1e-5, "batch_size": 2,
                "steps": 2, "lr": 0.1} | options  # fmt: skip
    return dpdl.DecentralizedTrainer(nn.Linear(5, 2), data, **settings)


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_an_evaluation_file_with_nan_is_refused_naming_the_record():
    x, y = nodes((10,), seed=1)[0]
    x[7, 2] = np.nan
    with pytest.raises(DPDLError, match="eval_data has non-finite inputs") as excinfo:
        trainer(nodes((20, 16, 12, 30)), eval_data=(x, y))
    assert "record 7" in one_line(excinfo)


def test_an_object_npz_is_one_line_not_a_traceback(tmp_path):
    path = tmp_path / "eval.npz"
    np.savez(path, x=np.array([object()] * 3, dtype=object), y=np.arange(3))
    with pytest.raises(DPDLError, match="'x' holds Python objects") as excinfo:
        read_records(path, "data.eval_file")
    assert str(path) in one_line(excinfo)


def test_a_label_out_of_range_names_the_node_not_torch():
    data = nodes()
    data[1][1][4] = -1
    with pytest.raises(DPDLError, match=r"node 1 has labels outside 0\.\.1.*-1") as excinfo:
        trainer(data)
    one_line(excinfo)


def test_delta_not_below_one_over_the_smallest_node_is_refused_naming_it():
    # J_min = 12 at node 2: 1/12 = 0.083; a delta of 0.1 allows publishing a record
    with pytest.raises(DPDLError, match=r"privacy.delta = 0.1 is not below 1/J_min = 1/12 "
                                        r"\(node 2 has 12 records\)") as excinfo:  # fmt: skip
        trainer(nodes((20, 16, 12, 30)), delta=0.1)
    one_line(excinfo)
    trainer(nodes((20, 16, 12, 30)), delta=0.08)  # below 1/12: accepted


def test_a_tiny_node_driving_the_common_rate_is_named():
    with pytest.warns(SmallNodeWarning, match=r"node 3 has 3 records \(median 14\).*2/3"):
        trainer(nodes())
    with warnings.catch_warnings():
        warnings.simplefilter("error", SmallNodeWarning)
        trainer(nodes(), sampling="per-node")  # each node at its own rate: nothing to say


def test_an_absurd_epsilon_is_refused_before_any_work():
    with pytest.raises(DPDLError, match="epsilon.*1e\\+06 is above 100") as excinfo:
        trainer(nodes(), epsilon=1e6)
    one_line(excinfo)


def _config(tmp_path, data, *, nodes_, eval_pair):
    for i, (x, y) in enumerate(data):
        np.savez(tmp_path / f"h-{i}.npz", x=x, y=y)
    np.savez(tmp_path / "eval.npz", x=eval_pair[0], y=eval_pair[1])
    return {"kind": "decentralized",
            "experiment": {"name": "c", "algorithms": ["const-d2p"], "seed": 0},
            "data": {"per_node": str(tmp_path / "h-{i}.npz"),
                     "eval_file": str(tmp_path / "eval.npz")},
            "model": {"name": "logreg"}, "topology": {"name": "ring", "nodes": nodes_},
            "training": {"steps": 2, "batch_size": 2, "lr": 0.1},
            "privacy": {"epsilon": 1.0, "delta": 1e-5}}  # fmt: skip


def test_more_per_node_files_than_nodes_is_refused_by_name(tmp_path):
    data = nodes((20, 16, 12, 30))
    config = _config(tmp_path, data, nodes_=3, eval_pair=data[0])
    out = tmp_path / "out"
    with pytest.raises(DPDLError, match=r"h-3.npz' exists but topology.nodes = 3") as excinfo:
        run_experiment(config, out, progress=False)
    one_line(excinfo)
    assert not out.exists()


def test_a_run_refused_by_its_first_cell_leaves_no_run_folder(tmp_path):
    data = nodes((20, 16, 12, 30))
    x, y = data[0][0].copy(), data[0][1]
    x[0, 0] = np.inf
    out = tmp_path / "out"
    with pytest.raises(DPDLError, match="non-finite inputs"):
        run_experiment(_config(tmp_path, data, nodes_=4, eval_pair=(x, y)), out,
                       progress=False)  # fmt: skip
    assert not out.exists()  # the run folder (made before the cell's checks) is gone too


# --------------------------------------------------------------------------- data.node_eval_file
def test_a_node_eval_file_needs_per_node_files_and_the_node_index():
    from dpdl.experiments.config import parse_config

    with pytest.raises(DPDLError, match="data.node_eval_file goes with data.per_node"):
        parse_config({"data": {"node_eval_file": "e-{i}.npz"}})
    with pytest.raises(DPDLError, match=r"data.node_eval_file needs \{i\}"):
        parse_config({"data": {"per_node": "h-{i}.npz", "node_eval_file": "e.npz"}})


# --------------------------------------------------------------------------- tune on per-node files
def test_tune_runs_on_per_node_files_with_a_public_validation_file(tmp_path):
    """`dpdl tune` with data.per_node: it chooses on data.validation_file (each selection
    run's val_accuracy is its saved average model's accuracy on that file, by hand); each
    node is scored on its own data.node_eval_file (node_local_*, by hand from the saved node
    models); and the site's ledger composes every selection and test run on the records."""
    import csv

    from dpdl.experiments.tune import run_tuning
    from dpdl.training.site_ledger import compose_site

    data = nodes((20, 16, 12, 30))
    config = _config(tmp_path, data, nodes_=4, eval_pair=data[0])
    val_x, val_y = nodes((25,), seed=9)[0]
    np.savez(tmp_path / "val.npz", x=val_x, y=val_y)
    config["data"]["validation_file"] = str(tmp_path / "val.npz")
    own = nodes((9, 7, 5, 11), seed=5)
    for i, (x, y) in enumerate(own):
        np.savez(tmp_path / f"own-{i}.npz", x=x, y=y)
    config["data"]["node_eval_file"] = str(tmp_path / "own-{i}.npz")
    config["experiment"] |= {"entropy": "seed"}
    config["training"] |= {"eval_every": 100, "lr": 0.5}
    config["privacy"] |= {"epsilon": [2.0], "calibrate": "clt"}
    config["tune"] = {"selection_seeds": [0], "test_seeds": [1], "workers": 1,
                      "candidates": {"const": {"algorithm": "const-d2p",
                                               "grid": {"privacy.clip": [0.2, 1.0]}}}}  # fmt: skip
    out = tmp_path / "tune"
    summary = run_tuning(config, out, workers=1, progress=False)
    assert not summary["failed"]
    scored = 0
    for metrics in sorted((out / "select").rglob("metrics.csv")):
        with open(metrics, newline="") as fh:
            last = list(csv.DictReader(fh))[-1]
        saved = torch.load(next((metrics.parent / "models").glob("*.pt")), weights_only=True)
        assert float(last["val_accuracy"]) == pytest.approx(
            _accuracy(saved["average"], val_x, val_y))
        accuracies = [_accuracy(saved["nodes"][str(i)], x, y) for i, (x, y) in enumerate(own)]
        assert float(last["node_local_accuracy_mean"]) == pytest.approx(np.mean(accuracies))
        assert float(last["node_local_accuracy_worst"]) == pytest.approx(min(accuracies))
        scored += 1
    assert scored == 2  # both grid points of the one selection seed
    (total,), _ = compose_site(out)
    assert total.runs == 3 and total.records == (78,)  # 2 selection runs + the test run


def _accuracy(state_dict, x, y) -> float:
    from dpdl.models import make_model

    model = make_model("logreg", (5,), 2)
    model.load_state_dict(state_dict)
    with torch.no_grad():
        predicted = model(torch.as_tensor(x)).argmax(dim=1).numpy()
    return float(np.mean(predicted == y))
