"""How the nodes' noise is correlated: a component of the private step (issue 41).

A private step releases node i's noisy sum as round_g(centre_i + σ X_i) (MATH.md §10); what a
correlation changes is the centre.  :data:`CORRELATIONS` names them (``privacy.correlation``):

* ``"independent"`` (the default): centre_i = S_i, the clipped sum; every node's noise its
  own.  The step's mechanism is the engine's own, untouched (a run is the run it was).
* ``"pairwise"`` (DECOR, Allouah et al. 2024): centre_i = S_i + Σ_{j ∈ N_k(i)} s_ij with
  pairwise secrets s_ij = -s_ji = σ_pair·η_e, one per edge e = {i, j} of the undirected
  version of step k's gossip graph and step: η_e is a standard Gaussian drawn from edge e's
  stream (:mod:`dpdl.algorithms.pairwise`: X25519, HKDF, ChaCha20) by the same exact sampler
  at its grid (:func:`~dpdl.algorithms.noise.draw` and :func:`~dpdl.algorithms.noise.release`
  at centre 0), so both endpoints compute the very same grid value and add it with opposite
  signs (the lower index +, the higher -): over the network the pairwise parts cancel, up to
  the float64 rounding of each node's own sum.  σ_pair = f·σ_k, f = ``correlation_factor``.
  The centre is summed in float64 and released by the exact float64 release: no float32
  intermediate.  (``dpdl.accounting.correlated`` calls the same noise model "pairwise".)

* ``"neighbourhood-zero-sum"`` (Zip-DL's zero-sum noise, Biswas et al. 2025): centre_i = S_i +
  Σ_{k ∈ N_k[i]} share_ki over the closed neighbourhoods i belongs to; node k draws ζ_k, one
  standard Gaussian per member of N[k] and coordinate, from a stream only it can read (a key
  HKDF-derived from its X25519 private scalar; with ``entropy = "seed"`` anyone with the seed
  rebuilds it, as every seeded stream) and hands member i the share f·σ_k·(ζ_ki − mean
  ζ_k): a neighbourhood's shares sum to zero.  A share crosses to another process only as a
  point-to-point message to the process hosting its receiver (the mixer's ``exchange``).  The
  same law and knowledge as ``dpdl.accounting.correlated``'s "neighbourhood-zero-sum".

Whom it protects is the run's ``privacy.trust_model``: by default the ledger accounts σ_k,
the independent part, alone, which is what protects a record against *curious neighbours*
who know the secrets they share ("curious-neighbours"); with "sec-ldp" it records DECOR's
stronger guarantee against a party who knows no honest pair's secret
(:func:`dpdl.training.plan.trust_noise_factor`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from dpdl.algorithms.noise import draw, release
from dpdl.algorithms.pairwise import HostedKeys
from dpdl.errors import require

__all__ = [
    "CENTRE_NORM_BOUND",
    "CORRELATIONS",
    "CorrelatedDraw",
    "CorrelatedRelease",
    "CorrelatedStep",
    "DecorNoise",
    "DecorRelease",
    "INDEPENDENT",
    "IndependentNoise",
    "MAX_CORRELATION_FACTOR",
    "NoiseCorrelation",
    "ScaledCorrelation",
    "ShareChannel",
    "ZeroSumNoise",
    "ZeroSumRelease",
    "correlation_names",
    "make_correlation",
    "neighbourhood_shares",
    "pair_secret",
    "register_correlation",
    "undirected_neighbours",
]

Params = dict  # {name: (m, *shape) tensor}: stacked parameters of the hosted nodes

#: The largest correlation_factor accepted: correlated parts far above σ_k make the centre's
#: float64 rounding (and the exact path's cells) grow with them (MATH.md §10.6), and a Sec-LDP
#: claim needs the secrets' grid f·σ_k·2^-10 far below σ_k (MATH.md §9.4: the aliasing term
#: exp(-π² 2^20 / (2 f²)) < e^-500).
MAX_CORRELATION_FACTOR = 100.0
#: ‖S_i + c_i‖ above this many C would let the centre's one float64 rounding (2^-52 of its
#: norm between two neighbouring centres) leave §10.3's clipping margin of 1.2e-4 C.
CENTRE_NORM_BOUND = 2.7e11

class ShareChannel(Protocol):
    """Private point-to-point delivery of per-edge tensors (a mixer that can carry them, e.g.
    :class:`dpdl.engine.comm.PointToPointMixer`): ``outgoing`` {(sender, receiver): (d,)
    tensor} goes to each receiver's process only; returns {(sender, receiver): tensor} for
    every pair in ``expected`` (receivers hosted here).  Every process calls it at the same
    point of a step."""

    def exchange(self, outgoing: dict, expected: Sequence[tuple[int, int]], step: int) -> dict: ...


@dataclass(frozen=True)
class CorrelatedStep:
    """What a correlation needs of step ``step`` (gossip round ``round``): the hosted nodes
    (``first_node`` and the count of ``neighbours``), each one's neighbours in the undirected
    graph of the round (ascending, itself excluded), the hosted nodes' keys, a channel to the
    other processes' nodes (None in one process) and the mixer's count of what each node
    sends (``Traffic``; None: not counted)."""

    step: int
    round: int
    first_node: int
    neighbours: tuple[tuple[int, ...], ...]
    keys: HostedKeys | None = None
    channel: ShareChannel | None = None
    traffic: object | None = None  # the mixer's Traffic: shares sent are messages too
    clip: float | None = None  # the step's clip bound C: the centre's norm is held to it


class NoiseCorrelation(Protocol):
    """A registered correlation: ``at_step`` turns the engine's mechanism into the mechanism
    of one step (``NoiseMechanism``: start / noisy_sums / noisy_step)."""

    name: str
    correlation_factor: float | None  # σ_pair / σ_k (None: no pairwise part)
    pairwise_keys: bool  # whether the engine must give the hosted nodes pairwise keys
    needs_channel: bool  # whether shares travel to other processes' nodes (a ShareChannel)

    def at_step(self, mechanism, step: CorrelatedStep): ...

    def describe(self) -> dict: ...


@dataclass
class CorrelatedDraw:
    """A correlated step's data-free half: the independent noise's draw (``independent``) and
    what each hosted node adds to its centre (``correlated``, (m, d) float64)."""

    independent: object
    correlated: torch.Tensor | None


class CorrelatedRelease:
    """The mechanism of one correlated step: node i releases round_g(S_i + c_i + σ X_i), exactly
    in law for the centre S_i + c_i (float64), X_i from its own stream; c_i, the correlated
    part, is the subclass's (:meth:`correlated_sums`)."""

    name = "exact-gaussian-grid"
    certified = True

    def __init__(self, step: CorrelatedStep, correlation_factor: float):
        require(step.keys is not None, "correlated noise needs the hosted nodes' keys")
        self.step, self.correlation_factor = step, float(correlation_factor)

    def correlated_sums(self, d: int, scale: float, device=None) -> torch.Tensor:
        raise NotImplementedError

    def start(self, generators, d: int, sigma: float, *, device=None, reuse=None) -> CorrelatedDraw:
        require(len(generators) == len(self.step.neighbours),
                f"{len(generators)} streams for {len(self.step.neighbours)} hosted nodes")
        independent = draw(generators, d, sigma, "gaussian", device=device, reuse=reuse)
        return CorrelatedDraw(independent,
                              self.correlated_sums(d, sigma * self.correlation_factor, device))

    def _cells(self, noise: CorrelatedDraw, sums: Params) -> torch.Tensor:
        """j (float64, integer-valued) with j·g the release of S + c + σX.  The centre is
        formed in the draw's correlated sums (no second (m, d) float64 buffer): a draw is
        released once."""
        centre, m = noise.correlated, noise.correlated.shape[0]
        for (lo, hi), s in zip(_columns(sums), sums.values(), strict=True):
            centre[:, lo:hi].add_(s.reshape(m, -1))  # float32 widened exactly, one rounding
        noise.correlated = None  # consumed
        clip = self.step.clip
        require(clip is not None and math.isfinite(clip) and clip > 0,
                f"a correlated release needs the step's clip bound, got {clip!r}")
        norms = torch.linalg.vector_norm(centre, dim=1)
        worst = int(torch.argmax(norms))
        require(float(norms[worst]) <= CENTRE_NORM_BOUND * clip,
                f"node {self.step.first_node + worst}'s correlated centre has norm "
                f"{float(norms[worst]) / clip:.3g} C, above {CENTRE_NORM_BOUND:.2g} C: its float64 "
                "rounding would leave the clipping margin (MATH.md §10.6); nothing is released")
        return release(noise.independent, centre)

    def noisy_sums(self, noise: CorrelatedDraw, sums: Params) -> Params:
        cells, grid = self._cells(noise, sums), noise.independent.grid
        for (lo, hi), tensor in zip(_columns(sums), sums.values(), strict=True):
            flat = tensor.view(tensor.shape[0], -1)
            flat.copy_(cells[:, lo:hi].mul(grid))  # exact: g = 2^e; rounded to the sums' dtype
        return sums

    def noisy_step(self, noise: CorrelatedDraw, x: Params, sums: Params, step_size: float,
                   out: Params) -> Params:  # fmt: skip
        """out = x - step_size·G, computed from the released G alone (``out`` may be sums)."""
        cells, grid = self._cells(noise, sums), noise.independent.grid
        for (lo, hi), name in zip(_columns(sums), sums, strict=True):
            flat = out[name].view(out[name].shape[0], -1)
            torch.add(x[name].reshape(flat.shape), cells[:, lo:hi].to(flat.dtype),
                      alpha=-step_size * grid, out=flat)  # fmt: skip
        return out


class DecorRelease(CorrelatedRelease):
    """DECOR: c_i = Σ_{j ∈ N(i)} s_ij, the pairwise secrets (the module doc)."""

    def correlated_sums(self, d: int, scale: float, device=None) -> torch.Tensor:
        return self.pair_sums(d, scale, device)

    def pair_sums(self, d: int, pair_sigma: float, device=None) -> torch.Tensor:
        """Σ_{j ∈ N(i)} s_ij for every hosted node i, (m, d) float64, neighbours in ascending
        order: s_ij drawn by node i from edge {i, j}'s stream of this step.  An edge whose two
        ends this process hosts is drawn once: the other end's value is its negation, the very
        bits that end would draw (same key, same words; the tests compare the two)."""
        step, zero = self.step, torch.zeros((1, d), dtype=torch.float64, device=device)
        sums = torch.zeros((len(step.neighbours), d), dtype=torch.float64, device=device)
        hosted = range(step.first_node, step.first_node + len(step.neighbours))
        drawn: dict[tuple[int, int], torch.Tensor] = {}  # edges both of whose ends are hosted
        for row, peers in enumerate(step.neighbours):
            node = step.first_node + row
            for peer in peers:
                edge = (min(node, peer), max(node, peer))
                value = drawn.pop(edge, None)
                if value is not None:
                    sums[row].sub_(value[0])  # the other end added it: s_ij = -s_ji
                    continue
                value = pair_secret(step.keys, node, peer, step, pair_sigma, zero)
                sums[row].add_(value[0])
                if peer in hosted:
                    drawn[edge] = value
        return sums


class ZeroSumRelease(CorrelatedRelease):
    """Zero-sum shares over each closed neighbourhood: c_i = Σ_{k ∈ N[i]} share_ki (the module
    doc).  Node k draws ζ_k, (|N[k]|, d), from its own stream (members in the order k, then its
    neighbours ascending) and hands member i the share f·σ·(ζ_ki − mean ζ_k); the shares of a
    neighbourhood sum to zero.  Shares to nodes hosted elsewhere travel through the step's
    ``channel`` (point to point, to that node's process only); each node sums the shares it
    holds in ascending order of their senders, wherever they were drawn (the same bits in
    every hosting)."""

    def correlated_sums(self, d: int, scale: float, device=None) -> torch.Tensor:
        step = self.step
        first, m = step.first_node, len(step.neighbours)
        hosted = range(first, first + m)
        held: list[dict[int, torch.Tensor]] = [{} for _ in range(m)]  # i -> {k: share_ki}
        outgoing: dict[tuple[int, int], torch.Tensor] = {}
        for row, peers in enumerate(step.neighbours):
            k = first + row
            members = (k, *peers)
            shares = neighbourhood_shares(step, k, len(members), d, scale, device)
            for member, share in zip(members, shares, strict=True):
                if member in hosted:
                    held[member - first][k] = share
                else:
                    outgoing[k, member] = share
        expected = [(k, first + row) for row, peers in enumerate(step.neighbours)
                    for k in peers if k not in hosted]  # fmt: skip
        if outgoing or expected:
            require(step.channel is not None,
                    "zero-sum shares for nodes hosted elsewhere need a channel to them")
            for (k, i), share in step.channel.exchange(outgoing, expected, step.step).items():
                held[i - first][k] = share
        if step.traffic is not None:  # each share to a neighbour: one float64 message
            step.traffic.record(np.array([len(p) for p in step.neighbours], dtype=np.int64), d * 8)
        sums = torch.zeros((m, d), dtype=torch.float64, device=device)
        for row, shares in enumerate(held):
            for k in sorted(shares):
                sums[row].add_(shares[k].to(sums.device))
        return sums


def neighbourhood_shares(step: CorrelatedStep, node: int, size: int, d: int, scale: float,
                         device=None) -> torch.Tensor:  # fmt: skip
    """Node ``node``'s shares of step ``step``: scale·(ζ − mean ζ), (size, d) float64, ζ standard
    Gaussians released on the grid of ``scale`` from the node's own stream (rows sum to 0 up
    to float64 rounding)."""
    zero = torch.zeros((1, size * d), dtype=torch.float64, device=device)
    source = draw([step.keys.own_stream(node, step.step, step.round)], size * d, scale,
                  "gaussian", device=device)  # fmt: skip
    zeta = release(source, zero).mul_(source.grid).reshape(size, d)  # exact: grid multiples
    return zeta.sub_(zeta.mean(dim=0, keepdim=True))


def pair_secret(keys: HostedKeys, node: int, peer: int, step: CorrelatedStep, pair_sigma: float,
                zero: torch.Tensor) -> torch.Tensor:  # fmt: skip
    """s_{node, peer} (1, d) float64: + σ_pair η_e at the lower index, - at the higher, η_e
    released on its grid from edge e's stream of the step (both ends read the same words)."""
    pair = draw([keys.stream(node, peer, step.step, step.round)], zero.shape[1], pair_sigma,
                "gaussian", device=zero.device)  # fmt: skip
    value = release(pair, zero).mul_(pair.grid)  # exact: integers times a power of two
    return value if node < peer else value.neg_()


class IndependentNoise:
    """Every node's noise its own: the engine's mechanism, unchanged."""

    name, pairwise_keys, needs_channel = "independent", False, False
    correlation_factor = None

    def at_step(self, mechanism, step: CorrelatedStep):
        return mechanism

    def describe(self) -> dict:
        return {"name": self.name}


class ScaledCorrelation:
    """A correlation of scale ``correlation_factor``·σ_k whose step is its ``release``."""

    name: str
    release: type[CorrelatedRelease]
    pairwise_keys = True

    def __init__(self, factor: float | None):
        self.correlation_factor = _factor(self.name, factor)

    def at_step(self, mechanism, step: CorrelatedStep):
        return self.release(step, self.correlation_factor)

    def describe(self) -> dict:
        return {"name": self.name, "correlation_factor": self.correlation_factor}


class DecorNoise(ScaledCorrelation):
    """DECOR's pairwise-cancelling noise of scale ``correlation_factor``·σ_k (the module doc)."""

    name, needs_channel, release = "pairwise", False, DecorRelease


class ZeroSumNoise(ScaledCorrelation):
    """Zero-sum shares over each closed neighbourhood, of scale ``correlation_factor``·σ_k (the
    module doc)."""

    name, needs_channel, release = "neighbourhood-zero-sum", True, ZeroSumRelease


def _factor(name: str, factor: float | None) -> float:
    ok = isinstance(factor, int | float) and not isinstance(factor, bool)
    require(ok and math.isfinite(factor) and 0 < factor <= MAX_CORRELATION_FACTOR,
            f"{name} noise needs privacy.correlation_factor (its scale over σ) in (0, "
            f"{MAX_CORRELATION_FACTOR:g}], got {factor!r}")  # fmt: skip
    return float(factor)


def _independent(factor: float | None) -> IndependentNoise:
    require(factor is None, f"privacy.correlation_factor ({factor!r}) scales correlated noise: "
            "independent noise has none")  # fmt: skip
    return INDEPENDENT


INDEPENDENT = IndependentNoise()
#: name -> the correlation of that name with a given correlation_factor (checked)
CORRELATIONS: dict[str, Callable[[float | None], NoiseCorrelation]] = {
    "independent": _independent,
    "pairwise": DecorNoise,
    "neighbourhood-zero-sum": ZeroSumNoise,
}


def correlation_names() -> tuple[str, ...]:
    return tuple(CORRELATIONS)


def register_correlation(name: str, factory: Callable[[float | None], NoiseCorrelation], *,
                         replace: bool = False) -> None:  # fmt: skip
    """Make ``privacy.correlation = name`` mean ``factory(privacy.correlation_factor)`` (which
    checks its argument and returns a :class:`NoiseCorrelation`); a name taken needs
    ``replace``."""
    require(isinstance(name, str) and name and callable(factory),
            f"a correlation needs a name and a factory, got {name!r}, {factory!r}")
    require(replace or name not in CORRELATIONS,
            f"noise correlation {name!r} is registered already (replace=True to replace it)")
    CORRELATIONS[name] = factory


def make_correlation(name: str, factor: float | None = None) -> NoiseCorrelation:
    """The correlation ``name`` (of :data:`CORRELATIONS`) with ``factor`` (the setting
    ``privacy.correlation_factor``), checked."""
    require(name in CORRELATIONS, f"unknown noise correlation {name!r}; choose one of "
            f"{', '.join(CORRELATIONS)}")  # fmt: skip
    return CORRELATIONS[name](factor)


def undirected_neighbours(mixing: np.ndarray, nodes: Sequence[int]) -> tuple[tuple[int, ...], ...]:
    """For each of ``nodes``, its neighbours in the undirected version of the graph of
    ``mixing`` (:func:`dpdl.accounting.correlated.undirected_adjacency`), ascending."""
    from dpdl.accounting.correlated import undirected_adjacency

    adjacency = undirected_adjacency(mixing)
    return tuple(tuple(int(j) for j in np.flatnonzero(adjacency[i])) for i in nodes)


def _columns(sums: Params):
    """(lo, hi) of each parameter's columns in the flat (m, d) order of ``sums``."""
    lo = 0
    for tensor in sums.values():
        hi = lo + tensor[0].numel()
        yield lo, hi
        lo = hi
