"""Schedules of the Dyn-D2P family (MATH.md §2): oracles, the table, eq. 8-10, the factory."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpdl.accounting.gdp import (
    clt_noise_scale,
    mu0_from_mu_total,
    mu_bar_from_mu_total,
    mu_from_epsilon_delta,
    sigma_scale_from_mu_total,
)
from dpdl.accounting.schedules import (
    ALGORITHMS,
    ShapeOptions,
    constant_clip,
    exponential_budget,
    exponential_clip,
    make_schedule,
    noise_from_budget,
    uniform_budget,
)
from dpdl.errors import DPDLError

P, K, DELTA = 1 / 2500, 10_000, 1e-4


def clt_lhs(mus, p=P):
    """eq. 6 written out directly (no shared code with the module)."""
    return p * math.sqrt(float(np.sum(np.exp(np.asarray(mus) ** 2) - 1)))


def test_mu_bar_oracle():
    mu_tot = mu_from_epsilon_delta(1.0, DELTA)
    assert mu_bar_from_mu_total(mu_tot, K, P) == pytest.approx(2.033842, abs=1e-6)


@pytest.mark.parametrize(("epsilon", "ratio"), [(1.0, 0.491680), (0.3, 0.688360), (3.0, 0.406986)])
def test_const_noise_multiplier_oracles(epsilon, ratio):
    schedule = make_schedule(
        "const-d2p", epsilon=epsilon, delta=DELTA, steps=K, sample_rate=P, calibrate="clt"
    )
    np.testing.assert_allclose(schedule.sigma / schedule.clip, ratio, atol=1e-6)
    np.testing.assert_allclose(schedule.noise_multipliers, ratio, atol=1e-6)
    assert schedule.mu_bar == pytest.approx(1 / ratio, rel=2e-6)


def test_dyn_mu_oracle_mu0():
    schedule = make_schedule(
        "dyn-mu-d2p", epsilon=1.0, delta=DELTA, steps=K, sample_rate=P,
        options=ShapeOptions(rho_mu=2), calibrate="clt",
    )
    assert schedule.mu0 == pytest.approx(1.23087, abs=1e-5)
    assert schedule.mu_bar is None
    # eq. 8 holds for the returned μ_k, computed independently of the module.
    assert clt_lhs(schedule.mu) == pytest.approx(mu_from_epsilon_delta(1.0, DELTA), rel=1e-9)
    assert schedule.mu_tot == pytest.approx(mu_from_epsilon_delta(1.0, DELTA), rel=1e-9)


def test_mu0_bracketed_by_mu_bar():
    mu_tot = mu_from_epsilon_delta(1.0, DELTA)
    mu_bar = mu_bar_from_mu_total(mu_tot, K, P)
    for rho in [1.01, 2.0, 10.0, 100.0]:
        mu0 = mu0_from_mu_total(mu_tot, K, P, rho)
        assert mu_bar / rho < mu0 < mu_bar
        assert clt_lhs(mu0 * rho ** (np.arange(K) / K)) == pytest.approx(mu_tot, rel=1e-9)


def test_table_of_section_2():
    """The clip / budget / noise columns of every algorithm in MATH.md §2's table."""
    kw = {"epsilon": 1.0, "delta": DELTA, "steps": 1000, "sample_rate": 0.01, "calibrate": "clt"}
    k = np.arange(1000) / 1000
    dyn = make_schedule("dyn-d2p", options=ShapeOptions(clip0=3.0, rho_c=4.0, rho_mu=5.0), **kw)
    np.testing.assert_allclose(dyn.clip, 3.0 * 4.0 ** (-k), rtol=1e-13)
    np.testing.assert_allclose(dyn.mu, dyn.mu0 * 5.0**k, rtol=1e-12)
    np.testing.assert_allclose(dyn.sigma, dyn.clip / dyn.mu, rtol=1e-12)

    dyn_c = make_schedule("dyn-c-d2p", options=ShapeOptions(clip0=3.0, rho_c=4.0), **kw)
    np.testing.assert_allclose(dyn_c.clip, 3.0 * 4.0 ** (-k), rtol=1e-13)
    np.testing.assert_allclose(dyn_c.mu, dyn_c.mu_bar, rtol=1e-13)
    np.testing.assert_allclose(dyn_c.sigma, dyn_c.clip / dyn_c.mu_bar, rtol=1e-12)

    dyn_mu = make_schedule("dyn-mu-d2p", options=ShapeOptions(clip=0.7, rho_mu=5.0), **kw)
    np.testing.assert_allclose(dyn_mu.clip, 0.7)
    np.testing.assert_allclose(dyn_mu.sigma, 0.7 / (dyn_mu.mu0 * 5.0**k), rtol=1e-12)
    # Dyn-D2P and Dyn[μ] share the budget schedule (the clip cancels in z_k).
    assert dyn.mu0 == pytest.approx(dyn_mu.mu0, rel=1e-12)

    const = make_schedule("const-d2p", options=ShapeOptions(clip=0.7), **kw)
    np.testing.assert_allclose(const.sigma, 0.7 / const.mu_bar, rtol=1e-13)
    assert const.mu_bar == pytest.approx(dyn_c.mu_bar, rel=1e-13)
    closed = math.sqrt(math.log(mu_from_epsilon_delta(1.0, DELTA) ** 2 / (1000 * 0.01**2) + 1))
    assert const.mu_bar == pytest.approx(closed, rel=1e-12)
    for schedule in (dyn, dyn_c, dyn_mu, const):
        assert schedule.private and schedule.calibrated_with == "clt"


def test_general_form_eq10_and_corollary1():
    mu_tot = mu_from_epsilon_delta(1.0, DELTA)
    rng = np.random.default_rng(0)
    clip = rng.uniform(0.5, 2.0, 500)
    shape = rng.uniform(0.2, 1.0, 500)
    scale = sigma_scale_from_mu_total(mu_tot, 0.02, clip, shape)
    assert clt_lhs(clip / (scale * shape), p=0.02) == pytest.approx(mu_tot, rel=1e-9)

    kw = {"epsilon": 1.0, "delta": DELTA, "steps": 2000, "sample_rate": 0.005, "calibrate": "clt"}
    general = make_schedule(
        "general",
        options=ShapeOptions(clip_shape=clip[:1] * np.ones(2000), noise_shape=np.ones(2000)),
        **kw,
    )
    const = make_schedule("const-d2p", options=ShapeOptions(clip=float(clip[0])), **kw)
    np.testing.assert_allclose(general.sigma, const.sigma, rtol=1e-9)
    # Corollary 1's default instance gives the same multipliers as Dyn-D2P (ρ_c ρ_μ / ρ_c = ρ_μ).
    corollary = make_schedule("general", options=ShapeOptions(rho_c=3.0, rho_mu=2.0), **kw)
    dyn = make_schedule("dyn-d2p", options=ShapeOptions(rho_c=3.0, rho_mu=2.0), **kw)
    np.testing.assert_allclose(corollary.noise_multipliers, dyn.noise_multipliers, rtol=1e-9)
    np.testing.assert_allclose(corollary.clip, dyn.clip, rtol=1e-13)
    assert corollary.sigma_scale == pytest.approx(1 / dyn.mu0, rel=1e-9)


def test_shape_helpers():
    np.testing.assert_array_equal(constant_clip(2.0, 3), [2.0, 2.0, 2.0])
    np.testing.assert_allclose(exponential_clip(1.0, 2.0, 2), [1.0, 2**-0.5])
    np.testing.assert_array_equal(uniform_budget(0.5, 2), [0.5, 0.5])
    np.testing.assert_allclose(exponential_budget(1.0, 4.0, 2), [1.0, 2.0])
    np.testing.assert_allclose(noise_from_budget([1.0, 2.0], [0.5, 4.0]), [2.0, 0.5])
    assert clt_noise_scale(0.5, 0.01, np.full(10, 2.0)) == pytest.approx(
        1 / (2.0 * mu_bar_from_mu_total(0.5, 10, 0.01)), rel=1e-12
    )


def test_sgp_is_non_private():
    schedule = make_schedule("sgp", epsilon=None, delta=None, steps=50, sample_rate=0.1)
    assert not schedule.private
    assert schedule.clip is None and schedule.mu is None
    np.testing.assert_array_equal(schedule.sigma, np.zeros(50))
    np.testing.assert_array_equal(schedule.noise_multipliers, np.zeros(50))


def test_schedule_epsilon_under_clt_hits_the_target():
    schedule = make_schedule(
        "dyn-mu-d2p", epsilon=0.7, delta=1e-5, steps=3000, sample_rate=0.003, calibrate="clt"
    )
    report = schedule.epsilon("clt")
    assert report.epsilon == pytest.approx(0.7, rel=1e-8)
    assert report.certified is False and report.accountant == "clt"
    assert schedule.epsilon("clt", steps=1500).epsilon < 0.7
    with pytest.raises(DPDLError, match="exceeds"):
        schedule.epsilon("clt", steps=3001)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_listed_algorithm_builds_its_schedule(algorithm):
    """Each name make_schedule advertises builds a schedule of that name that meets its target
    (sgp: no noise); a name outside the list is refused."""
    schedule = make_schedule(
        algorithm, epsilon=1.0, delta=DELTA, steps=200, sample_rate=0.01, calibrate="clt"
    )
    assert schedule.algorithm == algorithm and len(schedule.sigma) == 200
    if algorithm == "sgp":
        assert not schedule.sigma.any()
    else:
        assert (schedule.sigma > 0).all()
        assert schedule.epsilon("clt").epsilon == pytest.approx(1.0, rel=1e-8)


BASE = {"epsilon": 1.0, "delta": DELTA, "steps": 100, "sample_rate": 0.01, "calibrate": "clt"}


@pytest.mark.parametrize(
    ("algorithm", "changes", "needle"),
    [
        ("dyn-x", {}, "unknown algorithm 'dyn-x'"),
        ("const-d2p", {"epsilon": 0.0}, "epsilon"),
        ("const-d2p", {"epsilon": None}, "epsilon"),
        ("const-d2p", {"delta": 1.0}, "delta"),
        ("const-d2p", {"steps": 0}, "steps"),
        ("const-d2p", {"sample_rate": 0.0}, "sample_rate"),
        ("const-d2p", {"sample_rate": 1.5}, "sample_rate"),
        ("dyn-mu-d2p", {"options": ShapeOptions(rho_mu=0.99)}, "rho_mu"),
        ("dyn-d2p", {"options": ShapeOptions(rho_c=0.5)}, "rho_c"),
        ("const-d2p", {"options": ShapeOptions(clip=-1.0)}, "clip"),
        ("const-d2p", {"calibrate": "moments"}, "unknown accountant 'moments'"),
        ("general", {"options": ShapeOptions(clip_shape=[1.0, 2.0])}, "clip_shape has length 2"),
        ("general", {"options": ShapeOptions(noise_shape=-np.ones(100))}, "noise_shape"),
    ],
)
def test_bad_input(algorithm, changes, needle):
    with pytest.raises(DPDLError, match=needle):
        make_schedule(algorithm, **{**BASE, **changes})


@settings(max_examples=30, deadline=None)
@given(
    epsilon=st.floats(0.1, 8.0),
    log10_p=st.floats(-4.0, -0.5),
    steps=st.integers(1, 5000),
    rho=st.floats(1.05, 20.0),
    algorithm=st.sampled_from(["const-d2p", "dyn-c-d2p", "dyn-mu-d2p", "dyn-d2p", "general"]),
)
def test_clt_calibration_always_meets_eq6(epsilon, log10_p, steps, rho, algorithm):
    p = 10.0**log10_p
    schedule = make_schedule(
        algorithm,
        epsilon=epsilon,
        delta=1e-5,
        steps=steps,
        sample_rate=p,
        options=ShapeOptions(rho_c=rho, rho_mu=rho),
        calibrate="clt",
    )
    mu_tot = mu_from_epsilon_delta(epsilon, 1e-5)
    log_sum = float(np.log(np.sum(np.expm1(np.minimum(schedule.mu, 26.0) ** 2))))
    if np.all(schedule.mu < 26.0):  # beyond that exp overflows in the plain reference
        assert math.log(p) + 0.5 * log_sum == pytest.approx(math.log(mu_tot), abs=1e-8)
    assert np.all(np.diff(schedule.mu) >= -1e-12)  # budgets never shrink
    np.testing.assert_allclose(schedule.sigma, schedule.clip / schedule.mu, rtol=1e-12)


def test_rho_one_is_the_constant_schedule():
    kw = dict(epsilon=1.0, delta=DELTA, steps=200, sample_rate=0.05, calibrate="clt")
    flat = make_schedule("dyn-d2p", options=ShapeOptions(rho_c=1.0, rho_mu=1.0), **kw)
    const = make_schedule("const-d2p", **kw)
    np.testing.assert_allclose(flat.clip, const.clip, rtol=1e-12)
    np.testing.assert_allclose(flat.sigma, const.sigma, rtol=1e-9)
    with pytest.raises(DPDLError, match="rho_c must be a finite number >= 1"):
        make_schedule("dyn-d2p", options=ShapeOptions(rho_c=0.5, rho_mu=1.0), **kw)
