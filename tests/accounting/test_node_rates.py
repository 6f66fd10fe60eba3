"""Per-node sampling rates in the ledger (issue 27, item 4): every node's own ε at its own rate,
the worst equal to the ledger's ε; and the calibrators' progress callback.

The reference numbers come from dp_accounting's own accountants, composed here event by event.
"""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpdl.accounting.calibration import calibrate_safe
from dpdl.accounting.ledger import PrivacyLedger, accounted_node_rates
from dpdl.accounting.schedules import make_schedule
from dpdl.errors import DPDLError

DELTA, B = 1e-5, 4.0
SIZES = np.array([40, 90, 400, 90, 2000])  # very unequal nodes; two share a size
RATES = B / SIZES  # per-node sampling q_i = b / J_i; the worst is b / J_min


def library_epsilon(accountant, multipliers, q, delta=DELTA):
    """dp_accounting's PLD (grid 1e-4) or RDP of Poisson(q)-subsampled Gaussian steps."""
    if accountant == "pld":
        reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    else:
        reference = rdp_privacy_accountant.RdpAccountant()
    values, counts = np.unique(multipliers, return_counts=True)
    for z, count in zip(values, counts, strict=True):
        step = dp_event.PoissonSampledDpEvent(float(q), dp_event.GaussianDpEvent(float(z)))
        reference.compose(dp_event.SelfComposedDpEvent(step, int(count)))
    return reference.get_epsilon(delta)


def spent_ledger(algorithm, steps, calibrate="pld"):
    schedule = make_schedule(algorithm, epsilon=1.0, delta=DELTA, steps=steps,
                             sample_rate=float(RATES.max()), calibrate=calibrate)  # fmt: skip
    ledger = PrivacyLedger.for_schedule(schedule, node_sample_rates=RATES)
    ledger.record_steps(schedule.noise_multipliers)
    return schedule, ledger


@pytest.mark.parametrize(("accountant", "algorithm", "steps", "rtol"), [
    ("pld", "const-d2p", 400, 2e-3),  # exact PLD at the same grid: the tolerance of test_ledger
    ("rdp", "dyn-d2p", 8, 1e-9),  # heterogeneous multipliers, the same library underneath
])  # fmt: skip
def test_each_nodes_epsilon_is_the_accountants_at_its_own_rate(accountant, algorithm, steps, rtol):
    # calibrated with the CLT (fast); accounted with the certified accountant under test
    schedule, ledger = spent_ledger(algorithm, steps, "clt")
    reports = ledger.node_spent_reports(accountant, mode="exact")
    assert len(reports) == SIZES.size
    expected = {q: library_epsilon(accountant, schedule.noise_multipliers, q)
                for q in np.unique(RATES)}  # fmt: skip
    for q, report in zip(RATES, reports, strict=True):
        assert report.epsilon == pytest.approx(expected[q], rel=rtol)
    epsilons = [r.epsilon for r in reports]
    # the smallest node is the worst, and its epsilon is the ledger's (the one reported today)
    assert max(epsilons) == epsilons[0] == ledger.spent_report(accountant, mode="exact").epsilon
    assert epsilons[1] == epsilons[3]  # equal sizes, equal rates, one composition
    assert epsilons[4] < epsilons[2] < epsilons[1] < epsilons[0]


def test_more_distinct_rates_than_composed_are_rounded_up_never_down():
    rates = np.linspace(0.001, 0.02, 12)
    accounted = accounted_node_rates(rates, max_rates=4)
    assert np.unique(accounted).size == 4
    assert np.all(accounted >= rates) and accounted.max() == rates.max()
    np.testing.assert_array_equal(accounted_node_rates(rates[:4], max_rates=4), rates[:4])
    # rounded-up nodes get the epsilon of a larger rate: an upper bound of their own
    ledger = PrivacyLedger(0.02, DELTA, 10.0, node_sample_rates=rates)
    ledger.plan(np.full(100, 2.0))
    ledger.record_steps(np.full(100, 2.0))
    reports = ledger.node_spent_reports("rdp", max_rates=4, mode="exact")
    own = ledger.node_spent_reports("rdp", max_rates=12, mode="exact")
    assert all(r.epsilon >= o.epsilon for r, o in zip(reports, own, strict=True))
    assert sum(r.epsilon > o.epsilon for r, o in zip(reports, own, strict=True)) == 8
    assert reports[-1] == own[-1] == ledger.spent_report("rdp", mode="exact")


def test_node_rates_above_the_accounted_rate_are_refused_and_survive_json():
    with pytest.raises(DPDLError, match="node 1 samples at q = 0.5 above the accounted rate"):
        PrivacyLedger(0.1, DELTA, 1.0, node_sample_rates=[0.1, 0.5])
    with pytest.raises(DPDLError, match="not given the nodes' sampling rates"):
        PrivacyLedger(0.1, DELTA, 1.0).node_spent_reports()
    _, ledger = spent_ledger("const-d2p", 50)
    restored = PrivacyLedger.from_json(ledger.to_json())
    np.testing.assert_array_equal(restored.node_sample_rates, RATES)
    assert restored.node_spent_reports() == ledger.node_spent_reports()


# ----------------------------------------------------------------------------- progress
@pytest.mark.parametrize("accountant", ["pld", "clt"])
def test_calibration_progress_is_told_every_evaluation_and_ends_at_the_answer(accountant):
    calls = []
    schedule = make_schedule("const-d2p", epsilon=1.0, delta=DELTA, steps=300, sample_rate=0.02,
                             calibrate=accountant,
                             on_iteration=lambda *args: calls.append(args))  # fmt: skip
    *searching, (last_i, total, epsilon) = calls
    assert [i for i, _, _ in searching] == list(range(1, len(searching) + 1))
    assert all(t is None for _, t, _ in searching)
    assert total == last_i == len(searching)  # the last call says the search is over
    assert len(searching) >= (1 if accountant == "pld" else 0)
    # ... with the epsilon of the returned noise, under the accountant calibrated with
    assert epsilon == pytest.approx(schedule.epsilon(accountant).epsilon, rel=1e-9)
    assert epsilon <= 1.0 * (1 + 1e-9)


def test_calibrate_safe_reports_its_evaluations_and_its_answer():
    calls = []
    answer = calibrate_safe(lambda x: 1.0 / x, 0.25, (1.0, 2.0),
                            on_iteration=lambda *args: calls.append(args))  # fmt: skip
    *searching, (last_i, total, epsilon) = calls
    assert len(searching) >= 2 and total == last_i == len(searching)
    assert epsilon == 1.0 / answer <= 0.25 and math.isclose(answer, 4.0, rel_tol=1e-9)
