"""Topologies: graphs -> periodic column-stochastic mixing matrices, validation, metrics.

See MATH.md §3 for the mathematics.

>>> from dpdl.topology import make_topology, period_contraction
>>> exp = make_topology("exp", 20)
>>> [exp.circulant(k)[1][0] for k in range(exp.period)]
[1, 2, 4, 8, 16]
"""

from dpdl.topology.base import (
    CirculantTopology,
    MatrixTopology,
    Topology,
    circulant_form_of,
    circulant_matrix,
    circulant_spectrum,
)
from dpdl.topology.graphs import (
    TOPOLOGIES,
    edgelist_node_count,
    exponential_period,
    from_mixing_function,
    from_networkx,
    make_topology,
    read_edgelist,
    torus_shape,
)
from dpdl.topology.metrics import (
    MixingReport,
    mixing_matrices,
    mixing_report,
    period_contraction,
    period_product,
    spectral_gap,
)
from dpdl.topology.validation import (
    ConnectivityReport,
    MixingSchedule,
    check_b_strongly_connected,
    union_graph,
    validate_mixing_matrix,
)
from dpdl.topology.weights import metropolis_hastings_weights, uniform_sender_weights

__all__ = [
    "TOPOLOGIES",
    "CirculantTopology",
    "ConnectivityReport",
    "MatrixTopology",
    "MixingReport",
    "MixingSchedule",
    "Topology",
    "check_b_strongly_connected",
    "circulant_form_of",
    "circulant_matrix",
    "circulant_spectrum",
    "edgelist_node_count",
    "exponential_period",
    "from_mixing_function",
    "from_networkx",
    "make_topology",
    "metropolis_hastings_weights",
    "mixing_matrices",
    "mixing_report",
    "period_contraction",
    "period_product",
    "read_edgelist",
    "spectral_gap",
    "torus_shape",
    "uniform_sender_weights",
    "union_graph",
    "validate_mixing_matrix",
]
