"""``dpdl tune CONFIG``: tune every algorithm on validation data with one budget, then test."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "Tune every algorithm on validation data with the same budget, then run the test seeds."


def add_arguments(parser) -> None:
    parser.add_argument("config", nargs="?", help="tune config (a run config with a [tune] table)")
    parser.add_argument("--preset", help="a shipped tune preset, e.g. tune-table2")
    parser.add_argument("--output", type=Path, help="output directory (default runs/tune/NAME)")
    parser.add_argument("--workers", type=int, help="parallel worker processes")
    parser.add_argument("--selection", choices=("public", "private"),
                        help="public (the default): every grid point over the selection seeds, "
                             "the best mean picked, every run released; private: Papernot & "
                             "Steinke's random stopping (needs [tune.private]), only the best "
                             "of a secret random number of runs released. Overrides "
                             "tune.selection")  # fmt: skip
    from dpdl.commands.run import add_noise_arguments

    add_noise_arguments(parser)
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--report", action="store_true",
                        help="only write the report (tune.md, tune.json, CSVs) of what the "
                             "output folder holds so far, e.g. of a tuning still running")


def run(args) -> int:
    from dpdl.commands.run import apply_command_overrides, warn_if_reproducible
    from dpdl.errors import DPDLError
    from dpdl.experiments.registry import load_config_file
    from dpdl.experiments.tune import run_tuning, write_report

    if args.workers is not None and args.workers < 1:
        raise DPDLError(f"--workers must be >= 1, got {args.workers}")
    config = load_config_file(args.config, preset=args.preset)
    noise = {"entropy": args.entropy}
    tune = config.pop("tune", None)
    config = apply_command_overrides(config, {k: v for k, v in noise.items() if v is not None})
    if tune is not None:
        config["tune"] = tune
        if args.selection is not None:
            tune["selection"] = args.selection
    warn_if_reproducible(config)
    name = args.preset or Path(args.config).stem
    out = args.output or Path("runs") / "tune" / name
    if args.report:
        summary = write_report(config, out)
    else:
        summary = run_tuning(config, out, workers=args.workers, progress=not args.no_progress)
    picks = {name: {eps: by["pick"] for eps, by in entry["by_epsilon"].items()}
             for name, entry in summary["candidates"].items()}  # fmt: skip
    privacy = summary["privacy"]
    print(json.dumps({"output": str(out), "selection": summary["selection"], "picks": picks,
                      "epsilon_released": privacy["epsilon"], "delta": privacy["delta"],
                      "failed": summary["failed"]}, indent=2, default=str))  # fmt: skip
    print(f"report: {out / 'tune.md'}")
    if summary["selection"] == "private":
        # the site's ledger counts every run of the selections: printed, it would tell their
        # secret number K (Theorem 2's bound holds only while K stays hidden)
        print(f"ledger: `dpdl ledger {out}` composes every run on these records; it reveals "
              "the private selection's number of runs: keep it on the site")  # fmt: skip
    else:
        from dpdl.commands.ledger import print_site_total

        print_site_total(out)  # the tuning's runs and the tests composed, per data set
    return 1 if summary["failed"] else 0
