"""The multi-process runtime on ``torch.distributed`` (gloo on CPU, nccl on GPU).

Each process (rank) hosts a contiguous block of nodes (R <= n; R = n is the paper's one
process per node). The engine is the simulator itself (one ``Simulator.step``: the local
update on the rank's block, with the nodes' own generators, so a node draws the same numbers
wherever it lives); :class:`TorchDistributedRuntime` (a :class:`dpdl.engine.runtime.Runtime`)
gives it what differs: the block, the collectives, and the mixer,
:class:`dpdl.engine.comm.PointToPointMixer`, which sends (P^k_ji x_i, P^k_ji w_i) to the ranks
that host out-neighbours. Evaluation gathers per-node scores, so every rank computes the same
metrics and rank 0 writes them.

Start it with ``torchrun --nproc-per-node R -m dpdl run CONFIG --runtime distributed`` (any
torchrun rendezvous, several machines included), or ``dpdl run CONFIG --runtime distributed
--procs R``, which starts the R local processes itself (:func:`launch_local`). A process that
dies makes the others fail within the process-group timeout (``DPDL_DIST_TIMEOUT`` seconds,
default 60) with a clear error; the launcher then stops every process and says which rank
failed first.
"""

from __future__ import annotations

import atexit
import datetime
import json
import os
import signal
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist

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
    timeout = datetime.timedelta(seconds=timeout_seconds())
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt != "0" and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # A job torchrun restarted: its agent's store still holds the failed attempt's
        # addresses; a prefix of this attempt's own keeps the processes from reading them.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              int(os.environ["WORLD_SIZE"]), False, timeout)  # fmt: skip
        dist.init_process_group(
            backend, store=dist.PrefixStore(f"dpdl/attempt{attempt}", store),
            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
            timeout=timeout,
        )  # fmt: skip
    else:
        dist.init_process_group(backend, timeout=timeout)
    atexit.register(_leave_group)
    return dist.get_rank(), dist.get_world_size()


def _leave_group() -> None:
    """At exit: wait (briefly) for the other ranks, then destroy the process group, so that no
    rank tears its connections down while a peer still uses them (an abort at exit, with a C++
    stack trace, otherwise); a peer that is gone costs at most the short wait."""
    if not dist.is_initialized():
        return
    try:
        if dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=datetime.timedelta(seconds=_EXIT_WAIT_S))
        dist.destroy_process_group()
    except Exception:  # noqa: BLE001 -- exiting anyway: nothing left to protect
        pass


_EXIT_WAIT_S = 30


def local_device(device: torch.device) -> torch.device:
    """On CUDA each local rank drives its own GPU."""
    if device.type == "cuda" and device.index is None:
        return torch.device(
            "cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count()
        )
    return device


class TorchDistributedRuntime:
    """One contiguous block of nodes per ``torch.distributed`` rank (see the module doc): the
    :class:`dpdl.engine.runtime.Runtime` of ``runtime = "distributed"``.

    What ranks exchange: every node's size (public, for the sampling rate), the push-sum
    messages of the graph's edges (:class:`~dpdl.engine.comm.PointToPointMixer`), sums of the
    models for the network average, per-node scores on public evaluation data, whether every
    rank's checks passed, and every node's model only when asked (``gather_node_models``).
    The process group is joined the first time the hosted block is asked for (or found
    joined: a caller may have initialised it)."""

    name = "distributed"
    holds_every_record = False
    carries_private_shares = True  # PointToPointMixer.exchange

    @property
    def rank(self) -> int:
        """This process's rank (0 before it joined the group, as :func:`is_main_process`)."""
        return dist.get_rank() if dist.is_initialized() else 0

    def local_device(self, device: torch.device) -> torch.device:
        return local_device(device)

    def hosted_block(self, n_nodes: int, device: torch.device) -> tuple[int, int]:
        rank, world = init_from_environment(device)
        lo, hi = block_bounds(int(n_nodes), world, rank)
        return lo, hi - lo

    def is_main_process(self) -> bool:
        return is_main_process()

    def agree(self, check) -> None:
        """Run ``check``; every rank learns whether every rank passed: a refusal stops all of
        them, each rank's own message staying on its rank (it may name its data)."""
        error = None
        try:
            check()
        except DPDLError as err:
            error = err
        failed = ranks_that_failed(error is not None)
        if error is not None:
            raise error
        if failed:
            raise DPDLError(f"rank {failed[0]} refused its nodes' data or the model (its own "
                            "message is on its output)")  # fmt: skip

    def all_true(self, flag: bool) -> bool:
        return not ranks_that_failed(not flag)

    def same_on_every_rank(self, value: int) -> bool:
        return same_on_every_rank(value)

    def all_node_counts(self, local: list[int], n_nodes: int) -> list[int]:
        return all_node_counts(local, n_nodes)

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        total = tensor.clone()
        _collective(dist.all_reduce, total, what="a sum of the models")
        return total

    def gather_nodes(self, tensor: torch.Tensor, n_nodes: int) -> torch.Tensor:
        return _all_gather_blocks(tensor, n_nodes)

    def from_main_process(self, value):
        return from_main_process(value)

    def job_run_name(self, name: str) -> str | None:
        return job_run_name(name)

    def restarted(self) -> bool:
        return restarted()

    def mixer(self, topology, block: tuple[int, int], device: torch.device) -> PointToPointMixer:
        return PointToPointMixer(topology, int(topology.n), dist.get_rank(),
                                 dist.get_world_size(), device)  # fmt: skip

    def before_step(self, step: int) -> None:
        _maybe_inject_fault(dist.get_rank(), step)


class DistributedSimulator(Simulator):
    """The simulator on :class:`TorchDistributedRuntime`: this rank's block of nodes, mixed by
    point-to-point messages (``Simulator(..., runtime=TorchDistributedRuntime())``; the
    process group must be joined or described in the environment).  ``data`` holds only this
    rank's nodes (:func:`dpdl.engine.comm.block_bounds` of the topology's n); no record
    crosses a rank boundary, and the engine keys only the block's streams: in the default
    OS-entropy mode each rank draws its own keys locally, so no secret crosses the network."""

    def __init__(self, model, data: NodeData, topology, **kwargs):
        kwargs.setdefault("runtime", TorchDistributedRuntime())
        super().__init__(model, data, topology, **kwargs)


def _collective(op, *args, what: str) -> None:
    """A collective that fails with one line naming what was being exchanged."""
    try:
        op(*args)
    except RuntimeError as err:  # a peer died or timed out
        raise DPDLError(
            f"rank {dist.get_rank()}: exchanging {what} failed (a peer process stopped or "
            f"timed out): {str(err).splitlines()[0]}"
        ) from None


def _maybe_inject_fault(rank: int, step: int) -> None:
    """Fault injection for tests and drills: ``DPDL_FAULT_INJECT="RANK:STEP"`` makes that rank's
    process die abruptly (no clean-up, like a crashed machine) when it reaches that step; not
    in a job that torchrun restarted."""
    spec = os.environ.get("DPDL_FAULT_INJECT")
    if not spec or restarted():  # a crash drill: the job torchrun restarts runs through
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
    _collective(dist.all_gather, parts, padded, what="per-node values")
    return torch.cat([p[:s] for p, s in zip(parts, sizes, strict=True)])


def same_on_every_rank(value: int) -> bool:
    """Whether every rank holds the same integer ``value`` (a collective)."""
    both = torch.tensor([value, -value], dtype=torch.int64, device=_comm_device())
    _collective(dist.all_reduce, both, dist.ReduceOp.MAX, what="a value every rank must share")
    return int(both[0]) == -int(both[1])


def ranks_that_failed(failed: bool) -> list[int]:
    """The ranks whose ``failed`` is true, on every rank (a collective)."""
    flags = torch.zeros(dist.get_world_size(), dtype=torch.int64, device=_comm_device())
    flags[dist.get_rank()] = int(failed)
    _collective(dist.all_reduce, flags, what="whether every rank accepted its data")
    return [int(r) for r in flags.nonzero().flatten()]


def all_node_counts(local: list[int], n_nodes: int) -> list[int]:
    """Every node's record count (public, for the sampling rate), from each rank's block."""
    counts = torch.tensor(local, dtype=torch.int64, device=_comm_device())
    return [int(c) for c in _all_gather_blocks(counts, n_nodes)]


def _comm_device() -> torch.device:
    return (torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl"
            else torch.device("cpu"))  # fmt: skip


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
            # c10d's C++ warnings would bury the one-line error of a failed peer
            TORCH_CPP_LOG_LEVEL=os.environ.get("TORCH_CPP_LOG_LEVEL", "ERROR"),
        )
        children.append(subprocess.Popen([sys.executable, "-m", "dpdl", *argv], env=env))
    failures: list[tuple[int, int]] = []  # (rank, status) in the order they were seen
    deadline = None
    try:
        while True:
            codes = [c.poll() for c in children]
            for rank, code in enumerate(codes):
                if code not in (None, 0) and rank not in [r for r, _ in failures]:
                    failures.append((rank, code))
                    deadline = deadline or time.monotonic() + grace_s
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
    if failures:
        # The process that failed by itself, not one that stopped because a peer had gone:
        # those end with a DPDLError (status 2) after naming the peer.
        rank, code = next((f for f in failures if f[1] != 2), failures[0])
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
    device = _comm_device()
    payload = json.dumps(value).encode() if dist.get_rank() == 0 else b""
    length = torch.tensor([len(payload)], dtype=torch.int64, device=device)
    dist.broadcast(length, src=0)
    data = torch.zeros(int(length.item()), dtype=torch.uint8, device=device)
    if dist.get_rank() == 0:
        data.copy_(torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    dist.broadcast(data, src=0)
    return json.loads(bytes(data.cpu().tolist()).decode())


def job_run_name(name: str) -> str | None:
    """A run folder name that a torchrun job keeps across its restarts (``--max-restarts``):
    ``<name>-<TORCHELASTIC_RUN_ID>``; None outside torchrun (the main process then picks)."""
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    if not job or job == "none":
        return None
    return f"{name}-" + "".join(c if c.isalnum() or c in "-_" else "-" for c in job)[:40]


def restarted() -> bool:
    """Whether torchrun restarted this job after a failure (``TORCHELASTIC_RESTART_COUNT``)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    except ValueError:
        return False
