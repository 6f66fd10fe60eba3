"""Benchmark: the cost of the secret noise streams per Dyn-D2P step (n = 20, the shallow CNN).

Three simulators side by side in one process, interleaved rounds (bench_floor.interleaved):

* ``mersenne`` -- what the default was before issue 21: one CPU ``torch.Generator`` per node
  (Mersenne Twister, 32 bits of its seed kept), float uniforms compared with p, one
  ``torch.randn`` per node (re-created here by a stand-in stream; never a dpdl option);
* ``default`` -- today's default: one ChaCha20 stream per node under a 256-bit OS key, exact
  integer Poisson inclusion, Box-Muller normals with a 63-bit radius uniform;
* ``secure`` -- ``--secure-noise``: the same streams, each normal the sum of four Box-Muller
  draws from 53-bit uniforms.

Prints the median default/mersenne and secure/default step-time ratios with [min .. max] over
rounds, the noise draw alone under each sampler, and the load average.

    .venv/bin/python benchmarks/bench_secure_noise.py [--rounds 5] [--steps 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch

import dpdl.algorithms.dyn_d2p as dyn
from bench_floor import interleaved
from dpdl.algorithms.dyn_d2p import draw_node_noise, make_node_generators
from dpdl.engine import NodeData, Simulator
from dpdl.models import make_model
from dpdl.topology import make_topology


class MersenneStream:
    """The pre-issue-21 per-node generator, for comparison only (its secret has 32 bits)."""

    hardened = False

    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def bernoulli(self, count: int, p: float) -> np.ndarray:
        return (torch.rand(count, generator=self.generator) < p).numpy()


def fill_normals_or_mersenne(streams, out):
    if isinstance(streams[0], MersenneStream):
        for row, stream in zip(out, streams, strict=True):
            torch.randn(row.shape, generator=stream.generator, out=row)
        return out
    return REAL_FILL(streams, out)


REAL_FILL = dyn.fill_normals


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
    dyn.fill_normals = fill_normals_or_mersenne  # the stand-in's normals (benchmark only)
    n, J = args.nodes, args.records
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, J, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=(n, J))
    data = NodeData.from_arrays(x, y, np.ones((n, J), bool))
    topology = make_topology("exp", n)
    model = make_model("cnn", (1, 28, 28), 10, seed=0)
    d = sum(p.numel() for p in model.parameters())
    common = dict(lr=0.03, expected_batch_size=args.batch)
    mersenne = Simulator(model, data, topology, **common)
    mersenne.generators = [MersenneStream(int(s)) for s in rng.integers(0, 2**31, size=n)]
    default = Simulator(model, data, topology, **common)
    secure = Simulator(model, data, topology, secure_noise=True, **common)
    streams = {
        "mersenne": [MersenneStream(i) for i in range(n)],
        "default": make_node_generators(n, None),
        "secure": make_node_generators(n, None, secure=True),
    }
    buffer = torch.empty(n, d)
    step = {"private": True, "clip": 1.0, "sigma": 0.5}
    fns = {
        "mersenne": lambda: mersenne.step(**step),
        "default": lambda: default.step(**step),
        "secure": lambda: secure.step(**step),
        **{f"noise_{k}": (lambda s=s: draw_node_noise(s, d, out=buffer))
           for k, s in streams.items()},
    }  # fmt: skip
    load_before = os.getloadavg()[0]
    times = interleaved(fns, dict.fromkeys(fns, args.steps), args.rounds, torch.device("cpu"))
    load_after = os.getloadavg()[0]
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    print(
        f"n={n} J={J} b={args.batch:g} cnn d={d} threads={torch.get_num_threads()} "
        f"rounds={args.rounds} x {args.steps} steps; 1-min load average {load_before:.2f} -> "
        f"{load_after:.2f} on {os.cpu_count()} CPUs"
    )
    for name in ("mersenne", "default", "secure"):
        print(f"{name + ' step':<20}: {med[name]:8.1f} ms")
    for num, den in (("default", "mersenne"), ("secure", "default")):
        ratio = times[num] / times[den]
        print(f"{num + ' / ' + den:<20}: {np.median(ratio):8.2f} x "
              f"[{ratio.min():.2f} .. {ratio.max():.2f}]")  # fmt: skip
    print(
        f"noise draw alone    : mersenne {med['noise_mersenne']:.1f} ms, default "
        f"{med['noise_default']:.1f} ms, secure {med['noise_secure']:.1f} ms "
        f"(n x d = {n * d} normals)"
    )


if __name__ == "__main__":
    main()
