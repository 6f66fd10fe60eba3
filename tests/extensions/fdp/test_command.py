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


def test_pair_only_reports_the_pair_and_both_rdp_baselines(tmp_path, capsys):
    rc = main(["fdp", "-n", "32", "-T", "275", "--pair", "0", "1", "--output", str(tmp_path),
               "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    pair = out["pair"]
    # MATH.md §7 oracle (lemma form, K_loc = 1): 6.155 ± 0.002, bracketed by the twin
    assert abs(pair["epsilon_upper"] - 6.155) < 2e-3 and pair["epsilon_lower"] <= 6.1556
    assert pair["compositions"] == 8
    assert pair["epsilon_upper"] < pair["epsilon_rdp_ht"] < pair["epsilon_rdp_baseline"]
    assert "pn_fdp" not in out and "files" not in out and not list(tmp_path.iterdir())


def test_table_hop_form_and_target_column(tmp_path, capsys):
    base = ["fdp", "-n", "16", "-T", "160", "--sigma", "1.5", "--relative-slack", "1e-3",
            "--output", str(tmp_path), "--json"]
    assert main([*base, "--pair", "3", "2"]) == 0
    lemma = json.loads(capsys.readouterr().out)["pair"]["epsilon_upper"]
    assert main([*base, "--pair", "3", "2", "--hop-form", "table"]) == 0
    table = json.loads(capsys.readouterr().out)["pair"]["epsilon_upper"]
    assert table > lemma  # √K·Δ/(σ√t) > √K·Δ/(σ√(tK+1)) for every hop
    assert main([*base, "--target", "2", "--hop-form", "table"]) == 0
    out = json.loads(capsys.readouterr().out)
    column = np.loadtxt(tmp_path / "hypercube-n16-target2-epsilon.csv", delimiter=",")
    assert column.shape == (16, 3) and np.isnan(column[2, 1])
    # the same pair from the column, on its coarser μ² grid (1e-3 vs the pair's 1e-4)
    assert table <= column[3, 1] < table + 2e-3
    assert out["pn_fdp"]["pairs"] == 15
    assert abs(out["pn_fdp"]["epsilon_max"] - np.nanmax(column[:, 1])) < 1e-6


def test_pair_calibration_meets_the_target(capsys):
    from dpdl.extensions.fdp.accounting import BoundSettings, pnfdp_epsilon
    from dpdl.extensions.fdp.experiment import walk_matrix_of
    from dpdl.topology import make_topology

    rc = main(["fdp", "-n", "32", "-T", "275", "--pair", "0", "1", "--hop-form", "table",
               "--target-epsilon", "4", "--json"])
    assert rc == 0
    sigma = json.loads(capsys.readouterr().out)["calibration"]["sigma_pn_fdp"]
    walk = walk_matrix_of(make_topology("hypercube", 32))
    upper, _ = pnfdp_epsilon(walk, 0, 1, steps=275, sigma=sigma, delta=1e-5,
                             bound=BoundSettings(hop_form="table"))
    assert 4 * (1 - 1e-3) < upper <= 4


def test_scope_errors_exit_2(capsys):
    assert main(["fdp", "-n", "8", "--target", "8"]) == 2
    assert "--target 8" in capsys.readouterr().err


def test_heat_map_labels_lie_inside_the_figure():
    import io
    from types import SimpleNamespace

    from dpdl.extensions.fdp.command import heat_map_figure

    epsilon = np.random.default_rng(0).random((32, 32))
    np.fill_diagonal(epsilon, np.nan)
    report = SimpleNamespace(epsilon=epsilon, steps=275, sigma=1.0, delta=1e-5)
    fig = heat_map_figure(report, report, "hypercube")
    fig.savefig(io.BytesIO(), format="png", dpi=120)
    renderer = fig.canvas.get_renderer()
    labels = [ax.xaxis.label for ax in fig.axes if ax.get_xlabel()]
    labels += [ax.yaxis.label for ax in fig.axes if ax.get_ylabel()]
    assert len(labels) == 4
    for label in labels:
        extent = label.get_window_extent(renderer)
        assert fig.bbox.x0 <= extent.x0 and extent.x1 <= fig.bbox.x1, label.get_text()
        assert fig.bbox.y0 <= extent.y0 and extent.y1 <= fig.bbox.y1, label.get_text()


def _help(argv, capsys) -> str:
    import pytest

    with pytest.raises(SystemExit) as stop:
        main([*argv, "--help"])
    assert stop.value.code == 0
    return capsys.readouterr().out


def test_each_fdp_mode_has_its_own_help(capsys):
    overview = _help(["fdp"], capsys)
    pairwise = _help(["fdp", "pairwise"], capsys)
    decor = _help(["fdp", "decor"], capsys)
    assert len({overview, pairwise, decor}) == 3
    assert "--edgelist" in pairwise and "--edgelist" in decor
    assert "pairwise" in overview and "decor" in overview and "--pair" not in overview
    for flag in ("--pair", "--target J", "--hop-form", "--tolerance", "--zeta"):
        assert flag in pairwise and flag not in decor
    for flag in ("--sigma-cor", "--curious", "--clip"):
        assert flag in decor and flag not in pairwise


def test_a_mode_keeps_flags_given_before_it(tmp_path, capsys):
    argv = ["--graph", "undirected-ring", "-n", "8", "-T", "40", "--json"]
    assert main(["fdp", *argv, "decor"]) == 0
    before = json.loads(capsys.readouterr().out)
    assert main(["fdp", "decor", *argv]) == 0
    assert before == json.loads(capsys.readouterr().out)
    assert before["graph"] == "undirected-ring" and before["nodes"] == 8


def test_pairwise_on_the_users_edgelist(tmp_path, capsys):
    edges = tmp_path / "ring.txt"
    edges.write_text("# a ring of 6\n" + "".join(f"{u} {(u + 1) % 6}\n" for u in range(6)))
    common = ["-T", "60", "--sigma", "2", "--pair", "0", "3", "--json"]
    assert main(["fdp", "--edgelist", str(edges), *common]) == 0
    mine = json.loads(capsys.readouterr().out)
    assert main(["fdp", "pairwise", "--graph", "undirected-ring", "-n", "6", *common]) == 0
    named = json.loads(capsys.readouterr().out)
    assert mine["graph"] == "edgelist" and mine["nodes"] == 6
    assert mine["pair"] == named["pair"]  # the file's ring is the named ring


def test_a_bad_edgelist_is_one_line(tmp_path, capsys):
    edges = tmp_path / "bad.txt"
    edges.write_text("0 1\n1 2 3\n")
    assert main(["fdp", "--edgelist", str(edges), "-T", "40", "--pair", "0", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.txt:2" in err and "two node ids" in err
    assert main(["fdp", "--edgelist", str(edges), "--graph", "ring", "--pair", "0", "1"]) == 2
    assert "drop --graph" in capsys.readouterr().err
