"""The provenance block (issue 43): what a result needs to say where it came from, checked
against git, importlib.metadata and torch themselves, in results.json, sweep.json, tune.json
and the reports."""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.training import provenance as provenance_module
from dpdl.training.provenance import provenance, provenance_lines
from dpdl.training.run_folder import RunFolder

SOURCE = Path(dpdl.__file__).resolve().parent


def _git(*args) -> str:
    return subprocess.run(["git", *args], cwd=SOURCE, capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip


@pytest.fixture
def fresh_cache():
    provenance_module._source_commit.cache_clear()
    yield
    provenance_module._source_commit.cache_clear()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_block_names_commit_versions_command_and_machine(fresh_cache):
    block = provenance("cpu")
    inside = subprocess.run(["git", "rev-parse", "HEAD"], cwd=SOURCE, capture_output=True,
                            text=True, check=False)  # fmt: skip
    if inside.returncode == 0:
        assert block["git_commit"] == inside.stdout.strip()
        changed = _git("status", "--porcelain", "--untracked-files=no")
        assert block["git_dirty"] is bool(changed)
    assert block["versions"] == {
        "dpdl": importlib.metadata.version("dpdl"),
        "torch": importlib.metadata.version("torch"),
        "numpy": np.__version__,
        "dp_accounting": importlib.metadata.version("dp-accounting"),
    }
    assert block["versions"]["torch"].split("+")[0] == torch.__version__.split("+")[0]
    assert block["command"] == sys.argv
    assert block["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert block["device"] == "cpu"
    json.dumps(block)  # JSON as it is


def test_a_variable_forcing_other_kernels_is_recorded_and_printed(monkeypatch):
    # MKL's instruction set changes the numbers (RESULTS.md) yet torch's capability hides it
    for name in provenance_module.KERNEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "SSE4_2")
    block = provenance()
    assert block["kernel_env"] == {"MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}
    assert provenance_lines(block)[3].endswith("kernels forced by MKL_ENABLE_INSTRUCTIONS=SSE4_2")
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    assert "forced" not in provenance_lines(provenance())[3]


def test_outside_a_checkout_the_commit_is_none_not_an_error(fresh_cache, monkeypatch, tmp_path):
    package = tmp_path / "site-packages" / "dpdl"
    package.mkdir(parents=True)
    monkeypatch.setattr(dpdl, "__file__", str(package / "__init__.py"))
    block = provenance()
    assert block["git_commit"] is None and block["git_dirty"] is None
    assert provenance_lines(block)[0] == "commit: not a git checkout"
    # and without git on the PATH at all
    provenance_module._source_commit.cache_clear()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert provenance()["git_commit"] is None


def test_report_lines_say_what_was_recorded_and_what_was_not():
    block = {"git_commit": "abc", "git_dirty": True, "versions": {"dpdl": "1"},
             "python": "3.11", "command": ["dpdl", "run", "x.toml"], "cpu_capability": "AVX2",
             "machine": "x86_64", "device": "cuda:0", "cuda_device": "H200"}  # fmt: skip
    lines = provenance_lines(block)
    assert lines[0] == "commit: abc (tracked files modified)"
    assert lines[2] == "command: dpdl run x.toml"
    assert "CPU capability AVX2" in lines[3] and "device cuda:0 (H200)" in lines[3]
    assert "not recorded" in provenance_lines(None)[0]


def test_results_json_of_a_training_run_carries_the_block(tmp_path):
    gen = torch.Generator().manual_seed(0)
    nodes = [(torch.randn(12, 5, generator=gen), torch.randint(0, 3, (12,), generator=gen))
             for _ in range(3)]  # fmt: skip
    dpdl.train(nn.Linear(5, 3), nodes, topology="ring", algorithm="sgp", epsilon=None,
               steps=2, batch_size=4, lr=0.1, eval_data=nodes[0], entropy="seed", seed=0,
               output_dir=tmp_path, run_name="r", progress=False)  # fmt: skip
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["provenance"] == provenance("cpu")


def test_the_numpy_kinds_run_folder_carries_it_too(tmp_path):
    RunFolder(tmp_path).write_results({"cells": []})
    assert json.loads((tmp_path / "results.json").read_text())["provenance"] == provenance()
