"""Sweep mechanics (grid, resume, atomic cells, failures) and the report built from them.

The experiment here is a plugin module written by the test: it trains nothing, but writes a
metrics.csv whose numbers are a known function of the cell's config, so every table entry the
report prints can be checked against a hand computation.
"""

import json
import textwrap

import pytest

from dpdl.cli import main
from dpdl.errors import DPDLError
from dpdl.experiments.report import build_tables, collect_runs, write_report
from dpdl.experiments.sweep import expand_grid, run_sweep, split_sweep

PLUGIN = textwrap.dedent(
    """
    import csv, os
    def run_experiment(config, output_dir, progress=True):
        eps = config["privacy"]["epsilon"]; seed = config["experiment"]["seed"]
        if config["privacy"].get("fail") or config["privacy"].get("fail_seed") == seed:
            raise RuntimeError("boom")
        with open(output_dir / "metrics.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["iteration", "algorithm", "seed", "train_loss", "test_accuracy",
                        "epsilon_clt", "epsilon_certified"])
            for algo, base in (("const-d2p", 0.5), ("dyn-d2p", 0.6)):
                for it in (0, 10):
                    acc = base * it / 10 + 0.01 * seed + 0.1 * eps
                    w.writerow([it, algo, seed, 1.0 - acc, acc, eps, 2 * eps])
        with open(os.environ["SWEEP_TEST_LOG"], "a") as fh:
            fh.write(f"{eps},{seed}\\n")
        return {"ok": True}
    """
)


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    package = tmp_path / "sweep_test_plugins"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "fake_training.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    log = tmp_path / "calls.log"
    monkeypatch.setenv("SWEEP_TEST_LOG", str(log))
    return log


def _config(**privacy):
    return {
        "kind": "sweep_test_plugins.fake_training",
        "privacy": {"epsilon": 1.0, **privacy},
        "experiment": {"seed": 0},
        "sweep": {
            "workers": 2,
            "grid": {"privacy.epsilon": [0.5, 1.0], "experiment.seed": [0, 1, 2]},
        },
    }


def test_grid_is_the_cartesian_product_with_distinct_ids():
    _, sweep = split_sweep(_config())
    cells = expand_grid(sweep)
    assert len(cells) == 6
    assert len({c.cell_id for c in cells}) == 6
    assert {tuple(c.as_dict().values()) for c in cells} == {
        (e, s) for e in (0.5, 1.0) for s in (0, 1, 2)
    }


@pytest.mark.parametrize(
    "sweep, message",
    [
        ({"grid": {"a.b": []}}, "non-empty list"),
        ({"grid": {"a.b": [1]}, "typo": 1}, "unknown key"),
        ({"grid": {"a.b": [1]}, "workers": 0}, "workers"),
        ({"zip": {"a": [1, 2], "b": [1]}}, "same length"),
    ],
)
def test_bad_sweep_tables_are_rejected(sweep, message):
    with pytest.raises(DPDLError, match=message):
        split_sweep({"sweep": sweep})


def test_sweep_runs_every_cell_once_and_resumes(tmp_path, plugin):
    out = tmp_path / "sweep"
    summary = run_sweep(_config(), out, progress=False)
    assert summary == {"cells": 6, "skipped": 0, "done": 6, "failed": {}}
    assert len(plugin.read_text().splitlines()) == 6
    # A half-written cell (as an interrupted worker leaves it) is not taken as finished.
    finished = sorted((out / "cells").iterdir())
    victim = finished[0]
    (victim / "cell.json").unlink()
    victim.rename(victim.with_name(victim.name + ".partial"))
    summary = run_sweep(_config(), out, progress=False)
    assert summary["skipped"] == 5 and summary["done"] == 1
    assert len(plugin.read_text().splitlines()) == 7
    assert not any(p.name.endswith(".partial") for p in (out / "cells").iterdir())


def test_a_failing_cell_is_reported_and_the_others_finish(tmp_path, plugin):
    config = _config()
    config["sweep"]["grid"]["privacy.fail"] = [False, True]
    summary = run_sweep(config, tmp_path / "s", progress=False)
    assert summary["done"] == 6
    assert len(summary["failed"]) == 6
    assert all("boom" in msg for msg in summary["failed"].values())


def test_a_failed_cell_is_listed_in_the_report_until_it_finishes(tmp_path, plugin):
    out = tmp_path / "sweep"
    summary = run_sweep(_config(fail_seed=1), out, progress=False)
    assert summary["done"] == 4 and len(summary["failed"]) == 2  # seed 1 at both ε
    md = write_report(out)["markdown"].read_text()
    assert "## Failed cells: 2" in md
    for cell, eps in zip(sorted(summary["failed"]), (0.5, 1.0), strict=True):
        assert f"| {cell} | privacy.epsilon={eps}, experiment.seed=1 | RuntimeError: boom |" in md
    html = (out / "report" / "report.html").read_text()
    assert "<h2>Failed cells: 2</h2>" in html and "RuntimeError: boom" in html
    assert len(collect_runs(out)) == 8  # the failed cells are in no table
    summary = run_sweep(_config(), out, progress=False)  # the rerun retries them, and they finish
    assert summary["done"] == 2 and summary["skipped"] == 4 and not summary["failed"]
    assert "Failed cells" not in write_report(out)["markdown"].read_text()


def test_report_tables_match_a_hand_computation(tmp_path, plugin):
    out = tmp_path / "sweep"
    run_sweep(_config(), out, progress=False)
    runs = collect_runs(out)
    assert len(runs) == 12  # 6 cells × 2 algorithms
    tables = build_tables(runs)
    assert tables.accuracy_header == ["setting", "ε", "const-d2p", "dyn-d2p", "gain Dyn vs Const"]
    # no epsilon_target column: ε comes from the grid point, which is then not a "setting"
    rows = {(row[0], row[1]): row for row in tables.accuracy_rows}
    assert set(rows) == {("base", "0.5"), ("base", "1")}
    # eps=0.5: final acc = base + 0.01*seed + 0.05 over seeds 0,1,2 -> mean base+0.06, std 0.01
    const, dyn = rows["base", "0.5"][2], rows["base", "0.5"][3]
    assert const.startswith("56.00 ± 1.00") and dyn.startswith("66.00 ± 1.00")
    assert rows["base", "0.5"][4] == f"{100 * (0.66 / 0.56 - 1):+.1f} %"
    # certified = 2 x CLT in every cell
    assert tables.understatement and all(r == pytest.approx(2.0) for r in tables.understatement)
    paths = write_report(out)
    md = paths["markdown"].read_text()
    assert "understated ε by a factor of up to 2.00" in md
    html = paths["html"].read_text()
    assert html.count("data:image/png;base64,") >= 2  # self-contained figures


def test_sweep_and_report_commands(tmp_path, plugin, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text(
        textwrap.dedent(
            """
            kind = "sweep_test_plugins.fake_training"
            [privacy]
            epsilon = 1.0
            [experiment]
            seed = 0
            [sweep]
            workers = 1
            [sweep.grid]
            "experiment.seed" = [0, 1]
            """
        )
    )
    out = tmp_path / "out"
    assert (
        main(
            [
                "sweep",
                str(cfg),
                "--output",
                str(out),
                "--no-progress",
                "--set",
                "privacy.epsilon=0.25",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["done"] == 2
    assert {line.split(",")[0] for line in plugin.read_text().splitlines()} == {"0.25"}
    assert main(["report", str(out)]) == 0
    assert (out / "report" / "report.html").is_file()


def test_report_of_a_non_sweep_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "not a sweep directory" in capsys.readouterr().err


def test_an_invalid_override_is_refused_before_any_cell_runs(tmp_path):
    config = {
        "experiment": {"algorithms": ["sgp"]},
        "training": {"steps": 5},
        "sweep": {"grid": {"experiment.seed": [0, 1]}},
    }
    config["privacy"] = {"delta": 5.0}  # as `dpdl sweep --set privacy.delta=5` would
    with pytest.raises(DPDLError, match="privacy.delta"):
        run_sweep(config, tmp_path / "s", progress=False)
    assert not any((tmp_path / "s" / "cells").iterdir())


def test_only_reruns_the_matching_cell_into_the_same_cell_folder(tmp_path, plugin, capsys):
    whole = tmp_path / "whole"
    run_sweep(_config(), whole, progress=False)
    one = tmp_path / "one"
    from dpdl.experiments.sweep import select_cells

    _, sweep = split_sweep(_config())
    only = [("experiment.seed", 2), ("privacy.epsilon", 0.5)]
    (chosen,) = select_cells(expand_grid(sweep), only)
    assert chosen.as_dict() == {"privacy.epsilon": 0.5, "experiment.seed": 2}
    summary = run_sweep(_config(), one, progress=False, only=only)
    assert summary["cells"] == 1 and summary["done"] == 1
    (cell,) = (one / "cells").iterdir()
    assert cell.name == chosen.cell_id
    same = whole / "cells" / cell.name / "metrics.csv"
    assert (cell / "metrics.csv").read_text() == same.read_text()
    with pytest.raises(DPDLError, match=r"seed=7 matches no cell; grid has 0, 1, 2"):
        select_cells(expand_grid(sweep), [("experiment.seed", 7)])
    with pytest.raises(DPDLError, match="--only topology.name: not a grid key"):
        select_cells(expand_grid(sweep), [("topology.name", "ring")])


def test_only_on_the_command_line(tmp_path, plugin, capsys):
    cfg = tmp_path / "s.toml"
    cfg.write_text('kind = "sweep_test_plugins.fake_training"\n[privacy]\nepsilon = 1.0\n'
                   '[experiment]\nseed = 0\n[sweep]\nworkers = 1\n'
                   '[sweep.grid]\n"experiment.seed" = [0, 1, 2]\n')  # fmt: skip
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--output", str(out), "--no-progress",
                 "--only", "experiment.seed=1"]) == 0  # fmt: skip
    assert json.loads(capsys.readouterr().out)["done"] == 1
    assert plugin.read_text().splitlines() == ["1.0,1"]
    assert main(["sweep", str(cfg), "--output", str(out), "--only", "experiment.seed=9"]) == 2
    assert "matches no cell" in capsys.readouterr().err


def test_the_sweep_bar_stays_out_of_a_log_file(capsys):
    from dpdl.experiments.sweep.driver import _progress_bar

    bar = _progress_bar(3, 0, enabled=True)  # stderr is captured here: not a terminal
    bar.update(1)
    bar.close()
    assert bar.disable
    assert capsys.readouterr().err == ""


def test_declared_pairs_replace_the_registry_default_in_report_and_paired(
    tmp_path, plugin, capsys, monkeypatch
):
    """Issue 43: a sweep's [report] pairs (here Const-D2P against Dyn-D2P, the reverse of the
    registry's Dyn-over-Const) are what the report's gain column, claims and sentence and
    ``paired`` without --pair compare; a cell never sees the table."""
    from dpdl import plotting
    from dpdl.experiments.paired import main as paired_main
    from dpdl.experiments.report import check_claims, declared_pairs

    monkeypatch.setattr(plotting, "FORMATS", ("png",))  # the text is under test, not figures
    monkeypatch.setattr(plotting, "PNG_DPI", 72)
    config = _config()
    config["experiment"]["algorithms"] = ["const-d2p", "dyn-d2p"]
    config["report"] = {"pairs": [["const-d2p", "dyn-d2p"]]}
    out = tmp_path / "sweep"
    run_sweep(config, out, progress=False)
    recorded = json.loads((out / "sweep.json").read_text())
    assert recorded["report"] == {"pairs": [["const-d2p", "dyn-d2p"]]}
    assert "report" not in recorded["base"]
    assert declared_pairs(out) == [("const-d2p", "dyn-d2p")]
    runs = collect_runs(out)
    tables = build_tables(runs, declared_pairs(out))
    assert tables.accuracy_header[-1] == "gain Const vs Dyn"
    # eps=0.5: mean final accuracy 0.56 (const) and 0.66 (dyn), as hand-computed above
    assert tables.gains[("base", "const-d2p", "dyn-d2p", 0.5)] == pytest.approx(0.56 / 0.66 - 1)
    claims = dict(check_claims(runs, declared_pairs(out)))
    # every seed's Const-D2P is 0.1 below its Dyn-D2P: the interval lies below 0
    assert claims["Const-D2P > Dyn-D2P at equal ε"].startswith("did not hold")
    assert not any(claim.startswith("Dyn-D2P >") for claim in claims)  # not the registry's
    md = write_report(out)["markdown"].read_text()
    assert ("Gain (the pairs the sweep declared): relative accuracy of Const-D2P over "
            "Dyn-D2P.") in md
    assert "| Const-D2P > Dyn-D2P at equal ε | did not hold" in md
    # without the table the same runs get the registry's pair
    assert build_tables(runs).accuracy_header[-1] == "gain Dyn vs Const"
    capsys.readouterr()
    assert paired_main([str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" [")[0] for line in lines] == ["const-d2p - dyn-d2p"] * 2  # two ε
    assert all(": -10.0 points" in line and line.endswith("did not hold") for line in lines)


@pytest.mark.parametrize(("pairs", "message"), [
    ([["dyn-d2p@pld", "sgp"]], r"names 'sgp', which the config does not run \(it runs "
                               r"const-d2p@pld, dyn-d2p@pld, dyn-c-d2p@pld\)"),
    ([["dyn-d2p@pld", "dyn-d2p@pld"]], "not a pair of two different algorithm labels"),
    ([["dyn-d2p@pld"]], "not a pair"),
    ([], "must be a non-empty list"),
])  # fmt: skip
def test_declared_pairs_are_checked_against_what_the_sweep_runs(pairs, message):
    from dpdl.experiments.comparisons import split_report

    # the grid splits the algorithms over cells: a pair may span two cells
    sweep = {"grid": {"experiment.algorithms": [["const-d2p@pld"], ["dyn-d2p@pld",
                                                                    "dyn-c-d2p@pld"]]}}
    base, declared = split_report({"report": {"pairs": [["dyn-c-d2p@pld", "const-d2p@pld"]]}},
                                  sweep)  # fmt: skip
    assert declared == [("dyn-c-d2p@pld", "const-d2p@pld")] and "report" not in base
    with pytest.raises(DPDLError, match=message) as error:
        split_report({"report": {"pairs": pairs}}, sweep)
    assert "\n" not in str(error.value)
    with pytest.raises(DPDLError, match="unknown key"):
        split_report({"report": {"pair": pairs}}, sweep)
    # no grid over the algorithms: the base config's list
    with pytest.raises(DPDLError, match="it runs const-d2p, dyn-d2p"):
        split_report({"report": {"pairs": [["dyn-d2p@pld", "const-d2p"]]}})
