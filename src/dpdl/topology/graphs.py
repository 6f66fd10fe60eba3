"""The graph families of MATH.md §3 and :func:`make_topology`.

Directed graphs use :func:`uniform_sender_weights` (column-stochastic), undirected ones
:func:`metropolis_hastings_weights` (symmetric, doubly stochastic). Random graphs are drawn
from ``numpy.random.default_rng(seed)`` and resampled until connected, at most
``max_attempts`` times.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from pathlib import Path

import networkx as nx
import numpy as np

from dpdl.errors import DPDLError, require
from dpdl.topology.base import CirculantTopology, MatrixTopology, Topology
from dpdl.topology.weights import metropolis_hastings_weights, uniform_sender_weights

TOPOLOGIES = (
    "exp",
    "ring",
    "complete",
    "undirected-ring",
    "static-exp",
    "hypercube",
    "torus",
    "random-regular",
    "erdos-renyi",
    "star",
    "edgelist",
    "geometric",
    "central",
)

DEFAULT_MAX_ATTEMPTS = 100


def exponential_period(n: int) -> int:
    """m = ⌊log2(n−1)⌋ + 1 computed with integers (MATH.md §3)."""
    return (n - 1).bit_length()


def _int_param(name: str, value, *, minimum: int) -> int:
    if isinstance(value, bool):
        raise DPDLError(f"{name} must be an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise DPDLError(f"{name} must be an integer, got {value!r}") from None
    if value < minimum:
        raise DPDLError(f"{name} must be >= {minimum}, got {value}")
    return value


def _undirected(name: str, A: np.ndarray, *, params=None, layout: str = "spring") -> Topology:
    return MatrixTopology(
        name, [metropolis_hastings_weights(A)], directed=False, params=params, layout=layout
    )


def _adjacency_from_graph(graph: nx.Graph, n: int) -> np.ndarray:
    """``A[i, j]`` iff ``j -> i`` (undirected graphs give a symmetric ``A``)."""
    return nx.to_numpy_array(graph, nodelist=range(n), dtype=np.int8).T.astype(bool)


# --- deterministic families ------------------------------------------------------------------


def time_varying_exponential(n: int) -> Topology:
    """One-peer exponential graph: at step k node i sends to i + 2^(k mod m) (MATH.md §3)."""
    m = exponential_period(n)
    forms = [[(0, 0.5), (2**t, 0.5)] for t in range(m)]
    return CirculantTopology("exp", n, forms, directed=True)


def directed_ring(n: int) -> Topology:
    """i -> i+1 mod n with weights ½, ½ (MATH.md §3)."""
    return CirculantTopology("ring", n, [[(0, 0.5), (1, 0.5)]], directed=True)


def complete(n: int) -> Topology:
    """P = 11ᵀ/n (MATH.md §3); dense, so no circulant form."""
    return MatrixTopology(
        "complete",
        [np.full((n, n), 1.0 / n)],
        directed=False,
        layout="circular",
        detect_circulant=False,
    )


def central(n: int) -> Topology:
    """One node holding every record: central DP-SGD, the baseline of decentralized DP (the
    same record-level relation and ε, no gossip; MATH.md §9.4's local→central gap)."""
    return MatrixTopology("central", [np.ones((1, 1))], directed=False, layout="circular",
                          detect_circulant=False)  # fmt: skip


def undirected_ring(n: int) -> Topology:
    """i — i±1 mod n with Metropolis–Hastings weights (1/3 each for n >= 3)."""
    A = np.zeros((n, n), dtype=bool)
    nodes = np.arange(n)
    A[nodes, (nodes + 1) % n] = True
    A[(nodes + 1) % n, nodes] = True
    return _undirected("undirected-ring", A, layout="circular")


def static_exponential(n: int) -> Topology:
    """Static directed exponential graph: i -> i + 2^j for j < m, weight 1/(m+1) (MATH.md §3)."""
    m = exponential_period(n)
    weight = 1.0 / (m + 1)
    return CirculantTopology(
        "static-exp", n, [[(0, weight)] + [(2**j, weight) for j in range(m)]], directed=True
    )


def hypercube(n: int) -> Topology:
    """d-dimensional hypercube, n = 2^d: i — i XOR 2^b; Metropolis weights 1/(d+1)."""
    if n & (n - 1):
        lower = 1 << (n.bit_length() - 1)
        raise DPDLError(
            f"hypercube needs n to be a power of two (n = 2^d), got n={n}; "
            f"nearest: {lower} or {lower * 2}"
        )
    d = n.bit_length() - 1
    nodes = np.arange(n)
    A = np.zeros((n, n), dtype=bool)
    for bit in range(d):
        A[nodes, nodes ^ (1 << bit)] = True
    return _undirected("hypercube", A, params={"dimension": d}, layout="circular")


def torus_shape(n: int, rows: int | None = None, cols: int | None = None) -> tuple[int, int]:
    """rows × cols = n with rows, cols >= 3; by default the squarest such factorization."""
    if rows is None and cols is None:
        candidates = [r for r in range(3, math.isqrt(n) + 1) if n % r == 0 and n // r >= 3]
        if not candidates:
            raise DPDLError(
                f"torus needs n = rows × cols with rows, cols >= 3 (e.g. 9, 12, 15, 16, 20, 25); "
                f"n={n} has no such factorization"
            )
        rows = candidates[-1]
        return rows, n // rows
    if rows is None:
        cols = _int_param("cols", cols, minimum=3)
        rows = n // cols
    elif cols is None:
        rows = _int_param("rows", rows, minimum=3)
        cols = n // rows
    rows = _int_param("rows", rows, minimum=3)
    cols = _int_param("cols", cols, minimum=3)
    if rows * cols != n:
        raise DPDLError(f"torus rows × cols must equal n: {rows} × {cols} != {n}")
    return rows, cols


def torus(n: int, rows: int | None = None, cols: int | None = None) -> Topology:
    """2-D torus (wrap-around grid), 4-regular; node r·cols + c; Metropolis weights 1/5."""
    rows, cols = torus_shape(n, rows, cols)
    r, c = np.divmod(np.arange(n), cols)
    A = np.zeros((n, n), dtype=bool)
    nodes = np.arange(n)
    for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        A[nodes, ((r + dr) % rows) * cols + (c + dc) % cols] = True
    return _undirected("torus", A, params={"rows": rows, "cols": cols}, layout="grid")


def star(n: int) -> Topology:
    """Node 0 linked to every other node; Metropolis weights 1/n on edges."""
    A = np.zeros((n, n), dtype=bool)
    A[0, 1:] = A[1:, 0] = True
    return _undirected("star", A, layout="star")


# --- random families -------------------------------------------------------------------------


def _resample_until_connected(
    name: str, draw: Callable[[int], nx.Graph], *, seed: int, max_attempts: int, hint: str
) -> tuple[nx.Graph, int]:
    attempt_seeds = np.random.default_rng(seed).integers(0, 2**32, size=max_attempts)
    for attempt, attempt_seed in enumerate(attempt_seeds, start=1):
        graph = draw(int(attempt_seed))
        connected = (
            nx.is_strongly_connected(graph) if graph.is_directed() else nx.is_connected(graph)
        )
        if connected:
            return graph, attempt
    raise DPDLError(f"{name}: no connected graph in {max_attempts} attempts (seed={seed}); {hint}")


def random_regular(
    n: int, degree: int | None = None, *, seed: int = 0, max_attempts: int = DEFAULT_MAX_ATTEMPTS
) -> Topology:
    """Uniform random d-regular graph (networkx), resampled until connected.

    The default degree is ``min(4, n − 1)`` (``n × degree`` is then always even).
    """
    degree = min(4, n - 1) if degree is None else _int_param("degree", degree, minimum=1)
    max_attempts = _int_param("max_attempts", max_attempts, minimum=1)
    if degree >= n:
        raise DPDLError(f"random-regular degree must be < n: degree={degree}, n={n}")
    if (n * degree) % 2:
        raise DPDLError(f"random-regular needs n × degree even: n={n}, degree={degree}")
    if degree == 1 and n > 2:
        raise DPDLError(f"a 1-regular graph on n={n} > 2 nodes is never connected; use degree >= 2")
    graph, attempts = _resample_until_connected(
        "random-regular",
        lambda s: nx.random_regular_graph(degree, n, seed=s),
        seed=seed,
        max_attempts=max_attempts,
        hint="try a larger degree",
    )
    return _undirected(
        "random-regular",
        _adjacency_from_graph(graph, n),
        params={"degree": degree, "seed": seed, "attempts": attempts},
    )


def erdos_renyi(
    n: int,
    probability: float | None = None,
    *,
    directed: bool = False,
    seed: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Topology:
    """G(n, p), resampled until (strongly) connected; default p = min(1, 2 ln n / n)."""
    if probability is None:
        probability = min(1.0, 2.0 * math.log(n) / n)
    try:
        probability = float(probability)
    except (TypeError, ValueError):
        raise DPDLError(f"probability must be a number, got {probability!r}") from None
    if not 0.0 < probability <= 1.0:
        raise DPDLError(f"erdos-renyi probability must be in (0, 1], got {probability}")
    max_attempts = _int_param("max_attempts", max_attempts, minimum=1)
    graph, attempts = _resample_until_connected(
        "erdos-renyi",
        lambda s: nx.gnp_random_graph(n, probability, seed=s, directed=bool(directed)),
        seed=seed,
        max_attempts=max_attempts,
        hint=f"try a larger probability than {probability:g} (connectivity needs about ln(n)/n)",
    )
    A = _adjacency_from_graph(graph, n)
    params = {"probability": probability, "seed": seed, "attempts": attempts}
    if directed:
        return MatrixTopology(
            "erdos-renyi",
            [uniform_sender_weights(A)],
            directed=True,
            params=params | {"directed": True},
        )
    return _undirected("erdos-renyi", A, params=params)


def random_geometric(
    n: int,
    radius: float | None = None,
    *,
    seed: int = 0,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
) -> Topology:
    """Random geometric graph: n points uniform in the unit square, linked within ``radius``
    (default sqrt(2 ln n / (π n)), about twice the connectivity threshold), resampled until
    connected; the layout of a sensor or hospital network with local links."""
    if radius is None:
        radius = math.sqrt(2.0 * math.log(n) / (math.pi * n))
    try:
        radius = float(radius)
    except (TypeError, ValueError):
        raise DPDLError(f"radius must be a number, got {radius!r}") from None
    if not (math.isfinite(radius) and radius > 0):
        raise DPDLError(f"geometric radius must be > 0, got {radius}")
    max_attempts = _int_param("max_attempts", max_attempts, minimum=1)
    graph, attempts = _resample_until_connected(
        "geometric",
        lambda s: nx.random_geometric_graph(n, radius, seed=s),
        seed=seed,
        max_attempts=max_attempts,
        hint=f"try a larger radius than {radius:g}",
    )
    return _undirected(
        "geometric",
        _adjacency_from_graph(graph, n),
        params={"radius": radius, "seed": seed, "attempts": attempts},
    )


# --- edge-list files -------------------------------------------------------------------------


def read_edgelist(path, n: int) -> np.ndarray:
    """Parse ``u v`` lines (``#`` comments, blank lines allowed) into a boolean adjacency.

    Returns ``A`` with ``A[v, u]`` true for the line ``u v`` (u sends to v); self-loop lines
    are accepted and ignored (every node keeps a self-loop anyway).
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise DPDLError(f"cannot read edge list {str(path)!r}: {err.strerror or err}") from None
    A = np.zeros((n, n), dtype=bool)
    edges = 0
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if len(fields) != 2:
            raise DPDLError(f"{path}:{number}: expected two node ids 'u v', got {line.strip()!r}")
        try:
            u, v = int(fields[0]), int(fields[1])
        except ValueError:
            raise DPDLError(
                f"{path}:{number}: node ids must be integers, got {line.strip()!r}"
            ) from None
        for node in (u, v):
            if not 0 <= node < n:
                raise DPDLError(f"{path}:{number}: node {node} is out of range 0..{n - 1}")
        A[v, u] = True
        edges += 1
    if edges == 0:
        raise DPDLError(f"edge list {str(path)!r} has no edges")
    np.fill_diagonal(A, False)
    return A


def edgelist_node_count(path) -> int:
    """1 + the largest node id in an edge-list file (to infer n)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise DPDLError(f"cannot read edge list {str(path)!r}: {err.strerror or err}") from None
    largest = -1
    for number, line in enumerate(text.splitlines(), start=1):
        for field in line.split("#", 1)[0].split():
            try:
                largest = max(largest, int(field))
            except ValueError:
                raise DPDLError(
                    f"{path}:{number}: node ids must be integers, got {field!r}"
                ) from None
    if largest < 0:
        raise DPDLError(f"edge list {str(path)!r} has no edges")
    return largest + 1


def from_edgelist(n: int, path=None, *, directed: bool = False) -> Topology:
    """A graph read from a file: directed (uniform sender weights) or undirected (Metropolis)."""
    if path is None:
        raise DPDLError("topology 'edgelist' needs path=<file> (CLI: --edgelist FILE)")
    A = read_edgelist(path, n)
    params = {"path": str(path), "directed": bool(directed)}
    if directed:
        return MatrixTopology("edgelist", [uniform_sender_weights(A)], directed=True, params=params)
    return _undirected("edgelist", A | A.T, params=params)


# --- user graphs and schedules -----------------------------------------------------------


def from_networkx(graph: nx.Graph, *, name: str = "networkx") -> Topology:
    """A user's networkx graph as a validated topology (MATH.md §3 weights).

    Node ``i`` of the topology is the ``i``-th node of ``graph.nodes`` (its iteration order),
    so the i-th local data set belongs to it. A directed graph (``u -> v``: u sends to v) gets
    uniform sender weights ``1/(outdeg+1)`` (column-stochastic); an undirected one
    Metropolis–Hastings weights (doubly stochastic). Edge attributes and self-loops are
    ignored; a graph that is not strongly connected is refused.
    """
    if not isinstance(graph, nx.Graph):
        raise DPDLError(f"expected a networkx graph, got {type(graph).__name__}")
    n = graph.number_of_nodes()
    if n < 2:
        raise DPDLError(f"networkx graph {name!r} needs at least 2 nodes, got {n}")
    # to_numpy_array reads multigraph edges as counts; only their presence matters here.
    A = nx.to_numpy_array(graph, nodelist=list(graph.nodes), weight=None).T > 0
    params = {"directed": graph.is_directed(), "edges": graph.number_of_edges()}
    if graph.is_directed():
        return MatrixTopology(name, [uniform_sender_weights(A)], directed=True, params=params)
    return _undirected(name, A, params=params)


# Without a given period, a mixing function is read at k = 0 .. PERIOD_PROBE - 1 and its
# period is the smallest m <= PERIOD_PROBE / 2 that repeats over all of them.
PERIOD_PROBE = 64


def from_mixing_function(
    function: Callable[[int], np.ndarray], n: int, *, period: int | None = None,
    name: str = "function",
) -> Topology:
    """The schedule ``P^k = function(k)``, ``k = 0 .. period-1``, repeating with ``period``.

    Every matrix is validated (Assumption 1: non-negative, column-stochastic, self-loops) and
    the schedule B-strongly connected with ``B = period`` (Assumption 2); a schedule that does
    not repeat can be given whole with ``period = steps``.  Without ``period`` it is found by
    reading the function at k < 64; a function that does not repeat within that is refused
    (reading P^0 only would run a time-varying graph as a static one).
    """
    n = _int_param("the number of nodes n", n, minimum=2)
    if period is None:
        probed = [_call_mixing(function, k, n, name) for k in range(PERIOD_PROBE)]
        period = next((m for m in range(1, PERIOD_PROBE // 2 + 1)
                       if all(np.array_equal(P, probed[k % m]) for k, P in enumerate(probed))),
                      None)  # fmt: skip
        if period is None:
            raise DPDLError(
                f"mixing-matrix function {name!r} does not repeat within k < {PERIOD_PROBE}: "
                "give its period (topology_params={'period': m}, or m = steps for a schedule "
                "that never repeats)"
            )
        matrices = probed[:period]
    else:
        period = _int_param("period", period, minimum=1)
        matrices = [_call_mixing(function, k, n, name) for k in range(period)]
    symmetric = all(np.allclose(P, P.T, rtol=0.0, atol=1e-12) for P in matrices)
    return MatrixTopology(name, matrices, directed=not symmetric, params={"period": period})


def _call_mixing(function, k: int, n: int, name: str) -> np.ndarray:
    try:
        P = np.asarray(function(k), dtype=np.float64)
    except Exception as err:  # the user's code: report where it failed, in one line
        raise DPDLError(
            f"mixing-matrix function {name!r} failed at k={k}: {type(err).__name__}: {err}"
        ) from None
    if P.shape != (n, n):
        raise DPDLError(
            f"mixing-matrix function {name!r} returned shape {P.shape} at k={k}, "
            f"expected {(n, n)} (one row and column per node)"
        )
    return P


# --- the factory -----------------------------------------------------------------------------

_BUILDERS: dict[str, tuple[Callable[..., Topology], frozenset[str], bool]] = {
    # name: (builder, accepted parameters, takes a seed)
    "exp": (time_varying_exponential, frozenset(), False),
    "ring": (directed_ring, frozenset(), False),
    "complete": (complete, frozenset(), False),
    "undirected-ring": (undirected_ring, frozenset(), False),
    "static-exp": (static_exponential, frozenset(), False),
    "hypercube": (hypercube, frozenset(), False),
    "torus": (torus, frozenset({"rows", "cols"}), False),
    "random-regular": (random_regular, frozenset({"degree", "max_attempts"}), True),
    "erdos-renyi": (erdos_renyi, frozenset({"probability", "directed", "max_attempts"}), True),
    "star": (star, frozenset(), False),
    "edgelist": (from_edgelist, frozenset({"path", "directed"}), False),
    "geometric": (random_geometric, frozenset({"radius", "max_attempts"}), True),
    "central": (central, frozenset(), False),
}
assert tuple(_BUILDERS) == TOPOLOGIES


def make_topology(name: str, n: int, *, seed: int = 0, **params) -> Topology:
    """Build, validate and return the topology ``name`` on ``n`` nodes (MATH.md §3).

    Parameters by family: torus ``rows``/``cols``; random-regular ``degree``,
    ``max_attempts``; erdos-renyi ``probability``, ``directed``, ``max_attempts``;
    edgelist ``path``, ``directed``; geometric ``radius``, ``max_attempts``. Parameters set
    to None are ignored; any other parameter is an error. ``seed`` is used by the random
    families only.
    """
    if name not in _BUILDERS:
        raise DPDLError(f"unknown topology {name!r}; choose one of: {', '.join(TOPOLOGIES)}")
    if name == "central":
        require(n == 1, f"topology 'central' is one node holding every record, got n = {n}")
    else:
        n = _int_param("the number of nodes n", n, minimum=2)
    seed = _int_param("seed", seed, minimum=0)
    builder, accepted, seeded = _BUILDERS[name]
    given = {key: value for key, value in params.items() if value is not None}
    unknown = sorted(set(given) - accepted)
    if unknown:
        allowed = ", ".join(sorted(accepted)) or "none"
        raise DPDLError(
            f"topology {name!r} takes no parameter {unknown[0]!r} (accepted: {allowed})"
        )
    if seeded:
        given["seed"] = seed
    return builder(n, **given)
