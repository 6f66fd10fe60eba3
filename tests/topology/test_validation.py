"""Assumption 1 (validate_mixing_matrix) and Assumption 2 (B-strong connectivity), MATH.md §3."""

import networkx as nx
import numpy as np
import pytest

from dpdl.errors import DPDLError
from dpdl.topology import (
    MatrixTopology,
    check_b_strongly_connected,
    make_topology,
    validate_mixing_matrix,
)


def test_valid_matrix_is_returned_as_float64():
    P = validate_mixing_matrix([[1, 0], [0, 1]])
    assert P.dtype == np.float64
    np.testing.assert_array_equal(P, np.eye(2))


@pytest.mark.parametrize(
    ("matrix", "message"),
    [
        ([[1.2, 0.5], [-0.2, 0.5]], r"negative entry P\[1, 0\] = -0.2"),
        ([[0.5, 0.5], [0.5, 0.4]], "column 1 sums to 0.9"),
        ([[1.0, 1.0], [0.0, 0.0]], "self-loop of node 1"),
        ([[0.5, 0.5, 0.0], [0.5, 0.5, 1.0]], "square"),
        ([[np.nan, 0.5], [0.5, 0.5]], "non-finite"),
        ("abc", "numeric"),
    ],
)
def test_invalid_matrices_are_rejected_with_a_clear_message(matrix, message):
    with pytest.raises(DPDLError, match=message):
        validate_mixing_matrix(matrix)


def test_doubly_stochastic_check():
    P = np.array([[0.5, 0.5, 0.0], [0.25, 0.5, 0.5], [0.25, 0.0, 0.5]])
    validate_mixing_matrix(P)  # column-stochastic is enough by default
    with pytest.raises(DPDLError, match="row 1 sums to 1.25"):
        validate_mixing_matrix(P, doubly=True)


def test_tolerance_accepts_float_roundoff():
    P = np.full((3, 3), 1 / 3)
    P[0, 0] += 1e-12
    validate_mixing_matrix(P)


def test_topologies_fail_closed_on_construction():
    with pytest.raises(DPDLError, match="negative entry"):
        MatrixTopology.from_matrices("bad", [np.array([[1.5, 0.5], [-0.5, 0.5]])])
    disconnected = np.kron(np.eye(2), np.full((2, 2), 0.5))
    with pytest.raises(DPDLError, match="not 1-strongly connected.*2 strongly connected"):
        MatrixTopology.from_matrices("two islands", [disconnected])
    asymmetric = np.array([[0.5, 0.0, 0.5], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    with pytest.raises(DPDLError, match="not symmetric"):
        MatrixTopology.from_matrices("fake undirected", [asymmetric], directed=False)
    with pytest.raises(DPDLError, match="shape"):
        MatrixTopology.from_matrices("mixed", [np.eye(2), np.eye(3)])


def test_time_varying_schedule_connected_only_over_its_period():
    # Two steps on 4 nodes, each alone disconnected, their union a strongly connected cycle.
    swap_01_23 = np.kron(np.eye(2), np.full((2, 2), 0.5))
    swap_12_30 = np.roll(np.roll(swap_01_23, 1, axis=0), 1, axis=1)
    topology = MatrixTopology.from_matrices("alternating", [swap_01_23, swap_12_30])
    assert topology.connectivity.B == 2 and topology.connectivity.diameter == 2
    with pytest.raises(DPDLError, match="not 1-strongly connected"):
        check_b_strongly_connected(topology, 1)


def test_exponential_graph_window_shorter_than_its_period_fails_for_n20():
    topology = make_topology("exp", 20)
    with pytest.raises(DPDLError, match=r"not 1-strongly connected: the union of steps 1..1"):
        check_b_strongly_connected(topology, B=1)  # offset 2 alone splits 20 nodes in two cycles
    with pytest.raises(DPDLError, match="not 4-strongly connected"):
        check_b_strongly_connected(topology, B=4)  # the window 1..4 misses offset 1
    # for prime n every single offset is a Hamiltonian cycle
    assert check_b_strongly_connected(make_topology("exp", 7), B=1).diameter == 6


def _directed_diameter(n, offsets):
    graph = nx.DiGraph()
    graph.add_edges_from((i, (i + s) % n) for i in range(n) for s in offsets)
    return nx.diameter(graph)


@pytest.mark.parametrize(
    ("name", "n", "diameter"),
    [
        ("ring", 9, 8),
        ("complete", 6, 1),
        ("undirected-ring", 11, 5),
        ("hypercube", 16, 4),
        ("star", 7, 2),
        ("torus", 20, 2 + 2),  # floor(4/2) + floor(5/2)
        ("exp", 20, _directed_diameter(20, [1, 2, 4, 8, 16])),
        ("static-exp", 20, _directed_diameter(20, [1, 2, 4, 8, 16])),
    ],
)
def test_reported_diameter(name, n, diameter):
    report = make_topology(name, n).connectivity
    assert report.diameter == diameter
    assert report.to_dict()["B"] == make_topology(name, n).period


def test_larger_window_never_increases_the_diameter():
    topology = make_topology("exp", 20)
    assert check_b_strongly_connected(topology, 10).diameter <= topology.connectivity.diameter


def test_window_must_be_a_positive_integer():
    topology = make_topology("ring", 4)
    for bad in (0, -1):
        with pytest.raises(DPDLError, match=f"got {bad}"):
            check_b_strongly_connected(topology, bad)
    with pytest.raises(DPDLError, match="integer"):
        check_b_strongly_connected(topology, 1.5)
