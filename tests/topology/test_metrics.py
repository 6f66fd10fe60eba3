"""Spectral gaps and per-period contraction q against closed forms (MATH.md §3, "Metrics")."""

import numpy as np
import pytest

from dpdl.errors import DPDLError
from dpdl.topology import (
    MatrixTopology,
    circulant_matrix,
    circulant_spectrum,
    make_topology,
    mixing_matrices,
    mixing_report,
    period_contraction,
    period_product,
    spectral_gap,
)


def _circulant_eigenvalues(n, form):
    """Eigenvalues of Σ w·Shift_s: λ_k = Σ w·exp(−2πi k s / n), k = 0..n−1."""
    k = np.arange(n)
    return sum(w * np.exp(-2j * np.pi * k * s / n) for s, w in form)


@pytest.mark.parametrize("n", [5, 16, 20])
def test_spectral_gaps_closed_forms(n):
    assert spectral_gap(make_topology("ring", n)) == pytest.approx(1 - np.cos(np.pi / n), abs=1e-12)
    assert spectral_gap(make_topology("complete", n)) == pytest.approx(1.0, abs=1e-12)
    assert spectral_gap(make_topology("star", n)) == pytest.approx(1 / n, abs=1e-12)
    ring_eigs = (1 + 2 * np.cos(2 * np.pi * np.arange(1, n) / n)) / 3
    assert spectral_gap(make_topology("undirected-ring", n)) == pytest.approx(
        1 - np.abs(ring_eigs).max(), abs=1e-12
    )


@pytest.mark.parametrize("d", [1, 2, 3, 5])
def test_hypercube_gap(d):
    # Metropolis weights 1/(d+1): eigenvalues 1 − 2j/(d+1), SLEM (d−1)/(d+1) for d >= 1
    assert spectral_gap(make_topology("hypercube", 2**d)) == pytest.approx(2 / (d + 1), abs=1e-12)


def test_torus_gap():
    rows, cols = 4, 5
    a, b = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    laplacian = (2 - 2 * np.cos(2 * np.pi * a / rows)) + (2 - 2 * np.cos(2 * np.pi * b / cols))
    eigs = np.sort(np.abs(1 - laplacian.ravel() / 5))
    assert spectral_gap(make_topology("torus", 20)) == pytest.approx(1 - eigs[-2], abs=1e-12)


def test_static_exponential_gap_non_symmetric():
    n = 20
    form = [(0, 1 / 6)] + [(s, 1 / 6) for s in (1, 2, 4, 8, 16)]
    eigs = np.sort(np.abs(_circulant_eigenvalues(n, form)))
    assert spectral_gap(make_topology("static-exp", n)) == pytest.approx(1 - eigs[-2], abs=1e-12)


def test_spectral_gap_input_checks():
    with pytest.raises(DPDLError, match="static topology.*period 5"):
        spectral_gap(make_topology("exp", 20))
    with pytest.raises(DPDLError, match="column 0"):
        spectral_gap(np.array([[0.5, 0.5], [0.6, 0.5]]))
    # a disconnected (block-diagonal) matrix has a repeated eigenvalue 1: gap 0
    assert spectral_gap(np.kron(np.eye(2), np.full((2, 2), 0.5))) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("n", [16, 20, 33])
def test_ring_and_exponential_contraction_closed_forms(n):
    assert period_contraction(make_topology("ring", n)) == pytest.approx(
        np.cos(np.pi / n), abs=1e-12
    )
    m = (n - 1).bit_length()
    # the one-period product is circulant (normal): q = max_{k != 0} Π_t |(1 + ω^{k 2^t}) / 2|
    k = np.arange(1, n)
    factors = [np.abs(1 + np.exp(2j * np.pi * k * 2**t / n)) / 2 for t in range(m)]
    expected = np.prod(factors, axis=0).max()
    assert period_contraction(make_topology("exp", n)) == pytest.approx(expected, abs=1e-12)


def test_exponential_graph_averages_exactly_at_powers_of_two():
    # Π_t (I + Shift_{2^t}) / 2 over t < log2 n is 11ᵀ/n (one-peer exponential graph, exact
    # averaging after log2(n) steps; Ying et al., NeurIPS 2021).
    for n in (2, 4, 16, 64):
        np.testing.assert_allclose(
            period_product(make_topology("exp", n)), np.full((n, n), 1 / n), atol=1e-14
        )


def test_contraction_ordering_ring_exponential_complete():
    """MATH.md §3: q decreases ring > exponential > complete (per period and per step)."""
    q20 = {name: mixing_report(make_topology(name, 20)) for name in ("ring", "exp", "complete")}
    assert q20["ring"].q > q20["exp"].q > q20["complete"].q
    assert q20["ring"].per_step_rate > q20["exp"].per_step_rate > q20["complete"].per_step_rate
    assert q20["complete"].q == pytest.approx(0.0, abs=1e-12)
    q16 = {
        name: period_contraction(make_topology(name, 16)) for name in ("ring", "exp", "complete")
    }
    assert q16["ring"] > q16["exp"]  # exp ties complete (both 0) at a power of two
    assert q16["exp"] == pytest.approx(q16["complete"], abs=1e-12)


def test_mixing_report_fields():
    report = mixing_report(make_topology("exp", 20))
    assert report.period == 5 and report.spectral_gap is None
    assert report.q_spectral_radius <= report.q + 1e-12
    assert report.per_step_rate == pytest.approx(report.q ** (1 / 5))
    static = mixing_report(make_topology("undirected-ring", 12))
    # symmetric: q = SLEM = 1 − gap
    assert static.q == pytest.approx(1 - static.spectral_gap, abs=1e-12)
    assert set(static.to_dict()) == {
        "period",
        "q",
        "q_spectral_radius",
        "per_step_rate",
        "spectral_gap",
    }


def test_contraction_bounds_the_disagreement_after_one_period(rng):
    topology = make_topology("erdos-renyi", 12, seed=4, probability=0.3, directed=True)
    q = period_contraction(topology)
    M = period_product(topology)
    for _ in range(20):
        v = rng.standard_normal(12)
        v -= v.mean()
        assert np.linalg.norm(M @ v) <= q * np.linalg.norm(v) + 1e-12
    assert 0 < q < 1


def test_mixing_matrices_stacks_a_window():
    topology = make_topology("exp", 20)
    stack = mixing_matrices(topology, 3, 12)
    assert stack.shape == (9, 20, 20) and stack.dtype == np.float64
    for offset, P in enumerate(stack):
        np.testing.assert_array_equal(P, topology.mixing_matrix(3 + offset))
    assert mixing_matrices(topology, 4, 4).shape == (0, 20, 20)
    with pytest.raises(DPDLError, match="k0=5, k1=2"):
        mixing_matrices(topology, 5, 2)
    with pytest.raises(DPDLError, match="k0=-1"):
        mixing_matrices(topology, -1, 2)


@pytest.mark.parametrize(
    ("name", "n"),
    [("exp", 20), ("exp", 12), ("ring", 9), ("static-exp", 20), ("undirected-ring", 10)],
)
def test_fourier_fast_path_matches_dense_matrices(name, n):
    """Circulant schedules are measured from their spectra; the dense route must agree."""
    fast = make_topology(name, n)
    dense = MatrixTopology.from_matrices(
        name,
        [fast.mixing_matrix(k) for k in range(fast.period)],
        directed=fast.directed,
        detect_circulant=False,
    )
    assert dense.circulant(0) is None
    fast_report, dense_report = mixing_report(fast), mixing_report(dense)
    assert fast_report.q == pytest.approx(dense_report.q, abs=1e-10)
    assert fast_report.q_spectral_radius == pytest.approx(dense_report.q_spectral_radius, abs=1e-10)
    if not fast.time_varying:
        assert fast_report.spectral_gap == pytest.approx(dense_report.spectral_gap, abs=1e-10)
        assert spectral_gap(fast) == pytest.approx(spectral_gap(fast.mixing_matrix(0)), abs=1e-10)


def test_circulant_spectrum_matches_numpy_eigenvalues():
    form = [(0, 0.4), (3, 0.35), (5, 0.25)]
    n = 11
    ours = np.sort_complex(np.round(circulant_spectrum(form, n), 12))
    reference = np.sort_complex(np.round(np.linalg.eigvals(circulant_matrix(form, n)), 12))
    np.testing.assert_allclose(ours, reference, atol=1e-10)
