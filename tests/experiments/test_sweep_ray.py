"""``dpdl sweep --executor ray`` on a real local Ray cluster (127.0.0.1, 2 CPUs), no mocks.

One cluster serves the whole module. Its workers import the same dpdl as this test and a
plugin experiment written here, which sleeps a set time and leaves a ``start-SEED-PID`` file
per attempt (so a test can find and kill the worker running a cell, and count attempts) and
an ``end-SEED-PID`` file when it finishes.
"""

import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import dpdl
from dpdl.cli import main
from dpdl.experiments.sweep import finished_cells, run_sweep

# Multi-process runs share one pytest-xdist worker: never two of them at once on 2 cores.
pytestmark = pytest.mark.xdist_group("multi-process")

PLUGIN = textwrap.dedent(
    """
    import os, time
    from pathlib import Path

    def run_experiment(config, output_dir, progress=True):
        test = config["test"]
        seed = config["experiment"]["seed"]
        log = Path(test["log_dir"])
        (log / f"start-{seed}-{os.getpid()}").write_text("")
        time.sleep(test["slow_seconds"] if seed in test["slow_seeds"] else 0.05)
        if seed == test.get("fail_seed"):
            raise ValueError(f"bad seed {seed}")
        out = output_dir / "run" / "out.txt"
        out.parent.mkdir()
        out.write_text(f"seed {seed} eps {config['privacy']['epsilon']}")
        (log / f"end-{seed}-{os.getpid()}").write_text("")
        return {"seed": seed, "out": str(out)}
    """
)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    ray = pytest.importorskip("ray")
    plugins = tmp_path_factory.mktemp("plugins")
    (plugins / "sweep_ray_plugins").mkdir()
    (plugins / "sweep_ray_plugins" / "__init__.py").write_text("")
    (plugins / "sweep_ray_plugins" / "sleepy.py").write_text(PLUGIN)
    # Workers (and a driver started as a subprocess) inherit this environment: the plugin and
    # the dpdl under test come first on their path.
    dpdl_src = str(Path(dpdl.__file__).parents[1])
    path = [str(plugins), dpdl_src, os.environ.get("PYTHONPATH", "")]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PYTHONPATH", os.pathsep.join(p for p in path if p))
        mp.syspath_prepend(str(plugins))
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            logging_level="warning",
        )
        try:
            yield ray.get_runtime_context().gcs_address
        finally:
            ray.shutdown()


def _sleepy(log_dir, seeds, *, slow_seeds=(), slow_seconds=3.0, fail_seed=None):
    log_dir.mkdir(exist_ok=True)
    test = {"log_dir": str(log_dir), "slow_seeds": list(slow_seeds), "slow_seconds": slow_seconds}
    if fail_seed is not None:
        test["fail_seed"] = fail_seed
    return {
        "kind": "sweep_ray_plugins.sleepy",
        "privacy": {"epsilon": 1.0},
        "experiment": {"seed": 0},
        "test": test,
        "sweep": {"workers": 2, "grid": {"experiment.seed": list(seeds)}},
    }


def _attempts(log_dir: Path, event: str, seed: int) -> list[int]:
    return sorted(int(p.name.rsplit("-", 1)[1]) for p in log_dir.glob(f"{event}-{seed}-*"))


def _kill_first_attempt(log_dir: Path, seed: int) -> threading.Thread:
    """Kill -9 the Ray worker process running ``seed``'s cell as soon as it has started."""

    def killer():
        deadline = time.time() + 120
        while not _attempts(log_dir, "start", seed) and time.time() < deadline:
            time.sleep(0.05)
        os.kill(_attempts(log_dir, "start", seed)[0], signal.SIGKILL)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    return thread


def _by_seed(sweep_dir: Path) -> dict[int, tuple[Path, dict]]:
    return {rec["overrides"]["experiment.seed"]: (d, rec) for d, rec in finished_cells(sweep_dir)}


class _Terminal(io.StringIO):
    """A stderr that says it is a terminal: the sweep draws its bar only on one."""

    def isatty(self) -> bool:
        return True


def test_ray_gives_the_same_cells_as_the_local_pool(ray_cluster, tmp_path, monkeypatch):
    config = {
        "kind": "decentralized",
        "experiment": {"algorithms": ["const-d2p"], "seed": 0, "entropy": "seed"},
        "topology": {"nodes": 4},
        "training": {
            "steps": 10,
            "batch_size": 8,
            "lr": 0.5,
            "eval_every": 5,
            "eval_train_samples": 100,
            "eval_node_samples": 100,
        },
        "privacy": {"epsilon": 1.0, "calibrate": "clt"},
        "sweep": {"workers": 2, "grid": {"experiment.seed": [0, 1]}},
    }
    local = run_sweep(config, tmp_path / "local", progress=False)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    remote = run_sweep(config, tmp_path / "ray", executor="ray")
    monkeypatch.undo()
    assert local == remote == {"cells": 2, "skipped": 0, "done": 2, "failed": {}}
    bar = terminal.getvalue()
    assert "2/2" in bar and "done=2, running=0, failed=0" in bar
    local_cells, ray_cells = _by_seed(tmp_path / "local"), _by_seed(tmp_path / "ray")
    assert set(local_cells) == set(ray_cells) == {0, 1}
    for seed in (0, 1):
        (local_dir, local_rec), (ray_dir, ray_rec) = local_cells[seed], ray_cells[seed]
        assert local_dir.name == ray_dir.name
        # The run's files came back from the worker; the noise is seeded, so they are equal.
        local_csv = next(local_dir.rglob("metrics.csv")).read_text()
        assert next(ray_dir.rglob("metrics.csv")).read_text() == local_csv
        assert len(local_csv.splitlines()) == 4  # header + iterations 0, 5, 10
        finals = [[c["final"] for c in rec["results"]["cells"]] for rec in (local_rec, ray_rec)]
        assert finals[0] == finals[1]
        # The run folder named in the record is the one in place, not the worker's scratch.
        for cell_dir, rec in ((local_dir, local_rec), (ray_dir, ray_rec)):
            run_dir = Path(rec["results"]["run_dir"])
            assert run_dir.parent == cell_dir and (run_dir / "metrics.csv").is_file()


def test_a_killed_worker_is_retried_and_the_sweep_completes(ray_cluster, tmp_path):
    log = tmp_path / "log"
    config = _sleepy(log, range(5), slow_seeds=[2], fail_seed=4)
    killer = _kill_first_attempt(log, 2)
    summary = run_sweep(config, tmp_path / "s", progress=False, executor="ray", ray_max_retries=2)
    killer.join()
    assert summary["done"] == 4
    assert list(summary["failed"].values()) == ["ValueError: bad seed 4"]
    first, second = _attempts(log, "start", 2)  # killed once, then run again to the end
    assert _attempts(log, "end", 2) in ([first], [second])
    assert len({*_attempts(log, "start", 2)}) == 2
    for seed in (0, 1, 3, 4):  # the others ran once; the experiment's own error is not retried
        assert len(_attempts(log, "start", seed)) == 1
    cells = _by_seed(tmp_path / "s")
    assert set(cells) == {0, 1, 2, 3}
    for seed, (cell_dir, record) in cells.items():
        out = Path(record["results"]["out"])
        assert out == cell_dir / "run" / "out.txt"
        assert out.read_text() == f"seed {seed} eps 1.0"
    assert not any(p.name.endswith(".partial") for p in (tmp_path / "s" / "cells").iterdir())


def test_a_cell_whose_worker_dies_past_the_retries_is_failed(ray_cluster, tmp_path):
    log = tmp_path / "log"
    killer = _kill_first_attempt(log, 1)
    summary = run_sweep(
        _sleepy(log, range(3), slow_seeds=[1]),
        tmp_path / "s",
        progress=False,
        executor="ray",
        ray_max_retries=0,
    )
    killer.join()
    assert summary["done"] == 2
    [(cell_id, error)] = summary["failed"].items()
    assert cell_id.startswith("seed=1_") and "died 1 time(s)" in error
    assert set(_by_seed(tmp_path / "s")) == {0, 2}
    assert len(_attempts(log, "start", 1)) == 1


def _ctrl_c_as_in_a_terminal() -> None:
    """The driver starts with SIGINT at its default, unblocked, as under a shell: an ignored
    or blocked SIGINT is inherited across exec, and the test process's may have been changed
    by whatever ran in it before (the full suite saw the driver finish all six cells)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_an_interrupted_driver_keeps_finished_cells_and_runs_the_rest(ray_cluster, tmp_path):
    log = tmp_path / "log"
    config = _sleepy(log, range(6), slow_seeds=[2, 3, 4, 5], slow_seconds=30.0)
    toml = "\n".join(
        [
            f'kind = "{config["kind"]}"',
            "[privacy]\nepsilon = 1.0",
            "[experiment]\nseed = 0",
            f'[test]\nlog_dir = "{log}"\nslow_seeds = [2, 3, 4, 5]\nslow_seconds = 30.0',
            '[sweep]\nworkers = 2\n[sweep.grid]\n"experiment.seed" = [0, 1, 2, 3, 4, 5]',
        ]
    )
    (tmp_path / "s.toml").write_text(toml)
    out = tmp_path / "s"
    driver = subprocess.Popen(
        [sys.executable, "-m", "dpdl", "sweep", str(tmp_path / "s.toml"), "--output", str(out),
         "--executor", "ray", "--ray-address", ray_cluster, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_ctrl_c_as_in_a_terminal,
    )  # fmt: skip
    deadline = time.time() + 120
    while len(list(finished_cells(out) if (out / "cells").is_dir() else [])) < 2:
        assert time.time() < deadline and driver.poll() is None, driver.communicate()[0]
        time.sleep(0.1)
    while not _attempts(log, "start", 2):  # a slow cell is running when the driver stops
        assert time.time() < deadline, driver.communicate()[0]
        time.sleep(0.1)
    driver.send_signal(signal.SIGINT)
    try:
        code = driver.wait(timeout=120)
    except subprocess.TimeoutExpired:
        driver.kill()
        raise AssertionError(f"the driver ignored Ctrl-C: {driver.communicate()[0]!r}") from None
    assert code == 130, driver.communicate()[0]
    assert b"dpdl sweep: interrupted" in driver.communicate()[0]
    kept = {seed: (d, (d / "cell.json").read_bytes()) for seed, (d, _) in _by_seed(out).items()}
    assert {0, 1} <= set(kept) and len(kept) < 6
    starts = {seed: _attempts(log, "start", seed) for seed in range(6)}

    config["test"]["slow_seconds"] = 0.05  # the rerun's cells are quick
    summary = run_sweep(config, out, progress=False, executor="ray")
    assert summary == {"cells": 6, "skipped": len(kept), "done": 6 - len(kept), "failed": {}}
    assert set(_by_seed(out)) == set(range(6))
    for seed, (cell_dir, content) in kept.items():  # finished cells kept, untouched, not rerun
        assert (cell_dir / "cell.json").read_bytes() == content
        assert _attempts(log, "start", seed) == starts[seed]


def test_the_ray_options_are_checked(ray_cluster, tmp_path, capsys):
    config = tmp_path / "s.toml"
    config.write_text('[experiment]\ndevice = "cuda:1"\n[sweep.grid]\n"experiment.seed" = [0]\n')
    base = ["sweep", str(config), "--output", str(tmp_path / "s"), "--no-progress"]
    assert main([*base, "--executor", "ray", "--ray-max-retries", "-1"]) == 2
    assert "--ray-max-retries must be an integer ≥ 0, got -1" in capsys.readouterr().err
    assert main([*base, "--ray-address", "auto"]) == 2
    assert "need --executor ray" in capsys.readouterr().err
    config.write_text("[training]\nsteps = 2\n" + config.read_text())
    assert main([*base, "--executor", "ray"]) == 2
    assert "set experiment.device = 'cuda'" in capsys.readouterr().err


def test_without_ray_the_executor_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    config = tmp_path / "s.toml"
    config.write_text('[training]\nsteps = 2\n[sweep.grid]\n"experiment.seed" = [0]\n')
    out = tmp_path / "s"
    assert main(["sweep", str(config), "--output", str(out), "--executor", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("--executor ray needs Ray: pip install -e '.[ray]'")
    assert len(err.splitlines()) == 1
    assert not out.exists()  # refused before the sweep folder is touched
