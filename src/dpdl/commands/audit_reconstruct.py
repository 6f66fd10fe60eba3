"""``dpdl audit --threat reconstruct``: which nodes a coalition reconstructs from gossip or
decentralized gradient descent, the reconstruction itself, and the same attack on a DP run
(:mod:`dpdl.audit.reconstruct`, :mod:`dpdl.audit.reconstruct_dgd`)."""

from __future__ import annotations

import argparse
import json
import math

from dpdl.errors import DPDLError, require

PROTOCOLS = ("gossip", "dgd")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--threat reconstruct")
    group.add_argument("--protocol", choices=PROTOCOLS, default="gossip",
                       help="gossip: averaging of private values (default); dgd: decentralized "
                       "gradient descent on one digit per node (softmax regression)")
    group.add_argument("--coalition", type=int, nargs="+", default=[0], metavar="NODE",
                       help="the curious nodes (default 0)")
    group.add_argument("--rounds", type=int, default=3, help="T (default 3)")
    group.add_argument("--edgelist", metavar="FILE", help="--topology edgelist: 'u v' lines")
    group.add_argument("--graph-seed", type=int, default=0, help="seed of random graphs (0)")
    group.add_argument("--sigma", type=float, default=0.0,
                       help="gossip: noise std per message (default 0: no noise)")
    group.add_argument("--lr", type=float, default=0.01, help="dgd: step size γ (0.01)")
    group.add_argument("--data-seed", type=int, default=0,
                       help="which values / digits the nodes hold (public demo data; 0)")


def _topology(args):
    from dpdl.commands.graph import topology_from
    from dpdl.topology import check_b_strongly_connected

    name = args.topology or ("edgelist" if args.edgelist else "exp")
    topology = topology_from(name, args.nodes_given, seed=args.graph_seed, edgelist=args.edgelist,
                             default_nodes=12)  # fmt: skip
    check_b_strongly_connected(topology)
    return topology


def _validate(args, n: int) -> None:
    require(args.rounds >= 1, f"--rounds must be >= 1, got {args.rounds}")
    for v in args.coalition:
        require(0 <= v < n, f"--coalition: node {v} is not in 0..{n - 1}")
    require(len(set(args.coalition)) < n, "--coalition holds every node: nobody to attack")
    require(math.isfinite(args.sigma) and args.sigma >= 0, f"--sigma must be >= 0, got "
            f"{args.sigma}")  # fmt: skip
    require(math.isfinite(args.lr) and args.lr > 0, f"--lr must be > 0, got {args.lr}")
    if args.protocol == "dgd" and args.sigma:
        raise DPDLError("--sigma is for --protocol gossip; a private dgd run takes --epsilon")


def _gossip_sigma(args) -> float:
    """--sigma, or the σ that makes every message of the protocol (ε, δ)-DP (local DP: one
    contribution of sensitivity 1, seen once, since every value is added once)."""
    if args.epsilon is None:
        return args.sigma
    from dpdl.accounting.gdp import mu_from_epsilon_delta

    require(not args.sigma, "give either --sigma or --epsilon for gossip, not both")
    return 1.0 / mu_from_epsilon_delta(args.epsilon, args.delta or 1e-5)


def _digits(n: int, seed: int):
    """n public digits (scikit-learn's 8x8 set, scaled to [0, 1]) and the set's mean image."""
    import numpy as np
    from sklearn.datasets import load_digits

    X, Y = load_digits(return_X_y=True)
    pick = np.random.default_rng(seed).choice(len(X), n, replace=False)
    return X[pick] / 16.0, Y[pick], X.mean(axis=0) / 16.0


def _print(result, topology, heard, floor=None, baseline=None) -> None:
    import numpy as np

    d = result.to_dict()
    what = "gossip averaging" if result.protocol == "gossip" else (
        f"decentralized GD ({d['algorithm']}, lr {d['lr']:g}) on one digit per node")
    noise = "no noise" if result.sigma == 0 else f"noise sigma {result.sigma:.4g}"
    print(f"{what} on {topology.name} ({topology.n} nodes), T = {result.rounds}, {noise}")
    print(f"coalition {list(result.coalition)} hears from {heard}")
    honest = result.n - len(result.coalition)
    print(f"reconstructible: {d['reconstructible']} ({len(d['reconstructible'])} of {honest} "
          f"honest nodes); not: {d['not_reconstructible']}")  # fmt: skip
    gossip = result.protocol == "gossip"
    errors = result.errors() if gossip else result.relative_errors()
    header = "node  value     estimate  error         " if gossip else "node  relative error"
    if floor is not None:
        header += "  best possible std (Δ/μ)"
    if result.protocol == "dgd":
        header += "  label (recovered)"
    print(header)
    for u in range(result.n):
        if u in result.coalition:
            continue
        err = "n/a" if not math.isfinite(errors[u]) else f"{errors[u]:.3g}"
        if result.protocol == "gossip":
            est = result.estimate[u]
            est = "--" if not math.isfinite(est) else f"{est:.4f}"
            line = f"{u:>4}  {result.truth[u]:.4f}    {est:<8}  {err:<14}"
        else:
            line = f"{u:>4}  {err:<14}"
        if floor is not None:
            line += f"  {floor[u]:.3g}".ljust(26)
        if result.protocol == "dgd":
            got = d["recovered_labels"][u]
            line += f"  {d['labels'][u]} ({'--' if got is None else got})"
        print(line.rstrip())
    hit = result.reconstructible
    if gossip and hit.any():
        print(f"median error over the reconstructible nodes: {np.median(errors[hit]):.3g} "
              "(values in [0, 1])")
    elif hit.any():
        print(f"median relative error over the reconstructible nodes: "
              f"{d['median_relative_error']:.3g}")  # fmt: skip
    if baseline is not None:
        print(f"(guessing the public mean digit: median relative error {baseline:.3g}); labels "
              f"recovered: {d['labels_recovered']} of {len(d['reconstructible'])}")


def run(args) -> int:
    import numpy as np

    from dpdl.algorithms.randomness import secret_rng
    from dpdl.audit.reconstruct import attack_gossip, knowledge_matrix

    topology = _topology(args)
    n = topology.n
    _validate(args, n)
    coalition = sorted(set(args.coalition))
    view = knowledge_matrix(topology.mixing_matrix, rounds=args.rounds,
                            coalition=coalition).view  # fmt: skip
    heard = sorted({j for _, j in view.rows})
    floor = baseline = None
    if args.protocol == "gossip":
        sigma = _gossip_sigma(args)
        values = np.random.default_rng(args.data_seed).random(n)  # private values in [0, 1]
        result = attack_gossip(topology.mixing_matrix, values, rounds=args.rounds,
                               coalition=coalition, sigma=sigma,
                               rng=secret_rng(args.seed) if sigma > 0 else None)  # fmt: skip
        if sigma > 0:
            from dpdl.accounting.gossip import view_mu

            floor = np.full(n, math.nan)
            for u in range(n):
                if u not in coalition:
                    mu = view_mu(topology.mixing_matrix, rounds=args.rounds, target=u,
                                 observers=coalition, sigma=sigma, contribution="once")
                    floor[u] = 0.0 if math.isinf(mu) else (1.0 / mu if mu > 0 else math.inf)
    else:
        from dpdl.audit.reconstruct_dgd import attack_dgd

        inputs, labels, mean = _digits(n, args.data_seed)
        schedule = None
        if args.epsilon is not None:
            from dpdl.accounting.schedules import ShapeOptions, make_schedule

            schedule = make_schedule(args.algorithm or "const-d2p", epsilon=args.epsilon,
                                     delta=args.delta or 1e-5, steps=args.rounds,
                                     sample_rate=1.0,
                                     options=ShapeOptions(clip=args.clip or 1.0))  # fmt: skip
        result = attack_dgd(topology, inputs, labels, 10, rounds=args.rounds,
                            coalition=coalition, lr=args.lr, schedule=schedule,
                            seed=args.seed)  # fmt: skip
        scale = np.linalg.norm(inputs, axis=1)
        baseline = float(np.median(np.linalg.norm(inputs - mean, axis=1) / scale))
    out = result.to_dict() | {"topology": topology.name, "nodes": n, "heard_from": heard}
    if floor is not None:
        out["best_possible_std"] = [None if not math.isfinite(v) else float(v) for v in floor]
    if baseline is not None:
        out["mean_digit_relative_error"] = baseline
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print(result, topology, heard, floor, baseline)
    return 0
