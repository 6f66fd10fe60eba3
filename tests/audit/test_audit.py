"""``run_audit`` through the real engine: sound on correct mechanisms, refutes under-noised ones.

Every audit here is seeded (``seed=...``) so the test is deterministic; the library default is
OS entropy.  p = 1, K = 10, a linear model on 8 features: seconds per audit.
"""

import numpy as np
import pytest

import dpdl.audit.trials as trials_module
from dpdl.accounting.gdp import mu_from_epsilon_delta
from dpdl.accounting.schedules import make_schedule
from dpdl.audit import (
    AuditDesign,
    AuditExecution,
    run_audit,
    run_one_run,
    run_one_run_audit,
    run_trials,
)
from dpdl.audit.runner import DEFAULT_TRIALS
from dpdl.errors import DPDLError

FULL_BATCH = {"delta": 1e-5, "steps": 10, "sample_rate": 1.0}


@pytest.mark.parametrize(
    ("algorithm", "epsilon", "sample_rate", "design"),
    [
        ("const-d2p", 1.0, 1.0, AuditDesign()),
        ("dyn-d2p", 2.0, 1.0, AuditDesign()),
        ("dyn-d2p", 2.0, 0.5, AuditDesign()),
        ("const-d2p", 4.0, 1.0, AuditDesign(threat="final", canary="gradient", nodes=4)),
        ("const-d2p", 4.0, 1.0, AuditDesign(threat="final", canary="input")),
    ],
)
def test_a_correct_mechanism_is_never_refuted(algorithm, epsilon, sample_rate, design):
    result = run_audit(
        algorithm, epsilon=epsilon, delta=1e-5, steps=10, sample_rate=sample_rate,
        trials=2000, design=design, execution=AuditExecution(seed=11),
    )  # fmt: skip
    assert not result.claim_refuted
    assert result.epsilon_lower <= result.epsilon_certified
    if sample_rate == 1.0:
        assert result.epsilon_lower_gdp is not None
        assert result.epsilon_lower_gdp <= result.epsilon_certified
    else:
        assert result.epsilon_lower_gdp is None  # subsampled: not an exact Gaussian


@pytest.mark.parametrize("epsilon", [1.0, 4.0])
def test_an_under_noised_mechanism_is_refuted(epsilon):
    result = run_audit("const-d2p", epsilon=epsilon,
                       execution=AuditExecution(noise_scale=0.25, seed=3), **FULL_BATCH)
    assert result.claim_refuted
    assert result.epsilon_lower > epsilon


def test_power_full_batch_messages_gdp_bound_reaches_half_the_certified_epsilon():
    result = run_audit("const-d2p", epsilon=2.0, execution=AuditExecution(seed=5), **FULL_BATCH)
    assert result.trials == DEFAULT_TRIALS == 5000
    assert result.epsilon_lower_gdp >= 0.5 * result.epsilon_certified
    # Measured with this seed: GDP bound 1.36, the sound (epsilon, delta) bound 0.76 -- far
    # weaker at 5000 trials (its Clopper-Pearson intervals sit in the tails).
    assert 0 < result.epsilon_lower < result.epsilon_lower_gdp


def test_messages_score_has_the_claimed_gaussian_law_without_the_canary():
    """Engine noise check: with p = 1 the score Σ_k (μ_k s_k/σ_k − μ_k²/2) is N(−M/2, M),
    M = Σ μ_k² = μ_tot², without the canary and N(+M/2, M) with it."""
    schedule = make_schedule("dyn-d2p", epsilon=2.0, calibrate="clt", **FULL_BATCH)
    members = np.arange(4000) % 2 == 1
    scores = run_trials(schedule, AuditDesign(), members, seed=7)
    M = mu_from_epsilon_delta(2.0, 1e-5) ** 2
    for label, sign in ((False, -1), (True, 1)):
        s = scores[members == label]
        assert s.mean() == pytest.approx(sign * M / 2, abs=4 * np.sqrt(M / s.size))
        assert s.var() == pytest.approx(M, rel=0.12)


def test_noise_scale_multiplies_the_sigma_given_to_the_engine(monkeypatch):
    seen = []
    real = trials_module.local_update

    def spy(spec, params, weights, records, args, **kwargs):  # args: the StepArguments
        seen.append((args.clip, args.sigma))
        return real(spec, params, weights, records, args, **kwargs)

    monkeypatch.setattr(trials_module, "local_update", spy)
    schedule = make_schedule("dyn-d2p", epsilon=1.0, calibrate="clt", **FULL_BATCH)
    run_trials(schedule, AuditDesign(), np.array([True, False]), noise_scale=0.5, seed=1)
    assert [c for c, _ in seen] == pytest.approx(schedule.clip)
    assert [s for _, s in seen] == pytest.approx(0.5 * schedule.sigma)


def test_trials_use_fresh_randomness_unless_seeded():
    schedule = make_schedule("const-d2p", epsilon=1.0, calibrate="clt", **FULL_BATCH)
    members = np.array([True, False, True, False])
    a, b = (run_trials(schedule, AuditDesign(), members) for _ in range(2))
    assert not np.allclose(a, b)
    c, d = (run_trials(schedule, AuditDesign(), members, seed=4) for _ in range(2))
    np.testing.assert_array_equal(c, d)
    assert len(set(np.round(c, 12))) == 4  # independent trials within one batch


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trials": 1}, "trials"),
        ({"execution": AuditExecution(noise_scale=0.0)}, "noise.scale"),
        ({"execution": AuditExecution(noise_scale=-1.0)}, "noise.scale"),
        ({"design": AuditDesign(nodes=1)}, "no messages"),
        ({"design": AuditDesign(threat="messages", canary="input")}, "final"),
    ],
)
def test_bad_input_is_one_clear_error(kwargs, message):
    with pytest.raises(DPDLError, match=message):
        run_audit("const-d2p", epsilon=1.0, **FULL_BATCH, **kwargs)


def test_sgp_is_not_auditable():
    with pytest.raises(DPDLError, match="not private"):
        run_audit("sgp", epsilon=1.0, **FULL_BATCH, trials=10)


def test_one_run_canaries_each_get_their_full_clipped_gradient():
    """Every included canary (not only a prefix) shifts its score by +μ_tot² (p = 1)."""
    schedule = make_schedule("const-d2p", epsilon=1.0, calibrate="clt", **FULL_BATCH)
    included = np.random.default_rng(0).random(400) < 0.5
    scores = run_one_run(schedule, AuditDesign(), included, noise_scale=0.1, seed=2)
    M = mu_from_epsilon_delta(1.0, 1e-5) ** 2
    for label, sign in ((False, -1), (True, 1)):
        s = scores[included == label]
        # noise scale 0.1: the score's std is 0.1 sqrt(M)
        assert s.mean() == pytest.approx(sign * M / 2, abs=4 * 0.1 * np.sqrt(M / s.size))
        assert s.std() == pytest.approx(0.1 * np.sqrt(M), rel=0.2)


def test_one_run_audit_sound_on_a_correct_mechanism_and_refutes_a_broken_one():
    kwargs = {"epsilon": 0.5, "canaries": 400, **FULL_BATCH}
    honest = run_one_run_audit("const-d2p", execution=AuditExecution(seed=9), **kwargs)
    assert not honest.claim_refuted and honest.epsilon_lower <= honest.epsilon_certified
    assert honest.epsilon_lower_gdp is None and honest.trials == 1
    broken = run_one_run_audit(
        "const-d2p", execution=AuditExecution(noise_scale=0.05, seed=9), **kwargs
    )
    assert broken.claim_refuted
    assert broken.one_run["guesses"] >= 1 and broken.one_run["correct"] <= broken.one_run["guesses"]


@pytest.mark.parametrize("noise", ["exact", "legacy-hardened"])
def test_the_audited_samplers_have_the_claimed_gaussian_law_to_the_eye_of_a_score(noise):
    """The exact release and the old hardened sampler both pass a likelihood-ratio score's
    moments (only the bit-level audit, --threat implementation, tells the old one apart)."""
    schedule = make_schedule("const-d2p", epsilon=2.0, calibrate="clt", **FULL_BATCH)
    members = np.arange(2000) % 2 == 1
    scores = run_trials(schedule, AuditDesign(), members, noise=noise)
    M = mu_from_epsilon_delta(2.0, 1e-5) ** 2
    for label, sign in ((False, -1), (True, 1)):
        s = scores[members == label]
        assert s.mean() == pytest.approx(sign * M / 2, abs=4.5 * np.sqrt(M / s.size))
        assert s.var() == pytest.approx(M, rel=0.2)  # 4.5 standard errors of the variance
    with pytest.raises(DPDLError, match="unknown noise 'hardened'"):
        run_trials(schedule, AuditDesign(), members[:2], noise="hardened")
