"""MATH.md §5 privacy of DP decentralized linear regression: hand computations, closed form,
its validity conditions, calibration (checked with a scipy root find) and data-norm bounds."""

import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq

from dpdl.errors import DPDLError
from dpdl.extensions.linreg.accounting import (
    LinRegSensitivity,
    PowerDecay,
    calibrate_noise_scale,
    closed_form_violations,
    data_norm_bounds,
    epsilon_closed_form,
    epsilon_per_step,
    epsilon_sum,
    privacy_report,
)

# delta_X = 2, delta_y = 1, B = 1, m = 4, n_M = 9, k = 4:
# 4 * 2 * sqrt(36) * (2 * 1 * sqrt(16) + 1) = 48 * 9 = 432.
SENS = LinRegSensitivity(
    delta_x=2.0, delta_y=1.0, omega_bound=1.0, num_features=4, max_local_records=9, num_nodes=4
)


def test_coefficient_by_hand():
    assert SENS.coefficient == pytest.approx(432.0, rel=1e-15)


def test_epsilon_sum_by_hand():
    alpha = PowerDecay(c=1.0, d=2.0, e=1.0)  # 1/2, 1/3, 1/4
    noise = PowerDecay(c=6.0, d=1.0, e=0.5)  # v(1..3) = 6/sqrt2, 6/sqrt3, 3
    expected_terms = 432.0 * np.array([math.sqrt(2) / 12, math.sqrt(3) / 18, 1 / 12])
    np.testing.assert_allclose(epsilon_per_step(SENS, alpha, noise, 3), expected_terms,
                               rtol=1e-14)
    assert epsilon_sum(SENS, alpha, noise, 3) == pytest.approx(expected_terms.sum(), rel=1e-14)
    # The closed form 4 dX (c_a/c_v) T sqrt(m n_M)(...) = 432 * (1/6) * 3 = 216 bounds it.
    assert epsilon_closed_form(SENS, alpha, noise, 3) == pytest.approx(216.0, rel=1e-15)
    assert epsilon_sum(SENS, alpha, noise, 3) < 216.0


def test_closed_form_is_exact_when_ratios_are_constant():
    # d_alpha = d_v + 1 and e_alpha = e_v make alpha(t)/v(t+1) = c_alpha/c_v for every t.
    alpha = PowerDecay(c=0.3, d=11.0, e=0.7)
    noise = PowerDecay(c=5.0, d=10.0, e=0.7)
    steps = 1000
    assert epsilon_sum(SENS, alpha, noise, steps) == pytest.approx(
        432.0 * 0.3 / 5.0 * steps, rel=1e-12)
    assert epsilon_closed_form(SENS, alpha, noise, steps) == pytest.approx(
        432.0 * 0.3 / 5.0 * steps, rel=1e-15)


@settings(max_examples=60, deadline=None)
@given(
    c_alpha=st.floats(1e-3, 10), c_v=st.floats(1e-3, 10),
    d_v=st.floats(0.01, 50), gap=st.floats(1.0, 50),
    e_v=st.floats(0.01, 2), e_extra=st.floats(0.0, 2), steps=st.integers(1, 400),
)
def test_closed_form_bounds_the_sum_when_its_conditions_hold(c_alpha, c_v, d_v, gap, e_v,
                                                             e_extra, steps):
    alpha = PowerDecay(c_alpha, d_v + gap, e_v + e_extra)
    noise = PowerDecay(c_v, d_v, e_v)
    assert closed_form_violations(alpha, noise) == []
    assert epsilon_sum(SENS, alpha, noise, steps) <= epsilon_closed_form(
        SENS, alpha, noise, steps) * (1 + 1e-12)


@pytest.mark.parametrize(
    ("alpha", "noise", "fragment"),
    [
        (PowerDecay(1.0, 2.0, 0.5), PowerDecay(1.0, 1.0, 0.6), "e_v <= e_alpha"),
        (PowerDecay(1.0, 1.5, 1.0), PowerDecay(1.0, 1.0, 1.0), "d_v + 1 <= d_alpha"),
        (PowerDecay(1.0, 2.0, 0.0), PowerDecay(1.0, 1.0, 0.0), "e_alpha must be > 0"),
    ],
)
def test_closed_form_refuses_when_a_condition_fails(alpha, noise, fragment):
    with pytest.raises(DPDLError, match="does not apply") as info:
        epsilon_closed_form(SENS, alpha, noise, 10)
    assert fragment in str(info.value)
    report = privacy_report(SENS, alpha, noise, 10)
    assert report.epsilon_closed_form is None
    assert any(fragment in reason for reason in report.closed_form_violations)
    # The exact sum is still available and finite.
    assert math.isfinite(report.epsilon) and report.epsilon > 0


def test_privacy_report_holds_both_numbers():
    alpha = PowerDecay(0.1, 100.0, 0.5)
    noise = PowerDecay(2.0, 99.0, 0.5)
    report = privacy_report(SENS, alpha, noise, 500).to_dict()
    assert report["epsilon"] == pytest.approx(432 * 0.05 * 500, rel=1e-12)
    assert report["epsilon_closed_form"] == pytest.approx(432 * 0.05 * 500, rel=1e-15)
    assert report["sensitivity"]["coefficient"] == pytest.approx(432.0)


@pytest.mark.parametrize("target", [0.5, 10.0, 1e6])
@pytest.mark.parametrize("noise_shape", [(99.0, 0.5), (3.0, 1.2), (0.5, 0.0)])
def test_calibration_matches_a_root_find(target, noise_shape):
    alpha = PowerDecay(0.1, 100.0, 0.5)
    d_v, e_v = noise_shape
    steps = 2000
    noise = calibrate_noise_scale(target, SENS, alpha, steps, noise_offset=d_v,
                                  noise_exponent=e_v)
    assert (noise.d, noise.e) == (d_v, e_v)
    achieved = epsilon_sum(SENS, alpha, noise, steps)
    assert achieved <= target  # fails closed
    assert achieved == pytest.approx(target, rel=1e-12)

    def gap(log_c):
        return epsilon_sum(SENS, alpha, PowerDecay(math.exp(log_c), d_v, e_v), steps) - target

    root = math.exp(brentq(gap, -60.0, 60.0, xtol=1e-14, rtol=1e-14))
    assert noise.c == pytest.approx(root, rel=1e-9)


def test_calibration_rejects_bad_targets():
    alpha = PowerDecay(0.1, 100.0, 0.5)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(DPDLError, match="epsilon"):
            calibrate_noise_scale(bad, SENS, alpha, 10, noise_offset=1.0, noise_exponent=0.5)


def test_data_norm_bounds_scale_with_sqrt_records():
    assert data_norm_bounds(0.5, 2.0, 16) == pytest.approx((2.0, 8.0))
    with pytest.raises(DPDLError, match="row_norm"):
        data_norm_bounds(0.0, 1.0, 4)
    with pytest.raises(DPDLError, match="max_local_records"):
        data_norm_bounds(1.0, 1.0, 0)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"c": 0.0, "d": 1.0, "e": 1.0}, "scale c"),
        ({"c": 1.0, "d": 0.0, "e": 1.0}, "offset d"),
        ({"c": 1.0, "d": 1.0, "e": -0.5}, "exponent e"),
        ({"c": float("nan"), "d": 1.0, "e": 1.0}, "scale c"),
    ],
)
def test_power_decay_rejects_bad_parameters(kwargs, fragment):
    with pytest.raises(DPDLError, match=fragment):
        PowerDecay(**kwargs)


def test_power_decay_values():
    np.testing.assert_allclose(PowerDecay(6.0, 2.0, 0.5)([0, 2, 7]), [6 / math.sqrt(2), 3, 2])
    with pytest.raises(DPDLError, match="t >= 0"):
        PowerDecay(1.0, 1.0, 1.0)(-1)


def test_sensitivity_rejects_bad_values():
    with pytest.raises(DPDLError, match="num_nodes"):
        LinRegSensitivity(1.0, 1.0, 1.0, 3, 5, 0)
    with pytest.raises(DPDLError, match="delta_x"):
        LinRegSensitivity(-1.0, 1.0, 1.0, 3, 5, 2)
    with pytest.raises(DPDLError, match="steps"):
        epsilon_sum(SENS, PowerDecay(1, 2, 1), PowerDecay(1, 1, 1), 0)


def test_accounting_module_does_not_import_torch():
    code = "import sys, dpdl.extensions.linreg.accounting; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
