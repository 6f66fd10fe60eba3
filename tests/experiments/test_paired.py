"""Seed-paired comparisons for docs/RESULTS.md."""

import math

import pytest

from dpdl.errors import DPDLError
from dpdl.experiments.paired import gap_change, paired, summarize, t_interval

T_975_2 = 4.302652729911275  # Student t quantile, 2 degrees of freedom (tables)


def row(algorithm, seed, acc, eps=0.3, setting="", status="ok", spent=math.nan):
    return {"algorithm": algorithm, "seed": str(seed), "epsilon_target": eps, "setting": setting,
            "status": status, "test_accuracy": acc, "epsilon_certified": spent}  # fmt: skip


def test_t_interval_by_hand():
    mean, low, high = t_interval([0.01, 0.03, 0.02])
    half = T_975_2 * 0.01 / math.sqrt(3)
    assert (mean, low, high) == pytest.approx((0.02, 0.02 - half, 0.02 + half))
    assert math.isnan(t_interval([0.1])[1])


def test_paired_verdicts():
    rows = [row("dyn", s, 0.60 + 0.01 * s) for s in range(4)]
    rows += [row("const", s, 0.50 + 0.01 * s + 0.002 * (s % 2)) for s in range(4)]
    rows += [row("const", 9, 0.9)]  # no partner: left out
    (c,) = paired(rows, "dyn", "const")
    assert c.seeds == ("0", "1", "2", "3") and c.verdict == "held"
    assert c.mean == pytest.approx(0.099) and c.relative_mean > 0.18
    rel = [(0.60 + 0.01 * s) / (0.50 + 0.01 * s + 0.002 * (s % 2)) - 1 for s in range(4)]
    assert c.relative == pytest.approx(tuple(rel))
    assert c.relative_interval == pytest.approx(t_interval(rel)[1:])
    (flip,) = paired(rows, "const", "dyn")
    assert flip.verdict == "did not hold"
    noisy = [row("a", s, v) for s, v in enumerate([0.5, 0.7, 0.4])]
    noisy += [row("b", s, 0.55) for s in range(3)]
    assert paired(noisy, "a", "b")[0].verdict == "inconclusive"
    diverged = [row("a", 0, 0.9, status="diverged"), row("b", 0, 0.1)]
    assert paired(diverged, "a", "b") == []


def test_run_rows_of_a_real_sweep(tmp_path):
    from dpdl.experiments.paired import main, run_rows, write_csv
    from dpdl.experiments.sweep import run_sweep

    config = {
        "experiment": {"name": "p", "algorithms": ["const-d2p@clt", "dyn-d2p@clt"],
                       "entropy": "seed"},
        "data": {"dataset": "digits", "max_train_records": 240, "validation_records": 40},
        "model": {"name": "logreg"},
        "topology": {"name": "exp", "nodes": 4},
        "training": {"steps": 6, "batch_size": 8, "lr": 0.5, "eval_every": 3},
        "privacy": {"epsilon": 2.0, "eval_blocks": 2, "calibration_blocks": 4},
        "sweep": {"workers": 1, "grid": {"experiment.seed": [0, 1]}},
    }  # fmt: skip
    run_sweep(config, tmp_path / "s", progress=False)
    rows = run_rows(tmp_path / "s")
    assert sorted((r["algorithm"], r["seed"]) for r in rows) == [
        ("const-d2p@clt", "0"), ("const-d2p@clt", "1"), ("dyn-d2p@clt", "0"), ("dyn-d2p@clt", "1")
    ]
    assert all(0 <= r["val_accuracy"] <= 1 and r["steps"] == 6 for r in rows)
    assert all(r["train_seconds"] > 0 and r["setting"] == "" for r in rows)
    named = run_rows(tmp_path / "s", setting_keys=("topology.name", "privacy.epsilon"))
    assert {r["setting"] for r in named} == {"name=exp epsilon=2.0"}
    with pytest.raises(DPDLError, match="'topology.colour' is not in"):
        run_rows(tmp_path / "s", setting_keys=("topology.colour",))
    (c,) = paired(rows, "dyn-d2p@clt", "const-d2p@clt")
    assert c.seeds == ("0", "1") and c.epsilon == 2.0
    text = write_csv(rows, tmp_path / "runs.csv").read_text()
    assert text.splitlines()[0].startswith("algorithm,seed,epsilon_target")
    # per-node numbers (issue 43): the final row of each run's metrics.csv, worst <= mean
    for r in rows:
        assert 0 <= r["node_accuracy_worst"] <= r["node_accuracy_mean"] <= 1
        assert 0 <= r["val_node_accuracy_worst"] <= r["val_node_accuracy_mean"] <= 1
    (worst,) = paired(rows, "dyn-d2p@clt", "const-d2p@clt", metric="node_accuracy_worst")
    by = {(r["algorithm"], r["seed"]): r["node_accuracy_worst"] for r in rows}
    assert worst.differences == pytest.approx(
        [by["dyn-d2p@clt", s] - by["const-d2p@clt", s] for s in ("0", "1")])
    assert main([str(tmp_path / "s"), "--metric", "node_accuracy_worst", "--pair",
                 "dyn-d2p@clt", "const-d2p@clt"]) == 0  # fmt: skip
    with pytest.raises(DPDLError, match="--metric 'node_accuracy' is not a run's final number"):
        main([str(tmp_path / "s"), "--metric", "node_accuracy", "--summary"])
    # what a tuning selects on: the same number as the run recorded in results.json
    from dpdl.experiments.tune import sweep_runs

    selected = sweep_runs(tmp_path / "s", "val_node_accuracy_worst")
    assert sorted(x["value"] for x in selected) == pytest.approx(
        sorted(r["val_node_accuracy_worst"] for r in rows))


def test_pairing_two_settings_of_one_algorithm():
    rows = [row("dyn", s, 0.6 + 0.01 * s, setting="rho=2") for s in range(3)]
    rows += [row("dyn", s, 0.5 + 0.01 * s + 0.001 * s * s, setting="rho=1") for s in range(3)]
    (c,) = paired(rows, "rho=2", "rho=1", by="setting")
    assert c.setting == "dyn" and c.verdict == "held"
    assert c.differences == pytest.approx((0.1, 0.099, 0.096))


def test_summary_by_hand():
    rows = [row("dyn", s, v, spent=e) for s, v, e in [(0, 0.5, 0.29), (1, 0.7, 0.3), (2, 0.6, 0.3)]]
    rows += [row("dyn", 3, 0.99, status="diverged"), row("sgp", 0, 0.8, eps=math.nan)]
    by_name = {g.algorithm: g for g in summarize(rows)}
    dyn = by_name["dyn"]
    half = T_975_2 * 0.1 / math.sqrt(3)
    assert dyn.seeds == ("0", "1", "2") and dyn.epsilon_certified == 0.3
    assert (dyn.mean, dyn.low, dyn.high) == pytest.approx((0.6, 0.6 - half, 0.6 + half))
    assert math.isnan(by_name["sgp"].epsilon) and math.isnan(by_name["sgp"].low)


def test_gap_change_is_the_per_seed_difference_of_gaps():
    # gap dyn - const: 0.10, 0.12, 0.08 at eps 0.3; 0.02, 0.03, 0.04 at eps 1.
    rows = []
    for s, (g_small, g_large) in enumerate([(0.10, 0.02), (0.12, 0.03), (0.08, 0.04)]):
        rows += [row("const", s, 0.5, eps=0.3), row("dyn", s, 0.5 + g_small, eps=0.3)]
        rows += [row("const", s, 0.6, eps=1.0), row("dyn", s, 0.6 + g_large, eps=1.0)]
    (c,) = gap_change(rows, "dyn", "const")
    assert c.epsilon == 0.3 and c.seeds == ("0", "1", "2")
    assert c.differences == pytest.approx((0.08, 0.09, 0.04))
    assert c.mean == pytest.approx(0.07) and c.verdict == "held"
    (flip,) = gap_change(rows, "const", "dyn")
    assert flip.verdict == "did not hold"
    assert gap_change([r for r in rows if r["epsilon_target"] == 0.3], "dyn", "const") == []


def test_the_command_filters_and_refuses_an_empty_selection(tmp_path, capsys):
    import subprocess
    import sys

    from dpdl.experiments.paired import main
    from dpdl.experiments.sweep import run_sweep

    config = {
        "experiment": {"name": "p", "algorithms": ["const-d2p@clt", "dyn-d2p@clt"],
                       "entropy": "seed"},
        "data": {"dataset": "digits", "max_train_records": 200},
        "model": {"name": "logreg"},
        "topology": {"name": "exp", "nodes": 4},
        "training": {"steps": 4, "batch_size": 8, "lr": 0.5, "eval_every": 2},
        "privacy": {"epsilon": [1.0, 2.0], "eval_blocks": 2, "calibration_blocks": 4},
        "sweep": {"workers": 1, "grid": {"experiment.seed": [0, 1]}},
    }  # fmt: skip
    run_sweep(config, tmp_path / "s", progress=False)
    out = tmp_path / "runs.csv"
    args = [str(tmp_path / "s"), "--csv", str(out), "--algorithm", "dyn-d2p@clt",
            "--epsilon", "2", "--summary", "--markdown"]  # fmt: skip
    assert main(args) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 2 and all(line.startswith("dyn-d2p@clt,") for line in lines[1:])
    table = capsys.readouterr().out
    assert "| dyn-d2p@clt | – | 2 | 2 |" in table and "const-d2p" not in table
    png = tmp_path / "bars.png"
    assert main([str(tmp_path / "s"), "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.with_suffix(".pdf").read_bytes().startswith(b"%PDF-")  # vectors beside it
    assert b"<svg" in png.with_suffix(".svg").read_bytes()[:2000]
    with pytest.raises(DPDLError, match="--plot names the PNG"):
        main([str(tmp_path / "s"), "--plot", str(tmp_path / "bars.pdf")])
    command = [sys.executable, "-m", "dpdl.experiments.paired", str(tmp_path / "s"),
               "--epsilon", "7"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.strip() == "error: no run left after --algorithm / --epsilon"
