"""Simulator against the torch.distributed runtime, side by side in one command.

n = 20 nodes, time-varying directed exponential graph, the shallow CNN on scikit-learn's digits
(8x8), b = 1, the Dyn-D2P step (clip + noise). For R = 1 (the simulator, in this process) and
R = 2, 4 processes (gloo on loopback): steps/s and the bytes each step sends between processes;
then the bytes one evaluation moves through collectives per rank: today's (a sum of the
models for the network average, every node's score) against gathering every node's model,
what evaluation did before each party kept its own data (issue 22).

    python benchmarks/bench_distributed.py [--steps 60] [--procs 2 4]
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CONFIG = {
    "experiment": {"name": "bench", "algorithms": ["dyn-d2p"], "seed": 0},
    "data": {"dataset": "digits"},
    "model": {"name": "cnn"},
    "topology": {"name": "exp", "nodes": 20},
    "training": {"steps": 100, "batch_size": 1, "lr": 0.05},
    "privacy": {"epsilon": 1.0, "calibrate": "clt"},
}


def _engine(factory, threads: int, block=None):
    from dpdl.experiments.config import parse_config
    from dpdl.experiments.runner import prepare_workload
    from dpdl.models import make_model

    torch.set_num_threads(threads)
    work = prepare_workload(parse_config(CONFIG), seed=0, block=block)
    model = make_model("cnn", work.input_shape, work.num_classes, seed=0)
    return factory(model, work.node_data, work.topology, lr=0.05, expected_batch_size=1, seed=0)


def _time_steps(sim, steps: int, sync=lambda: None) -> float:
    for _ in range(5):  # warm-up: first calls build the vmapped graphs
        sim.step(private=True, clip=1.0, sigma=1.0)
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        sim.step(private=True, clip=1.0, sigma=1.0)
    sync()
    return time.perf_counter() - start


def _worker(rank: int, world: int, port: int, steps: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from dpdl.engine.comm import block_bounds
    from dpdl.engine.distributed import DistributedSimulator

    lo, hi = block_bounds(CONFIG["topology"]["nodes"], world, rank)
    sim = _engine(DistributedSimulator, threads=1, block=(lo, hi - lo))
    sim.mixer.bytes_sent = 0
    seconds = _time_steps(sim, steps, sync=dist.barrier)
    sent = torch.tensor([sim.mixer.bytes_sent, sim.mixer.messages_sent], dtype=torch.float64)
    dist.all_reduce(sent)
    x = torch.zeros((500, 1, 8, 8))
    y = torch.zeros(500, dtype=torch.int64)
    now = _collective_bytes(lambda: (sim.average_params(), sim.node_accuracies(x, y)))
    gathered = _collective_bytes(sim.gather_debiased_params)
    if rank == 0:
        warm = 5
        queue.put((seconds, float(sent[0]) / (steps + warm), float(sent[1]) / (steps + warm),
                   now, gathered))  # fmt: skip
    dist.destroy_process_group()


def _collective_bytes(fn) -> int:
    """Bytes this rank puts into all_reduce / all_gather while ``fn`` runs."""
    counted, real_reduce, real_gather = [0], dist.all_reduce, dist.all_gather

    def reduce(tensor, *args, **kwargs):
        counted[0] += tensor.numel() * tensor.element_size()
        return real_reduce(tensor, *args, **kwargs)

    def gather(parts, tensor, *args, **kwargs):
        counted[0] += tensor.numel() * tensor.element_size() * (len(parts) - 1)
        return real_gather(parts, tensor, *args, **kwargs)

    dist.all_reduce, dist.all_gather = reduce, gather
    try:
        fn()
    finally:
        dist.all_reduce, dist.all_gather = real_reduce, real_gather
    return counted[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    args = parser.parse_args()
    from dpdl.engine.simulator import Simulator

    rows = []
    for threads in (1, 2):
        sim = _engine(Simulator, threads)
        seconds = _time_steps(sim, args.steps)
        rows.append((f"simulator, 1 process, {threads} thread(s)", args.steps / seconds, 0.0, 0.0))
    ctx = mp.get_context("spawn")
    evaluations = []
    for procs in args.procs:
        queue = ctx.Queue()
        mp.start_processes(
            _worker, args=(procs, _free_port(), args.steps, queue), nprocs=procs,
            start_method="spawn",
        )  # fmt: skip
        seconds, bytes_per_step, messages_per_step, now, gathered = queue.get()
        rows.append(
            (f"distributed, {procs} processes (1 thread each)", args.steps / seconds,
             bytes_per_step, messages_per_step)
        )  # fmt: skip
        evaluations.append((procs, now, gathered))
    base = rows[0][1]
    print(f"n = 20, exponential graph, shallow CNN on digits, b = 1, Dyn-D2P, {args.steps} steps")
    print(
        f"{'runtime':45s} {'steps/s':>9s} {'vs sim(1t)':>10s} {'bytes/step':>11s} {'msgs/step':>9s}"
    )
    for name, rate, sent, msgs in rows:
        print(f"{name:45s} {rate:9.2f} {rate / base:9.2f}x {sent:11.0f} {msgs:9.1f}")
    print("one evaluation, bytes rank 0 puts into collectives:")
    for procs, now, gathered in evaluations:
        print(f"  {procs} processes: {now:,} (sum of the models + node scores) against "
              f"{gathered:,} gathering every node's model ({gathered / max(now, 1):.0f}x)")
    print(f"cores on this machine: {os.cpu_count()}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
