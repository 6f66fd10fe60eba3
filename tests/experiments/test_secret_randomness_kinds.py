"""Secret randomness in the numpy kinds (linreg, netdp-logreg, fdp-random-walk) and their
algorithms: OS entropy by default and never written out, ``entropy = "seed"`` reproducible and
recorded, one stream per cell, and no private call without noise."""

from __future__ import annotations

import copy
import math

import networkx as nx
import numpy as np
import pytest

from dpdl.algorithms import randomness
from dpdl.cli import main
from dpdl.errors import DPDLError
from dpdl.experiments.registry import experiment_module, validate_experiment_config
from dpdl.extensions.fdp.decor import RunOptions, run_decor
from dpdl.extensions.linreg.accounting import PowerDecay
from dpdl.extensions.linreg.algorithm import Ball, LocalProblems, run_linreg
from dpdl.extensions.netdp import algorithm as tk

CONFIGS = {
    "linreg": {
        "kind": "linreg",
        "experiment": {"name": "secret", "seeds": [0]},
        "data": {"dataset": "diabetes", "nodes": 10},
        "algorithm": {"steps": 60, "record_every": 20},
        "privacy": {"epsilons": [1e6], "include_non_private": True},
    },
    "netdp-logreg": {
        "kind": "netdp-logreg",
        "experiment": {"name": "secret", "seeds": [0]},
        "algorithm": {"steps": 60, "eval_every": 30},
        "privacy": {"epsilons": [10.0], "approaches": ["local", "network"],
                    "include_non_private": True},
    },
    "fdp-random-walk": {
        "kind": "fdp-random-walk",
        "experiment": {"name": "secret", "seeds": [0]},
        "data": {"dataset": "breast-cancer", "nodes": 8},
        "graph": {"topology": "hypercube"},
        "privacy": {"epsilons": [4.0], "steps": 40, "accountants": ["local"]},
        "train": {"lr": 0.05, "batch_size": 8, "eval_every": 20, "include_non_private": True},
        "decor": {"enabled": True, "steps": 10, "sigma_cor": 5.0, "lr": 0.01},
    },
}
# The file whose numbers depend on the noise, and the (cell) streams one seed draws:
# linreg: eps and non-private; netdp: local, network, non-private;
# fdp: random walk (local, non-private) and DECOR (rdp-simple, fdp).
NOISY_FILE = {"linreg": "test_mse.csv", "netdp-logreg": "metrics.csv",
              "fdp-random-walk": "metrics.csv"}  # fmt: skip
CELLS = {"linreg": 2, "netdp-logreg": 3, "fdp-random-walk": 4}


def run(kind: str, out, entropy: str | None = None) -> dict:
    cfg = copy.deepcopy(CONFIGS[kind])
    if entropy is not None:
        cfg["experiment"]["entropy"] = entropy
    return experiment_module(kind).run_experiment(cfg, out, progress=False)


def run_files(results: dict) -> dict[str, bytes]:
    from pathlib import Path

    folder = Path(results["run_dir"])
    return {p.name: p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def entropies(results: dict) -> set[str]:
    cells = results.get("cells") or results["table"]
    return {c["noise_entropy"] for c in cells}


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_default_runs_draw_fresh_secret_noise_that_no_file_holds(kind, tmp_path, os_keys):
    drawn = os_keys
    validate_experiment_config(CONFIGS[kind])
    a = run(kind, tmp_path / "a")
    b = run(kind, tmp_path / "b")
    assert len(drawn) == 2 * CELLS[kind]  # one 256-bit key per cell and run
    assert len(set(drawn)) == len(drawn)
    assert entropies(a) == entropies(b) == {"os"} and a["noise_entropy"] == "os"
    files_a, files_b = run_files(a), run_files(b)
    assert files_a[NOISY_FILE[kind]] != files_b[NOISY_FILE[kind]]
    if kind == "linreg":  # its own report marks only reproducible noise
        assert b"entropy = seed" not in files_a["final.md"]
    needles = [k.hex() for k in drawn] + [str(int.from_bytes(k, "little")) for k in drawn]
    for name, content in [*files_a.items(), *files_b.items()]:
        text = content.decode("latin-1")
        assert not any(n in text for n in needles), f"{name} holds a secret"
        assert not any(k in content for k in drawn), f"{name} holds a secret key"


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_seed_runs_repeat_and_every_cell_has_its_own_stream(kind, tmp_path, monkeypatch):
    first_draws = []
    real = randomness.numpy_secret_rng

    def spying(seed, entropy, cell=""):
        rng = real(seed, entropy, cell)
        first_draws.append(tuple(copy.deepcopy(rng).random(4)))
        return rng

    monkeypatch.setattr(randomness, "numpy_secret_rng", spying)
    a = run(kind, tmp_path / "a", entropy="seed")
    b = run(kind, tmp_path / "b", entropy="seed")
    assert entropies(a) == {"seed"} and a["noise_entropy"] == "seed"
    files_a, files_b = run_files(a), run_files(b)
    assert files_a[NOISY_FILE[kind]] == files_b[NOISY_FILE[kind]]
    if kind == "linreg":
        assert "reproducible noise (entropy = seed)" in files_a["final.md"].decode()
    cells = CELLS[kind]
    assert first_draws[:cells] == first_draws[cells:]  # the same streams, run after run
    assert len(set(first_draws[:cells])) == cells  # but no two cells share one


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_run_flags_set_the_entropy(kind):
    module = experiment_module(kind)
    cfg = module.apply_overrides(CONFIGS[kind], entropy="seed")
    assert cfg["experiment"]["entropy"] == "seed"
    validate_experiment_config(cfg)
    bad = copy.deepcopy(CONFIGS[kind])
    bad["experiment"]["entropy"] = "time"
    with pytest.raises(DPDLError, match="experiment.entropy"):
        validate_experiment_config(bad)


def test_dpdl_run_warns_once_for_seed_entropy(tmp_path, capsys):
    from dpdl.experiments.runner import to_toml

    toml = tmp_path / "linreg.toml"
    toml.write_text(to_toml(CONFIGS["linreg"]))
    out = tmp_path / "runs"
    assert main(["run", str(toml), "--output", str(out), "--no-progress", "--entropy",
                 "seed"]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert err.count("warning: entropy = seed") == 1 and err.count("\n") == 1
    assert main(["run", str(toml), "--output", str(out), "--no-progress"]) == 0
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_dpdl_sweep_takes_the_noise_flags_by_the_kinds_rules(kind, tmp_path, capsys):
    # The sweep routes --entropy through the kind's own apply_overrides, as `dpdl run` does:
    # not a blind key that only one kind knows.
    import json

    from dpdl.experiments.runner import to_toml

    config = {**copy.deepcopy(CONFIGS[kind]), "sweep": {"grid": {"experiment.name": ["a"]}}}
    path = tmp_path / "sweep.toml"
    path.write_text(to_toml(config))
    out = tmp_path / "s"
    assert main(["sweep", str(path), "--output", str(out), "--entropy", "seed",
                 "--no-progress"]) == 0  # fmt: skip
    (cell,) = (out / "cells").iterdir()
    (config_file,) = cell.rglob("config.json")
    assert json.loads(config_file.read_text())["experiment"]["entropy"] == "seed"


# ------------------------------------------------------------------ the library functions
def _walk_sgd(**kwargs):
    walk = tk.sample_random_walk(3, 50, seed=0)
    return tk.random_walk_sgd(lambda w, u: w - 1.0, np.zeros(2), walk, lr=0.1, clip=1.0, n=3,
                              **kwargs)


def _decor(*, sigma, seed, unsafe_zero_noise=False):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(4, 10, 3)), rng.integers(0, 2, size=(4, 10))
    w = nx.to_numpy_array(nx.cycle_graph(4)) / 3 + np.eye(4) / 3
    return run_decor(w, x, y, num_classes=2, steps=3, lr=0.1, clip=1.0, sigma_cor=1.0,
                     batch_size=2, sigma=sigma,
                     options=RunOptions(seed=seed, unsafe_zero_noise=unsafe_zero_noise))


@pytest.mark.parametrize("call", [_walk_sgd, _decor])
def test_a_private_call_needs_explicit_positive_noise(call):
    for bad in (0.0, -1.0, math.nan, math.inf, None):
        with pytest.raises(DPDLError, match="noise std"):
            call(sigma=bad, seed=0)
    call(sigma=0.0, unsafe_zero_noise=True, seed=0)  # labelled: not private


@pytest.mark.parametrize(
    "call",
    [
        lambda s: tk.ring_summation(np.ones((2, 4)), 1.0, seed=s).estimate,
        lambda s: tk.random_walk_summation(np.ones(4), 20, 1.0, seed=s).estimate,
        lambda s: tk.sample_random_walk(5, 20, seed=s),
        lambda s: _walk_sgd(sigma=1.0, seed=s).weights,
        lambda s: _decor(sigma=1.0, seed=s).theta,
    ],
)
def test_library_noise_is_secret_by_default_and_takes_a_stream(call):
    assert not np.array_equal(call(None), call(None))  # OS entropy: fresh every call
    g = np.random.default_rng(np.random.SeedSequence(5, spawn_key=(1,)))
    same = copy.deepcopy(g)
    np.testing.assert_array_equal(call(g), call(same))  # a given stream is used as is
    np.testing.assert_array_equal(call(np.random.SeedSequence(9)), call(9))


def test_linreg_refuses_a_private_replica_without_noise():
    rng = np.random.default_rng(0)
    problems = LocalProblems.from_parts([rng.normal(size=(6, 2)) for _ in range(3)],
                                        [rng.normal(size=6) for _ in range(3)])
    w = np.full((3, 3), 1 / 3)
    kw = dict(steps=5, alpha=PowerDecay(0.1, 1.0, 0.5), domain=Ball(2.0))

    with pytest.raises(DPDLError, match=r"v\(0\) = 0.0 must be finite and > 0"):
        run_linreg(problems, w, noise=lambda t: np.zeros_like(t, dtype=float), seed=0, **kw)
    a = run_linreg(problems, w, noise=PowerDecay(1.0, 1.0, 0.5), **kw)
    b = run_linreg(problems, w, noise=PowerDecay(1.0, 1.0, 0.5), **kw)
    assert not np.array_equal(a.released, b.released)  # seed=None: OS entropy
