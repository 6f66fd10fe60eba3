"""How nodes mix (MATH.md §4 step 6): the one seam a new transport implements.

A :class:`Mixer` turns the hosted nodes' x^{k+1/2} and push-sum weights w^k into x^{k+1} and
w^{k+1} with the graph of gossip round ``k``.  :meth:`dpdl.engine.simulator.Simulator.step`
and :meth:`~dpdl.engine.simulator.Simulator.mix_only` call it and nothing else, whichever
runtime hosts the nodes:

* :class:`InMemoryMixer`: every node in this process; a roll for circulant graphs, else one
  batched product with P^k (:func:`dpdl.algorithms.dyn_d2p.push_sum_mix`), written into the
  buffers the engine hands it (``out``).
* :class:`dpdl.engine.comm.PointToPointMixer`: a rank's block of nodes of the
  ``torch.distributed`` runtime; messages follow the graph's edges.

A transport of its own (another collective library, a message queue, a simulated lossy
network) is a class with this ``mix``, handed out by its runtime's ``mixer``
(:mod:`dpdl.engine.runtime`).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import torch

from dpdl.algorithms.dyn_d2p import Params, push_sum_mix

__all__ = ["InMemoryMixer", "Mixer", "Traffic", "message_bytes", "out_degrees"]


class Traffic:
    """What each hosted node has sent to other nodes, summed over every mix of a run.

    A message is one node's mixed tensors (each in its own dtype) and its float64 push-sum
    weight, sent to one out-neighbour j != i of the round's graph (P^k_ji != 0): what a node
    of a real network puts on the wire, whichever process hosts the receiver.  A mixer counts
    it (:meth:`record`); the engine gathers it over processes, checkpoints and reports it."""

    def __init__(self, nodes: int):
        self.messages = np.zeros(nodes, dtype=np.int64)
        self.bytes = np.zeros(nodes, dtype=np.int64)

    def record(self, degrees: np.ndarray, payload: int) -> None:
        """One mix: node i sent ``degrees[i]`` messages of ``payload`` bytes each."""
        self.messages += degrees
        self.bytes += degrees * payload

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"messages": torch.from_numpy(self.messages.copy()),
                "bytes": torch.from_numpy(self.bytes.copy())}  # fmt: skip

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.messages = state["messages"].numpy().astype(np.int64)
        self.bytes = state["bytes"].numpy().astype(np.int64)


def out_degrees(matrix: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """How many other nodes each node of [lo, hi) sends to under P (its column's non-zeros
    off the diagonal: x_j gets P_ji x_i)."""
    sends = np.asarray(matrix)[:, lo:hi] != 0
    own = sends[np.arange(lo, hi), np.arange(hi - lo)]
    return sends.sum(axis=0).astype(np.int64) - own


def message_bytes(params: Params, weights: torch.Tensor) -> int:
    """One node's message: a row of every mixed tensor and its push-sum weight, in bytes."""
    rows = sum(v[0].numel() * v.element_size() for v in params.values())
    return int(rows + weights.element_size())


@runtime_checkable
class Mixer(Protocol):
    """x^{k+1}_i = Σ_j P^k_ij x^{k+1/2}_j and w^{k+1} = P^k w^k for the hosted nodes."""

    def mix(self, params: Params, weights: torch.Tensor, k: int, *, step: int | None = None,
            out: Params | None = None) -> tuple[Params, torch.Tensor]:  # fmt: skip
        """The hosted nodes' mixed models and weights (``params`` {name: (m, *shape)},
        ``weights`` (m,) float64).  ``k`` is the gossip round (the graph P^k); ``step`` the
        iteration an error names (default ``k``; they differ with local steps); ``out``
        tensors shaped like ``params`` (not ``params`` itself) that the mixer may write the
        result into instead of allocating (it may also ignore them and return new ones).

        A mixer that counts what its nodes send keeps a :class:`Traffic` of the hosted nodes
        as ``traffic`` (optional: without one, a run reports no communication)."""
        ...


class InMemoryMixer:
    """Push-sum mixing of every node in this process: a roll for circulant graphs, else a
    batched product; P^k (or its circulant form) cached over one period of the topology."""

    def __init__(self, topology, device: torch.device):
        self.topology = topology
        self.device = device
        self.traffic = Traffic(int(topology.n))
        self._cache: dict[int, tuple] = {}

    def mixing(self, k: int):
        """(P^k as a tensor, None, out-degrees) or (None, circulant form, out-degrees);
        cached over one period."""
        period = getattr(self.topology, "period", None)
        key = k % period if isinstance(period, int) and period > 0 else None
        if key is not None and key in self._cache:
            return self._cache[key]
        circ, n = self.topology.circulant(k), int(self.topology.n)
        if circ is not None:
            circ = [(int(s), float(wt)) for s, wt in circ]
            # node i sends to i + s for every distinct non-zero shift s (mod n)
            shifts = {s % n for s, wt in circ if wt != 0 and s % n != 0}
            entry = (None, circ, np.full(n, len(shifts), dtype=np.int64))
        else:
            matrix = np.asarray(self.topology.mixing_matrix(k), dtype=np.float64)
            entry = (torch.as_tensor(matrix, device=self.device), None,
                     out_degrees(matrix, 0, n))  # fmt: skip
        if key is not None:
            self._cache[key] = entry
        return entry

    def mix(self, params: Params, weights: torch.Tensor, k: int, *, step: int | None = None,
            out: Params | None = None) -> tuple[Params, torch.Tensor]:  # fmt: skip
        """See :class:`Mixer`; with ``out``, x^{k+1} is written there (no n x d allocation)."""
        P, circ, degrees = self.mixing(k)
        self.traffic.record(degrees, message_bytes(params, weights))
        return push_sum_mix(params, weights, P, circulant=circ, out=out)
