"""``dpdl run``: train from a config file, a shipped preset, or the embedded default."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

from dpdl.errors import DPDLError

HELP = "Train with the simulator (or the distributed runtime) from a config or preset."

DEFAULT_PRESET = "default"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", nargs="?", help="a TOML config file (default: the embedded default preset)"
    )
    parser.add_argument("--preset", help="run a shipped preset (e.g. default, fashion-mnist)")
    parser.add_argument(
        "--output", default="runs", help="folder under which the run folder is made (runs/)"
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:N or auto (overrides the config)")
    parser.add_argument("--seed", type=int, help="seed (overrides the config's seeds)")
    parser.add_argument("--steps", type=int, help="number of iterations (overrides the config)")
    parser.add_argument("--runtime", metavar="NAME",
                        help="execution runtime: simulator, distributed or a registered one")
    add_noise_arguments(parser)
    parser.add_argument(
        "--procs",
        type=int,
        help="with --runtime distributed: start this many local processes (else use torchrun)",
    )
    parser.add_argument(
        "--consortium", metavar="FILE",
        help="run as one party of the consortium FILE (with --party): mutual-TLS links to the "
        "graph neighbours only (docs/THREAT_MODEL.md)",
    )
    parser.add_argument("--party", help="with --consortium: this party's name in the file")
    parser.add_argument(
        "--resume",
        metavar="RUN_DIR",
        help="continue a run folder from its last checkpoint (training.checkpoint_every)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default 1 unless OMP_NUM_THREADS is set: the per-step work "
        "of small models is too fine-grained for intra-op threads: 2 threads measured 0.8x the "
        "speed of 1 on an idle 2-core machine, 3x slower on a busy one; raise it for large "
        "models such as resnet18-gn)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--vector-figures", action="store_true",
                        help="write curves.png's PDF and SVG beside it (a paper's figure; "
                             "experiment.vector_figures in a config)")  # fmt: skip
    parser.add_argument("--list-presets", action="store_true", help="list presets and exit")


def add_noise_arguments(parser: argparse.ArgumentParser) -> None:
    """``--entropy``, shared by ``dpdl run``, ``dpdl sweep`` and ``dpdl tune``."""
    parser.add_argument(
        "--entropy",
        choices=("os", "seed"),
        help="where the secret sampling and noise streams come from: os (secret, the default) or "
        "seed (reproducible noise for research: anyone who knows the seed can remove it)",
    )


def warn_if_reproducible(config: dict) -> None:
    """One line on stderr when a run's noise is derived from its seed."""
    import sys

    if config.get("experiment", {}).get("entropy") == "seed" and main_process():
        print(
            "warning: entropy = seed: the noise is reproducible from the seed, so it protects "
            "nothing against anyone who knows it; use it for research, never on real data",
            file=sys.stderr,
        )
        if config["experiment"].get("common_noise"):
            print("warning: common_noise = true: every algorithm and setting of a seed draws "
                  "the same noise on purpose (research mode, paired comparisons)",
                  file=sys.stderr)  # fmt: skip


def main_process() -> bool:
    """Whether this is the process that speaks: every one outside the distributed runtime,
    rank 0 within it (the others keep quiet: one voice)."""
    return os.environ.get("RANK", "0") == "0"


def apply_command_overrides(config: dict, overrides: dict) -> dict:
    """Command-line flags (``--seed``, ``--entropy``, ...) on a config, by
    the rules of its experiment kind: each kind's ``apply_overrides`` knows where a flag goes
    and refuses, in one line, a flag it cannot honour. A sweep's ``[sweep]`` table is kept."""
    from dpdl.experiments.registry import experiment_module

    if not overrides:
        return config
    kind = config.get("kind")
    module = experiment_module(kind)
    if not hasattr(module, "apply_overrides"):
        flags = ", ".join("--" + k.replace("_", "-") for k in overrides)
        raise DPDLError(f"{flags} not supported for experiment kind {kind!r}")
    base = {k: v for k, v in config.items() if k != "sweep"}
    out = module.apply_overrides(base, **overrides)
    if "sweep" in config:
        out["sweep"] = config["sweep"]
    return out


def _load(args) -> dict:
    from dpdl.experiments.registry import load_config_file

    if args.config and args.preset:
        raise DPDLError("give either a config file or --preset, not both")
    if args.config:
        return load_config_file(args.config)
    return load_config_file(preset=args.preset or DEFAULT_PRESET)


def _overrides(args) -> dict:
    given = {
        "seed": args.seed,
        "steps": args.steps,
        "device": args.device,
        "runtime": args.runtime,
        "entropy": args.entropy,
        "vector_figures": True if args.vector_figures else None,
    }
    if args.steps is not None and args.steps < 1:
        raise DPDLError(f"--steps must be a positive integer, got {args.steps}")
    if args.seed is not None and args.seed < 0:
        raise DPDLError(f"--seed must be non-negative, got {args.seed}")
    return {k: v for k, v in given.items() if v is not None}


def _fmt(value, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.{digits}g}"
    return str(value)


def print_summary(results: dict) -> None:
    header = (
        "algorithm",
        "eps target",
        "test acc",
        "node acc mean",
        "node acc worst",
        "eps CLT*",
        "eps certified",
        "status",
    )
    rows = []
    for s in results.get("summary", []):
        acc = _fmt(s.get("test_accuracy"))
        if s.get("test_accuracy_std") is not None:
            acc += f" ± {_fmt(s['test_accuracy_std'], 2)}"
        rows.append(
            (
                s["algorithm"],
                _fmt(s.get("epsilon_target")),
                acc,
                _fmt(s.get("node_accuracy_mean")),
                _fmt(s.get("node_accuracy_worst")),
                _fmt(s.get("epsilon_clt")) if s.get("epsilon_target") else "inf",
                _fmt(s.get("epsilon_certified")) if s.get("epsilon_target") else "inf",
                ",".join(s.get("status", [])),
            )
        )
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))
    print("* CLT: the paper's approximation; it can understate epsilon (certified: PLD/RDP).")
    relations = sorted({c["neighboring"] for c in results.get("cells", []) if c.get("neighboring")})
    if relations:  # the Dyn-D2P family's cells name the relation every epsilon is stated for
        print(f"* epsilon under the neighbouring relation {' / '.join(relations)}")
    for line in dyn_vs_const_notes(results.get("summary", [])):
        print(line)
    for cell in results.get("cells", []):
        if cell.get("status") != "ok":
            print(f"! {cell['algorithm']} seed {cell['seed']}: {cell['message']}")
    print(f"run folder: {results['run_dir']}")


def dyn_vs_const_notes(summary: list[dict]) -> list[str]:
    """One line for every epsilon (and calibration) where Dyn-D2P does not beat Const-D2P:
    the paper's headline claim, so a run that contradicts it never passes in silence."""
    from dpdl.accounting.schedules import ALGORITHMS

    by_key = {(s["algorithm"], s.get("epsilon_target")): s for s in summary}
    notes = []
    for (algorithm, eps), dyn in by_key.items():
        name, _, calibration = algorithm.partition("@")
        family = ALGORITHMS.get(name)
        if family is None or family.baseline is None:  # only a family with a baseline
            continue
        const = by_key.get((family.baseline + (f"@{calibration}" if calibration else ""), eps))
        if const is None:
            continue
        a_dyn, a_const = dyn.get("test_accuracy"), const.get("test_accuracy")
        if a_dyn is None or a_const is None or a_dyn > a_const:
            continue
        seeds = len(dyn.get("seeds", []))
        notes.append(
            f"note: at eps = {_fmt(eps)}{f' ({calibration})' if calibration else ''} "
            f"{family.display} ({_fmt(a_dyn)}) does not beat "
            f"{ALGORITHMS[family.baseline].display} ({_fmt(a_const)}) in this run "
            f"({seeds} seed{'s' * (seeds != 1)}); docs/RESULTS.md gives the paired comparison "
            "at the paper's scale"
        )
    return notes


def _launch_local(args) -> int:
    """Re-run this command in ``--procs`` local processes of the distributed runtime, once the
    config, the data and the number of processes have been checked (a bad one is one line
    here, not an error in every process)."""
    if args.runtime != "distributed":
        raise DPDLError("--procs needs --runtime distributed")
    _check_before_launch(args)
    from dpdl.engine.distributed import launch_local

    argv = ["run"] + ([args.config] if args.config else [])
    for flag in (
        "preset", "output", "device", "seed", "steps", "runtime", "entropy", "threads", "resume"
    ):  # fmt: skip
        value = getattr(args, flag)
        if value is not None:
            argv += [f"--{flag}", str(value)]
    for flag in ("no_progress", "vector_figures"):  # the switches, passed on as given
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    return launch_local(argv, args.procs)


def _check_before_launch(args) -> None:
    import json

    from dpdl.experiments.config import parse_config
    from dpdl.experiments.registry import kind_of
    from dpdl.experiments.runner import prepare_workload

    if args.procs < 1:
        raise DPDLError(f"--procs must be >= 1, got {args.procs}")
    if args.resume:
        path = Path(args.resume) / "config.json"
        if not path.is_file():
            raise DPDLError(f"{args.resume} is not a dpdl run folder (no config.json)")
        config = json.loads(path.read_text())
    else:
        config = apply_command_overrides(_load(args), _overrides(args))
    if not kind_of(config).distributed:
        raise DPDLError(f"the distributed runtime runs the decentralized kind, not "
                        f"{config.get('kind')!r}")  # fmt: skip
    cfg = parse_config(config)
    nodes = cfg.topology.nodes
    if args.procs > nodes:
        raise DPDLError(f"--procs {args.procs} for {nodes} nodes: every process needs at least "
                        "one node")  # fmt: skip
    prepare_workload(cfg, cfg.experiment.seeds[0], block=(0, 1))  # the data are there


def _resume(args) -> int:
    import json

    from dpdl.experiments.registry import experiment_kind, experiment_module
    from dpdl.experiments.runner import resume_run

    if args.config or args.preset:
        raise DPDLError("--resume takes its config from the run folder: give no config or preset")
    path = Path(args.resume) / "config.json"
    if not path.is_file():
        raise DPDLError(f"{args.resume} is not a dpdl run folder (no config.json)")
    kind = json.loads(path.read_text()).get("kind")
    if not experiment_kind(kind).distributed:  # the trainer's kind resumes with its runtime
        module = experiment_module(kind)
        if not hasattr(module, "resume_experiment"):
            raise DPDLError(f"experiment kind {kind!r} cannot resume a run folder")
        if any(v is not None for v in (args.seed, args.steps, args.entropy)):
            raise DPDLError("--resume continues the saved config; it cannot change --seed, "
                            "--steps or --entropy")
        print_summary(module.resume_experiment(args.resume, progress=not args.no_progress))
        return 0
    results = resume_run(
        args.resume, progress=not args.no_progress, runtime=args.runtime, device=args.device,
        seed=args.seed, steps=args.steps, entropy=args.entropy,
    )  # fmt: skip
    if main_process():
        print_summary(results)
    failed = [c for c in results.get("cells", []) if c.get("status", "ok") != "ok"]
    return 1 if failed else 0


def run(args) -> int:
    from dpdl.experiments.registry import experiment_module, preset_names

    if args.list_presets:
        from dpdl.experiments.registry import preset_description

        names = preset_names()
        width = max(map(len, names))
        print("\n".join(f"{n:<{width}}  {preset_description(n)}" for n in names))
        return 0
    threads = args.threads
    if threads is None and "OMP_NUM_THREADS" not in os.environ:
        threads = 1
    if threads is not None:
        if threads < 1:
            raise DPDLError(f"--threads must be >= 1, got {threads}")
        import torch

        torch.set_num_threads(threads)
    if args.consortium or args.party:
        from dpdl.commands.consortium import run_party

        return run_party(args, _load, _overrides(args), print_summary)
    if args.procs is not None and "RANK" not in os.environ:
        return _launch_local(args)
    if args.resume:
        return _resume(args)
    config = _load(args)
    if "sweep" in config:
        name = args.preset or args.config
        raise DPDLError(f"{name} is a sweep (it has a [sweep] table): run it with `dpdl sweep`")
    module = experiment_module(config.get("kind"))
    config = apply_command_overrides(config, _overrides(args))
    warn_if_reproducible(config)
    results = module.run_experiment(config, Path(args.output), progress=not args.no_progress)
    if not main_process():
        pass
    elif "summary" in results:
        print_summary(results)
    else:
        print(f"run folder: {results.get('run_dir', args.output)}")
    failed = [c for c in results.get("cells", []) if c.get("status", "ok") != "ok"]
    return 1 if failed else 0
