"""Benchmark: the empirical pairwise network-DP accountant (MATH.md §6) at paper scale.

A complete-graph random walk of T = 100 n steps with n = 400 users (160 000 ordered pairs,
40 000 steps); times the vectorized accountant for summation (exact GDP and the paper's
advanced-composition recipe) and for SGD (amplification by iteration), and — on a small
instance — compares against a direct per-pair loop to show the speed-up.

    .venv/bin/python benchmarks/bench_netdp.py [--n 400] [--steps-per-user 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpdl.extensions.netdp import accounting as nd
from dpdl.extensions.netdp.algorithm import sample_random_walk


def loop_costs(walk: np.ndarray, n: int) -> np.ndarray:
    """The per-pair loop a user would write (summation costs, final view included)."""
    T = len(walk)
    cost = np.full((n, n), np.nan)
    for v in range(n):
        ends = list(np.flatnonzero(walk == v)) + [T]
        for u in range(n):
            if u == v:
                continue
            total, start = 0.0, 0
            for end in ends:
                seg = walk[start:end]
                k = int(np.sum(seg == u))
                if k:
                    total += k * k / len(seg)
                start = end + 1
            cost[u, v] = total
    return cost


def timed(label: str, fn):
    start = time.perf_counter()
    out = fn()
    elapsed = time.perf_counter() - start
    print(f"{label:<48} {elapsed:8.2f} s")
    return out, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=400)
    parser.add_argument("--steps-per-user", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    n, T = args.n, args.n * args.steps_per_user
    eps0, delta = 0.1, 1e-7
    z = nd.gaussian_sigma_for_ldp(eps0, delta)
    walk, _ = timed(f"sample walk (n={n}, T={T})", lambda: sample_random_walk(n, T, seed=args.seed))
    timed("pairwise costs, summation", lambda: nd.pairwise_costs(walk, n))
    exact, _ = timed("pairwise eps, summation, exact GDP",
                     lambda: nd.pairwise_privacy(walk, n, noise_multiplier=z, delta=delta))
    adv, _ = timed("pairwise eps, summation, advanced composition",
                   lambda: nd.pairwise_privacy(walk, n, epsilon0=eps0, delta=delta,
                                               composition="advanced"))
    sgd, _ = timed("pairwise eps, SGD, amplification by iteration",
                   lambda: nd.pairwise_privacy(walk, n, noise_multiplier=z, delta=delta,
                                               mechanism="sgd"))
    for name, rep in (("exact", exact), ("advanced", adv), ("sgd", sgd)):
        print(f"  {name:<9} network mean {rep.mean:.3f} best {rep.best:.3f} worst "
              f"{rep.worst:.3f} | local mean {rep.local_mean:.3f} worst {rep.local_worst:.3f}")
    small_n = 60
    small = sample_random_walk(small_n, 100 * small_n, seed=args.seed)
    fast, t_fast = timed(f"vectorized costs, n={small_n}",
                         lambda: nd.pairwise_costs(small, small_n))
    slow, t_slow = timed(f"per-pair loop,   n={small_n}", lambda: loop_costs(small, small_n))
    assert np.allclose(fast, slow, equal_nan=True)
    print(f"speed-up at n={small_n}: {t_slow / t_fast:.0f}x (identical costs)")


if __name__ == "__main__":
    main()
