"""The noise that seed 002's published experiment calibrated for centralized and local DP-SGD,
beside dpdl's certified calibrations of the same mechanisms (docs/results/netdp.md).

    python examples/netdp_paper_calibration.py

The paper's centralized DP-SGD uses Bassily et al.'s 2014 bound,
σ = 16 L √(T ln(2/δ) ln(1.25 T/(δ n))) / (n ε), and its local DP-SGD composes
K = ⌈1.2 T/n⌉ Gaussian releases by advanced composition with δ split evenly (per-release ε₀
from √(2K ln(K/δ)) ε₀ + K ε₀ (e^ε₀ − 1) = ε, then σ = √(2 ln(1.25 K/δ)) L/ε₀).  dpdl's:
``dp_accounting``'s RDP of one user sampled without replacement per step, and exact GDP of
the capped releases (σ in gradient units, sensitivity 2L, L = 1).
"""

from __future__ import annotations

import math

from scipy.optimize import brentq

from dpdl.extensions.netdp import accounting as nd
from dpdl.extensions.netdp.experiment import central_noise_multiplier

N, T, DELTA, L = 2000, 20000, 1e-6, 1.0


def bassily_central(epsilon: float) -> float:
    return 16 * L * math.sqrt(T * math.log(2 / DELTA) * math.log(1.25 * T / (DELTA * N))) / (
        N * epsilon)


def advanced_composition_local(epsilon: float, factor: float = 1.2) -> float:
    k = math.ceil(factor * T / N)
    per_release_delta = DELTA / k
    eps0 = brentq(lambda e: math.sqrt(2 * k * math.log(1 / per_release_delta)) * e
                  + k * e * math.expm1(e) - epsilon, 1e-12, epsilon)
    return math.sqrt(2 * math.log(1.25 / per_release_delta)) * L / eps0


def main() -> int:
    cap = nd.contribution_cap(1.5, T, N)
    print("| ε | paper: central (Bassily) | paper: local (advanced composition) | "
          "dpdl: central (RDP) | dpdl: local (GDP, cap 15) |")
    print("|---|---|---|---|---|")
    for eps in (1.0, 10.0):
        central = 2 * L * central_noise_multiplier(N, T, eps, DELTA)
        local = 2 * L * nd.local_noise_multiplier_for_target(cap, eps, DELTA)
        print(f"| {eps:g} | {bassily_central(eps):.3g} | {advanced_composition_local(eps):.3g} "
              f"| {central:.3g} | {local:.3g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
