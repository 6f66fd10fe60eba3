"""f-DP accounting for decentralized learning (MATH.md §7; seed 003, Li, Su, Wang, Long, Su 2025).

One import point for the three parts:

* trade-off functions as objects, composition, (ε, δ) conversions both ways and plotting
  (:mod:`dpdl.extensions.fdp.tradeoff`);
* PN-f-DP of random-walk DP-SGD: first-hitting weights, per-hop μ_t, the revealed-index
  mixture, composition under the contribution cap or the ζ slack, pairwise matrices, the RDP
  baseline and σ calibration (:mod:`dpdl.extensions.fdp.random_walk`);
* DECOR's Sec-LDP (RDP) and Sec-f-LDP guarantees and σ calibration for a given σ_cor
  (:mod:`dpdl.extensions.fdp.decor_accounting`).

>>> from dpdl.extensions.fdp.accounting import GaussianTradeOff
>>> round(GaussianTradeOff(3.0).compose(GaussianTradeOff(4.0)).mu, 12)
5.0
"""

from dpdl.extensions.fdp.decor_accounting import (
    DECOR_ACCOUNTANTS,
    DecorPrivacy,
    calibrate_sigma_decor,
    decor_epsilon,
    decor_privacy,
    decor_rho,
    honest_laplacian,
)
from dpdl.extensions.fdp.random_walk import (
    DEFAULT_TOLERANCE,
    HOP_FORMS,
    BoundSettings,
    PairwiseReport,
    calibrate_sigma_pnfdp,
    calibrate_sigma_rdp_baseline,
    composition_count,
    first_hitting_weights,
    markov_slack_delta,
    per_hop_mu,
    pnfdp_epsilon,
    pnfdp_epsilon_matrix,
    rdp_baseline_epsilon,
    rdp_baseline_rho,
    rdp_epsilon_from_rho,
    rdp_ht_epsilon,
    rdp_ht_epsilon_from_rho,
    single_visit_tradeoff,
    walk_matrix,
)
from dpdl.extensions.fdp.tradeoff import (
    EpsilonDeltaTradeOff,
    GaussianTradeOff,
    PLDTradeOff,
    RevealedGaussianMixture,
    TabulatedTradeOff,
    TradeOff,
    compose,
    gaussian_delta,
    gaussian_log_delta,
    plot_tradeoff,
)

__all__ = [
    "DECOR_ACCOUNTANTS",
    "DEFAULT_TOLERANCE",
    "HOP_FORMS",
    "BoundSettings",
    "rdp_ht_epsilon",
    "rdp_ht_epsilon_from_rho",
    "DecorPrivacy",
    "EpsilonDeltaTradeOff",
    "GaussianTradeOff",
    "PLDTradeOff",
    "PairwiseReport",
    "RevealedGaussianMixture",
    "TabulatedTradeOff",
    "TradeOff",
    "calibrate_sigma_decor",
    "calibrate_sigma_pnfdp",
    "calibrate_sigma_rdp_baseline",
    "compose",
    "composition_count",
    "decor_epsilon",
    "decor_privacy",
    "decor_rho",
    "first_hitting_weights",
    "gaussian_delta",
    "gaussian_log_delta",
    "honest_laplacian",
    "markov_slack_delta",
    "per_hop_mu",
    "plot_tradeoff",
    "pnfdp_epsilon",
    "pnfdp_epsilon_matrix",
    "rdp_baseline_epsilon",
    "rdp_baseline_rho",
    "rdp_epsilon_from_rho",
    "single_visit_tradeoff",
    "walk_matrix",
]
