"""Drawing a topology to PNG with matplotlib (Agg canvas, no pyplot state) and networkx.

Static graphs get one panel; a time-varying schedule gets one small panel per step of its
period followed by the union over the period (only the union when the period is long).
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import numpy as np

from dpdl.files import png_path, save_png
from dpdl.topology.base import Topology
from dpdl.topology.validation import union_graph

MAX_STEP_PANELS = 8


def _positions(topology: Topology, graph: nx.DiGraph, seed: int) -> dict:
    n = topology.n
    if topology.layout == "grid" and "cols" in topology.params:
        cols = topology.params["cols"]
        return {i: (i % cols, -(i // cols)) for i in range(n)}
    if topology.layout == "star":
        angles = 2 * np.pi * np.arange(n - 1) / max(n - 1, 1)
        return {0: (0.0, 0.0)} | {i + 1: (np.cos(a), np.sin(a)) for i, a in enumerate(angles)}
    if topology.layout == "circular":
        return nx.circular_layout(graph)
    return nx.spring_layout(graph.to_undirected(), seed=seed)


def _grid_distance(positions: dict, u: int, v: int) -> float:
    (xu, yu), (xv, yv) = positions[u], positions[v]
    return abs(xu - xv) + abs(yu - yv)


def _draw_panel(ax, topology: Topology, graph: nx.DiGraph, positions: dict, title: str) -> None:
    small = topology.n <= 40
    nx.draw_networkx_nodes(
        graph, positions, ax=ax, node_size=220 if small else 40, node_color="#4c72b0"
    )
    if small:
        nx.draw_networkx_labels(graph, positions, ax=ax, font_size=7, font_color="white")
    if topology.directed:
        nx.draw_networkx_edges(
            graph,
            positions,
            ax=ax,
            arrows=True,
            arrowsize=8,
            width=0.8,
            node_size=220 if small else 40,
            connectionstyle="arc3,rad=0.08",
            edge_color="#555555",
        )
    else:
        undirected = graph.to_undirected()
        # grid wrap-around edges would lie on top of the row/column lines: draw them as arcs
        wraps = [
            (u, v)
            for u, v in undirected.edges
            if topology.layout == "grid" and _grid_distance(positions, u, v) > 1.5
        ]
        straight = [edge for edge in undirected.edges if edge not in set(wraps)]
        nx.draw_networkx_edges(
            undirected, positions, edgelist=straight, ax=ax, width=0.8, edge_color="#555555"
        )
        if wraps:
            nx.draw_networkx_edges(
                graph,
                positions,
                edgelist=wraps,
                ax=ax,
                arrows=True,
                arrowstyle="-",
                width=0.6,
                style="dashed",
                edge_color="#8c8c8c",
                node_size=220 if small else 40,
                connectionstyle="arc3,rad=0.25",
            )
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()


def draw_topology(topology: Topology, path, *, seed: int = 0, dpi: int = 120) -> Path:
    """Write a PNG of ``topology`` to ``path`` and return the path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = png_path(path)
    union = union_graph(topology, 0, topology.period)
    positions = _positions(topology, union, seed)
    panels: list[tuple[nx.DiGraph, str]] = []
    if topology.time_varying and topology.period <= MAX_STEP_PANELS:
        panels = [
            (union_graph(topology, k, 1), f"step k ≡ {k} (mod {topology.period})")
            for k in range(topology.period)
        ]
    union_title = (
        f"union over one period ({topology.period} steps)"
        if topology.time_varying
        else f"{topology.name}, n = {topology.n}"
    )
    panels.append((union, union_title))
    columns = min(len(panels), 3)
    rows = -(-len(panels) // columns)
    figure = Figure(figsize=(3.6 * columns, 3.6 * rows))
    FigureCanvasAgg(figure)
    for index, (graph, title) in enumerate(panels, start=1):
        _draw_panel(figure.add_subplot(rows, columns, index), topology, graph, positions, title)
    kind = "time-varying" if topology.time_varying else "static"
    figure.suptitle(
        f"{topology.name} ({kind}, {'directed' if topology.directed else 'undirected'},"
        f" n = {topology.n})",
        fontsize=11,
    )
    figure.tight_layout()
    return save_png(figure, path, dpi)


def draw_adjacency(adjacency: np.ndarray, path, *, title: str, seed: int = 0,
                   dpi: int = 120) -> Path:
    """A PNG of a graph that is not a valid topology (e.g. not strongly connected), so a user
    can see what is wrong with it: ``adjacency[i, j]`` when j sends to i; nodes coloured by
    strongly connected component."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = png_path(path)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(adjacency)))
    receivers, senders = np.nonzero(adjacency)
    graph.add_edges_from(zip(senders.tolist(), receivers.tolist(), strict=True))
    component = {v: c for c, nodes in enumerate(nx.strongly_connected_components(graph))
                 for v in nodes}  # fmt: skip
    figure = Figure(figsize=(5, 5))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 1, 1)
    positions = nx.spring_layout(graph, seed=seed)
    nx.draw_networkx(graph, positions, ax=ax, node_color=[component[v] for v in graph],
                     cmap="tab10", node_size=300, font_size=8, arrows=True)  # fmt: skip
    ax.set_title(title, fontsize=9)
    ax.set_axis_off()
    figure.tight_layout()
    return save_png(figure, path, dpi)
