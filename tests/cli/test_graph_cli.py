"""`dpdl graph`: text and JSON summaries, drawing, one-line errors."""

import json

import numpy as np
import pytest

from dpdl.cli import main


def run_cli(capsys, *argv):
    status = main(["graph", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_exponential_graph_json(capsys):
    status, out, err = run_cli(capsys, "--topology", "exp", "--nodes", "20", "--json")
    assert status == 0 and err == ""
    summary = json.loads(out)
    assert summary["period"] == 5 and summary["time_varying"] and summary["directed"]
    assert [form[1][0] for form in summary["circulant"]] == [1, 2, 4, 8, 16]
    assert summary["connectivity"]["B"] == 5 and summary["connectivity"]["strongly_connected"]
    k = np.arange(1, 20)
    q = np.prod([np.abs(1 + np.exp(2j * np.pi * k * 2**t / 20)) / 2 for t in range(5)], axis=0)
    assert summary["mixing"]["q"] == pytest.approx(q.max(), abs=1e-12)
    assert summary["mixing"]["spectral_gap"] is None
    assert summary["out_degree"] == [[1]] * 5


def test_text_output_and_png(capsys, tmp_path):
    png = tmp_path / "ring.png"
    status, out, _ = run_cli(capsys, "-t", "ring", "-n", "16", "--png", str(png))
    assert status == 0
    assert "period        1" in out
    assert "diameter Δ = 15" in out
    assert f"{1 - np.cos(np.pi / 16):.6g}" in out  # spectral gap of the directed ring
    assert png.read_bytes().startswith(b"\x89PNG")


def test_exponential_text_lists_offsets(capsys):
    status, out, _ = run_cli(capsys, "--topology", "exp", "--nodes", "20")
    assert status == 0 and "offsets 1, 2, 4, 8, 16" in out and "torch.roll" in out


def test_random_and_file_graphs(capsys, tmp_path):
    status, out, _ = run_cli(
        capsys, "-t", "random-regular", "-n", "12", "--degree", "3", "--seed", "7", "--json"
    )
    assert status == 0 and json.loads(out)["out_degree"] == [[3]]
    edges = tmp_path / "edges.txt"
    edges.write_text("0 1\n1 2\n2 0\n")
    status, out, _ = run_cli(
        capsys, "-t", "edgelist", "--edgelist", str(edges), "--directed", "--json"
    )
    summary = json.loads(out)
    assert status == 0 and summary["n"] == 3 and summary["directed"]
    assert summary["connectivity"]["diameter"] == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nodes", "1"], "must be >= 2, got 1"),
        (["--topology", "mesh"], "unknown topology 'mesh'"),
        (["-t", "hypercube", "-n", "12"], "power of two"),
        (["-t", "exp", "-n", "20", "--window", "1"], "not 1-strongly connected"),
        (["-t", "ring", "--degree", "3"], "no parameter 'degree'"),
        (["-t", "ring", "--edgelist", "x.txt"], "--edgelist needs --topology edgelist"),
    ],
)
def test_bad_input_is_one_line_error(capsys, argv, message):
    status, out, err = run_cli(capsys, *argv)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("dpdl graph: error:") and message in err


def test_a_graph_that_is_not_strongly_connected_is_still_drawn(tmp_path, capsys):
    edges = tmp_path / "two.edges"
    edges.write_text("0 1\n1 2\n3 4\n")
    png = tmp_path / "two.png"
    code = main(["graph", "--topology", "edgelist", "--edgelist", str(edges), "--png", str(png)])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "node 0 cannot reach node 3" in err and f"drawn anyway to {png}" in err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
