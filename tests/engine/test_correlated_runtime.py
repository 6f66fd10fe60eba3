"""Correlated noise in the distributed runtime (issue 41): two processes, each holding its own
nodes' X25519 private keys, exchange only public keys at start-up (and, for zero-sum noise,
the shares of the edges that cross them, point to point) and release the same messages as the
simulator (seeded), which differ from independent noise's."""

import subprocess
import sys
import tomllib

import numpy as np
import pytest
from tests.engine.test_runtime import CONFIG, _assert_same, _env, _metrics

from dpdl.experiments.runner import run_experiment

pytestmark = pytest.mark.xdist_group("multi-process")


def correlated_config(correlation: str = "pairwise", factor: float = 2.0) -> str:
    """The runtime tests' config with the nodes' noise correlated."""
    return CONFIG + f'correlation = "{correlation}"\ncorrelation_factor = {factor}\n'


DECOR = correlated_config()


@pytest.mark.slow  # 90 s each; the blocks tests of test_correlated and test_p2p_mixer cover
# the hosting-independence of both correlations fast
@pytest.mark.parametrize("correlation", ["pairwise", "neighbourhood-zero-sum"])
def test_distributed_correlated_noise_equals_the_simulator_and_differs_from_independent(
        tmp_path, correlation):  # fmt: skip
    correlated = correlated_config(correlation)
    run_experiment(tomllib.loads(correlated), tmp_path / "sim", progress=False)
    run_experiment(tomllib.loads(CONFIG), tmp_path / "independent", progress=False)
    simulator, independent = _metrics(tmp_path / "sim"), _metrics(tmp_path / "independent")
    config = tmp_path / "decor.toml"
    config.write_text(correlated)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dpdl", "run", str(config), "--output", str(out),
           "--no-progress", "--runtime", "distributed", "--procs", "2"]  # fmt: skip
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same(_metrics(out), simulator)
    losses = [[float(row["test_loss"]) for row in rows] for rows in (simulator, independent)]
    assert not np.allclose(*losses, rtol=1e-3)
    assert not any("pairwise" in p.name for p in out.rglob("*"))


@pytest.mark.slow  # 60 s; the simulator side is test_correlation's muffliato test
@pytest.mark.parametrize("correlation", ["independent", "neighbourhood-zero-sum"])
def test_distributed_noise_once_then_r_rounds_equals_the_simulator(tmp_path, monkeypatch,
                                                                    correlation):  # fmt: skip
    """Muffliato (noise once, then R = 3 rounds: the example plugin) in two processes, with
    independent and with zero-sum noise, releases what the simulator does (seeded)."""
    from pathlib import Path

    from dpdl.algorithms import registry

    plugin = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "muffliato.py"
    monkeypatch.setenv(registry.PLUGINS_VARIABLE, str(plugin))
    registry.load_plugins()
    text = CONFIG.replace('algorithms = ["dyn-d2p"]', 'algorithms = ["muffliato(rounds=3)"]')
    assert "muffliato" in text
    if correlation != "independent":
        text += f'correlation = "{correlation}"\ncorrelation_factor = 2.0\n'
    run_experiment(tomllib.loads(text), tmp_path / "sim", progress=False)
    config = tmp_path / "muffliato.toml"
    config.write_text(text)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "dpdl", "run", str(config), "--output", str(out),
           "--no-progress", "--runtime", "distributed", "--procs", "2"]  # fmt: skip
    env = _env() | {registry.PLUGINS_VARIABLE: str(plugin)}
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    _assert_same(_metrics(out), _metrics(tmp_path / "sim"))
