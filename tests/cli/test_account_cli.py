"""``dpdl account``: JSON keys, summary, schedule CSV, and one-line errors."""

import json
import subprocess
import sys

import numpy as np
import pytest

from dpdl.cli import main

ISSUE_ARGS = [
    "account",
    "--algorithm",
    "dyn-mu-d2p",
    "--epsilon",
    "1",
    "--delta",
    "1e-4",
    "--steps",
    "10000",
    "--sample-rate",
    "0.0004",
    "--rho-mu",
    "2",
    "--calibrate",
    "clt",
    "--neighboring",  # MATH.md §2's oracles are add/remove numbers
    "add-remove",
]


def run_cli(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_json_clt_calibration_has_the_issue_keys(capsys):
    code, out, err = run_cli(capsys, [*ISSUE_ARGS, "--report", "clt", "--json"])
    assert code == 0
    data = json.loads(out)
    for key in (
        "algorithm",
        "epsilon_target",
        "delta",
        "steps",
        "sample_rate",
        "calibrated_with",
        "mu_tot",
        "mu0",
        "noise_multiplier_first",
        "noise_multiplier_last",
        "epsilon",
    ):
        assert key in data, key
    assert data["algorithm"] == "dyn-mu-d2p" and data["calibrated_with"] == "clt"
    assert data["steps"] == 10000 and data["sample_rate"] == 0.0004
    assert data["mu0"] == pytest.approx(1.23087, abs=1e-5)  # MATH.md §2 oracle
    assert data["mu_tot"] == pytest.approx(0.313902, abs=1e-6)  # μ(1, 1e-4), MATH.md §1
    assert data["noise_multiplier_first"] == pytest.approx(1 / 1.23087, rel=1e-5)
    assert data["noise_multiplier_last"] == pytest.approx(
        1 / (1.23087 * 2 ** (9999 / 10000)), rel=1e-5
    )
    assert set(data["epsilon"]) == {"clt"}
    assert data["epsilon"]["clt"] == pytest.approx(1.0, rel=1e-8)


def test_const_json_reports_mu_bar_from_dataset_and_batch(capsys):
    argv = ["account", "--algorithm", "const-d2p", "--epsilon", "0.3", "--steps", "10000"]
    argv += ["--dataset-size", "2500", "--batch-size", "1", "--calibrate", "clt", "--json",
             "--neighboring", "add-remove"]  # fmt: skip
    code, out, _ = run_cli(capsys, [*argv, "--report", "clt"])
    data = json.loads(out)
    assert code == 0 and data["sample_rate"] == pytest.approx(1 / 2500)
    assert data["mu0"] is None
    assert data["noise_multiplier_first"] == pytest.approx(0.688360, abs=1e-6)
    assert data["mu_bar"] == pytest.approx(1 / 0.688360, rel=2e-6)


def test_schedule_out_csv(capsys, tmp_path):
    path = tmp_path / "schedule.csv"
    argv = ["account", "--algorithm", "dyn-d2p", "--epsilon", "1", "--steps", "500"]
    argv += ["--sample-rate", "0.01", "--calibrate", "clt", "--report", "clt", "--rho-c", "3"]
    code, out, _ = run_cli(capsys, [*argv, "--clip0", "2", "--schedule-out", str(path)])
    assert code == 0
    assert path.read_text().splitlines()[0] == "k,C_k,mu_k,sigma_k"
    table = np.loadtxt(path, delimiter=",", skiprows=1)
    assert table.shape == (500, 4)
    np.testing.assert_array_equal(table[:, 0], np.arange(500))
    np.testing.assert_allclose(table[:, 1], 2.0 * 3.0 ** (-np.arange(500) / 500), rtol=1e-14)
    np.testing.assert_allclose(table[:, 3], table[:, 1] / table[:, 2], rtol=1e-14)
    # The budget grows geometrically by ρ_μ = 2 (the default) over the run.
    np.testing.assert_allclose(table[:, 2] / table[0, 2], 2.0 ** (np.arange(500) / 500))


def test_readable_summary(capsys):
    code, out, err = run_cli(capsys, [*ISSUE_ARGS, "--report", "clt"])
    assert code == 0
    assert "dyn-mu-d2p" in out and "calibrated with clt" in out
    assert "mu0" in out and "1.23087" in out
    assert "approximate (CLT)" in out
    assert err == ""


def test_sgp_needs_no_epsilon(capsys):
    argv = ["account", "--algorithm", "sgp", "--steps", "10", "--sample-rate", "0.1"]
    code, out, _ = run_cli(capsys, [*argv, "--report", "clt", "--json"])
    data = json.loads(out)
    assert code == 0 and data["epsilon"] == {"clt": None}  # no finite guarantee


BAD = [
    (["--epsilon", "0"], "--epsilon must be > 0"),
    (["--epsilon", "-1"], "--epsilon must be > 0"),
    (["--delta", "1"], "--delta must lie in (0, 1)"),
    (["--delta", "0"], "--delta must lie in (0, 1)"),
    (["--sample-rate", "1.5"], "--sample-rate must lie in (0, 1]"),
    (["--sample-rate", "0"], "--sample-rate must lie in (0, 1]"),
    (["--rho-mu", "1"], "--rho-mu must be > 1"),
    (["--rho-c", "0.9"], "--rho-c must be > 1"),
    (["--steps", "0"], "--steps must be >= 1"),
    (["--algorithm", "dyn-x"], "unknown algorithm 'dyn-x'"),
    (["--calibrate", "moments"], "unknown accountant 'moments'"),
    (["--report", "clt,prv"], "unknown accountant 'prv'"),
    (["--blocks", "0"], "--blocks must be >= 1"),
    (["--dataset-size", "10"], "not both"),
]


@pytest.mark.parametrize(("change", "needle"), BAD)
def test_bad_input_is_one_line_on_stderr(capsys, change, needle):
    argv = list(ISSUE_ARGS)
    for flag, value in zip(change[::2], change[1::2], strict=True):
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    code, out, err = run_cli(capsys, argv)
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], err
    assert "Traceback" not in err


def test_subprocess_error_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "dpdl", "account", "--algorithm", "const-d2p"]
        + ["--epsilon", "-1", "--steps", "10", "--sample-rate", "0.1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1 and "epsilon" in proc.stderr
    assert "Traceback" not in proc.stderr


CERTIFIED = ["account", "--algorithm", "const-d2p", "--epsilon", "1", "--delta", "1e-4"]
CERTIFIED += ["--steps", "2000", "--sample-rate", "0.001"]


def test_default_calibration_is_certified_pld_and_warns_about_the_clt(capsys):
    code, out, err = run_cli(capsys, [*CERTIFIED, "--json"])
    data = json.loads(out)
    assert code == 0 and data["calibrated_with"] == "pld"
    assert set(data["epsilon"]) == {"clt", "pld", "rdp"}
    assert data["epsilon"]["pld"] <= 1.0 and data["epsilon"]["pld"] > 0.99
    assert data["certified"] == {"clt": False, "pld": True, "rdp": True}
    # p = 1e-3 with z ≈ 0.6: the CLT understates ε (MATH.md §2), so a warning is attached.
    assert data["epsilon"]["clt"] < 0.9 * data["epsilon"]["pld"]
    assert any("CLT" in warning for warning in data["warnings"])
    assert data["mu_bar"] == pytest.approx(1 / data["noise_multiplier_first"])
    assert data["mu0"] is None

    code, out, err = run_cli(capsys, [*CERTIFIED, "--report", "pld,clt"])
    assert code == 0 and "certified (pld-exact)" in out and "approximate (CLT)" in out
    assert err.startswith("warning: the CLT epsilon")


def test_account_never_imports_torch(tmp_path):
    script = (
        "import sys\n"
        "from dpdl.cli import main\n"
        "code = main(['account', '--algorithm', 'dyn-d2p', '--epsilon', '1', '--steps', '50',"
        " '--sample-rate', '0.1', '--calibrate', 'clt', '--report', 'clt', '--json'])\n"
        "assert code == 0\n"
        "assert 'torch' not in sys.modules, 'dpdl account imported torch'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr


def test_no_warning_where_the_clt_is_nearly_tight(capsys):
    """MATH.md §2: at b = 64 (p = 0.0256, K = 2000) CLT ε = 1 has PLD ε ≈ 1.009."""
    argv = ["account", "--algorithm", "const-d2p", "--epsilon", "1", "--steps", "2000"]
    argv += ["--dataset-size", "2500", "--batch-size", "64", "--calibrate", "clt",
             "--neighboring", "add-remove"]  # fmt: skip
    code, out, err = run_cli(capsys, [*argv, "--report", "clt,pld", "--json"])
    data = json.loads(out)
    assert code == 0 and data["sample_rate"] == pytest.approx(0.0256)
    assert data["epsilon"]["pld"] == pytest.approx(1.009, abs=0.005)
    assert data["warnings"] == []


def test_pld_report_of_a_long_dyn_schedule_prints_lower_and_upper(capsys):
    # 400 distinct multipliers: the binned PLD bound with its lower companion (issue 15)
    argv = ["account", "--algorithm", "dyn-mu-d2p", "--epsilon", "1", "--delta", "1e-5",
            "--steps", "400", "--sample-rate", "0.02", "--calibrate", "clt"]
    code, out, err = run_cli(capsys, [*argv, "--report", "pld", "--json"])
    data = json.loads(out)
    assert code == 0 and data["method"]["pld"] == "pld-binned(bins=500, exact)"
    # 400 distinct multipliers fit in 500 bins: the sandwich closes (exact composition)
    assert data["epsilon_lower"]["pld"] == data["epsilon"]["pld"]
    code, out, err = run_cli(capsys, [*argv, "--steps", "1200", "--report", "pld"])
    assert code == 0
    line = next(line for line in out.splitlines() if line.strip().startswith("pld"))
    lower, upper = (float(x) for x in line.split("[")[1].split("]")[0].split(","))
    assert 0 < lower < upper < lower * 1.01
    assert "pld-binned(bins=500)" in line


def test_the_default_relation_is_replace_one_and_named_everywhere(capsys):
    """A run's default relation (it releases node sizes): ε as dp_accounting's REPLACE_ONE PLD
    of the schedule, the relation in the JSON and in the text."""
    import dp_accounting as dpa
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import pld_privacy_accountant

    argv = ["account", "--algorithm", "const-d2p", "--epsilon", "1", "--steps", "300",
            "--sample-rate", "0.05", "--report", "clt,pld"]  # fmt: skip
    code, out, _ = run_cli(capsys, [*argv, "--json"])
    data = json.loads(out)
    assert code == 0 and data["neighboring"] == "replace-one"
    reference = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=NeighboringRelation.REPLACE_ONE)
    step = dpa.PoissonSampledDpEvent(0.05, dpa.GaussianDpEvent(data["noise_multiplier_first"]))
    reference.compose(step, 300)
    assert data["epsilon"]["pld"] == pytest.approx(reference.get_epsilon(1e-4), rel=1e-6)
    assert 0.997 <= data["epsilon"]["pld"] <= 1.0
    code, out, _ = run_cli(capsys, argv)
    assert code == 0 and "neighbouring relation replace-one" in out
    code, _, err = run_cli(capsys, [*argv, "--neighboring", "replace"])
    assert code != 0 and "unknown --neighboring 'replace'" in err
