"""The torch.distributed runtime: same metrics as the simulator, multi-machine rendezvous on
loopback, and a killed rank that stops the others instead of hanging."""

import csv
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpdl.experiments.runner import run_experiment

CONFIG = """
kind = "decentralized"
[experiment]
name = "dist"
algorithms = ["dyn-d2p"]
seed = 3
entropy = "seed"
[data]
dataset = "digits"
[model]
name = "logreg"
[topology]
name = "exp"
nodes = 8
[training]
steps = 8
batch_size = 4
lr = 0.3
eval_every = 4
[privacy]
epsilon = 2.0
delta = 1e-4
calibrate = "clt"
certified_accountant = "rdp"
"""
NUMERIC = ("test_loss", "test_accuracy", "node_accuracy_mean",
           "node_accuracy_worst", "epsilon_clt", "epsilon_certified")  # fmt: skip


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", DPDL_DIST_TIMEOUT="30")
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _metrics(run_root: Path) -> list[dict]:
    (path,) = [p for p in run_root.rglob("metrics.csv") if ".ranks" not in p.parts]
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _assert_same(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want) > 1
    for g, w in zip(got, want, strict=True):
        assert g["iteration"] == w["iteration"]
        for key in NUMERIC:
            np.testing.assert_allclose(float(g[key]), float(w[key]), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def simulator_metrics(tmp_path_factory):
    import tomllib

    out = tmp_path_factory.mktemp("sim")
    run_experiment(tomllib.loads(CONFIG), out, progress=False)
    return _metrics(out)


@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "dist.toml"
    path.write_text(CONFIG)
    return path


# R = 4 is covered by the two-machine test below (2 machines x 2 processes).
@pytest.mark.parametrize("procs", [1, 2])
def test_distributed_equals_simulator(tmp_path, config_file, simulator_metrics, procs):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dpdl", "run", str(config_file), "--output", str(out),
           "--no-progress", "--runtime", "distributed", "--procs", str(procs)]  # fmt: skip
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same(_metrics(out), simulator_metrics)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_torchrun_machines_on_loopback(tmp_path, config_file, simulator_metrics):
    """Two torchrun invocations acting as two machines (--nnodes 2), c10d rendezvous."""
    port = _free_port()
    out = tmp_path / "out"
    procs = []
    for node_rank in (0, 1):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
               "--node-rank", str(node_rank), "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "dpdl", "run", str(config_file),
               "--output", str(out), "--no-progress", "--runtime", "distributed"]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))  # fmt: skip
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(log[-1500:] for log in logs)
    _assert_same(_metrics(out), simulator_metrics)


def test_a_killed_rank_stops_the_others_and_the_run_resumes(tmp_path, simulator_metrics):
    """Rank 1 of 2 dies at step 3: rank 0 stops with a clear error (not a hang); the run then
    resumes from its step-2 checkpoint and ends with exactly the simulator's metrics."""
    config_file = tmp_path / "dist.toml"
    config_file.write_text(CONFIG.replace("eval_every = 4", "eval_every = 4\ncheckpoint_every = 2"))
    out = tmp_path / "out"
    env = _env() | {"DPDL_FAULT_INJECT": "1:3"}
    cmd = [sys.executable, "-m", "dpdl", "run", str(config_file), "--output", str(out),
           "--no-progress", "--runtime", "distributed", "--procs", "2"]  # fmt: skip
    start = time.monotonic()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    elapsed = time.monotonic() - start
    assert result.returncode != 0
    assert "process 1 of 2 exited with status 17" in result.stderr
    # The surviving rank notices by itself (not only through the launcher's kill).
    assert "point-to-point exchange at step 3 failed" in result.stderr
    assert "Traceback" not in result.stderr
    assert elapsed < 120

    (run_dir,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    assert (run_dir / "checkpoints" / "dyn-d2p-default_seed3_eps2.pt").is_file()
    resume = [sys.executable, "-m", "dpdl", "run", "--resume", str(run_dir), "--no-progress",
              "--runtime", "distributed", "--procs", "2"]  # fmt: skip
    result = subprocess.run(resume, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same(_metrics(out), simulator_metrics)
