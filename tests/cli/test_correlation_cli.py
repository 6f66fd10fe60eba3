"""privacy.correlation from a run config (issue 41): `dpdl audit` plays the config's pairwise
noise through the engine's own mechanism, under the observer threat only."""

import json

from tests.engine.test_correlated_runtime import DECOR

from dpdl.cli import main


def test_dpdl_audit_plays_a_decor_configs_noise_under_the_observer_threat(tmp_path, capsys):
    config = tmp_path / "decor.toml"
    config.write_text(DECOR)
    for threat in ("messages", "implementation", "reconstruct"):  # from the config or a flag
        for given in ([str(config)], ["--correlation", "neighbourhood-zero-sum",
                                      "--correlation-factor", "1"]):  # fmt: skip
            assert main(["audit", *given, "--threat", threat, "--trials", "4", "--no-plot"]) != 0
            error = capsys.readouterr().err.strip()
            assert "\n" not in error
            assert error.endswith(f"is audited under --threat observer; --threat {threat} "
                                  "plays independent noise"), error
    assert main(["audit", str(config), "--threat", "observer", "--observer", "2", "--nodes",
                 "4", "--topology", "ring", "--steps", "2", "--sample-rate", "1", "--trials",
                 "6", "--seed", "1", "--no-plot", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["design"]["correlation"] == "pairwise"
    assert out["design"]["correlation_factor"] == 2.0
