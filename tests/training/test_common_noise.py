"""experiment.common_noise (issue 43, research mode): arms that differ in a training setting
draw the same sampling and noise streams on purpose; without it they never do."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import dpdl
from dpdl.errors import DPDLError
from dpdl.experiments.config import parse_config

pytestmark = pytest.mark.usefixtures("one_thread")


def _step(lr: float, common: bool):
    """One private step of three nodes from one initial model: every node's move."""
    gen = torch.Generator().manual_seed(0)
    nodes = [(torch.randn(16, 4, generator=gen), torch.randint(0, 2, (16,), generator=gen))
             for _ in range(3)]  # fmt: skip
    torch.manual_seed(1)
    model = nn.Linear(4, 2)
    start = torch.cat([p.detach().flatten() for p in model.parameters()])
    result = dpdl.train(model, nodes, topology="ring", algorithm="const-d2p", epsilon=5.0,
                        delta=1e-4, steps=1, batch_size=4, lr=lr, eval_every=1,
                        eval_data=nodes[0], entropy="seed", seed=3, common_noise=common,
                        progress=False)  # fmt: skip
    moves = [torch.cat([p.detach().flatten() for p in m.parameters()]) - start
             for m in result.node_models]  # fmt: skip
    return torch.stack(moves), result.record


def test_shared_noise_makes_the_move_linear_in_the_step_size():
    """After one step z_i - x0 = -γ (P u)_i / w_i with u the clipped sum plus noise: with the
    same batches and noise, twice the step size moves every node exactly twice as far."""
    small, record = _step(0.05, common=True)
    large, _ = _step(0.10, common=True)
    torch.testing.assert_close(large, 2 * small, rtol=1e-5, atol=1e-7)
    assert record.common_noise is True and record.noise_entropy == "seed"
    # without it the two settings draw other streams: the moves are not proportional
    small, record = _step(0.05, common=False)
    large, _ = _step(0.10, common=False)
    assert not torch.allclose(large, 2 * small, rtol=1e-3, atol=1e-5)
    assert record.common_noise is None


def test_common_noise_needs_seeded_noise():
    with pytest.raises(DPDLError, match="common_noise = True shares seeded noise .* got entropy "
                                        "= 'os'"):  # fmt: skip
        dpdl.DecentralizedTrainer(nn.Linear(4, 2), [(torch.zeros(4, 4), torch.zeros(4).long())]
                                  * 2, steps=1, common_noise=True)  # fmt: skip
    with pytest.raises(DPDLError, match="common_noise = true .* needs entropy"):
        parse_config({"experiment": {"common_noise": True}})
    assert parse_config({"experiment": {"common_noise": True, "entropy": "seed"}}
                        ).experiment.common_noise  # fmt: skip
