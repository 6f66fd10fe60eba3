"""The trainer's parts: settings given as sections with keyword shortcuts over them, the step
loop and its hooks, and the run record (results.json's entry of one cell)."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import dpdl
from dpdl.algorithms.dyn_d2p import NonFiniteUpdate
from dpdl.errors import DPDLError
from dpdl.training.loop import RunState, run_steps
from dpdl.training.results import RunRecord
from dpdl.training.settings import PrivacySection, TrainingSection


def nodes_data(n=4, records=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(records, 4, generator=g), torch.randint(0, 3, (records,), generator=g))
            for _ in range(n)]  # fmt: skip


def linear():
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def trainer(**options):
    return dpdl.DecentralizedTrainer(linear(), nodes_data(), topology="ring", **options)


# ------------------------------------------------------------------ settings
def test_sections_give_the_same_settings_as_keywords():
    by_keyword = trainer(delta=1e-5, clip=0.5, rho_c=2.0, steps=3, batch_size=2, lr=0.2,
                         eval_every=2, eval_node_samples=5)  # fmt: skip
    privacy = PrivacySection(delta=1e-5, clip=0.5, rho_c=2.0)
    training = TrainingSection(steps=3, batch_size=2, lr=0.2, eval_every=2, eval_node_samples=5)
    for given in ({"privacy": privacy, "training": training},
                  {"privacy": privacy.model_dump(exclude={"epsilon"}),
                   "training": training.model_dump()}):  # fmt: skip
        by_section = trainer(**given)
        assert by_section.privacy == by_keyword.privacy
        assert by_section.training == by_keyword.training
        assert by_section.stream_settings() == by_keyword.stream_settings()


def test_a_shortcut_overrides_its_sections_field():
    t = trainer(privacy={"clip": 0.5, "delta": 1e-5}, clip=2.0,
                training=TrainingSection(epochs=1.0, batch_size=2), steps=4)  # fmt: skip
    assert (t.privacy.clip, t.privacy.delta) == (2.0, 1e-5)
    # steps replaces the section's epochs (a run has one or the other)
    assert (t.training.steps, t.training.epochs, t.steps) == (4, None, 4)
    assert t.training.batch_size == 2


def test_settings_refusals_are_one_line_errors():
    with pytest.raises(DPDLError, match="unknown trainer option.*rho_x"):
        trainer(steps=2, rho_x=2.0)
    with pytest.raises(DPDLError, match="target epsilon is the trainer's epsilon"):
        trainer(steps=2, privacy=PrivacySection(epsilon=3.0))
    with pytest.raises(DPDLError, match="invalid privacy settings: clip"):
        trainer(steps=2, privacy={"clip": -1.0})
    with pytest.raises(DPDLError, match="training settings must be a TrainingSection"):
        trainer(training=[("steps", 2)])


# ------------------------------------------------------------------ the loop
class _Plan:
    steps, private = 3, True

    def noise_multiplier(self, k):
        return 1.0 + k

    def step_arguments(self, k):
        return k


class _Engine:
    def __init__(self, log, fail_at=None):
        self.log, self.fail_at = log, fail_at

    def step(self, k):
        if k == self.fail_at:
            raise NonFiniteUpdate(node=0, step=k)
        self.log.append(("step", k))


class _Ledger:
    def __init__(self, log):
        self.log = log

    def record_step(self, z):
        self.log.append(("record", z))


class _Hook:
    def __init__(self, log):
        self.log = log

    def on_start(self, state):
        self.log.append(("start", state.done))

    def on_step(self, state):
        self.log.append(("hook", state.done))

    def on_end(self, state):
        self.log.append(("end", state.done))


def test_every_step_is_recorded_before_it_runs_and_hooks_follow_it():
    log = []
    state = RunState(_Engine(log), _Ledger(log), done=1)  # resumed after step 0
    assert run_steps(_Plan(), state, [_Hook(log)]) == ("ok", "")
    assert log == [("start", 1), ("record", 2.0), ("step", 1), ("hook", 2),
                   ("record", 3.0), ("step", 2), ("hook", 3), ("end", 3)]  # fmt: skip


def test_a_diverged_step_stays_recorded_and_the_hooks_end():
    log = []
    status, message = run_steps(_Plan(), RunState(_Engine(log, fail_at=1), _Ledger(log)),
                                [_Hook(log)])  # fmt: skip
    assert status == "diverged" and "node 0" in message
    assert log[-2:] == [("record", 2.0), ("end", 1)]


# ------------------------------------------------------------------ the record
def test_the_run_record_reads_back_what_results_json_holds(tmp_path):
    result = trainer(steps=3, batch_size=2, eval_every=2, eval_data=nodes_data(1)[0],
                     output_dir=tmp_path, run_name="r")  # fmt: skip
    result = result.fit()
    record = result.record
    assert isinstance(record, RunRecord)
    (cell,) = json.loads((tmp_path / "r" / "results.json").read_text())["cells"]
    assert list(cell) == list(record.to_dict(rows=False))
    assert RunRecord.from_dict(json.loads(json.dumps(record.to_dict(), default=str))).to_dict(
        rows=False) == cell | {"train_seconds": record.train_seconds}  # fmt: skip
    assert record["steps"] == record.steps == 3 and record["rows"] == result.history
    partial = RunRecord.from_dict({"algorithm": "netdp", "seed": 0, "other": 1})
    assert partial.status is None and partial.rows == ()
