"""The noise each random-walk accountant needs, against the number of nodes (docs/results/
pnfdp.md; issue 28, claim 2): σ that makes the worst ordered pair of a hypercube meet (ε, δ)
under the certified PN-f-DP bound (MATH.md §7), the RDP baseline of Cyffers et al. 2024, and
local DP (no amplification by the walk: ⌊T/n⌋ Gaussian releases of sensitivity Δ, composed
exactly in GDP).

    python examples/pnfdp_noise_table.py [--nodes 16 32 ... 2048] \
        [--out docs/results/pnfdp-noise.csv]

Setting of the paper's Table 3 (MATH.md §7): T = 20000, Δ = 0.4, δ = 1e-5, K_loc = 1,
Metropolis weights.  PN-f-DP is computed for observer 0's column: every source against node 0.
The hypercube is vertex-transitive and its Metropolis walk uniform, so that column holds every
pair's law up to an automorphism: its worst source is the worst pair.  Resumable: rows already
in the CSV are kept.  One row is also one command, e.g.
    dpdl fdp pairwise -n 256 -T 20000 --sensitivity 0.4 --hop-form table --target 0 \\
        --relative-slack 1e-3 --target-epsilon 10 --no-plot
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from pathlib import Path

from dpdl.accounting.gdp import mu_from_epsilon_delta
from dpdl.extensions.fdp import accounting as fdp
from dpdl.extensions.fdp.experiment import walk_matrix_of
from dpdl.topology import make_topology

STEPS, SENSITIVITY, DELTA, RELATIVE_SLACK = 20000, 0.4, 1e-5, 1e-3
FIELDS = ["nodes", "epsilon", "hop_form", "compositions", "sigma_pn_fdp", "sigma_rdp_baseline",
          "sigma_local", "rdp_over_local", "pn_fdp_over_local", "seconds"]


def row(n: int, epsilon: float, hop_form: str) -> dict:
    start = time.perf_counter()
    walk = walk_matrix_of(make_topology("hypercube", n))
    k = fdp.composition_count(n, STEPS)
    bound = fdp.BoundSettings(sensitivity=SENSITIVITY, hop_form=hop_form,
                              relative_slack=RELATIVE_SLACK)
    pn = fdp.calibrate_sigma_pnfdp(walk, steps=STEPS, target_epsilon=epsilon, delta=DELTA,
                                   bound=bound, targets=[0])
    rdp = fdp.calibrate_sigma_rdp_baseline(walk, steps=STEPS, target_epsilon=epsilon,
                                           delta=DELTA, sensitivity=SENSITIVITY)
    local = math.sqrt(k) * SENSITIVITY / mu_from_epsilon_delta(epsilon, DELTA)
    return {"nodes": n, "epsilon": epsilon, "hop_form": hop_form, "compositions": k,
            "sigma_pn_fdp": pn, "sigma_rdp_baseline": rdp, "sigma_local": local,
            "rdp_over_local": rdp / local, "pn_fdp_over_local": pn / local,
            "seconds": round(time.perf_counter() - start, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+",
                        default=[16, 32, 64, 128, 256, 512, 1024, 2048])
    parser.add_argument("--epsilons", type=float, nargs="+", default=[1.0, 3.0, 10.0])
    parser.add_argument("--hop-forms", nargs="+", default=["lemma", "table"])
    parser.add_argument("--out", type=Path, default=Path("docs/results/pnfdp-noise.csv"))
    args = parser.parse_args(argv)
    done = set()
    if args.out.exists():
        with open(args.out) as fh:
            done = {(int(r["nodes"]), float(r["epsilon"]), r["hop_form"])
                    for r in csv.DictReader(fh)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fresh = not args.out.exists()
    with open(args.out, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        if fresh:
            writer.writeheader()
        for n in sorted(args.nodes, reverse=True):  # the large graphs are the fast ones
            for hop_form in args.hop_forms:
                for eps in args.epsilons:
                    if (n, eps, hop_form) in done:
                        continue
                    result = row(n, eps, hop_form)
                    writer.writerow(result)
                    fh.flush()
                    print(", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                    for k, v in result.items()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
