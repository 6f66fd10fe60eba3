"""``dpdl gossip account``: one pair, every pair by distance, calibration, bad input."""

import json

import numpy as np
import pytest

from dpdl.accounting import gossip
from dpdl.cli import main
from dpdl.topology import make_topology


def test_one_pair_matches_the_library(capsys):
    assert main(["gossip", "account", "-t", "exp", "-n", "8", "-T", "5", "--sigma", "1.5",
                 "-u", "3", "-v", "0", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    P = make_topology("exp", 8).mixing_matrix
    want = gossip.view_mu(P, rounds=5, target=3, observers=[0], sigma=1.5)
    assert out["mu"] == pytest.approx(want, rel=1e-12)
    assert out["epsilon"] < out["local_dp_epsilon"]


def test_every_pair_by_distance_and_the_calibration(tmp_path, capsys):
    png = tmp_path / "heat.png"
    assert main(["gossip", "account", "-t", "undirected-ring", "-n", "10", "-T", "6",
                 "--sigma", "2", "--plot", str(png), "--calibrate", "1", "--beyond", "2",
                 "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    worst = [row["worst"] for row in out["by_distance"]]
    assert worst == sorted(worst, reverse=True)  # privacy grows with distance
    assert worst[0] < out["local_dp_epsilon"]
    assert png.is_file() and png.stat().st_size > 10_000
    P = make_topology("undirected-ring", 10).mixing_matrix
    eps = gossip.epsilon_of(gossip.pairwise_mu(P, rounds=6, sigma=out["calibrated_sigma"]), 1e-5)
    far = gossip.graph_distances(P, 6) > 2
    np.fill_diagonal(far, False)
    assert np.nanmax(eps[far]) == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("args, fragment", [
    (["--sigma", "0"], "sigma must be a finite number > 0"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["-u", "2", "-v", "2"], "the target 2 is one of the observers"),
    (["-u", "2"], "give both --target and --observer"),
])  # fmt: skip
def test_bad_input_is_one_line(args, fragment, capsys):
    assert main(["gossip", "account", "-t", "ring", "-n", "6", *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_correlated_noise_under_each_named_trust_model(capsys):
    """DECOR on the complete graph: Sec-LDP's eavesdropper gets the closed form
    T (Δ/σ)² (1/n + (1 − 1/n)/(1 + f² n)); the curious neighbours (every other node) hold
    every secret of the target, so only the independent part protects (today's view)."""
    import math

    from dpdl.accounting.gossip import view_mu
    from dpdl.topology import make_topology

    base = ["gossip", "account", "-t", "complete", "-n", "5", "--rounds", "3", "--sigma", "2",
            "-u", "1", "--correlation", "pairwise", "--correlation-factor", "3", "--json"]
    assert main([*base, "--trust", "sec-ldp"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trust"] == "sec-ldp" and out["observers"] == []
    assert out["mu"] == pytest.approx(math.sqrt(3 / 4 * (1 / 5 + (4 / 5) / (1 + 9 * 5))))
    assert main([*base, "--trust", "curious-neighbours"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["observers"] == [0, 2, 3, 4]
    P = make_topology("complete", 5).mixing_matrix(0)
    assert out["mu"] == pytest.approx(view_mu(P, rounds=3, target=1, observers=[0, 2, 3, 4],
                                              sigma=2.0), rel=1e-9)  # fmt: skip
    assert main(["gossip", "account", "-t", "ring", "-n", "5", "--correlation", "pairwise"]) == 2
    assert "--correlation pairwise: give --target" in capsys.readouterr().err
