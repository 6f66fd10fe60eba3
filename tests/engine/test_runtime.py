"""The torch.distributed runtime: same metrics as the simulator, multi-machine rendezvous on
loopback, and a killed rank that stops the others instead of hanging."""

import csv
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpdl.experiments.runner import run_experiment

# Multi-process runs share one pytest-xdist worker: never two of them at once on 2 cores.
pytestmark = pytest.mark.xdist_group("multi-process")

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
# messages_per_node, bytes_per_node (issue 43): what the point-to-point mixer counted equals
# what the in-memory mixer counts
NUMERIC = ("test_loss", "test_accuracy", "node_accuracy_mean",
           "node_accuracy_worst", "epsilon_clt", "epsilon_certified", "messages_per_node",
           "bytes_per_node")  # fmt: skip


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


# R = 4 is covered by the two-machine test below (2 machines x 2 processes); R = 1 (slow) by
# R = 2's code path, which it runs with one block.
@pytest.mark.parametrize("procs", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_distributed_equals_simulator(tmp_path, config_file, simulator_metrics, procs):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dpdl", "run", str(config_file), "--output", str(out),
           "--no-progress", "--runtime", "distributed", "--procs", str(procs)]  # fmt: skip
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same(_metrics(out), simulator_metrics)
    # every node's own count, gathered over the processes into results.json
    (path,) = [p for p in out.rglob("results.json") if ".ranks" not in p.parts]
    sent = json.loads(path.read_text())["cells"][0]["communication"]
    assert len(sent["bytes_per_node"]) == 8 and min(sent["messages_per_node"]) > 0
    for key in ("messages_per_node", "bytes_per_node"):
        assert np.mean(sent[key]) == float(simulator_metrics[-1][key])


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow  # the runtime is test_distributed_equals_simulator's; here the rendezvous
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

    (run_dir,) = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for rank in (0, 1):  # every process keeps its own nodes' checkpoint
        assert (run_dir / "checkpoints" / f"dyn-d2p-default_seed3_eps2.rank{rank}.pt").is_file()
    assert not list(out.rglob(".ranks"))  # no scratch folders
    resume = [sys.executable, "-m", "dpdl", "run", "--resume", str(run_dir), "--no-progress",
              "--runtime", "distributed", "--procs", "2"]  # fmt: skip
    result = subprocess.run(resume, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same(_metrics(out), simulator_metrics)


# ------------------------------------------------------------------ each party its own data
PARTIES = """
kind = "decentralized"
[experiment]
name = "parties"
algorithms = ["dyn-d2p"]
seed = 3
entropy = "seed"
[data]
per_node = "{pattern}"
eval_file = "{eval}"
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
{extra}
[privacy]
epsilon = 2.0
delta = 1e-4
calibrate = "clt"
certified_accountant = "rdp"
"""


def _torchrun(*options: str) -> list[str]:
    """torchrun with 2 processes on one machine, a c10d rendezvous on loopback and a job id
    (the run folder keeps it across restarts)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
            "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
            "--rdzv-id", "job", *options]  # fmt: skip


def _party_files(tmp_path: Path) -> tuple[Path, Path]:
    """Digits split over 8 nodes, written twice: every node's file in all/, and each rank's
    nodes only in rank0/ (nodes 0-3) and rank1/ (nodes 4-7)."""
    from dpdl.data import load_dataset, partition

    data = load_dataset("digits", seed=0)
    parts = partition(data.y_train, 8, seed=0)
    for i, part in enumerate(parts):
        for folder in ("all", f"rank{i // 4}"):
            (tmp_path / folder).mkdir(exist_ok=True)
            np.savez(tmp_path / folder / f"node-{i}.npz", x=data.x_train[part],
                     y=data.y_train[part])  # fmt: skip
    np.savez(tmp_path / "eval.npz", x=data.x_test, y=data.y_test)
    return tmp_path / "all" / "node-{i}.npz", tmp_path / "eval.npz"


def _parties_config(tmp_path: Path, pattern, extra: str = "") -> Path:
    _, eval_file = _party_files(tmp_path)
    path = tmp_path / "parties.toml"
    path.write_text(PARTIES.format(pattern=pattern, eval=eval_file, extra=extra))
    return path


def test_each_rank_reads_only_its_own_nodes_files_and_equals_the_simulator(tmp_path):
    import tomllib

    all_nodes, _ = _party_files(tmp_path)
    reference = _parties_config(tmp_path, all_nodes)
    run_experiment(tomllib.loads(reference.read_text()), tmp_path / "sim", progress=False)
    # under torchrun, rank r reads rank{r}/node-{i}.npz: the other rank's files are absent
    own = _parties_config(tmp_path, str(tmp_path / "rank{rank}" / "node-{i}.npz"))
    cmd = [*_torchrun(), "-m", "dpdl", "run", str(own), "--output", str(tmp_path / "dist"),
           "--no-progress", "--runtime", "distributed"]  # fmt: skip
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same(_metrics(tmp_path / "dist"), _metrics(tmp_path / "sim"))
    assert not list((tmp_path / "dist").rglob(".ranks"))
    assert result.stdout.count("run folder:") == 1  # one voice


API_SCRIPT = """
import json, os, sys
import numpy as np, torch
import dpdl

rank, out = int(os.environ.get("RANK", "0")), sys.argv[1]
calls = []

def data(i):  # a party's own records: only ever asked for the nodes its process hosts
    calls.append(i)
    rng = np.random.default_rng(i)
    return rng.normal(size=(12, 4)).astype(np.float32), rng.integers(0, 3, size=12)

rng = np.random.default_rng(99)
torch.manual_seed(0)
result = dpdl.train(torch.nn.Linear(4, 3), data, nodes=6, topology="exp",
                    runtime=sys.argv[2], algorithm="const-d2p", epsilon=2.0, steps=6,
                    batch_size=2, lr=0.2, eval_every=3, entropy="seed",
                    eval_data=(rng.normal(size=(50, 4)).astype(np.float32),
                               rng.integers(0, 3, size=50)),
                    output_dir=out, gather_node_models=sys.argv[3] == "all",
                    checkpoint_every=2 if len(sys.argv) > 4 else None,
                    run_name=None if len(sys.argv) > 4 else "api")
with open(os.path.join(out, f"calls{rank}.json"), "w") as fh:
    json.dump({"calls": calls, "nodes": result.node_indices, "epsilon": result.epsilon,
               "history": result.history}, fh)
"""


def test_the_data_function_is_called_only_for_hosted_nodes(tmp_path):
    import json

    script = tmp_path / "train.py"
    script.write_text(API_SCRIPT)
    sim = subprocess.run([sys.executable, str(script), str(tmp_path / "sim"), "simulator",
                          "local"], env=_env(), capture_output=True, text=True, timeout=240)
    assert sim.returncode == 0, sim.stderr[-2000:]
    cmd = [*_torchrun(), str(script), str(tmp_path / "dist"), "distributed", "local"]
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    want = json.loads((tmp_path / "sim" / "calls0.json").read_text())
    assert want["calls"] == list(range(6)) and want["nodes"] == list(range(6))
    for rank, block in ((0, [0, 1, 2]), (1, [3, 4, 5])):
        got = json.loads((tmp_path / "dist" / f"calls{rank}.json").read_text())
        assert got["calls"] == block and got["nodes"] == block
        assert got["epsilon"] == want["epsilon"]
        for g, w in zip(got["history"], want["history"], strict=True):
            np.testing.assert_allclose(g["test_loss"], w["test_loss"], rtol=1e-5)
    # every node's model only when asked, and then on every rank
    cmd = [*_torchrun(), str(script), str(tmp_path / "all"), "distributed", "all"]
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / "all" / f"calls{rank}.json").read_text())
        assert got["nodes"] == list(range(6)) and got["calls"] == [[0, 1, 2], [3, 4, 5]][rank]


@pytest.mark.slow  # the same restart path as the API run's test below, from a config
def test_a_rank_killed_under_torchrun_max_restarts_resumes_by_itself(tmp_path, simulator_metrics):
    """kill -9 of rank 1 at step 3; torchrun restarts the job, which resumes from the
    processes' own step-2 checkpoints and ends with the uninterrupted (simulator) result."""
    config_file = tmp_path / "dist.toml"
    config_file.write_text(CONFIG.replace("eval_every = 4", "eval_every = 4\ncheckpoint_every = 2"))
    out = tmp_path / "out"
    cmd = [*_torchrun("--max-restarts", "1"), "-m", "dpdl", "run", str(config_file), "--output",
           str(out), "--no-progress", "--runtime", "distributed"]  # fmt: skip
    env = _env() | {"DPDL_FAULT_INJECT": "1:3"}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [p for p in out.iterdir() if p.is_dir()]
    assert len(runs) == 1  # the restarted job continued the same run folder
    _assert_same(_metrics(out), simulator_metrics)


def test_too_many_processes_are_refused_before_any_starts(tmp_path, config_file):
    cmd = [sys.executable, "-m", "dpdl", "run", str(config_file), "--output", str(tmp_path),
           "--no-progress", "--runtime", "distributed", "--procs", "9"]  # fmt: skip
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].endswith(
        "--procs 9 for 8 nodes: every process needs at least one node")
    assert not any(tmp_path.iterdir()) or not list(tmp_path.rglob("metrics.csv"))


def test_an_api_run_killed_under_torchrun_max_restarts_resumes_by_itself(tmp_path):
    import json

    script = tmp_path / "train.py"
    script.write_text(API_SCRIPT)
    sim = subprocess.run([sys.executable, str(script), str(tmp_path / "sim"), "simulator",
                          "local"], env=_env(), capture_output=True, text=True, timeout=240)
    assert sim.returncode == 0, sim.stderr[-2000:]
    cmd = [*_torchrun("--max-restarts", "1"), str(script), str(tmp_path / "dist"),
           "distributed", "local", "checkpoints"]  # fmt: skip
    env = _env() | {"DPDL_FAULT_INJECT": "1:3"}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    want = json.loads((tmp_path / "sim" / "calls0.json").read_text())
    got = json.loads((tmp_path / "dist" / "calls0.json").read_text())
    assert [r["iteration"] for r in got["history"]] == [0, 3, 6]
    for g, w in zip(got["history"], want["history"], strict=True):
        np.testing.assert_allclose(g["test_loss"], w["test_loss"], rtol=1e-5)
    assert got["epsilon"] == want["epsilon"]


# ~90 s on the shared 2-core machine: slow.  tests/training/test_node_eval.py covers the
# scoring in one process; the gather is node_accuracies' (_gather_nodes), tested above.
@pytest.mark.slow
def test_per_node_evaluation_is_the_same_in_the_distributed_runtime(tmp_path):
    """Each rank scores its own nodes on their own held-out records; the gathered per-node
    vectors equal the simulator's, node by node."""
    config = CONFIG.replace("eval_every = 4", "eval_every = 4\nnode_eval_share = 0.2")
    path = tmp_path / "node_eval.toml"
    path.write_text(config)
    finals = []
    for runtime in ("simulator", "distributed"):
        out = tmp_path / runtime
        cmd = [sys.executable, "-m", "dpdl", "run", str(path), "--output", str(out),
               "--no-progress", "--runtime", runtime]  # fmt: skip
        cmd += ["--procs", "2"] if runtime == "distributed" else []
        result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
        assert result.returncode == 0, result.stderr[-2000:]
        (results,) = [p for p in out.rglob("results.json") if ".ranks" not in p.parts]
        (cell,) = json.loads(results.read_text())["cells"]
        finals.append(cell)
    sim, dist = finals
    assert dist["node_sizes"] == sim["node_sizes"] and len(sim["node_sizes"]) == 8
    for key in ("node_local_accuracy", "node_local_loss"):
        assert len(dist["final"][key]) == 8
        np.testing.assert_allclose(dist["final"][key], sim["final"][key], rtol=1e-5, atol=1e-6)
