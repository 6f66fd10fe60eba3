"""``dpdl netdp``: tables, JSON, the Figure-1 PNG, one-line errors."""

import json

import pytest

from dpdl.cli import main


def test_netdp_json_reports_spec_oracles_and_pairwise_losses(tmp_path, capsys):
    png = tmp_path / "fig.png"
    rc = main(["netdp", "--n", "10", "20", "--walks", "1", "--json", "--plot", str(png)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["n"]: r for r in out["rows"]}
    assert rows[10]["heuristic"]["local"] == pytest.approx(11.762, abs=1e-3)
    assert rows[20]["heuristic"]["network"] == pytest.approx(9.759, abs=1e-3)
    emp = rows[20]["empirical"]["advanced"]
    assert emp["network_best"] <= emp["network_mean"] <= emp["network_worst"]
    assert emp["network_worst"] < emp["local_mean"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_netdp_tables(capsys):
    assert main(["netdp", "--n", "100", "--no-empirical", "--no-plot"]) == 0
    text = capsys.readouterr().out
    assert "20.034" in text and "5.112" in text and "network" in text


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--n", "1"], "--n values must be >= 2"),
        (["--epsilon0", "0"], "--epsilon0 must be a finite number > 0"),
        (["--steps", "0"], "--steps must be >= 1"),
        (["--delta", "2"], "--delta must lie in (0, 1)"),
    ],
)
def test_netdp_bad_input_is_one_line(argv, fragment, capsys):
    assert main(["netdp", "--no-plot", "--no-empirical", *argv]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1
