"""Every graph family of MATH.md §3: weights, structure, connectivity, circulant forms."""

import math

import networkx as nx
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdl.errors import DPDLError
from dpdl.topology import (
    TOPOLOGIES,
    circulant_matrix,
    make_topology,
    metropolis_hastings_weights,
    uniform_sender_weights,
)

# (name, n, params): one representative instance of every family (edgelist has its own tests).
CASES = [
    ("exp", 20, {}),
    ("exp", 7, {}),
    ("ring", 9, {}),
    ("complete", 6, {}),
    ("undirected-ring", 10, {}),
    ("static-exp", 12, {}),
    ("hypercube", 16, {}),
    ("torus", 20, {}),
    ("random-regular", 14, {"degree": 3}),
    ("erdos-renyi", 15, {"probability": 0.3}),
    ("erdos-renyi", 12, {"probability": 0.35, "directed": True}),
    ("star", 8, {}),
    ("geometric", 16, {}),
    ("geometric", 10, {"radius": 0.6}),
    ("central", 1, {}),
]
UNDIRECTED = {"complete", "undirected-ring", "hypercube", "torus", "random-regular", "star",
              "geometric", "central"}


def shift(n, s):
    """(Shift_s)[(i + s) % n, i] = 1, written independently of the package."""
    S = np.zeros((n, n))
    S[(np.arange(n) + s) % n, np.arange(n)] = 1.0
    return S


def test_a_geometric_graph_links_exactly_the_points_within_its_radius():
    topology = make_topology("geometric", 12, seed=4, radius=0.5)
    attempt_seed = int(np.random.default_rng(4).integers(0, 2**32, size=100)[
        topology.params["attempts"] - 1])
    graph = nx.random_geometric_graph(12, 0.5, seed=attempt_seed)
    points = np.array([graph.nodes[i]["pos"] for i in range(12)])
    close = np.linalg.norm(points[:, None] - points[None], axis=2) <= 0.5
    np.fill_diagonal(close, False)
    assert np.array_equal(topology.mixing_matrix(0) > 0, close | np.eye(12, dtype=bool))
    with pytest.raises(DPDLError, match="geometric radius must be > 0, got -1"):
        make_topology("geometric", 12, radius=-1)
    with pytest.raises(DPDLError, match="geometric: no connected graph in 2 attempts"):
        make_topology("geometric", 30, radius=0.01, max_attempts=2)


def test_every_family_has_a_case():
    assert {name for name, _, _ in CASES} | {"edgelist"} == set(TOPOLOGIES)


@pytest.mark.parametrize(("name", "n", "params"), CASES, ids=lambda c: str(c))
def test_column_stochastic_self_loops_and_connected(name, n, params):
    topology = make_topology(name, n, seed=3, **params)
    assert topology.n == n and topology.name == name
    union = np.zeros((n, n), dtype=bool)
    for k in range(topology.period):
        P = topology.mixing_matrix(k)
        assert P.dtype == np.float64 and P.shape == (n, n)
        assert np.all(P >= 0)
        np.testing.assert_allclose(P.sum(axis=0), 1.0, atol=1e-12)
        assert np.all(np.diag(P) > 0)
        if not topology.directed:
            np.testing.assert_allclose(P, P.T, atol=1e-15)
            np.testing.assert_allclose(P.sum(axis=1), 1.0, atol=1e-12)
        union |= P > 0
    graph = nx.from_numpy_array(union.T.astype(int), create_using=nx.DiGraph)
    assert nx.is_strongly_connected(graph)
    assert topology.directed == (
        name not in UNDIRECTED and not (name == "erdos-renyi" and not params.get("directed"))
    )


@pytest.mark.parametrize(("name", "n", "params"), CASES, ids=lambda c: str(c))
def test_neighbours_edges_and_circulant_agree_with_the_matrix(name, n, params):
    topology = make_topology(name, n, seed=3, **params)
    for k in range(topology.period + 1):  # one step past the period: wraps around
        P = topology.mixing_matrix(k)
        for i in range(n):
            assert topology.out_neighbours(k, i) == [j for j in range(n) if j != i and P[j, i] > 0]
            assert topology.in_neighbours(k, i) == [j for j in range(n) if j != i and P[i, j] > 0]
        edges = topology.edges(k)
        rebuilt = np.diag(np.diag(P))
        for sender, receiver, weight in edges:
            assert sender != receiver
            rebuilt[receiver, sender] = weight
        np.testing.assert_array_equal(rebuilt, P)
        form = topology.circulant(k)
        if form is not None:
            offsets = [s for s, _ in form]
            assert len(set(offsets)) == len(offsets) and all(0 <= s < n for s in offsets)
            np.testing.assert_allclose(sum(w * shift(n, s) for s, w in form), P, atol=1e-15)


@pytest.mark.parametrize("name", ["exp", "ring", "static-exp", "undirected-ring"])
def test_shift_structured_graphs_are_circulant(name):
    topology = make_topology(name, 12)
    assert all(topology.circulant(k) is not None for k in range(topology.period))


def test_non_circulant_graphs_return_none():
    assert make_topology("torus", 12).circulant(0) is None
    assert make_topology("star", 6).circulant(0) is None
    assert make_topology("complete", 6).circulant(0) is None  # dense: the engine uses a matmul


def test_exponential_graph_n20_offsets_cycle_1_2_4_8_16():
    topology = make_topology("exp", 20)
    assert topology.period == 5 and topology.time_varying and topology.directed
    for k, s in enumerate([1, 2, 4, 8, 16] * 3):
        np.testing.assert_array_equal(
            topology.mixing_matrix(k), 0.5 * np.eye(20) + 0.5 * shift(20, s)
        )
        assert topology.out_neighbours(k, 19) == [(19 + s) % 20]
        assert topology.in_neighbours(k, 0) == [(0 - s) % 20]


@pytest.mark.parametrize("n", [2, 3, 5, 7, 20, 33])
def test_exponential_graph_for_any_n(n):
    topology = make_topology("exp", n)
    m = math.floor(math.log2(n - 1)) + 1
    assert topology.period == m
    for k in range(2 * m):
        s = 2 ** (k % m)
        assert s < n
        np.testing.assert_array_equal(
            topology.mixing_matrix(k), 0.5 * np.eye(n) + 0.5 * shift(n, s)
        )
        assert topology.circulant(k) == [(0, 0.5), (s, 0.5)]
    assert topology.connectivity.B == m


def test_directed_ring_and_complete_matrices():
    n = 7
    np.testing.assert_array_equal(
        make_topology("ring", n).mixing_matrix(4), 0.5 * np.eye(n) + 0.5 * shift(n, 1)
    )
    np.testing.assert_allclose(make_topology("complete", n).mixing_matrix(0), np.ones((n, n)) / n)


def test_static_exponential_weights():
    n = 12  # m = 4: offsets 1, 2, 4, 8, weight 1/5
    expected = (np.eye(n) + sum(shift(n, s) for s in (1, 2, 4, 8))) / 5
    np.testing.assert_allclose(make_topology("static-exp", n).mixing_matrix(0), expected)


def test_uniform_sender_weights_by_hand():
    # edges 0->1, 0->2, 1->2, 2->0 ; A[i, j] = "i receives from j"
    A = np.zeros((3, 3), dtype=bool)
    A[1, 0] = A[2, 0] = A[2, 1] = A[0, 2] = True
    expected = np.array([[1 / 3, 0, 1 / 2], [1 / 3, 1 / 2, 0], [1 / 3, 1 / 2, 1 / 2]])
    np.testing.assert_allclose(uniform_sender_weights(A), expected)


def test_metropolis_hastings_by_hand():
    A = np.zeros((3, 3), dtype=bool)  # path 0 - 1 - 2, degrees 1, 2, 1
    A[0, 1] = A[1, 0] = A[1, 2] = A[2, 1] = True
    expected = np.array([[2 / 3, 1 / 3, 0], [1 / 3, 1 / 3, 1 / 3], [0, 1 / 3, 2 / 3]])
    np.testing.assert_allclose(metropolis_hastings_weights(A), expected)
    with pytest.raises(DPDLError, match="symmetric"):
        metropolis_hastings_weights(np.triu(np.ones((3, 3)), 1))


def test_undirected_families_match_networkx_graphs():
    cases = {
        ("hypercube", 16): nx.hypercube_graph(4),
        ("undirected-ring", 11): nx.cycle_graph(11),
        ("star", 9): nx.star_graph(8),
        ("torus", 20): nx.grid_2d_graph(4, 5, periodic=True),
    }
    for (name, n), reference in cases.items():
        topology = make_topology(name, n)
        ours = nx.from_numpy_array(topology.adjacency(0).astype(int))
        assert nx.is_isomorphic(ours, reference), name


def test_metropolis_weights_of_regular_graphs():
    np.testing.assert_allclose(
        make_topology("hypercube", 8).mixing_matrix(0)[0, [0, 1, 2, 4]], [1 / 4] * 4
    )
    np.testing.assert_allclose(make_topology("torus", 9).mixing_matrix(0).max(), 1 / 5)
    star = make_topology("star", 5).mixing_matrix(0)
    np.testing.assert_allclose(star[0], [1 / 5] * 5)
    np.testing.assert_allclose(np.diag(star)[1:], [4 / 5] * 4)


def test_torus_shape_choice_and_errors():
    assert make_topology("torus", 20).params == {"rows": 4, "cols": 5}
    assert make_topology("torus", 36).params == {"rows": 6, "cols": 6}
    assert make_topology("torus", 12, cols=4).params == {"rows": 3, "cols": 4}
    with pytest.raises(DPDLError, match="n=7"):
        make_topology("torus", 7)
    with pytest.raises(DPDLError, match="rows, cols >= 3"):
        make_topology("torus", 8)  # 2 x 4 only
    with pytest.raises(DPDLError, match="3 × 5 != 12"):
        make_topology("torus", 12, rows=3, cols=5)


def test_hypercube_needs_power_of_two():
    with pytest.raises(DPDLError, match="power of two.*n=12"):
        make_topology("hypercube", 12)
    assert make_topology("hypercube", 2).mixing_matrix(0).tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_random_families_are_seeded_regular_and_connected():
    a = make_topology("random-regular", 20, seed=5, degree=3)
    b = make_topology("random-regular", 20, seed=5, degree=3)
    c = make_topology("random-regular", 20, seed=6, degree=3)
    np.testing.assert_array_equal(a.mixing_matrix(0), b.mixing_matrix(0))
    assert not np.array_equal(a.mixing_matrix(0), c.mixing_matrix(0))
    assert set(a.adjacency(0).sum(axis=0)) == {3}
    np.testing.assert_allclose(a.mixing_matrix(0)[a.adjacency(0)], 1 / 4)
    er1 = make_topology("erdos-renyi", 20, seed=1, probability=0.3)
    er2 = make_topology("erdos-renyi", 20, seed=1, probability=0.3)
    np.testing.assert_array_equal(er1.mixing_matrix(0), er2.mixing_matrix(0))


def test_random_family_errors():
    with pytest.raises(DPDLError, match="no connected graph in 5 attempts"):
        make_topology("erdos-renyi", 30, probability=0.01, max_attempts=5)
    with pytest.raises(DPDLError, match="even"):
        make_topology("random-regular", 7, degree=3)
    with pytest.raises(DPDLError, match="degree must be < n"):
        make_topology("random-regular", 6, degree=6)
    with pytest.raises(DPDLError, match="never connected"):
        make_topology("random-regular", 6, degree=1)
    with pytest.raises(DPDLError, match=r"probability must be in \(0, 1\]"):
        make_topology("erdos-renyi", 6, probability=1.5)


def test_factory_rejects_bad_input():
    with pytest.raises(DPDLError, match="unknown topology 'mesh'"):
        make_topology("mesh", 10)
    for bad_n in (1, 0, -3):
        with pytest.raises(DPDLError, match=f"got {bad_n}"):
            make_topology("exp", bad_n)
    with pytest.raises(DPDLError, match="integer"):
        make_topology("ring", 4.5)
    with pytest.raises(DPDLError, match="no parameter 'degree'"):
        make_topology("ring", 5, degree=2)


def test_circulant_matrix_helper_matches_shifts():
    form = [(0, 0.25), (3, 0.5), (9, 0.25)]  # 9 ≡ 4 mod 5
    np.testing.assert_allclose(
        circulant_matrix(form, 5), 0.25 * np.eye(5) + 0.5 * shift(5, 3) + 0.25 * shift(5, 4)
    )


@settings(max_examples=25, deadline=None)
@given(n=st.integers(min_value=2, max_value=300))
def test_exponential_graph_property_any_n(n):
    topology = make_topology("exp", n)
    m = math.floor(math.log2(n - 1)) + 1
    assert topology.period == m
    offsets = [topology.circulant(k)[1][0] for k in range(m)]
    assert offsets == [2**t for t in range(m)] and max(offsets) < n
    graph = nx.DiGraph((i, (i + s) % n) for i in range(n) for s in offsets)
    assert nx.is_strongly_connected(graph)
    assert topology.connectivity.diameter == nx.diameter(graph)


def test_matrices_are_returned_as_copies_and_summaries():
    topology = make_topology("star", 5)
    P = topology.mixing_matrix(0)
    P[:] = 0
    assert topology.mixing_matrix(0)[0, 0] == pytest.approx(1 / 5)
    assert topology.describe() == {
        "name": "star",
        "n": 5,
        "period": 1,
        "directed": False,
        "time_varying": False,
        "params": {},
    }
    assert "time-varying" in repr(make_topology("exp", 5))
    with pytest.raises(DPDLError, match="node 5 is out of range 0..4"):
        topology.out_neighbours(0, 5)
    with pytest.raises(DPDLError, match="step index must be >= 0, got -1"):
        topology.mixing_matrix(-1)


@pytest.mark.parametrize(("name", "n"), [("exp", 20), ("static-exp", 12), ("undirected-ring", 7)])
def test_circulant_form_is_a_torch_roll(name, n):
    """The engine mixes circulant graphs with torch.roll(x, s, dims=0): it must equal P @ x."""
    topology = make_topology(name, n)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for k in range(topology.period):
        rolled = sum(w * torch.roll(x, shifts=s, dims=0) for s, w in topology.circulant(k))
        expected = torch.from_numpy(topology.mixing_matrix(k)) @ x
        torch.testing.assert_close(rolled, expected, rtol=0, atol=1e-14)
