"""``dpdl audit``: the JSON keys, the PNG, a run config, and one-line errors."""

import json

import pytest

from dpdl.cli import main

BASE = ["audit", "--algorithm", "const-d2p", "--epsilon", "2", "--delta", "1e-5",
        "--steps", "5", "--sample-rate", "1"]  # fmt: skip
KEYS = {"epsilon_lower", "epsilon_lower_gdp", "confidence", "trials", "threat",
        "epsilon_certified", "epsilon_clt", "claim_refuted"}  # fmt: skip


def test_json_has_the_issue_keys_and_writes_a_png(capsys, tmp_path):
    png = tmp_path / "audit.png"
    code = main([*BASE, "--trials", "400", "--seed", "1", "--json", "--plot", str(png)])
    out, _ = capsys.readouterr()
    assert code == 0
    data = json.loads(out)
    assert KEYS <= set(data)
    assert data["threat"] == "messages" and data["trials"] == 400 and data["confidence"] == 0.95
    assert data["epsilon_certified"] == pytest.approx(2.0, abs=1e-3)
    assert data["claim_refuted"] is False and data["seeded"] is True
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_subsampled_final_audit_has_no_gdp_bound(capsys, tmp_path):
    argv = [*BASE[:-1], "0.5", "--threat", "final", "--trials", "200", "--json", "--no-plot"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["threat"] == "final" and data["canary"] == "input"
    assert data["epsilon_lower_gdp"] is None


def test_text_output_names_threat_and_verdict(capsys, tmp_path):
    code = main([*BASE, "--trials", "200", "--noise-scale", "0.5", "--no-progress",
                 "--plot", str(tmp_path / "a.png")])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "threat: messages" in out and "epsilon_lower" in out and "claim epsilon 2" in out


def test_run_config_is_audited_with_its_schedule(capsys, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text(
        'kind = "decentralized"\n[experiment]\nalgorithms = ["sgp", "dyn-d2p@clt"]\n'
        '[data]\ndataset = "digits"\n[topology]\nnodes = 4\n'
        "[training]\nsteps = 6\nbatch_size = 8\n[privacy]\nepsilon = 3.0\ndelta = 1e-5\n"
    )
    assert main(["audit", str(config), "--trials", "100", "--json", "--no-plot"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["algorithm"] == "dyn-d2p" and data["calibrated_with"] == "clt"
    assert data["epsilon_claimed"] == 3.0 and data["steps"] == 6
    assert data["sample_rate"] == pytest.approx(8 / 359)  # digits: 1437 records over 4 nodes


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--trials", "1"], "--trials must be >= 2"),
        (["--noise-scale", "0"], "--noise-scale must be positive"),
        (["--noise-scale", "-2"], "--noise-scale must be positive"),
        (["--nodes", "1"], "no messages"),
        (["--canary", "input"], "final"),
    ],
)
def test_bad_input_is_one_line(capsys, extra, needle):
    assert main([*BASE, *extra, "--no-plot"]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1 and err.startswith("dpdl audit: error:")


def test_missing_mechanism_is_one_line(capsys):
    assert main(["audit", "--epsilon", "1", "--no-plot"]) == 2
    assert "--algorithm is required" in capsys.readouterr().err


def test_one_run_mode_reports_its_guesses(capsys):
    assert main([*BASE, "--one-run", "100", "--seed", "3", "--json", "--no-plot"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["trials"] == 1 and data["epsilon_lower_gdp"] is None
    assert data["one_run"]["canaries"] == 100
    assert main([*BASE, "--one-run", "100", "--trials", "10", "--no-plot"]) == 2
    assert "not both" in capsys.readouterr().err
