"""training.momentum, weight_decay and local_steps through the trainer (MATH.md §4): checked
before anything is written, accounted for every step, resumable to the bit, and absent from
every digest while at their defaults."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import dpdl
from dpdl.engine import Simulator
from dpdl.errors import DPDLError


def _nodes(n=4, j=16, d=6, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(j, d)).astype(np.float32), rng.integers(0, 3, size=j))
            for _ in range(n)]  # fmt: skip


def _linear(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(6, 3)


def _eval_data():
    rng = np.random.default_rng(9)
    return rng.normal(size=(40, 6)).astype(np.float32), rng.integers(0, 3, size=40)


BASE = dict(algorithm="const-d2p", epsilon=2.0, calibrate="clt", certified_accountant="rdp",
            batch_size=4, lr=0.2, entropy="seed", seed=3)  # fmt: skip


@pytest.mark.parametrize(
    ("option", "value"),
    [("momentum", 1.0), ("momentum", -0.1), ("weight_decay", -1), ("local_steps", 0),
     ("local_steps", 1.5)],
)  # fmt: skip
def test_bad_optimiser_settings_are_one_line_errors_before_anything_is_written(
    tmp_path, option, value
):
    with pytest.raises(DPDLError, match=f"training.*{option}") as excinfo:
        dpdl.train(_linear(), _nodes(), steps=3, output_dir=tmp_path, run_name="r",
                   **BASE | {option: value})  # fmt: skip
    assert "\n" not in str(excinfo.value)
    assert not any(tmp_path.iterdir())
    with pytest.raises(DPDLError, match=f"training settings: {option}"):  # the [training] table
        dpdl.DecentralizedTrainer(_linear(), _nodes(), training={"steps": 3, option: value},
                                  **BASE)  # fmt: skip


def test_every_step_local_or_not_is_in_the_ledger():
    """K = 7 steps with H = 3: gossip after steps 2, 5 and the last, 6; the ledger holds 7."""
    mixed = []

    class Watching(Simulator):
        def step(self, args):  # the loop hands each step one StepArguments
            mixed.append(args.mix)
            return super().step(args)

    result = dpdl.train(_linear(), _nodes(), steps=7, local_steps=3, eval_every=50,
                        engine_factory=Watching, **BASE)  # fmt: skip
    assert result.status == "ok"
    assert mixed == [False, False, True, False, False, True, True]
    assert result.ledger.steps_taken == 7 and result.record.steps_done == 7
    # the epsilon spent is that of 7 subsampled Gaussian steps, as without local steps
    plain = dpdl.train(_linear(), _nodes(), steps=7, eval_every=50, **BASE)
    assert result.epsilon == plain.epsilon


def test_the_settings_enter_the_digests_only_when_not_at_their_defaults():
    def trainer(**options):
        return dpdl.DecentralizedTrainer(_linear(), _nodes(), steps=4, **BASE | options)

    default, explicit = trainer(), trainer(momentum=0.0, weight_decay=0.0, local_steps=1)
    for t in (default, explicit):
        assert set(t.stream_settings()["training"]) == {"steps", "epochs", "batch_size", "lr",
                                                        "lr_decay"}  # fmt: skip
        assert not {"momentum", "weight_decay", "local_steps"} & set(t.describe()["training"])
    assert explicit.run_digest() == default.run_digest()
    digests = {default.run_digest()}
    for option, value in (("momentum", 0.9), ("weight_decay", 1e-3), ("local_steps", 2)):
        t = trainer(**{option: value})
        assert t.stream_settings()["training"][option] == value
        digests.add(t.run_digest())
    assert len(digests) == 4  # other settings, other noise and checkpoints


def test_a_run_with_momentum_resumes_bit_identically(tmp_path):
    nodes, settings = _nodes(), BASE | dict(
        momentum=0.9, weight_decay=1e-3, local_steps=2, steps=12, eval_every=4,
        checkpoint_every=3, eval_data=_eval_data(), run_name="r",
    )  # fmt: skip
    full = dpdl.train(_linear(), nodes, output_dir=tmp_path / "full", **settings)

    class Crash(Exception):
        pass

    def crash_at_8(evaluation):
        if evaluation.iteration == 8:
            raise Crash

    with pytest.raises(Crash):  # after the checkpoint at step 6, with m != 0 in it
        dpdl.train(_linear(), nodes, output_dir=tmp_path / "cut", callbacks=[crash_at_8],
                   **settings)  # fmt: skip
    resumed = dpdl.train(_linear(), nodes, output_dir=tmp_path / "cut", resume=True, **settings)
    assert json.dumps(resumed.history) == json.dumps(full.history)
    assert resumed.ledger.steps_taken == 12
    for a, b in zip(resumed.node_models, full.node_models, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(),
                                                     strict=True))  # fmt: skip
    with pytest.raises(DPDLError, match="other settings"):
        dpdl.train(_linear(), nodes, output_dir=tmp_path / "cut", resume=True,
                   **settings | {"momentum": 0.5})  # fmt: skip
