"""``dpdl report SWEEP_DIR``: Markdown and self-contained HTML report of a sweep."""

from __future__ import annotations

from pathlib import Path

HELP = "Build Markdown and self-contained HTML reports from a sweep directory."


def add_arguments(parser) -> None:
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--output", type=Path, help="report folder (default SWEEP_DIR/report)")


def run(args) -> int:
    from dpdl.experiments.report import write_report

    paths = write_report(args.sweep_dir, args.output)
    print(f"wrote {paths['markdown']}")
    print(f"wrote {paths['html']}")
    return 0
