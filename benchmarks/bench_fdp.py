"""PN-f-DP at the paper's scale (MATH.md §7, issue 15): one pair, one column, the full matrix.

    .venv/bin/python benchmarks/bench_fdp.py [--sizes 256 2048] [--full-max-n 256]

Setting of the PN-f-DP paper's Table 3 (seed 003): hypercube with Metropolis weights,
T = 20000, Δ = 0.4, δ = 1e-5, the table hop form √K·Δ/(σ√t) and the paper's σ for ε = 10
(MATH.md §7 oracles: n = 256 → ε ≈ 9.997, n = 2048 → ε ≈ 10.008). For each n:

* one pair 0 → 1 (``pnfdp_epsilon``: T sparse matrix-vector products, upper + optimistic);
* one column, every source against observer 1 (``pnfdp_epsilon_matrix(targets=[1])``);
* the full n×n matrix, chunks of targets with truncated hitting weights; above
  ``--full-max-n`` one chunk is timed and the whole matrix *projected* (n / chunk chunks);
* the σ calibrated for ε = 10 on pair 0 → 1 (``calibrate_sigma_pnfdp``);

beside the time the paper's code reports for one n = 2048 evaluation (847 s, issue 15).
Times are wall-clock seconds in this process (all rows under the same machine load).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from dpdl.extensions.fdp import accounting as fdp
from dpdl.extensions.fdp.experiment import walk_matrix_of
from dpdl.topology import make_topology

STEPS, SENSITIVITY, DELTA = 20_000, 0.4, 1e-5
PAPER_SIGMA = {256: 0.7446875, 2048: 0.3246875}  # MATH.md §7 table-form oracles
SPEC_EPSILON = {256: 9.997, 2048: 10.008}
PAPER_SECONDS = {2048: 847.0}  # the paper's code, one evaluation at n = 2048 (issue 15)
COMMON = {"steps": STEPS, "delta": DELTA,
          "bound": fdp.BoundSettings(sensitivity=SENSITIVITY, hop_form="table")}


def timed(function, *args, **kwargs):
    start = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - start


def row(name: str, value: str, seconds: float | None, note: str = "") -> None:
    shown = "" if seconds is None else f"{seconds:10.2f}"
    print(f"{name:<46} {value:>18} {shown:>10}  {note}", flush=True)


def bench(n: int, full_max_n: int) -> None:
    walk = walk_matrix_of(make_topology("hypercube", n))
    sigma = PAPER_SIGMA[n]
    paper = PAPER_SECONDS.get(n)
    (upper, lower), seconds = timed(fdp.pnfdp_epsilon, walk, 0, 1, sigma=sigma, **COMMON)
    note = f"MATH.md §7: ≈ {SPEC_EPSILON[n]}"
    if paper is not None:
        note += f"; paper's code {paper:.0f} s = {paper / seconds:.0f}x this"
    row(f"n={n} pair 0->1 [optimistic, upper]", f"[{lower:.4f}, {upper:.4f}]", seconds, note)
    column, seconds = timed(fdp.pnfdp_epsilon_matrix, walk, sigma=sigma, targets=[1], **COMMON)
    row(f"n={n} column (all sources -> 1), worst", f"{np.nanmax(column.epsilon):.4f}", seconds,
        f"RDP (HT) worst {np.nanmax(column.epsilon_rdp_ht):.4f}; {column.extra['hops']} hops")
    if n <= full_max_n:
        matrix, seconds = timed(fdp.pnfdp_epsilon_matrix, walk, sigma=sigma, **COMMON)
        row(f"n={n} full matrix, worst / mean", f"{np.nanmax(matrix.epsilon):.4f} / "
            f"{np.nanmean(matrix.epsilon):.4f}", seconds, matrix.method)
    else:
        # the first targets also pay for composing every pair class once: an upper estimate
        sample = 4
        _, seconds = timed(fdp.pnfdp_epsilon_matrix, walk, sigma=sigma,
                           targets=list(range(sample)), **COMMON)
        row(f"n={n} full matrix (projected from {sample} targets)", "—",
            seconds * n / sample, f"{seconds:.1f} s measured for {sample} of {n} targets")
    calibrated, seconds = timed(fdp.calibrate_sigma_pnfdp, walk, target_epsilon=10.0,
                                pair=(0, 1), **COMMON)
    row(f"n={n} calibrated sigma for eps=10, pair 0->1", f"{calibrated:.6f}", seconds,
        f"paper's Table 3: {sigma}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 2048],
                        choices=sorted(PAPER_SIGMA))
    parser.add_argument("--full-max-n", type=int, default=256,
                        help="largest n whose full matrix is computed (else projected)")
    args = parser.parse_args()
    print(f"{'measurement':<46} {'value':>18} {'seconds':>10}  note")
    for n in args.sizes:
        bench(n, args.full_max_n)


if __name__ == "__main__":
    main()
