"""RunFolder: the one writer of run folders (names, JSON/CSV formats, checkpoint paths)."""

import csv
import json
import tomllib

from dpdl.training.provenance import provenance
from dpdl.training.run_folder import RunFolder


def test_create_names_a_fresh_folder_each_time(tmp_path):
    first = RunFolder.create(tmp_path, "exp")
    second = RunFolder.create(tmp_path, "exp")
    assert first.path.is_dir() and second.path.is_dir()
    assert first.path != second.path and second.path.name.startswith(first.path.name)
    named = RunFolder.create(tmp_path, "exp", "mine")
    assert named.path == tmp_path / "mine" and named / "x.csv" == tmp_path / "mine" / "x.csv"


def test_files_are_written_in_the_shared_formats(tmp_path):
    folder = RunFolder.create(tmp_path, "exp", "run")
    resolved = {"kind": "decentralized", "experiment": {"name": "exp", "seeds": [0, 1]}}
    folder.write_config(resolved, toml=True)
    assert (folder / "config.json").read_text() == json.dumps(resolved, indent=2) + "\n"
    assert tomllib.loads((folder / "config.toml").read_text()) == resolved
    folder.write_csv("plain.csv", ["a", "b"], [[1, 2.5], [3, "x"]])
    assert (folder / "plain.csv").read_bytes() == b"a,b\r\n1,2.5\r\n3,x\r\n"
    folder.write_records_csv("dicts.csv", [{"a": 1, "b": None}, {"a": 2, "b": 3}])
    with (folder / "dicts.csv").open(newline="") as fh:
        assert list(csv.DictReader(fh)) == [{"a": "1", "b": ""}, {"a": "2", "b": "3"}]
    folder.write_results({"cells": []})
    # issue 43: every results.json says where it came from
    assert json.loads((folder / "results.json").read_text()) == {"provenance": provenance(),
                                                                  "cells": []}


def test_checkpoints_live_under_checkpoints(tmp_path):
    folder = RunFolder.create(tmp_path, "exp", "run")
    assert folder.checkpoint("sgp_seed0") == tmp_path / "run" / "checkpoints" / "sgp_seed0.pt"
    assert not folder.checkpoints.exists()  # created by whoever saves one
