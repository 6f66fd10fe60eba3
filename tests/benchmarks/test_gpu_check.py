"""benchmarks/gpu_check.py runs every check on the CPU at its tiny sizes and passes (so the
script a lent GPU runs cannot rot), one line per check; a check that breaks is a FAIL line
that does not hide the others."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpu_check"] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("gpu_check", None)
        sys.path.remove(str(SCRIPT.parent))


def test_every_check_passes_on_the_cpu_at_tiny_sizes(gpu_check):
    lines: list[str] = []
    assert gpu_check.run_checks("cpu", gpu_check.TINY, emit=lines.append), lines
    assert all(line.startswith("PASS ") for line in lines), lines
    started = [line.split()[1].rstrip(":") for line in lines]
    assert set(gpu_check.CHECKS) == set(started), started  # every check printed its line
    assert "max |parameter difference| 0.0e+00" in lines[0]  # same bits on both paths
    assert any("equals OpenSSL across the 2^32 carry: True" in line for line in lines)
    assert any(line.startswith("PASS resnet18-gn n=2 b=1") and "images/s" in line
               for line in lines)  # fmt: skip


def test_a_broken_check_is_one_fail_line_and_the_others_still_run(gpu_check, monkeypatch):
    def broken(device, sizes):
        raise RuntimeError("no kernel image\nsecond line")
        yield  # a generator, as every check is

    def fine(device, sizes):
        yield True, "fine: ran"

    monkeypatch.setattr(gpu_check, "CHECKS", {"broken": broken, "fine": fine})
    lines: list[str] = []
    assert not gpu_check.run_checks("cpu", gpu_check.TINY, names=("broken", "fine"),
                                    emit=lines.append)  # fmt: skip
    assert lines == ["FAIL broken: RuntimeError: no kernel image", "PASS fine: ran"]
