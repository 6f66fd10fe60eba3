"""Privacy accounting of the Dyn-D2P family: pure numpy/scipy + dp_accounting, never torch.

SPEC §1 (GDP toolkit) in ``gdp``; §2 (schedules, calibration) in ``schedules`` and
``calibration``; certified PLD/RDP accountants in ``certified``; the training ledger in
``ledger``.
"""

from dpdl.accounting.calibration import (
    ACCOUNTANTS,
    CalibrationResult,
    EpsilonReport,
    accountant_options,
    calibrate,
    calibrate_noise_scale,
    epsilon_report,
)
from dpdl.accounting.gdp import (
    clt_mu_total,
    delta_from_epsilon,
    epsilon_from_delta,
    gaussian_sigma,
    mu_from_epsilon_delta,
)
from dpdl.accounting.ledger import PrivacyLedger
from dpdl.accounting.schedules import (
    ALGORITHMS,
    PrivacySchedule,
    clt_noise_scale,
    constant_clip,
    exponential_budget,
    exponential_clip,
    make_schedule,
    mu0_from_mu_total,
    mu_bar_from_mu_total,
    noise_from_budget,
    sigma_scale_from_mu_total,
    uniform_budget,
)

__all__ = [
    "ACCOUNTANTS",
    "ALGORITHMS",
    "CalibrationResult",
    "EpsilonReport",
    "PrivacyLedger",
    "PrivacySchedule",
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
    "sigma_scale_from_mu_total",
    "uniform_budget",
]
