"""`dpdl audit --threat observer` of DECOR's pairwise noise (issue 41): the trials draw it
with the engine's mechanism and real X25519 edge keys; the observers subtract the secrets
they hold and weigh the rest by the exact correlated view (MATH.md §9.4)."""

import numpy as np
import pytest

from dpdl.audit.runner import AuditExecution, run_audit
from dpdl.audit.trials import AuditDesign

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_observer_audit_of_pairwise_noise_matches_the_exact_correlated_view():
    """At p = 1 the GLS estimate of the canary's presence is N(θ, 1/μ²) with μ the exact view
    (θ = 0 out, 1 in): its spread is 1/μ_view only if the engine added the pairwise secrets the
    view assumes and the observers removed exactly the ones they hold (unsubtracted, their
    σ_pair = 2σ would widen it several times; missing, the weights would be wrong).  The
    audit's lower bound stays below the view's ε."""
    result = run_audit(
        "const-d2p", epsilon=2, delta=1e-5, steps=3, sample_rate=1.0, trials=400,
        design=AuditDesign(threat="observer", nodes=6, topology="ring", observers=(2,),
                           correlation="pairwise", correlation_factor=2.0),
        execution=AuditExecution(seed=5),
    )
    scores, members = np.asarray(result.scores), np.asarray(result.members)
    spread = 1 / result.mu_view
    for group, theta in ((scores[~members], 0.0), (scores[members], 1.0)):
        assert np.std(group) == pytest.approx(spread, rel=0.12)
        assert abs(np.mean(group) - theta) < 3 * spread / np.sqrt(group.size)
    assert result.epsilon_lower <= result.epsilon_view
    # against an observer two hops away, the pairwise secrets it cannot cancel protect more
    independent = run_audit(
        "const-d2p", epsilon=2, delta=1e-5, steps=3, sample_rate=1.0, trials=4,
        design=AuditDesign(threat="observer", nodes=6, topology="ring", observers=(2,)),
        execution=AuditExecution(seed=5),
    )
    assert result.mu_view < independent.mu_view
