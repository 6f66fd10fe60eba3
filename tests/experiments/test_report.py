"""The sweep report on hand-made sweep folders whose every number is known in closed form.

Cells hold several algorithms, seeds and target epsilons in one metrics.csv (as the real
runner writes them), so the report must group curves by (algorithm, seed, epsilon_target).
"""

import csv
import json
import math
import statistics

import pytest

from dpdl.experiments.report import build_tables, check_claims, collect_runs, write_report

COLUMNS = ["iteration", "algorithm", "seed", "epsilon_target", "train_loss", "test_accuracy",
           "epsilon_clt", "epsilon_certified"]  # fmt: skip
# Final accuracy of Const-D2P at each epsilon, and Dyn-D2P's relative gain over it.
CONST = {0.3: 0.50, 1.0: 0.70}
GAIN = {0.3: 0.40, 1.0: 0.10}
# Certified epsilon a CLT-calibrated schedule spends, as a multiple of its target.
CLT_OVERSPEND = {0.3: 2.5, 1.0: 3.0}


def _final(algorithm: str, eps: float | None, seed: int, offset: float = 0.0) -> float:
    name = algorithm.partition("@")[0]
    if name == "sgp":
        return 0.9 + 0.02 * seed
    base = CONST[eps] * (1 + GAIN[eps]) if name == "dyn-d2p" else CONST[eps]
    return base + 0.02 * seed + offset


def _write_cell(root, overrides: dict, seed: int, offset: float = 0.0):
    cell = root / "cells" / "_".join(f"{k}={v}" for k, v in overrides.items())
    cell.mkdir(parents=True)
    (cell / "cell.json").write_text(json.dumps({"overrides": overrides, "results": {}}))
    with open(cell / "metrics.csv", "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        writer.writerows(
            [it, "sgp", seed, "nan", 0.1, _final("sgp", None, seed) * it / 10, "inf", "inf"]
            for it in (0, 10)
        )
        for algorithm in ("const-d2p@clt", "dyn-d2p@clt", "const-d2p@pld", "dyn-d2p@pld"):
            for eps in (0.3, 1.0):
                spend = CLT_OVERSPEND[eps] if algorithm.endswith("@clt") else 0.99
                for it in (0, 10):
                    acc = _final(algorithm, eps, seed, offset) * it / 10
                    writer.writerow([it, algorithm, seed, eps, 1 - acc, acc, eps, spend * eps])


@pytest.fixture(autouse=True)
def png_only(monkeypatch):
    """The report's numbers and text are under test here: its figures are drawn as PNG only,
    at a screen's resolution (tests/experiments/test_figures.py checks the PNG, PDF and SVG
    of every figure at 200 dpi)."""
    from dpdl import plotting

    monkeypatch.setattr(plotting, "FORMATS", ("png",))
    monkeypatch.setattr(plotting, "PNG_DPI", 72)


@pytest.fixture
def sweep(tmp_path):
    for seed in (0, 1):
        _write_cell(tmp_path, {"experiment.seed": seed}, seed)
    return tmp_path


def test_runs_are_grouped_by_algorithm_seed_and_target_epsilon(sweep):
    runs = collect_runs(sweep)
    assert len(runs) == 2 * (1 + 4 * 2)
    keys = {(r.algorithm, r.seed, r.epsilon_target) for r in runs if r.private}
    assert len(keys) == 16 and {k[2] for k in keys} == {0.3, 1.0}
    assert {r.calibrated_with for r in runs if r.private} == {"clt", "pld"}


def test_accuracy_table_and_gain_per_epsilon_and_calibration(sweep):
    tables = build_tables(collect_runs(sweep))
    header = tables.accuracy_header
    assert header[:3] == ["setting", "ε", "sgp"]
    assert header[-2:] == ["gain Dyn vs Const (clt)", "gain Dyn vs Const (pld)"]
    rows = {(r[0], r[1]): dict(zip(header, r, strict=True)) for r in tables.accuracy_rows}
    assert set(rows) == {("base", "0.3"), ("base", "1")}
    std = 100 * statistics.stdev([0.0, 0.02])  # the sample std over seeds 0, 1
    # SGP has no epsilon: it is shown in every epsilon's row
    assert rows["base", "0.3"]["sgp"] == rows["base", "1"]["sgp"] == f"91.00 ± {std:.2f} (n=2)"
    assert rows["base", "0.3"]["const-d2p@clt"] == f"51.00 ± {std:.2f} (n=2)"
    for eps, text in ((0.3, "0.3"), (1.0, "1")):
        dyn = CONST[eps] * (1 + GAIN[eps]) + 0.01
        gain = dyn / (CONST[eps] + 0.01) - 1
        assert rows["base", text]["dyn-d2p@pld"].startswith(f"{100 * dyn:.2f} ± ")
        assert rows["base", text]["gain Dyn vs Const (clt)"] == f"{100 * gain:+.1f} %"
        assert tables.gains[("base", "dyn-d2p@clt", "const-d2p@clt", eps)] == pytest.approx(gain)


def test_a_single_seed_has_no_spread_to_report(tmp_path):
    _write_cell(tmp_path, {"experiment.seed": 0}, 0)
    tables = build_tables(collect_runs(tmp_path))
    rows = {(r[0], r[1]): dict(zip(tables.accuracy_header, r, strict=True))
            for r in tables.accuracy_rows}  # fmt: skip
    assert rows["base", "0.3"]["sgp"] == "90.00 (n=1)"
    assert rows["base", "1"]["const-d2p@clt"] == "70.00 (n=1)"


def _recording(name: str, draw, drawn: list):
    """``draw`` (an Axes method) that first notes (name, axes, label, yerr) in ``drawn``."""

    def record(ax, *args, **kwargs):
        if not kwargs.get("label", "_").startswith("_"):  # not the bars' own error bars
            drawn.append((name, ax, kwargs["label"], list(kwargs["yerr"])))
        return draw(ax, *args, **kwargs)

    return record


def test_error_bars_are_the_sample_std_over_seeds(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    offsets = {4: [0.0, 0.01, 0.05], 8: [0.0, -0.01, 0.02], 16: [0.03, 0.0, 0.0]}
    for nodes, per_seed in offsets.items():
        for seed, offset in enumerate(per_seed):
            _write_cell(tmp_path, {"topology.nodes": nodes, "experiment.seed": seed}, seed, offset)
    drawn = []
    for name in ("bar", "errorbar"):
        monkeypatch.setattr(Axes, name, _recording(name, getattr(Axes, name), drawn))
    write_report(tmp_path)

    def stdev(label: str, nodes: int) -> float:  # see _final: SGP has no offset
        finals = [0.02 * s + (0 if label == "SGP" else o) for s, o in enumerate(offsets[nodes])]
        return statistics.stdev(finals)

    # every accuracy here lies far from 0 and 1: the bars are ± std on both sides (issue 43:
    # points with error bars, not bars from zero; the registries' display names)
    points = [(ax.get_title(), label, yerr) for name, ax, label, yerr in drawn
              if name == "errorbar"]  # fmt: skip
    by_nodes = [(label, yerr) for title, label, yerr in points if title.startswith("ε")]
    assert len(by_nodes) == 2 * 5  # per epsilon, per algorithm: one point per number of nodes
    for label, (low, high) in by_nodes:
        assert list(low) == pytest.approx([stdev(label, n) for n in (4, 8, 16)])
        assert list(high) == pytest.approx(list(low))
    lines = [(title, label, yerr) for title, label, yerr in points if title.endswith("nodes")]
    assert len(lines) == 3 * 4  # per setting, per private algorithm: one point per epsilon
    assert {label for _, label, _ in lines} == {"Const-D2P (CLT)", "Dyn-D2P (CLT)",
                                                "Const-D2P (PLD)", "Dyn-D2P (PLD)"}
    for title, label, (low, high) in lines:
        expected = [stdev(label, int(title.split()[0]))] * 2
        assert list(low) == pytest.approx(expected) and list(high) == pytest.approx(expected)


def test_privacy_tables_state_what_the_clt_understated(sweep):
    tables = build_tables(collect_runs(sweep))
    assert len(tables.privacy_rows) == 16  # every private run, side by side
    # only the CLT-calibrated runs count towards the overspend, each at its own epsilon
    assert sorted(tables.clt_overspend_by_epsilon) == [0.3, 1.0]
    assert tables.clt_overspend_by_epsilon[0.3] == pytest.approx([2.5] * 4)
    assert max(tables.clt_overspend) == pytest.approx(3.0)
    paths = write_report(sweep)
    md = paths["markdown"].read_text()
    assert "up to 3.00× their target ε" in md
    assert "ε = 0.3: up to 2.50× (certified 0.75)" in md
    html = paths["html"].read_text()
    assert html.count("data:image/png;base64,") == 2  # accuracy vs iteration, vs epsilon
    assert (sweep / "report" / "accuracy_vs_epsilon.png").is_file()


def test_claims_of_the_paper_are_checked(sweep):
    claims = dict(check_claims(collect_runs(sweep)))
    # the same gain at both seeds: a zero-width paired interval above 0, at both epsilons
    assert claims["Dyn-D2P > const-d2p at equal ε (clt calibration)"].startswith(
        "held: paired by seed, the 95 % interval of the gain is above 0 in 2, below 0 in 0"
    )
    # GAIN shrinks from 40 % to 10 % as epsilon grows: the gap grows as epsilon falls
    assert claims["the Dyn-vs-Const gap grows as ε falls (pld calibration)"].startswith("held")


def test_topology_claim_heatmap_and_node_figures(tmp_path):
    offsets = {"ring": -0.05, "exp": 0.0, "complete": 0.02}
    for name, offset in offsets.items():
        _write_cell(tmp_path, {"topology.name": name, "experiment.seed": 0}, 0, offset)
    runs = collect_runs(tmp_path)
    claims = dict(check_claims(runs))
    assert claims["accuracy ring < exponential < complete"].startswith("held")
    assert (
        "strictly increasing in 8 of 8 (algorithm, ε)"
        in claims["accuracy ring < exponential < complete"]
    )
    write_report(tmp_path)
    assert (tmp_path / "report" / "topologies.png").is_file()

    rho = tmp_path / "rho"
    for rc in (1.5, 2.0):
        for rm in (1.5, 4.0):
            _write_cell(rho, {"privacy.rho_c": rc, "privacy.rho_mu": rm}, 0, 0.01 * rc * rm)
    write_report(rho)
    assert (rho / "report" / "rho.png").is_file()
    # a setting per (rho_c, rho_mu) point: four rows per epsilon
    assert len(build_tables(collect_runs(rho)).accuracy_rows) == 4 * 2
    assert not math.isnan(
        build_tables(collect_runs(rho)).gains[("rho_c=1.5, rho_mu=1.5", "dyn-d2p@clt",
                                               "const-d2p@clt", 0.3)]
    )


def test_a_diverged_run_is_named_in_the_report(sweep):
    cell = sweep / "cells" / "experiment.seed=0"
    record = {"algorithm": "dyn-d2p@pld", "seed": 0, "epsilon_target": 0.3, "status": "diverged"}
    (cell / "results.json").write_text(json.dumps({"cells": [record]}))
    runs = collect_runs(sweep)
    assert [(r.algorithm, r.epsilon_target) for r in runs if r.status == "diverged"] == [
        ("dyn-d2p@pld", 0.3)
    ]
    md = write_report(sweep)["markdown"].read_text()
    assert "1 run(s) diverged" in md and f"{cell.name}: dyn-d2p@pld seed 0 ε 0.3" in md


def test_runs_with_reproducible_noise_are_marked(sweep):
    seeded, secret = sweep / "cells" / "experiment.seed=0", sweep / "cells" / "experiment.seed=1"
    for cell, entropy in ((seeded, "seed"), (secret, "os")):
        seed = int(cell.name[-1])
        records = [{"algorithm": a, "seed": seed, "epsilon_target": eps, "noise_entropy": entropy}
                   for a in ("const-d2p@clt", "dyn-d2p@clt", "const-d2p@pld", "dyn-d2p@pld")
                   for eps in (0.3, 1.0)]  # fmt: skip
        (cell / "results.json").write_text(json.dumps({"cells": records}))
    runs = collect_runs(sweep)
    assert {r.noise_entropy for r in runs if r.private and r.seed == "0"} == {"seed"}
    noise = {(row[0], row[-1]) for row in build_tables(runs).privacy_rows}
    assert noise == {(seeded.name, "reproducible (entropy = seed)"),
                     (secret.name, "secret (OS entropy)")}  # fmt: skip
    paths = write_report(sweep)
    # 8 private runs of the seed-0 cell out of 18 runs (SGP's records were not written)
    note = f"8 of 18 runs (cells: {seeded.name}) used reproducible noise (entropy = seed)"
    assert f"**Note:** {note}" in paths["markdown"].read_text()
    assert f"<strong>Note:</strong> {note}" in paths["html"].read_text()
    assert "common_noise" not in paths["markdown"].read_text()
    # issue 43: runs that shared their streams on purpose are named as such
    records = json.loads((seeded / "results.json").read_text())
    for record in records["cells"][:3]:
        record["common_noise"] = True
    (seeded / "results.json").write_text(json.dumps(records))
    md = write_report(sweep)["markdown"].read_text()
    assert "3 of them shared their sampling and noise streams with every run" in md


def test_a_report_without_seeded_runs_has_no_reproducibility_note(sweep):
    runs = collect_runs(sweep)
    assert {r.noise_entropy for r in runs} == {None}  # results.json absent: not recorded
    assert {row[-1] for row in build_tables(runs).privacy_rows} == {"not recorded"}
    assert "entropy = seed" not in write_report(sweep)["markdown"].read_text()


def test_the_html_report_is_styled_and_aligns_text_left_numbers_right(sweep):
    html = write_report(sweep)["html"].read_text()
    style = html[html.index("<style>") : html.index("</style>")]
    for rule in ("font-family:system-ui", "max-width:1100px", "border:1px solid #ccc",
                 "padding:4px 10px", ".text{text-align:left}", ".num{text-align:right",
                 "img{max-width:100%"):  # fmt: skip
        assert rule in style, rule
    std = 100 * statistics.stdev([0.0, 0.02])
    assert "<td class='text'>base</td>" in html  # the setting column
    assert f"<td class='num'>51.00 ± {std:.2f} (n=2)</td>" in html
    assert "<th class='text'>claim</th><th class='text'>verdict</th>" in html


def test_columns_are_numeric_only_when_every_value_is_a_number():
    from dpdl.experiments.report.render import column_kinds

    header = ["setting", "ε", "gain", "note"]
    rows = [["base", "0.3", "+12.5%", "ok"], ["lr=0.1", "inf", "—", "3 runs"]]
    assert column_kinds(header, rows) == ["text", "num", "num", "text"]


def test_a_failed_cell_is_named_with_its_settings_and_error_line(sweep):
    from dpdl.experiments.sweep.driver import failure_record_path

    cell = sweep / "cells" / "experiment.seed=2"  # never finished: no folder, only the record
    error = "DPDLError: calibration failed: no noise scale brackets the target epsilon\n  more"
    record = {"overrides": {"experiment.seed": 2, "privacy.epsilon": 0.3}, "error": error}
    failure_record_path(cell).write_text(json.dumps(record))
    paths = write_report(sweep)
    md = paths["markdown"].read_text()
    assert "## Failed cells: 1" in md
    assert (f"| {cell.name} | experiment.seed=2, privacy.epsilon=0.3 | DPDLError: calibration "
            "failed: no noise scale brackets the target epsilon |") in md  # fmt: skip
    assert "more" not in md.partition("## Failed cells")[2]
    html = paths["html"].read_text()
    assert "<td class='text'>experiment.seed=2, privacy.epsilon=0.3</td>" in html
    assert len(collect_runs(sweep)) == 18  # the two finished cells only


def test_a_claim_whose_paired_interval_contains_zero_is_inconclusive(tmp_path):
    # Dyn-D2P ahead by 0.10 at seed 0 and behind by 0.02 at seed 1: higher on average, but
    # the seed-paired 95 % interval (t with one degree of freedom) contains 0
    finals = {("const-d2p@pld", 0): 0.50, ("dyn-d2p@pld", 0): 0.60,
              ("const-d2p@pld", 1): 0.52, ("dyn-d2p@pld", 1): 0.50}  # fmt: skip
    for seed in (0, 1):
        cell = tmp_path / "cells" / f"experiment.seed={seed}"
        cell.mkdir(parents=True)
        (cell / "cell.json").write_text(json.dumps({"overrides": {"experiment.seed": seed},
                                                    "results": {}}))  # fmt: skip
        with open(cell / "metrics.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(COLUMNS)
            for algorithm in ("const-d2p@pld", "dyn-d2p@pld"):
                for it in (0, 10):
                    acc = finals[(algorithm, seed)] * it / 10
                    writer.writerow([it, algorithm, seed, 1.0, 1 - acc, acc, 1.0, 0.99])
    claims = dict(check_claims(collect_runs(tmp_path)))
    verdict = claims["Dyn-D2P > const-d2p at equal ε (pld calibration)"]
    assert verdict.startswith("inconclusive")
    assert "contains 0 (or has one seed) in 1 of 1" in verdict


def test_the_introduction_speaks_of_the_pairs_that_ran(sweep):
    """Issue 43: the gain sentence names the families that ran and the baseline the registry
    gives them, never a fixed paper's pair; without a pair there is none."""
    from dpdl.experiments.report.document import _introduction

    intro = _introduction(collect_runs(sweep))
    assert "Gain: relative accuracy of Dyn-D2P over Const-D2P, under the same calibration." in (
        intro)
    assert "@clt by the approximation CLT; @pld by the certified accountant PLD." in intro
    for metrics in sweep.glob("cells/*/metrics.csv"):  # only SGP and Const-D2P (PLD) ran
        lines = metrics.read_text().splitlines()
        metrics.write_text("\n".join(line for line in lines
                                     if ",dyn-d2p" not in line and "@clt" not in line) + "\n")
    intro = _introduction(collect_runs(sweep))
    assert "Gain:" not in intro and "Dyn-D2P" not in intro and "@clt" not in intro
    assert "@pld by the certified accountant PLD." in intro
