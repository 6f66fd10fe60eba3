"""Certified accountants (MATH.md §2): its oracles, closed forms and dp_accounting itself."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import privacy_loss_distribution as dp_pld
from dp_accounting.pld.pld_privacy_accountant import PLDAccountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from dpdl.accounting import _pld_gaussian
from dpdl.accounting.certified import (
    ACCOUNTANTS,
    DEFAULT_BLOCKS,
    EpsilonReport,
    blocked_run_length,
    compute_delta,
    compute_epsilon,
    privacy_loss_distribution,
    run_length,
)
from dpdl.errors import DPDLError

# MATH.md §2 oracles (p = 1/2500, K = 10 000, δ = 1e-4)
P_B1, K_B1, DELTA_B1 = 4e-4, 10_000, 1e-4
MU_TOTAL_EPS1 = 0.313902  # μ(ε = 1, δ = 1e-4), MATH.md §1.2


def dyn_mu_multipliers(steps: int, mu0: float = 1.23087, rho_mu: float = 2.0) -> np.ndarray:
    """z_k = 1/μ_k with μ_k = μ0·ρ_μ^(k/K) (MATH.md §2, Dyn[μ]-D2P at C̄ = 1)."""
    return 1.0 / (mu0 * rho_mu ** (np.arange(steps) / steps))


def gdp_delta(epsilon: float, mu: float) -> float:
    """Eq. 4 directly from scipy, an independent closed form."""
    return norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2)


# ------------------------------------------------------------------ the PMF builder itself


@pytest.mark.parametrize(
    ("z", "q", "grid"),
    [(1.5, 0.04, 1e-3), (0.8, 0.01, 1e-3), (2.0, 1.0, 1e-3), (5.0, 0.01, 1e-4), (0.6, 0.3, 1e-3)],
)
def test_pmfs_match_dp_accounting_construction(z, q, grid):
    remove, add = _pld_gaussian.subsampled_gaussian_pmfs(z, q, grid)
    reference = dp_pld.from_gaussian_mechanism(
        z, sampling_prob=q, pessimistic_estimate=True, value_discretization_interval=grid
    )
    pairs = [(remove, reference._pmf_remove)]
    if q < 1:
        pairs.append((add, reference._pmf_add))
    else:
        assert add is None
    for mine, theirs in pairs:
        theirs = theirs.to_dense_pmf()
        assert mine.lower_index == theirs._lower_loss
        assert mine.probs.size == theirs.size
        np.testing.assert_allclose(mine.probs, theirs._probs, rtol=0, atol=1e-10)
        assert mine.infinity_mass == pytest.approx(theirs._infinity_mass, rel=1e-6, abs=1e-30)


# ------------------------------------------------------------------------- MATH.md oracles


def test_rdp_oracle_poisson_004_z15_2250_steps():
    report = compute_epsilon("rdp", [(1.5, 2250)], 0.04, 1e-5)
    assert report.epsilon == pytest.approx(7.329111, abs=5e-4)
    assert report.certified and report.method == "rdp" and report.accountant == "rdp"


def test_pld_oracle_poisson_004_z15_2249_steps():
    report = compute_epsilon("pld", [(1.5, 2249)], 0.04, 1e-5)
    assert report.epsilon == pytest.approx(6.767, abs=0.01)
    assert report.method == "pld-exact" and report.certified
    # RDP is a looser certified bound; Opacus's PRV upper bound is 6.7774
    assert report.epsilon < 6.7774 < compute_epsilon("rdp", [(1.5, 2249)], 0.04, 1e-5).epsilon


def test_pld_oracle_poisson_02_z05_three_steps():
    report = compute_delta("pld", [0.5, 0.5, 0.5], 0.2, 1.0)
    assert report.delta == pytest.approx(0.15594, abs=1e-3)
    assert report.epsilon == 1.0


def test_pld_gaussian_three_fold_is_pessimistic_and_tight():
    # z = √3 three times is exactly 1-GDP, whose δ(1) is eq. 4
    exact = gdp_delta(1.0, 1.0)
    assert exact == pytest.approx(0.126936, abs=1e-6)
    pld = compute_delta("pld", [(math.sqrt(3), 3)], 1.0, 1.0).delta
    assert exact <= pld <= exact + 1e-5


@pytest.mark.parametrize(("z", "expected"), [(0.491680, 2.26), (0.688360, 0.361), (0.406986, 5.37)])
def test_pld_shows_clt_understates_at_b1(z, expected):
    pld = compute_epsilon("pld", [(z, K_B1)], P_B1, DELTA_B1)
    assert pld.epsilon == pytest.approx(expected, rel=0.01)
    clt = compute_epsilon("clt", [(z, K_B1)], P_B1, DELTA_B1)
    assert not clt.certified and clt.method == "clt"
    assert clt.epsilon < pld.epsilon


def test_clt_matches_spec_calibration():
    # σ/C = 0.491680 is the CLT calibration to ε = 1 (MATH.md §2)
    clt = compute_epsilon("clt", np.full(K_B1, 0.491680), P_B1, DELTA_B1)
    assert clt.epsilon == pytest.approx(1.0, abs=2e-4)
    assert compute_delta("clt", [(0.491680, K_B1)], P_B1, 1.0).delta == pytest.approx(
        DELTA_B1, rel=2e-3
    )


def test_b64_regime_clt_is_nearly_tight():
    p, steps = 0.0256, 2000
    mu_bar = math.sqrt(math.log(MU_TOTAL_EPS1**2 / (steps * p**2) + 1))  # eq. 9
    z = 1.0 / mu_bar
    clt = compute_epsilon("clt", [(z, steps)], p, DELTA_B1).epsilon
    pld = compute_epsilon("pld", [(z, steps)], p, DELTA_B1).epsilon
    assert clt == pytest.approx(1.0, abs=1e-4)
    assert pld == pytest.approx(1.009, abs=0.005)


def test_dyn_mu_blocked_bound_within_two_percent_of_spec_exact():
    report = compute_epsilon("pld", dyn_mu_multipliers(K_B1), P_B1, DELTA_B1, mode="blocked")
    assert report.method == f"pld-blocked(B={DEFAULT_BLOCKS})"
    # MATH.md §2: exact ≈ 3.04, the B = 100 bound 1.6 % above it
    assert 3.04 * 0.995 <= report.epsilon <= 3.04 * 1.02 * 1.005


@pytest.mark.slow
def test_dyn_mu_exact_and_blocked_gaps():
    schedule = dyn_mu_multipliers(K_B1)
    exact = compute_epsilon("pld", schedule, P_B1, DELTA_B1).epsilon
    assert exact == pytest.approx(3.04, rel=0.01)
    for blocks, gap in [(100, 0.02), (1000, 0.003)]:
        bound = compute_epsilon("pld", schedule, P_B1, DELTA_B1, mode="blocked", blocks=blocks)
        assert exact <= bound.epsilon <= exact * (1 + gap)


def test_binned_sandwich_brackets_exact_composition():
    # 300 distinct multipliers, exact composition still cheap at grid 1e-3
    schedule = dyn_mu_multipliers(300, mu0=1.2)
    exact = compute_epsilon("pld", schedule, 0.01, 1e-5, value_discretization=1e-3).epsilon
    binned = compute_epsilon(
        "pld", schedule, 0.01, 1e-5, mode="binned", bins=40, value_discretization=1e-3
    )
    assert binned.method == "pld-binned(bins=40)"
    assert binned.epsilon_lower <= exact <= binned.epsilon
    assert binned.epsilon <= exact * 1.02
    blocked = compute_epsilon(
        "pld", schedule, 0.01, 1e-5, mode="blocked", blocks=40, value_discretization=1e-3
    )
    assert binned.epsilon < blocked.epsilon  # bins by value beat blocks by count


def test_binned_brackets_dp_accounting_one_by_one():
    rng = np.random.default_rng(3)
    schedule = rng.uniform(0.7, 1.5, size=40)
    q, grid = 0.05, 1e-3
    accountant = PLDAccountant(value_discretization_interval=grid)
    for z in schedule:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
    reference = accountant.get_epsilon(1e-6)
    report = compute_epsilon("pld", schedule, q, 1e-6, mode="binned", bins=8,
                             value_discretization=grid)
    assert report.epsilon_lower <= reference <= report.epsilon
    # with a bin per multiplier the sandwich closes on dp_accounting's value (the grid
    # trimming of the binned path only moves ε at the level of round-off here)
    tight = compute_epsilon("pld", schedule, q, 1e-6, mode="binned", bins=40,
                            value_discretization=grid)
    assert tight.method == "pld-binned(bins=40, exact)"
    assert tight.epsilon_lower == tight.epsilon
    assert tight.epsilon == pytest.approx(reference, rel=1e-7)


def test_binned_is_order_free_and_monotone_in_bins():
    schedule = dyn_mu_multipliers(400, mu0=1.1)
    kwargs = {"mode": "binned", "value_discretization": 1e-3}
    coarse = compute_epsilon("pld", schedule, 0.02, 1e-5, bins=10, **kwargs)
    fine = compute_epsilon("pld", schedule, 0.02, 1e-5, bins=60, **kwargs)
    reversed_fine = compute_epsilon("pld", schedule[::-1], 0.02, 1e-5, bins=60, **kwargs)
    assert reversed_fine == fine
    assert coarse.epsilon_lower <= fine.epsilon_lower <= fine.epsilon <= coarse.epsilon


def test_value_bins_are_narrow_where_multipliers_are_small():
    from dpdl.accounting.certified import value_bins

    z = np.linspace(0.5, 1.0, 1001)
    starts = value_bins(z, np.ones(z.size, dtype=np.int64), 20)
    widths = np.diff(z[np.append(starts, z.size - 1)])
    assert starts[0] == 0 and 10 <= starts.size <= 20
    assert widths[0] < widths[-1] / 3


@pytest.mark.slow
def test_spec_dyn_mu_binned_oracle():
    # MATH.md §2: Dyn[μ], ρ_μ = 2, CLT ε = 1 → exact PLD 3.0373; issue 15: bound in
    # [3.0373, 3.0404], with a lower companion below the exact value
    report = compute_epsilon("pld", dyn_mu_multipliers(K_B1), P_B1, DELTA_B1, mode="binned")
    assert 3.0373 <= report.epsilon <= 3.0404
    assert 3.0 < report.epsilon_lower <= 3.0373


# ------------------------------------------------------- exact composition vs dp_accounting


def test_exact_heterogeneous_matches_dp_accounting_one_by_one():
    rng = np.random.default_rng(7)
    schedule = rng.uniform(0.8, 1.6, size=30)
    q, grid = 0.05, 1e-3
    accountant = PLDAccountant(value_discretization_interval=grid)
    for z in schedule:
        accountant.compose(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)))
    for epsilon in (0.5, 1.0, 2.0):
        mine = compute_delta("pld", schedule, q, epsilon, value_discretization=grid).delta
        assert mine == pytest.approx(accountant.get_delta(epsilon), rel=1e-8)
    mine = compute_epsilon("pld", schedule, q, 1e-5, value_discretization=grid).epsilon
    assert mine == pytest.approx(accountant.get_epsilon(1e-5), rel=1e-8)


def test_self_composition_matches_dp_accounting_self_compose():
    grid = 1e-3
    reference = dp_pld.from_gaussian_mechanism(
        0.9, sampling_prob=0.02, value_discretization_interval=grid
    ).self_compose(500)
    mine = compute_epsilon("pld", [(0.9, 500)], 0.02, 1e-6, value_discretization=grid)
    assert mine.epsilon == pytest.approx(reference.get_epsilon_for_delta(1e-6), rel=1e-8)


def test_run_length_and_per_step_forms_agree():
    per_step = [1.2, 0.9, 1.2, 0.9, 0.9, 2.0]
    rows = [(0.9, 3), (2.0, 1), (1.2, 2)]
    for accountant in ACCOUNTANTS:
        a = compute_epsilon(accountant, per_step, 0.1, 1e-5, value_discretization=1e-3)
        b = compute_epsilon(accountant, rows, 0.1, 1e-5, value_discretization=1e-3)
        assert a == b


def test_epsilon_and_delta_directions_are_consistent():
    schedule = [(1.1, 40), (1.4, 60)]
    for accountant in ("pld", "rdp", "clt"):
        epsilon = compute_epsilon(accountant, schedule, 0.05, 1e-5, value_discretization=1e-3)
        delta = compute_delta(
            accountant, schedule, 0.05, epsilon.epsilon, value_discretization=1e-3
        ).delta
        assert delta <= 1e-5 * (1 + 1e-6)
        assert delta >= 1e-5 * 0.5  # ε is the smallest one: δ at ε is not far below target


# -------------------------------------------------------------------- blocked / run-length


def test_blocked_run_length_uses_each_blocks_smallest_multiplier():
    multipliers, counts = run_length(np.arange(10, 0, -1, dtype=float))
    z, c = blocked_run_length(multipliers, counts, 2)
    np.testing.assert_array_equal(z, [1.0, 6.0])
    np.testing.assert_array_equal(c, [5, 5])
    z, c = blocked_run_length(*run_length([(3.0, 7), (1.0, 2)]), 3)
    np.testing.assert_array_equal(z, [1.0, 3.0])  # blocks: {1, 1, 3}, {3, 3, 3}, {3, 3, 3}
    np.testing.assert_array_equal(c, [3, 6])
    z, c = blocked_run_length(multipliers, counts, 100)  # more blocks than steps: exact
    np.testing.assert_array_equal(z, multipliers)


def test_infinite_multipliers_are_dropped_and_empty_schedule_is_free():
    with_inf = compute_epsilon("pld", [1.0, math.inf, 1.0], 0.1, 1e-5, value_discretization=1e-3)
    without = compute_epsilon("pld", [1.0, 1.0], 0.1, 1e-5, value_discretization=1e-3)
    assert with_inf.epsilon == without.epsilon
    for accountant in ACCOUNTANTS:
        assert compute_epsilon(accountant, [], 0.1, 1e-5).epsilon == 0.0
        assert compute_delta(accountant, [(1.0, 0)], 0.1, 1.0).delta == 0.0


def test_privacy_loss_distribution_is_the_composed_pld():
    assert privacy_loss_distribution([], 0.1) is None
    pld = privacy_loss_distribution([(1.2, 30)], 0.1, value_discretization=1e-3)
    report = compute_epsilon("pld", [(1.2, 30)], 0.1, 1e-5, value_discretization=1e-3)
    assert pld.get_epsilon_for_delta(1e-5) == report.epsilon
    blocked = privacy_loss_distribution(
        np.linspace(1, 2, 30), 0.1, mode="blocked", blocks=3, value_discretization=1e-3
    )
    same = privacy_loss_distribution(
        [(1.0, 10), (1 + 10 / 29, 10), (1 + 20 / 29, 10)], 0.1, value_discretization=1e-3
    )
    assert blocked.get_delta_for_epsilon(1.0) == pytest.approx(same.get_delta_for_epsilon(1.0))


def test_report_to_dict():
    report = compute_epsilon("rdp", [(2.0, 10)], 0.01, 1e-5)
    assert isinstance(report, EpsilonReport)
    assert report.to_dict() == {
        "accountant": "rdp",
        "epsilon": report.epsilon,
        "delta": 1e-5,
        "certified": True,
        "method": "rdp",
        "epsilon_lower": None,
        "neighboring": "add-remove",
    }


# ------------------------------------------------------------------------- fail closed


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"noise_multipliers": [1.0, 0.0]}, "0.0"),
        ({"noise_multipliers": [1.0, -2.0]}, "-2.0"),
        ({"noise_multipliers": [float("nan")]}, "nan"),
        ({"noise_multipliers": [(1.0, 2.5)]}, "2.5"),
        ({"noise_multipliers": [(1.0, -1)]}, "-1"),
        ({"noise_multipliers": np.ones((2, 3))}, "(2, 3)"),
        ({"noise_multipliers": ["a"]}, "numbers"),
        ({"accountant": "prv"}, "prv"),
        ({"sample_rate": 0.0}, "0.0"),
        ({"sample_rate": 1.5}, "1.5"),
        ({"delta": 0.0}, "0.0"),
        ({"delta": 1.0}, "1.0"),
        ({"mode": "fast"}, "fast"),
        ({"blocks": 10}, "blocks=10"),
        ({"mode": "blocked", "blocks": 0}, "0"),
        ({"value_discretization": -1e-4}, "-0.0001"),
    ],
)
def test_bad_input_raises_dpdl_error_naming_the_value(kwargs, fragment):
    arguments = {
        "accountant": "pld",
        "noise_multipliers": [1.0],
        "sample_rate": 0.1,
        "delta": 1e-5,
    } | kwargs
    option_names = ("mode", "blocks", "value_discretization")
    options = {k: arguments.pop(k) for k in option_names if k in arguments}
    with pytest.raises(DPDLError) as caught:
        compute_epsilon(
            arguments["accountant"],
            arguments["noise_multipliers"],
            arguments["sample_rate"],
            arguments["delta"],
            **options,
        )
    assert fragment in str(caught.value)


def test_non_private_step_is_refused_by_every_accountant():
    for accountant in ACCOUNTANTS:
        with pytest.raises(DPDLError, match="no finite privacy guarantee"):
            compute_epsilon(accountant, [(0.0, 5)], 0.1, 1e-5)
        with pytest.raises(DPDLError, match="epsilon"):
            compute_delta(accountant, [(1.0, 5)], 0.1, -1.0)


def test_grid_too_fine_for_tiny_multiplier_is_refused():
    with pytest.raises(DPDLError, match="value_discretization"):
        compute_epsilon("pld", [1e-3], 0.1, 1e-5)


def test_composed_grid_too_long_is_refused(monkeypatch):
    monkeypatch.setattr(_pld_gaussian, "MAX_FOURIER_POINTS", 1000)
    with pytest.raises(DPDLError, match="composed privacy-loss grid"):
        compute_epsilon("pld", [(1.0, 50)], 0.1, 1e-5, value_discretization=1e-3)


def test_too_short_fourier_grid_is_detected_and_retried(monkeypatch):
    schedule = np.linspace(0.9, 1.3, 12)
    expected = compute_epsilon("pld", schedule, 0.05, 1e-6, value_discretization=1e-3).epsilon
    monkeypatch.setattr(_pld_gaussian, "_WINDOW_MARGIN", 0.3)  # first grid far too short
    retried = compute_epsilon("pld", schedule, 0.05, 1e-6, value_discretization=1e-3).epsilon
    assert retried == pytest.approx(expected, rel=1e-9)


# ------------------------------------------------------------------ properties (hypothesis)

multipliers_strategy = st.lists(st.floats(min_value=0.7, max_value=3.0), min_size=1, max_size=12)
rates = st.sampled_from([0.01, 0.05, 0.2])


@settings(max_examples=8, deadline=None)
@given(schedule=multipliers_strategy, q=rates)
def test_reversal_gives_the_same_epsilon(schedule, q):
    forward = compute_epsilon("pld", schedule, q, 1e-5, value_discretization=1e-3)
    backward = compute_epsilon("pld", schedule[::-1], q, 1e-5, value_discretization=1e-3)
    assert backward.epsilon == pytest.approx(forward.epsilon, rel=1e-9, abs=1e-12)


@settings(max_examples=8, deadline=None)
@given(schedule=multipliers_strategy, q=rates, blocks=st.integers(1, 4))
def test_blocked_bound_is_never_below_exact(schedule, q, blocks):
    exact = compute_epsilon("pld", schedule, q, 1e-5, value_discretization=1e-3).epsilon
    bound = compute_epsilon(
        "pld", schedule, q, 1e-5, mode="blocked", blocks=blocks, value_discretization=1e-3
    ).epsilon
    assert bound >= exact - 1e-9
    rdp_exact = compute_epsilon("rdp", schedule, q, 1e-5).epsilon
    rdp_bound = compute_epsilon("rdp", schedule, q, 1e-5, mode="blocked", blocks=blocks).epsilon
    assert rdp_bound >= rdp_exact - 1e-9


@settings(max_examples=8, deadline=None)
@given(z=st.floats(min_value=0.6, max_value=3.0), factor=st.floats(1.05, 2.0), q=rates)
def test_more_noise_never_costs_more_privacy(z, factor, q):
    for accountant in ACCOUNTANTS:
        low_noise = compute_epsilon(accountant, [(z, 20)], q, 1e-5, value_discretization=1e-3)
        high_noise = compute_epsilon(
            accountant, [(z * factor, 20)], q, 1e-5, value_discretization=1e-3
        )
        assert high_noise.epsilon <= low_noise.epsilon + 1e-9


@settings(max_examples=5, deadline=None)
@given(z=st.floats(min_value=0.4, max_value=0.7), steps=st.integers(5_000, 20_000))
def test_clt_never_exceeds_the_certified_epsilon_at_b1(z, steps):
    clt = compute_epsilon("clt", [(z, steps)], P_B1, DELTA_B1).epsilon
    pld = compute_epsilon("pld", [(z, steps)], P_B1, DELTA_B1, value_discretization=1e-3).epsilon
    assert clt <= pld


def test_rdp_leaves_non_converging_orders_out_without_a_warning_per_order(caplog):
    import logging

    from dpdl.accounting.certified import compute_epsilon as epsilon_of

    with caplog.at_level(logging.WARNING):
        report = epsilon_of("rdp", np.full(4, 0.661385), 0.05, 1e-4)
    assert np.isfinite(report.epsilon) and report.epsilon > 0
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
