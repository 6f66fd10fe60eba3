"""``dpdl sweep CONFIG``: run a grid of configurations in parallel, resumably."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "Run a grid of configurations in parallel (local processes or Ray), resumably."


def add_arguments(parser) -> None:
    from dpdl.experiments.sweep.executors import EXECUTORS  # stdlib only: cheap at parse time

    parser.add_argument("config", nargs="?", help="sweep config (TOML with a [sweep] table)")
    parser.add_argument("--preset", help="a shipped sweep preset, e.g. table2, figure4")
    parser.add_argument("--output", type=Path, help="sweep directory (default runs/sweeps/NAME)")
    parser.add_argument(
        "--workers",
        type=int,
        help="parallel worker processes (with --executor ray and no --ray-address: local CPUs)",
    )
    parser.add_argument(
        "--executor",
        choices=EXECUTORS,
        default="local",
        help="where the cells run: a local process pool, or Ray tasks on a cluster",
    )
    parser.add_argument(
        "--ray-address",
        metavar="ADDR",
        help="Ray cluster to use, e.g. auto or HEAD_IP:6379 (default: a fresh local Ray)",
    )
    parser.add_argument(
        "--ray-max-retries",
        type=int,
        metavar="N",
        help="times a cell is rerun when its Ray worker dies (default 2)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a base config value (dotted key, TOML value), e.g. training.steps=200",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="run only the grid cells with this value (dotted grid key, TOML value), e.g. "
        "experiment.seed=3: re-runs one cell exactly as the sweep ran it",
    )
    from dpdl.commands.run import add_noise_arguments

    add_noise_arguments(parser)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--report", action="store_true", help="write the report when done")


def parse_override(text: str):
    """``a.b=1.5`` -> ("a.b", 1.5); the value is parsed as TOML, falling back to a string."""
    import tomllib

    from dpdl.errors import DPDLError

    if "=" not in text:
        raise DPDLError(f"--set expects KEY=VALUE, got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def run(args) -> int:
    from dpdl.errors import DPDLError
    from dpdl.experiments.registry import load_config_file
    from dpdl.experiments.sweep.driver import run_sweep
    from dpdl.experiments.sweep.grid import set_dotted

    if args.workers is not None and args.workers < 1:
        raise DPDLError(f"--workers must be ≥ 1, got {args.workers}")
    config = load_config_file(args.config, preset=args.preset)
    for item in args.set:
        set_dotted(config, *parse_override(item))
    from dpdl.commands.run import apply_command_overrides, warn_if_reproducible

    noise = {"entropy": args.entropy}
    config = apply_command_overrides(config, {k: v for k, v in noise.items() if v is not None})

    warn_if_reproducible(config)
    name = args.preset or Path(args.config).stem
    out = args.output or Path("runs") / "sweeps" / name
    summary = run_sweep(
        config,
        out,
        workers=args.workers,
        progress=not args.no_progress,
        executor=args.executor,
        ray_address=args.ray_address,
        ray_max_retries=args.ray_max_retries,
        only=[parse_override(item) for item in args.only],
    )
    from dpdl.commands.ledger import site_total_lines

    # every run on these records composed, not only this sweep's cells one by one (stdout
    # stays one JSON document)
    print(json.dumps({"sweep_dir": str(out), **summary,
                      "site_ledger": site_total_lines(out)}, indent=2))  # fmt: skip
    if args.report:
        from dpdl.experiments.report import write_report

        paths = write_report(out)
        print(f"report: {paths['markdown']}  {paths['html']}")
    return 1 if summary["failed"] else 0
