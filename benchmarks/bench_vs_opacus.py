"""Benchmark: dpdl's simulator against a per-node Opacus loop doing the same Dyn-D2P work.

The Opacus loop is what a user who does not pick dpdl would write: one ``GradSampleModule`` +
``DPOptimizer`` (SGD) per node, Poisson sampling with each node's own generator, the clipped
sum + N(0, sigma^2) noise divided by b (``loss_reduction="sum"``, lr / b: no NaN on an empty
batch), ``zero_grad(set_to_none=True)`` right after each node's step (its per-sample gradients
are freed at once), then push-sum mixing by hand over each node's in-neighbours.  dpdl runs
``Simulator.step(private=True)``.  Same model (the shallow CNN on 28x28 inputs), J records
per node, C = 1, z = 0.5, the exponential graph (doubly stochastic: every w_i stays 1).
Before timing, each case checks that both compute the same clipped sums (max |difference|).

Timing: interleaved rounds in one process (the machine is shared), medians and [min..max] of
the per-round ratios, load average printed.  One line per case:

    vs-opacus n=N b=B: R.RRx [MIN..MAX]

``--scaling`` adds the simulator's steps/s and peak memory for n in {20, 64, 256}, logreg and
CNN, b in {1, 16}; ``--memory`` the peak memory of both contenders at n = 64, b = 16.  Peak
memory is measured in a fresh subprocess per case: the growth of the resident set's high-water
mark (VmHWM, reset through /proc/self/clear_refs) over the resident set after set-up.

    pip install -e '.[bench]'        # opacus, for this benchmark only
    .venv/bin/python benchmarks/bench_vs_opacus.py --threads 1 [--nodes 20 64]
        [--batches 1 4 16 64] [--rounds 3] [--scaling] [--memory]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import torch

from dpdl.algorithms.dyn_d2p import clipped_record_sums, make_node_generators, poisson_sample
from dpdl.engine import NodeData, Simulator, stack_params
from dpdl.models import make_model
from dpdl.topology import make_topology

LR, CLIP, SIGMA = 0.03, 1.0, 0.5


def make_workload(n: int, J: int, model_name: str = "cnn", seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, J, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=(n, J))
    data = NodeData.from_arrays(x, y, np.ones((n, J), bool))
    return data, make_topology("exp", n), make_model(model_name, (1, 28, 28), 10, seed=seed)


class OpacusLoop:
    """n nodes, each an Opacus GradSampleModule + DPOptimizer; mixing by hand."""

    def __init__(self, model, data: NodeData, topology, *, b: float, seed: int = 0):
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer

        # Opacus's hooks warn when the input needs no gradient (the first layer's never does)
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        self.data, self.topology, self.n = data, topology, data.n_nodes
        self.sample_rate = b / int(data.counts.min())
        # Opacus draws its noise from a torch.Generator (not a secret stream): benchmark only.
        # on the data's device: Opacus draws its noise where the parameters are
        self.generators = [torch.Generator(data.inputs.device).manual_seed(seed * 100_003 + i)
                           for i in range(self.n)]  # fmt: skip
        self.modules, self.optimizers = [], []
        for g in self.generators:
            module = GradSampleModule(copy.deepcopy(model), loss_reduction="sum")
            sgd = torch.optim.SGD(module.parameters(), lr=LR / b)
            self.modules.append(module)
            self.optimizers.append(
                DPOptimizer(sgd, noise_multiplier=SIGMA / CLIP, max_grad_norm=CLIP,
                            expected_batch_size=None, loss_reduction="sum", generator=g)
            )  # fmt: skip
        self.k = 0

    def backward(self, i: int, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        out = self.modules[i](inputs)
        torch.nn.functional.cross_entropy(out, targets, reduction="sum").backward()

    def step(self) -> None:
        counts = self.data.counts.tolist()
        for i, (g, opt) in enumerate(zip(self.generators, self.optimizers, strict=True)):
            draw = torch.rand(counts[i], generator=g, device=g.device)
            chosen = torch.nonzero(draw < self.sample_rate)
            chosen = chosen.flatten()
            self.backward(i, self.data.inputs[i, chosen], self.data.targets[i, chosen])
            opt.step()
            opt.zero_grad(set_to_none=True)
        P = self.topology.mixing_matrix(self.k)
        params = [list(m.parameters()) for m in self.modules]
        with torch.no_grad():
            mixed = [
                [sum(float(P[i, j]) * params[j][q] for j in np.flatnonzero(P[i]))
                 for q in range(len(params[i]))]
                for i in range(self.n)
            ]  # fmt: skip
            for mine, new in zip(params, mixed, strict=True):
                for p, value in zip(mine, new, strict=True):
                    p.copy_(value)
        self.k += 1


def check_clipped_sums(model, data: NodeData, b: float) -> float:
    """Max |dpdl - Opacus| over the clipped per-node sums of one Poisson batch."""
    n = data.n_nodes
    loop = OpacusLoop(model, data, make_topology("exp", n), b=b)
    batch = poisson_sample(data.inputs, data.targets, data.mask, loop.sample_rate,
                           make_node_generators(n, 123))  # fmt: skip
    params = stack_params(model, n, torch.device("cpu"))
    ours = clipped_record_sums(model, params, batch, CLIP)
    worst = 0.0
    for i in range(n):
        mine = batch.node == i
        if not bool(mine.any()):
            continue
        loop.backward(i, batch.inputs[mine], batch.targets[mine])
        loop.optimizers[i].clip_and_accumulate()
        for (name, p) in loop.modules[i]._module.named_parameters():
            worst = max(worst, float((p.summed_grad - ours[name][i]).abs().max()))
        loop.optimizers[i].zero_grad(set_to_none=True)
    return worst


def timed(fn, calls: int) -> float:
    return timed_both(fn, calls)[0]


def timed_both(fn, calls: int) -> tuple[float, float]:
    """Wall-clock and CPU (all threads of this process) seconds per call."""
    start, start_cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls, (time.process_time() - start_cpu) / calls


def compare(n: int, b: int, J: int, rounds: int, budget_s: float) -> None:
    data, topology, model = make_workload(n, J)
    diff = check_clipped_sums(model, data, b)
    sim = Simulator(model, data, topology, lr=LR, expected_batch_size=b, seed=0)
    loop = OpacusLoop(model, data, topology, b=b)
    contenders = {"dpdl": lambda: sim.step(private=True, clip=CLIP, sigma=SIGMA),
                  "opacus": loop.step}  # fmt: skip
    calls = {}
    for name, fn in contenders.items():  # warm-up, and enough calls for ~budget_s a round
        calls[name] = max(1, math.ceil(budget_s / timed(fn, 1)))
    times = {name: [] for name in contenders}
    cpu = {name: [] for name in contenders}
    load = os.getloadavg()[0]
    for _ in range(rounds):
        for name, fn in contenders.items():
            wall, used = timed_both(fn, calls[name])
            times[name].append(wall)
            cpu[name].append(used)
    ratio = np.asarray(times["opacus"]) / np.asarray(times["dpdl"])
    cpu_ratio = np.asarray(cpu["opacus"]) / np.asarray(cpu["dpdl"])
    print(
        f"vs-opacus n={n} b={b}: {np.median(ratio):.2f}x [{ratio.min():.2f}..{ratio.max():.2f}]"
        f"   (dpdl {np.median(times['dpdl']) * 1e3:.0f} ms/step, opacus "
        f"{np.median(times['opacus']) * 1e3:.0f} ms/step; CPU-time ratio "
        f"{np.median(cpu_ratio):.2f}x [{cpu_ratio.min():.2f}..{cpu_ratio.max():.2f}]; "
        f"{rounds} rounds x {calls['dpdl']}/{calls['opacus']} steps, load {load:.1f} -> "
        f"{os.getloadavg()[0]:.1f}, max |clipped-sum difference| {diff:.1e})",
        flush=True,
    )


# ------------------------------------------------------------------ memory, in a subprocess
def _high_water_reset() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def measure_one(spec: dict) -> dict:
    """Run in a fresh process: steps/s and peak memory growth of one contender."""
    torch.set_num_threads(spec["threads"])
    data, topology, model = make_workload(spec["n"], spec["J"], spec["model"])
    b = spec["b"]
    if spec["who"] == "dpdl":
        sim = Simulator(model, data, topology, lr=LR, expected_batch_size=b, seed=0)

        def step():
            sim.step(private=True, clip=CLIP, sigma=SIGMA)
    else:
        step = OpacusLoop(model, data, topology, b=b).step
    base_kib = _status_kib("VmRSS")
    reset = _high_water_reset()
    step()  # the first step allocates the engine's buffers: part of the peak
    seconds, cpu_seconds = timed_both(step, spec["steps"])
    peak_kib = _status_kib("VmHWM")
    return {"seconds": seconds, "cpu_seconds": cpu_seconds,
            "peak_mb": (peak_kib - base_kib) / 1024 if reset else None,
            "total_mb": peak_kib / 1024}  # fmt: skip


def measure(**spec) -> dict:
    out = subprocess.run(
        [sys.executable, __file__, "--measure-one", json.dumps(spec)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mb(value) -> str:
    return "n/a" if value is None else f"{value:.0f} MB"


def scaling(J: int, threads: int, models, batches) -> None:
    print(f"\nsimulator scaling (Dyn-D2P steps, one process each; load {os.getloadavg()[0]:.1f})")
    print("model   n    b  steps/s  ms/node-step (CPU ms/node-step)  peak extra memory (total RSS)")
    for model in models:
        for b in batches:
            for n in (20, 64, 256):
                steps = max(2, int(200 / (n * b)))
                r = measure(who="dpdl", model=model, n=n, b=b, J=J, steps=steps, threads=threads)
                print(f"{model:7s} {n:3d} {b:3d} {1 / r['seconds']:8.2f} "
                      f"{r['seconds'] / n * 1e3:12.2f} ({r['cpu_seconds'] / n * 1e3:6.2f})"
                      f"{'':18s}  {_mb(r['peak_mb'])} ({_mb(r['total_mb'])})",
                      flush=True)  # fmt: skip


def memory(J: int, threads: int) -> None:
    print(f"\npeak memory n=64 b=16, cnn (fresh process each; load {os.getloadavg()[0]:.1f})")
    for who in ("dpdl", "opacus"):
        r = measure(who=who, model="cnn", n=64, b=16, J=J, steps=1, threads=threads)
        print(f"{who:6s}: extra {_mb(r['peak_mb'])} over the set-up, total RSS "
              f"{_mb(r['total_mb'])}, {r['seconds'] * 1e3:.0f} ms/step", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[20, 64])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--records", type=int, default=300, help="records per node (J)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=0.5, help="per contender per round")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--scaling-models", nargs="+", default=["logreg", "cnn"])
    parser.add_argument("--scaling-batches", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--skip-compare", action="store_true")
    parser.add_argument("--measure-one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure_one:
        print(json.dumps(measure_one(json.loads(args.measure_one))))
        return
    torch.set_num_threads(args.threads)
    print(f"dpdl vs Opacus per-node loop: cnn, J={args.records}, C={CLIP}, z={SIGMA / CLIP}, "
          f"exp graph, threads={torch.get_num_threads()}, {os.cpu_count()} CPUs, "
          f"1-min load {os.getloadavg()[0]:.2f}; ratio = Opacus s/step / dpdl s/step, "
          "median [min..max] over rounds", flush=True)  # fmt: skip
    if not args.skip_compare:
        for n in args.nodes:
            for b in args.batches:
                compare(n, b, args.records, args.rounds, args.seconds)
    if args.memory:
        memory(args.records, args.threads)
    if args.scaling:
        scaling(args.records, args.threads, args.scaling_models, args.scaling_batches)


if __name__ == "__main__":
    main()
