"""Privacy ledger: plans, fail-closed steps, ε spent, JSON round trip."""

import json
import math

import numpy as np
import pytest

from dpdl.accounting.gdp import epsilon_from_delta
from dpdl.accounting.ledger import (
    LEDGER_SCHEMA_VERSION,
    PrivacyLedger,
    run_length_decode,
    run_length_encode,
)
from dpdl.accounting.schedules import make_schedule
from dpdl.errors import DPDLError, PrivacyBudgetExceeded

P, DELTA = 0.01, 1e-5


def clt_epsilon(z, p=P, delta=DELTA):
    """eq. 6 then eq. 4 inverted, written out without the ledger's code path."""
    mu_tot = p * math.sqrt(float(np.sum(np.exp(1.0 / np.asarray(z) ** 2) - 1)))
    return epsilon_from_delta(delta, mu_tot)


@pytest.fixture
def schedule():
    return make_schedule(
        "dyn-mu-d2p", epsilon=1.0, delta=DELTA, steps=200, sample_rate=P, calibrate="clt"
    )


def test_run_length_round_trip():
    values = np.array([0.5, 0.5, 0.5, 1.0, 0.5, 2.0, 2.0])
    runs = run_length_encode(values)
    assert runs == [[0.5, 3], [1.0, 1], [0.5, 1], [2.0, 2]]
    np.testing.assert_array_equal(run_length_decode(runs), values)
    assert run_length_encode([]) == []


def test_plan_refuses_a_schedule_over_budget(schedule):
    tight = PrivacyLedger(P, DELTA, 0.99, accountant="clt")
    with pytest.raises(PrivacyBudgetExceeded, match="budget"):
        tight.plan(schedule.noise_multipliers)
    assert tight.planned_steps is None and tight.steps_taken == 0
    ledger = PrivacyLedger(P, DELTA, 1.0 + 1e-9, accountant="clt")
    report = ledger.plan(schedule.noise_multipliers)
    assert report.epsilon == pytest.approx(1.0, rel=1e-8)
    assert ledger.planned_steps == 200


def test_record_steps_follow_the_plan_and_fail_closed(schedule):
    z = schedule.noise_multipliers
    ledger = PrivacyLedger(P, DELTA, 1.0 + 1e-9, accountant="clt")
    ledger.plan(z)
    ledger.record_steps(z[:50])
    # Less noise than planned at step 50: refused, nothing recorded.
    with pytest.raises(PrivacyBudgetExceeded, match="step 50"):
        ledger.record_step(z[50] * 0.999)
    assert ledger.steps_taken == 50
    ledger.record_step(z[50] * 1.5)  # more noise than planned is fine
    ledger.record_steps(z[51:])
    assert ledger.epsilon_spent() < 1.0 + 1e-9
    with pytest.raises(PrivacyBudgetExceeded, match="beyond the approved plan"):
        ledger.record_step(100.0)
    assert ledger.steps_taken == 200
    recorded = np.concatenate([z[:50], [z[50] * 1.5], z[51:]])
    assert ledger.epsilon_spent() == pytest.approx(clt_epsilon(recorded), rel=1e-9)


def test_epsilon_spent_grows_and_starts_at_zero(schedule):
    ledger = PrivacyLedger(P, DELTA, 2.0, accountant="clt")
    assert ledger.epsilon_spent() == 0.0
    ledger.plan(schedule.noise_multipliers)
    spent = []
    for z in schedule.noise_multipliers[:40]:
        ledger.record_step(float(z))
        spent.append(ledger.epsilon_spent())
    assert all(b > a for a, b in zip(spent, spent[1:], strict=False))
    assert spent[-1] == pytest.approx(clt_epsilon(schedule.noise_multipliers[:40]), rel=1e-9)


def test_without_plan_every_step_is_accounted():
    ledger = PrivacyLedger(P, DELTA, 0.5, accountant="clt")
    z = 1.0
    allowed = 0
    with pytest.raises(PrivacyBudgetExceeded, match="would bring"):
        for _ in range(10_000):
            ledger.record_step(z)
            allowed += 1
    assert clt_epsilon(np.full(allowed, z)) <= 0.5 < clt_epsilon(np.full(allowed + 1, z))
    assert ledger.steps_taken == allowed


def test_step_without_noise_is_refused():
    ledger = PrivacyLedger(P, DELTA, 10.0, accountant="clt")
    with pytest.raises(PrivacyBudgetExceeded):
        ledger.record_step(0.0)
    assert ledger.steps_taken == 0


def test_json_round_trip_keeps_spent_privacy(schedule):
    ledger = PrivacyLedger(P, DELTA, 1.0 + 1e-9, accountant="clt")
    ledger.plan(schedule.noise_multipliers)
    ledger.record_steps(schedule.noise_multipliers[:120])
    text = ledger.to_json()
    data = json.loads(text)
    assert data["schema_version"] == LEDGER_SCHEMA_VERSION and data["steps_taken"] == 120
    loaded = PrivacyLedger.from_json(text)
    assert loaded.steps_taken == 120
    assert loaded.epsilon_spent() == pytest.approx(ledger.epsilon_spent(), rel=1e-12)
    assert loaded.planned_steps == 200
    loaded.record_steps(schedule.noise_multipliers[120:])
    with pytest.raises(PrivacyBudgetExceeded):
        loaded.record_step(100.0)
    # Re-planning after loading accounts the spent steps too: the same full schedule again
    # on top of 200 spent steps is refused.
    with pytest.raises(PrivacyBudgetExceeded):
        loaded.plan(schedule.noise_multipliers)


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d.pop("recorded"), "lacks"),
        (lambda d: d.update(steps_taken=0), "steps_taken"),
        (lambda d: d.update(recorded=[[1.0, -3]]), "malformed"),
        (lambda d: d.update(recorded=[["x", 3]]), "malformed"),
        (lambda d: d.update(accountant="moments"), "unknown accountant"),
        (lambda d: d.update(delta=2.0), "delta"),
        (lambda d: d.update(approved_plan=[[1.0, 1]]), "shorter"),
    ],
)
def test_malformed_json_is_refused(edit, needle):
    ledger = PrivacyLedger(P, DELTA, 5.0, accountant="clt")
    ledger.plan(np.ones(5))
    ledger.record_steps(np.ones(3))
    data = ledger.to_dict()
    edit(data)
    with pytest.raises(DPDLError, match=needle):
        PrivacyLedger.from_json(json.dumps(data))
    with pytest.raises(DPDLError, match="not valid JSON"):
        PrivacyLedger.from_json("{broken")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((0.0, 1e-5, 1.0), "sample_rate"),
        ((0.1, 0.0, 1.0), "delta"),
        ((0.1, 1e-5, 0.0), "epsilon_budget"),
        ((0.1, 1e-5, 1.0, "prv"), "unknown accountant"),
    ],
)
def test_bad_construction(args, needle):
    with pytest.raises(DPDLError, match=needle):
        PrivacyLedger(*args)


def test_bad_steps():
    ledger = PrivacyLedger(P, DELTA, 1.0, accountant="clt")
    with pytest.raises(DPDLError, match="finite"):
        ledger.record_step(float("nan"))
    with pytest.raises(DPDLError, match="empty"):
        ledger.plan([])


def test_pld_ledger_matches_dp_accounting():
    """A certified ledger: ε spent after 300 steps of z = 1.2 equals dp_accounting's PLD."""
    from dp_accounting import dp_event
    from dp_accounting.pld import pld_privacy_accountant

    ledger = PrivacyLedger(0.02, DELTA, 3.0)  # accountant "pld" by default
    ledger.plan(np.full(400, 1.2))
    ledger.record_steps(np.full(300, 1.2))
    reference = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-4)
    step = dp_event.PoissonSampledDpEvent(0.02, dp_event.GaussianDpEvent(1.2))
    reference.compose(dp_event.SelfComposedDpEvent(step, 300))
    expected = reference.get_epsilon(DELTA)
    assert ledger.epsilon_spent() == pytest.approx(expected, rel=2e-3)
    assert ledger.spent_report().certified
    # The CLT understates the same steps (b = 1 regime of MATH.md §2 is not needed to see it).
    assert ledger.epsilon_spent("clt") < ledger.epsilon_spent("pld")
    with pytest.raises(PrivacyBudgetExceeded):
        PrivacyLedger(0.02, DELTA, expected * 0.99).plan(np.full(300, 1.2))


def test_for_schedule_plans_the_whole_run():
    clt_schedule = make_schedule(
        "const-d2p", epsilon=1.0, delta=DELTA, steps=500, sample_rate=0.002, calibrate="clt"
    )
    ledger = PrivacyLedger.for_schedule(clt_schedule)  # held to the CLT it was calibrated with
    assert ledger.accountant == "clt" and ledger.planned_steps == 500
    # The same schedule held to the certified PLD bound does not fit: the CLT understates ε.
    with pytest.raises(PrivacyBudgetExceeded, match="pld epsilon"):
        PrivacyLedger.for_schedule(clt_schedule, accountant="pld")
    pld_schedule = make_schedule(
        "const-d2p", epsilon=1.0, delta=DELTA, steps=500, sample_rate=0.002, calibrate="pld"
    )
    certified = PrivacyLedger.for_schedule(pld_schedule)
    certified.record_steps(pld_schedule.noise_multipliers)
    assert certified.epsilon_spent() <= 1.0
    sgp = make_schedule("sgp", epsilon=None, delta=None, steps=5, sample_rate=0.1)
    with pytest.raises(DPDLError, match="not private"):
        PrivacyLedger.for_schedule(sgp)


# ----------------------------------------------------------------- review fixes: fail closed
def test_a_run_length_table_is_refused_not_flattened():
    from dpdl.accounting.certified import epsilon_report

    # [(z, count)] flattened would read as two steps (z=1, z=1000) and understate epsilon.
    with pytest.raises(DPDLError, match="1-D"):
        epsilon_report("pld", [(1.0, 1000)], 0.05, 1e-5)
    ledger = PrivacyLedger(0.05, 1e-5, 50.0, "rdp")
    with pytest.raises(DPDLError, match="1-D"):
        ledger.plan([(1.0, 1000)])


def test_an_infinite_budget_is_refused():
    with pytest.raises(DPDLError, match="finite"):
        PrivacyLedger(0.05, 1e-5, float("inf"), "rdp")


def test_a_tampered_saved_ledger_is_refused():
    import json

    ledger = PrivacyLedger(0.05, 1e-5, 1.0, "rdp")
    ledger.plan(np.full(100, 5.0))
    ledger.record_steps(np.full(10, 5.0))
    saved = json.loads(ledger.to_json())
    assert PrivacyLedger.from_dict(saved).steps_taken == 10  # the honest file loads

    weaker_plan = dict(saved, approved_plan=[[0.3, 100]])  # far over the budget
    with pytest.raises(PrivacyBudgetExceeded):
        PrivacyLedger.from_dict(weaker_plan)
    weaker_steps = dict(saved, recorded=[[0.3, 10]])  # less noise than planned was spent
    with pytest.raises(PrivacyBudgetExceeded, match="below the planned"):
        PrivacyLedger.from_dict(weaker_steps)
    bigger_budget = dict(saved, epsilon_budget=float("inf"))
    with pytest.raises(DPDLError, match="finite"):
        PrivacyLedger.from_dict(bigger_budget)
    unplanned = dict(saved, approved_plan=None, recorded=[[0.3, 100]], steps_taken=100)
    with pytest.raises(PrivacyBudgetExceeded, match="budget"):
        PrivacyLedger.from_dict(unplanned)


def test_calibration_from_far_too_much_noise_is_not_a_traceback():
    from dpdl.accounting.schedules import make_schedule

    # epsilon tiny: the first trial scale gives a certified epsilon of exactly 0 at some points
    schedule = make_schedule(
        "dyn-d2p", epsilon=1e-9, delta=1e-4, steps=10, sample_rate=0.1, calibrate="pld"
    )
    assert schedule.epsilon("pld").epsilon <= 1e-9
