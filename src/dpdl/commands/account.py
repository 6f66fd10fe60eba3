"""``dpdl account``: calibrate a Dyn-D2P family schedule and report its ε (MATH.md §1-2).

Example::

    dpdl account --algorithm dyn-mu-d2p --epsilon 1 --delta 1e-4 --steps 10000 \\
        --sample-rate 0.0004 --rho-mu 2 --calibrate clt --report clt,pld,rdp --json

Never imports torch.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dpdl.accounting.certified import ACCOUNTANTS
from dpdl.accounting.schedules import (
    ALGORITHMS,
    DEFAULT_CLIP,
    DEFAULT_RHO_C,
    DEFAULT_RHO_MU,
    ShapeOptions,
    calibrate,
)
from dpdl.accounting.validators import DEFAULT_NEIGHBORING, NEIGHBORING_RELATIONS
from dpdl.errors import DPDLError, require

HELP = "Privacy accounting of a Dyn-D2P family schedule (CLT, PLD, RDP)."

# Warn when the tightest certified ε exceeds the CLT's by more than this factor.
CLT_GAP_WARNING_RATIO = 1.2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--algorithm", required=True,
                        help=f"one of {', '.join(ALGORITHMS)}, or a registered algorithm "
                             "name(key=value, ...) (its schedule and releases per step)")
    parser.add_argument("--epsilon", type=float, help="target epsilon (> 0)")
    parser.add_argument("--delta", type=float, default=1e-4, help="target delta (default 1e-4)")
    parser.add_argument("--steps", type=int, required=True, help="number of iterations K")
    rate = parser.add_argument_group("sampling (give --sample-rate, or both of the others)")
    rate.add_argument("--sample-rate", type=float, help="Poisson sampling rate p in (0, 1]")
    rate.add_argument("--dataset-size", type=int, help="records per node J (p = b / J)")
    rate.add_argument("--batch-size", type=int, help="expected batch size b")
    parser.add_argument("--clip", type=float, default=DEFAULT_CLIP, help="C̄ (default 1.0)")
    parser.add_argument("--clip0", type=float, help="C0 of the decaying clip (default C̄)")
    parser.add_argument("--rho-c", type=float, help=f"clip decay ρ_c > 1 (default {DEFAULT_RHO_C})")
    parser.add_argument(
        "--rho-mu", type=float, help=f"budget growth ρ_μ > 1 (default {DEFAULT_RHO_MU})"
    )
    parser.add_argument(
        "--calibrate",
        default="pld",
        help=f"accountant to calibrate with: {_accountants_help()} (default pld)",
    )
    parser.add_argument(
        "--neighboring",
        default=DEFAULT_NEIGHBORING,
        help=f"neighbouring relation: {' or '.join(NEIGHBORING_RELATIONS)} (default "
        f"{DEFAULT_NEIGHBORING}, a run's default; add-remove when node sizes are secret)",
    )
    parser.add_argument(
        "--report",
        default=",".join(ACCOUNTANTS),
        help=f"comma-separated accountants to report (default {','.join(ACCOUNTANTS)})",
    )
    parser.add_argument(
        "--blocks", type=int, help="use the blocked PLD upper bound with this many blocks"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--schedule-out", metavar="FILE.csv", help="write per-step k, C_k, mu_k, sigma_k"
    )


def _accountants_help() -> str:
    """The registered accountants, each marked certified or approximate."""
    return ", ".join(f"{name} ({'certified' if accountant.certified else 'approximate'})"
                     for name, accountant in ACCOUNTANTS.items())  # fmt: skip


def _sample_rate(args: argparse.Namespace) -> float:
    if args.sample_rate is not None:
        require(
            args.dataset_size is None and args.batch_size is None,
            "give either --sample-rate or --dataset-size with --batch-size, not both",
        )
        return args.sample_rate
    require(
        args.dataset_size is not None and args.batch_size is not None,
        "give --sample-rate, or both --dataset-size and --batch-size",
    )
    require(args.dataset_size >= 1, f"--dataset-size must be >= 1, got {args.dataset_size}")
    require(args.batch_size >= 1, f"--batch-size must be >= 1, got {args.batch_size}")
    require(
        args.batch_size <= args.dataset_size,
        f"--batch-size {args.batch_size} exceeds --dataset-size {args.dataset_size}",
    )
    return args.batch_size / args.dataset_size


def _accountant_list(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    require(names, f"--report needs at least one accountant, got {text!r}")
    for name in names:
        require(
            name in ACCOUNTANTS,
            f"unknown accountant {name!r} in --report; expected some of {', '.join(ACCOUNTANTS)}",
        )
    return list(dict.fromkeys(names))


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def _validate(args: argparse.Namespace) -> None:
    from dpdl.algorithms.registry import resolve

    algorithm, settings = resolve(args.algorithm)  # one line naming an unknown one
    args.family = algorithm.schedule
    args.releases = algorithm.schedule_releases(settings)
    require(
        args.calibrate in ACCOUNTANTS,
        f"unknown accountant {args.calibrate!r} for --calibrate; expected one of "
        f"{', '.join(ACCOUNTANTS)}",
    )
    require(
        args.neighboring in NEIGHBORING_RELATIONS,
        f"unknown --neighboring {args.neighboring!r}; use one of "
        f"{', '.join(NEIGHBORING_RELATIONS)}",
    )
    require(args.steps >= 1, f"--steps must be >= 1, got {args.steps}")
    if ALGORITHMS[args.family].private:
        require(args.epsilon is not None, f"--epsilon is required for {args.algorithm}")
    if args.epsilon is not None:
        require(
            math.isfinite(args.epsilon) and args.epsilon > 0,
            f"--epsilon must be > 0, got {args.epsilon}",
        )
    require(0 < args.delta < 1, f"--delta must lie in (0, 1), got {args.delta}")
    for flag, value in (("--rho-c", args.rho_c), ("--rho-mu", args.rho_mu)):
        require(
            value is None or (math.isfinite(value) and value > 1),
            f"{flag} must be > 1, got {value}",
        )
    for flag, value in (("--clip", args.clip), ("--clip0", args.clip0)):
        require(
            value is None or (math.isfinite(value) and value > 0),
            f"{flag} must be > 0, got {value}",
        )
    require(args.blocks is None or args.blocks >= 1, f"--blocks must be >= 1, got {args.blocks}")


def _warnings(reports: dict[str, Any]) -> list[str]:
    """Warn when an approximate accountant's ε (the CLT's) is far below the tightest
    certified ε (MATH.md §1.3, §2)."""
    certified = [
        reports[name]
        for name, accountant in ACCOUNTANTS.items()
        if accountant.certified and name in reports and math.isfinite(reports[name].epsilon)
    ]
    warnings = []
    for name, accountant in ACCOUNTANTS.items():
        approximate = reports.get(name) if not accountant.certified else None
        if approximate is None or not certified or not approximate.epsilon > 0:
            continue
        tightest = min(certified, key=lambda report: report.epsilon)
        if tightest.epsilon <= CLT_GAP_WARNING_RATIO * approximate.epsilon:
            continue
        warnings.append(
            f"the {accountant.display} epsilon {approximate.epsilon:.4g} is far below the "
            f"certified {tightest.accountant} epsilon {tightest.epsilon:.4g} "
            f"({tightest.epsilon / approximate.epsilon:.2f}x): the {accountant.display} is an "
            "approximation that understates the privacy loss here (small sampling rate / noise)"
        )
    return warnings


def _write_schedule(path: str, table: np.ndarray) -> None:
    try:
        np.savetxt(
            Path(path),
            table,
            delimiter=",",
            header="k,C_k,mu_k,sigma_k",
            comments="",
            fmt=["%d", "%.17g", "%.17g", "%.17g"],
        )
    except OSError as err:
        raise DPDLError(f"cannot write --schedule-out {path!r}: {err.strerror}") from None


def run(args: argparse.Namespace) -> int:
    _validate(args)
    sample_rate = _sample_rate(args)
    require(0 < sample_rate <= 1, f"--sample-rate must lie in (0, 1], got {sample_rate}")
    report_names = _accountant_list(args.report)
    # The CLT is cheap: always compute it so the gap warning can be given.
    computed = list(dict.fromkeys([*report_names, "clt"]))
    options: dict[str, Any] = {
        "epsilon": args.epsilon,
        "delta": args.delta,
        "steps": args.steps,
        "sample_rate": sample_rate,
        "options": ShapeOptions(
            clip=args.clip,
            clip0=args.clip0,
            rho_c=DEFAULT_RHO_C if args.rho_c is None else args.rho_c,
            rho_mu=DEFAULT_RHO_MU if args.rho_mu is None else args.rho_mu,
        ),
        "calibrate": args.calibrate,
        "blocks": args.blocks,
        "neighboring": args.neighboring,
        "releases": args.releases,
    }
    result = calibrate(args.family, report=computed, **options)
    schedule = result.schedule
    warnings = _warnings(result.reports) if schedule.private else []
    if args.schedule_out:
        _write_schedule(args.schedule_out, schedule.table())

    summary = schedule.to_dict()
    summary.update(
        {
            "epsilon_target": args.epsilon,
            "delta": args.delta,
            "epsilon": {n: _finite_or_none(result.reports[n].epsilon) for n in report_names},
            "certified": {n: result.reports[n].certified for n in report_names},
            "method": {n: result.reports[n].method for n in report_names},
            # the binned PLD's lower companion: the exact ε lies in [epsilon_lower, epsilon]
            "epsilon_lower": {
                n: _finite_or_none(result.reports[n].epsilon_lower)
                for n in report_names
                if result.reports[n].epsilon_lower is not None
            },
            "warnings": warnings,
        }
    )
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary, schedule, result.reports, report_names)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
    return 0


def _ends(values: np.ndarray | None) -> str:
    if values is None:
        return "—"
    return f"{values[0]:.6g} -> {values[-1]:.6g}"


def _print_summary(summary, schedule, reports, report_names) -> None:
    print(
        f"{schedule.algorithm}: K = {schedule.steps} steps, sample rate p = "
        f"{schedule.sample_rate:.6g}, delta = {summary['delta']:g}, neighbouring relation "
        f"{schedule.neighboring}"
    )
    if not schedule.private:
        print("  non-private (no clipping, no noise): no finite epsilon")
        return
    print(
        f"  target epsilon {summary['epsilon_target']:g}, calibrated with "
        f"{schedule.calibrated_with}"
        + (" (certified)" if ACCOUNTANTS[schedule.calibrated_with].certified
           else " (approximate)")
    )
    print(f"  clip C_k           {_ends(schedule.clip)}")
    print(f"  budget mu_k        {_ends(schedule.mu)}")
    print(f"  noise sigma_k      {_ends(schedule.sigma)}")
    print(f"  multiplier z_k     {_ends(schedule.noise_multipliers)}")
    for key in ("mu0", "mu_bar", "sigma_scale", "mu_tot"):
        if summary.get(key) is not None:
            label = "mu_tot (CLT)" if key == "mu_tot" else key
            print(f"  {label:<18} {summary[key]:.6g}")
    print("  epsilon:")
    for name in report_names:
        report = reports[name]
        kind = (f"certified ({report.method})" if report.certified
                else f"approximate ({ACCOUNTANTS[name].display})")
        if report.epsilon_lower is not None and report.epsilon_lower != report.epsilon:
            # the exact composition lies in between: the report shows how tight it is
            bracket = f"[{report.epsilon_lower:.6g}, {report.epsilon:.6g}]"
            print(f"    {name:<4} {bracket}   {kind}, upper bound certified")
        else:
            print(f"    {name:<4} {report.epsilon:10.6g}   {kind}")
