"""What choosing among runs costs the training records (issue 38): one run, the composition of
n runs (what a public selection releases) and the best of a random number of runs (private
selection, Papernot & Steinke 2022), all as RDP at δ, for one run's calibrated schedule.

    python examples/tuning_cost.py [--algorithm const-d2p] [--epsilon 0.3 1] [--delta 1e-4]
        [--steps 2750] [--sample-rate 0.000363636] [--runs 12 36 120 360] [--mean 3 10 36]

The defaults are tune-table2's Const-D2P cell (Fashion-MNIST, 20 nodes, b = 1, one epoch:
q = 1/2750, K = 2750, PLD-calibrated).  Seconds on one core.
"""

from __future__ import annotations

import argparse

from dpdl.accounting.schedules import ShapeOptions, make_schedule
from dpdl.accounting.selection import (
    SELECTION_ORDERS,
    best_of_rdp,
    gamma_for_mean,
    rdp_epsilon_at,
    schedule_rdp,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", default="const-d2p")
    parser.add_argument("--epsilon", type=float, nargs="+", default=[0.3, 1.0])
    parser.add_argument("--delta", type=float, default=1e-4)
    parser.add_argument("--steps", type=int, default=2750)
    parser.add_argument("--sample-rate", type=float, default=1 / 2750)
    parser.add_argument("--runs", type=int, nargs="+", default=[12, 36, 120, 360])
    parser.add_argument("--mean", type=float, nargs="+", default=[3.0, 10.0, 36.0])
    args = parser.parse_args()
    orders, delta = SELECTION_ORDERS, args.delta
    print("| ε per run (PLD) | one run (RDP) | "
          + " | ".join(f"{n} runs composed" for n in args.runs) + " | "
          + " | ".join(f"best of E[K] = {m:g} (η = 0 / 1)" for m in args.mean) + " |")
    print("|---" * (2 + len(args.runs) + len(args.mean)) + "|")
    for eps in args.epsilon:
        schedule = make_schedule(args.algorithm, epsilon=eps, delta=delta, steps=args.steps,
                                 sample_rate=args.sample_rate,
                                 options=ShapeOptions(clip=1.0), calibrate="pld")
        run = schedule_rdp(schedule.noise_multipliers, schedule.sample_rate)
        composed = [rdp_epsilon_at(orders, n * run, delta)[0] for n in args.runs]
        best = [[rdp_epsilon_at(orders, best_of_rdp(orders, run, eta, gamma_for_mean(eta, m)),
                                delta)[0] for eta in (0.0, 1.0)] for m in args.mean]
        print(f"| {eps:g} | {rdp_epsilon_at(orders, run, delta)[0]:.3f} | "
              + " | ".join(f"{e:.3f}" for e in composed) + " | "
              + " | ".join(f"{a:.3f} / {b:.3f}" for a, b in best) + " |")


if __name__ == "__main__":
    main()
