"""A step that releases several noisy messages (gradient tracking's model and tracker): the
ledger records one subsampled Gaussian per release and composes them as dp_accounting composes
the same events."""

import dp_accounting
import numpy as np
import pytest

from dpdl.accounting.ledger import PrivacyLedger
from dpdl.errors import DPDLError, PrivacyBudgetExceeded

Q, DELTA = 0.05, 1e-5


def _dp_accounting_epsilon(multipliers_per_step):
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for step in multipliers_per_step:
        for z in step:
            gaussian = dp_accounting.GaussianDpEvent(z)
            accountant.compose(dp_accounting.PoissonSampledDpEvent(Q, gaussian))
    return accountant.get_epsilon(DELTA)


def test_two_releases_per_step_compose_as_dp_accounting_composes_them():
    steps = [(1.1, 2.5), (1.1, 2.5), (1.3, 3.0)] * 3
    ledger = PrivacyLedger(Q, DELTA, 50.0, "pld", releases=("model", "tracker"))
    for step in steps:
        ledger.record_step(step)
    assert ledger.steps_taken == len(steps)
    ours = ledger.spent_report("pld", mode="exact").epsilon
    assert ours == pytest.approx(_dp_accounting_epsilon(steps), rel=2e-3)
    # the same ledger's dp_accounting event, composed by dp_accounting itself
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    accountant.compose(ledger.dp_event())
    assert accountant.get_epsilon(DELTA) == pytest.approx(ours, rel=2e-3)
    # a second release per step costs privacy: more than the model's releases alone
    alone = PrivacyLedger(Q, DELTA, 50.0, "pld")
    alone.record_steps([z for z, _ in steps])
    assert ours > alone.spent_report("pld", mode="exact").epsilon


def test_a_step_must_give_every_release_and_no_less_noise_than_planned():
    ledger = PrivacyLedger(Q, DELTA, 50.0, "pld", releases=("model", "tracker"))
    with pytest.raises(DPDLError, match="releases 2 mechanisms"):
        ledger.record_step(1.0)
    ledger.plan(np.array([[1.0, 2.0]] * 4).ravel())
    assert ledger.planned_steps == 4
    ledger.record_step((1.0, 2.0))
    with pytest.raises(PrivacyBudgetExceeded, match="release 'tracker'"):
        ledger.record_step((1.0, 1.5))
    for _ in range(3):
        ledger.record_step((1.0, 2.0))
    with pytest.raises(PrivacyBudgetExceeded, match="beyond the approved plan of 4 steps"):
        ledger.record_step((1.0, 2.0))


def test_releases_survive_a_json_round_trip_and_a_tampered_file_fails_closed():
    ledger = PrivacyLedger(Q, DELTA, 50.0, "pld", releases=("model", "tracker"))
    ledger.plan([1.0, 2.0] * 3)
    ledger.record_steps(np.array([[1.0, 2.0], [1.0, 2.0]]))
    back = PrivacyLedger.from_json(ledger.to_json())
    assert back.releases == ("model", "tracker") and back.steps_taken == 2
    assert back.spent_report("pld").epsilon == ledger.spent_report("pld").epsilon
    data = ledger.to_dict()
    data["releases"] = ["model"]  # claims one release per step: 4 steps recorded, not 2
    with pytest.raises(DPDLError, match="steps_taken"):
        PrivacyLedger.from_dict(data)
    data = ledger.to_dict() | {"recorded": [[1.0, 3]]}
    with pytest.raises(DPDLError, match="whole number of steps"):
        PrivacyLedger.from_dict(data)


def test_a_one_release_ledger_writes_what_it_always_wrote():
    ledger = PrivacyLedger(Q, DELTA, 5.0, "pld")
    ledger.record_step(1.5)
    assert "releases" not in ledger.to_dict()
