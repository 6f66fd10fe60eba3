"""Per-node accuracy on the validation records (issue 43): the mean and worst node of
``val_node_accuracy_*`` are those of the node models the run returns, scored here by hand."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpdl

pytestmark = pytest.mark.usefixtures("one_thread")


def test_val_node_accuracy_is_the_mean_and_worst_of_the_node_models():
    gen = torch.Generator().manual_seed(1)
    centres = torch.randn(3, 6, generator=gen) * 2

    def records(count):
        y = torch.randint(0, 3, (count,), generator=gen)
        return centres[y] + torch.randn(count, 6, generator=gen), y

    nodes = [records(30) for _ in range(5)]
    x_val, y_val = records(50)
    result = dpdl.train(nn.Linear(6, 3), nodes, topology="ring", algorithm="dyn-d2p",
                        epsilon=4.0, delta=1e-4, steps=6, batch_size=6, lr=0.3, eval_every=6,
                        eval_data=records(40), validation_data=(x_val, y_val),
                        entropy="seed", seed=2, progress=False)  # fmt: skip
    final = result.history[-1]
    with torch.no_grad():
        by_node = [float((m(x_val).argmax(1) == y_val).float().mean())
                   for m in result.node_models]  # fmt: skip
    assert len(set(by_node)) > 1  # the nodes differ: worst and mean are two numbers
    assert final["val_node_accuracy_mean"] == pytest.approx(sum(by_node) / len(by_node))
    assert final["val_node_accuracy_worst"] == pytest.approx(min(by_node))


@pytest.mark.parametrize("local_steps", [1, 2])
def test_messages_and_bytes_per_node_are_the_graph_degrees_times_the_rounds(tmp_path,
                                                                           local_steps):
    """A star of 5 nodes (networkx: the hub 0 and four leaves): per gossip round the hub sends
    its model to 4 nodes, a leaf to 1; a message is Linear(5, 3)'s 18 float32 numbers and the
    float64 push-sum weight, 80 bytes.  Gossip every ``local_steps``-th step of 6."""
    import csv
    import json

    import networkx as nx

    gen = torch.Generator().manual_seed(0)
    nodes = [(torch.randn(10, 5, generator=gen), torch.randint(0, 3, (10,), generator=gen))
             for _ in range(5)]  # fmt: skip
    steps, rounds = 6, 6 // local_steps
    dpdl.train(nn.Linear(5, 3), nodes, topology=nx.star_graph(4), algorithm="sgp",
               epsilon=None, steps=steps, local_steps=local_steps, batch_size=4, lr=0.1,
               eval_every=3, eval_data=nodes[0], entropy="seed", seed=0, progress=False,
               output_dir=tmp_path, run_name="r")  # fmt: skip
    messages = [4 * rounds] + [rounds] * 4
    (cell,) = json.loads((tmp_path / "r" / "results.json").read_text())["cells"]
    assert cell["communication"] == {"messages_per_node": messages,
                                     "bytes_per_node": [80 * m for m in messages]}
    with open(tmp_path / "r" / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [float(r["messages_per_node"]) for r in rows] == pytest.approx([
        0.0, sum(messages) / 5 * (3 // local_steps) / rounds, sum(messages) / 5])
    assert float(rows[-1]["bytes_per_node"]) == 80 * sum(messages) / 5
