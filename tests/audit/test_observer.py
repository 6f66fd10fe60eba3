"""Pairwise audit of Dyn-D2P: the canary on node 0, the attack sees only what an observer
(or a coalition) receives (MATH.md §8, §9).

Oracles: the exact view μ of dpdl.accounting.gossip (itself checked against brute-force
likelihood ratios), recomputed here with an explicit pseudo-inverse; the claimed local-DP ε.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpdl.accounting.gossip import schedule_view_mu, view_mu
from dpdl.accounting.schedules import make_schedule
from dpdl.audit import AuditDesign, AuditExecution, run_audit
from dpdl.audit.trials import run_trials
from dpdl.cli import main
from dpdl.errors import DPDLError
from dpdl.topology import make_topology


def test_schedule_view_mu_is_view_mu_for_constant_steps_and_a_pseudo_inverse_otherwise():
    P = make_topology("undirected-ring", 7).mixing_matrix(0)
    constant = schedule_view_mu(P, target=0, observers=[3], sigmas=[2.0] * 5,
                                sensitivities=[0.5] * 5)  # fmt: skip
    assert constant == pytest.approx(
        view_mu(P, rounds=5, target=0, observers=[3], sigma=2.0, sensitivity=0.5), rel=1e-10)
    # varying C_k, σ_k: μ² = cᵀ (B diag(σ²) Bᵀ)⁺ c, built here from matrix powers
    sigmas, deltas, n, T, v = [1.0, 2.0, 0.5, 3.0], [1.0, 0.7, 0.4, 0.2], 7, 4, 3
    honest = [i for i in range(n) if i != v]
    seen = [j for j in range(n) if P[v, j] > 0 and j != v]
    rows_c, rows_B = [], []
    for t in range(T):  # message of j at t: Σ_s (P^(t−s))[j] · input^s
        for j in seen:
            rows_c.append(sum(deltas[s] * np.linalg.matrix_power(P, t - s)[j, 0]
                              for s in range(t + 1)))  # fmt: skip
            rows_B.append(np.concatenate([
                sigmas[s] * np.linalg.matrix_power(P, t - s)[j, honest] if s <= t
                else np.zeros(len(honest)) for s in range(T)]))  # fmt: skip
    c, B = np.array(rows_c), np.array(rows_B)
    expected = math.sqrt(c @ np.linalg.pinv(B @ B.T) @ c)
    got = schedule_view_mu(P, target=0, observers=[v], sigmas=sigmas, sensitivities=deltas)
    assert got == pytest.approx(expected, rel=1e-8)


def _schedule(steps=4, epsilon=2.0):
    return make_schedule("const-d2p", epsilon=epsilon, delta=1e-5, steps=steps, sample_rate=1.0)


def test_the_observers_score_through_the_engine_is_gaussian_with_the_view_mu():
    """Out-scores ~ N(0, 1/μ²), in-scores ~ N(1, 1/μ²): the engine's view is §9's."""
    schedule = _schedule()
    design = AuditDesign(threat="observer", nodes=6, topology="ring", observers=(2,))
    members = np.arange(3000) % 2 == 1
    scores = run_trials(schedule, design, members, seed=3)
    mu = schedule_view_mu(make_topology("ring", 6).mixing_matrix, target=0, observers=[2],
                          sigmas=schedule.sigma[:4], sensitivities=schedule.clip[:4])
    for held, mean in ((False, 0.0), (True, 1.0)):
        s = scores[members == held]
        var, k = s.var(ddof=1), len(s) - 1
        lo, hi = (var * k / stats.chi2.ppf(q, k) for q in (0.9995, 0.0005))
        assert lo <= 1 / mu**2 <= hi
        assert abs(s.mean() - mean) < 4 / (mu * math.sqrt(len(s)))


@pytest.mark.parametrize(("topology", "observers"), [("ring", (1,)), ("ring", (3,)),
                                                      ("exp", (2,)), ("geometric", (4, 5))])
def test_bounds_never_exceed_the_view_epsilon_nor_the_claim(topology, observers):
    design = AuditDesign(threat="observer", nodes=8, topology=topology, observers=observers)
    r = run_audit("const-d2p", epsilon=2.0, delta=1e-5, steps=4, sample_rate=1.0, trials=2000,
                  design=design, execution=AuditExecution(seed=4))  # fmt: skip
    assert not r.claim_refuted
    assert r.epsilon_lower <= r.epsilon_view <= r.epsilon_claimed + 1e-9
    assert r.mu_lower_gdp <= r.mu_view


def test_an_implementation_with_too_little_noise_is_caught_by_an_observer_two_hops_away():
    design = AuditDesign(threat="observer", nodes=8, topology="ring", observers=(2,))
    r = run_audit("const-d2p", epsilon=2.0, delta=1e-5, steps=4, sample_rate=1.0, trials=2000,
                  design=design,
                  execution=AuditExecution(seed=5, noise_scale=0.2))  # fmt: skip
    assert r.epsilon_lower > r.epsilon_view  # the view's exact ε is refuted


def test_the_design_refuses_bad_observers():
    with pytest.raises(DPDLError, match="the canary's node 0 cannot be its own observer"):
        AuditDesign(threat="observer", nodes=4, observers=(0,)).validate()
    with pytest.raises(DPDLError, match=r"observer 7 is not a node of 0..3"):
        AuditDesign(threat="observer", nodes=4, observers=(7,)).validate()
    with pytest.raises(DPDLError, match="audits the gradient canary"):
        AuditDesign(threat="observer", nodes=4, canary="input").validate()


def _audit(capsys, *extra):
    code = main(["audit", "--algorithm", "const-d2p", "--epsilon", "2", "--steps", "3",
                 "--sample-rate", "1", "--delta", "1e-5", "--trials", "400", "--seed", "0",
                 "--no-plot", "--no-progress", "--nodes", "6", "--topology", "ring",
                 *extra])  # fmt: skip
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_cli_reports_the_view_epsilon_and_distance(capsys):
    code, out, _ = _audit(capsys, "--threat", "observer", "--observer", "2")
    assert code == 0
    line = next(x for x in out.splitlines() if "epsilon_view" in x)
    assert "distance 2" in line
    mu = schedule_view_mu(make_topology("ring", 6).mixing_matrix, target=0, observers=[2],
                          sigmas=_schedule(3).sigma[:3], sensitivities=_schedule(3).clip[:3])
    assert f"(mu {mu:.4g};" in line


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--threat", "observer"], "--threat observer needs --observer"),
        (["--observer", "2"], "--observer needs --threat observer"),
        (["--threat", "observer", "--observer", "0"], "cannot be its own observer"),
        (["--threat", "observer", "--observer", "9"], "observer 9 is not a node of 0..5"),
    ],
)
def test_the_cli_refuses_bad_observer_input_in_one_line(capsys, extra, message):
    code, _, err = _audit(capsys, *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
