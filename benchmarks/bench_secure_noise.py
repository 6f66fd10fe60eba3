"""Benchmark: the cost of ``--secure-noise`` per Dyn-D2P step (n = 20, the shallow CNN).

Two simulators side by side in one process, interleaved rounds (see bench_engine.py): the
default per-node Mersenne-Twister streams from OS entropy, and the hardened sampler
(AES-256-CTR CSPRNG per node, each normal the sum of four Box-Muller draws).  Prints the
median secure/default step-time ratio with [min .. max] over rounds, the noise draw alone under
both samplers, and the load average.

    .venv/bin/python benchmarks/bench_secure_noise.py [--rounds 5] [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

from bench_engine import interleaved
from dpdl.algorithms.dyn_d2p import draw_node_noise, make_node_generators
from dpdl.engine import NodeData, Simulator
from dpdl.models import make_model
from dpdl.topology import make_topology


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--records", type=int, default=300, help="records per node (J)")
    parser.add_argument("--batch", type=float, default=1.0, help="expected batch size b")
    parser.add_argument("--steps", type=int, default=5, help="steps per round")
    parser.add_argument("--rounds", type=int, default=5)
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
    default = Simulator(model, data, topology, **common)
    secure = Simulator(model, data, topology, secure_noise=True, **common)
    torch_gens = make_node_generators(n, None)
    secure_gens = make_node_generators(n, None, secure=True)
    buffer = torch.empty(n, d)
    load_before = os.getloadavg()[0]
    times = interleaved(
        {
            "default": lambda: default.step(private=True, clip=1.0, sigma=0.5),
            "secure": lambda: secure.step(private=True, clip=1.0, sigma=0.5),
            "noise_default": lambda: draw_node_noise(torch_gens, d, out=buffer),
            "noise_secure": lambda: draw_node_noise(secure_gens, d, out=buffer),
        },
        dict.fromkeys(("default", "secure", "noise_default", "noise_secure"), args.steps),
        args.rounds,
        torch.device("cpu"),
    )
    load_after = os.getloadavg()[0]
    ratio = times["secure"] / times["default"]
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(
        f"n={n} J={J} b={args.batch:g} cnn d={d} threads={torch.get_num_threads()} "
        f"rounds={args.rounds} x {args.steps} steps; 1-min load average {load_before:.2f} -> "
        f"{load_after:.2f} on {os.cpu_count()} CPUs"
    )
    print(f"default step        : {med['default']:8.1f} ms")
    print(f"secure-noise step   : {med['secure']:8.1f} ms")
    print(
        f"secure / default    : {np.median(ratio):8.2f} x [{ratio.min():.2f} .. {ratio.max():.2f}]"
    )
    print(
        f"noise draw alone    : default {med['noise_default']:.1f} ms, secure "
        f"{med['noise_secure']:.1f} ms (n x d = {n * d} normals)"
    )


if __name__ == "__main__":
    main()
