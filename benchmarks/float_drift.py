"""Float drift of one seeded cell across CPU instruction sets (RESULTS.md, "Reproducibility").

A seeded run (``entropy = "seed"``) is bit-identical on the same machine; on another machine
torch may pick other CPU kernels, whose float rounding differs.  There is no second machine
here, but torch's kernels can be forced down to another instruction set on this one
(``ATEN_CPU_CAPABILITY``), and MKL's (the BLAS behind the matrix products) with
``MKL_ENABLE_INSTRUCTIONS``.  Each configuration runs ``dpdl run --preset PRESET --entropy
seed --threads 1`` in a fresh process (the variables are read when torch loads), recording:

* the capability torch reports and the one the run's provenance block recorded;
* the final metrics of every cell (results.json) and every parameter of the average and the
  node models (``models/*.pt``);
* the certified ε of every cell;
* a SHA-256 of every sampled batch (the (node, record) pairs of each step, in order).

Then each configuration is compared with the first (the native one): max |Δ| of the final
metrics and of the parameters, and whether ε and the sampled batches are identical.  One
Markdown table on stdout::

    .venv/bin/python benchmarks/float_drift.py [--preset default | --config F.toml]
        [--out runs/drift]

Runs one process at a time (~15 s each for the default preset on the reference machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

# name -> the environment it runs under (beside the inherited one); the first is the reference
CONFIGURATIONS: dict[str, dict[str, str]] = {
    "native": {},
    "native, again": {},
    "ATEN avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "ATEN default": {"ATEN_CPU_CAPABILITY": "default"},
    "ATEN default + MKL SSE4_2": {"ATEN_CPU_CAPABILITY": "default",
                                  "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},  # fmt: skip
}
_DRIFT_VARIABLES = ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")
METRICS = ("test_accuracy", "test_loss", "node_accuracy_mean", "node_accuracy_worst")


def _child(source: list[str], out: Path) -> None:
    """Run the cell in this process (the variables are already set) and write its record."""
    import torch

    from dpdl import cli
    from dpdl.algorithms import dyn_d2p

    steps: list[str] = []  # one digest per sampled step, in order (both algorithms)
    original = dyn_d2p.poisson_sample

    def recording_sample(*args, **kwargs):
        # which records a step drew: the node of each sampled record and its bytes
        batch = original(*args, **kwargs)
        digest = hashlib.sha256()
        for tensor in (batch.node, batch.targets, batch.inputs):
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        steps.append(digest.hexdigest())
        return batch

    dyn_d2p.poisson_sample = recording_sample  # instrumentation of this measurement only
    code = cli.main(["run", *source, "--entropy", "seed", "--threads", "1",
                     "--no-progress", "--output", str(out)])  # fmt: skip
    if code:
        raise SystemExit(code)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    results = json.loads((run_dir / "results.json").read_text())
    params = {}
    for model_file in sorted((run_dir / "models").glob("*.pt")):
        saved = torch.load(model_file, weights_only=False)
        for name, value in saved["average"].items():
            params[f"{model_file.stem}/average/{name}"] = value.double().flatten().tolist()
        for node, state in saved["nodes"].items():
            for name, value in state.items():
                params[f"{model_file.stem}/node{node}/{name}"] = (
                    value.double().flatten().tolist()
                )
    record = {
        "torch_capability": torch.backends.cpu.get_cpu_capability(),
        "provenance_capability": results["provenance"]["cpu_capability"],
        "provenance_kernel_env": results["provenance"]["kernel_env"],
        "metrics": {f"{c['algorithm']}/{m}": c["final"][m] for c in results["cells"]
                    for m in METRICS if m in c["final"]},  # fmt: skip
        "epsilon": {c["algorithm"]: [c["final"]["epsilon_certified"], c["ledger_epsilon_spent"]]
                    for c in results["cells"]},  # fmt: skip
        "batches": steps,
        "params": params,
    }
    (out / "record.json").write_text(json.dumps(record))


def _max_abs(a: dict[str, float | list[float]], b: dict[str, float | list[float]]) -> float:
    worst = 0.0
    for key, value in a.items():
        left = value if isinstance(value, list) else [value]
        right = b[key] if isinstance(b[key], list) else [b[key]]
        worst = max([worst, *(abs(x - y) for x, y in zip(left, right, strict=True))])
    return worst


def _batches(reference: list[str], record: list[str]) -> str:
    """"True" when every step drew the same records, else the first step that did not."""
    if reference == record:
        return "True"
    first = next((k for k, (a, b) in enumerate(zip(reference, record, strict=False)) if a != b),
                 min(len(reference), len(record)))  # fmt: skip
    return f"False (from sampled step {first} of {len(reference)})"


def _metrics(reference: dict, record: dict, kind: str) -> tuple[dict, dict]:
    """The final metrics of both whose name contains ``kind`` (accuracy or loss)."""
    names = [name for name in reference["metrics"] if kind in name]
    return ({n: reference["metrics"][n] for n in names},
            {n: record["metrics"][n] for n in names})  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="default")
    parser.add_argument("--config", type=Path, help="a TOML config instead of a preset")
    parser.add_argument("--out", type=Path, default=Path("runs/drift"))
    parser.add_argument("--only", nargs="+", choices=list(CONFIGURATIONS), metavar="NAME",
                        help="run only these configurations (the first named is the reference)")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    source = [str(args.config.resolve())] if args.config else ["--preset", args.preset]
    if args.child is not None:
        _child(source, args.child)
        return 0
    base_env = {k: v for k, v in os.environ.items() if k not in _DRIFT_VARIABLES}
    records = {}
    chosen_names = args.only or list(CONFIGURATIONS)
    for index, name in enumerate(chosen_names):
        env = CONFIGURATIONS[name]
        out = args.out / f"config{index}"
        out.mkdir(parents=True, exist_ok=False)
        chosen = (["--config", str(args.config.resolve())] if args.config
                  else ["--preset", args.preset])  # fmt: skip
        subprocess.run([sys.executable, __file__, *chosen, "--child", str(out)],
                       env={**base_env, **env}, check=True)  # fmt: skip
        records[name] = json.loads((out / "record.json").read_text())
    reference = records[chosen_names[0]]
    n_params = sum(len(v) for v in reference["params"].values())
    print(f"{' '.join(source)}: {len(reference['metrics'])} final metrics, {n_params} "
          f"parameters (average and node models), compared with the first row")  # fmt: skip
    print("| configuration | torch capability | provenance records | max abs Δ final accuracies "
          "| max abs Δ final test loss | max abs Δ parameters | certified ε identical "
          "| sampled batches identical |")
    print("|---|---|---|---|---|---|---|---|")
    for name, record in records.items():
        forced = " ".join(f"{k}={v}" for k, v in record["provenance_kernel_env"].items())
        print(f"| {name} | {record['torch_capability']} "
              f"| {record['provenance_capability']} {forced} "
              f"| {_max_abs(*_metrics(reference, record, 'accuracy')):.3g} "
              f"| {_max_abs(*_metrics(reference, record, 'loss')):.3g} "
              f"| {_max_abs(reference['params'], record['params']):.3g} "
              f"| {record['epsilon'] == reference['epsilon']} "
              f"| {_batches(reference['batches'], record['batches'])} |")
    largest = max(abs(x) for values in reference["params"].values() for x in values)
    print(f"largest |parameter| of the reference: {largest:.3g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
