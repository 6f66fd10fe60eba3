"""The one RDP → (ε, δ) conversion against dp_accounting's own, order by order."""

import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from dpdl.accounting.rdp import RDP_ORDERS, rdp_epsilon


@pytest.mark.parametrize("delta", [1e-5, 1e-3])
def test_matches_dp_accounting_on_the_same_orders(delta):
    rho = np.geomspace(1e-6, 50.0, 40)
    reference = [compute_epsilon(RDP_ORDERS, RDP_ORDERS * r, delta)[0] for r in rho]
    np.testing.assert_allclose(rdp_epsilon(rho, delta), reference, rtol=1e-10)


def test_never_worse_than_dp_accounting_defaults():
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    orders = np.asarray(DEFAULT_RDP_ORDERS, dtype=float)
    for r in np.geomspace(1e-5, 10.0, 25):
        assert rdp_epsilon(r, 1e-5) <= compute_epsilon(orders, orders * r, 1e-5)[0] + 1e-12


def test_no_guarantee_is_never_epsilon_zero():
    out = rdp_epsilon(np.array([-1.0, np.nan, np.inf, 0.0]), 1e-5)
    assert np.isnan(out[0]) and np.isnan(out[1]) and out[2] == np.inf and out[3] == 0.0
    assert np.isscalar(rdp_epsilon(0.5, 1e-5))
