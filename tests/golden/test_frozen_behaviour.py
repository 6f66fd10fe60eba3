"""Behaviour lock for restructurings (issue 24): seeded runs of every experiment kind give
byte-identical CSV outputs to those written before the restructuring began (commit 82aded6).

A difference means the code now computes something else: find it, or, if the change is
intended, regenerate with ``tests/golden/regenerate.py`` and say why in the commit.
"""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path

import pytest
from tests.golden.frozen import CONFIGS, run_config

EXPECTED = Path(__file__).resolve().parent / "expected"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", CONFIGS)
def test_seeded_run_is_byte_identical(name, tmp_path):
    expected = {p.name: p for p in sorted((EXPECTED / name).glob("*.csv"))}
    assert expected, f"no frozen outputs for {name}"
    produced = run_config(name, tmp_path)
    assert sorted(produced) == sorted(expected)
    for filename, path in produced.items():
        if _digest(path) != _digest(expected[filename]):
            diff = difflib.unified_diff(
                expected[filename].read_text().splitlines(), path.read_text().splitlines(),
                "frozen", "now", lineterm="", n=0)
            pytest.fail(f"{name}/{filename} changed:\n" + "\n".join(list(diff)[:20]))
