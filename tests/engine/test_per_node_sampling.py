"""Per-node sampling (issue 27, item 4): node i samples at q_i = b / J_i, an expected batch of b
at every node, reading exactly J_i words of its own stream with its own exact threshold."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpdl.algorithms.dyn_d2p import make_node_generators, node_sample_rates, poisson_sample
from dpdl.algorithms.randomness import inclusion_threshold
from dpdl.engine import NodeData, Sampling, Simulator
from dpdl.errors import DPDLError

from .conftest import ExpGraph, tiny_data, tiny_model

COUNTS = [6, 60, 600]  # a hundredfold between the smallest and the largest node
B = 3.0


def test_rates_are_b_over_each_nodes_size_or_b_over_the_smallest():
    np.testing.assert_array_equal(node_sample_rates(COUNTS, B, "per-node"), [0.5, 0.05, 0.005])
    np.testing.assert_array_equal(node_sample_rates(COUNTS, B), [0.5, 0.5, 0.5])
    with pytest.raises(DPDLError, match="unknown sampling 'fixed'") as excinfo:
        node_sample_rates(COUNTS, B, "fixed")
    assert "\n" not in str(excinfo.value)


def test_each_node_draws_b_records_per_step_in_expectation():
    x, y, mask = tiny_data(len(COUNTS), COUNTS)
    data = NodeData.from_arrays(x, y, mask)
    sim = Simulator(tiny_model(), data, ExpGraph(len(COUNTS)), lr=0.1, expected_batch_size=B,
                    seed=7, sampling=Sampling("per-node"))  # fmt: skip
    assert sim.sample_rate == B / min(COUNTS) == float(sim.sample_rates.max())
    steps = 300
    drawn = torch.stack([sim.step(private=True, clip=1.0, sigma=1.0) for _ in range(steps)])
    mean = drawn.double().mean(dim=0).numpy()
    for j_i, q_i, m in zip(COUNTS, sim.sample_rates, mean, strict=True):
        # the mean of `steps` Binomial(J_i, q_i) draws: sd sqrt(J_i q_i (1 - q_i) / steps)
        sd = math.sqrt(j_i * q_i * (1 - q_i) / steps)
        assert abs(m - B) < 5 * sd, (j_i, m)
    # uniform sampling would have drawn b J_i / J_min: 30 and 300 at the larger nodes
    assert mean[2] < 2 * B


def test_per_node_rates_read_the_same_words_with_each_nodes_own_threshold():
    x, y, mask = tiny_data(len(COUNTS), COUNTS)
    rates = node_sample_rates(COUNTS, B, "per-node")
    streams = make_node_generators(len(COUNTS), 11)
    copies = make_node_generators(len(COUNTS), 11)
    batch = poisson_sample(torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(mask), rates,
                           streams)  # fmt: skip
    for i, (j_i, q_i) in enumerate(zip(COUNTS, rates, strict=True)):
        words = copies[i].words(j_i)  # exactly J_i words, whatever the rate
        expected = np.flatnonzero(words < np.uint64(inclusion_threshold(q_i)))
        np.testing.assert_array_equal(_records_of(batch, x, i), expected)
        assert bytes(streams[i].get_state().tolist()) == bytes(copies[i].get_state().tolist())
        assert inclusion_threshold(q_i) <= q_i * 2.0**64  # inclusion probability <= q_i


def _records_of(batch, x, node):
    """Indices, within node ``node``'s records, of the batch's records from that node."""
    rows = batch.inputs[batch.node == node].numpy()
    return [int(np.flatnonzero((x[node] == row).all(axis=1))[0]) for row in rows]


def test_a_single_rate_still_samples_every_node_at_it():
    x, y, mask = tiny_data(len(COUNTS), COUNTS)
    tensors = torch.as_tensor(x), torch.as_tensor(y), torch.as_tensor(mask)
    one = poisson_sample(*tensors, 0.25, make_node_generators(len(COUNTS), 3))
    many = poisson_sample(*tensors, [0.25] * len(COUNTS), make_node_generators(len(COUNTS), 3))
    assert torch.equal(one.node, many.node) and torch.equal(one.inputs, many.inputs)
    with pytest.raises(DPDLError, match="one sample rate per node: 2 for 3"):
        poisson_sample(*tensors, [0.1, 0.2], make_node_generators(len(COUNTS), 3))
