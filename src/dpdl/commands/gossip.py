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
    p.add_argument("--algorithm", metavar="NAME",
                   help="a registered algorithm, name(key=value, ...): its view (rounds per "
                        "step, when noise is fresh); --rounds then counts its steps")
    p.add_argument("--correlation", default="independent", metavar="MODEL",
                   help="the noise's correlation across nodes: independent (default), pairwise "
                        "(DECOR) or neighbourhood-zero-sum; needs --target")
    p.add_argument("--correlation-factor", type=float, default=1.0, metavar="F",
                   help="the correlated part's std over the independent part's (default 1)")
    p.add_argument("--target", "-u", type=int, help="the node whose privacy is asked")
    p.add_argument("--observer", "-v", type=int, nargs="+", help="the observers (a coalition)")
    p.add_argument("--trust", choices=("curious-neighbours", "sec-ldp"),
                   help="instead of --observer: every neighbour of --target over the rounds "
                        "(they hold every secret it shares), or Sec-LDP's eavesdropper (every "
                        "message, no secret)")
    p.add_argument("--calibrate", type=float, metavar="EPS",
                   help="print the σ with every pair beyond --beyond hops within (EPS, δ)")
    p.add_argument("--beyond", type=int, default=0, metavar="D")
    p.add_argument("--plot", metavar="PNG", help="heat map of the pairwise ε and ε by distance")
    p.add_argument("--json", action="store_true")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (shown on a terminal for every pair and --calibrate)")


def _topology(args):
    from dpdl.commands.graph import topology_from
    from dpdl.errors import DPDLError
    from dpdl.topology import check_b_strongly_connected

    try:
        topology = topology_from(args.topology, args.nodes, seed=args.seed,
                                 edgelist=args.edgelist, default_nodes=16)  # fmt: skip
    except MemoryError as err:  # the dense n x n mixing matrices
        text = str(err).strip().splitlines()
        raise DPDLError(f"--nodes {args.nodes}: the graph's mixing matrices do not fit in "
                        f"memory ({text[0] if text else 'MemoryError'})") from None
    check_b_strongly_connected(topology)  # one line naming a window and an unreachable pair
    return topology


def _check_arguments(args) -> None:
    """Every flag, in one line naming the value, before any work (the topology's own checks
    follow when it is built)."""
    from pathlib import Path

    from dpdl.accounting import gossip
    from dpdl.errors import require

    gossip._check_sigma(args.sigma, args.sensitivity)
    require(args.rounds >= 1, f"--rounds must be >= 1, got {args.rounds}")
    require(0 < args.delta < 1, f"--delta must lie in (0, 1), got {args.delta}")
    require(args.nodes is None or args.nodes >= 2, f"--nodes must be >= 2, got {args.nodes}")
    require(args.seed >= 0, f"--seed must be >= 0, got {args.seed}")
    require(args.calibrate is None or (math.isfinite(args.calibrate) and args.calibrate > 0),
            f"--calibrate must be a finite epsilon > 0, got {args.calibrate}")  # fmt: skip
    require(args.beyond >= 0, f"--beyond must be a number of hops >= 0, got {args.beyond}")
    require(not (args.trust and args.observer), "give --observer or --trust, not both")
    require((args.target is None) == (not args.observer and not args.trust),
            "give both --target and --observer or --trust (or neither, for every pair)")
    require(args.correlation == "independent" or args.target is not None,
            f"--correlation {args.correlation}: give --target and --observer or --trust "
            "(every pair is computed for independent noise)")  # fmt: skip
    from dpdl.accounting.correlated import make_noise_model

    args.noise_model = make_noise_model(args.correlation, args.correlation_factor)
    if args.plot:
        folder = Path(args.plot).parent
        require(folder.is_dir(), f"--plot {args.plot}: folder {str(folder)!r} does not exist")


def _check_nodes_of(args, n: int) -> None:
    """--target and --observer name nodes 0..n-1 (-1 or n would read another node's column)."""
    from dpdl.errors import require

    for flag, nodes in (("--target", [] if args.target is None else [args.target]),
                        ("--observer", args.observer or [])):  # fmt: skip
        for v in nodes:
            require(0 <= v < n, f"{flag} {v} is not a node of this {n}-node graph (0..{n - 1})")
    require(args.target not in (args.observer or []),
            f"the target {args.target} is one of the observers")  # fmt: skip


def _algorithm_view(args) -> dict | None:
    """With --algorithm: the algorithm's view of one step turned into this command's rounds,
    noise and contribution (its first round of a step carries the contribution and fresh
    noise; the others only mix), or None.  An algorithm whose messages are not one linear
    Gaussian stream is stated by the local-DP bound of its releases, which always holds."""
    if not args.algorithm:
        return None
    from dpdl.algorithms.registry import resolve

    algorithm, settings = resolve(args.algorithm)
    view = algorithm.view(settings)
    steps = args.rounds
    described = {"algorithm": args.algorithm, "steps": steps, "rounds_per_step": view.rounds,
                 "exact_view": view.exact}  # fmt: skip
    if view.exact and not view.fresh_noise_every_round:
        args.rounds, args.period = steps * view.rounds, view.rounds
    elif view.exact:
        args.rounds = steps * view.rounds
    else:
        described["releases"] = {r.name: r.noise_factor for r in algorithm.releases(settings)}
        factors = list(described["releases"].values())
        described["local_dp_mu"] = math.sqrt(steps * sum(1 / f**2 for f in factors)) * (
            args.sensitivity / args.sigma)
    return described


def run(args) -> int:
    from dpdl.accounting import gossip

    _check_arguments(args)  # one-line errors before any work
    args.period = 1
    described = _algorithm_view(args)
    if described is not None and not described["exact_view"]:
        return _local_bound_only(args, described)
    topology = _topology(args)
    _check_nodes_of(args, topology.n)
    contributions = -(-args.rounds // args.period) if args.contribution == "every-round" else 1
    local = math.sqrt(contributions) * (args.sensitivity / args.sigma)
    out: dict = {"topology": topology.name, "nodes": topology.n, "rounds": args.rounds,
                 "sigma": args.sigma, "delta": args.delta, "contribution": args.contribution,
                 "noise": args.noise, "local_dp_mu": local,
                 "local_dp_epsilon": gossip.epsilon_of(local, args.delta)}  # fmt: skip
    if described is not None:
        out |= described
    if args.target is not None:
        text = _one_pair(args, topology, out)
    else:
        text = _every_pair(args, topology, out)
    if args.calibrate is not None:
        text.append(_calibrated(args, topology, out))
    print(json.dumps(out, indent=2, default=float) if args.json else "\n".join(text))
    return 0


def _common(args) -> dict:
    return dict(rounds=args.rounds, sigma=args.sigma, sensitivity=args.sensitivity,
                contribution=args.contribution, noise=args.noise, period=args.period)


def _local_bound_only(args, described: dict) -> int:
    from dpdl.accounting import gossip

    mu = described["local_dp_mu"]
    described["local_dp_epsilon"] = gossip.epsilon_of(mu, args.delta)
    text = (f"{args.algorithm}: its messages are not one linear Gaussian stream, so the exact "
            f"view is not modelled; every observer is bounded by the local DP of its "
            f"{len(described['releases'])} releases per step over {described['steps']} steps: "
            f"mu = {mu:.4g}, epsilon = {described['local_dp_epsilon']:.4g} at delta = "
            f"{args.delta:g}")  # fmt: skip
    print(json.dumps(described, indent=2, default=float) if args.json else text)
    return 0


def _bar(args, total: int, what: str):
    """A progress bar of ``total`` units on stderr when it is a terminal (tqdm's
    ``disable=None``, the rule of every dpdl bar), none with --no-progress.  tqdm itself,
    not dpdl.training's bar: this command never imports torch."""
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=what, disable=True if args.no_progress else None,
                leave=False, dynamic_ncols=True)  # fmt: skip


def _observers(args, topology) -> list[int]:
    """--observer, or the coalition --trust names (() for Sec-LDP's eavesdropper)."""
    import numpy as np

    from dpdl.accounting import gossip
    from dpdl.errors import require

    if args.trust == "sec-ldp":
        return []
    if args.trust == "curious-neighbours":
        dist = gossip.graph_distances(topology.mixing_matrix, args.rounds)
        near = np.flatnonzero((dist[args.target] == 1) | (dist[:, args.target] == 1))
        require(near.size > 0, f"node {args.target} has no neighbour over {args.rounds} rounds")
        return [int(v) for v in near]
    return list(args.observer)


def _one_pair(args, topology, out: dict) -> list[str]:
    from dpdl.accounting import gossip
    from dpdl.accounting.correlated import correlated_view_mu

    observers = _observers(args, topology)
    if args.correlation == "independent" and observers:
        with _bar(args, args.rounds, "view (rounds)") as bar:
            mu = gossip.view_mu(topology.mixing_matrix, target=args.target, observers=observers,
                                progress=bar.update, **_common(args))  # fmt: skip
    else:
        mu = correlated_view_mu(topology.mixing_matrix, rounds=args.rounds, target=args.target,
                                observers=tuple(observers), sigma=args.sigma,
                                model=args.noise_model, sensitivity=args.sensitivity,
                                contribution=args.contribution, period=args.period,
                                noise_once=args.noise == "once")  # fmt: skip
    who = args.trust or observers
    out |= {"target": args.target, "observers": observers, "trust": args.trust or "coalition",
            "correlation": args.correlation, "mu": mu,
            "epsilon": gossip.epsilon_of(mu, args.delta)}  # fmt: skip
    if args.correlation != "independent":
        out["correlation_factor"] = args.correlation_factor
    return [f"node {args.target} against {who}: mu = {mu:.4g}, epsilon = "
            f"{out['epsilon']:.4g} at delta = {args.delta:g} (local DP: mu = "
            f"{out['local_dp_mu']:.4g}, epsilon = {out['local_dp_epsilon']:.4g})"]  # fmt: skip


def _every_pair(args, topology, out: dict) -> list[str]:
    import numpy as np

    from dpdl.accounting import gossip

    mixing = topology.mixing_matrix
    with _bar(args, topology.n, "every pair (observers)") as bar:
        mu = gossip.pairwise_mu(mixing, progress=bar.update, **_common(args))
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
    return text


def _calibrated(args, topology, out: dict) -> str:
    from dpdl.accounting import gossip

    with _bar(args, topology.n, "calibration (observers)") as bar:
        sigma = gossip.sigma_for_target(
            topology.mixing_matrix, epsilon=args.calibrate, delta=args.delta,
            beyond_distance=args.beyond, rounds=args.rounds, sensitivity=args.sensitivity,
            contribution=args.contribution, noise=args.noise, progress=bar.update,
            period=args.period,
        )  # fmt: skip
    out["calibrated_sigma"] = sigma
    return (f"sigma = {sigma:.6g} holds every pair beyond {args.beyond} hops to "
            f"epsilon <= {args.calibrate:g} at delta = {args.delta:g}")


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
