"""The central topology: one node holding every record, i.e. central DP-SGD, the baseline a
decentralized mechanism's local→central gap is measured against (issue 41)."""

import dp_accounting
import numpy as np
import pytest
import torch

import dpdl
from dpdl.errors import DPDLError
from dpdl.topology import make_topology

pytestmark = pytest.mark.usefixtures("one_thread")


def test_central_is_one_node_and_nothing_else():
    topology = make_topology("central", 1)
    assert topology.n == 1 and np.array_equal(topology.mixing_matrix(0), [[1.0]])
    with pytest.raises(DPDLError, match="topology 'central' is one node holding every record"):
        make_topology("central", 4)
    with pytest.raises(DPDLError, match="must be >= 2, got 1"):
        make_topology("ring", 1)


def test_central_dp_sgd_trains_the_pooled_records_with_dp_accountings_epsilon():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    torch.manual_seed(0)
    result = dpdl.train(torch.nn.Linear(4, 2), [(x, y)], topology="central", algorithm="const-d2p",
                        epsilon=1.0, calibrate="pld", batch_size=20, lr=0.5, steps=30,
                        eval_every=100, entropy="seed", seed=1)  # fmt: skip
    z = float(result.ledger.recorded_multipliers[0])
    event = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
        20 / 200, dp_accounting.GaussianDpEvent(z)), 30)
    accountant = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.REPLACE_ONE)  # the default relation
    expected = accountant.compose(event).get_epsilon(result.ledger.delta)
    assert result.epsilon == pytest.approx(expected, rel=1e-3) and result.epsilon <= 1.0 + 1e-9
    model = result.node_models[0]
    accuracy = (model(torch.as_tensor(x)).argmax(1).numpy() == y).mean()
    assert accuracy > 0.8  # a separable task: the one node learned it
