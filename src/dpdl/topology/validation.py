"""Validation of mixing matrices and of B-strong connectivity (MATH.md §3, Assumptions 1–2).

Everything here fails closed: a matrix or schedule that breaks an assumption raises
:class:`~dpdl.errors.DPDLError` with a message naming the offending entry, column or node.
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass
from typing import Protocol

import networkx as nx
import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import shortest_path

from dpdl.errors import DPDLError

#: Absolute tolerance on row/column sums (float64 weights like 1/3 do not sum to 1 exactly).
SUM_TOLERANCE = 1e-9


class MixingSchedule(Protocol):
    """What the connectivity check needs of a periodic schedule: any
    :class:`~dpdl.topology.base.Topology` is one. Stated here so this module need not import
    ``base``, which imports it to validate every topology it builds."""

    name: str
    n: int
    period: int

    def adjacency(self, k: int) -> np.ndarray:
        """Boolean ``(n, n)``: ``A[i, j]`` iff ``i != j`` and ``i`` receives from ``j`` at k."""
        ...


def validate_mixing_matrix(
    P, *, doubly: bool = False, atol: float = SUM_TOLERANCE, label: str = "mixing matrix"
) -> np.ndarray:
    """Check Assumption 1 and return ``P`` as a float64 array.

    ``P`` must be square, finite, non-negative, column-stochastic (``1ᵀP = 1ᵀ`` within
    ``atol``) and have a positive diagonal (every node is its own in-neighbour). With
    ``doubly=True`` the rows must also sum to one.
    """
    try:
        M = np.asarray(P, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise DPDLError(f"{label} is not a numeric array: {err}") from None
    if M.ndim != 2 or M.shape[0] != M.shape[1] or M.shape[0] == 0:
        raise DPDLError(f"{label} must be a non-empty square matrix, got shape {M.shape}")
    if not np.all(np.isfinite(M)):
        i, j = np.argwhere(~np.isfinite(M))[0]
        raise DPDLError(f"{label} has a non-finite entry P[{i}, {j}] = {M[i, j]}")
    if np.any(M < 0):
        i, j = np.argwhere(M < 0)[0]
        raise DPDLError(f"{label} has a negative entry P[{i}, {j}] = {M[i, j]:.6g}")
    column_error = np.abs(M.sum(axis=0) - 1.0)
    if np.any(column_error > atol):
        j = int(np.argmax(column_error))
        raise DPDLError(
            f"{label} is not column-stochastic: column {j} sums to {M[:, j].sum():.12g}, not 1"
        )
    if doubly:
        row_error = np.abs(M.sum(axis=1) - 1.0)
        if np.any(row_error > atol):
            i = int(np.argmax(row_error))
            raise DPDLError(
                f"{label} is not doubly stochastic: row {i} sums to {M[i].sum():.12g}, not 1"
            )
    diagonal = np.diagonal(M)
    if np.any(diagonal <= 0):
        i = int(np.flatnonzero(diagonal <= 0)[0])
        raise DPDLError(f"{label} misses the self-loop of node {i}: P[{i}, {i}] = {M[i, i]:.6g}")
    return M


@dataclass(frozen=True)
class ConnectivityReport:
    """Outcome of :func:`check_b_strongly_connected` (Assumption 2).

    ``diameter`` is the largest directed diameter Δ over every window of ``B`` consecutive
    steps; ``windows`` is how many distinct windows were checked (one per phase of the period,
    or one when ``B >= period`` since every such window has the same union).
    """

    B: int
    diameter: int
    windows: int

    def to_dict(self) -> dict:
        return asdict(self)


def union_adjacency(topology: MixingSchedule, start: int, steps: int) -> np.ndarray:
    """Boolean ``A[i, j]``: ``i`` receives from ``j`` in some step ``start .. start+steps-1``."""
    received = np.zeros((topology.n, topology.n), dtype=bool)
    # a window of >= period steps covers every phase once; more steps add no edge
    for k in range(start, start + min(steps, topology.period)):
        received |= topology.adjacency(k)
    return received


def union_graph(topology: MixingSchedule, start: int, steps: int) -> nx.DiGraph:
    """The directed graph of all edges ``j -> i`` used in steps ``start .. start+steps-1``."""
    return _digraph(union_adjacency(topology, start, steps))


def _digraph(adjacency: np.ndarray) -> nx.DiGraph:
    receivers, senders = np.nonzero(adjacency)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(adjacency.shape[0]))
    graph.add_edges_from(zip(senders.tolist(), receivers.tolist(), strict=True))
    return graph


def directed_diameter(adjacency: np.ndarray, chunk: int = 256) -> int:
    """Largest shortest-path hop count of a strongly connected digraph (``A[i, j]``: j -> i).

    Breadth-first search from every node in scipy's compiled csgraph (networkx's pure-Python
    ``diameter`` is O(n·e) interpreted and takes seconds from n ≈ 1000); sources are processed
    in chunks so memory stays O(chunk · n).
    """
    n = adjacency.shape[0]
    # csgraph reads G[u, v] as the edge u -> v
    graph = csr_matrix(adjacency.T.astype(np.int8))
    diameter = 0
    for first in range(0, n, chunk):
        distances = shortest_path(
            graph, unweighted=True, indices=np.arange(first, min(n, first + chunk))
        )
        diameter = max(diameter, int(distances.max()))
    return diameter


def check_b_strongly_connected(
    topology: MixingSchedule, B: int | None = None
) -> ConnectivityReport:
    """Check that the union of any ``B`` consecutive steps is strongly connected (MATH.md §3).

    ``B`` defaults to the topology's period. Because the schedule is periodic, the windows
    starting at ``0 .. period-1`` are all the windows there are; every one of them is checked
    (stronger than the paper's aligned windows ``[lB, (l+1)B)``). Strong connectivity is
    checked with networkx; returns the diameter Δ (max over windows, :func:`directed_diameter`);
    raises :class:`DPDLError` naming a window and an unreachable pair.
    """
    if B is None:
        B = topology.period
    try:
        B = operator.index(B)
    except TypeError:
        raise DPDLError(f"the connectivity window B must be an integer, got {B!r}") from None
    if B < 1:
        raise DPDLError(f"the connectivity window B must be >= 1, got {B}")
    diameter = 0
    # windows with B >= period all see the same union: check it once
    starts = range(topology.period if B < topology.period else 1)
    for start in starts:
        adjacency = union_adjacency(topology, start, B)
        graph = _digraph(adjacency)
        if not nx.is_strongly_connected(graph):
            components = nx.number_strongly_connected_components(graph)
            source, target = _unreachable_pair(graph, topology.n)
            raise DPDLError(
                f"topology {topology.name!r} (n={topology.n}) is not {B}-strongly connected: "
                f"the union of steps {start}..{start + B - 1} has {components} strongly "
                f"connected components (node {source} cannot reach node {target})"
            )
        diameter = max(diameter, directed_diameter(adjacency))
    return ConnectivityReport(B=B, diameter=int(diameter), windows=len(starts))


def _unreachable_pair(graph: nx.DiGraph, n: int) -> tuple[int, int]:
    """Some (source, target) with no directed path source -> target."""
    for source in range(n):
        missing = set(range(n)) - nx.descendants(graph, source) - {source}
        if missing:
            return source, min(missing)
    raise AssertionError("graph is strongly connected")  # pragma: no cover
