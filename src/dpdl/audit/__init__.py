"""Empirical privacy auditing (MATH.md §8): canaries through the real engine, lower bounds on ε.

* :mod:`dpdl.audit.stats` -- Clopper–Pearson, ε_lower, the μ-GDP bound, the one-run bound;
* :mod:`dpdl.audit.trials` -- batched canary trials through ``local_update``/``push_sum_mix``;
* :mod:`dpdl.audit.runner` -- :func:`run_audit`, the whole audit of one calibrated schedule;
* :mod:`dpdl.audit.plot` -- the score distributions and ROC (PNG, PDF, SVG).
"""

from dpdl.audit.runner import AuditExecution, AuditResult, run_audit, run_one_run_audit
from dpdl.audit.stats import (
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
    gdp_epsilon_lower_bound,
    gdp_mu_lower_bound,
    one_run_epsilon_lower_bound,
    one_run_p_value,
    threshold_bounds,
)
from dpdl.audit.trials import CANARIES, THREATS, AuditDesign, run_one_run, run_trials

__all__ = [
    "AuditDesign",
    "AuditExecution",
    "AuditResult",
    "CANARIES",
    "THREATS",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "epsilon_lower_bound",
    "gdp_epsilon_lower_bound",
    "gdp_mu_lower_bound",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "run_audit",
    "run_one_run",
    "run_one_run_audit",
    "run_trials",
    "threshold_bounds",
]
