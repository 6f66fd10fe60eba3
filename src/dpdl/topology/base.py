"""Periodic schedules of column-stochastic mixing matrices (MATH.md §3).

A :class:`Topology` is a periodic sequence ``P^0, P^1, ...`` of mixing matrices with
``P^k = P^(k mod period)``; ``P[i, j] > 0`` iff node ``i`` receives from node ``j`` at step
``k``. Two concrete forms exist:

* :class:`CirculantTopology` — every ``P^k`` is a weighted sum of shifts
  ``(Shift_s)[(i + s) % n, i] = 1`` (exponential graphs, rings); the engine can mix with
  ``torch.roll(x, s, dims=0)`` and ``n`` can be large because no matrix is stored.
* :class:`MatrixTopology` — explicit matrices (any graph).

Both validate themselves on construction (Assumption 1 for every phase, Assumption 2 with
``B = period``) and keep the resulting :class:`ConnectivityReport` as ``connectivity``,
so an invalid topology cannot exist.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np

from dpdl.errors import DPDLError
from dpdl.topology.validation import (
    ConnectivityReport,
    check_b_strongly_connected,
    validate_mixing_matrix,
)

CirculantForm = list[tuple[int, float]]

#: Weights at or below this are treated as "no edge" when reading edges off a matrix.
EDGE_THRESHOLD = 0.0


def _step_index(k) -> int:
    try:
        k = operator.index(k)
    except TypeError:
        raise DPDLError(f"a step index must be an integer, got {k!r}") from None
    if k < 0:
        raise DPDLError(f"a step index must be >= 0, got {k}")
    return k


def _node_index(i, n: int) -> int:
    try:
        i = operator.index(i)
    except TypeError:
        raise DPDLError(f"a node index must be an integer, got {i!r}") from None
    if not 0 <= i < n:
        raise DPDLError(f"node {i} is out of range 0..{n - 1}")
    return i


class Topology:
    """Base class: a periodic schedule of ``n × n`` column-stochastic mixing matrices.

    Attributes: ``name``, ``n``, ``period``, ``directed`` (False when every ``P^k`` is
    symmetric and doubly stochastic), ``time_varying`` (``period > 1``), ``params`` (the
    construction parameters, for reports), ``layout`` (a drawing hint: "circular", "grid",
    "star" or "spring"), ``connectivity`` (:class:`ConnectivityReport` for ``B = period``).
    """

    name: str
    n: int
    period: int
    directed: bool
    params: dict
    layout: str
    connectivity: ConnectivityReport

    def __init__(
        self,
        name: str,
        n: int,
        period: int,
        *,
        directed: bool,
        params=None,
        layout: str = "circular",
    ) -> None:
        self.name = name
        self.n = int(n)
        self.period = int(period)
        self.directed = bool(directed)
        self.params = dict(params or {})
        self.layout = layout
        if self.n < 2 and not (self.n == 1 and name == "central"):
            raise DPDLError(f"a topology needs at least 2 nodes, got n={self.n}")
        if self.period < 1:
            raise DPDLError(f"a topology's period must be >= 1, got {self.period}")

    # --- subclasses implement these two, on a phase 0 <= phase < period -----------------
    def _matrix(self, phase: int) -> np.ndarray:
        raise NotImplementedError

    def _adjacency(self, phase: int) -> np.ndarray:
        raise NotImplementedError

    def _circulant(self, phase: int) -> CirculantForm | None:
        return None

    # --- public API -----------------------------------------------------------------------
    @property
    def time_varying(self) -> bool:
        return self.period > 1

    def phase(self, k: int) -> int:
        """The phase ``k mod period`` of step ``k``."""
        return _step_index(k) % self.period

    def mixing_matrix(self, k: int) -> np.ndarray:
        """``P^k`` as a fresh float64 ``(n, n)`` array (column-stochastic)."""
        return np.array(self._matrix(self.phase(k)), dtype=np.float64, copy=True)

    def circulant(self, k: int) -> CirculantForm | None:
        """``P^k = Σ weight · Shift_offset`` as ``[(offset, weight), ...]`` or None.

        ``(Shift_s)[(i + s) % n, i] = 1`` so ``Shift_s @ x == torch.roll(x, s, dims=0)``;
        offsets lie in ``0..n-1`` and are distinct.
        """
        form = self._circulant(self.phase(k))
        return None if form is None else list(form)

    def adjacency(self, k: int) -> np.ndarray:
        """Boolean ``(n, n)``: ``A[i, j]`` iff ``i != j`` and ``i`` receives from ``j`` at step k.

        (A fresh copy; see :mod:`dpdl.topology.weights` for the convention.)
        """
        return np.array(self._adjacency(self.phase(k)), dtype=bool, copy=True)

    def out_neighbours(self, k: int, i: int) -> list[int]:
        """Nodes that ``i`` sends to at step ``k`` (itself excluded), ascending."""
        i = _node_index(i, self.n)
        return np.flatnonzero(self._adjacency(self.phase(k))[:, i]).tolist()

    def in_neighbours(self, k: int, i: int) -> list[int]:
        """Nodes that ``i`` receives from at step ``k`` (itself excluded), ascending."""
        i = _node_index(i, self.n)
        return np.flatnonzero(self._adjacency(self.phase(k))[i, :]).tolist()

    def edges(self, k: int) -> list[tuple[int, int, float]]:
        """Messages of step ``k`` as ``(sender j, receiver i, weight P[i, j])``, ``i != j``.

        Sorted by sender then receiver; the distributed runtime sends ``P[i, j] · x_j`` and
        ``P[i, j] · w_j`` along each, and a node keeps ``P[j, j]`` of its own mass.
        """
        phase = self.phase(k)
        receivers, senders = np.nonzero(self._adjacency(phase))
        order = np.lexsort((receivers, senders))
        weights = self._matrix(phase)[receivers[order], senders[order]]
        return [
            (int(j), int(i), float(w))
            for j, i, w in zip(senders[order], receivers[order], weights, strict=True)
        ]

    def describe(self) -> dict:
        """A JSON-friendly summary (name, n, period, directed, time_varying, params)."""
        return {
            "name": self.name,
            "n": self.n,
            "period": self.period,
            "directed": self.directed,
            "time_varying": self.time_varying,
            "params": {
                key: (str(v) if not isinstance(v, int | float | bool) else v)
                for key, v in self.params.items()
            },
        }

    def __repr__(self) -> str:
        kind = "time-varying" if self.time_varying else "static"
        arrows = "directed" if self.directed else "undirected"
        return f"<Topology {self.name!r} n={self.n} period={self.period} {kind} {arrows}>"

    def _validate(self) -> None:
        for phase in range(self.period):
            P = self._matrix(phase)
            validate_mixing_matrix(
                P, doubly=not self.directed, label=f"mixing matrix of {self.name!r} at step {phase}"
            )
            if not self.directed and not np.allclose(P, P.T, rtol=0.0, atol=1e-12):
                raise DPDLError(
                    f"topology {self.name!r} is declared undirected but its mixing matrix "
                    f"at step {phase} is not symmetric"
                )
        self.connectivity = check_b_strongly_connected(self)


def _normalise_form(form: Sequence[tuple[int, float]], n: int) -> CirculantForm:
    """Merge offsets equal mod ``n`` and drop zero weights; sorted by offset."""
    merged: dict[int, float] = {}
    for offset, weight in form:
        offset = operator.index(offset) % n
        merged[offset] = merged.get(offset, 0.0) + float(weight)
    return [(s, w) for s, w in sorted(merged.items()) if w != 0.0]


def circulant_matrix(form: Sequence[tuple[int, float]], n: int) -> np.ndarray:
    """``Σ weight · Shift_offset`` as a dense ``(n, n)`` float64 matrix."""
    P = np.zeros((n, n))
    columns = np.arange(n)
    for offset, weight in form:
        P[(columns + offset) % n, columns] += weight
    return P


def circulant_form_of(P: np.ndarray, atol: float = 1e-12) -> CirculantForm | None:
    """The ``[(offset, weight), ...]`` form of ``P`` if it is circulant, else None."""
    n = P.shape[0]
    columns = np.arange(n)
    # shifted[s, i] = P[(i + s) % n, i]: constant along each row iff P is circulant.
    shifted = P[(columns[None, :] + columns[:, None]) % n, columns[None, :]]
    if not np.allclose(shifted, shifted[:, :1], rtol=0.0, atol=atol):
        return None
    weights = shifted[:, 0]
    return [(int(s), float(weights[s])) for s in np.flatnonzero(weights > atol)]


def circulant_spectrum(form: Sequence[tuple[int, float]], n: int) -> np.ndarray:
    """Eigenvalues of ``Σ w · Shift_s`` by Fourier mode: ``λ_f = Σ w · exp(−2πi f s / n)``.

    The Fourier vector ``v_f = exp(2πi f j / n)`` satisfies ``Shift_s v_f = λ v_f`` with
    ``λ = exp(−2πi f s / n)``; mode ``f = 0`` is the consensus direction.
    """
    offsets = np.array([s for s, _ in form], dtype=np.float64)
    weights = np.array([w for _, w in form])
    modes = np.arange(n)[:, None]
    return np.exp(-2j * np.pi * modes * offsets[None, :] / n) @ weights


class CirculantTopology(Topology):
    """Each phase is a weighted sum of shifts; no matrix is stored (MATH.md §3)."""

    def __init__(
        self,
        name: str,
        n: int,
        forms: Sequence[Sequence[tuple[int, float]]],
        *,
        directed: bool,
        params=None,
        layout: str = "circular",
    ) -> None:
        super().__init__(name, n, len(forms), directed=directed, params=params, layout=layout)
        self._forms = [_normalise_form(form, self.n) for form in forms]
        self._validate()

    def _matrix(self, phase: int) -> np.ndarray:
        return circulant_matrix(self._forms[phase], self.n)

    def _adjacency(self, phase: int) -> np.ndarray:
        A = np.zeros((self.n, self.n), dtype=bool)
        columns = np.arange(self.n)
        for offset, _ in self._forms[phase]:
            if offset != 0:
                A[(columns + offset) % self.n, columns] = True
        return A

    def _circulant(self, phase: int) -> CirculantForm:
        return self._forms[phase]

    def out_neighbours(self, k: int, i: int) -> list[int]:
        i = _node_index(i, self.n)
        return sorted((i + s) % self.n for s in self.offsets(k))

    def in_neighbours(self, k: int, i: int) -> list[int]:
        i = _node_index(i, self.n)
        return sorted((i - s) % self.n for s in self.offsets(k))

    def edges(self, k: int) -> list[tuple[int, int, float]]:
        # O(n · offsets) without a dense matrix; offsets are distinct and non-zero mod n.
        sends = [(s, w) for s, w in self._forms[self.phase(k)] if s != 0]
        offsets = np.array([s for s, _ in sends], dtype=np.int64)
        weights = np.array([w for _, w in sends])
        senders = np.repeat(np.arange(self.n), len(sends))
        receivers = (senders + np.tile(offsets, self.n)) % self.n
        weights = np.tile(weights, self.n)
        order = np.lexsort((receivers, senders))
        return [
            (int(j), int(i), float(w))
            for j, i, w in zip(senders[order], receivers[order], weights[order], strict=True)
        ]

    def offsets(self, k: int) -> list[int]:
        """Non-zero shift offsets used at step ``k`` (where node ``i`` sends: ``i + s``)."""
        return [s for s, _ in self._forms[self.phase(k)] if s != 0]


class MatrixTopology(Topology):
    """A periodic schedule of explicit matrices (any graph, MATH.md §3).

    ``detect_circulant`` reports the shift form of circulant phases so the engine can roll;
    dense schedules (the complete graph) turn it off because one matmul beats ``n`` rolls.
    """

    def __init__(
        self,
        name: str,
        matrices: Sequence[np.ndarray],
        *,
        directed: bool,
        params=None,
        layout: str = "spring",
        detect_circulant: bool = True,
    ) -> None:
        if len(matrices) == 0:
            raise DPDLError("a topology needs at least one mixing matrix")
        stacked = [np.asarray(M, dtype=np.float64) for M in matrices]
        if stacked[0].ndim != 2 or stacked[0].shape[0] != stacked[0].shape[1]:
            raise DPDLError(
                f"mixing matrix of {name!r} at step 0 must be square, got shape {stacked[0].shape}"
            )
        super().__init__(
            name,
            stacked[0].shape[0] if stacked[0].ndim == 2 else 0,
            len(stacked),
            directed=directed,
            params=params,
            layout=layout,
        )
        for phase, M in enumerate(stacked):
            if M.shape != (self.n, self.n):
                raise DPDLError(
                    f"mixing matrix of {name!r} at step {phase} has shape {M.shape}, "
                    f"expected {(self.n, self.n)}"
                )
        self._matrices = [M.copy() for M in stacked]
        for M in self._matrices:
            M.flags.writeable = False
        off_diagonal = ~np.eye(self.n, dtype=bool)
        self._adjacencies = [(M > EDGE_THRESHOLD) & off_diagonal for M in self._matrices]
        self._validate()
        self._forms = [circulant_form_of(M) if detect_circulant else None for M in self._matrices]

    @classmethod
    def from_matrices(
        cls, name: str, matrices: Sequence[np.ndarray], *, directed: bool = True, **kwargs
    ) -> MatrixTopology:
        """A validated custom schedule (e.g. loaded from disk)."""
        return cls(name, matrices, directed=directed, **kwargs)

    def _matrix(self, phase: int) -> np.ndarray:
        return self._matrices[phase]

    def _adjacency(self, phase: int) -> np.ndarray:
        return self._adjacencies[phase]

    def _circulant(self, phase: int) -> CirculantForm | None:
        return self._forms[phase]
