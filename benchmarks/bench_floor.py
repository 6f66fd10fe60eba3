"""Benchmark: dpdl's step against the compute floor, and against Opacus in both its modes.

The *compute floor* of a step is one plain, non-private forward + backward of one model over
the same n·b records (one batch, one set of weights: no engine that keeps n models can beat
it).  Beside it, in interleaved rounds in one process:

* ``dp``: ``Simulator.step(private=True)`` (Poisson sampling, book-keeping clipping, the
  secret-stream noise, the local step and the mixing);
* ``sgp``: ``Simulator.step(private=False)`` (the non-private baseline of every table);
* ``opacus``: a per-node Opacus loop, ``GradSampleModule`` hooks (the default mode);
* ``opacus-ghost``: the same loop in Opacus's fast gradient clipping mode
  (``GradSampleModuleFastGradientClipping`` with ghost clipping, what ``make_private(...,
  grad_sample_mode="ghost")`` builds), what a speed-minded Opacus user picks.

The shallow CNN on 28x28 inputs, J = 300 records per node, C = 1, z = 0.5, the exponential
graph.  One line per case, each the median over rounds of the per-round ratio to the floor::

    floor n=N b=B: dp R.RRx sgp R.RRx opacus R.RRx opacus-ghost R.RRx

then ms/step of each (and of ``floor-chunked``: the floor in batches of 64 records, its
cache-friendly form at large n·b), and the peak memory of each contender at n = 64, b = 16
(the growth of VmHWM over the set-up of a fresh process; the median over three such
processes).  Run on a quiet machine, one thread:

    .venv/bin/python benchmarks/bench_floor.py --threads 1 [--nodes 20 64]
        [--batches 1 4 16 64] [--rounds 3] [--seconds 0.5] [--memory] [--device cpu]
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import math
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_vs_opacus import (  # noqa: E402  (a sibling script, not a package)
    CLIP,
    LR,
    SIGMA,
    OpacusLoop,
    _high_water_reset,
    _status_kib,
    make_workload,
)
from dpdl.engine import Simulator  # noqa: E402

CONTENDERS = ("floor", "dp", "sgp", "opacus", "opacus-ghost")
# beside them, not in the ratio line: the floor in batches of 64 records
REFERENCES = ("floor-chunked",)


class OpacusGhostLoop(OpacusLoop):
    """The per-node Opacus loop in fast gradient clipping mode (ghost clipping)."""

    def __init__(self, model, data, topology, *, b: float, seed: int = 0):
        from opacus.grad_sample import GradSampleModuleFastGradientClipping
        from opacus.optimizers import DPOptimizerFastGradientClipping
        from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        self.data, self.topology, self.n = data, topology, data.n_nodes
        self.sample_rate = b / int(data.counts.min())
        # on the data's device: Opacus draws its noise where the parameters are
        self.generators = [torch.Generator(data.inputs.device).manual_seed(seed * 100_003 + i)
                           for i in range(self.n)]  # fmt: skip
        self.modules, self.optimizers, self.losses = [], [], []
        for g in self.generators:
            module = GradSampleModuleFastGradientClipping(
                copy.deepcopy(model), loss_reduction="sum", max_grad_norm=CLIP,
                use_ghost_clipping=True,
            )  # fmt: skip
            sgd = torch.optim.SGD(module.parameters(), lr=LR / b)
            opt = DPOptimizerFastGradientClipping(
                sgd, noise_multiplier=SIGMA / CLIP, max_grad_norm=CLIP,
                expected_batch_size=None, loss_reduction="sum", generator=g,
            )  # fmt: skip
            criterion = torch.nn.CrossEntropyLoss(reduction="sum")
            self.modules.append(module)
            self.optimizers.append(opt)
            self.losses.append(DPLossFastGradientClipping(module, opt, criterion, "sum"))
        self.k = 0

    def backward(self, i: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        if len(inputs) == 0:  # ghost clipping needs a record; an empty batch sends noise only
            for p in self.modules[i].parameters():
                p.grad = torch.zeros_like(p)
                p.summed_grad = torch.zeros_like(p)
            return
        self.losses[i](self.modules[i](inputs), targets).backward()


class Floor:
    """One plain forward + backward of the model over n·b records: the compute floor; with
    ``chunk``, the same records in batches of at most ``chunk`` (gradients accumulated), the
    floor's cache-friendly form where one batch of n·b records no longer fits in cache."""

    def __init__(self, model, data, b: int, chunk: int | None = None):
        self.model = copy.deepcopy(model)
        n, J = data.inputs.shape[:2]
        take = torch.arange(n * b) % (n * J)
        self.inputs = data.inputs.reshape(n * J, *data.inputs.shape[2:])[take]
        self.targets = data.targets.reshape(n * J)[take]
        self.chunk = chunk or len(self.inputs)

    def step(self) -> None:
        self.model.zero_grad(set_to_none=True)
        for lo in range(0, len(self.inputs), self.chunk):
            out = self.model(self.inputs[lo : lo + self.chunk])
            targets = self.targets[lo : lo + self.chunk]
            torch.nn.functional.cross_entropy(out, targets, reduction="sum").backward()


def make_contender(who: str, n: int, b: int, J: int, device):
    data, topology, model = make_workload(n, J)
    if device.type != "cpu":
        from dpdl.engine import NodeData

        data = NodeData(data.inputs.to(device), data.targets.to(device), data.mask.to(device))
        model = model.to(device)
    if who == "floor":
        return Floor(model, data, b).step
    if who == "floor-chunked":
        return Floor(model, data, b, chunk=64).step
    if who in ("dp", "sgp"):
        sim = Simulator(model, data, topology, lr=LR, expected_batch_size=b, device=device)
        if who == "dp":
            return lambda: sim.step(private=True, clip=CLIP, sigma=SIGMA)
        return lambda: sim.step(private=False)
    loop = (OpacusLoop if who == "opacus" else OpacusGhostLoop)(model, data, topology, b=b)
    return loop.step


def seconds_per_call(fn, calls: int, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls


def interleaved(fns: dict, calls: dict, rounds: int, device) -> dict[str, np.ndarray]:
    """Seconds per call of each function in ``rounds`` interleaved rounds (after one warm-up
    call each): the contenders see the same machine load, and per-round ratios cancel most
    of it."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(seconds_per_call(fn, calls[name], device))
    return {name: np.asarray(t) for name, t in times.items()}


def case(n: int, b: int, J: int, rounds: int, budget_s: float, device, who) -> dict:
    fns = {name: make_contender(name, n, b, J, device) for name in who}
    calls = {}
    for name, fn in fns.items():  # warm-up, then enough calls for ~budget_s a round
        fn()
        calls[name] = max(1, math.ceil(budget_s / seconds_per_call(fn, 1, device)))
    return interleaved(fns, calls, rounds, device)


def report(n: int, b: int, times: dict) -> None:
    ratios = {k: times[k] / times["floor"] for k in times if k != "floor"}
    line = " ".join(f"{k} {np.median(r):.2f}x" for k, r in ratios.items() if k in CONTENDERS)
    spread = ", ".join(f"{k} [{r.min():.2f}..{r.max():.2f}]" for k, r in ratios.items())
    ms = ", ".join(f"{k} {np.median(t) * 1e3:.1f}" for k, t in times.items())
    print(f"floor n={n} b={b}: {line}", flush=True)
    print(f"    ms/step: {ms}; ratio ranges over rounds: {spread}", flush=True)


def measure_one(spec: dict) -> dict:
    """In a fresh process: seconds per step and the peak memory growth of one contender."""
    torch.set_num_threads(spec["threads"])
    device = torch.device(spec["device"])
    step = make_contender(spec["who"], spec["n"], spec["b"], spec["J"], device)
    base_kib = _status_kib("VmRSS")
    reset = _high_water_reset()
    step()  # the first step allocates the engine's buffers: part of the peak
    seconds = seconds_per_call(step, spec["steps"], device)
    peak_kib = _status_kib("VmHWM")
    return {"seconds": seconds, "peak_mb": (peak_kib - base_kib) / 1024 if reset else None}


def memory(J: int, threads: int, device, who, repeats: int = 3) -> None:
    """Peak memory growth of each contender at n = 64, b = 16: the median over ``repeats``
    fresh processes, with the range (one process's figure moves with where the allocator's
    arenas happen to lie)."""
    print(f"\npeak memory n=64 b=16 (median [range] over {repeats} fresh processes each; "
          f"load {os.getloadavg()[0]:.1f})")  # fmt: skip
    for name in who:
        spec = {"who": name, "n": 64, "b": 16, "J": J, "steps": 2, "threads": threads,
                "device": str(device)}  # fmt: skip
        results = []
        for _ in range(repeats):
            out = subprocess.run(
                [sys.executable, __file__, "--measure-one", json.dumps(spec)],
                check=True, capture_output=True, text=True,
            )  # fmt: skip
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        peaks = [r["peak_mb"] for r in results if r["peak_mb"] is not None]
        peak = (f"{np.median(peaks):.0f} MB [{min(peaks):.0f}..{max(peaks):.0f}]"
                if peaks else "n/a")  # fmt: skip
        ms = np.median([r["seconds"] for r in results]) * 1e3
        print(f"memory {name:12s}: peak {peak} over the set-up, {ms:.0f} ms/step", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[20, 64])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--records", type=int, default=300, help="records per node (J)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="per contender per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--only", nargs="+", choices=CONTENDERS[1:], default=None,
                        help="contenders beside the floor (default: all)")  # fmt: skip
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--memory-repeats", type=int, default=3,
                        help="fresh processes per contender for the peak memory")
    parser.add_argument("--measure-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure_one(json.loads(args.measure_one))))
        return
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    who = ("floor", *(args.only or CONTENDERS[1:]), *REFERENCES)
    if importlib.util.find_spec("opacus") is None:
        print("opacus is not installed (pip install -e '.[bench]'): its loops are left out")
        who = tuple(name for name in who if not name.startswith("opacus"))
    print(f"dpdl against the compute floor: cnn, J={args.records}, C={CLIP}, z={SIGMA / CLIP}, "
          f"exp graph, device={device}, threads={torch.get_num_threads()}, {os.cpu_count()} "
          f"CPUs, 1-min load {os.getloadavg()[0]:.2f}; median over {args.rounds} rounds of "
          "(s/step) / (floor s/step)", flush=True)  # fmt: skip
    for n in args.nodes:
        for b in args.batches:
            report(n, b, case(n, b, args.records, args.rounds, args.seconds, device, who))
    if args.memory:
        memory(args.records, args.threads, device, who, args.memory_repeats)


if __name__ == "__main__":
    main()
