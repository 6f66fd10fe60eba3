"""Behaviour lock for restructurings (issue 24): seeded runs of every experiment kind give
byte-identical CSV outputs to those written before the restructuring began (commit 82aded6).

A difference means the code now computes something else: find it, or, if the change is
intended, regenerate with ``tests/golden/regenerate.py`` and say why in the commit. Where the
bytes differ, every number must agree to 1e-6 relative and every other field exactly: the last
bits depend on the machine, not only on torch's instruction set (``expected/CPU_CAPABILITY``
records where they were frozen). CI on another AVX512 machine moved float32 losses by one ulp
and numpy's float64 epsilons by 2e-16, so bytes alone would fail on rounding.
"""

from __future__ import annotations

import difflib
import hashlib
import math
from pathlib import Path

import pytest
from tests.golden.frozen import CONFIGS, run_config

EXPECTED = Path(__file__).resolve().parent / "expected"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _numbers_close(frozen: Path, now: Path) -> bool:
    old, new = frozen.read_text().splitlines(), now.read_text().splitlines()
    if len(old) != len(new):
        return False
    for a_line, b_line in zip(old, new, strict=True):
        a_fields, b_fields = a_line.split(","), b_line.split(",")
        if len(a_fields) != len(b_fields):
            return False  # a column added or lost is a change, not rounding
        for a, b in zip(a_fields, b_fields, strict=True):
            if a == b:
                continue
            try:
                x, y = float(a), float(b)
            except ValueError:
                return False
            if not math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12):
                return False
    return True


@pytest.mark.parametrize("name", CONFIGS)
def test_seeded_run_is_byte_identical(name, tmp_path):
    expected = {p.name: p for p in sorted((EXPECTED / name).glob("*.csv"))}
    assert expected, f"no frozen outputs for {name}"
    produced = run_config(name, tmp_path)
    assert sorted(produced) == sorted(expected)
    for filename, path in produced.items():
        if _digest(path) == _digest(expected[filename]):
            continue
        if _numbers_close(expected[filename], path):
            continue  # another machine's rounding: the last bits may differ, nothing else
        diff = difflib.unified_diff(
            expected[filename].read_text().splitlines(), path.read_text().splitlines(),
            "frozen", "now", lineterm="", n=0)
        pytest.fail(f"{name}/{filename} changed:\n" + "\n".join(list(diff)[:20]))


def test_the_rounding_fallback_tolerates_rounding_only(tmp_path):
    frozen, near, far = (tmp_path / f for f in ("a.csv", "b.csv", "c.csv"))
    frozen.write_text("iteration,loss\n0,0.6940014700409008\n")
    near.write_text("iteration,loss\n0,0.6940014700409009\n")  # one ulp
    far.write_text("iteration,loss\n0,0.6940214700409008\n")  # 3e-5 relative
    assert _numbers_close(frozen, near) and not _numbers_close(frozen, far)
    wider = tmp_path / "d.csv"
    wider.write_text("iteration,loss\n0,0.6940014700409008,1\n")  # a field more
    assert not _numbers_close(frozen, wider)
