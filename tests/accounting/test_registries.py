"""The accountant and schedule-family registries (issue 40, item 4): registering a new
accountant or family is one call, and every caller then takes it by name."""

import json

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant

from dpdl.accounting.certified import (
    ACCOUNTANTS,
    Accountant,
    compute_delta,
    compute_epsilon,
    register_accountant,
    unregister_accountant,
)
from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import (
    ALGORITHMS,
    ScheduleFamily,
    make_schedule,
    register_schedule_family,
    unregister_schedule_family,
)
from dpdl.errors import DPDLError, require
from dpdl.training.settings import AlgorithmSpec, PrivacySection, validate_config

# A grid of orders coarser than dp_accounting's default: its ε is a (looser) certified bound.
ORDERS = (1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0)


class CoarseRdp(Accountant):
    """dp_accounting's RDP accountant at ``ORDERS`` (add/remove only)."""

    name, display, certified = "mine", "RDP (12 orders)", True
    modes = ("exact",)

    def _composed(self, multipliers, counts, sample_rate, composition):
        require(composition.neighboring == "add-remove", "mine accounts add/remove only")
        accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS))
        for z, count in zip(multipliers, counts, strict=True):
            gaussian = dp_event.GaussianDpEvent(float(z))
            accountant.compose(dp_event.PoissonSampledDpEvent(sample_rate, gaussian), int(count))
        return accountant

    def epsilon(self, multipliers, counts, sample_rate, delta, composition):
        return self._composed(multipliers, counts, sample_rate, composition).get_epsilon(delta)

    def delta(self, multipliers, counts, sample_rate, epsilon, composition):
        return self._composed(multipliers, counts, sample_rate, composition).get_delta(epsilon)


def _reference_epsilon(z: float, steps: int, q: float, delta: float) -> float:
    """dp_accounting itself, one self-composed event: the number ``mine`` must give."""
    accountant = rdp_privacy_accountant.RdpAccountant(list(ORDERS))
    event = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z))
    return accountant.compose(event, steps).get_epsilon(delta)


@pytest.fixture
def mine():
    accountant = register_accountant(CoarseRdp())
    yield accountant
    unregister_accountant("mine")


def test_a_registered_accountant_is_taken_by_name(mine):
    assert "mine" in ACCOUNTANTS and ACCOUNTANTS["mine"] is mine
    assert list(ACCOUNTANTS)[:3] == ["clt", "pld", "rdp"]  # iterating gives the names
    report = compute_epsilon("mine", [1.1] * 300, 0.02, 1e-5)
    assert report.epsilon == pytest.approx(_reference_epsilon(1.1, 300, 0.02, 1e-5), rel=1e-12)
    assert (report.accountant, report.certified, report.method) == ("mine", True, "mine")
    # a coarser grid of orders: never below the default grid's RDP bound
    assert report.epsilon >= compute_epsilon("rdp", [1.1] * 300, 0.02, 1e-5).epsilon
    delta = compute_delta("mine", [1.1] * 300, 0.02, report.epsilon).delta
    assert delta == pytest.approx(1e-5, rel=1e-3)
    with pytest.raises(DPDLError, match="not a composition of mine"):
        compute_epsilon("mine", [1.1] * 300, 0.02, 1e-5, mode="blocked")


def test_a_registered_accountant_calibrates_and_gates(mine):
    schedule = make_schedule("const-d2p", epsilon=2.0, delta=1e-5, steps=200, sample_rate=0.02,
                             calibrate="mine", neighboring="add-remove")  # fmt: skip
    assert schedule.calibrated_with == "mine"
    spent = schedule.epsilon("mine").epsilon
    assert 2.0 * (1 - 2e-3) <= spent <= 2.0  # safe, and within the search's tolerance
    z = float(schedule.noise_multipliers[0])
    assert spent == pytest.approx(_reference_epsilon(z, 200, 0.02, 1e-5), rel=1e-12)
    ledger = PrivacyLedger.for_schedule(schedule)  # held to the accountant it was calibrated with
    assert ledger.accountant == "mine" and ledger.spent_report().certified


def test_the_settings_validate_against_the_registry(mine):
    spec = AlgorithmSpec.parse("const-d2p@mine")
    assert (spec.name, spec.calibrate, spec.label, spec.private) == (
        "const-d2p", "mine", "const-d2p@mine", True)
    privacy = validate_config(PrivacySection, {"calibrate": "mine",
                                               "certified_accountant": "mine"})  # fmt: skip
    assert (privacy.calibrate, privacy.certified_accountant) == ("mine", "mine")
    with pytest.raises(DPDLError, match="not a certified accountant"):
        validate_config(PrivacySection, {"certified_accountant": "clt"})


def test_a_run_plan_takes_a_registered_accountant(mine):
    from dpdl.training import plan

    privacy = validate_config(PrivacySection, {"neighboring": "add-remove",
                                               "certified_accountant": "mine"})  # fmt: skip
    schedule = plan.build_schedule(privacy, AlgorithmSpec.parse("const-d2p@mine"), 2.0, 100,
                                   0.05)  # fmt: skip
    assert schedule.calibrated_with == "mine"
    ledger = plan.approve_schedule(privacy, schedule)
    for z in schedule.noise_multipliers[:40]:
        ledger.record_step(float(z))
    clt, certified, method = plan.epsilon_spent(privacy, ledger, final=True)
    z = float(schedule.noise_multipliers[0])
    assert certified == pytest.approx(_reference_epsilon(z, 40, 0.05, privacy.delta), rel=1e-12)
    assert method == "mine" and 0 < clt < certified


def test_an_unregistered_accountant_is_refused_everywhere():
    assert "mine" not in ACCOUNTANTS
    with pytest.raises(DPDLError, match="unknown accountant 'mine'"):
        compute_epsilon("mine", [1.0], 0.1, 1e-5)
    with pytest.raises(ValueError, match="unknown calibration 'mine'"):
        AlgorithmSpec.parse("const-d2p@mine")
    with pytest.raises(DPDLError, match="calibrate: unknown accountant 'mine'"):
        validate_config(PrivacySection, {"calibrate": "mine"})
    with pytest.raises(DPDLError, match="already registered"):
        register_accountant(ACCOUNTANTS["pld"])


def test_the_built_in_accountants_say_what_they_are():
    assert {name: a.certified for name, a in ACCOUNTANTS.items()} == {
        "clt": False, "pld": True, "rdp": True}
    assert [ACCOUNTANTS[n].display for n in ("clt", "pld", "rdp")] == ["CLT", "PLD", "RDP"]
    assert ACCOUNTANTS["pld"].calibration_blocks and not ACCOUNTANTS["rdp"].calibration_blocks
    # the coarse phase of a heterogeneous calibration, per method
    shape = np.linspace(1.0, 2.0, 50)
    assert ACCOUNTANTS["pld"].coarse_options(shape)["mode"] == "binned"
    assert ACCOUNTANTS["rdp"].coarse_options(shape) == {"mode": "blocked", "blocks": 20}
    assert ACCOUNTANTS["rdp"].coarse_options(shape[:20]) is None
    assert ACCOUNTANTS["clt"].coarse_options(shape) is None


# ------------------------------------------------------------------- schedule families
def _halving_clip(steps, options):
    return options.clip * 0.5 ** (np.arange(steps) / steps)  # C_k = C̄ 2^(-k/K)


def _constant_multiplier(steps, options):
    return np.ones(steps)


@pytest.fixture
def half():
    family = register_schedule_family(ScheduleFamily(
        "half-d2p", "Half-D2P", _halving_clip, _constant_multiplier, scale="mu_bar",
        parameters=("clip",), short="Half", description="clip halves, constant multiplier"))
    yield family
    unregister_schedule_family("half-d2p")


def test_a_registered_family_makes_schedules(half):
    assert list(ALGORITHMS)[-1] == "half-d2p" and half.order == len(ALGORITHMS) - 1
    kw = dict(epsilon=1.0, delta=1e-5, steps=100, sample_rate=0.01, calibrate="clt")
    schedule = make_schedule("half-d2p", **kw)
    const = make_schedule("const-d2p", **kw)
    assert schedule.private and schedule.algorithm == "half-d2p"
    np.testing.assert_array_equal(schedule.clip, 0.5 ** (np.arange(100) / 100))
    # the same constant multiplier as Const-D2P at the same ε: the same noise scale
    np.testing.assert_allclose(schedule.noise_multipliers, const.noise_multipliers, rtol=1e-12)
    assert schedule.mu_bar == pytest.approx(const.mu_bar, rel=1e-12) and schedule.mu0 is None
    assert AlgorithmSpec.parse("half-d2p@pld").label == "half-d2p@pld"


def test_dpdl_account_takes_a_registered_family(half, capsys):
    from dpdl.cli import main

    code = main(["account", "--algorithm", "half-d2p", "--epsilon", "1", "--steps", "100",
                 "--sample-rate", "0.01", "--calibrate", "clt", "--report", "clt", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["algorithm"] == "half-d2p" and out["clip_last"] == pytest.approx(0.5 ** 0.99)
    assert out["epsilon"]["clt"] == pytest.approx(1.0, rel=1e-9)


def test_the_built_in_families_derive_what_callers_read():
    assert list(ALGORITHMS) == ["sgp", "const-d2p", "dyn-c-d2p", "dyn-mu-d2p", "dyn-d2p",
                                "general"]  # fmt: skip
    assert [f.order for f in ALGORITHMS.values()] == list(range(6))
    assert [n for n, f in ALGORITHMS.items() if not f.private] == ["sgp"]
    dyn = ALGORITHMS["dyn-d2p"]
    assert (dyn.display, dyn.baseline, dyn.rivals) == (
        "Dyn-D2P", "const-d2p", ("dyn-c-d2p", "dyn-mu-d2p", "const-d2p"))
    with pytest.raises(DPDLError, match="unknown rival"):
        register_schedule_family(ScheduleFamily("x-d2p", "X", _halving_clip,
                                                _constant_multiplier, rivals=("nope",)))
    with pytest.raises(DPDLError, match="unknown algorithm 'half-d2p'"):
        make_schedule("half-d2p", epsilon=1.0, delta=1e-5, steps=10, sample_rate=0.1)
