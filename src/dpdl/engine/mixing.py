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

__all__ = ["InMemoryMixer", "Mixer"]


@runtime_checkable
class Mixer(Protocol):
    """x^{k+1}_i = Σ_j P^k_ij x^{k+1/2}_j and w^{k+1} = P^k w^k for the hosted nodes."""

    def mix(self, params: Params, weights: torch.Tensor, k: int, *, step: int | None = None,
            out: Params | None = None) -> tuple[Params, torch.Tensor]:  # fmt: skip
        """The hosted nodes' mixed models and weights (``params`` {name: (m, *shape)},
        ``weights`` (m,) float64).  ``k`` is the gossip round (the graph P^k); ``step`` the
        iteration an error names (default ``k``; they differ with local steps); ``out``
        tensors shaped like ``params`` (not ``params`` itself) that the mixer may write the
        result into instead of allocating (it may also ignore them and return new ones)."""
        ...


class InMemoryMixer:
    """Push-sum mixing of every node in this process: a roll for circulant graphs, else a
    batched product; P^k (or its circulant form) cached over one period of the topology."""

    def __init__(self, topology, device: torch.device):
        self.topology = topology
        self.device = device
        self._cache: dict[int, tuple] = {}

    def mixing(self, k: int):
        """(P^k as a tensor, None) or (None, circulant form); cached over one period."""
        period = getattr(self.topology, "period", None)
        key = k % period if isinstance(period, int) and period > 0 else None
        if key is not None and key in self._cache:
            return self._cache[key]
        circ = self.topology.circulant(k)
        if circ is not None:
            entry = (None, [(int(s), float(wt)) for s, wt in circ])
        else:
            matrix = np.asarray(self.topology.mixing_matrix(k), dtype=np.float64)
            entry = (torch.as_tensor(matrix, device=self.device), None)
        if key is not None:
            self._cache[key] = entry
        return entry

    def mix(self, params: Params, weights: torch.Tensor, k: int, *, step: int | None = None,
            out: Params | None = None) -> tuple[Params, torch.Tensor]:  # fmt: skip
        """See :class:`Mixer`; with ``out``, x^{k+1} is written there (no n x d allocation)."""
        P, circ = self.mixing(k)
        return push_sum_mix(params, weights, P, circulant=circ, out=out)
