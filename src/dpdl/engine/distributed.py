"""The multi-process runtime on ``torch.distributed`` (gloo on CPU, nccl on GPU).

Each process (rank) hosts a contiguous block of nodes (R <= n; R = n is the paper's one
process per node). The local update is the simulator's own code
(:func:`dpdl.algorithms.dyn_d2p.local_update` on the rank's block, with the nodes' own
generators, so a node draws the same numbers wherever it lives); only mixing differs:
:class:`dpdl.engine.comm.PointToPointMixer` sends (P^k_ji x_i, P^k_ji w_i) to the ranks that
host out-neighbours. Evaluation gathers the blocks, so every rank computes the same metrics
and rank 0 writes them.

Start it with ``torchrun --nproc-per-node R -m dpdl run CONFIG --runtime distributed`` (any
torchrun rendezvous, several machines included), or ``dpdl run CONFIG --runtime distributed
--procs R``, which starts the R local processes itself (:func:`launch_local`). A process that
dies makes the others fail within the process-group timeout (``DPDL_DIST_TIMEOUT`` seconds,
default 60) with a clear error; the launcher then stops every process and says which rank
failed first.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from dpdl.algorithms.dyn_d2p import Params, local_update
from dpdl.engine.checkpoint import check_fingerprints as checkpoint_fingerprints
from dpdl.engine.comm import PointToPointMixer, block_bounds
from dpdl.engine.simulator import NodeData, Simulator
from dpdl.errors import DPDLError

DEFAULT_TIMEOUT_S = 60.0
_ENV_KEYS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def timeout_seconds() -> float:
    raw = os.environ.get("DPDL_DIST_TIMEOUT", str(DEFAULT_TIMEOUT_S))
    try:
        value = float(raw)
    except ValueError as err:
        raise DPDLError(f"DPDL_DIST_TIMEOUT must be a number of seconds, got {raw!r}") from err
    if value <= 0:
        raise DPDLError(f"DPDL_DIST_TIMEOUT must be positive, got {raw!r}")
    return value


def init_from_environment(device: torch.device) -> tuple[int, int]:
    """Join the process group that torchrun (or :func:`launch_local`) described in the env."""
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    missing = [k for k in _ENV_KEYS if k not in os.environ]
    if missing:
        raise DPDLError(
            "the distributed runtime needs to be started by torchrun or by "
            "`dpdl run CONFIG --runtime distributed --procs R` "
            f"(missing environment variables: {', '.join(missing)})"
        )
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_seconds()))
    return dist.get_rank(), dist.get_world_size()


def local_device(device: torch.device) -> torch.device:
    """On CUDA each local rank drives its own GPU."""
    if device.type == "cuda" and device.index is None:
        return torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        )
    return device


class DistributedSimulator(Simulator):
    """The simulator's interface for one rank's block of nodes.

    ``step`` updates only this rank's nodes and exchanges messages with the neighbouring
    ranks; ``params``/``weights`` of all n nodes are gathered on demand for evaluation
    (every rank gets them, so all ranks compute identical metrics).
    """

    def __init__(self, model, data: NodeData, topology, **kwargs):
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.lo, self.hi = block_bounds(data.n_nodes, self.world_size, self.rank)
        # The base class keys only this rank's nodes' streams (node_block): in the default
        # OS-entropy mode each rank draws its own keys locally, so no secret crosses the network.
        super().__init__(model, data, topology, **kwargs)
        m = self.hi - self.lo
        self.local_data = self.data.block(self.lo, m)
        self.local_params = {k: v[self.lo : self.hi].clone() for k, v in self.params.items()}
        self.local_weights = self.weights[self.lo : self.hi].clone()
        self.mixer = PointToPointMixer(topology, self.n, self.rank, self.world_size, self.device)
        self._gathered_at = self.iteration

    @property
    def node_block(self) -> tuple[int, int]:
        return self.lo, self.hi - self.lo

    # ------------------------------------------------------------------ stepping
    def step(
        self,
        *,
        private: bool,
        clip: float | None = None,
        sigma: float | None = None,
        unsafe_zero_noise: bool = False,
        lr: float | None = None,
    ):
        k = self.iteration
        _maybe_inject_fault(self.rank, k)
        data = self.local_data
        half = local_update(
            self.model, self.local_params, self.local_weights,
            data.inputs, data.targets, data.mask, self.generators,
            step=k, lr=self.lr if lr is None else lr, expected_batch_size=self.expected_batch_size,
            sample_rate=self.sample_rate, private=private, clip=clip, sigma=sigma,
            loss=self.loss, buffers=self.buffers, first_node=self.lo,
            unsafe_zero_noise=unsafe_zero_noise, clip_method=self.clip_method,
        )  # fmt: skip
        self.local_params, self.local_weights = self.mixer.mix(half.params, self.local_weights, k)
        self.iteration += 1
        return half.batch_sizes

    def mix_only(self) -> None:
        self.local_params, self.local_weights = self.mixer.mix(
            self.local_params, self.local_weights, self.iteration
        )
        self.iteration += 1

    # ------------------------------------------------------------------ gathering
    def _sync(self) -> None:
        if self._gathered_at == self.iteration:
            return
        self.params = {k: _all_gather_blocks(v, self.n) for k, v in self.local_params.items()}
        self.weights = _all_gather_blocks(self.local_weights, self.n)
        self._gathered_at = self.iteration

    def debiased_params(self) -> Params:
        self._sync()
        return super().debiased_params()

    def average_params(self) -> Params:
        self._sync()
        return super().average_params()

    def all_finite(self) -> bool:
        self._sync()
        return super().all_finite()

    # ------------------------------------------------------------------ checkpoints
    def gather_state(self) -> dict:
        """The models of all nodes on every rank (collective), and this rank's own generator
        states under ``rank_generators`` (never gathered: see :mod:`dpdl.engine.checkpoint`)."""
        self._sync()
        return {
            "iteration": self.iteration,
            "params": {k: v.detach().cpu() for k, v in self.params.items()},
            "weights": self.weights.detach().cpu(),
            "generators": None,
            "rank_generators": {
                "rank": self.rank,
                "first_node": self.lo,
                "iteration": self.iteration,
                "states": [g.get_state() for g in self.generators],
                "data_fingerprints": [f.hex() for f in self.data_fingerprints],
            },
        }

    def restore_state(self, state: dict) -> None:
        """Take this rank's block of the gathered models and its own secret shard."""
        shard = state.get("rank_generators")
        if shard is None or shard["first_node"] != self.lo:
            raise DPDLError(
                f"no secret shard for rank {self.rank} (nodes {self.lo}..{self.hi - 1}): "
                "resume with the same number of processes"
            )
        self.params = {k: v.to(self.device) for k, v in state["params"].items()}
        self.weights = state["weights"].to(self.device)
        self.local_params = {k: v[self.lo : self.hi].clone() for k, v in self.params.items()}
        self.local_weights = self.weights[self.lo : self.hi].clone()
        checkpoint_fingerprints(shard.get("data_fingerprints"), self.data_fingerprints, self.lo)
        for g, s in zip(self.generators, shard["states"], strict=True):
            g.set_state(s.clone())  # set_state needs a tensor that owns its storage
        self.iteration = int(state["iteration"])
        self._gathered_at = self.iteration


def _maybe_inject_fault(rank: int, step: int) -> None:
    """Fault injection for tests and drills: ``DPDL_FAULT_INJECT="RANK:STEP"`` makes that rank's
    process die abruptly (no clean-up, like a crashed machine) when it reaches that step."""
    spec = os.environ.get("DPDL_FAULT_INJECT")
    if not spec:
        return
    try:
        fault_rank, fault_step = (int(part) for part in spec.split(":"))
    except ValueError as err:
        raise DPDLError(f"DPDL_FAULT_INJECT must be RANK:STEP, got {spec!r}") from err
    if (rank, step) == (fault_rank, fault_step):
        os._exit(17)


def _all_gather_blocks(block: torch.Tensor, n: int) -> torch.Tensor:
    """Concatenate every rank's contiguous block (sizes may differ by one) on every rank."""
    world = dist.get_world_size()
    sizes = [hi - lo for lo, hi in (block_bounds(n, world, r) for r in range(world))]
    longest = max(sizes)
    padded = torch.zeros((longest, *block.shape[1:]), dtype=block.dtype, device=block.device)
    padded[: block.shape[0]] = block
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded)
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)])


def is_main_process() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


# ---------------------------------------------------------------------- local launcher
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_local(argv: list[str], procs: int, *, grace_s: float = 10.0) -> int:
    """Start ``procs`` processes of ``python -m dpdl <argv>`` on this machine, as torchrun would.

    Watches them: when one exits with an error, the others get ``grace_s`` seconds to notice
    (they fail on their next message to the dead peer) and are then terminated, so nothing
    hangs. Returns the first non-zero exit status (0 when all succeeded).
    """
    if procs < 1:
        raise DPDLError(f"--procs must be >= 1, got {procs}")
    port = _free_port()
    children = []
    for rank in range(procs):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(procs),
            LOCAL_WORLD_SIZE=str(procs),
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
        )
        children.append(subprocess.Popen([sys.executable, "-m", "dpdl", *argv], env=env))
    first_failure: tuple[int, int] | None = None
    deadline = None
    try:
        while True:
            codes = [c.poll() for c in children]
            if first_failure is None:
                for rank, code in enumerate(codes):
                    if code not in (None, 0):
                        first_failure = (rank, code)
                        deadline = time.monotonic() + grace_s
                        break
            if all(code is not None for code in codes):
                break
            if deadline is not None and time.monotonic() > deadline:
                for c in children:
                    if c.poll() is None:
                        c.send_signal(signal.SIGTERM)
                time.sleep(1.0)
                for c in children:
                    if c.poll() is None:
                        c.kill()
                break
            time.sleep(0.1)
    except KeyboardInterrupt:
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        raise
    finally:
        for c in children:
            c.wait()
    if first_failure is not None:
        rank, code = first_failure
        print(
            f"dpdl run: error: process {rank} of {procs} exited with status {code}; "
            "the other processes were stopped",
            file=sys.stderr,
        )
        return code if code > 0 else 1
    return 0


def from_main_process(value):
    """Rank 0's JSON-able ``value`` on every rank (a collective: every rank calls it once).

    Sent as UTF-8 JSON in a byte tensor (length first): no rank unpickles what another sent.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if (
        dist.get_backend() == "nccl") else torch.device("cpu")  # fmt: skip
    payload = json.dumps(value).encode() if dist.get_rank() == 0 else b""
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    data = torch.zeros(int(length.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == 0:
        data.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    dist.broadcast(data, src=0)
    return json.loads(bytes(data.cpu().tolist()).decode())


def worker_output_dir(output_dir: Path) -> Path:
    """Rank 0 writes the run folder; the others write into a scratch folder beside it."""
    if is_main_process():
        return Path(output_dir)
    return Path(output_dir) / ".ranks" / f"rank{dist.get_rank()}"
