"""The trainer's grouped parameters (issue 40, item 5): evaluation, output and execution specs
beside the privacy and training sections, each field still a keyword of its own; settings
metadata on the sections' fields instead of parallel lists."""

from __future__ import annotations

import dataclasses
import inspect
import json

import numpy as np
import pytest
import torch

import dpdl
from dpdl.errors import DPDLError
from dpdl.training import settings
from dpdl.training.settings import PrivacySection, TrainingSection
from dpdl.training.specs import EvaluationSpec, ExecutionSpec, OutputSpec
from dpdl.training.trainer import _PROBLEM_KEYWORDS, DecentralizedTrainer


def _nodes(n=4, j=12, d=5, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(j, d)).astype(np.float32), rng.integers(0, 3, size=j))
            for _ in range(n)]  # fmt: skip


def _eval_data():
    rng = np.random.default_rng(9)
    return rng.normal(size=(30, 5)).astype(np.float32), rng.integers(0, 3, size=30)


def _linear():
    torch.manual_seed(0)
    return torch.nn.Linear(5, 3)


BASE = dict(algorithm="const-d2p", epsilon=2.0, calibrate="clt", certified_accountant="rdp",
            batch_size=3, lr=0.2, steps=4, eval_every=2)  # fmt: skip


def _same(a, b) -> None:
    assert json.dumps(a.history, default=str) == json.dumps(b.history, default=str)
    for x, y in zip(a.node_models, b.node_models, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(x.parameters(), y.parameters(), strict=True))


def test_the_trainer_takes_at_most_twelve_parameters():
    assert len(inspect.signature(DecentralizedTrainer.__init__).parameters) <= 12


def test_no_keyword_names_two_things():
    """Every keyword the trainer accepts sets exactly one field of one section or spec."""
    groups = [set(PrivacySection.model_fields), set(TrainingSection.model_fields),
              set(_PROBLEM_KEYWORDS)] + [
        {f.name for f in dataclasses.fields(spec)}
        for spec in (EvaluationSpec, OutputSpec, ExecutionSpec)]  # fmt: skip
    named = set(inspect.signature(DecentralizedTrainer.__init__).parameters)
    for i, group in enumerate(groups):
        assert not group & named - {"epsilon"}
        for other in groups[i + 1:]:
            assert not group & other


def test_specs_and_their_keywords_make_the_same_run(tmp_path):
    by_keyword = dpdl.train(_linear(), _nodes(), eval_data=_eval_data(), entropy="seed",
                            seed=5, output_dir=tmp_path, run_name="a", **BASE)  # fmt: skip
    by_spec = dpdl.train(
        _linear(), _nodes(), evaluation=EvaluationSpec(eval_data=_eval_data()),
        execution=ExecutionSpec(entropy="seed", seed=5),
        output=OutputSpec(output_dir=tmp_path, run_name="b"), **BASE,
    )  # fmt: skip
    by_dict = dpdl.train(_linear(), _nodes(), evaluation={"eval_data": _eval_data()},
                         execution={"entropy": "seed", "seed": 5}, **BASE)  # fmt: skip
    _same(by_keyword, by_spec)
    _same(by_keyword, by_dict)
    assert (tmp_path / "a" / "trainer.json").read_text() == (
        tmp_path / "b" / "trainer.json").read_text()  # fmt: skip


def test_a_keyword_overrides_its_specs_field_and_none_leaves_it():
    spec = ExecutionSpec(entropy="seed", seed=5)
    trainer = DecentralizedTrainer(_linear(), _nodes(), execution=spec, seed=7, **BASE)
    assert (trainer.seed, trainer.entropy) == (7, "seed")
    trainer = DecentralizedTrainer(_linear(), _nodes(), execution=spec, seed=None, **BASE)
    assert trainer.seed == 5
    assert spec.seed == 5  # frozen: the caller's spec is not changed


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"evaluation": {"eval_dta": 1}}, "unknown evaluation option.*eval_dta"),
        ({"output": 3}, r"output must be OutputSpec\(...\) or a dict of its fields, got int"),
        ({"execution": {"entropy": "dice"}}, "unknown entropy 'dice'"),
        ({"seed": -1}, "seed must be a non-negative integer"),
        ({"runtime": "mpi"}, "runtime must be one of"),
        ({"callbacks_on": "some"}, "callbacks_on must be 'main' or 'all'"),
        ({"callbacks": [1]}, "every callback must be a callable"),
        ({"resume": True}, "resume needs output_dir and the run_name"),
        ({"evaluaton_data": 1}, "unknown trainer option.*evaluaton_data"),
    ],
)  # fmt: skip
def test_bad_specs_are_one_line_errors(options, message):
    with pytest.raises(DPDLError, match=message):
        DecentralizedTrainer(_linear(), _nodes(), **BASE | options)


def test_the_settings_lists_derive_from_the_fields_metadata():
    """The lists the digests read (their values are those runs were always keyed with)."""
    assert set(settings.SHAPING_TRAINING) == {"steps", "epochs", "batch_size", "lr", "lr_decay",
                                              "sampling", "momentum", "weight_decay",
                                              "local_steps"}  # fmt: skip
    assert settings.REPORTING_PRIVACY == ("certified_accountant", "eval_blocks", "final_mode",
                                          "final_blocks")  # fmt: skip
    assert settings.LATER_SETTING_DEFAULTS == {
        "momentum": 0.0, "weight_decay": 0.0, "local_steps": 1, "node_eval_share": 0.0,
        "sampling": "uniform", "sample_rate": None}  # fmt: skip
    # a later setting's default is its field's: at it, the run is the run before it existed
    for name, value in settings.LATER_SETTING_DEFAULTS.items():
        assert TrainingSection.model_fields[name].default == value
