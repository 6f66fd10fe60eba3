"""netdp-logreg's step-size selection on validation records and its seed-paired comparisons."""

import csv
import json

import numpy as np
import pytest
from scipy import stats

from dpdl.errors import DPDLError
from dpdl.extensions.netdp import experiment as ex
from dpdl.extensions.netdp.tuning import paired_comparisons, select_step_sizes


def tuned_config(**tune):
    return {
        "kind": "netdp-logreg",
        "experiment": {"name": "t", "seeds": [0, 1], "entropy": "seed"},
        "algorithm": {"steps": 200, "eval_every": 100},
        "tune": {"lr_grid": [0.001, 0.1, 1.0], "selection_seeds": [7, 8],
                 "validation_records": 50, **tune},
        "privacy": {"epsilons": [10.0], "delta": 1e-6, "approaches": ["local", "network"],
                    "include_non_private": True},
    }


def test_the_pick_is_the_best_mean_and_ties_go_to_the_first_point():
    score = {0.1: [0.6, 0.8], 0.2: [0.9, 0.7], 0.3: [0.5, 0.5]}  # means 0.7, 0.8, 0.5
    seeds = [3, 4]
    trained = []

    def train(seed, approach, eps, lr):
        trained.append((seed, approach, eps, lr))
        bonus = 0.1 if (approach == "b" and lr == 0.1) else 0.0  # b: 0.8 at 0.1 and at 0.2
        return score[lr][seeds.index(seed)] + bonus

    out = select_step_sizes([("a", 1.0), ("b", 1.0)], [0.1, 0.2, 0.3], seeds, train)
    picks = {p["approach"]: p["lr"] for p in out["picks"]}
    assert picks == {"a": 0.2, "b": 0.1}
    assert len(trained) == 2 * 3 * 2  # every cell, point and seed: the same budget
    rows = [p for p in out["points"] if p["approach"] == "a"]
    assert [r["mean"] for r in rows] == pytest.approx([0.7, 0.8, 0.5])
    assert [r["picked"] for r in rows] == [False, True, False]


def test_validation_records_are_held_by_no_user_and_untuned_users_are_unchanged():
    plain = {k: v for k, v in tuned_config().items() if k != "tune"}
    untuned = ex.load_users(ex.parse_config(plain))
    tuned = ex.load_users(ex.parse_config(tuned_config()))
    users = {r.tobytes() for r in tuned["x"].reshape(-1, tuned["dim"])}
    assert not users & {r.tobytes() for r in tuned["x_val"]}
    assert len(tuned["x_val"]) == 50 and tuned["n"] == (455 - 50) // 8
    # without [tune] nothing is held back: the split of the first runs
    from dpdl.data import load_dataset

    assert untuned["n"] == len(load_dataset("breast-cancer", seed=0).y_train) // 8
    assert "tune" not in ex.parse_config(plain).model_dump()


@pytest.mark.parametrize("change, message", [
    ({"selection_seeds": [1, 9]}, r"share \[1\]"),
    ({"lr_grid": [0.1, 0.1]}, "repeat"),
    ({"lr_grid": [0.1, -1.0]}, "finite and > 0"),
    ({"validation_records": 0}, "validation_records"),
])
def test_bad_tune_tables_are_refused_in_one_line(change, message):
    with pytest.raises(DPDLError, match=message) as err:
        ex.parse_config(tuned_config(**change))
    assert "\n" not in str(err.value)


def test_a_step_size_past_the_contraction_limit_is_refused_before_anything_runs(tmp_path):
    with pytest.raises(DPDLError, match="2/beta"):
        ex.run_experiment(tuned_config(lr_grid=[0.1, 9.0]), tmp_path, progress=False)
    assert not any(tmp_path.rglob("metrics.csv"))


def test_a_tuned_run_tests_at_the_picks_and_never_reads_the_test_set_to_choose(tmp_path):
    out = ex.run_experiment(tuned_config(), tmp_path, progress=False)
    run = tmp_path / next(p.name for p in tmp_path.iterdir())
    with open(run / "selection.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 3 * 3  # (local, network, non-private) x 3 step sizes
    for pick in out["tuning"]["picks"]:
        label = "-" if pick["epsilon"] is None else str(pick["epsilon"])
        mine = [r for r in rows if r["approach"] == pick["approach"] and r["epsilon"] == label]
        best = max(mine, key=lambda r: float(r["val_accuracy_mean"]))
        assert float(best["lr"]) == pick["lr"] and best["picked"] == "True"
        tested = {c["lr"] for c in out["cells"]
                  if c["approach"] == pick["approach"] and c["epsilon"] == pick["epsilon"]}
        assert tested == {pick["lr"]}
    assert set(json.loads((run / "results.json").read_text())["tuning"]) >= {"rule", "lr_grid"}


def test_paired_comparisons_are_seed_by_seed_t_intervals():
    acc = {("network", 0): 0.80, ("network", 1): 0.70, ("network", 2): 0.75,
           ("central", 0): 0.78, ("central", 1): 0.71, ("central", 2): 0.70,
           ("local", 1): 0.5}
    results = [{"approach": a, "epsilon": 1.0, "seed": s, "status": "ok", "test_accuracy": v}
               for (a, s), v in acc.items()]
    comp = {(c["first"], c["second"]): c for c in paired_comparisons(results)}
    diffs = np.array([0.02, -0.01, 0.05])
    low, high = stats.t.interval(0.95, 2, loc=diffs.mean(), scale=stats.sem(diffs))
    got = comp[("network", "central")]
    assert got["seeds"] == [0, 1, 2] and got["mean"] == pytest.approx(diffs.mean())
    assert (got["low"], got["high"]) == pytest.approx((low, high))
    one = comp[("network", "local")]  # one shared seed: no interval
    assert one["seeds"] == [1] and one["low"] is None and one["high"] is None


def test_an_interrupted_tuned_run_resumes_to_the_same_results(tmp_path, monkeypatch):
    from pathlib import Path

    whole = ex.run_experiment(tuned_config(), tmp_path / "whole", progress=False)
    calls = {"n": 0}
    original = ex._CellTrainer.train

    def dies_after_five(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 5:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(ex._CellTrainer, "train", dies_after_five)
    with pytest.raises(KeyboardInterrupt):
        ex.run_experiment(tuned_config(), tmp_path / "cut", progress=False)
    monkeypatch.setattr(ex._CellTrainer, "train", original)
    run_dir = next((tmp_path / "cut").iterdir())
    trained = []
    monkeypatch.setattr(ex._CellTrainer, "train", lambda self, *a, **k: (
        trained.append(a), original(self, *a, **k))[1])
    resumed = ex.resume_experiment(run_dir, progress=False)
    assert len(trained) == 3 * 3 * 2 + 3 * 2 - 5  # the cells not logged before the cut
    assert resumed["cells"] == whole["cells"] and resumed["tuning"] == whole["tuning"]
    assert (Path(resumed["run_dir"]) / "metrics.csv").read_text() == (
        Path(whole["run_dir"]) / "metrics.csv").read_text()
    # a log written for other settings is refused, not mixed in
    (run_dir / "config.json").write_text((run_dir / "config.json").read_text().replace(
        '"steps": 200', '"steps": 201'))
    with pytest.raises(DPDLError, match="refusing to resume"):
        ex.resume_experiment(run_dir, progress=False)
