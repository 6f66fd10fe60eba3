"""Calibration under clt, pld and rdp (MATH.md §2), checked against dp_accounting directly."""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdl.accounting.calibration import calibrate_noise_scale, calibrate_safe
from dpdl.accounting.certified import epsilon_report
from dpdl.accounting.gdp import mu_from_epsilon_delta
from dpdl.accounting.schedules import ShapeOptions, calibrate, make_schedule
from dpdl.errors import DPDLError


def event(z, p, count):
    step = dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(z))
    return dp_event.SelfComposedDpEvent(step, count)


def library_pld_epsilon(runs, p, delta, discretization=1e-4):
    """dp_accounting's PLD accountant on [(z, count), ...] (add/remove, pessimistic)."""
    accountant = pld_privacy_accountant.PLDAccountant(value_discretization_interval=discretization)
    for z, count in runs:
        accountant.compose(event(z, p, count))
    return accountant.get_epsilon(delta)


def library_rdp_epsilon(runs, p, delta):
    accountant = rdp_privacy_accountant.RdpAccountant()
    for z, count in runs:
        accountant.compose(event(z, p, count))
    return accountant.get_epsilon(delta)


# ----------------------------------------------------------------------------- clt
def test_clt_calibration_hits_the_target_exactly():
    shape = 2.0 ** (-np.arange(800) / 800)
    scale = calibrate_noise_scale(
        shape, epsilon=0.5, delta=1e-5, sample_rate=0.02, accountant="clt"
    )
    mus = 1 / (scale * shape)
    mu_tot = 0.02 * math.sqrt(float(np.sum(np.exp(mus**2) - 1)))
    assert mu_tot == pytest.approx(mu_from_epsilon_delta(0.5, 1e-5), rel=1e-9)


def test_calibrate_rejects_bad_input():
    with pytest.raises(DPDLError, match="unknown accountant 'prv'"):
        calibrate_noise_scale(np.ones(3), epsilon=1, delta=1e-5, sample_rate=0.1, accountant="prv")
    with pytest.raises(DPDLError, match="epsilon"):
        calibrate_noise_scale(np.ones(3), epsilon=0, delta=1e-5, sample_rate=0.1)
    with pytest.raises(DPDLError, match="shape"):
        calibrate_noise_scale(np.zeros(3), epsilon=1, delta=1e-5, sample_rate=0.1)
    with pytest.raises(DPDLError, match="unknown accountant"):
        calibrate(
            "const-d2p",
            report=("clt", "x"),
            epsilon=1.0,
            delta=1e-5,
            steps=3,
            sample_rate=0.1,
            calibrate="clt",
        )


def test_epsilon_report_without_noise_is_infinite():
    report = epsilon_report("clt", [1.0, 0.0], 0.1, 1e-5)
    assert report.epsilon == math.inf


# ----------------------------------------------------------------------------- certified
def test_pld_calibration_const_is_safe_and_tight_against_dp_accounting():
    p, steps, delta, target = 0.01, 1000, 1e-5, 1.0
    schedule = make_schedule(
        "const-d2p", epsilon=target, delta=delta, steps=steps, sample_rate=p, calibrate="pld"
    )
    z = float(schedule.noise_multipliers[0])
    assert schedule.calibrated_with == "pld"
    assert library_pld_epsilon([(z, steps)], p, delta) <= target * (1 + 1e-9)
    # Tight: 0.5 % less noise already breaks the target.
    assert library_pld_epsilon([(z * 0.995, steps)], p, delta) > target


def test_pld_calibration_inverts_the_spec_oracles():
    """MATH.md §2: at p = 4e-4, K = 1e4, δ = 1e-4, z = 0.491680 has PLD ε ≈ 2.26, 0.688360 ≈ 0.361.
    """
    for eps_pld, z_ref in [(2.26, 0.491680), (0.361, 0.688360)]:
        schedule = make_schedule(
            "const-d2p",
            epsilon=eps_pld,
            delta=1e-4,
            steps=10_000,
            sample_rate=4e-4,
            calibrate="pld",
        )
        assert schedule.noise_multipliers[0] == pytest.approx(z_ref, rel=5e-3)


def test_rdp_calibration_heterogeneous_against_dp_accounting():
    # dp_accounting's RDP takes ~50 ms per distinct event: keep the reference short.
    p, delta, target, steps = 0.05, 1e-5, 1.0, 12
    schedule = make_schedule(
        "dyn-mu-d2p",
        epsilon=target,
        delta=delta,
        steps=steps,
        sample_rate=p,
        options=ShapeOptions(rho_mu=3.0),
        calibrate="rdp",
    )
    runs = [(float(z), 1) for z in schedule.noise_multipliers]
    assert library_rdp_epsilon(runs, p, delta) <= target * (1 + 1e-6)
    looser = [(z * 0.99, 1) for z, _ in runs]
    assert library_rdp_epsilon(looser, p, delta) > target
    assert schedule.mu0 == pytest.approx(1 / schedule.noise_multipliers[0])


def test_pld_calibration_general_piecewise_against_dp_accounting():
    """A heterogeneous schedule with three distinct multipliers, so that dp_accounting can
    compose it exactly as three self-compositions."""
    p, delta, target = 0.01, 1e-5, 1.5
    noise_shape = np.repeat([1.0, 0.8, 0.6], 200)
    schedule = make_schedule(
        "general",
        epsilon=target,
        delta=delta,
        steps=600,
        sample_rate=p,
        options=ShapeOptions(clip_shape=np.ones(600), noise_shape=noise_shape),
        calibrate="pld",
    )
    scale = schedule.sigma_scale
    runs = [(scale * level, 200) for level in (1.0, 0.8, 0.6)]
    assert library_pld_epsilon(runs, p, delta) <= target * (1 + 1e-9)
    assert library_pld_epsilon([(z * 0.995, c) for z, c in runs], p, delta) > target


def test_blocked_pld_calibration_is_safe_for_exact():
    p, delta, target, steps = 0.05, 1e-5, 1.0, 60
    kw = {"epsilon": target, "delta": delta, "steps": steps, "sample_rate": p,
          "options": ShapeOptions(rho_mu=4.0)}
    blocked = make_schedule("dyn-mu-d2p", calibrate="pld", blocks=6, **kw)
    exact = make_schedule("dyn-mu-d2p", calibrate="pld", **kw)
    # The blocked bound is an upper bound: it needs at least as much noise as exact.
    assert blocked.noise_multipliers[0] > exact.noise_multipliers[0]
    assert exact.epsilon("pld").method == "pld-exact"
    assert blocked.epsilon("pld", mode="exact").epsilon <= target
    assert exact.epsilon("pld").epsilon <= target


def test_two_phase_calibration_of_a_long_schedule_against_dp_accounting():
    """K = 1000 distinct multipliers: coarse search, then the secant refinement under the
    blocked bound the caller asked for (B = 10), verified with dp_accounting composing the
    same dominating schedule (each block at its smallest multiplier)."""
    p, delta, target, steps, blocks = 0.01, 1e-5, 1.0, 1000, 10
    schedule = make_schedule(
        "dyn-mu-d2p",
        epsilon=target,
        delta=delta,
        steps=steps,
        sample_rate=p,
        options=ShapeOptions(rho_mu=2.0),
        calibrate="pld",
        blocks=blocks,
    )
    z = schedule.noise_multipliers
    assert np.all(np.diff(z) < 0)  # decreasing: block k's minimum is its last step
    runs = [(float(z[(k + 1) * 100 - 1]), 100) for k in range(blocks)]
    reference = library_pld_epsilon(runs, p, delta)
    assert reference <= target * (1 + 1e-9)
    assert reference >= target * (1 - 5e-3)  # refined to within epsilon_rtol = 2e-3 (+ grid)


def test_calibrate_reports_every_accountant_and_clt_understates():
    result = calibrate(
        "dyn-mu-d2p",
        report=("clt", "pld", "rdp"),
        epsilon=1.0,
        delta=1e-4,
        steps=30,
        sample_rate=2e-2,
        calibrate="pld",
    )
    reports = result.reports
    assert set(reports) == {"clt", "pld", "rdp"}
    assert reports["pld"].certified and reports["rdp"].certified
    assert not reports["clt"].certified
    assert reports["pld"].epsilon <= 1.0
    # b = 1 regime: the CLT is below the certified numbers; RDP is looser than PLD.
    assert reports["clt"].epsilon < reports["pld"].epsilon <= reports["rdp"].epsilon
    data = result.to_dict()
    assert set(data["epsilon"]) == {"clt", "pld", "rdp"} and data["mu0"] is not None


@settings(max_examples=4, deadline=None, derandomize=True)
@given(
    log10_p=st.floats(-3.3, -2.5),
    z=st.floats(0.5, 0.9),
    steps=st.integers(500, 3000),
)
def test_clt_never_exceeds_certified_pld_in_the_b1_regime(log10_p, z, steps):
    """MATH.md §1.3/§2: at small p and small multipliers the CLT understates ε."""
    p = 10.0**log10_p
    clt = epsilon_report("clt", np.full(steps, z), p, 1e-5)
    pld = epsilon_report("pld", np.full(steps, z), p, 1e-5)
    assert pld.certified and not clt.certified
    assert clt.epsilon <= pld.epsilon


def test_long_schedule_calibrates_with_the_binned_bound_by_default():
    """More than EXACT_MAX_DISTINCT distinct multipliers: PLD calibration uses the binned
    bound (issue 15), which needs less noise than 100 blocks by count and stays safe for the
    exact composition (the same construction as dp_accounting's, tested in test_certified)."""
    kw = {"epsilon": 1.0, "delta": 1e-5, "steps": 600, "sample_rate": 0.01,
          "options": ShapeOptions(rho_mu=2.0)}
    binned = make_schedule("dyn-mu-d2p", calibrate="pld", **kw)
    blocked = make_schedule("dyn-mu-d2p", calibrate="pld", blocks=100, **kw)
    report = binned.epsilon("pld")
    assert report.method == "pld-binned(bins=500)"
    assert report.epsilon_lower <= report.epsilon <= 1.0
    assert binned.noise_multipliers[0] < blocked.noise_multipliers[0]
    exact = binned.epsilon("pld", mode="exact", value_discretization=3e-4).epsilon
    assert exact <= report.epsilon <= 1.0


# ------------------------------------------------------------------ the one safe calibrator


@pytest.mark.parametrize("target", [0.3, 1.0, 7.0])
def test_calibrate_safe_falling_epsilon_lands_on_the_safe_side_of_the_closed_form(target):
    seen = []

    def epsilon_of(sigma):
        seen.append(sigma)
        return 2.0 / sigma  # root at 2 / target

    sigma = calibrate_safe(epsilon_of, target, (0.01, 1.0), xtol=1e-10)
    assert epsilon_of(sigma) <= target
    assert sigma == pytest.approx(2.0 / target, rel=1e-9)
    assert sigma in seen[:-1]  # returned only after being evaluated


def test_calibrate_safe_rising_epsilon_returns_the_largest_safe_parameter():
    eps0 = calibrate_safe(lambda e: e * e, 2.0, (1e-6, 10.0), log_scale=False, xtol=1e-13)
    assert eps0 * eps0 <= 2.0
    assert eps0 == pytest.approx(math.sqrt(2.0), abs=1e-12)


def test_calibrate_safe_at_a_jump_returns_a_point_past_it():
    # ε jumps at 1.2345: no point below it is safe, whatever brentq interpolates
    sigma = calibrate_safe(lambda s: 1.0 if s < 1.2345 else 0.5, 0.75, (0.1, 10.0), xtol=1e-12)
    assert 1.2345 <= sigma < 1.2345 * (1 + 1e-9)


def test_calibrate_safe_expands_the_safe_end_and_fails_closed():
    assert calibrate_safe(lambda s: 1 / s, 0.01, (0.1, 0.2)) == pytest.approx(100.0, rel=1e-9)
    with pytest.raises(DPDLError, match="no parameter reaches epsilon"):
        calibrate_safe(lambda s: 2.0 + 1 / s, 0.5, (0.1, 1.0), max_expansions=3)


def test_calibrate_safe_pushes_a_safe_lower_end_outwards_on_a_log_scale_only():
    assert calibrate_safe(lambda s: 1 / s, 100.0, (0.5, 2.0)) == pytest.approx(0.01, rel=1e-9)
    # on a linear scale the bracket's end is the caller's domain: returned as it is
    assert calibrate_safe(lambda g: 1 / g, 100.0, (0.5, 0.9), log_scale=False) == 0.5


def test_calibrate_safe_an_end_exactly_at_the_target_is_the_answer():
    assert calibrate_safe(lambda x: 2 / x, 1.0, (1.0, 2.0)) == 2.0
    assert calibrate_safe(lambda x: 1 / x, 0.6, (1.0, 1.7), epsilon_rtol=0.1) == 1.7


@pytest.mark.parametrize(
    ("epsilon_of", "bracket", "kwargs", "needle"),
    [
        (lambda x: 1 / x, (0.0, 1.0), {}, "log-scale bracket must be positive"),
        (lambda x: 1 / x, (2.0, 1.0), {}, "bracket must be increasing"),
        (lambda x: 1.0, (1.0, 2.0), {}, "at both ends"),
        (lambda x: float("nan"), (1.0, 2.0), {}, "NaN"),
        (lambda x: 1 / x if x < 1.5 or x > 1.9 else float("nan"), (1.0, 2.0), {}, "NaN"),
    ],
)
def test_calibrate_safe_refuses_with_one_line(epsilon_of, bracket, kwargs, needle):
    with pytest.raises(DPDLError, match=needle):
        calibrate_safe(epsilon_of, 0.55, bracket, **kwargs)
