"""``dpdl fdp`` end to end through the dispatcher."""

import json

import numpy as np

from dpdl.cli import main


def test_pairwise_writes_csv_and_png(tmp_path, capsys):
    rc = main(["fdp", "--graph", "hypercube", "-n", "8", "-T", "80", "--sigma", "2",
               "--relative-slack", "2e-3", "--target-epsilon", "3", "--output", str(tmp_path),
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    fdp_csv = np.loadtxt(tmp_path / "hypercube-n8-pn_fdp-epsilon.csv", delimiter=",")
    rdp_csv = np.loadtxt(tmp_path / "hypercube-n8-rdp_baseline-epsilon.csv", delimiter=",")
    assert fdp_csv.shape == (8, 8) and np.all(np.isnan(np.diag(fdp_csv)))
    off = ~np.eye(8, dtype=bool)
    assert np.all(fdp_csv[off] < rdp_csv[off])
    assert np.nanmax(fdp_csv) == np.float64(round(out["pn_fdp"]["epsilon_max"], 6))
    assert (tmp_path / "hypercube-n8-epsilon.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "hypercube-n8-tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    cal = out["calibration"]
    assert cal["sigma_pn_fdp"] < cal["sigma_rdp_baseline"]


def test_decor_spec_oracle_through_the_cli(capsys):
    rc = main(["fdp", "decor", "--graph", "undirected-ring", "-n", "16", "-T", "3500",
               "--sigma", "189.336", "--sigma-cor", "501", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["rho_step"] - 1.04097418e-5) < 1e-12
    assert abs(out["epsilon_rdp_simple"] - 1.3317534) < 1e-6


def test_user_errors_exit_2(tmp_path, capsys):
    assert main(["fdp", "-n", "8", "-T", "4", "--output", str(tmp_path)]) == 2
    assert "cap" in capsys.readouterr().err
    assert main(["fdp", "-n", "8", "--pair", "3", "3", "--output", str(tmp_path)]) == 2
    assert main(["fdp", "decor", "--graph", "ring", "-n", "8"]) == 2
    assert "undirected" in capsys.readouterr().err
