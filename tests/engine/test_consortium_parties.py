"""Issue 39, as a consortium runs it: four parties as separate processes on loopback, each
with its own folder, certificate and key, train over mutual TLS and end where the simulator
does (seeded research noise); a party killed (SIGKILL) mid-run and restarted finishes the
same run, its ε counting every step it sent; with secret noise the restart is refused."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from tests.engine.consortium_helpers import write_consortium

from dpdl.engine.consortium.pki import provision
from dpdl.engine.consortium.settings import load_consortium
from dpdl.experiments.runner import run_experiment

# Multi-process runs share one pytest-xdist worker: never two of them at once on 2 cores.
pytestmark = pytest.mark.xdist_group("multi-process")

CONFIG = """
kind = "decentralized"
[experiment]
name = "consortium"
algorithms = ["dyn-d2p"]
seed = 3
entropy = "{entropy}"
[data]
dataset = "digits"
[model]
name = "logreg"
[topology]
name = "exp"
nodes = 8
[training]
steps = 6
batch_size = 4
lr = 0.3
eval_every = 3
[privacy]
epsilon = 2.0
delta = 1e-4
calibrate = "clt"
certified_accountant = "rdp"
"""
NUMERIC = ("test_loss", "test_accuracy", "node_accuracy_mean", "node_accuracy_worst",
           "epsilon_clt", "epsilon_certified")  # fmt: skip


def _env(**extra) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _rows(folder: Path) -> list[dict]:
    (results,) = folder.rglob("results.json")  # the finished run's folder
    with open(results.parent / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def simulator(tmp_path_factory):
    import tomllib

    out = tmp_path_factory.mktemp("simulator")
    run_experiment(tomllib.loads(CONFIG.format(entropy="seed")), out, progress=False)
    return out


@pytest.fixture(scope="module")
def simulator_rows(simulator):
    return _rows(simulator)


def _models(folder: Path) -> tuple[dict, dict]:
    (path,) = folder.rglob("models/*.pt")
    return torch.load(path, weights_only=True), json.loads(path.with_suffix(".json").read_text())


def _consortium(tmp_path: Path, entropy: str, timeout_s: float) -> tuple[Path, Path]:
    """Each party's own folder; the consortium file and the PKI of `dpdl consortium init`."""
    path = write_consortium(tmp_path, parties=4, nodes_each=2, timeout_s=timeout_s)
    provision(load_consortium(path), tmp_path / "pki")
    config = tmp_path / "run.toml"
    config.write_text(CONFIG.format(entropy=entropy))
    return path, config


def _start(tmp_path, consortium, config, party: str, **env) -> subprocess.Popen:
    folder = tmp_path / party
    folder.mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "dpdl", "run", str(config), "--consortium", str(consortium),
           "--party", party, "--output", str(folder), "--no-progress"]  # fmt: skip
    log = open(folder / "log.txt", "a")  # noqa: SIM115 -- closed with the process
    return subprocess.Popen(cmd, env=_env(**env), stdout=log, stderr=subprocess.STDOUT)


def _wait(procs: dict[str, subprocess.Popen], timeout_s: float = 240) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    try:
        return {name: p.wait(timeout=max(deadline - time.monotonic(), 1))
                for name, p in procs.items()}  # fmt: skip
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()


def _log(tmp_path, party: str) -> str:
    return (tmp_path / party / "log.txt").read_text()


def _killed_and_restarted(tmp_path, fault: str, entropy: str, timeout_s: float):
    """Start the 4 parties with ``fault`` (PARTY:STEP[:after-ledger]); once that party died
    of its SIGKILL, start it again (no fault); the exit statuses."""
    victim = fault.split(":")[0]
    consortium, config = _consortium(tmp_path, entropy, timeout_s)
    procs = {f"p{i}": _start(tmp_path, consortium, config, f"p{i}",
                             DPDL_CONSORTIUM_FAULT=fault) for i in range(4)}  # fmt: skip
    assert procs[victim].wait(timeout=180) == -9, _log(tmp_path, victim)
    procs[victim] = _start(tmp_path, consortium, config, victim)
    return _wait(procs)


def _check_equal(tmp_path, simulator_rows, parties) -> None:
    for party in parties:
        rows = _rows(tmp_path / party)
        assert [r["iteration"] for r in rows] == [r["iteration"] for r in simulator_rows]
        for got, want in zip(rows, simulator_rows, strict=True):
            for key in NUMERIC:
                np.testing.assert_allclose(float(got[key]), float(want[key]), rtol=1e-5,
                                           atol=1e-6, err_msg=f"{party} {key}")  # fmt: skip


def _ledger(tmp_path, party: str, *, finished: bool = False) -> list[dict]:
    (path,) = (tmp_path / party / "consortium").glob("*.sent.jsonl")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert (lines[-1] == {"finished": True}) == finished  # a clean end is marked
    return [line for line in lines if "step" in line]


@pytest.mark.parametrize("fault", [
    "p2:4",  # before its step 4: steps 0-3 sent
    pytest.param("p0:2:after-ledger", marks=pytest.mark.slow),  # step 2 recorded, not sent
    pytest.param("p3:5", marks=pytest.mark.slow),
    pytest.param("p1:0", marks=pytest.mark.slow),  # before anything was sent
    # every party killed at two points at least
    pytest.param("p0:5", marks=pytest.mark.slow),
    pytest.param("p1:3:after-ledger", marks=pytest.mark.slow),
    pytest.param("p2:1", marks=pytest.mark.slow),
    pytest.param("p3:2:after-ledger", marks=pytest.mark.slow),
])  # fmt: skip
def test_a_party_killed_mid_run_and_restarted_finishes_the_uninterrupted_run(
        tmp_path, simulator, simulator_rows, fault):  # fmt: skip
    statuses = _killed_and_restarted(tmp_path, fault, "seed", timeout_s=60)
    assert statuses == dict.fromkeys(statuses, 0), [_log(tmp_path, p)[-1500:] for p in statuses]
    # every party trained over mTLS to the simulator's numbers, the restarted one included
    _check_equal(tmp_path, simulator_rows, [f"p{i}" for i in range(4)])
    victim, step = fault.split(":")[0], int(fault.split(":")[1])
    # its ledger holds every step it sent, once: the ε it reports (the simulator's, above)
    # counts them all, as the restart re-sent the same bytes
    assert sorted({e["step"] for e in _ledger(tmp_path, victim, finished=True)}) == list(
        range(6))
    for party in statuses:  # clean ends: no traceback, no C++ log line (gRPC's E1203 ...)
        assert "Traceback" not in _log(tmp_path, party)
        assert not re.search(r"^[EWF]\d{4} ", _log(tmp_path, party), re.MULTILINE)
    log = _log(tmp_path, victim)
    resent = step + ("after-ledger" in fault)
    assert f"({resent} re-sent identically after a restart)" in log
    # each party wrote the trained models: the network average and its own nodes, with the
    # config and the ε beside them (the simulator's, which holds every node)
    want, want_about = _models(simulator)
    for i in range(4):
        got, about = _models(tmp_path / f"p{i}")
        assert sorted(got["nodes"]) == [str(2 * i), str(2 * i + 1)] == [str(n) for n in
                                                                        about["nodes"]]
        for name, tensor in want["average"].items():
            torch.testing.assert_close(got["average"][name], tensor, rtol=1e-5, atol=1e-6)
        for node, state in got["nodes"].items():
            for name, tensor in state.items():
                torch.testing.assert_close(tensor, want["nodes"][node][name], rtol=1e-5,
                                           atol=1e-6)  # fmt: skip
        assert about["epsilon_certified"] == pytest.approx(want_about["epsilon_certified"])
        assert about["config"]["experiment"]["runtime"] == "consortium"


# slow: the seeded kill above covers the replay, test_consortium.py's tests the kept stream
# roots, the ledger's refusal and the telling of why; here all of it with secret noise
@pytest.mark.slow
def test_with_secret_noise_a_restarted_party_draws_the_noise_it_sent_and_finishes(tmp_path):
    statuses = _killed_and_restarted(tmp_path, "p2:3", "os", timeout_s=60)
    assert statuses == dict.fromkeys(statuses, 0), [_log(tmp_path, p)[-1500:] for p in statuses]
    assert "(3 re-sent identically after a restart)" in _log(tmp_path, "p2")
    assert sorted({e["step"] for e in _ledger(tmp_path, "p2", finished=True)}) == list(range(6))
    assert not list((tmp_path / "p2" / "consortium").glob("*.keys"))  # removed at the end
    finals = {p: _rows(tmp_path / p)[-1] for p in statuses}  # one network, one average model
    assert len({(r["test_loss"], r["epsilon_certified"]) for r in finals.values()}) == 1


@pytest.mark.slow
def test_with_its_stream_keys_lost_a_restart_is_refused_and_the_others_name_it(tmp_path):
    consortium, config = _consortium(tmp_path, "os", timeout_s=8)
    procs = {f"p{i}": _start(tmp_path, consortium, config, f"p{i}",
                             DPDL_CONSORTIUM_FAULT="p2:3") for i in range(4)}  # fmt: skip
    assert procs["p2"].wait(timeout=180) == -9
    (keys,) = (tmp_path / "p2" / "consortium").glob("*.keys")
    for key in keys.iterdir():  # a disk lost: a restart would draw fresh noise
        key.unlink()
    procs["p2"] = _start(tmp_path, consortium, config, "p2")
    statuses = _wait(procs)
    log = _log(tmp_path, "p2")
    refusal = [line for line in log.splitlines() if "already left" in line]
    assert statuses["p2"] != 0 and len(refusal) == 1, log[-2000:]
    assert "is gone: refusing to draw fresh noise" in refusal[0]
    # what it sent before the kill stays in its ledger: nothing was overwritten
    assert sorted({e["step"] for e in _ledger(tmp_path, "p2")}) == [0, 1, 2]
    for party in ("p0", "p1", "p3"):  # every other party stops, naming p2 and why
        assert statuses[party] != 0
        (error,) = [line for line in _log(tmp_path, party).splitlines() if "error" in line]
        assert "party p2 (127.0.0.1:" in error, error
        assert "already left" in error or "down or unreachable" in error, error
