"""Checkpoints and --resume: a run interrupted mid-cell continues exactly where it stopped,
keeps the privacy already spent, and still refuses to exceed its ε."""

import csv
import json

import pytest

from dpdl.accounting.ledger import PrivacyLedger
from dpdl.cli import main
from dpdl.engine import checkpoint as checkpoints
from dpdl.engine.simulator import Simulator
from dpdl.errors import DPDLError, PrivacyBudgetExceeded
from dpdl.experiments import runner

CONFIG = {
    # Reproducible noise, so that a resumed run can be compared with an uninterrupted one.
    "experiment": {"name": "ckpt", "algorithms": ["sgp", "dyn-d2p"], "seed": 1, "entropy": "seed"},
    "data": {"dataset": "digits"},
    "model": {"name": "logreg"},
    "topology": {"name": "exp", "nodes": 6},
    "training": {"steps": 12, "batch_size": 4, "lr": 0.3, "eval_every": 4, "checkpoint_every": 3},
    "privacy": {"epsilon": 2.0, "calibrate": "clt", "certified_accountant": "rdp"},
}


class Crash(Exception):
    pass


def _crashing_simulator(at_step):
    class CrashingSimulator(Simulator):
        def step(self, args):
            if self.iteration == at_step and self.__class__.crash:
                raise Crash(f"simulated crash at step {at_step}")
            return super().step(args)

    CrashingSimulator.crash = True
    return CrashingSimulator


def _rows(run_dir):
    with open(run_dir / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("full")
    results = runner.run_experiment(CONFIG, out, progress=False, run_name="run")
    return results, _rows(out / "run")


def _interrupted_run(tmp_path, monkeypatch, at_step=7):
    """Crash inside the second (private) cell, after its checkpoint at step 6."""
    monkeypatch.setattr(runner, "Simulator", _crashing_simulator(at_step))
    sgp_done = {"n": 0}
    real_run_cell = runner.run_cell

    def run_cell(work, spec, eps, **kw):  # let the SGP cell finish, crash the private one
        factory = kw["simulator_factory"]
        factory.crash = spec.name != "sgp"
        sgp_done["n"] += spec.name == "sgp"
        return real_run_cell(work, spec, eps, **kw)

    monkeypatch.setattr(runner, "run_cell", run_cell)
    with pytest.raises(Crash):
        runner.run_experiment(CONFIG, tmp_path, progress=False, run_name="run")
    monkeypatch.undo()
    assert sgp_done["n"] == 1
    return tmp_path / "run"


def test_resume_continues_exactly_and_keeps_the_privacy_spent(tmp_path, monkeypatch, uninterrupted):
    full_results, full_rows = uninterrupted
    run_dir = _interrupted_run(tmp_path, monkeypatch)
    state = checkpoints.load(run_dir / "checkpoints" / "dyn-d2p-default_seed1_eps2.pt")
    assert state["engine"]["iteration"] == 6
    ledger = PrivacyLedger.from_json(state["ledger"])
    assert ledger.steps_taken == 6  # the privacy spent before the crash is in the checkpoint
    finished = json.loads((run_dir / "checkpoints" / "finished.json").read_text())
    assert list(finished) == ["sgp-default_seed1_epsnone"]

    results = runner.resume_run(run_dir, progress=False)
    assert _rows(run_dir) == full_rows  # every metric of every evaluation, bit for bit
    private = [c for c in results["cells"] if c["algorithm"] == "dyn-d2p"][0]
    want = [c for c in full_results["cells"] if c["algorithm"] == "dyn-d2p"][0]
    assert private["steps_done"] == 12
    assert private["ledger_epsilon_spent"] == pytest.approx(want["ledger_epsilon_spent"])
    assert not (run_dir / "checkpoints" / "dyn-d2p-default_seed1_eps2.pt").exists()


def test_resume_refuses_to_exceed_the_budget(tmp_path, monkeypatch):
    run_dir = _interrupted_run(tmp_path, monkeypatch)
    # The checkpointed ledger, not a fresh one, governs the resumed steps: make its approved
    # plan stricter than the schedule (as if the schedule code had changed to add less noise)
    # and the first resumed step is refused.
    path = run_dir / "checkpoints" / "dyn-d2p-default_seed1_eps2.pt"
    state = checkpoints.load(path)
    ledger = json.loads(state["ledger"])
    ledger["approved_plan"] = [[z * 1.5, n] for z, n in ledger["approved_plan"]]
    state["ledger"] = json.dumps(ledger)
    checkpoints.save_atomic(path, {k: v for k, v in state.items() if k != "version"})
    with pytest.raises(PrivacyBudgetExceeded, match="below the planned"):
        runner.resume_run(run_dir, progress=False)


def test_a_changed_config_is_not_resumed(tmp_path, monkeypatch):
    run_dir = _interrupted_run(tmp_path, monkeypatch)
    config = json.loads((run_dir / "config.json").read_text())
    config["privacy"]["epsilon"] = 20.0  # less noise: would orphan the privacy already spent
    (run_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(DPDLError, match="changed since the run started"):
        runner.resume_run(run_dir, progress=False)


def test_resume_errors(tmp_path, monkeypatch, capsys):
    with pytest.raises(DPDLError, match="not a dpdl run folder"):
        runner.resume_run(tmp_path / "nothing")
    run_dir = _interrupted_run(tmp_path, monkeypatch)
    with pytest.raises(DPDLError, match="cannot change steps"):
        runner.resume_run(run_dir, steps=50)
    assert main(["run", "--resume", str(run_dir), "--preset", "default"]) == 2
    assert "give no config" in capsys.readouterr().err
    (run_dir / "checkpoints" / "config.sha256").unlink()
    with pytest.raises(DPDLError, match="was not checkpointed"):
        runner.resume_run(run_dir)


def test_a_corrupt_checkpoint_is_refused(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(DPDLError, match="cannot be read"):
        checkpoints.load(path)
