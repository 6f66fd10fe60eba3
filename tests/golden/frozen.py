"""Run one frozen config through ``dpdl run`` and return its CSV outputs by file name."""

from __future__ import annotations

from pathlib import Path

import torch

from dpdl.cli import main

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
CONFIGS = ("decentralized", "conv", "linreg", "netdp", "fdp")


def run_config(name: str, out: Path) -> dict[str, Path]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # intra-op reductions in another order change the last bits
    try:
        code = main(["run", str(CONFIG_DIR / f"{name}.toml"), "--output", str(out),
                     "--no-progress"])
    finally:
        torch.set_num_threads(threads)
    assert code == 0, f"dpdl run {name}.toml exited with {code}"
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    # Only the CSVs are locked, never the JSON files: results.json holds the provenance block
    # (commit, versions, command line, CPU capability: the machine, not the computation) and
    # the wall-clock train_seconds, which differ on every run of the same code.
    return {p.name: p for p in sorted(run_dir.glob("*.csv"))}
