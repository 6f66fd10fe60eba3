"""Privacy accounting of the Dyn-D2P family: pure numpy/scipy + dp_accounting, never torch.

Imports run one way inside: ``validators`` → ``gdp`` (MATH.md §1's GDP toolkit and the CLT
solves) → ``certified`` (PLD/RDP accountants, ε reports) → ``calibration`` (the safe search for
a noise scale) → ``schedules`` (MATH.md §2: per-step clip and noise, calibrated) → ``ledger`` (what
a run has spent); ``gossip`` (exact view accounting of linear Gaussian protocols) stands apart.
A new accounting method is one ``register_accountant(Accountant subclass)`` and a new schedule
one ``register_schedule_family(ScheduleFamily(...))``.
"""

from dpdl.accounting.calibration import calibrate_noise_scale
from dpdl.accounting.certified import (
    ACCOUNTANTS,
    Accountant,
    EpsilonReport,
    accountant_options,
    epsilon_report,
    register_accountant,
)
from dpdl.accounting.gdp import (
    clt_mu_total,
    clt_noise_scale,
    delta_from_epsilon,
    epsilon_from_delta,
    gaussian_sigma,
    mu0_from_mu_total,
    mu_bar_from_mu_total,
    mu_from_epsilon_delta,
    sigma_scale_from_mu_total,
)
from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import (
    ALGORITHMS,
    CalibrationResult,
    PrivacySchedule,
    ScheduleFamily,
    ShapeOptions,
    calibrate,
    constant_clip,
    exponential_budget,
    exponential_clip,
    make_schedule,
    noise_from_budget,
    register_schedule_family,
    uniform_budget,
)

__all__ = [
    "ACCOUNTANTS",
    "ALGORITHMS",
    "Accountant",
    "CalibrationResult",
    "EpsilonReport",
    "PrivacyLedger",
    "PrivacySchedule",
    "ScheduleFamily",
    "ShapeOptions",
    "accountant_options",
    "calibrate",
    "calibrate_noise_scale",
    "clt_mu_total",
    "clt_noise_scale",
    "constant_clip",
    "delta_from_epsilon",
    "epsilon_from_delta",
    "epsilon_report",
    "exponential_budget",
    "exponential_clip",
    "gaussian_sigma",
    "make_schedule",
    "mu0_from_mu_total",
    "mu_bar_from_mu_total",
    "mu_from_epsilon_delta",
    "noise_from_budget",
    "register_accountant",
    "register_schedule_family",
    "sigma_scale_from_mu_total",
    "uniform_budget",
]
