"""A run calibrated against the trust model its config names (MATH.md §9.4)."""

import math

import numpy as np
import pytest

import dpdl
from dpdl.accounting.correlated import sec_ldp_noise_factor
from dpdl.errors import DPDLError
from dpdl.topology import make_topology

pytestmark = pytest.mark.usefixtures("one_thread")


def _data(n=6, records=30, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(records, 4)).astype(np.float32), rng.integers(0, 2, size=records))
            for _ in range(n)]  # fmt: skip


BASE = dict(algorithm="const-d2p", epsilon=1.0, calibrate="pld", batch_size=5, lr=0.2,
            steps=6, eval_every=50, entropy="os", topology="ring")


def _train(**privacy):
    import torch

    torch.manual_seed(0)
    return dpdl.DecentralizedTrainer(torch.nn.Linear(4, 2), _data(), **BASE, **privacy)


def test_sec_ldp_calibration_adds_less_independent_noise_and_the_ledger_records_its_factor():
    local = _train(correlation="pairwise", correlation_factor=2.0)
    sec = _train(correlation="pairwise", correlation_factor=2.0, trust_model="sec-ldp")
    s = sec_ldp_noise_factor(make_topology("ring", 6).mixing_matrix, rounds=6, factor=2.0)
    assert s > 1.5  # a ring node's share hides under its two pairs' noise too
    # the same target ε: the ledger records z·s for the sec-ldp run, so its σ_k is s times less
    z_local, z_sec = local.schedule.noise_multipliers, sec.schedule.noise_multipliers
    assert z_sec == pytest.approx(z_local / s, rel=1e-3)
    assert sec.schedule.release_multipliers == pytest.approx(z_local, rel=1e-3)
    result = sec.fit()
    assert result.epsilon <= 1.0 + 1e-9 and result.record.trust_model == "sec-ldp"
    assert local.fit().record.trust_model == "curious-neighbours"


def test_a_claim_the_mechanism_does_not_support_is_refused():
    with pytest.raises((DPDLError, ValueError), match="trust_model 'sec-ldp' needs correlation "
                       "'pairwise'"):  # fmt: skip
        _train(trust_model="sec-ldp")


def test_the_trust_factor_is_decors_per_step_gaussian():
    """On the complete graph K_n, [(I + f² L)⁻¹]_ii = 1/n + (1 − 1/n)/(1 + f² n)."""
    n, f = 5, 1.5
    q = 1 / n + (1 - 1 / n) / (1 + f * f * n)
    assert sec_ldp_noise_factor(make_topology("complete", n).mixing_matrix, rounds=1,
                                factor=f) == pytest.approx(1 / math.sqrt(q))  # fmt: skip


def test_sec_ldp_is_refused_where_its_secrets_would_not_stay_secret_or_would_not_hide():
    # f beyond 100: the secrets' grid f·σ·2^-10 is coarse enough to read σ_k's noise off
    # the message modulo it (an attacker's finding): refused
    with pytest.raises((DPDLError, ValueError),
                       match=r"correlation_factor \(its scale over σ\) in \(0, 100\], got 500"):
        _train(correlation="pairwise", correlation_factor=500.0, trust_model="sec-ldp")
    # seeded edge keys follow from the seed: refused before anything is drawn
    import torch

    options = dict(BASE, entropy="seed")
    with pytest.raises(DPDLError, match="needs secret edge keys: entropy 'seed'"):
        dpdl.DecentralizedTrainer(torch.nn.Linear(4, 2), _data(), **options,
                                  correlation="pairwise", correlation_factor=2.0,
                                  trust_model="sec-ldp")
