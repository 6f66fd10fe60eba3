"""A user's own model named in a config: registered, or by its import path, through
`dpdl run`, `dpdl sweep` and `dpdl report` (issue 27)."""

from __future__ import annotations

import csv
import json
import textwrap

import pytest
import torch

from dpdl.cli import main
from dpdl.errors import DPDLError
from dpdl.models import make_model, register_model

USER_MODULE = '''
from torch import nn


def tiny(input_shape, num_outputs, hidden=5):
    size = 1
    for s in input_shape:
        size *= s
    return nn.Sequential(nn.Flatten(), nn.Linear(size, hidden), nn.Tanh(),
                         nn.Linear(hidden, num_outputs))


def not_a_model(input_shape, num_outputs):
    return "a string"
'''


@pytest.fixture
def user_models(tmp_path, monkeypatch):
    (tmp_path / "mylab_models.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # for a sweep's spawned workers
    return "mylab_models"


def test_a_factory_by_import_path_gets_shape_outputs_options_and_seed(user_models):
    model = make_model(f"{user_models}:tiny", (1, 8, 8), 10, seed=3, hidden=7)
    assert model[1].in_features == 64 and model[1].out_features == 7
    assert model[3].out_features == 10
    again = make_model(f"{user_models}:tiny", (1, 8, 8), 10, seed=3, hidden=7)
    pairs = zip(model.parameters(), again.parameters(), strict=True)
    assert all(torch.equal(a, b) for a, b in pairs)


@pytest.mark.parametrize(
    ("name", "options", "needle"),
    [
        ("mylab_models:nope", {}, "cannot be loaded"),
        ("no_such_package.models:tiny", {}, "cannot be loaded"),
        ("mylab_models:not_a_model", {}, "not a torch.nn.Module"),
        ("mylab_models:tiny", {"width": 3}, "does not take option"),
        ("no-such-model", {}, "unknown model"),
    ],
)
def test_bad_model_names_are_one_line_errors(user_models, name, options, needle):
    with pytest.raises(DPDLError, match=needle):
        make_model(name, (1, 8, 8), 10, **options)


def test_register_model_and_refuse_shipped_names(user_models):
    import importlib

    register_model("my-tiny", importlib.import_module(user_models).tiny)
    assert make_model("my-tiny", (4,), 2)[1].in_features == 4
    with pytest.raises(DPDLError, match="shipped"):
        register_model("cnn", importlib.import_module(user_models).tiny)


CONFIG = """
kind = "decentralized"
[experiment]
name = "own-model"
algorithms = ["dyn-d2p@clt"]
entropy = "seed"
[data]
dataset = "digits"
max_train_records = 120
[model]
name = "mylab_models:tiny"
options = {{ hidden = 6 }}
[topology]
name = "ring"
nodes = 3
[training]
steps = 4
batch_size = 2
lr = 0.1
eval_every = 2
[privacy]
epsilon = 2.0
certified_accountant = "rdp"
{sweep}
"""


def test_a_users_model_runs_through_run_sweep_and_report(user_models, tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    cfg.write_text(CONFIG.format(sweep=""))
    assert main(["run", str(cfg), "--output", str(tmp_path / "runs"), "--no-progress"]) == 0
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    with open(run_dir / "metrics.csv", newline="") as fh:
        assert [int(r["iteration"]) for r in csv.DictReader(fh)] == [0, 2, 4]
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(CONFIG.format(sweep=textwrap.dedent("""
        [sweep]
        workers = 1
        [sweep.grid]
        "training.lr" = [0.1, 0.2]
        """)))
    out = tmp_path / "sweep"
    capsys.readouterr()
    assert main(["sweep", str(sweep), "--output", str(out), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["done"] == 2
    # the site's ledger: both cells on the same records, composed
    assert len(printed["site_ledger"]) == 1 and " 2 run(s)" in printed["site_ledger"][0]
    assert main(["report", str(out)]) == 0
    report = (out / "report" / "report.md").read_text()
    assert "dyn-d2p@clt" in report and "lr=0.1" in report and "lr=0.2" in report
