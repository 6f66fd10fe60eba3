"""Benchmark: the sweep executors side by side, the local process pool vs Ray tasks.

Both run with 2 workers on this machine (the pool: 2 processes; Ray: a fresh local instance
with 2 CPUs, as ``dpdl sweep --executor ray`` without ``--ray-address`` starts it).

* Cold: what one ``dpdl sweep`` call costs: 1 no-op cell (an experiment that writes one small
  file), i.e. the executor's start-up, and one small real grid: the decentralized kind,
  digits, 4 nodes, Const-D2P, 2 seeds x 2 epsilons of 10 steps (each cell imports torch and
  calibrates its schedule). Ray starts and stops its local instance in every call.
* Warm: the marginal cost per cell, (T(N+1 cells) - T(1 cell)) / N on no-op cells, with the
  Ray instance already running (a cluster that outlives the sweep) -- the per-cell overhead.

Executors alternate within each round (the machine is shared); medians over the rounds.

    .venv/bin/python benchmarks/bench_sweep.py [--rounds 3] [--cells 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

NOOP = """
def run_experiment(config, output_dir, progress=True):
    (output_dir / "out.txt").write_text(str(config["experiment"]["seed"]))
    return {"seed": config["experiment"]["seed"]}
"""

GRID = {
    "kind": "decentralized",
    "experiment": {"algorithms": ["const-d2p"], "seed": 0, "entropy": "seed"},
    "topology": {"nodes": 4},
    "training": {
        "steps": 10,
        "batch_size": 8,
        "lr": 0.5,
        "eval_every": 5,
        "eval_train_samples": 100,
        "eval_node_samples": 100,
    },
    "privacy": {"epsilon": 1.0, "calibrate": "clt"},
    "sweep": {"workers": 2, "grid": {"experiment.seed": [0, 1], "privacy.epsilon": [0.5, 1.0]}},
}


def noop_grid(cells: int) -> dict:
    return {
        "kind": "bench_sweep_plugins.noop",
        "experiment": {"seed": 0},
        "sweep": {"workers": 2, "grid": {"experiment.seed": list(range(cells))}},
    }


def timed(config: dict, out: Path, executor: str) -> float:
    from dpdl.experiments.sweep import run_sweep

    start = time.perf_counter()
    summary = run_sweep(config, out, progress=False, executor=executor)
    wall = time.perf_counter() - start
    assert summary["done"] == summary["cells"] and not summary["failed"], summary
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cells", type=int, default=40, help="N, the extra no-op cells")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "bench_sweep_plugins").mkdir()
        (tmp / "bench_sweep_plugins" / "__init__.py").write_text("")
        (tmp / "bench_sweep_plugins" / "noop.py").write_text(NOOP)
        sys.path.insert(0, str(tmp))  # this process and its spawned pool workers
        path = [str(tmp), os.environ.get("PYTHONPATH", "")]
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in path if p)  # Ray's workers
        times: dict[tuple[str, str], list[float]] = {}

        def measure(phase: str, cases: list[tuple[str, dict]]) -> None:
            for r in range(args.rounds):
                for executor in ("local", "ray"):
                    for i, (name, config) in enumerate(cases):
                        out = tmp / f"{phase}-{executor}-{i}-{r}"  # a fresh sweep every time
                        wall = timed(config, out, executor)
                        times.setdefault((f"{phase}: {name}", executor), []).append(wall)

        measure("cold", [("1 no-op cell", noop_grid(1)), ("grid 2x2 (10 steps)", GRID)])
        import ray

        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="warning")
        n = args.cells
        warm = [("1 no-op cell", noop_grid(1)), (f"{n + 1} no-op cells", noop_grid(n + 1))]
        measure("warm", warm)
        ray.shutdown()
        med = {key: statistics.median(v) for key, v in times.items()}
        print(f"median of {args.rounds} rounds, 2 workers, wall seconds")
        print(f"{'':32s} {'local pool':>11s} {'ray':>8s} {'ray/local':>10s}")
        for name in dict.fromkeys(name for name, _ in times):
            local, remote = med[name, "local"], med[name, "ray"]
            print(f"{name:32s} {local:11.3f} {remote:8.3f} {remote / local:10.2f}")
        per_cell = {
            ex: (med[f"warm: {n + 1} no-op cells", ex] - med["warm: 1 no-op cell", ex]) / n
            for ex in ("local", "ray")
        }
        print(
            f"{'warm: marginal s per cell':32s} {per_cell['local']:11.4f} {per_cell['ray']:8.4f} "
            f"{per_cell['ray'] / per_cell['local']:10.2f}"
        )


if __name__ == "__main__":
    main()
