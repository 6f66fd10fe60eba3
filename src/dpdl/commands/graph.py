"""``dpdl graph``: inspect a topology (period, connectivity, mixing metrics) and draw it."""

from __future__ import annotations

import argparse
import json

from dpdl.errors import DPDLError

HELP = "Inspect a topology: period, connectivity, mixing metrics; draw it."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dpdl.topology import TOPOLOGIES

    parser.add_argument(
        "--topology",
        "-t",
        default="exp",
        metavar="NAME",
        help=f"one of: {', '.join(TOPOLOGIES)} (default: exp)",
    )
    parser.add_argument(
        "--nodes",
        "-n",
        type=int,
        default=None,
        metavar="N",
        help="number of nodes (default 20; inferred from --edgelist)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random families")
    parser.add_argument("--degree", type=int, default=None, help="random-regular: degree d")
    parser.add_argument(
        "--probability",
        type=float,
        default=None,
        help="erdos-renyi: edge probability p (default 2 ln n / n)",
    )
    parser.add_argument(
        "--edgelist",
        default=None,
        metavar="FILE",
        help="edgelist: file of 'u v' lines, node ids 0..n-1",
    )
    parser.add_argument(
        "--directed",
        action="store_true",
        default=None,
        help="edgelist / erdos-renyi: read edges as directed",
    )
    parser.add_argument("--rows", type=int, default=None, help="torus: number of rows")
    parser.add_argument("--cols", type=int, default=None, help="torus: number of columns")
    parser.add_argument(
        "--window",
        "-B",
        type=int,
        default=None,
        metavar="B",
        help="connectivity window B (default: the period)",
    )
    parser.add_argument("--png", default=None, metavar="FILE", help="draw the graph to FILE.png")
    parser.add_argument("--json", action="store_true", help="print a JSON summary")


def topology_from(name: str, nodes: int | None, *, seed: int = 0, edgelist=None,
                  default_nodes: int = 20, **params):
    """The topology a command's --topology/--nodes/--edgelist name (every command's one
    reading of them): n inferred from the edge list when --nodes is not given."""
    from dpdl.topology import edgelist_node_count, make_topology

    if name != "edgelist" and edgelist is not None:
        raise DPDLError(f"--edgelist needs --topology edgelist, got {name!r}")
    if name == "edgelist" and edgelist is None:
        raise DPDLError("--topology edgelist needs --edgelist FILE")
    if nodes is None:
        nodes = edgelist_node_count(edgelist) if edgelist is not None else default_nodes
    return make_topology(name, nodes, seed=seed, path=edgelist, **params)


def summarize(args: argparse.Namespace) -> tuple[object, dict]:
    """Build the topology of ``args`` and its summary dict (what --json prints)."""
    from dpdl.topology import check_b_strongly_connected, mixing_report

    params = {
        "degree": args.degree,
        "probability": args.probability,
        "directed": args.directed,
        "rows": args.rows,
        "cols": args.cols,
    }
    topology = topology_from(args.topology, args.nodes, seed=args.seed, edgelist=args.edgelist,
                             **params)  # fmt: skip
    connectivity = (
        topology.connectivity
        if args.window is None
        else check_b_strongly_connected(topology, args.window)
    )
    summary = topology.describe()
    summary["connectivity"] = {"strongly_connected": True, **connectivity.to_dict()}
    summary["mixing"] = mixing_report(topology).to_dict()
    forms = [topology.circulant(k) for k in range(topology.period)]
    summary["circulant"] = (
        None
        if any(f is None for f in forms)
        else [[[offset, weight] for offset, weight in form] for form in forms]
    )
    summary["out_degree"] = [
        sorted({len(topology.out_neighbours(k, i)) for i in range(topology.n)})
        for k in range(topology.period)
    ]
    return topology, summary


def _format(summary: dict) -> str:
    kind = "time-varying" if summary["time_varying"] else "static"
    arrows = "directed" if summary["directed"] else "undirected"
    lines = [f"topology      {summary['name']} ({kind}, {arrows}), n = {summary['n']}"]
    shown = {k: v for k, v in summary["params"].items() if k != "path"}
    if shown:
        lines.append("parameters    " + ", ".join(f"{k}={v}" for k, v in shown.items()))
    period = f"period        {summary['period']}"
    if summary["circulant"] is not None and summary["time_varying"]:
        offsets = [next((s for s, _ in form if s != 0), 0) for form in summary["circulant"]]
        period += f"  (offsets {', '.join(map(str, offsets))})"
    lines.append(period)
    degrees = sorted({d for step in summary["out_degree"] for d in step})
    lines.append(f"out-degree    {', '.join(map(str, degrees))}")
    c = summary["connectivity"]
    lines.append(
        f"connectivity  {c['B']}-strongly connected, diameter Δ = {c['diameter']} "
        f"(every window of {c['B']} consecutive steps)"
    )
    m = summary["mixing"]
    lines.append(
        f"mixing        q = {m['q']:.6g} per period (‖ΠP^k (I − 11ᵀ/n)‖₂), "
        f"{m['per_step_rate']:.6g} per step; spectral radius {m['q_spectral_radius']:.6g}"
    )
    gap = m["spectral_gap"]
    lines.append("spectral gap  " + ("n/a (time-varying)" if gap is None else f"{gap:.6g}"))
    lines.append(
        "mixing by     "
        + ("torch.roll (circulant)" if summary["circulant"] is not None else "matrix product")
    )
    if "png" in summary:
        lines.append(f"drawing       {summary['png']}")
    return "\n".join(lines)


def _draw_invalid(args, err: DPDLError) -> None:
    """An edge list that is no valid topology is still drawn when --png asks for it."""
    from dpdl.topology import edgelist_node_count, read_edgelist
    from dpdl.topology.draw import draw_adjacency

    n = args.nodes or edgelist_node_count(args.edgelist)
    A = read_edgelist(args.edgelist, n)
    if not args.directed:
        A = A | A.T
    path = draw_adjacency(A, args.png, title=f"{args.edgelist}: not a valid topology",
                          seed=args.seed)  # fmt: skip
    raise DPDLError(f"{err} (drawn anyway to {path}, components coloured)") from None


def run(args: argparse.Namespace) -> int:
    try:
        topology, summary = summarize(args)
    except DPDLError as err:
        if args.png is None or args.topology != "edgelist" or args.edgelist is None:
            raise
        _draw_invalid(args, err)
    if args.png is not None:
        from dpdl.topology.draw import draw_topology

        summary["png"] = str(draw_topology(topology, args.png, seed=args.seed))
    print(json.dumps(summary, indent=2) if args.json else _format(summary))
    return 0
