"""Per-node evaluation (``node_eval_data``, ``training.node_eval_share``) and the
heterogeneity summaries (node sizes; label histograms only of a public benchmark's split)."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.data import (
    held_out_mask,
    label_histograms,
    load_dataset,
    partition,
    plot_label_distribution,
)
from dpdl.errors import DPDLError
from dpdl.experiments import runner

NODES = 5
FEATURES, CLASSES = 6, 3


pytestmark = pytest.mark.usefixtures("one_thread")


def node_sets(sizes, seed=0, regression=False):
    rng = np.random.default_rng(seed)
    sets = []
    for size in sizes:
        x = rng.normal(size=(size, FEATURES)).astype(np.float32)
        y = (rng.normal(size=size).astype(np.float32) if regression
             else rng.integers(0, CLASSES, size=size))  # fmt: skip
        sets.append((x, y))
    return sets


def linear(outputs=CLASSES):
    torch.manual_seed(0)
    return nn.Linear(FEATURES, outputs)


def train(data, **options):
    settings = dict(topology="exp", algorithm="dyn-d2p", epsilon=2.0, steps=6, batch_size=2,
                    lr=0.3, eval_every=3, entropy="seed", seed=1)  # fmt: skip
    return dpdl.train(options.pop("model", None) or linear(), data, **(settings | options))


def one_line_error(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# --------------------------------------------------------------------------- node_eval_data
def test_node_local_scores_are_each_node_model_on_its_own_set(tmp_path):
    data, evals = node_sets([20, 25, 30, 22, 28]), node_sets([7, 9, 5, 11, 8], seed=5)
    result = train(data, node_eval_data=evals, output_dir=tmp_path, run_name="r")
    assert [row["iteration"] for row in result.history] == [0, 3, 6]
    final = result.history[-1]
    for i, (x, y) in enumerate(evals):  # brute force: node i's model, node i's records
        with torch.no_grad():
            out = result.node_model(i)(torch.as_tensor(x))
        y = torch.as_tensor(y)
        assert final["node_local_accuracy"][i] == pytest.approx(
            float((out.argmax(-1) == y).double().mean()), abs=1e-12)  # fmt: skip
        assert final["node_local_loss"][i] == pytest.approx(
            float(nn.functional.cross_entropy(out, y)), rel=1e-5)  # fmt: skip
    assert final["node_local_accuracy_mean"] == pytest.approx(np.mean(final["node_local_accuracy"]))
    assert final["node_local_accuracy_worst"] == min(final["node_local_accuracy"])
    # the vectors go in the rows and results.json's final row, not in metrics.csv
    assert result.record.final["node_local_accuracy"] == final["node_local_accuracy"]
    cell = json.loads((tmp_path / "r" / "results.json").read_text())["cells"][0]
    assert cell["final"]["node_local_loss"] == final["node_local_loss"]
    assert cell["node_sizes"] == [20, 25, 30, 22, 28]
    with open(tmp_path / "r" / "metrics.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert "node_local_accuracy_worst" in header and "node_local_accuracy" not in header


def test_a_regression_run_gets_per_node_losses_only():
    data, evals = node_sets([20] * NODES, regression=True), node_sets([6] * NODES, 3, True)
    result = train(data, node_eval_data=evals, loss="squared_error", model=linear(1))
    final = result.history[-1]
    assert "node_local_accuracy" not in final and math.isnan(final["node_local_accuracy_mean"])
    x, y = evals[2]
    with torch.no_grad():
        out = result.node_model(2)(torch.as_tensor(x)).reshape(-1)
    want = float((0.5 * (out - torch.as_tensor(y)) ** 2).mean())
    assert final["node_local_loss"][2] == pytest.approx(want, rel=1e-5)


def test_without_per_node_evaluation_rows_are_as_before():
    final = train(node_sets([20] * NODES)).history[-1]
    assert not [k for k in final if k.startswith("node_local")]


def _bad_sets():
    good = node_sets([6] * NODES, seed=2)
    wrong_shape = list(good)
    wrong_shape[3] = (np.zeros((6, FEATURES + 1), np.float32), good[3][1])
    real_labels = list(good)
    real_labels[1] = (good[1][0], np.full(6, 0.5, np.float32))
    out_of_range = list(good)
    out_of_range[4] = (good[4][0], np.array([0, 1, 2, 3, 0, 1]))
    empty = list(good)
    empty[0] = (np.zeros((0, FEATURES), np.float32), np.zeros(0, np.int64))
    return {
        "count": (good[:4], "node_eval_data has 4 sets but the run has 5 nodes"),
        "shape": (wrong_shape, "node_eval_data[3] (node 3's evaluation set) has record shape (7,)"),
        "float labels": (real_labels, "node_eval_data[1] (node 1's evaluation set) has "
                         "real-valued labels"),
        "out of range": (out_of_range, "node_eval_data[4] (node 4's evaluation set) has labels "
                         "outside 0..2 (the model's 3 outputs), e.g. 3"),
        "empty": (empty, "node_eval_data[0] (node 0's evaluation set) has no records"),
    }  # fmt: skip


@pytest.mark.parametrize("case", list(_bad_sets()))
def test_bad_node_eval_data_is_refused_before_anything_is_written(tmp_path, case):
    sets, message = _bad_sets()[case]
    with pytest.raises(DPDLError) as excinfo:
        dpdl.DecentralizedTrainer(linear(), node_sets([20] * NODES), epsilon=2.0, steps=4,
                                  node_eval_data=sets, output_dir=tmp_path)  # fmt: skip
    assert message in one_line_error(excinfo)
    assert list(tmp_path.iterdir()) == []


def test_node_eval_data_and_share_are_exclusive():
    with pytest.raises(DPDLError, match="not both"):
        dpdl.DecentralizedTrainer(linear(), node_sets([20] * NODES), epsilon=2.0, steps=4,
                                  node_eval_data=node_sets([5] * NODES),
                                  node_eval_share=0.2)  # fmt: skip


# --------------------------------------------------------------------------- node_eval_share
def test_the_held_out_share_is_a_keyed_hash_of_each_record():
    x, y = node_sets([4000])[0]
    held = held_out_mask(x, y, 0.1, seed=3, node=2)
    assert held.mean() == pytest.approx(0.1, abs=0.015)  # each record with probability 0.1
    assert np.array_equal(held_out_mask(x[::-1], y[::-1], 0.1, seed=3, node=2), held[::-1])
    with pytest.raises(DPDLError, match="node_eval_share must lie strictly between 0 and 1"):
        held_out_mask(x, y, 1.0, seed=0, node=4)


def _distinctive_hold_out(x, y, share, seed, node):
    """Each record in one of two versions, chosen so that the hold-out (a hash of the
    record's own bytes) holds out exactly the huge versions: a record whose huge version is
    held out becomes it, one whose plain version is kept stays plain, any other is left out."""
    huge = np.full_like(x, 1e4) + np.arange(len(x), dtype=x.dtype)[:, None]
    held_huge = held_out_mask(huge, y, share, seed, node)
    kept_plain = ~held_out_mask(x, y, share, seed, node)
    x = np.where(held_huge[:, None], huge, x)
    usable = held_huge | kept_plain
    return x[usable], y[usable], held_huge[usable]


def test_held_out_records_are_never_trained_on():
    """A run holding out records by node_eval_share trains exactly as a run on the other
    records alone (same seeded streams: sizes, sampling rate, data): the held-out records,
    made huge and distinctive, are never sampled; and they are what the per-node scores are
    computed on."""
    sizes, share, seed = [20, 25, 30, 22, 28], 0.2, 1
    data, kept_sets, held_sets, want_sizes = [], [], [], []
    for i, (x, y) in enumerate(node_sets(sizes)):
        x, y, held = _distinctive_hold_out(x, y, share, seed, i)
        assert held.any() and not held.all()
        np.testing.assert_array_equal(held_out_mask(x, y, share, seed, i), held)
        data.append((x, y))
        kept_sets.append((x[~held], y[~held]))
        held_sets.append((x[held], y[held]))
        want_sizes.append(int((~held).sum()))
    held_out = train(data, node_eval_share=share, seed=seed)
    alone = train(kept_sets, node_eval_data=held_sets, seed=seed)
    assert list(held_out.record.node_sizes) == want_sizes
    assert held_out.record.sample_rate == pytest.approx(2 / min(want_sizes))
    for name, p in held_out.model.state_dict().items():
        torch.testing.assert_close(p, alone.model.state_dict()[name], rtol=0, atol=0)
    for key in ("node_local_accuracy", "node_local_loss"):
        assert held_out.history[-1][key] == alone.history[-1][key]


def test_node_eval_share_is_a_training_setting():
    from dpdl.experiments.config import parse_config

    assert parse_config(config(node_eval_share=0.1)).training.node_eval_share == 0.1
    with pytest.raises(DPDLError, match="training.node_eval_share: Input should be less than 1"):
        parse_config(config(node_eval_share=1.0))
    with pytest.raises(DPDLError, match="node_eval_share: Input should be less than 1"):
        dpdl.DecentralizedTrainer(linear(), node_sets([20] * NODES), epsilon=2.0, steps=4,
                                  node_eval_share=1.0)  # fmt: skip
    with pytest.raises(DPDLError, match=r"node \d: node_eval_share = 0.99 holds out all its "
                       r"\d+ records; lower the share"):  # fmt: skip
        dpdl.DecentralizedTrainer(linear(), node_sets([20, 20, 1, 20, 20]), epsilon=2.0,
                                  steps=4, batch_size=1, node_eval_share=0.99)  # fmt: skip


# --------------------------------------------------------------------------- heterogeneity
def test_label_histograms_and_their_drawing(tmp_path):
    data = node_sets([20, 25, 30, 22, 28])
    histograms = label_histograms(data, CLASSES)
    for row, (_, y) in zip(histograms, data, strict=True):
        assert row.tolist() == np.bincount(y, minlength=CLASSES).tolist()
    path = plot_label_distribution(histograms, tmp_path / "labels.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(DPDLError, match="node 0 has labels outside 0..1, e.g. 2"):
        label_histograms(data, 2)


def test_api_runs_release_no_label_histograms(tmp_path):
    result = train(node_sets([20] * NODES), output_dir=tmp_path, run_name="api")
    assert result.record.heterogeneity is None
    cell = json.loads((tmp_path / "api" / "results.json").read_text())["cells"][0]
    assert cell["heterogeneity"] is None and cell["node_sizes"] == [20] * NODES
    assert not (tmp_path / "api" / "label_distribution.png").exists()
    # the option off: trainer.json as before it existed (a resume compares it as text)
    settings = json.loads((tmp_path / "api" / "trainer.json").read_text())
    assert "node_eval_share" not in settings["training"]


def config(dataset="digits", **training):
    return {
        "kind": "decentralized",
        "experiment": {"name": "het", "algorithms": ["dyn-d2p"], "entropy": "seed", "seed": 2},
        "data": {"dataset": dataset, "partition": "dirichlet", "alpha": 0.5},
        "model": {"name": "logreg"},
        "topology": {"name": "exp", "nodes": 6},
        "training": {"steps": 2, "batch_size": 2, "lr": 0.3, "eval_every": 2} | training,
        "privacy": {"epsilon": 2.0, "delta": 1e-4, "calibrate": "clt",
                    "certified_accountant": "rdp"},
    }  # fmt: skip


def test_a_benchmark_split_records_its_label_histograms(tmp_path):
    results = runner.run_experiment(config(node_eval_share=0.1), tmp_path, progress=False,
                                    run_name="r")  # fmt: skip
    (cell,) = results["cells"]
    data = load_dataset("digits", seed=2)
    parts = partition(data.y_train, 6, scheme="dirichlet", alpha=0.5, seed=2)
    trained = [p[~held_out_mask(data.x_train[p], data.y_train[p], 0.1, 2, i)]
               for i, p in enumerate(parts)]  # fmt: skip
    het = cell["heterogeneity"]
    assert het["source"] == "partition of the public benchmark digits"
    assert het["node_sizes"] == cell["node_sizes"] == [len(p) for p in trained]
    assert all(len(t) < len(p) for t, p in zip(trained, parts, strict=True))
    assert het["label_histograms"] == [np.bincount(data.y_train[p], minlength=10).tolist()
                                       for p in trained]  # fmt: skip
    assert len(cell["final"]["node_local_accuracy"]) == 6
    run_dir = tmp_path / "r"
    assert (run_dir / "label_distribution.png").read_bytes()[:4] == b"\x89PNG"
    with open(run_dir / "metrics.csv", newline="") as fh:
        header = next(csv.reader(fh))
    assert header == [*runner.METRIC_COLUMNS, "node_local_accuracy_mean",
                      "node_local_accuracy_worst", "node_local_loss_mean",
                      "node_local_loss_worst"]  # fmt: skip


def test_a_csv_data_set_gets_no_label_histograms(tmp_path):
    rng = np.random.default_rng(0)
    table = np.column_stack([rng.normal(size=(120, 4)), rng.integers(0, 2, 120)])
    path = tmp_path / "mine.csv"
    np.savetxt(path, table, delimiter=",", fmt=["%.5f"] * 4 + ["%d"])
    results = runner.run_experiment(config(f"csv:{path}"), tmp_path / "out", progress=False,
                                    run_name="r")  # fmt: skip
    (cell,) = results["cells"]
    assert cell["heterogeneity"] is None and len(cell["node_sizes"]) == 6
    assert not (tmp_path / "out" / "r" / "label_distribution.png").exists()


def test_private_files_in_a_benchmarks_format_get_no_label_histograms(tmp_path):
    """A user's own images in Fashion-MNIST's IDX format, read by the shipped loader under the
    shipped name, are private data: the name alone does not make them public (review)."""
    from dpdl.data import is_public_benchmark, write_idx

    rng = np.random.default_rng(0)
    for split, size in (("train", 200), ("t10k", 50)):
        write_idx(tmp_path / f"{split}-images-idx3-ubyte",
                  rng.integers(0, 256, (size, 28, 28)).astype(np.uint8))  # fmt: skip
        write_idx(tmp_path / f"{split}-labels-idx1-ubyte",
                  rng.integers(0, 10, size).astype(np.uint8))  # fmt: skip
    mine = load_dataset("fashion-mnist", data_dir=tmp_path)
    assert is_public_benchmark("fashion-mnist", mine) is None
    assert is_public_benchmark("fashion-mnist") is None  # nothing read: nothing to vouch for
    cfg = config("fashion-mnist") | {"model": {"name": "logreg"}}
    cfg["data"] = cfg["data"] | {"data_dir": str(tmp_path)}
    work = runner.prepare_workload(runner.parse_config(cfg), seed=0)
    assert work.heterogeneity is None


def test_the_workload_counts_what_the_nodes_train_on(tmp_path):
    """``dpdl audit --config`` audits the workload's mechanism: its sampling rate and steps are
    those of the records left after a node_eval_share hold-out, the trainer's (review)."""
    cfg = config(node_eval_share=0.5)
    cfg["training"] = cfg["training"] | {"epochs": 0.1, "steps": None, "batch_size": 4}
    parsed = runner.parse_config(cfg)
    work = runner.prepare_workload(parsed, seed=2)
    results = runner.run_experiment(cfg, tmp_path, progress=False, run_name="r")
    (cell,) = results["cells"]
    assert work.records_per_node == cell["node_sizes"]
    assert work.sample_rate == pytest.approx(cell["sample_rate"])
    assert work.steps == cell["steps"]
    assert "node_local_metrics" in cell["unaccounted_outputs"]
