"""Reconstruction attacks on gossip and decentralized GD (El Mrini, Cyffers & Bellet 2024).

Oracles: the paper's Figure 1 (coalition {0, 1}, T = 3: every honest node but 3 and 4
reconstructible), a rank test and an explicit pair of indistinguishable inputs for the set of
reconstructible nodes, the protocol run forward for the observations, autograd for the
gradient inversion, and the exact view μ of dpdl.accounting.gossip (Cramér–Rao) for the noisy
runs.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import networkx as nx
import numpy as np
import pytest
import torch
from scipy import stats

from dpdl.accounting.gossip import view_mu
from dpdl.accounting.schedules import make_schedule
from dpdl.audit.reconstruct import (
    attack_gossip,
    informed_estimate,
    knowledge_matrix,
    reconstructible,
    simulate_gossip,
)
from dpdl.audit.reconstruct_dgd import attack_dgd, record_from_gradient
from dpdl.cli import main
from dpdl.errors import DPDLError
from dpdl.topology import make_topology
from dpdl.topology.weights import metropolis_hastings_weights

FIGURE1 = Path(__file__).parents[2] / "examples" / "graphs" / "elmrini2024_figure1.edges"


def _figure1():
    return make_topology("edgelist", 12, path=FIGURE1)


def _random_graph(n, p, seed):
    while True:
        g = nx.erdos_renyi_graph(n, p, seed=seed)
        if nx.is_connected(g):
            return metropolis_hastings_weights(nx.to_numpy_array(g, dtype=bool))
        seed += 1000


def test_the_papers_figure1_graph_and_coalition():
    P = _figure1().mixing_matrix(0)
    k = knowledge_matrix(P, rounds=3, coalition=[0, 1])
    assert sorted({j for _, j in k.view.rows}) == [2, 5, 7, 8]  # "receive updates from ..."
    hit = reconstructible(k)
    assert [u for u in range(2, 12) if not hit[u]] == [3, 4]  # "only nodes 3 and 4 are not"
    assert list(np.flatnonzero(reconstructible(knowledge_matrix(P, rounds=1,
                                                                coalition=[0, 1])))) == [2, 5, 7, 8]


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("contribution", ["once", "every-round"])
def test_reconstructible_nodes_agree_with_a_rank_test_and_others_are_indistinguishable(
    seed, contribution
):
    rng = np.random.default_rng(seed)
    n, rounds = 9, int(rng.integers(1, 5))
    P = _random_graph(n, 0.3, seed)
    coalition = sorted(rng.choice(n, size=int(rng.integers(1, 3)), replace=False).tolist())
    k = knowledge_matrix(P, rounds=rounds, coalition=coalition, contribution=contribution)
    honest = [u for u in range(n) if u not in coalition]
    K = k.matrix[:, honest]
    rank = np.linalg.matrix_rank(K)
    hit = reconstructible(k)
    values = rng.random(n)
    result = attack_gossip(P, values, rounds=rounds, coalition=coalition,
                           contribution=contribution)  # fmt: skip
    observed, _ = simulate_gossip(P, values, rounds=rounds, coalition=coalition,
                                  contribution=contribution)  # fmt: skip
    null = np.linalg.svd(K)[2][rank:] if rank < len(honest) else np.zeros((0, len(honest)))
    for i, u in enumerate(honest):
        e = np.eye(len(honest))[i]
        assert hit[u] == (np.linalg.matrix_rank(np.vstack([K, e])) == rank)
        if hit[u]:
            assert abs(result.estimate[u] - values[u]) < 1e-9
            continue
        assert math.isnan(result.estimate[u])
        # a second input, different at u, that the coalition cannot tell apart
        w = null[np.argmax(np.abs(null[:, i]))]
        other = values.copy()
        other[honest] += w
        seen, _ = simulate_gossip(P, other, rounds=rounds, coalition=coalition,
                                  contribution=contribution)  # fmt: skip
        assert abs(other[u] - values[u]) > 1e-3 and np.allclose(seen, observed, atol=1e-12)
    assert not hit[coalition].any()


def test_observations_of_the_forward_run_are_the_knowledge_matrix_times_the_values():
    topology = make_topology("exp", 8)  # time-varying and directed
    values = np.random.default_rng(0).random((8, 3))
    observed, _ = simulate_gossip(topology.mixing_matrix, values, rounds=4, coalition=[3],
                                  contribution="every-round")  # fmt: skip
    k = knowledge_matrix(topology.mixing_matrix, rounds=4, coalition=[3],
                         contribution="every-round")  # fmt: skip
    assert np.allclose(observed, k.matrix @ values, atol=1e-12)


def test_the_informed_adversarys_error_is_the_cramer_rao_floor_of_the_exact_view_mu():
    P = _figure1().mixing_matrix(0)
    sigma, target, trials = 0.2, 9, 3000  # 9 is two hops from the coalition
    mu = view_mu(P, rounds=3, target=target, observers=[0, 1], sigma=sigma, contribution="once")
    values = np.random.default_rng(1).random(12)
    rng = np.random.default_rng(2)
    errors = []
    for _ in range(trials):
        observed, noises = simulate_gossip(P, values, rounds=3, coalition=[0, 1], sigma=sigma,
                                           rng=rng)  # fmt: skip
        errors.append(informed_estimate(P, observed, values, noises, rounds=3,
                                        coalition=[0, 1], target=target) - values[target])
    errors = np.asarray(errors)
    var = errors.var(ddof=1)
    lo, hi = (var * (trials - 1) / stats.chi2.ppf(q, trials - 1) for q in (0.9995, 0.0005))
    assert lo <= (1 / mu) ** 2 <= hi
    assert abs(errors.mean()) < 4 * (1 / mu) / math.sqrt(trials)  # unbiased


def test_a_dp_gossip_run_defeats_the_attack():
    """σ for local (ε = 1, δ = 1e-5)-DP of every value: the attack's error on every
    reconstructible node is at least the Cramér–Rao floor Δ/μ_u ≥ σ ≈ 3.7, the range of the
    values (0..1) many times over."""
    P = _figure1().mixing_matrix(0)
    sigma = 1 / 0.268  # μ(1, 1e-5) ≈ 0.268
    values = np.random.default_rng(3).random(12)
    rng = np.random.default_rng(4)
    runs = [attack_gossip(P, values, rounds=3, coalition=[0, 1], sigma=sigma, rng=rng)
            for _ in range(400)]  # fmt: skip
    clean = attack_gossip(P, values, rounds=3, coalition=[0, 1])
    rmse = np.sqrt(np.mean([r.errors() ** 2 for r in runs], axis=0))
    for u in np.flatnonzero(clean.reconstructible):
        floor = 1 / view_mu(P, rounds=3, target=u, observers=[0, 1], sigma=sigma,
                            contribution="once")  # fmt: skip
        assert clean.errors()[u] < 1e-9
        assert floor >= sigma * (1 - 1e-9) and rmse[u] >= 0.85 * floor
        assert rmse[u] > 3


def test_record_from_gradient_inverts_autograd():
    torch.manual_seed(0)
    model = torch.nn.Linear(6, 4, dtype=torch.float64)
    x, y = torch.rand(6, dtype=torch.float64), 2
    loss = torch.nn.functional.cross_entropy(model(x)[None], torch.tensor([y]))
    gw, gb = torch.autograd.grad(loss, [model.weight, model.bias])
    got, label = record_from_gradient(gw.numpy(), gb.numpy())
    assert np.allclose(got, x.numpy(), atol=1e-12) and label == y


def _digits(n=12, seed=0):
    from sklearn.datasets import load_digits

    X, Y = load_digits(return_X_y=True)
    pick = np.random.default_rng(seed).choice(len(X), n, replace=False)
    return X[pick] / 16.0, Y[pick]


def test_dgd_through_the_engine_leaks_records_and_a_dp_run_defeats_it():
    topology = _figure1()
    x, y = _digits()
    clean = attack_dgd(topology, x, y, 10, rounds=3, coalition=[0, 1], lr=0.01)
    hit = clean.reconstructible
    assert [u for u in range(2, 12) if not hit[u]] == [3, 4]
    errors = clean.relative_errors()
    assert np.all(errors[hit] < 0.05)
    assert clean.extra["labels_recovered"] == int(hit.sum()) == 8
    steep = attack_dgd(topology, x, y, 10, rounds=3, coalition=[0, 1], lr=1.0)
    assert np.median(steep.relative_errors()[hit]) > 10 * np.median(errors[hit])  # paper Fig. 4

    schedule = make_schedule("const-d2p", epsilon=1.0, delta=1e-5, steps=3, sample_rate=1.0)
    private = attack_dgd(topology, x, y, 10, rounds=3, coalition=[0, 1], lr=0.01,
                         schedule=schedule, seed=5)  # fmt: skip
    mean_digit_error = np.linalg.norm(x - x.mean(axis=0), axis=1) / np.linalg.norm(x, axis=1)
    assert np.all(private.relative_errors()[hit] > 1.5 * np.median(mean_digit_error))
    assert private.extra["labels_recovered"] <= 4  # chance: 0.8 of 8


def test_attack_dgd_refuses_bad_input():
    topology = _figure1()
    x, y = _digits()
    with pytest.raises(DPDLError, match="lr must be positive, got 0"):
        attack_dgd(topology, x, y, 10, rounds=3, coalition=[0], lr=0.0)
    with pytest.raises(DPDLError, match="11 records for a topology of 12 nodes"):
        attack_dgd(topology, x[:11], y[:11], 10, rounds=3, coalition=[0], lr=0.1)
    with pytest.raises(DPDLError, match=r"observers: node 12 is not in 0..11"):
        knowledge_matrix(topology.mixing_matrix(0), rounds=2, coalition=[12])
    with pytest.raises(DPDLError, match="rounds must be a positive integer, got 0"):
        knowledge_matrix(topology.mixing_matrix(0), rounds=0, coalition=[1])


def _cli(capsys, *extra):
    code = main(["audit", "--threat", "reconstruct", "--edgelist", str(FIGURE1),
                 "--coalition", "0", "1", *extra])  # fmt: skip
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_cli_reproduces_figure1_and_reports_a_dp_run(capsys):
    code, out, _ = _cli(capsys)
    assert code == 0
    assert "coalition [0, 1] hears from [2, 5, 7, 8]" in out
    assert "reconstructible: [2, 5, 6, 7, 8, 9, 10, 11] (8 of 10 honest nodes); not: [3, 4]" in out
    code, out, _ = _cli(capsys, "--epsilon", "1", "--json")
    d = json.loads(out)
    assert code == 0 and d["sigma"] == pytest.approx(1 / 0.2685, rel=0.01)
    assert min(d["best_possible_std"][u] for u in d["reconstructible"]) >= d["sigma"] * 0.999
    code, out, _ = _cli(capsys, "--protocol", "dgd", "--json")
    d = json.loads(out)
    assert code == 0 and d["labels_recovered"] == 8 and d["median_relative_error"] < 0.05


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--coalition", "12"], "--coalition: node 12 is not in 0..11"),
        (["--rounds", "0"], "--rounds must be >= 1, got 0"),
        (["--sigma", "-1"], "--sigma must be >= 0, got -1.0"),
        (["--protocol", "dgd", "--sigma", "1"], "a private dgd run takes --epsilon"),
        (["--topology", "ring"], "--edgelist needs --topology edgelist, got 'ring'"),
    ],
)
def test_the_cli_refuses_bad_input_in_one_line(capsys, extra, message):
    code, _, err = _cli(capsys, *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
