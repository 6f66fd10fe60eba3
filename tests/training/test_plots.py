"""A run's figure, curves.png (issue 43): the paper style at 200 dpi, PDF and SVG only when
asked, the registries' names, seeds averaged with a band cut at the bounds, the worst node;
numbers from a hand-written metrics.csv."""

from __future__ import annotations

import csv
import json
import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from tests.experiments.test_figures import _png_dpi

from dpdl.training.plots import read_curves
from dpdl.training.results import write_results

COLUMNS = ["iteration", "algorithm", "seed", "epsilon_target", "test_loss", "test_accuracy",
           "node_accuracy_worst"]  # fmt: skip
# (algorithm, ε, seed) -> final test accuracy; seed 1 of Dyn-D2P at ε = 1 stops one
# evaluation short, so only the iterations both seeds reached are averaged
FINAL = {("sgp", "", 0): 0.99, ("sgp", "", 1): 0.97,
         ("dyn-d2p@pld", 0.3, 0): 0.50, ("dyn-d2p@pld", 0.3, 1): 0.70,
         ("dyn-d2p@pld", 1.0, 0): 0.80, ("dyn-d2p@pld", 1.0, 1): 0.84,
         ("const-d2p@clt", 0.3, 0): 0.40, ("const-d2p@clt", 0.3, 1): 0.42,
         ("const-d2p@clt", 1.0, 0): 0.60, ("const-d2p@clt", 1.0, 1): 0.64}  # fmt: skip


def _metrics(path):
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for (algorithm, eps, seed), final in FINAL.items():
            last = 10 if (algorithm, eps, seed) == ("dyn-d2p@pld", 1.0, 1) else 20
            for it in range(0, last + 1, 10):
                acc = final * it / 20
                worst = "nan" if algorithm == "sgp" else acc - 0.1
                writer.writerow([it, algorithm, seed, eps, 2.0 - acc, acc, worst])
    return path


def test_curves_average_the_seeds_at_the_iterations_every_seed_reached(tmp_path):
    curves = {(c.algorithm, c.epsilon): c for c in read_curves(_metrics(tmp_path / "m.csv"))}
    # one curve per (algorithm, ε): SGP's without an ε
    assert len(curves) == 5 and {a for a, _ in curves} == {"sgp", "dyn-d2p@pld", "const-d2p@clt"}
    dyn = curves["dyn-d2p@pld", 0.3]
    assert list(dyn.iteration) == [0, 10, 20] and dyn.seeds == 2
    assert dyn.mean["test_accuracy"][-1] == pytest.approx(0.6)
    assert dyn.std["test_accuracy"][-1] == pytest.approx(np.std([0.5, 0.7], ddof=1))
    assert dyn.mean["node_accuracy_worst"][-1] == pytest.approx(0.5)
    short = curves["dyn-d2p@pld", 1.0]
    assert list(short.iteration) == [0, 10]  # seed 1 stopped at 10
    assert short.mean["test_accuracy"][-1] == pytest.approx((0.40 + 0.42) / 2)
    sgp = next(c for c in curves.values() if c.algorithm == "sgp")
    assert math.isnan(sgp.epsilon) and not sgp.has("node_accuracy_worst")


def test_the_runs_figure_is_a_200_dpi_png_and_its_vectors_only_when_asked(tmp_path):
    _metrics(tmp_path / "metrics.csv")
    results = write_results(tmp_path, [], plot_title="run")
    png = tmp_path / "curves.png"
    assert results["plot"] == str(png)
    width, height, dpi = _png_dpi(png.read_bytes())
    assert dpi == pytest.approx(200, abs=1) and width >= 1000 and height >= 600
    assert not png.with_suffix(".pdf").exists() and not png.with_suffix(".svg").exists()
    write_results(tmp_path, [], plot_title="run", vector_figures=True)
    assert png.with_suffix(".pdf").read_bytes().startswith(b"%PDF-")
    svg = png.with_suffix(".svg").read_text()
    assert ET.fromstring(svg).tag == "{http://www.w3.org/2000/svg}svg"
    # the registries' names, one row of panels per ε, the line styles' key, the seeds
    for text in ("Dyn-D2P (PLD)", "Const-D2P (CLT)", "SGP", "ε = 0.3", "ε = 1",
                 "worst node", "mean of 2 seeds"):  # fmt: skip
        assert text in svg, text
    assert "dyn-d2p@pld" not in svg
    assert json.loads((tmp_path / "results.json").read_text())["plot"] == str(png)


def test_the_command_line_switch_reaches_the_config():
    from dpdl.cli import build_parser
    from dpdl.commands.run import _overrides, apply_command_overrides

    argv = ["run", "--preset", "default", "--vector-figures"]
    args = build_parser(argv).parse_args(argv)
    config = apply_command_overrides({"kind": "decentralized"}, _overrides(args))
    assert config["experiment"]["vector_figures"] is True
    argv = ["run", "--preset", "default"]
    assert "vector_figures" not in _overrides(build_parser(argv).parse_args(argv))
