"""Push-sum mixing across processes with point-to-point messages (torch.distributed).

Each rank hosts a contiguous block of nodes. At step k node i sends (P^k_ji x_i, P^k_ji w_i)
to each out-neighbour j; contributions to nodes on the same rank are summed in memory, and
those to nodes on another rank travel in one message per (sender rank, receiver rank) pair
that the step's graph connects. A rank never sends to a rank that hosts none of its nodes'
out-neighbours, and a message carries rows only for the receiving nodes that are
out-neighbours: the message pattern follows the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

from dpdl.engine.mixing import Traffic, message_bytes, out_degrees
from dpdl.errors import DPDLError, require

Params = dict[str, torch.Tensor]


def block_bounds(n_nodes: int, world_size: int, rank: int) -> tuple[int, int]:
    """Nodes [lo, hi) of ``rank``: contiguous blocks whose sizes differ by at most one."""
    require(world_size >= 1, f"world size must be >= 1, got {world_size}")
    require(
        world_size <= n_nodes,
        f"{world_size} processes for {n_nodes} nodes: every process needs at least one node",
    )
    require(0 <= rank < world_size, f"rank {rank} outside [0, {world_size})")
    base, extra = divmod(n_nodes, world_size)
    lo = rank * base + min(rank, extra)
    return lo, lo + base + (1 if rank < extra else 0)


@dataclass(frozen=True)
class _Plan:
    """What one rank does at one step: local block of P, and its sends and receives."""

    local: torch.Tensor  # P[lo:hi, lo:hi]
    sends: tuple[tuple[int, np.ndarray, torch.Tensor], ...]  # (rank, global rows, P[rows, lo:hi])
    recvs: tuple[tuple[int, np.ndarray], ...]  # (rank, local row indices receiving)
    degrees: np.ndarray  # every local node's out-neighbours but itself (Traffic's messages)


class PointToPointMixer:
    """Push-sum mixing of one rank's block of nodes by point-to-point messages."""

    def __init__(self, topology, n_nodes: int, rank: int, world_size: int, device: torch.device):
        self.topology = topology
        self.n = n_nodes
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.bounds = [block_bounds(n_nodes, world_size, r) for r in range(world_size)]
        self.lo, self.hi = self.bounds[rank]
        self._plans: dict[int, _Plan] = {}
        # what crossed between processes (one message per peer rank, rows of every receiving
        # node summed in); ``traffic``: what each node sends, as the in-memory mixer counts it
        self.bytes_sent = 0
        self.messages_sent = 0
        self.traffic = Traffic(self.hi - self.lo)

    def _plan(self, k: int) -> _Plan:
        period = getattr(self.topology, "period", None)
        key = k % period if isinstance(period, int) and period > 0 else k
        if key in self._plans:
            return self._plans[key]
        P = np.asarray(self.topology.mixing_matrix(k), dtype=np.float64)
        require(P.shape == (self.n, self.n), f"mixing matrix of step {k} has shape {P.shape}")
        lo, hi = self.lo, self.hi
        sends, recvs = [], []
        for r, (rlo, rhi) in enumerate(self.bounds):
            if r == self.rank:
                continue
            out_rows = rlo + np.flatnonzero((P[rlo:rhi, lo:hi] != 0).any(axis=1))
            if out_rows.size:
                weights = torch.as_tensor(
                    P[np.ix_(out_rows, np.arange(lo, hi))], device=self.device
                )
                sends.append((r, out_rows, weights))
            in_rows = np.flatnonzero((P[lo:hi, rlo:rhi] != 0).any(axis=1))
            if in_rows.size:
                recvs.append((r, in_rows))
        plan = _Plan(
            torch.as_tensor(P[lo:hi, lo:hi], device=self.device), tuple(sends), tuple(recvs),
            out_degrees(P, lo, hi),
        )
        if isinstance(period, int) and period > 0:
            self._plans[key] = plan
        return plan

    def mix(self, params: Params, weights: torch.Tensor, k: int, *, step: int | None = None,
            out: Params | None = None) -> tuple[Params, torch.Tensor]:  # fmt: skip
        """x^{k+1}_i = sum_j P^k_ij x_j^{k+1/2}, w likewise, for the nodes of this rank (the
        :class:`dpdl.engine.mixing.Mixer` of the distributed runtime).

        ``k`` picks the graph P^k (the gossip round); ``step``, the iteration that an error
        names (default ``k``; they differ with local steps between rounds).  ``out`` is not
        written: the result is assembled from the messages in new tensors."""
        plan = self._plan(k)
        step = k if step is None else step
        self.traffic.record(plan.degrees, message_bytes(params, weights))
        flat = flatten_rows(params)
        # Parameters travel in their own dtype, push-sum weights in float64 (as the simulator).
        mixed = plan.local.to(flat.dtype) @ flat
        mixed_w = plan.local @ weights
        requests, inbox = [], []  # requests: (peer rank, request)
        try:
            for r, rows in plan.recvs:
                buf = torch.empty(len(rows), flat.shape[1], dtype=flat.dtype, device=flat.device)
                wbuf = torch.empty(len(rows), dtype=weights.dtype, device=weights.device)
                requests += [(r, dist.irecv(buf, src=r)), (r, dist.irecv(wbuf, src=r))]
                inbox.append((rows, buf, wbuf))
            for r, _rows, coeff in plan.sends:
                out = (coeff.to(flat.dtype) @ flat).contiguous()
                out_w = (coeff @ weights).contiguous()
                requests += [(r, dist.isend(out, dst=r)), (r, dist.isend(out_w, dst=r))]
                self.bytes_sent += (
                    out.numel() * out.element_size() + out_w.numel() * out_w.element_size()
                )
                self.messages_sent += 1
        except RuntimeError as err:  # a peer is gone before anything was posted
            raise _peer_failed(self.rank, None, step, err) from None
        for peer, request in requests:
            try:
                request.wait()
            except RuntimeError as err:  # a peer died or timed out: one line naming it
                raise _peer_failed(self.rank, peer, step, err) from None
        for rows, buf, wbuf in inbox:
            index = torch.as_tensor(rows, device=flat.device)
            mixed.index_add_(0, index, buf)
            mixed_w.index_add_(0, index, wbuf)
        return unflatten_rows(mixed, params), mixed_w


    def rank_of(self, node: int) -> int:
        """The rank hosting ``node``."""
        for r, (lo, hi) in enumerate(self.bounds):
            if lo <= node < hi:
                return r
        raise DPDLError(f"node {node} is hosted by no rank (nodes 0..{self.n - 1})")

    def exchange(self, outgoing: dict[tuple[int, int], torch.Tensor],
                 expected: list[tuple[int, int]], step: int) -> dict[tuple[int, int], torch.Tensor]:
        """Per-edge private tensors (:class:`dpdl.algorithms.correlated.ShareChannel`): each
        {(sender, receiver): (d,) tensor} goes only to the rank hosting its receiver, one
        message per rank pair, rows in (sender, receiver) order on both sides; returns the
        tensors of ``expected`` (receivers hosted here, senders elsewhere)."""
        sends: dict[int, list[tuple[int, int]]] = {}
        for pair in sorted(outgoing):
            sends.setdefault(self.rank_of(pair[1]), []).append(pair)
        recvs: dict[int, list[tuple[int, int]]] = {}
        for pair in sorted(expected):
            recvs.setdefault(self.rank_of(pair[0]), []).append(pair)
        like = next(iter(outgoing.values()), None)  # the received rows' width, dtype, device
        require(like is not None or not recvs, f"rank {self.rank}: shares expected at step "
                f"{step}, but none of this rank's own to size them")  # fmt: skip
        requests, inbox = [], []
        try:
            for r, pairs in recvs.items():
                buf = torch.empty(len(pairs), like.shape[0], dtype=like.dtype, device=like.device)
                requests.append((r, dist.irecv(buf, src=r)))
                inbox.append((pairs, buf))
            for r, pairs in sends.items():
                rows = torch.stack([outgoing[pair] for pair in pairs]).contiguous()
                requests.append((r, dist.isend(rows, dst=r)))
                self.bytes_sent += rows.numel() * rows.element_size()
                self.messages_sent += 1
        except RuntimeError as err:
            raise _peer_failed(self.rank, None, step, err) from None
        for peer, request in requests:
            try:
                request.wait()
            except RuntimeError as err:
                raise _peer_failed(self.rank, peer, step, err) from None
        return {pair: buf[row] for pairs, buf in inbox for row, pair in enumerate(pairs)}


def flatten_rows(params: dict[str, torch.Tensor]) -> torch.Tensor:
    """The hosted nodes' tensors {name: (m, *shape)} as one (m, d) matrix, names in order:
    what a mixer multiplies and sends."""
    m = next(iter(params.values())).shape[0]
    return torch.cat([p.reshape(m, -1) for p in params.values()], dim=1)


def unflatten_rows(flat: torch.Tensor, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """:func:`flatten_rows` undone: ``flat``'s columns cut into ``like``'s names and shapes."""
    out, start = {}, 0
    for name, tensor in like.items():
        width = int(np.prod(tensor.shape[1:], dtype=np.int64))
        out[name] = flat[:, start : start + width].reshape(tensor.shape)
        start += width
    return out


def _peer_failed(rank: int, peer: int | None, step: int, err: Exception) -> DPDLError:
    who = "a peer process" if peer is None else f"rank {peer}"
    return DPDLError(
        f"rank {rank}: point-to-point exchange at step {step} failed: {who} stopped or timed "
        f"out ({str(err).splitlines()[0][:120]})"
    )


def check_initialized() -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise DPDLError("torch.distributed is not initialised")
    return dist.get_rank(), dist.get_world_size()
