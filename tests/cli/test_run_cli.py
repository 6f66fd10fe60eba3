"""``dpdl run`` end to end on a tiny config (a few seconds)."""

from __future__ import annotations

import csv
import json

import pytest

from dpdl.cli import main

TINY = """
kind = "decentralized"
[experiment]
name = "cli"
algorithms = ["sgp", "dyn-d2p@clt"]
[data]
dataset = "digits"
max_train_records = 200
[model]
name = "logreg"
[topology]
name = "ring"
nodes = 5
[training]
steps = 50
batch_size = 4
lr = 0.5
eval_every = 4
[privacy]
epsilon = 3.0
certified_accountant = "rdp"
"""


def test_run_config_file_end_to_end(tmp_path, capsys):
    cfg = tmp_path / "tiny.toml"
    cfg.write_text(TINY)
    out = tmp_path / "runs"
    code = main(["run", str(cfg), "--output", str(out), "--no-progress", "--steps", "8"])
    printed = capsys.readouterr().out
    assert code == 0, printed
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]  # beside it: the site's ledger
    assert run_dir.name.startswith("cli-")
    assert "sgp" in printed and "dyn-d2p@clt" in printed and str(run_dir) in printed
    with open(run_dir / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["iteration"]) for r in rows] == [0, 4, 8, 0, 4, 8]  # --steps 8 applied
    results = json.loads((run_dir / "results.json").read_text())
    dyn = next(c for c in results["cells"] if c["algorithm"] == "dyn-d2p@clt")
    assert dyn["final"]["epsilon_clt"] == pytest.approx(3.0, rel=1e-6)
    # RDP is a certified upper bound, never below the (approximate) CLT epsilon here
    assert dyn["final"]["epsilon_certified"] >= dyn["final"]["epsilon_clt"] * 0.9
    assert (run_dir / "curves.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv_tail", "needle"),
    [
        (["--preset", "no-such-preset"], "unknown preset 'no-such-preset'"),
        (["/no/such/file.toml"], "does not exist"),
        (["--steps", "0"], "--steps must be a positive integer"),
    ],
)
def test_user_errors_are_one_line_exit_2(tmp_path, capsys, argv_tail, needle):
    code = main(["run", *argv_tail, "--output", str(tmp_path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert needle in err and err.count("\n") == 1


def test_config_typo_names_the_key(tmp_path, capsys):
    cfg = tmp_path / "typo.toml"
    cfg.write_text(TINY.replace("eval_every = 4", "eval_evry = 4"))
    assert main(["run", str(cfg), "--output", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "training.eval_evry: unknown key" in err
    assert not (tmp_path / "o").exists()  # nothing started


def test_list_presets(capsys):
    assert main(["run", "--list-presets"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "default" in lines and "fashion-mnist" in lines
    assert "Table 2 of the Dyn-D2P paper" in lines["table2"]  # each with what it runs


def test_a_closed_pipe_ends_the_command_quietly():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-m", "dpdl", "run", "--list-presets"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    child.stdout.close()  # the reader is gone before the command writes (it takes ~1 s to start)
    err = child.stderr.read().decode()
    assert child.wait(timeout=60) == 141 and "Traceback" not in err, err
