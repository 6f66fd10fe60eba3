"""Benchmark: the exact noise release per Dyn-D2P step against the sampler it replaced.

Simulators side by side in one process, interleaved rounds (bench_floor.interleaved), the
shallow CNN, n = 20, b = 1, the same secret streams:

* ``exact`` -- today's default: every node's noisy sum released as round_g(S + sigma X),
  exactly in law (MATH.md §10: words on a worker thread, a float64 fast path, mpmath for the
  rare rest);
* ``box-muller`` -- the float32 Box-Muller sampler and arithmetic that ``main`` released with
  before issue 38 (``dpdl.audit.legacy_noise``: kept to be refuted; never a training option).

Prints the median exact/box-muller step-time ratio with [min .. max] over rounds, each
mechanism's noise alone (the data-free draw, then the release against the sums), the share of
coordinates that took the exact path, and the load average.

    .venv/bin/python benchmarks/bench_noise.py [--rounds 9] [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from bench_floor import interleaved
from dpdl.algorithms import noise
from dpdl.algorithms.dyn_d2p import GAUSSIAN_RELEASE, make_node_generators
from dpdl.audit.legacy_noise import LEGACY_MECHANISMS
from dpdl.engine import NodeData, Simulator, StepOptions
from dpdl.models import make_model
from dpdl.topology import make_topology


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--records", type=int, default=300, help="records per node (J)")
    parser.add_argument("--batch", type=float, default=1.0, help="expected batch size b")
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    n, J = args.nodes, args.records
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, J, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=(n, J))
    data = NodeData.from_arrays(x, y, np.ones((n, J), bool))
    topology = make_topology("exp", n)
    model = make_model("cnn", (1, 28, 28), 10, seed=0)
    d = sum(p.numel() for p in model.parameters())
    common = dict(lr=0.03, expected_batch_size=args.batch)
    old = LEGACY_MECHANISMS["legacy-box-muller"]
    sims = {"exact": Simulator(model, data, topology, **common),
            "box-muller": Simulator(model, data, topology,
                                    options=StepOptions(mechanism=old), **common)}
    step = {"private": True, "clip": 1.0, "sigma": 0.5}
    sums = {"w": torch.randn(n, d)}
    out = {"w": torch.empty(n, d)}
    x_flat = {"w": torch.randn(n, d)}
    buffer = noise.NoiseDraw.empty(n, d)

    def alone(mechanism, reuse=None):
        drawn = mechanism.start(make_node_generators(n, None), d, 0.5, reuse=reuse)
        mechanism.noisy_step(drawn, x_flat, sums, 0.03, out=out)

    fns = {
        **{name: (lambda s=sim: s.step(**step)) for name, sim in sims.items()},
        "noise_exact": lambda: alone(GAUSSIAN_RELEASE, buffer),
        "noise_box-muller": lambda: alone(old),
    }
    load_before = os.getloadavg()[0]
    times = interleaved(fns, dict.fromkeys(fns, args.steps), args.rounds, torch.device("cpu"))
    load_after = os.getloadavg()[0]
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(f"n={n} J={J} b={args.batch:g} cnn d={d} threads={torch.get_num_threads()} "
          f"rounds={args.rounds} x {args.steps} steps; 1-min load average {load_before:.2f} -> "
          f"{load_after:.2f} on {os.cpu_count()} CPUs")  # fmt: skip
    for name in sims:
        print(f"{name + ' step':<22}: {med[name]:8.1f} ms")
    ratio = times["exact"] / times["box-muller"]
    print(f"{'exact / box-muller':<22}: {np.median(ratio):8.2f} x "
          f"[{ratio.min():.2f} .. {ratio.max():.2f}]")  # fmt: skip
    print(f"noise alone (n x d = {n * d}): exact {med['noise_exact']:.1f} ms, box-muller "
          f"{med['noise_box-muller']:.1f} ms (the step hides the draw on a worker thread)")
    drawn = noise.draw(make_node_generators(n, None), d, 0.5)
    noise.release_float32(drawn, sums["w"])
    print(f"coordinates on the exact path: {drawn.exact_count} of {n * d}")


if __name__ == "__main__":
    main()
