"""Checkpoints of a training run: everything needed to continue exactly where it stopped.

A checkpoint holds every node's model x_i and push-sum weight w_i, every node's secret stream
state (so the resumed run draws the very numbers it would have drawn), a SHA-256 fingerprint
of every node's data (a resume on changed data is refused: it would re-send the same noise on
other records), the iteration, the privacy ledger (steps spent are never forgotten), and the
metrics rows written so far.
Files are written atomically (a temporary file, then ``os.replace``): a crash while saving
leaves the previous checkpoint intact.

Works for the simulator and for the distributed runtime (whose ranks gather their models;
the main process writes them).  Stream states are the secret that protects the data (they
replay every node's batches and noise): the simulator's checkpoint holds them, and in the
distributed runtime every rank keeps its own nodes' states and data fingerprints in a shard
of its own (:func:`shard_path`), so no rank ever receives another rank's secrets.  Checkpoint
files are created owner-only (0600): treat them like the model and the data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dpdl.errors import DPDLError
from dpdl.files import write_atomic

CHECKPOINT_VERSION = 2  # 2: ChaCha20 stream states and the nodes' data fingerprints


def capture(sim) -> dict[str, Any]:
    """The engine's state (a collective call in the distributed runtime: every rank calls it)."""
    if hasattr(sim, "gather_state"):
        return sim.gather_state()
    return {
        "iteration": sim.iteration,
        "params": {k: v.detach().cpu() for k, v in sim.params.items()},
        "weights": sim.weights.detach().cpu(),
        "generators": [g.get_state() for g in sim.generators],
        "data_fingerprints": [f.hex() for f in sim.data_fingerprints],
    }


def check_fingerprints(saved: list[str] | None, current: list[bytes], first_node: int) -> None:
    """Refuse to resume on data other than the checkpoint's: the resumed steps would re-send
    the noise already sent, on other records, and release the difference without noise."""
    if saved is None or len(saved) != len(current):
        raise DPDLError("checkpoint holds no fingerprint of this process's nodes' data: "
                        "refusing to resume")  # fmt: skip
    for offset, (was, now) in enumerate(zip(saved, current, strict=True)):
        if was != now.hex():
            raise DPDLError(
                f"node {first_node + offset}'s data differ from the checkpoint's (SHA-256): "
                "refusing to resume, which would re-send its noise on other data"
            )


def shard_path(path: Path, rank: int) -> Path:
    """Rank ``rank``'s shard of secret generator states beside the checkpoint ``path``."""
    path = Path(path)
    return path.with_name(f"{path.stem}.rank{rank}.secret{path.suffix}")


def _rank() -> int | None:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else None


def load_for_resume(path: Path, factory=None) -> dict[str, Any]:
    """The checkpoint at ``path`` and, in the distributed runtime, this rank's secret shard."""
    payload = load(path)
    rank = _rank()
    if rank is not None and hasattr(factory, "gather_state"):
        shard = load(shard_path(path, rank))
        if int(shard["iteration"]) != int(payload["engine"]["iteration"]):
            raise DPDLError(
                f"secret shard of rank {rank} is at step {shard['iteration']}, the checkpoint "
                f"{str(path)!r} at step {payload['engine']['iteration']}: refusing to resume"
            )
        payload["engine"]["rank_generators"] = shard
    return payload


def remove(path: Path) -> None:
    """Delete a finished cell's checkpoint (main process) and this rank's secret shard."""
    rank = _rank()
    if rank in (None, 0):
        Path(path).unlink(missing_ok=True)
    if rank is not None:
        shard_path(path, rank).unlink(missing_ok=True)


def restore(sim, state: dict[str, Any]) -> None:
    """Put ``state`` (from :func:`capture`) back into a freshly built engine."""
    if set(state["params"]) != set(sim.params) or any(
        state["params"][k].shape != sim.params[k].shape for k in sim.params
    ):
        raise DPDLError("checkpoint does not match the model: parameter names or shapes differ")
    if state["weights"].shape != sim.weights.shape:
        raise DPDLError(
            f"checkpoint has {state['weights'].shape[0]} nodes, the run has {sim.weights.shape[0]}"
        )
    if hasattr(sim, "restore_state"):
        sim.restore_state(state)
        return
    check_fingerprints(state.get("data_fingerprints"), sim.data_fingerprints, 0)
    sim.params = {k: v.to(sim.device) for k, v in state["params"].items()}
    sim.weights = state["weights"].to(sim.device)
    for g, s in zip(sim.generators, state["generators"], strict=True):
        g.set_state(s.clone())  # set_state needs a tensor that owns its storage
    sim.iteration = int(state["iteration"])


def save_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Write ``payload`` to ``path`` atomically, readable and writable by its owner only."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_atomic(path, lambda fh: torch.save({"version": CHECKPOINT_VERSION, **payload}, fh))


def load(path: Path) -> dict[str, Any]:
    try:
        payload = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError as err:
        raise DPDLError(f"checkpoint {str(path)!r} does not exist") from err
    except Exception as err:  # a truncated or foreign file: refuse it, never guess
        raise DPDLError(f"checkpoint {str(path)!r} cannot be read: {err}") from err
    if not isinstance(payload, dict) or payload.get("version") != CHECKPOINT_VERSION:
        raise DPDLError(f"checkpoint {str(path)!r} has an unsupported format")
    return payload
