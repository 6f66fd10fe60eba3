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
