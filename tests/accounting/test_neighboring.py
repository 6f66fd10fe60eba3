"""The neighbouring relation (issue 38, Major 3): replace-one accounted as dp_accounting's
``REPLACE_ONE`` (MATH.md Conventions, §1.3, §2), add-remove as before, and bad relations refused.

Reference numbers come from dp_accounting itself (``PLDAccountant(REPLACE_ONE)`` composing
``PoissonSampledDpEvent(q, GaussianDpEvent(z))``) or from closed forms, never from dpdl.
"""

from __future__ import annotations

import math

import dp_accounting as dpa
import numpy as np
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as dp_pld

from dpdl.accounting import _pld_gaussian
from dpdl.accounting.certified import compute_delta, compute_epsilon, epsilon_report
from dpdl.accounting.gdp import clt_mu_total, epsilon_from_delta
from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import calibrate, make_schedule
from dpdl.errors import DPDLError

REPLACE = NeighboringRelation.REPLACE_ONE


def dp_accounting_epsilon(runs, q: float, delta: float, grid: float = 1e-4) -> float:
    """dp_accounting's PLD ε of Poisson(q)-subsampled Gaussian steps ``runs`` = [(z, count)]
    under REPLACE_ONE, composed run by run."""
    accountant = pld_privacy_accountant.PLDAccountant(
        neighboring_relation=REPLACE, value_discretization_interval=grid)
    for z, count in runs:
        accountant.compose(dpa.PoissonSampledDpEvent(q, dpa.GaussianDpEvent(z)), count)
    return accountant.get_epsilon(delta)


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message, message
    return message


# ------------------------------------------------------------------ the PMF builder itself
@pytest.mark.parametrize(("z", "q", "grid"), [(1.5, 0.04, 1e-3), (0.8, 0.01, 1e-3),
                                              (2.0, 1.0, 1e-3), (5.0, 0.01, 1e-4),
                                              (0.6, 0.3, 1e-3)])  # fmt: skip
def test_replace_one_pmf_is_dp_accounting_construction(z, q, grid):
    mine, other = _pld_gaussian.subsampled_gaussian_pmfs(z, q, grid, relation="replace-one")
    reference = dp_pld.from_gaussian_mechanism(
        z, sampling_prob=q, pessimistic_estimate=True, value_discretization_interval=grid,
        neighboring_relation=REPLACE)
    assert other is None and reference._symmetric  # one direction: the pair is symmetric
    theirs = reference._pmf_remove.to_dense_pmf()
    assert mine.lower_index == theirs._lower_loss
    assert mine.probs.size == theirs.size
    np.testing.assert_allclose(mine.probs, theirs._probs, rtol=0, atol=1e-10)
    assert mine.infinity_mass == pytest.approx(theirs._infinity_mass, rel=1e-6, abs=1e-30)


# ------------------------------------------------------------------ ε against dp_accounting
@pytest.mark.parametrize(("q", "z", "steps"), [(8 / 71, 0.9, 300), (1 / 3000, 0.6, 3000),
                                               (0.04, 1.5, 50), (1.0, 3.0, 5),
                                               (0.01, 0.8, 1000)])  # fmt: skip
def test_replace_one_pld_epsilon_is_dp_accounting(q, z, steps):
    mine = compute_epsilon("pld", [(z, steps)], q, 1e-5, neighboring="replace-one")
    assert mine.neighboring == "replace-one" and mine.certified
    assert mine.epsilon == pytest.approx(dp_accounting_epsilon([(z, steps)], q, 1e-5), rel=1e-6)


def test_heterogeneous_replace_one_schedule_is_dp_accounting_one_run_at_a_time():
    runs, q = [(0.7, 40), (0.9, 60), (1.4, 100)], 0.05
    mine = compute_epsilon("pld", runs, q, 1e-5, neighboring="replace-one").epsilon
    assert mine == pytest.approx(dp_accounting_epsilon(runs, q, 1e-5), rel=1e-6)
    delta = compute_delta("pld", runs, q, mine, neighboring="replace-one").delta
    assert delta == pytest.approx(1e-5, rel=1e-3)


def test_binned_replace_one_brackets_the_exact_composition():
    z = 1.0 / (1.2 * 2.0 ** (np.arange(400) / 400))  # Dyn[μ]'s shape, 400 distinct steps
    exact = compute_epsilon("pld", z, 0.02, 1e-5, neighboring="replace-one").epsilon
    binned = compute_epsilon("pld", z, 0.02, 1e-5, mode="binned", bins=50,
                             neighboring="replace-one")  # fmt: skip
    assert binned.epsilon_lower <= exact * (1 + 1e-9) and exact <= binned.epsilon * (1 + 1e-9)


def test_at_full_batch_replace_one_is_the_gaussian_of_twice_the_sensitivity():
    """q = 1: N(−1, z²) against N(1, z²) per step, K steps: μ = 2√K / z exactly (MATH.md §1.2)."""
    z, steps, delta = 4.0, 9, 1e-5
    exact = epsilon_from_delta(delta, 2 * math.sqrt(steps) / z)
    mine = compute_epsilon("pld", [(z, steps)], 1.0, delta, neighboring="replace-one").epsilon
    assert mine == pytest.approx(exact, abs=2e-3)  # the PLD grid is pessimistic by ~1e-4·K
    assert mine >= exact


def test_replace_one_never_costs_less_than_add_remove():
    for q, z in ((0.01, 0.8), (0.2, 2.0), (1.0, 5.0)):
        runs = [(z, 200)]
        add_remove = compute_epsilon("pld", runs, q, 1e-5).epsilon
        replace_one = compute_epsilon("pld", runs, q, 1e-5, neighboring="replace-one").epsilon
        assert replace_one >= add_remove


def test_default_preset_schedules_under_replace_one():
    """adjacency_replace.py: the default preset's (digits, b = 8, J_min = 71, K = 300, δ = 1e-4)
    schedules calibrated to 0.3 / 1 / 2 under add/remove have replace-one ε 0.651 / 2.156 /
    4.276 (dp_accounting)."""
    q = 8 / 71
    for target, replace_one in ((0.3, 0.651), (1.0, 2.156), (2.0, 4.276)):
        schedule = make_schedule("const-d2p", epsilon=target, delta=1e-4, steps=300,
                                 sample_rate=q)  # fmt: skip
        assert schedule.neighboring == "add-remove"
        z = float(schedule.noise_multipliers[0])
        reference = dp_accounting_epsilon([(z, 300)], q, 1e-4)
        assert reference == pytest.approx(replace_one, abs=1e-3)
        mine = compute_epsilon("pld", [(z, 300)], q, 1e-4, neighboring="replace-one").epsilon
        assert mine == pytest.approx(reference, rel=1e-6)


# ------------------------------------------------------------------ calibration
@pytest.mark.parametrize("algorithm", ["const-d2p", "dyn-d2p"])
def test_calibration_under_replace_one_reaches_the_target(algorithm):
    q, steps, target, delta = 8 / 71, 60, 1.0, 1e-4
    schedule = make_schedule(algorithm, epsilon=target, delta=delta, steps=steps, sample_rate=q,
                             neighboring="replace-one")  # fmt: skip
    assert schedule.neighboring == "replace-one" and schedule.calibrated_with == "pld"
    multipliers, counts = np.unique(schedule.noise_multipliers, return_counts=True)
    reference = dp_accounting_epsilon(zip(multipliers, counts.tolist(), strict=True), q, delta)
    assert target * (1 - 3e-3) <= reference <= target * (1 + 1e-9)
    # σ is calibrated for the relation: more noise than the add/remove calibration needs
    add_remove = make_schedule(algorithm, epsilon=target, delta=delta, steps=steps,
                               sample_rate=q)  # fmt: skip
    assert np.all(schedule.sigma > add_remove.sigma)


def test_clt_calibration_under_replace_one_is_its_own_term():
    """The CLT term of replace-one is 2(e^{μ²} − e^{−μ²}) (MATH.md §1.3): ≈ (2μ)² for small μ,
    i.e. sensitivity 2C; the CLT schedule hits its own target exactly."""
    steps, z = 50, 30.0
    assert clt_mu_total(1.0, noise_multipliers=[z] * steps, neighboring="replace-one") == (
        pytest.approx(2 * math.sqrt(steps) / z, rel=1e-3))
    schedule = make_schedule("const-d2p", epsilon=1.0, delta=1e-4, steps=300, sample_rate=0.05,
                             calibrate="clt", neighboring="replace-one")  # fmt: skip
    report = schedule.epsilon("clt")
    assert report.neighboring == "replace-one" and not report.certified
    assert report.epsilon == pytest.approx(1.0, rel=1e-9)


# ------------------------------------------------------------------ the ledger
def test_ledger_holds_the_schedule_to_its_relation_and_names_it():
    schedule = make_schedule("const-d2p", epsilon=1.0, delta=1e-5, steps=100, sample_rate=0.05,
                             neighboring="replace-one")  # fmt: skip
    ledger = PrivacyLedger.for_schedule(schedule)
    assert ledger.neighboring == "replace-one"
    ledger.record_steps(schedule.noise_multipliers)
    z = float(schedule.noise_multipliers[0])
    assert ledger.epsilon_spent() == pytest.approx(dp_accounting_epsilon([(z, 100)], 0.05, 1e-5),
                                                   rel=1e-6)  # fmt: skip
    saved = ledger.to_dict()
    assert saved["neighboring"] == "replace-one"
    assert PrivacyLedger.from_dict(saved).epsilon_spent() == ledger.epsilon_spent()
    del saved["neighboring"]  # a ledger written before the relation was recorded: add/remove
    old = PrivacyLedger.from_dict({**saved, "approved_plan": None, "epsilon_budget": 10.0})
    assert old.neighboring == "add-remove"
    assert old.epsilon_spent() < ledger.epsilon_spent()


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("relation", ["replace", "add/remove", None, 1])
def test_an_unknown_relation_is_a_one_line_error_naming_it(relation):
    calls = [
        lambda: compute_epsilon("pld", [(1.0, 10)], 0.1, 1e-5, neighboring=relation),
        lambda: epsilon_report("pld", np.ones(10), 0.1, 1e-5, neighboring=relation),
        lambda: make_schedule("const-d2p", epsilon=1.0, delta=1e-5, steps=10, sample_rate=0.1,
                              neighboring=relation),
        lambda: PrivacyLedger(0.1, 1e-5, 1.0, neighboring=relation),
    ]
    for call in calls:
        with pytest.raises(DPDLError) as excinfo:
            call()
        assert f"unknown neighbouring relation {relation!r}" in one_line(excinfo)


# ------------------------------------------------------------------ replace-one RDP
def brute_force_rdp(q: float, sigma: float, order: float, reverse: bool = False) -> float:
    """ln ∫ p^α r^{1−α} / (α − 1) for p = (1 − q)N(0, σ²) + qN(−1, σ²), r the same at +1, at 20
    digits over 30 panels (mpmath's tanh-sinh; 40 digits and 400 panels agree to the last
    float64 digit), independent of dpdl's quadrature."""
    mp = pytest.importorskip("mpmath")
    with mp.workdps(20):
        q, s, a = mp.mpf(q), mp.mpf(sigma), mp.mpf(order)

        def phi(x, mean):
            return mp.exp(-((x - mean) ** 2) / (2 * s * s)) / (s * mp.sqrt(2 * mp.pi))

        def mixture(x, shift):
            return (1 - q) * phi(x, 0) + q * phi(x, shift)

        first, second = (1, -1) if reverse else (-1, 1)
        points = mp.linspace(-a - 2 - 20 * s, 2 + 20 * s, 30)
        value = mp.quad(lambda x: mixture(x, first) ** a * mixture(x, second) ** (1 - a), points)
        return float(mp.log(value) / (a - 1))


@pytest.mark.parametrize(("q", "sigma", "orders"), [(0.05, 1.0, (1.5, 8.0)), (8 / 71, 12.0, (2.0,)),
                                                     (0.01, 0.8, (2.0, 32.0))])  # fmt: skip
def test_replace_one_rdp_is_the_renyi_divergence_of_the_pair(q, sigma, orders):
    from dpdl.accounting._rdp_replace import ORDERS, rdp_replace_one

    curve = np.asarray(rdp_replace_one(sigma, q))
    for order in orders:
        (index,) = np.flatnonzero(ORDERS == order)
        exact = brute_force_rdp(q, sigma, order)
        # an upper estimate: the quadrature's error estimate (~1e-9 of A) is added
        assert exact * (1 - 1e-12) <= curve[index] <= exact * (1 + 1e-6) + 1e-8


def test_replace_one_rdp_pair_is_symmetric_and_exact_at_full_batch():
    from dpdl.accounting._rdp_replace import ORDERS, rdp_replace_one

    # swapping the pair (x -> -x) leaves the divergence unchanged: one direction suffices
    assert brute_force_rdp(0.1, 0.9, 4.0) == pytest.approx(
        brute_force_rdp(0.1, 0.9, 4.0, reverse=True), rel=1e-12)
    # q = 1: N(-1, s^2) against N(1, s^2), an order-a divergence of 2a / s^2
    np.testing.assert_allclose(rdp_replace_one(2.0, 1.0), 2 * ORDERS / 4.0, rtol=1e-15)


def test_the_antipodal_pair_dominates_every_other_replacement():
    """Replacing a record whose clipped contribution is a by one whose contribution is b
    (|a|, |b| <= 1) gives the pair (1 - q)N(0) + qN(a) / (1 - q)N(0) + qN(b); the divergence
    grows with the angle between a and b and is largest for b = -a (the pair accounted)."""
    q, sigma, order = 0.2, 0.8, 3.0
    axis = np.linspace(-8.0, 8.0, 1601)
    x, y = np.meshgrid(axis, axis, indexing="ij")

    def density(center):
        unsampled = np.exp(-(x**2 + y**2) / (2 * sigma**2))
        sampled = np.exp(-((x - center[0]) ** 2 + (y - center[1]) ** 2) / (2 * sigma**2))
        return ((1 - q) * unsampled + q * sampled) / (2 * np.pi * sigma**2)

    def divergence(angle):
        p, r = density((1.0, 0.0)), density((np.cos(angle), np.sin(angle)))
        integral = np.sum(p**order * r ** (1 - order)) * (axis[1] - axis[0]) ** 2
        return math.log(integral) / (order - 1)

    values = [divergence(angle) for angle in np.linspace(0.0, np.pi, 7)]
    assert values[0] == pytest.approx(0.0, abs=1e-9)
    assert all(b > a for a, b in zip(values, values[1:], strict=False))
    assert values[-1] == pytest.approx(brute_force_rdp(q, sigma, order), rel=1e-6)


@pytest.mark.parametrize(("q", "z", "steps"), [(8 / 71, 12.4, 300), (0.04, 1.5, 50),
                                               (0.01, 0.8, 1000)])  # fmt: skip
def test_replace_one_rdp_bounds_the_pld_epsilon_from_above(q, z, steps):
    rdp = compute_epsilon("rdp", [(z, steps)], q, 1e-5, neighboring="replace-one")
    assert rdp.neighboring == "replace-one" and rdp.certified
    reference = dp_accounting_epsilon([(z, steps)], q, 1e-5)  # (almost) exact
    assert reference <= rdp.epsilon <= 1.3 * reference
    delta = compute_delta("rdp", [(z, steps)], q, rdp.epsilon, neighboring="replace-one").delta
    assert delta <= 1e-5 * (1 + 1e-6)


def test_calibration_with_rdp_under_replace_one_holds_the_target():
    schedule = make_schedule("const-d2p", epsilon=1.0, delta=1e-4, steps=300, sample_rate=8 / 71,
                             calibrate="rdp", neighboring="replace-one")  # fmt: skip
    assert 1.0 * (1 - 3e-3) <= schedule.epsilon("rdp").epsilon <= 1.0
    z = float(schedule.noise_multipliers[0])
    assert dp_accounting_epsilon([(z, 300)], 8 / 71, 1e-4) <= 1.0
    result = calibrate("const-d2p", epsilon=1.0, delta=1e-5, steps=10, sample_rate=0.1,
                       neighboring="replace-one")  # fmt: skip
    assert sorted(result.reports) == ["clt", "pld", "rdp"]
    assert {r.neighboring for r in result.reports.values()} == {"replace-one"}
    assert result.to_dict()["neighboring"] == "replace-one"
