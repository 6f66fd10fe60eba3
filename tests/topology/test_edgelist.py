"""Graphs read from edge-list files (MATH.md §3)."""

import numpy as np
import pytest

from dpdl.errors import DPDLError
from dpdl.topology import make_topology


@pytest.fixture
def edge_file(tmp_path):
    path = tmp_path / "graph.txt"
    # 0 -> 1 -> 2 -> 3 -> 0 plus the chord 0 -> 2; comments and blank lines are allowed
    path.write_text("# a directed cycle with a chord\n0 1\n1 2\n\n2 3  # last hop\n3 0\n0 2\n")
    return path


def test_directed_edgelist_uses_uniform_sender_weights(edge_file):
    topology = make_topology("edgelist", 4, path=edge_file, directed=True)
    P = topology.mixing_matrix(0)
    expected = np.array(
        [
            [1 / 3, 0, 0, 1 / 2],
            [1 / 3, 1 / 2, 0, 0],
            [1 / 3, 1 / 2, 1 / 2, 0],
            [0, 0, 1 / 2, 1 / 2],
        ]
    )
    np.testing.assert_allclose(P, expected)
    assert topology.directed and topology.out_neighbours(0, 0) == [1, 2]


def test_undirected_edgelist_uses_metropolis_weights(edge_file):
    P = make_topology("edgelist", 4, path=edge_file).mixing_matrix(0)
    # undirected degrees: 0:3, 1:2, 2:3, 3:2
    assert P[1, 0] == pytest.approx(1 / 4) and P[3, 1] == 0
    assert P[2, 1] == pytest.approx(1 / 4) and P[3, 2] == pytest.approx(1 / 4)
    np.testing.assert_allclose(P, P.T)
    np.testing.assert_allclose(P.sum(axis=0), 1.0)


def test_edgelist_errors(tmp_path, edge_file):
    with pytest.raises(DPDLError, match="node 3 is out of range 0..2"):
        make_topology("edgelist", 3, path=edge_file)
    bad = tmp_path / "bad.txt"
    bad.write_text("0 1\n1 x\n")
    with pytest.raises(DPDLError, match="bad.txt:2: node ids must be integers"):
        make_topology("edgelist", 2, path=bad)
    bad.write_text("0 1 0.5\n")
    with pytest.raises(DPDLError, match="bad.txt:1: expected two node ids"):
        make_topology("edgelist", 2, path=bad)
    with pytest.raises(DPDLError, match="cannot read edge list"):
        make_topology("edgelist", 2, path=tmp_path / "missing.txt")
    with pytest.raises(DPDLError, match="needs path"):
        make_topology("edgelist", 2)
    one_way = tmp_path / "one_way.txt"
    one_way.write_text("0 1\n1 2\n")  # a directed path is not strongly connected
    with pytest.raises(DPDLError, match="not 1-strongly connected"):
        make_topology("edgelist", 3, path=one_way, directed=True)
    make_topology("edgelist", 3, path=one_way)  # ... but its undirected version is connected
