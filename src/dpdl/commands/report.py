"""``dpdl report SWEEP_DIR``: Markdown and self-contained HTML report of a sweep
(``--figures-only``: its figures alone, drawn again)."""

from __future__ import annotations

from pathlib import Path

HELP = "Build Markdown and self-contained HTML reports from a sweep directory."


def add_arguments(parser) -> None:
    parser.add_argument("sweep_dir", type=Path)
    parser.add_argument("--output", type=Path, help="report folder (default SWEEP_DIR/report)")
    parser.add_argument("--figures-only", action="store_true",
                        help="only draw the figures again (PNG, PDF, SVG), from the finished "
                             "cells; the report's text is left as it is")  # fmt: skip


def run(args) -> int:
    from dpdl.experiments.report import write_figures, write_report

    if args.figures_only:
        for path in write_figures(args.sweep_dir, args.output):
            print(f"wrote {path}")
        return 0
    paths = write_report(args.sweep_dir, args.output)
    print(f"wrote {paths['markdown']}")
    print(f"wrote {paths['html']}")
    return 0
