"""Secret randomness (issue: private by default): the sampling and noise streams come from OS
entropy, never reach an output file, survive a kill -9 through the checkpoint only, and every
(algorithm, epsilon) cell has its own; ``entropy = "seed"`` is the explicit reproducible mode."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from scipy import stats

from dpdl.algorithms import randomness
from dpdl.algorithms.dyn_d2p import (
    LocalStep,
    NodeRecords,
    StepArguments,
    local_update,
    make_node_generators,
)
from dpdl.algorithms.randomness import SecretStream
from dpdl.engine import checkpoint as checkpoints
from dpdl.engine.simulator import Simulator
from dpdl.errors import DPDLError
from dpdl.experiments import runner
from dpdl.experiments.config import parse_config
from dpdl.training import trainer


def config(**experiment) -> dict:
    return {
        "experiment": {"name": "secret", "algorithms": ["dyn-d2p@clt"], "seed": 0} | experiment,
        "data": {"dataset": "digits", "max_train_records": 240},
        "model": {"name": "logreg"},
        "topology": {"name": "exp", "nodes": 6},
        "training": {"steps": 10, "batch_size": 8, "lr": 0.5, "eval_every": 5},
        "privacy": {"epsilon": 2.0, "calibrate": "clt", "certified_accountant": "rdp"},
    }


def rows(run_dir):
    with open(run_dir / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_default_runs_draw_fresh_noise_and_seed_runs_repeat(tmp_path):
    assert parse_config(config()).experiment.entropy == "os"
    a = runner.run_experiment(config(), tmp_path, progress=False, run_name="a")
    runner.run_experiment(config(), tmp_path, progress=False, run_name="b")
    assert [r["test_loss"] for r in rows(tmp_path / "a")][1:] != [
        r["test_loss"] for r in rows(tmp_path / "b")
    ][1:]
    assert a["cells"][0]["noise_entropy"] == "os"
    seeded = config(entropy="seed")
    c = runner.run_experiment(seeded, tmp_path, progress=False, run_name="c")
    runner.run_experiment(seeded, tmp_path, progress=False, run_name="d")
    assert rows(tmp_path / "c") == rows(tmp_path / "d")
    assert c["cells"][0]["noise_entropy"] == "seed"


def test_no_output_file_holds_the_secret(tmp_path, monkeypatch, os_keys):
    drawn, keys = os_keys, []

    class Recording(Simulator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            keys.extend(bytes(g.get_state()[: randomness.KEY_BYTES].tolist())
                        for g in self.generators)  # fmt: skip

    monkeypatch.setattr(runner, "Simulator", Recording)
    cfg = config()
    cfg["experiment"]["algorithms"] = ["const-d2p@clt", "dyn-d2p@clt"]
    runner.run_experiment(cfg, tmp_path, progress=False, run_name="r")
    # one 256-bit OS key per node and cell, each the key of its stream
    assert len(keys) == 12 and sorted(keys) == sorted(drawn) and len(set(keys)) == 12
    needles = [k.hex() for k in keys] + [k.hex().upper() for k in keys]
    files = [p for p in (tmp_path / "r").rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"config.json", "config.toml", "metrics.csv", "results.json"}
    for path in files:
        raw = path.read_bytes()
        text = raw.decode("latin-1")
        assert not any(n in text for n in needles), f"{path.name} holds a secret"
        assert not any(k in raw for k in keys), f"{path.name} holds a secret key"


def test_cells_of_one_seed_draw_their_own_streams():
    def first_draws(entropy, settings):
        (g,) = make_node_generators(1, randomness.stream_root(entropy, 7, settings))
        return g.words(4)

    for entropy in ("seed", "os"):
        a = first_draws(entropy, {"algorithm": "const-d2p", "epsilon": 1.0})
        b = first_draws(entropy, {"algorithm": "const-d2p", "epsilon": 0.3})
        assert not np.array_equal(a, b)
    same = {"algorithm": "dyn-d2p", "epsilon": 1.0, "lr": 0.03}
    assert np.array_equal(first_draws("seed", same), first_draws("seed", dict(same)))
    assert not np.array_equal(first_draws("seed", same), first_draws("seed", same | {"lr": 0.06}))
    assert not np.array_equal(first_draws("os", same), first_draws("os", same))


def test_a_private_step_needs_explicit_positive_noise():
    n, J = 2, 4
    model = torch.nn.Linear(3, 2)
    params = {k: v.detach().unsqueeze(0).repeat(n, *[1] * v.dim()) for k, v in
              model.named_parameters()}  # fmt: skip
    records = NodeRecords(torch.randn(n, J, 3), torch.zeros(n, J, dtype=torch.int64),
                          torch.ones(n, J, dtype=torch.bool), make_node_generators(n, 0), 0.5)

    def step(**kw):
        return local_update(LocalStep(model), params, torch.ones(n, dtype=torch.float64),
                            records, StepArguments(private=True, clip=1.0, lr=0.1, **kw),
                            step=0)  # fmt: skip

    with pytest.raises(DPDLError, match="explicit noise std"):
        step()
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(DPDLError, match="sigma_k > 0"):
            step(sigma=bad)
    step(sigma=0.0, unsafe_zero_noise=True)  # labelled, for tests only


def test_streams_restore_exactly_and_the_removed_secure_noise_key_says_why(tmp_path):
    g = SecretStream()
    u = g.doubles(100_000)
    assert 0 < u.min() and u.max() <= 1 and stats.kstest(u, "uniform").pvalue > 1e-4
    # The state restores the stream exactly; a fresh key draws other numbers.
    state = g.get_state()
    ahead = g.words(10)
    g2 = SecretStream()
    g2.set_state(state)
    assert np.array_equal(g2.words(10), ahead)
    assert not np.array_equal(SecretStream().words(10), ahead)
    cfg = config()
    result = runner.run_experiment(cfg, tmp_path, progress=False, run_name="s")
    assert result["cells"][0]["noise_mechanism"] == "exact-gaussian-grid"
    cfg["privacy"]["secure_noise"] = True
    with pytest.raises(DPDLError, match="privacy.secure_noise: removed: every private step's "
                       "noise is now exact") as err:  # fmt: skip
        parse_config(cfg)
    assert "\n" not in str(err.value)


def test_kill_9_then_resume_uses_the_checkpointed_streams(tmp_path, monkeypatch):
    cfg = config()
    cfg["experiment"]["algorithms"] = ["const-d2p"]
    cfg["training"] |= {"steps": 300, "eval_every": 300, "checkpoint_every": 10}
    cfg["privacy"] = {"epsilon": 2.0, "calibrate": "clt", "certified_accountant": "rdp"}
    path = tmp_path / "cfg.toml"
    path.write_text(runner.to_toml(cfg))
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpdl", "run", str(path), "--output", str(tmp_path / "runs"),
         "--no-progress"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    ckpt = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list((tmp_path / "runs").glob("*/checkpoints/const-d2p-default_seed0_eps2.pt"))
        if found:
            try:
                if checkpoints.load(found[0])["engine"]["iteration"] >= 20:
                    ckpt = found[0]
                    break
            except DPDLError:
                pass  # caught between a write and its rename
        time.sleep(0.02)
    assert ckpt is not None and proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    run_dir = ckpt.parent.parent
    assert oct(ckpt.stat().st_mode & 0o777) == "0o600"  # secret material: owner only
    saved = checkpoints.load(ckpt)
    saved_states = saved["engine"]["generators"]
    saved_step = saved["engine"]["iteration"]

    restored = {}

    class Watching(Simulator):
        def step(self, args):
            if not restored:
                restored["step"] = self.iteration
                restored["states"] = [g.get_state() for g in self.generators]
            return super().step(args)

    monkeypatch.setattr(runner, "Simulator", Watching)
    results = runner.resume_run(run_dir, progress=False)
    assert restored["step"] == saved_step
    assert all(torch.equal(a, b) for a, b in zip(restored["states"], saved_states, strict=True))
    (cell,) = results["cells"]
    assert cell["status"] == "ok" and cell["steps_done"] == 300
    privacy = parse_config(cfg).privacy
    fresh = trainer.build_schedule(privacy, cfg_spec(), 2.0, 300, cell["sample_rate"])
    want = trainer.approve_schedule(privacy, fresh)
    for z in fresh.noise_multipliers:
        want.record_step(float(z))
    assert cell["ledger_epsilon_spent"] == pytest.approx(want.epsilon_spent(), rel=1e-9)
    assert json.loads((run_dir / "config.json").read_text())["experiment"]["entropy"] == "os"


def cfg_spec():
    from dpdl.training.settings import AlgorithmSpec

    return AlgorithmSpec.parse("const-d2p")


def test_node_streams_do_not_depend_on_the_block_or_on_earlier_calls():
    root = randomness.stream_root("seed", 5, {"algorithm": "dyn-d2p", "epsilon": 1.0})

    def keys(**block):
        return [g.get_state().tolist() for g in make_node_generators(6, root, **block)]

    whole = keys()
    assert keys() == whole  # same root, second call
    assert keys(first_node=2, count=3) == whole[2:5]
