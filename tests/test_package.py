"""The top-level ``dpdl`` package: what ``dir(dpdl)`` and ``from dpdl import *`` show."""

import subprocess
import sys

import dpdl

PUBLIC = {"train", "DecentralizedTrainer", "TrainingResult", "DPDLError", "__version__"}


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def test_dir_lists_the_public_api_and_no_private_name():
    names = dir(dpdl)
    assert PUBLIC <= set(names)
    assert names == sorted(names)
    assert [name for name in names if name.startswith("_") and not _is_dunder(name)] == []


def test_every_name_dir_lists_resolves():
    for name in dir(dpdl):
        getattr(dpdl, name)


def test_star_import_gives_the_public_api():
    namespace: dict = {}
    exec("from dpdl import *", namespace)
    assert PUBLIC <= set(namespace)
    assert namespace["train"] is dpdl.train


def test_import_dpdl_and_dir_stay_free_of_torch():
    code = "import sys, dpdl; dir(dpdl); assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
