"""The pairwise audit table of docs/RESULTS.md: how much privacy Dyn-D2P's nodes really have
against an observer 1, 2, 3 hops away (dpdl audit --threat observer), beside the local-DP ε
the run claims and the exact view ε (MATH.md §9).

    python examples/observer_audit_table.py [--trials 10000] [--out docs/results/observer-audit.csv]

Resumable: rows already in the CSV are kept.  Each row is also one command:
    dpdl audit --threat observer --observer V --topology T --nodes 16 --algorithm const-d2p \\
        --epsilon 2 --delta 1e-5 --steps 10 --sample-rate 1 --trials 10000
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from dpdl.accounting.gossip import graph_distances
from dpdl.audit import AuditDesign, run_audit
from dpdl.topology import make_topology

NODES, STEPS, EPSILON, DELTA = 16, 10, 2.0, 1e-5
FIELDS = ["topology", "observers", "distance", "epsilon_claimed", "epsilon_view", "mu_view",
          "epsilon_lower", "epsilon_lower_gdp", "mu_lower_gdp", "trials"]  # fmt: skip


def settings():
    for name in ("ring", "exp", "geometric"):
        topology = make_topology(name, NODES)
        dist = graph_distances(topology.mixing_matrix, topology.period)[0]
        for d in (1, 2, 3):
            at = [v for v in range(NODES) if dist[v] == d]
            if at:
                yield name, (at[0],), d
        at2 = tuple(v for v in range(NODES) if dist[v] == 2)
        if len(at2) > 1:
            yield name, at2, 2  # the whole ring of nodes two hops away, as one coalition


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--out", default="docs/results/observer-audit.csv")
    args = parser.parse_args()
    out = Path(args.out)
    done = {}
    if out.exists():
        with out.open() as fh:
            done = {(r["topology"], r["observers"]): r for r in csv.DictReader(fh)}
    rows = []
    for name, observers, d in settings():
        key = (name, " ".join(map(str, observers)))
        if key in done:
            rows.append(done[key])
            continue
        design = AuditDesign(threat="observer", nodes=NODES, topology=name, observers=observers)
        r = run_audit("const-d2p", epsilon=EPSILON, delta=DELTA, steps=STEPS, sample_rate=1.0,
                      trials=args.trials, design=design)  # fmt: skip
        rows.append({"topology": name, "observers": key[1], "distance": d,
                     "epsilon_claimed": r.epsilon_claimed, "epsilon_view": r.epsilon_view,
                     "mu_view": r.mu_view, "epsilon_lower": r.epsilon_lower,
                     "epsilon_lower_gdp": r.epsilon_lower_gdp, "mu_lower_gdp": r.mu_lower_gdp,
                     "trials": args.trials})  # fmt: skip
        with out.open("w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=FIELDS)
            writer.writeheader()
            writer.writerows(rows)
        print(rows[-1], flush=True)
    print("| topology | observers | distance | ε claimed (local DP) | ε of the exact view | "
          "ε_lower (CP) | ε_lower (GDP fit) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['topology']} | {r['observers']} | {r['distance']} | "
              f"{float(r['epsilon_claimed']):.3g} | {float(r['epsilon_view']):.3g} | "
              f"{float(r['epsilon_lower']):.3g} | {float(r['epsilon_lower_gdp']):.3g} |")


if __name__ == "__main__":
    main()
