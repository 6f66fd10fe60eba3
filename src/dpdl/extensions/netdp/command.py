"""``dpdl netdp``: local vs network DP for the token algorithms (MATH.md §6, seed 002).

Prints (or writes as JSON) three comparisons for each number of users n, with T = steps or
T = T/n·n steps:

* A3 random-walk summation, the reference-figure heuristic (Figure 1(a) of the paper);
* the empirical pairwise losses over actual walks (Figure 1(b)): mean / best / worst pair,
  under the paper's advanced-composition recipe and under exact Gaussian composition;
* the ring algorithms A1 (summation) and A2 (histogram) with K = T/n rounds;

and draws a PNG like the paper's Figure 1 (ε against n, local vs network).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

HELP = "Network DP: local vs network DP for token algorithms (tables, Figure 1, pairwise)."


def add_arguments(parser) -> None:
    parser.add_argument("--n", type=int, nargs="+", default=[10, 20, 50, 100, 200],
                        help="numbers of users to compare (default: 10 20 50 100 200)")
    parser.add_argument("--steps-per-user", type=float, default=100.0,
                        help="T = this x n random-walk steps (default 100, as in the paper)")
    parser.add_argument("--steps", type=int, help="a fixed T for every n (overrides the above)")
    parser.add_argument("--epsilon0", type=float, default=0.1,
                        help="per-contribution LDP epsilon (default 0.1)")
    parser.add_argument("--delta", type=float, default=1e-7, help="delta (default 1e-7)")
    parser.add_argument("--walks", type=int, default=3,
                        help="random walks per n for the empirical accountant (default 3)")
    parser.add_argument("--mechanism", choices=["summation", "sgd"], default="summation",
                        help="what the token aggregates for the empirical accountant")
    parser.add_argument("--no-empirical", action="store_true",
                        help="skip the empirical pairwise accountant")
    parser.add_argument("--histogram-values", type=int, default=10,
                        help="L, the histogram domain size for A2 (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("--plot", type=Path, default=Path("runs/netdp/figure1.png"),
                        help="where to write the Figure-1 PNG (default runs/netdp/figure1.png)")
    parser.add_argument("--no-plot", action="store_true")


def _steps_for(n: int, args) -> int:
    from dpdl.errors import require

    if args.steps is not None:
        require(args.steps >= 1, f"--steps must be >= 1, got {args.steps}")
        return int(args.steps)
    require(math.isfinite(args.steps_per_user) and args.steps_per_user > 0,
            f"--steps-per-user must be > 0, got {args.steps_per_user}")
    return max(1, round(args.steps_per_user * n))


def compare(args) -> dict:
    """All the numbers the command prints, as one JSON-able dict."""
    from dpdl.errors import require
    from dpdl.extensions.netdp import accounting as nd
    from dpdl.extensions.netdp.algorithm import sample_random_walk

    require(args.walks >= 1, f"--walks must be >= 1, got {args.walks}")
    require(math.isfinite(args.epsilon0) and args.epsilon0 > 0,
            f"--epsilon0 must be a finite number > 0, got {args.epsilon0}")
    require(0 < args.delta < 1, f"--delta must lie in (0, 1), got {args.delta}")
    require(all(n >= 2 for n in args.n), f"--n values must be >= 2, got {args.n}")
    eps0, delta = args.epsilon0, args.delta
    sigma_multiplier = nd.gaussian_sigma_for_ldp(eps0, delta)  # (eps0, delta)-LDP Perturb
    rows = []
    for n in args.n:
        T = _steps_for(n, args)
        heuristic = nd.random_walk_summation_guarantees(n, T, eps0, delta)
        K = max(1, T // n)
        ring = nd.ring_summation_guarantees(n, K, eps0, delta, delta)
        L = args.histogram_values
        hist = nd.ring_histogram_guarantees(n, K, L, nd.randomized_response_gamma(eps0, L),
                                            delta, delta)
        row = {
            "n": n, "T": T,
            "heuristic": {m: heuristic[m].epsilon for m in ("local", "network")},
            "ring_summation": {m: g.to_dict() for m, g in ring.items()},
            "ring_histogram": {m: g.to_dict() for m, g in hist.items()},
        }
        if not args.no_empirical:
            runs = {"advanced": [], "exact": []}
            for w in range(args.walks):
                walk = sample_random_walk(n, T, seed=args.seed * 1000 + w)
                runs["advanced"].append(nd.pairwise_privacy(
                    walk, n, epsilon0=eps0, delta=delta, composition="advanced",
                    mechanism=args.mechanism))
                runs["exact"].append(nd.pairwise_privacy(
                    walk, n, noise_multiplier=sigma_multiplier, delta=delta,
                    composition="exact", mechanism=args.mechanism))
            row["empirical"] = {
                comp: {
                    "network_mean": float(np.mean([r.mean for r in reps])),
                    "network_best": float(min(r.best for r in reps)),
                    "network_worst": float(max(r.worst for r in reps)),
                    "local_mean": float(np.mean([r.local_mean for r in reps])),
                    "local_worst": float(max(r.local_worst for r in reps)),
                }
                for comp, reps in runs.items()
            }
        rows.append(row)
    return {"epsilon0": eps0, "delta": delta, "mechanism": args.mechanism,
            "walks": args.walks, "rows": rows}


def format_tables(result: dict) -> str:
    eps0, delta = result["epsilon0"], result["delta"]
    lines = [f"A3 random-walk summation, MATH.md §6 reference heuristic (not certified); "
             f"eps0={eps0:g}, delta={delta:g}",
             f"{'n':>6} {'T':>8} {'local eps':>10} {'network eps':>12} {'winner':>8}"]
    for r in result["rows"]:
        h = r["heuristic"]
        winner = "network" if h["network"] < h["local"] else "local"
        lines.append(f"{r['n']:>6} {r['T']:>8} {h['local']:>10.3f} {h['network']:>12.3f} "
                     f"{winner:>8}")
    if any("empirical" in r for r in result["rows"]):
        for comp, title in (("advanced", "paper recipe: eps0*sqrt(cost) per view, advanced "
                             "composition"),
                            ("exact", "exact Gaussian composition (GDP/RDP)")):
            lines += ["", f"Empirical pairwise losses ({result['mechanism']}, "
                      f"{result['walks']} walk(s)), {title}",
                      f"{'n':>6} {'net mean':>9} {'net best':>9} {'net worst':>10} "
                      f"{'local mean':>11} {'local worst':>12}"]
            for r in result["rows"]:
                e = r.get("empirical", {}).get(comp)
                if e:
                    lines.append(f"{r['n']:>6} {e['network_mean']:>9.3f} "
                                 f"{e['network_best']:>9.3f} {e['network_worst']:>10.3f} "
                                 f"{e['local_mean']:>11.3f} {e['local_worst']:>12.3f}")
    lines += ["", "Ring algorithms with K = T/n rounds (certified; error = std of the sum / "
              "expected L1 of the histogram)",
              f"{'n':>6} {'A1 eps':>8} {'A1 net err':>11} {'A1 loc err':>11} "
              f"{'A2 net eps':>11} {'A2 loc eps':>11}"]
    for r in result["rows"]:
        a1, a2 = r["ring_summation"], r["ring_histogram"]
        lines.append(f"{r['n']:>6} {a1['network']['epsilon']:>8.3f} "
                     f"{a1['network']['error']:>11.2f} {a1['local']['error']:>11.2f} "
                     f"{a2['network']['epsilon']:>11.3f} {a2['local']['epsilon']:>11.3f}")
    return "\n".join(lines)


def plot_figure1(result: dict, path: Path) -> Path:
    """ε against n, local vs network: (a) the heuristic bound, (b) the empirical losses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    ns = [r["n"] for r in rows]
    has_emp = all("empirical" in r for r in rows)
    fig, axes = plt.subplots(1, 2 if has_emp else 1, figsize=(11 if has_emp else 5.5, 4))
    axes = list(np.atleast_1d(axes)) if has_emp else [axes]
    ax = axes[0]
    ax.plot(ns, [r["heuristic"]["local"] for r in rows], "o-", label="local DP")
    ax.plot(ns, [r["heuristic"]["network"] for r in rows], "s-", label="network DP")
    ax.set(xscale="log", xlabel="number of users n", ylabel="epsilon",
           title="(a) A3 summation bound (heuristic)")
    ax.legend()
    if has_emp:
        ax = axes[1]
        emp = [r["empirical"]["advanced"] for r in rows]
        ax.plot(ns, [e["local_mean"] for e in emp], "o-", label="local DP (mean)")
        ax.plot(ns, [e["network_mean"] for e in emp], "s-", label="network DP mean")
        ax.fill_between(ns, [e["network_best"] for e in emp],
                        [e["network_worst"] for e in emp], alpha=0.25,
                        label="network DP best-worst pair")
        ax.set(xscale="log", xlabel="number of users n", ylabel="epsilon",
               title="(b) empirical pairwise losses")
        ax.legend()
    fig.suptitle(f"eps0={result['epsilon0']:g}, delta={result['delta']:g}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def run(args) -> int:
    result = compare(args)
    if not args.no_plot:
        result["plot"] = str(plot_figure1(result, args.plot))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(format_tables(result))
        if "plot" in result:
            print(f"\nfigure: {result['plot']}")
    return 0

