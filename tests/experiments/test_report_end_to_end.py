"""A real sweep end to end: the training runner in two spawn workers, resumed, reported.

Digits + logistic regression on 8 nodes for 20 steps, two seeds (one cell each) x two
algorithms x two target epsilons in one cell.  The certified epsilon the report states for
the CLT-calibrated Const-D2P is checked against dp_accounting's PLD of the closed-form
schedule (MATH.md §2, eq. 9), not against the code's own output.
"""

import csv
import json
import math
import statistics

import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import privacy_loss_distribution
from scipy.optimize import brentq
from scipy.stats import norm

from dpdl.experiments.report import build_tables, collect_runs, write_report
from dpdl.experiments.sweep import run_sweep
from dpdl.training.provenance import provenance

STEPS, DELTA, EPSILONS = 20, 1e-4, (0.5, 2.0)


def _config():
    return {
        "kind": "decentralized",
        "experiment": {"name": "e2e", "algorithms": ["const-d2p@clt", "dyn-d2p@clt"]},
        "data": {"dataset": "digits"},
        "model": {"name": "logreg"},
        "topology": {"name": "exp", "nodes": 8},
        "training": {
            "steps": STEPS,
            "batch_size": 8,
            "lr": 0.5,
            "eval_every": STEPS,
            "eval_train_samples": 200,
            "eval_node_samples": 100,
        },  # fmt: skip
        "privacy": {"epsilon": list(EPSILONS), "delta": DELTA, "clip": 0.3},
        "sweep": {"workers": 2, "grid": {"experiment.seed": [0, 1]}},
    }


def _gdp_mu(epsilon: float, delta: float) -> float:
    """μ of the μ-GDP mechanism that is (ε, δ)-DP (MATH.md §1, eq. 4), by root finding."""

    def excess(mu):
        return (
            norm.cdf(-epsilon / mu + mu / 2)
            - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)
            - delta
        )

    return brentq(excess, 1e-6, 100.0)


def _certified_const_d2p_clt(epsilon: float, sample_rate: float) -> float:
    """The PLD ε of Const-D2P calibrated by the CLT, under a run's default relation
    (replace-one: μ̄² = asinh(μ_tot² / (4 K p²)), MATH.md §1.3)."""
    mu_bar = math.sqrt(math.asinh(_gdp_mu(epsilon, DELTA) ** 2 / (4 * STEPS * sample_rate**2)))
    pld = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=1 / mu_bar,
        sampling_prob=sample_rate,
        value_discretization_interval=1e-4,
        neighboring_relation=NeighboringRelation.REPLACE_ONE,
    )
    return pld.self_compose(STEPS).get_epsilon_for_delta(DELTA)


def test_real_sweep_runs_resumes_and_reports(tmp_path):
    out = tmp_path / "sweep"
    assert run_sweep(_config(), out, progress=False) == {
        "cells": 2, "skipped": 0, "done": 2, "failed": {},
    }  # fmt: skip
    cells = sorted((out / "cells").iterdir())
    assert [c.name.split("_")[0] for c in cells] == ["seed=0", "seed=1"]
    # An interrupted cell (no cell.json, still .partial) is rerun; the finished one is kept.
    kept = json.loads((cells[0] / "cell.json").read_text())
    (cells[1] / "cell.json").unlink()
    cells[1].rename(cells[1].with_name(cells[1].name + ".partial"))
    assert run_sweep(_config(), out, progress=False)["skipped"] == 1
    assert json.loads((cells[0] / "cell.json").read_text()) == kept
    assert (cells[1] / "cell.json").is_file()

    runs = collect_runs(out)
    assert sorted((r.algorithm, r.seed, r.epsilon_target) for r in runs) == sorted(
        (a, s, e) for a in ("const-d2p@clt", "dyn-d2p@clt") for s in ("0", "1") for e in EPSILONS
    )
    assert all(r.iterations[-1] == STEPS and r.calibrated_with == "clt" for r in runs)
    results = json.loads(next((cells[0]).rglob("results.json")).read_text())
    sample_rate = results["cells"][0]["sample_rate"]
    for r in runs:
        # the schedule is calibrated so that its CLT epsilon is the target
        assert r.epsilon_clt == pytest.approx(r.epsilon_target, rel=1e-6)
        if r.algorithm == "const-d2p@clt":
            expected = _certified_const_d2p_clt(r.epsilon_target, sample_rate)
            assert r.epsilon_certified == pytest.approx(expected, rel=0.02)

    tables = build_tables(runs)
    assert len(tables.privacy_rows) == 8
    assert sorted(tables.clt_overspend_by_epsilon) == list(EPSILONS)
    paths = write_report(out)
    md = paths["markdown"].read_text()
    worst = max(tables.clt_overspend)
    assert f"up to {worst:.2f}× their target ε" in md
    assert "gain Dyn vs Const (clt)" in md
    assert paths["html"].read_text().count("data:image/png;base64,") == 2
    for stem in ("accuracy_vs_iteration", "accuracy_vs_epsilon"):  # vectors beside the PNGs
        assert (out / "report" / f"{stem}.pdf").read_bytes().startswith(b"%PDF-")
        assert b"<svg" in (out / "report" / f"{stem}.svg").read_bytes()[:2000]
    # where the runs came from (issue 43): the sweep's own block, and every run's in the report
    here = provenance()
    recorded = json.loads((out / "sweep.json").read_text())["provenance"]
    assert recorded["versions"] == here["versions"]
    assert results["provenance"]["cpu_capability"] == here["cpu_capability"]
    assert "## Provenance" in md and "**8 run(s):** commit: " in md
    assert f"CPU capability {here['cpu_capability']}" in md
    # what every node sent (issue 43): exp on 8 nodes, one peer per round, 20 rounds of digits'
    # logreg (650 float32 numbers) and the float64 weight
    # every node's own model beside the average (issue 43): the worst node of each seed's
    # final row, mean ± sample std over the two seeds
    worst = []
    for metrics in sorted((out / "cells").rglob("metrics.csv")):
        with metrics.open(newline="") as fh:
            rows = [r for r in csv.DictReader(fh)
                    if r["algorithm"] == "dyn-d2p@clt" and float(r["epsilon_target"]) == 0.5]
        worst.append(100 * float(rows[-1]["node_accuracy_worst"]))
    (line,) = [x for x in md.splitlines() if x.startswith("| base | dyn-d2p@clt | 0.5 |")]
    assert line.endswith(f"| {statistics.mean(worst):.2f} ± {statistics.stdev(worst):.2f} |")
    assert "## Communication: what each node sent in a run" in md
    assert "| base | dyn-d2p@clt | 20 | 20 | 52.2 kB |" in md  # 20 x 2608 bytes
