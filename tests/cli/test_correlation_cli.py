"""privacy.correlation from a run config (issue 41): `dpdl audit` refuses to audit a DECOR
config with its independent-noise trials (it would certify another mechanism)."""

from tests.engine.test_correlated_runtime import DECOR

from dpdl.cli import main


def test_dpdl_audit_refuses_a_decor_config_instead_of_auditing_independent_noise(tmp_path,
                                                                                  capsys):
    config = tmp_path / "decor.toml"
    config.write_text(DECOR)
    assert main(["audit", str(config), "--trials", "4"]) != 0
    error = capsys.readouterr().err.strip()
    assert "\n" not in error
    assert error.endswith("dpdl audit plays independent noise only, not privacy.correlation = "
                          "'pairwise'")
