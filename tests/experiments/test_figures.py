"""Figures a paper can take (issue 43): every figure as PNG of at least 200 dpi, PDF and
SVG, checked by the files' own headers; bands that stop at a physical bound; the
registries' names in the drawings; ``dpdl report --figures-only``."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from tests.experiments.test_report import _write_cell

from dpdl.cli import main
from dpdl.errors import DPDLError
from dpdl.plotting import band, paper_style, pyplot, save_figure, spans_decades

FIGURES = ("accuracy_vs_iteration", "accuracy_vs_epsilon", "nodes")


def _png_dpi(data: bytes) -> tuple[int, int, float]:
    """(width, height, dots per inch) from a PNG's IHDR and pHYs chunks (PNG spec 11.2.2,
    11.3.5.3: pixels per metre)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    at, dpi, size = 8, None, None
    while at < len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + length]
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"pHYs":
            x, _, unit = struct.unpack(">IIB", body)
            assert unit == 1  # per metre
            dpi = x * 0.0254
        at += 12 + length
    return (*size, dpi)


def _check_formats(folder, stem: str) -> None:
    width, height, dpi = _png_dpi((folder / f"{stem}.png").read_bytes())
    assert dpi == pytest.approx(200, abs=1) and width >= 800 and height >= 400
    pdf = (folder / f"{stem}.pdf").read_bytes()
    assert pdf.startswith(b"%PDF-") and pdf.rstrip().endswith(b"%%EOF")
    root = ET.fromstring((folder / f"{stem}.svg").read_bytes())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"


@pytest.fixture
def sweep(tmp_path):
    for nodes, offsets in {4: [0.0, 0.01], 8: [0.02, -0.01]}.items():
        for seed, offset in enumerate(offsets):
            _write_cell(tmp_path, {"topology.nodes": nodes, "experiment.seed": seed}, seed,
                        offset)  # fmt: skip
    return tmp_path


def test_the_report_and_figures_only_draw_every_figure_in_three_formats(sweep, tmp_path,
                                                                        capsys):
    assert main(["report", str(sweep)]) == 0
    folder = sweep / "report"
    for stem in FIGURES:
        _check_formats(folder, stem)
    svg = (folder / "accuracy_vs_epsilon.svg").read_text()
    # text stays text (svg.fonttype none): the labels are readable, not raw config names
    assert "Dyn-D2P (PLD)" in svg and "4 nodes" in svg
    assert "dyn-d2p@pld" not in svg and "nodes=4" not in svg
    md = (folder / "report.md").read_text()
    assert "[accuracy_vs_iteration.pdf](accuracy_vs_iteration.pdf)" in md
    capsys.readouterr()
    # drawn again from the finished cells alone, the text left as it is
    out = tmp_path / "figures"
    assert main(["report", str(sweep), "--figures-only", "--output", str(out)]) == 0
    for stem in FIGURES:
        _check_formats(out, stem)
    assert not (out / "report.md").exists()
    assert capsys.readouterr().out.count("wrote ") == 3 * len(FIGURES)


def test_a_band_never_crosses_the_bound_it_is_given():
    with paper_style():
        fig, ax = pyplot().subplots()
        x = np.arange(4.0)
        mean, std = np.array([0.05, 0.5, 0.9, 0.98]), np.array([0.1, 0.1, 0.05, 0.1])
        band(ax, x, mean - std, mean + std, color="k", floor=0.0, ceiling=1.0)
        (poly,) = ax.collections
        y = poly.get_paths()[0].vertices[:, 1]
        assert y.min() == 0.0 and y.max() == 1.0  # mean - std = -0.05, mean + std = 1.08
        pyplot().close(fig)


def test_log_scale_only_where_the_values_span_decades():
    assert spans_decades([0.01, 0.5, 3.0]) and not spans_decades([0.3, 1.0, 3.0])
    assert not spans_decades([0.0, 10.0, 1000.0])  # zero has no place on a log axis


def test_a_figure_is_named_by_its_png(tmp_path):
    fig = pyplot().figure()
    with pytest.raises(DPDLError, match="named by its PNG file; got .*curves.pdf"):
        save_figure(fig, tmp_path / "curves.pdf")
