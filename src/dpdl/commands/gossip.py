"""``dpdl gossip account``: what a node (or a coalition) learns about another from noisy gossip.

Exact μ-GDP of the linear Gaussian view (MATH.md §9, :mod:`dpdl.accounting.gossip`): one pair,
one observer's column, or every pair summarised by graph distance beside the local-DP level,
with a heat map; ``--calibrate EPS --beyond D`` gives the σ that holds every pair farther than
D hops to (EPS, δ).
"""

from __future__ import annotations

import argparse
import json
import math

HELP = "Privacy of gossip against non-neighbours: exact view accounting, pairwise by distance."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from dpdl.topology import TOPOLOGIES

    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("account", help="μ and ε of u against observers, or every pair")
    p.add_argument("--topology", "-t", default="ring" if "ring" in TOPOLOGIES else "exp",
                   metavar="NAME", help=f"one of: {', '.join(TOPOLOGIES)} (default: ring)")
    p.add_argument("--nodes", "-n", type=int, help="default 16; inferred from --edgelist")
    p.add_argument("--edgelist", metavar="FILE", help="--topology edgelist: 'u v' lines")
    p.add_argument("--seed", type=int, default=0, help="seed of the random graph families")
    p.add_argument("--rounds", "-T", type=int, default=10)
    p.add_argument("--sigma", type=float, default=1.0, help="noise std per message")
    p.add_argument("--sensitivity", type=float, default=1.0, help="Δ of a contribution")
    p.add_argument("--delta", type=float, default=1e-5)
    p.add_argument("--contribution", choices=("every-round", "once"), default="every-round")
    p.add_argument("--noise", choices=("every-round", "once"), default="every-round",
                   help="fresh noise every round (default) or once at t = 0 (Muffliato)")
    p.add_argument("--target", "-u", type=int, help="the node whose privacy is asked")
    p.add_argument("--observer", "-v", type=int, nargs="+", help="the observers (a coalition)")
    p.add_argument("--calibrate", type=float, metavar="EPS",
                   help="print the σ with every pair beyond --beyond hops within (EPS, δ)")
    p.add_argument("--beyond", type=int, default=0, metavar="D")
    p.add_argument("--plot", metavar="PNG", help="heat map of the pairwise ε and ε by distance")
    p.add_argument("--json", action="store_true")


def _topology(args):
    from dpdl.commands.graph import topology_from
    from dpdl.topology import check_b_strongly_connected

    topology = topology_from(args.topology, args.nodes, seed=args.seed, edgelist=args.edgelist,
                             default_nodes=16)  # fmt: skip
    check_b_strongly_connected(topology)  # one line naming a window and an unreachable pair
    return topology


def run(args) -> int:
    import numpy as np

    from dpdl.accounting import gossip
    from dpdl.errors import require

    gossip._check_sigma(args.sigma, args.sensitivity)  # one-line errors before any work
    require(args.rounds >= 1, f"--rounds must be >= 1, got {args.rounds}")
    require(0 < args.delta < 1, f"--delta must lie in (0, 1), got {args.delta}")
    topology = _topology(args)
    mixing = topology.mixing_matrix
    local = math.sqrt(args.rounds if args.contribution == "every-round" else 1) * (
        args.sensitivity / args.sigma)
    common = dict(rounds=args.rounds, sigma=args.sigma, sensitivity=args.sensitivity,
                  contribution=args.contribution, noise=args.noise)  # fmt: skip
    out: dict = {"topology": topology.name, "nodes": topology.n, "rounds": args.rounds,
                 "sigma": args.sigma, "delta": args.delta, "contribution": args.contribution,
                 "noise": args.noise, "local_dp_mu": local,
                 "local_dp_epsilon": gossip.epsilon_of(local, args.delta)}  # fmt: skip
    if args.target is not None or args.observer:
        require(args.target is not None and args.observer,
                "give both --target and --observer (or neither, for every pair)")  # fmt: skip
        mu = gossip.view_mu(mixing, target=args.target, observers=args.observer, **common)
        out |= {"target": args.target, "observers": args.observer, "mu": mu,
                "epsilon": gossip.epsilon_of(mu, args.delta)}  # fmt: skip
        text = [f"node {args.target} against {args.observer}: mu = {mu:.4g}, epsilon = "
                f"{out['epsilon']:.4g} at delta = {args.delta:g} (local DP: mu = {local:.4g}, "
                f"epsilon = {out['local_dp_epsilon']:.4g})"]  # fmt: skip
    else:
        mu = gossip.pairwise_mu(mixing, **common)
        eps = gossip.epsilon_of(mu, args.delta)
        dist = gossip.graph_distances(mixing, args.rounds)
        rows = []
        for d in sorted({int(x) for x in dist[np.isfinite(dist)] if x > 0}):
            at = eps[dist == d]
            rows.append({"distance": d, "pairs": int(at.size), "worst": float(np.max(at)),
                         "median": float(np.median(at)), "best": float(np.min(at))})
        out["by_distance"] = rows
        text = [f"{topology.name}, n = {topology.n}, T = {args.rounds}, sigma = {args.sigma:g}, "
                f"delta = {args.delta:g}; local DP: epsilon = {out['local_dp_epsilon']:.4g} for "
                "every pair", "distance  pairs   worst eps  median eps    best eps"]  # fmt: skip
        text += [f"{r['distance']:>8}  {r['pairs']:>5}  {r['worst']:10.4g}  {r['median']:10.4g}"
                 f"  {r['best']:10.4g}" for r in rows]  # fmt: skip
        if args.plot:
            _plot(args.plot, eps, dist, out)
            text.append(f"plot: {args.plot}")
    if args.calibrate is not None:
        sigma = gossip.sigma_for_target(
            mixing, epsilon=args.calibrate, delta=args.delta, beyond_distance=args.beyond,
            rounds=args.rounds, sensitivity=args.sensitivity, contribution=args.contribution,
            noise=args.noise,
        )  # fmt: skip
        out["calibrated_sigma"] = sigma
        text.append(f"sigma = {sigma:.6g} holds every pair beyond {args.beyond} hops to "
                    f"epsilon <= {args.calibrate:g} at delta = {args.delta:g}")  # fmt: skip
    print(json.dumps(out, indent=2, default=float) if args.json else "\n".join(text))
    return 0


def _plot(path: str, eps, dist, info: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax_map, ax_d) = plt.subplots(1, 2, figsize=(11, 4.4))
    shown = np.where(np.isfinite(eps), eps, np.nan)
    image = ax_map.imshow(shown, cmap="viridis")
    ax_map.set(xlabel="observer v", ylabel="node u", title="ε of u against v")
    fig.colorbar(image, ax=ax_map)
    finite = np.isfinite(dist) & (dist > 0) & np.isfinite(eps)
    ax_d.scatter(dist[finite], eps[finite], s=12, alpha=0.6, label="pairs")
    ax_d.axhline(info["local_dp_epsilon"], color="black", linestyle="--", label="local DP")
    ax_d.set(xlabel="graph distance (hops)", ylabel="ε", title="ε by distance")
    ax_d.legend()
    fig.suptitle(f"{info['topology']}, n = {info['nodes']}, T = {info['rounds']}, "
                 f"σ = {info['sigma']:g}, δ = {info['delta']:g}")  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
