"""Benchmark: a real model through the private step: ResNet-18 (GroupNorm) on 32x32 images.

n nodes, b expected records per node (J = 4b each), C = 1, z = 0.5, the exponential graph; in
interleaved rounds in one process (bench_floor.interleaved):

* ``floor``: one plain forward + backward over the n·b images (bench_floor's compute floor);
* ``dp``: ``Simulator.step(private=True)``; ``sgp``: ``Simulator.step(private=False)``;
* ``opacus``, ``opacus-ghost``: the per-node Opacus loops of bench_floor (if installed);
* ``noise``: the private step's noise alone: the data-free draw of n·d secret normals
  (``GaussianRelease.start``) and their release against sums of the step's shape
  (``noisy_step``), on the step's device.

Prints ms/step and the ratio to the floor of each (median [min..max] over rounds), and the
noise's share of the private step (median noise time / median dp time: an upper bound, since
the engine draws the noise on a worker thread while the sums are computed).

    .venv/bin/python benchmarks/bench_resnet.py --threads 1 [--nodes 8] [--batch 4]
        [--rounds 3] [--device cpu] [--only dp sgp noise]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_floor import Floor, OpacusGhostLoop, interleaved  # noqa: E402  (sibling scripts)
from bench_vs_opacus import CLIP, LR, SIGMA, OpacusLoop  # noqa: E402
from dpdl.algorithms.dyn_d2p import GAUSSIAN_RELEASE, make_node_generators  # noqa: E402
from dpdl.engine import NodeData, Simulator  # noqa: E402
from dpdl.models import make_model  # noqa: E402
from dpdl.topology import make_topology  # noqa: E402

CONTENDERS = ("floor", "dp", "sgp", "opacus", "opacus-ghost", "noise")


def workload(n: int, b: int, device: torch.device):
    rng = np.random.default_rng(0)
    j = 4 * b
    x = rng.normal(size=(n, j, 3, 32, 32)).astype(np.float32)
    data = NodeData.from_arrays(x, rng.integers(0, 10, size=(n, j)), np.ones((n, j), bool))
    data = NodeData(data.inputs.to(device), data.targets.to(device), data.mask.to(device))
    model = make_model("resnet18-gn", (3, 32, 32), 10, seed=0).to(device)
    return data, make_topology("exp", n), model


def noise_only(n: int, d: int, device: torch.device):
    """The mechanism's two halves on n streams of d words, against random float32 sums."""
    streams = make_node_generators(n, None)
    sums = {"w": torch.randn(n, d, device=device)}
    x = {"w": torch.zeros(n, d, device=device)}
    out = {"w": torch.empty(n, d, device=device)}
    buffer = [None]

    def step():
        buffer[0] = GAUSSIAN_RELEASE.start(streams, d, SIGMA, device=device, reuse=buffer[0])
        GAUSSIAN_RELEASE.noisy_step(buffer[0], x, sums, LR, out)

    return step


def contender(who: str, n: int, b: int, device: torch.device):
    data, topology, model = workload(n, b, device)
    if who == "floor":
        return Floor(model, data, b).step
    if who == "noise":
        return noise_only(n, sum(p.numel() for p in model.parameters()), device)
    if who in ("dp", "sgp"):
        sim = Simulator(model, data, topology, lr=LR, expected_batch_size=b, device=device)
        if who == "dp":
            return lambda: sim.step(private=True, clip=CLIP, sigma=SIGMA)
        return lambda: sim.step(private=False)
    return (OpacusLoop if who == "opacus" else OpacusGhostLoop)(model, data, topology, b=b).step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS[1:], default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    who = ("floor", *(args.only or CONTENDERS[1:]))
    if importlib.util.find_spec("opacus") is None:
        print("opacus is not installed (pip install -e '.[bench]'): its loops are left out")
        who = tuple(name for name in who if not name.startswith("opacus"))
    n, b = args.nodes, args.batch
    print(f"resnet18-gn 32x32, n={n}, b={b}, C={CLIP}, z={SIGMA / CLIP}, exp graph, "
          f"device={device}, threads={torch.get_num_threads()}, 1-min load "
          f"{os.getloadavg()[0]:.2f}; {args.rounds} interleaved rounds", flush=True)  # fmt: skip
    fns = {name: contender(name, n, b, device) for name in who}
    times = interleaved(fns, dict.fromkeys(fns, 1), args.rounds, device)
    for name, t in times.items():
        ratio = t / times["floor"]
        print(f"{name:13s} {np.median(t) * 1e3:9.0f} ms/step  {np.median(ratio):6.2f}x floor "
              f"[{ratio.min():.2f}..{ratio.max():.2f}]", flush=True)  # fmt: skip
    if "noise" in times and "dp" in times:
        share = np.median(times["noise"]) / np.median(times["dp"])
        print(f"noise share of the private step: {share:.0%} "
              f"(noise {np.median(times['noise']) * 1e3:.0f} ms of dp "
              f"{np.median(times['dp']) * 1e3:.0f} ms)")  # fmt: skip
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
