"""``dpdl fdp``: f-DP accounting for decentralized learning (MATH.md §7, seed 003).

``dpdl fdp [pairwise]`` — PN-f-DP of random-walk DP-SGD on a named graph (or the user's,
``--edgelist FILE``), beside two RDP
baselines (Cyffers et al. 2024, and "RDP (HT)" with exact hitting times, seed 003's
Table 1). Three scopes:

* ``--pair I J`` — one pair (with its optimistic twin); T matrix-vector products, seconds
  even at n = 2048 (no (T+1)·n² table);
* ``--target J`` — one column: every source against observer J (CSV);
* neither — the full matrix, computed in chunks of targets with truncated hitting weights
  (``--tolerance``: sound) and a progress bar; CSV + heat-map PNGs.

``--hop-form lemma|table`` picks the per-hop μ_t (MATH.md §7): Lemma 4.3's √K·Δ/(σ√(tK+1))
(default) or the more conservative √K·Δ/(σ√t) of the script behind the paper's Table 3
(use it to reproduce that table's σ). ``--target-epsilon`` calibrates σ for the pair, the
column's worst source, or the worst pair.

``dpdl fdp decor`` — DECOR's Sec-LDP (RDP, DECOR's simple conversion and the optimal one)
and Sec-f-LDP ε for (σ, σ_cor), eavesdropper only or with ``--curious`` nodes, and with
``--target-epsilon`` the calibrated σ for the given σ_cor.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np

from dpdl.errors import DPDLError, require

HELP = "f-DP accounting: PN-f-DP pairwise matrices, DECOR's Sec-f-LDP."
PAIRWISE_HELP = ("PN-f-DP of random-walk DP-SGD on a graph, pair by pair, beside two RDP "
                 "baselines (Cyffers et al. 2024 and RDP with exact hitting times). All "
                 "assume every hop's update is non-expansive (convex, smooth, a step <= 2/L, "
                 "a clip that never acts: MATH.md §7); a neural network has local DP only.")
DECOR_HELP = ("DECOR's Sec-LDP (RDP) and Sec-f-LDP ε for (σ, σ_cor), against an eavesdropper "
              "or with --curious nodes.")
DEFAULT_GRAPH, DEFAULT_NODES = "hypercube", 32


def add_arguments(parser) -> None:
    """Two modes, each with its own ``--help``; without a MODE ``dpdl fdp`` runs pairwise
    (its flags are accepted before any MODE, but listed only under ``dpdl fdp pairwise``)."""
    parser.description = (f"{HELP} MODE pairwise (the default): {PAIRWISE_HELP} MODE decor: "
                          f"{DECOR_HELP} `dpdl fdp MODE --help` lists a mode's flags.")
    hidden = _declarer(parser, listed=False)
    _shared_arguments(hidden)
    _pairwise_arguments(hidden, parser.add_mutually_exclusive_group())
    parser.set_defaults(what="pairwise")
    parser.usage = "%(prog)s [pairwise | decor] [FLAGS ...]"
    modes = parser.add_subparsers(dest="what", metavar="MODE")
    pairwise = modes.add_parser("pairwise", prog=f"{parser.prog} pairwise", help=PAIRWISE_HELP,
                                description=PAIRWISE_HELP)
    listed = _declarer(pairwise, listed=True)
    _shared_arguments(listed)
    _pairwise_arguments(listed, pairwise.add_mutually_exclusive_group())
    decor = modes.add_parser("decor", prog=f"{parser.prog} decor", help=DECOR_HELP,
                             description=DECOR_HELP)
    _shared_arguments(_declarer(decor, listed=True))
    _decor_arguments(decor)


def _declarer(parser, *, listed: bool):
    """``add_argument`` for the fdp parser (listed=False: accepted, as pairwise's, not shown)
    or a mode's (listed=True: shown; no default, so a value given before the MODE stays)."""
    import argparse

    def add(*names, group=None, **options):
        options |= {"default": argparse.SUPPRESS} if listed else {"help": argparse.SUPPRESS}
        (group or parser).add_argument(*names, **options)

    return add


def _shared_arguments(add) -> None:
    add("--graph", default=None,
        help=f"topology name for dpdl.topology.make_topology (default {DEFAULT_GRAPH})")
    add("--edgelist", metavar="FILE", default=None,
        help="the graph from a file of 'u v' lines, node ids 0..n-1 (as dpdl graph "
             "--edgelist); replaces --graph")
    add("--nodes", "-n", type=int, default=None,
        help=f"number of nodes (default {DEFAULT_NODES}; inferred from --edgelist)")
    add("--graph-seed", type=int, default=0, help="seed of random graphs")
    add("--steps", "-T", type=int, default=275, help="iterations T (275)")
    add("--sigma", type=float, default=1.0, help="noise std σ (1.0)")
    add("--delta", type=float, default=1e-5, help="δ (1e-5)")
    add("--target-epsilon", type=float, default=None,
        help="also calibrate σ to this ε (pairwise: pair / column / worst pair; decor)")
    add("--json", action="store_true", default=False, help="print JSON instead of text")


def _pairwise_arguments(add, scope) -> None:
    add("--sensitivity", type=float, default=1.0, help="sensitivity Δ of one update (1.0)")
    add("--local-steps", type=int, default=1, help="K_loc (1)")
    add("--contraction", type=float, default=1.0,
        help="per-hop contraction c ≤ 1 (strongly convex; 1 = none)")
    add("--hop-form", choices=("lemma", "table"), default="lemma",
        help="per-hop μ_t — lemma: √K·Δ/(σ√(tK+1)) (Lemma 4.3, default); table: √K·Δ/(σ√t), "
             "as the code behind the paper's Table 3 (more conservative)")
    add("--zeta", type=float, default=None,
        help="compose ⌈(1+ζ)T/n⌉ times with the Markov slack δ' instead of the contribution "
             "cap ⌊T/n⌋")
    add("--relative-slack", type=float, default=2e-4,
        help="grid of μ² relative to μ_1² (2e-4; smaller = tighter)")
    add("--tolerance", type=float, default=1e-12,
        help="stop the hitting-time recursion once every pair's unreached mass is below this; "
             "it is then put on the next hop's μ (sound) (1e-12; 0 = all T hops)")
    add("--pair", type=int, nargs=2, metavar=("I", "J"), default=None, group=scope,
        help="only this pair (leak of I to J), with its optimistic twin; no full matrix")
    add("--target", type=int, metavar="J", default=None, group=scope,
        help="only observer J's column (every source against J)")
    add("--output", type=Path, default=Path("runs/fdp"),
        help="folder for the CSV and PNG files (runs/fdp)")
    add("--no-plot", action="store_true", default=False, help="no heat map")


def _decor_arguments(parser) -> None:
    parser.add_argument("--sigma-cor", type=float, default=0.0, help="σ_cor (0)")
    parser.add_argument("--clip", type=float, default=1.0, help="clipping bound C (1)")
    parser.add_argument("--curious", type=int, nargs="*", default=[],
                        help="indices of curious nodes (default: eavesdropper only)")


def _node_count(args) -> int:
    """--nodes, else the edge list's 1 + largest node id, else the default."""
    from dpdl.topology import edgelist_node_count

    if args.nodes is not None:
        return args.nodes
    return DEFAULT_NODES if args.edgelist is None else edgelist_node_count(args.edgelist)


def _topology(args):
    from dpdl.topology import make_topology

    require(args.nodes >= 2, f"--nodes must be >= 2, got {args.nodes}")
    if args.edgelist is None:
        return make_topology(args.graph, args.nodes, seed=args.graph_seed)
    require(args.graph is None,
            f"--edgelist {args.edgelist} is the graph: drop --graph {args.graph}")
    return make_topology("edgelist", args.nodes, path=args.edgelist)


def _pair_baselines(walk: np.ndarray, rows, cols, common: dict) -> dict:
    """The Cyffers et al. 2024 RDP baseline at the given entries (symmetric walks only)."""
    from dpdl.extensions.fdp import accounting as fdp

    if not np.allclose(walk, walk.T, atol=1e-12):
        return {"rdp_baseline": "needs a symmetric walk matrix (undirected graph)"}
    rho = fdp.rdp_baseline_rho(walk, steps=common["steps"], sigma=common["sigma"],
                               sensitivity=common["sensitivity"])[rows, cols]
    return {"rdp_baseline": fdp.rdp_epsilon_from_rho(np.atleast_1d(rho), common["delta"])}


def _pairwise(args) -> dict:
    from dpdl.extensions.fdp import accounting as fdp
    from dpdl.extensions.fdp.experiment import walk_matrix_of

    topology = _topology(args)
    walk = walk_matrix_of(topology)
    n = walk.shape[0]
    options = dict(steps=args.steps, delta=args.delta)

    def bound(relative_slack: float) -> fdp.BoundSettings:
        return fdp.BoundSettings(sensitivity=args.sensitivity, local_steps=args.local_steps,
                                 contraction=args.contraction, zeta=args.zeta,
                                 relative_slack=relative_slack, hop_form=args.hop_form,
                                 tolerance=args.tolerance)
    # the Cyffers baseline has no K_loc: fold it into the sensitivity, as the experiment does
    baseline_common = dict(steps=args.steps, sigma=args.sigma, delta=args.delta,
                           sensitivity=args.sensitivity * math.sqrt(args.local_steps))
    out = {"graph": topology.name, "nodes": n, "hop_form": args.hop_form}
    report = baseline = None
    if args.pair is not None:
        i, j = args.pair
        slack = min(args.relative_slack, 1e-4)
        upper, lower = fdp.pnfdp_epsilon(walk, i, j, sigma=args.sigma, bound=bound(slack),
                                         **options)
        rdp_ht = fdp.rdp_ht_epsilon(walk, i, j, steps=args.steps, sigma=args.sigma,
                                    delta=args.delta, sensitivity=args.sensitivity,
                                    local_steps=args.local_steps, tolerance=args.tolerance)
        pair = {"source": i, "target": j, "epsilon_upper": upper, "epsilon_lower": lower,
                "compositions": fdp.composition_count(n, args.steps, zeta=args.zeta),
                "epsilon_rdp_ht": rdp_ht}
        cyffers = _pair_baselines(walk, i, j, baseline_common)["rdp_baseline"]
        pair["epsilon_rdp_baseline"] = cyffers if isinstance(cyffers, str) else float(cyffers[0])
        out["pair"] = pair
    else:
        targets = None if args.target is None else [args.target]
        report = fdp.pnfdp_epsilon_matrix(
            walk, sigma=args.sigma, bound=bound(args.relative_slack), targets=targets,
            progress=sys.stderr.isatty(), **options)
        out["pn_fdp"] = report.summary()
        if args.target is None:
            neighbours = [j for j in np.flatnonzero(walk[0] > 0) if j != 0]
            if neighbours:
                out["pn_fdp"][f"epsilon_neighbour_0_to_{neighbours[0]}"] = float(
                    report.epsilon[0, neighbours[0]])
            if np.allclose(walk, walk.T, atol=1e-12):
                baseline = fdp.rdp_baseline_epsilon(walk, **baseline_common)
                out["rdp_baseline"] = baseline.summary()
            else:
                out["rdp_baseline"] = "needs a symmetric walk matrix (undirected graph)"
        else:
            j = args.target
            sources = np.array([i for i in range(n) if i != j])
            cyffers = _pair_baselines(walk, sources, np.full(sources.size, j), baseline_common)
            cyffers = cyffers["rdp_baseline"]
            out["target"] = j
            out["rdp_baseline"] = cyffers if isinstance(cyffers, str) else {
                "epsilon_max": float(np.nanmax(cyffers)),
                "epsilon_mean": float(np.nanmean(cyffers))}
            worst = int(np.nanargmax(report.epsilon[:, j]))
            out["pn_fdp"]["worst_source"] = worst
    if args.target_epsilon is not None:
        scope = ({"pair": tuple(args.pair)} if args.pair is not None
                 else {"targets": [args.target]} if args.target is not None else {})
        cal = {"target_epsilon": args.target_epsilon,
               "sigma_pn_fdp": fdp.calibrate_sigma_pnfdp(
                   walk, target_epsilon=args.target_epsilon,
                   bound=bound(min(args.relative_slack, 1e-4) if args.pair is not None
                               else args.relative_slack),
                   progress=sys.stderr.isatty(), **options, **scope)}
        if np.allclose(walk, walk.T, atol=1e-12):
            cal["sigma_rdp_baseline"] = fdp.calibrate_sigma_rdp_baseline(
                walk, steps=args.steps, target_epsilon=args.target_epsilon, delta=args.delta,
                sensitivity=args.sensitivity * math.sqrt(args.local_steps))
        out["calibration"] = cal
    if report is not None:
        out["files"] = _write_pairwise(args, report, baseline, topology.name)
    return out


def _write_pairwise(args, report, baseline, name: str) -> list[str]:
    args.output.mkdir(parents=True, exist_ok=True)
    files = []
    if args.target is not None:  # one column: source, PN-f-DP ε, RDP (HT) ε
        j = args.target
        path = args.output / f"{name}-n{args.nodes}-target{j}-epsilon.csv"
        table = np.column_stack([np.arange(args.nodes), report.epsilon[:, j],
                                 report.epsilon_rdp_ht[:, j]])
        np.savetxt(path, table, delimiter=",", fmt=["%d", "%.6f", "%.6f"],
                   header=f"source,pn_fdp_epsilon,rdp_ht_epsilon (leak of source to {j}), "
                          f"delta={args.delta}, T={args.steps}, sigma={args.sigma}, "
                          f"hop_form={args.hop_form}")
        return [str(path)]
    for label, rep in (("pn_fdp", report), ("rdp_baseline", baseline)):
        if rep is None:
            continue
        path = args.output / f"{name}-n{args.nodes}-{label}-epsilon.csv"
        np.savetxt(path, rep.epsilon, delimiter=",", fmt="%.6f",
                   header=f"{label} epsilon[i,j] (leak of i to j), delta={args.delta}, "
                          f"T={args.steps}, sigma={args.sigma}; diagonal nan")
        files.append(str(path))
    if not args.no_plot:
        path = args.output / f"{name}-n{args.nodes}-epsilon.png"
        _heat_maps(path, report, baseline, name)
        files.append(str(path))
        path = args.output / f"{name}-n{args.nodes}-tradeoff.png"
        _tradeoff_plot(path, args, report, name)
        files.append(str(path))
    return files


def _tradeoff_plot(path: Path, args, report, name: str) -> None:
    """f of the worst pair after k contributions, against local DP (no walk) and G_μ."""
    from dpdl.extensions.fdp import accounting as fdp
    from dpdl.extensions.fdp.experiment import walk_matrix_of

    walk = walk_matrix_of(_topology(args))
    eps = np.where(np.isnan(report.epsilon), -np.inf, report.epsilon)
    i, j = np.unravel_index(np.argmax(eps), eps.shape)
    single = fdp.single_visit_tradeoff(walk, int(i), int(j), args.steps, args.sigma,
                                       sensitivity=args.sensitivity,
                                       local_steps=args.local_steps,
                                       contraction=args.contraction, hop_form=args.hop_form)
    composed = single.self_compose(report.compositions,
                                   grid=1e-3 * float(single.mu_squared.max()))
    local_mu = math.sqrt(report.compositions * args.local_steps) * args.sensitivity / args.sigma
    fdp.plot_tradeoff(
        {f"PN-f-DP pair {i}->{j} (k={report.compositions})": composed,
         f"local DP, G_{local_mu:.3g}": fdp.GaussianTradeOff(local_mu),
         f"({report.epsilon[i, j]:.3g}, {args.delta:g})-DP": fdp.EpsilonDeltaTradeOff(
             float(report.epsilon[i, j]), args.delta)},
        path, title=f"{name} n={args.nodes}, T={args.steps}, σ={args.sigma:g}")


def _heat_maps(path: Path, report, baseline, name: str) -> None:
    import matplotlib.pyplot as plt

    fig = heat_map_figure(report, baseline, name)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def heat_map_figure(report, baseline, name: str):
    """The pairwise-ε heat maps (PN-f-DP, and the RDP baseline when given), laid out by
    matplotlib's constrained layout so that titles, labels and colour bars fit the figure."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    panels = [("PN-f-DP (certified for a non-expansive hop map)", report.epsilon)]
    if baseline is not None:
        panels.append(("RDP baseline", baseline.epsilon))
    vmax = max(float(np.nanmax(m)) for _, m in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 4.4), squeeze=False,
                             layout="constrained")
    for ax, (title, matrix) in zip(axes[0], panels, strict=True):
        image = ax.imshow(matrix, cmap="viridis", vmin=0, vmax=vmax)
        ax.set_title(f"{title}: max ε = {np.nanmax(matrix):.3f}", fontsize="small")
        ax.set_xlabel("observer j")
        ax.set_ylabel("source i")
        fig.colorbar(image, ax=ax)
    fig.suptitle(f"pairwise ε on {name}, T={report.steps}, σ={report.sigma:g}, "
                 f"δ={report.delta:g}")
    return fig


def _decor(args) -> dict:
    from dpdl.extensions.fdp import accounting as fdp

    topology = _topology(args)
    require(not topology.directed,
            f"DECOR needs an undirected graph; {topology.name!r} is directed "
            "(try undirected-ring, hypercube, torus, complete)")
    W = topology.mixing_matrix(0)
    privacy = fdp.decor_privacy(W, sigma=args.sigma, sigma_cor=args.sigma_cor, steps=args.steps,
                                delta=args.delta, clip=args.clip, curious=args.curious)
    out = {"graph": topology.name, "nodes": args.nodes, "curious": list(args.curious),
           "sigma": args.sigma, "sigma_cor": args.sigma_cor, **privacy.to_dict()}
    if args.target_epsilon is not None:
        out["calibration"] = {
            "target_epsilon": args.target_epsilon,
            **{f"sigma_{acc.replace('-', '_')}": fdp.calibrate_sigma_decor(
                W, sigma_cor=args.sigma_cor, target_epsilon=args.target_epsilon,
                steps=args.steps, delta=args.delta, clip=args.clip, curious=args.curious,
                accountant=acc) for acc in fdp.DECOR_ACCOUNTANTS},
        }
    return out


def _print_text(out: dict, what: str) -> None:
    def fmt(v):
        return f"{v:.6g}" if isinstance(v, float) else str(v)

    if what == "decor":
        print(f"DECOR on {out['graph']} (n={out['nodes']}), curious={out['curious'] or 'none'}")
        for key in ("rho_step", "mu_total", "epsilon_rdp_simple", "epsilon_rdp", "epsilon_fdp"):
            print(f"  {key:20s} {fmt(out[key])}")
    else:
        scope = (f", observer {out['target']}" if "target" in out else "")
        print(f"PN-f-DP of random-walk DP-SGD on {out['graph']} (n={out['nodes']}{scope}, "
              f"hop form {out['hop_form']})")
        if "pn_fdp" in out:
            s = out["pn_fdp"]
            print(f"  {'pn_fdp':13s} worst {fmt(s['epsilon_max'])}  mean "
                  f"{fmt(s['epsilon_mean'])}  best {fmt(s['epsilon_min'])}")
            print(f"  {'rdp_ht':13s} worst {fmt(s['epsilon_rdp_ht_max'])}  mean "
                  f"{fmt(s['epsilon_rdp_ht_mean'])}")
            b = out["rdp_baseline"]
            if isinstance(b, str):
                print(f"  {'rdp_baseline':13s} {b}")
            else:
                print(f"  {'rdp_baseline':13s} worst {fmt(b['epsilon_max'])}  mean "
                      f"{fmt(b['epsilon_mean'])}")
        if "pair" in out:
            p = out["pair"]
            print(f"  pair {p['source']}->{p['target']} ({p['compositions']} compositions): "
                  f"PN-f-DP ε ≤ {fmt(p['epsilon_upper'])} (optimistic "
                  f"{fmt(p['epsilon_lower'])}); RDP (HT) {fmt(p['epsilon_rdp_ht'])}; "
                  f"RDP baseline {fmt(p['epsilon_rdp_baseline'])}")
        for f in out.get("files", []):
            print(f"  wrote {f}")
    for key, value in out.get("calibration", {}).items():
        print(f"  {key:20s} {fmt(value)}")


def run(args) -> int:
    args.nodes = _node_count(args)
    if args.edgelist is None and args.graph is None:
        args.graph = DEFAULT_GRAPH
    if args.what == "decor":
        out = _decor(args)
    else:
        if args.pair is not None:
            i, j = args.pair
            if not (0 <= i < args.nodes and 0 <= j < args.nodes and i != j):
                raise DPDLError(f"--pair {i} {j} must name two distinct nodes in [0, {args.nodes})")
        if args.target is not None and not 0 <= args.target < args.nodes:
            raise DPDLError(f"--target {args.target} must name a node in [0, {args.nodes})")
        out = _pairwise(args)
    if args.json:
        print(json.dumps(out, indent=2, default=float))
    else:
        _print_text(out, args.what)
    return 0
