"""Private selection in ``dpdl tune`` (issue 38): Papernot & Steinke's random stopping, what
it leaves on disk, the ε its report states, and the ``--selection`` option."""

from __future__ import annotations

import json
import math
import stat
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp

from dpdl.accounting.selection import SELECTION_ORDERS
from dpdl.cli import main
from dpdl.errors import DPDLError
from dpdl.experiments.tune import split_tune
from dpdl.experiments.tune_private import STATE, run_private_selection
from dpdl.training.site_ledger import LEDGER_FILE, read_entries

CONFIG = """
kind = "decentralized"
[experiment]
name = "tiny-private"
seed = 0
[data]
dataset = "digits"
max_train_records = 300
validation_records = 60
[model]
name = "logreg"
[topology]
name = "exp"
nodes = 4
[training]
steps = 6
batch_size = 4
lr = 0.3
eval_every = 100
sample_rate = 0.06
[privacy]
epsilon = 2.0
calibrate = "clt"
certified_accountant = "rdp"
neighboring = "add-remove"
[tune]
selection_seeds = [0, 1]
test_seeds = [5]
workers = 1
[tune.candidates.const]
algorithm = "const-d2p"
grid = { "privacy.clip" = [0.2, 1.0] }
[tune.baselines.const-untuned]
algorithm = "const-d2p"
set = { "privacy.clip" = 1.0 }
"""


def base_config() -> dict:
    import tomllib

    return tomllib.loads(CONFIG)


@pytest.mark.parametrize("change, message", [
    ({"selection": "secret"}, "tune.selection must be public or private, got 'secret'"),
    ({"selection": "private"}, "exactly one of gamma .* got neither"),
    ({"selection": "private", "private": {"gamma": 0.5, "mean": 2}}, "exactly one of gamma"),
    ({"selection": "private", "private": {"mean": 0.5}}, "mean .* > 1, got 0.5"),
    ({"selection": "private", "private": {"gamma": 0.5, "eta": -0.5}}, ">= 0, got -0.5"),
    ({"selection": "private", "private": {"gamma": 1.5}}, "gamma must lie in .*, got 1.5"),
    ({"selection": "private", "private": {"mean": 2, "k": 3}}, "unknown key.* k"),
    ({"private": {"mean": 2}}, "goes with tune.selection = \"private\""),
])  # fmt: skip
def test_bad_private_tables_are_one_line_errors(change, message):
    config = base_config()
    config["tune"] |= change
    with pytest.raises(DPDLError, match=message) as error:
        split_tune(config)
    assert "\n" not in str(error.value)


def test_private_selection_needs_secret_randomness():
    config = base_config()
    config["tune"] |= {"selection": "private", "private": {"mean": 2}}
    config["experiment"]["entropy"] = "seed"
    with pytest.raises(DPDLError, match="needs experiment.entropy = \"os\", got 'seed'"):
        split_tune(config)
    config["experiment"]["entropy"] = "os"
    _, tune = split_tune(config)
    assert tune["private"] == pytest.approx({"eta": 1.0, "gamma": 0.5, "mean": 2.0})


def test_the_selection_keeps_only_its_winner_and_never_draws_k_twice(tmp_path):
    """A selection killed at its second run resumes its own plan (the same K: it makes the
    runs of one draw); every beaten run's folder is gone as soon as it is beaten, a tie
    keeps the earlier run, and the finished state holds the winner only."""
    scores, calls, kill = [0.5, 0.1, 0.5, 0.9, 0.2], [], {"at": 2}

    def run_one(point, seed, folder):
        folder.mkdir(exist_ok=True)
        calls.append(folder.name)
        if len(calls) == kill["at"]:
            raise RuntimeError("killed")
        return scores[(len(dict.fromkeys(calls)) - 1) % 5]

    private = {"eta": 1.0, "gamma": 0.2, "mean": 5.0}
    for attempt in range(30):  # a plan of one run (P = 0.2) finishes before the kill
        folder, calls[:] = tmp_path / f"selection{attempt}", []
        try:
            run_private_selection(folder, 3, [0, 1], private, run_one)
        except RuntimeError:
            break
    else:
        pytest.fail("30 plans of one run")
    state = json.loads((folder / STATE).read_text())
    assert stat.S_IMODE((folder / STATE).stat().st_mode) == 0o600
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    planned = [token for _, _, token in state["runs"]]
    assert state["next"] == 1 and len(planned) >= 2
    kill["at"] = -1
    with pytest.raises(DPDLError, match="planned under other settings"):
        run_private_selection(folder, 3, [0, 1], private, run_one, digest="another grid")
    winner = run_private_selection(folder, 3, [0, 1], private, run_one)
    assert list(dict.fromkeys(calls)) == planned  # one K, kept; the killed run run again
    assert json.loads((folder / STATE).read_text()) == {"winner": winner, "digest": ""}
    assert {p.name for p in folder.iterdir()} == {STATE, winner["folder"]}
    values = [scores[i % 5] for i in range(len(planned))]
    assert winner["folder"] == planned[int(np.argmax(values))]  # the first of equal bests
    assert run_private_selection(folder, 3, [0, 1], private, run_one) == winner  # no run


def test_the_number_of_runs_follows_the_geometric_distribution(tmp_path):
    """400 selections with gamma = 0.5: E[K] = 2, sd 1.41 (the mean within 5 standard errors)."""
    counts = []
    for i in range(400):
        runs = []
        run_private_selection(tmp_path / str(i), 2, [0], {"eta": 1.0, "gamma": 0.5},
                              lambda p, s, f, runs=runs: runs.append(f) or 0.0)  # fmt: skip
        counts.append(len(runs))
    assert min(counts) == 1
    assert abs(np.mean(counts) - 2.0) < 5 * math.sqrt(0.5) / 0.5 / math.sqrt(400)


def independent_epsilon(schedule: dict, mean: float, tests: int, delta: float) -> tuple:
    """dp_accounting alone: the best of K runs (RepeatAndSelect), and it composed with
    ``tests`` more runs, of one run's schedule (every run here has the same one)."""
    gaussian = dp_event.GaussianDpEvent(schedule["noise_multiplier_first"])
    step = dp_event.PoissonSampledDpEvent(schedule["sample_rate"], gaussian)
    run = dp_event.SelfComposedDpEvent(step, schedule["steps"])
    selection = rdp.RdpAccountant(list(SELECTION_ORDERS))
    selection.compose(dp_event.RepeatAndSelectDpEvent(run, mean, 1.0))
    total = rdp.RdpAccountant(list(SELECTION_ORDERS))
    total.compose(dp_event.RepeatAndSelectDpEvent(run, mean, 1.0))
    total.compose(run, tests)
    return selection.get_epsilon(delta), total.get_epsilon(delta)


def test_dpdl_tune_selection_private_end_to_end(tmp_path, capsys):
    """`dpdl tune CONFIG --selection private`: only the winner is on disk, its numbers are its
    own run's, and the ε stated is dp_accounting's for the best of K runs and the test runs."""
    config, out = tmp_path / "tiny.toml", tmp_path / "out"
    config.write_text(CONFIG)
    assert main(["tune", str(config), "--selection", "private", "--output", str(out),
                 "--no-progress"]) == 2  # fmt: skip
    assert "exactly one of gamma" in capsys.readouterr().err
    config.write_text(CONFIG + "[tune.private]\nmean = 2\n")
    assert main(["tune", str(config), "--selection", "private", "--output", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out.split("\nreport:")[0])
    assert printed["selection"] == "private"
    folder = out / "private" / "const-eps2"
    state = json.loads((folder / STATE).read_text())
    assert set(state) == {"winner", "digest"}  # K, the plan and every score are gone
    assert set(state["winner"]) == {"point", "seed", "folder"}
    # the losing runs' folders are gone (if K > 1), not their privacy: the site's ledger
    # keeps every run, the winner's in its folder, the others' moved up beside it
    assert {p.name for p in folder.iterdir()} - {LEDGER_FILE} == {STATE, state["winner"]["folder"]}
    kept = read_entries(folder)
    assert len(kept) >= 1 and (len(kept) == 1) == (not (folder / LEDGER_FILE).exists())
    summary = json.loads((out / "tune.json").read_text())
    by = summary["candidates"]["const"]["by_epsilon"]["2"]
    (cell,) = Path(by["winner"]["folder"]).glob("cells/*/cell.json")
    run = json.loads(cell.read_text())["results"]["cells"][0]
    assert by["winner"]["value"] == run["final"]["val_accuracy"]
    assert by["pick"] == {"privacy.clip": [0.2, 1.0][state["winner"]["point"]]}
    privacy = summary["privacy"]
    assert privacy["runs"] == 2  # the pick's and the baseline's test runs
    selection, total = independent_epsilon(run["schedule"], 2.0, 2, privacy["delta"])
    assert privacy["selections"][0]["epsilon_selection"] == pytest.approx(selection, rel=1e-9)
    assert privacy["epsilon"] == pytest.approx(total, rel=1e-9)
    assert printed["epsilon_released"] == privacy["epsilon"]
    md = (out / "tune.md").read_text()
    assert "Selection: private" in md and f"ε = {privacy['epsilon']:.3f}" in md
    # a rerun finds the selection finished: the same winner, nothing drawn or run again
    assert main(["tune", str(config), "--selection", "private", "--output", str(out),
                 "--no-progress"]) == 0  # fmt: skip
    assert json.loads((folder / STATE).read_text()) == state
    # the report of what is on disk (--report) is the run's own
    assert main(["tune", str(config), "--selection", "private", "--output", str(out),
                 "--report"]) == 0  # fmt: skip
    assert json.loads((out / "tune.json").read_text())["privacy"] == privacy
