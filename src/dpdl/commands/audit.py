"""``dpdl audit``: empirical lower bounds on ε from canaries through the real engine.

The statistics are those of MATH.md §8.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from typing import Any

from dpdl.accounting.certified import accountant_names, get_accountant
from dpdl.commands import audit_reconstruct
from dpdl.errors import DPDLError, require

HELP = "Audit a private algorithm empirically: canaries, hypothesis tests, a lower ε bound."

CANARY_FOR_THREAT = {"messages": "gradient", "final": "input", "observer": "gradient"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", nargs="?", help="a run config (TOML): audit its first private algorithm"
    )
    parser.add_argument("--algorithm", help="const-d2p, dyn-d2p, dyn-c-d2p, dyn-mu-d2p, general")
    parser.add_argument("--epsilon", type=float, help="the claimed (target) epsilon")
    parser.add_argument("--delta", type=float, help="target delta (default 1e-4)")
    parser.add_argument("--steps", type=int, help="number of iterations K")
    parser.add_argument("--sample-rate", type=float, help="Poisson sampling rate p in (0, 1]")
    parser.add_argument("--calibrate", choices=accountant_names(), help="accountant (pld)")
    parser.add_argument("--clip", type=float, help="C̄ (default 1.0)")
    parser.add_argument("--clip0", type=float, help="C0 of the decaying clip (default C̄)")
    parser.add_argument("--rho-c", type=float, help="clip decay ρ_c > 1 (default 2)")
    parser.add_argument("--rho-mu", type=float, help="budget growth ρ_μ > 1 (default 2)")
    parser.add_argument(
        "--threat",
        choices=("messages", "final", "observer", "reconstruct", "implementation"),
        default="messages",
        help="messages: a curious out-neighbour sees every message of the canary's node "
        "(white-box); final: only the final network-average model (default messages); "
        "observer: only what --observer nodes receive; "
        "reconstruct: a coalition reconstructs other nodes' data (see below); "
        "implementation: bit-level attacks on the released float32 messages and a "
        "record-play check of the sensitivity (--noise picks the mechanism attacked)",
    )
    parser.add_argument(
        "--canary",
        choices=("gradient", "input"),
        help="gradient (fixed clipped gradient of norm C) or input (a mislabelled record); "
        "default gradient for messages, input for final",
    )
    parser.add_argument("--observer", type=int, nargs="+", metavar="NODE",
                        help="--threat observer: the curious node(s) (the canary is on node 0)")
    parser.add_argument("--trials", type=int, help="independent trials (default 5000)")
    parser.add_argument(
        "--one-run",
        type=int,
        metavar="M",
        help="instead of independent trials: ONE run with M gradient canaries, each in with "
        "probability 1/2, bounded by Steinke, Nasr & Jagielski's one-run theorem",
    )
    parser.add_argument(
        "--noise-scale",
        type=float,
        default=1.0,
        help="multiply the noise the engine adds by S (S < 1: an implementation that adds too "
        "little); the claim stays the calibrated epsilon",
    )
    parser.add_argument("--confidence", type=float, default=0.95, help="default 0.95")
    parser.add_argument("--nodes", type=int, dest="nodes_given",
                        help="nodes per trial network (2; reconstruct: 12 or the edge list's)")
    parser.add_argument("--topology", help="trial network topology (exp; edgelist with "
                        "--edgelist)")
    parser.add_argument("--records", type=int, default=8, help="ordinary records per node (8)")
    parser.add_argument("--correlation", help="the noise's correlation across nodes: "
                        "independent (default) or pairwise (DECOR; --threat observer only)")
    parser.add_argument("--correlation-factor", type=float, metavar="F",
                        help="pairwise noise std over the independent noise's")
    parser.add_argument(
        "--seed",
        type=int,
        help="seed the trials' noise and sampling (a reproducible audit, labelled as such); "
        "default: OS entropy",
    )
    parser.add_argument(
        "--noise",
        default="exact",
        help="the noise mechanism audited: exact (the engine's, default), or one of the old "
        "floating-point samplers kept to be refuted: legacy-box-muller, legacy-hardened",
    )
    parser.add_argument("--plot", default="audit.png",
                        help="PNG of scores and ROC, PDF and SVG beside it (audit.png)")
    parser.add_argument("--no-plot", action="store_true", help="write no PNG")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    audit_reconstruct.add_arguments(parser)


def _from_config(args) -> dict:
    """Mechanism settings of a run config: its first private algorithm, first epsilon, K, p."""
    from dpdl.experiments.config import parse_config
    from dpdl.experiments.registry import kind_of, load_config_file
    from dpdl.experiments.runner import prepare_workload
    from dpdl.training.settings import AlgorithmSpec

    raw = load_config_file(args.config)
    require(
        kind_of(raw).audits,
        f"{args.config}: dpdl audit takes a 'decentralized' run config, not {raw.get('kind')!r}",
    )
    config = parse_config(raw)
    specs = [AlgorithmSpec.parse(a) for a in config.experiment.algorithms]
    private = [s for s in specs if s.private]
    require(private, f"{args.config}: no private algorithm to audit")
    spec = private[0]
    seed = config.experiment.seed
    work = prepare_workload(config, seed[0] if isinstance(seed, list) else seed)
    p = config.privacy
    calibrate = spec.calibrate or p.calibrate
    return {
        "algorithm": spec.label.split("@")[0],  # name(settings): its view is audited
        "epsilon": p.epsilons[0],
        "delta": p.delta,
        "steps": work.steps,
        "sample_rate": work.sample_rate,
        "calibrate": calibrate,
        "clip": p.clip,
        "clip0": p.clip0,
        "rho_c": p.rho_c,
        "rho_mu": p.rho_mu,
        "blocks": p.calibration_blocks if get_accountant(calibrate).calibration_blocks else None,
        "correlation": p.correlation,
        "correlation_factor": p.correlation_factor,
    }


def _settings(args) -> dict:
    settings = _from_config(args) if args.config else {}
    given = {
        "algorithm": args.algorithm,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "steps": args.steps,
        "sample_rate": args.sample_rate,
        "calibrate": args.calibrate,
        "clip": args.clip,
        "clip0": args.clip0,
        "rho_c": args.rho_c,
        "rho_mu": args.rho_mu,
        "correlation": args.correlation,
        "correlation_factor": args.correlation_factor,
    }
    settings.update({k: v for k, v in given.items() if v is not None})
    settings.setdefault("delta", 1e-4)
    settings.setdefault("calibrate", "pld")
    for key, flag in (("algorithm", "--algorithm"), ("epsilon", "--epsilon"), ("steps", "--steps"),
                      ("sample_rate", "--sample-rate")):  # fmt: skip
        if settings.get(key) is None:
            raise DPDLError(f"{flag} is required (or give a run config)")
    return settings


def _validate(args) -> None:
    if args.one_run is not None and args.trials is not None:
        raise DPDLError("give either --trials (independent runs) or --one-run M, not both")
    if args.one_run is not None and args.one_run < 2:
        raise DPDLError(f"--one-run needs at least 2 canaries, got {args.one_run}")
    if args.trials is not None and args.trials < 2:
        raise DPDLError(f"--trials must be >= 2, got {args.trials}")
    if not (math.isfinite(args.noise_scale) and args.noise_scale > 0):
        raise DPDLError(f"--noise-scale must be positive, got {args.noise_scale}")
    if not 0 < args.confidence < 1:
        raise DPDLError(f"--confidence must lie in (0, 1), got {args.confidence}")
    from dpdl.audit.trials import noise_mechanism

    noise_mechanism(args.noise)
    if args.threads < 1:
        raise DPDLError(f"--threads must be >= 1, got {args.threads}")


def _distance(design: dict) -> int:
    """Hops from the canary's node 0 to the nearest observer."""
    from dpdl.accounting.gossip import graph_distances
    from dpdl.topology import make_topology

    topology = make_topology(design["topology"], design["nodes"])
    dist = graph_distances(topology.mixing_matrix, topology.period)
    return int(min(dist[0, v] for v in design["observers"]))


def _fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"


def _print(result, plot_path) -> None:
    r = result
    seeded = ", seeded (reproducible)" if r.seeded else ""
    seeded += f", noise {r.noise}" if r.noise != "exact" else ""
    print(f"audit of {r.algorithm} calibrated with {r.calibrated_with} to epsilon "
          f"{r.epsilon_claimed:g} at delta {r.delta:g}: K = {r.steps}, p = {r.sample_rate:g}, "
          f"noise scale {r.noise_scale:g}")  # fmt: skip
    if r.one_run is None:
        runs = f"{r.trials} independent trials"
    else:
        runs = (f"one run, {r.one_run['canaries']} canaries, {r.one_run['correct']} of "
                f"{r.one_run['guesses']} guesses right")  # fmt: skip
    print(f"threat: {r.threat} ({r.canary} canary), {runs}, "
          f"confidence {r.confidence:g}{seeded}")  # fmt: skip
    how = "Clopper-Pearson, Bonferroni" if r.one_run is None else "one-run bound, Bonferroni"
    print(f"  epsilon_lower ({how}; sound)".ljust(54) + f"{r.epsilon_lower:.4g}")
    if r.epsilon_lower_gdp is None:
        why = "p < 1: not Gaussian" if r.one_run is None else "one run: no independent trials"
        print(f"  epsilon_lower_gdp                                   n/a ({why})")
    else:
        print(f"  epsilon_lower_gdp (assumes an exact Gaussian, p = 1)  {r.epsilon_lower_gdp:.4g}"
              f"  (mu_lower {r.mu_lower_gdp:.4g})")  # fmt: skip
    print(f"  epsilon_clt (approximation)                         {_fmt(r.epsilon_clt)}")
    print(f"  epsilon_certified (PLD)                             {_fmt(r.epsilon_certified)}")
    if r.mu_view is not None:
        observers = r.design["observers"]
        print(f"  epsilon_view (exact privacy of {observers}'s view)".ljust(54)
              + f"{r.epsilon_view:.4g}  (mu {r.mu_view:.4g}; distance "
              f"{_distance(r.design)})")  # fmt: skip
    verdict = "REFUTED" if r.claim_refuted else "not refuted"
    speed = f"{r.trials_per_second:.0f} trials/s" if r.one_run is None else "one run"
    print(f"claim epsilon {r.epsilon_claimed:g}: {verdict} ({speed})")
    if plot_path is not None:
        print(f"plot: {plot_path}")


def _correlation_asked(args) -> str:
    """The noise correlation the command line or the config asks for (independent if none)."""
    if args.correlation:
        return args.correlation
    if getattr(args, "config", None):
        from dpdl.experiments.registry import load_config_file

        correlation = load_config_file(args.config).get("privacy", {}).get("correlation")
        return correlation or "independent"
    return "independent"


def run(args) -> int:
    correlation = _correlation_asked(args)
    require(correlation == "independent" or args.threat == "observer",
            f"correlated noise ({correlation}) is audited under --threat observer; --threat "
            f"{args.threat} plays independent noise")  # fmt: skip
    if args.threat == "reconstruct":
        return audit_reconstruct.run(args)
    if args.threat == "implementation":
        return _run_implementation(args)
    args.nodes = 2 if args.nodes_given is None else args.nodes_given
    args.topology = args.topology or "exp"
    require(args.edgelist is None, "--edgelist is for --threat reconstruct")
    require(args.threat == "observer" or args.observer is None,
            "--observer needs --threat observer")  # fmt: skip
    require(args.threat != "observer" or args.observer, "--threat observer needs --observer")
    _validate(args)
    import torch

    from dpdl.accounting.schedules import ShapeOptions
    from dpdl.audit import AuditDesign, run_audit, run_one_run_audit
    from dpdl.audit.runner import DEFAULT_TRIALS, AuditExecution

    torch.set_num_threads(args.threads)
    s = _settings(args)
    design = AuditDesign(
        threat=args.threat,
        canary=args.canary or CANARY_FOR_THREAT[args.threat],
        nodes=args.nodes,
        topology=args.topology,
        records_per_node=args.records,
        observers=tuple(args.observer or ()) if args.threat == "observer" else (1,),
        correlation=s.get("correlation") or "independent",
        correlation_factor=s.get("correlation_factor"),
    )
    shape = {k: s[k] for k in ("clip", "clip0", "rho_c", "rho_mu") if s.get(k) is not None}
    options: dict[str, Any] = {"options": ShapeOptions(**shape)}
    if s.get("blocks") is not None:
        options["blocks"] = s["blocks"]
    execution = AuditExecution(
        noise_scale=args.noise_scale, confidence=args.confidence, seed=args.seed,
        noise=args.noise, progress=not (args.no_progress or args.json),
    )  # fmt: skip
    common = {
        "epsilon": s["epsilon"], "delta": s["delta"], "steps": s["steps"],
        "sample_rate": s["sample_rate"], "calibrate": s["calibrate"], "design": design,
        "schedule_options": options, "execution": execution,
    }  # fmt: skip
    if args.one_run is not None:
        if args.canary == "input":
            raise DPDLError("a one-run audit uses gradient canaries (--canary gradient)")
        design = dataclasses.replace(design, canary="gradient")
        result = run_one_run_audit(
            s["algorithm"], canaries=args.one_run, **{**common, "design": design}
        )
    else:
        result = run_audit(s["algorithm"], trials=args.trials or DEFAULT_TRIALS, **common)
    plot_path = None
    if not args.no_plot:
        from dpdl.audit.plot import plot_audit

        plot_path = str(plot_audit(result, args.plot))
    if args.json:
        out = result.to_dict()
        out["plot"] = plot_path
        print(json.dumps(out, indent=2))
    else:
        _print(result, plot_path)
    return 0


def _run_implementation(args) -> int:
    """``--threat implementation``: the bit-level games and record-play (MATH.md §10.5)."""
    import torch

    from dpdl.audit.implementation import audit_implementation
    from dpdl.audit.trials import noise_mechanism

    epsilon = 1.0 if args.epsilon is None else args.epsilon
    delta = 1e-5 if args.delta is None else args.delta
    require(math.isfinite(epsilon) and epsilon > 0, f"--epsilon must be positive, got {epsilon}")
    require(0 < delta < 1, f"--delta must lie in (0, 1), got {delta}")
    require(args.trials is None or args.trials >= 2, f"--trials must be >= 2, got {args.trials}")
    require(0 < args.confidence < 1, f"--confidence must lie in (0, 1), got {args.confidence}")
    noise_mechanism(args.noise)
    torch.set_num_threads(args.threads)
    result = audit_implementation(args.noise, epsilon=epsilon, delta=delta,
                                  trials=args.trials or 200, confidence=args.confidence,
                                  seed=args.seed)  # fmt: skip
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return 0
    print(f"implementation audit of noise {result.noise!r}: claim epsilon {epsilon:g} at delta "
          f"{delta:g} (one step, p = 1, sigma {result.sigma:.4g}), {result.trials} games per "
          f"world, confidence {result.confidence:g}")  # fmt: skip
    for test in result.tests:
        verdict = "REFUTED" if test.refuted else "passed"
        if test.name == "record-play":
            d = test.detail
            print(f"  record-play   sensitivity measured/declared "
                  f"{d['max_distance_over_declared_sensitivity']:.7f}, elsewhere "
                  f"{d['max_distance_elsewhere']:.3g} (mu {d['mu_elsewhere_per_step']:.3g} a "
                  f"step): {verdict}")  # fmt: skip
        else:
            d = test.detail
            print(f"  {test.name:<13} said 'in' {d['said_in_given_in']}/{d['trials_per_world']} "
                  f"with the target, {d['said_in_given_out']}/{d['trials_per_world']} without: "
                  f"epsilon_lower {test.epsilon_lower:.3g}: {verdict}")  # fmt: skip
    print(f"claim epsilon {epsilon:g}: {'REFUTED' if result.claim_refuted else 'not refuted'}")
    return 0
