"""Benchmark: one private step with independent noise against DECOR's (issue 41).

The shallow CNN on 28x28 inputs (d = 114314), n = 20 nodes on the time-varying exponential
graph (two neighbours a step in its undirected version), J = 64 records, b = 8, σ = 2, C = 1,
one thread.  DECOR draws each edge's pairwise Gaussian once per process (d words and an exact
release at centre 0) on the noise worker thread, then releases the float64 centre exactly.
Prints ms/step of each, the mean of ``--steps`` steps after one warm-up, in interleaved
rounds::

    .venv/bin/python benchmarks/bench_decor_step.py [--rounds 3] [--steps 5]
        [--correlation-factor 2]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from dpdl.algorithms.correlated import make_correlation
from dpdl.engine.simulator import NodeData, Simulator, StepOptions
from dpdl.models import make_model
from dpdl.topology import make_topology

N, J = 20, 64
STEP = {"private": True, "clip": 1.0, "sigma": 2.0}


def _simulator(correlation) -> Simulator:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, J, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=(N, J))
    torch.manual_seed(0)
    return Simulator(make_model("cnn", (1, 28, 28), 10),
                     NodeData.from_arrays(x, y, np.ones((N, J), bool)), make_topology("exp", N),
                     lr=0.1, expected_batch_size=8.0, seed=1,
                     options=StepOptions(correlation=correlation))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--correlation-factor", type=float, default=2.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sims = {"independent": _simulator(make_correlation("independent")),
            "pairwise": _simulator(make_correlation("pairwise",
                                                    args.correlation_factor))}  # fmt: skip
    times = {name: [] for name in sims}
    for sim in sims.values():
        sim.step(**STEP)  # warm-up
    for _ in range(args.rounds):
        for name, sim in sims.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                sim.step(**STEP)
            times[name].append((time.perf_counter() - start) / args.steps * 1000)
    for name, values in times.items():
        print(f"{name}: {np.median(values):.0f} ms/step (rounds: "
              f"{', '.join(f'{v:.0f}' for v in values)})")


if __name__ == "__main__":
    main()
