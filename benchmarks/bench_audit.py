"""Audit throughput (MATH.md §8): trials per second, batched against one trial per engine call.

    .venv/bin/python benchmarks/bench_audit.py [--trials T] [--steps K] [--sample-rate P]

``dpdl.audit`` stacks T independent trials as T blocks of n = 2 nodes and runs one
``local_update`` per step for all of them.  This measures, in one process, trials/s of that
batched form (chunks of 1000 trials) against one trial per engine call (chunk 1, on a
subset of the trials), and prints the ratio.  Const-D2P, ε = 2, δ = 1e-5, CLT calibration.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dpdl.accounting.schedules import make_schedule
from dpdl.audit import AuditDesign, run_trials


def trials_per_second(schedule, trials: int, chunk: int) -> float:
    members = np.arange(trials) % 2 == 1
    start = time.perf_counter()
    for first in range(0, trials, chunk):
        run_trials(schedule, AuditDesign(), members[first : first + chunk])
    return trials / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--sample-rate", type=float, default=1.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    schedule = make_schedule(
        "const-d2p", epsilon=2.0, delta=1e-5, steps=args.steps,
        sample_rate=args.sample_rate, calibrate="clt",
    )  # fmt: skip
    run_trials(schedule, AuditDesign(), np.array([True, False]))  # warm-up (vmap tracing)
    batched = trials_per_second(schedule, args.trials, chunk=1000)
    single = trials_per_second(schedule, max(20, args.trials // 50), chunk=1)
    print(f"K = {args.steps}, p = {args.sample_rate:g}, {args.trials} trials of 2 nodes")
    print(f"batched (1000 trials per engine call): {batched:10.1f} trials/s")
    print(f"one trial per engine call:             {single:10.1f} trials/s")
    print(f"ratio batched / single:                {batched / single:10.1f}x")


if __name__ == "__main__":
    main()
