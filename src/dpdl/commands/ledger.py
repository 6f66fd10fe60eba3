"""``dpdl ledger SITE_DIR``: the privacy every run at a site spent, per data set, composed."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "Compose every run a site's records took part in (per data set) and state the total ε."


def add_arguments(parser) -> None:
    parser.add_argument("site", type=Path,
                        help="the site's output folder (its dpdl-ledger.jsonl files, in any "
                             "subfolder: runs, sweep cells, tunings)")  # fmt: skip
    parser.add_argument("--delta", type=float,
                        help="the delta to state epsilon at (default: the smallest any run "
                             "was stated at)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the totals as JSON")


def run(args) -> int:
    from dpdl.training.site_ledger import compose_site, format_totals

    totals, site_total = compose_site(args.site, args.delta)
    if args.json:
        print(json.dumps({"site": str(args.site),
                          "data_sets": [t.to_dict() for t in totals],
                          "site_total": None if site_total is None else site_total.to_dict()},
                         indent=2))  # fmt: skip
        return 0
    if not totals:
        print(f"{args.site}: no run has recorded itself here (no dpdl-ledger.jsonl)")
        return 0
    for line in format_totals(totals, site_total):
        print(line)
    return 0


def site_total_lines(site: Path) -> list[str]:
    """What ``dpdl tune`` and ``dpdl sweep`` print at the end: the site's ledger, a line per
    data set (and one for the whole site)."""
    from dpdl.training.site_ledger import compose_site, format_totals

    return format_totals(*compose_site(site))


def print_site_total(site: Path) -> None:
    for line in site_total_lines(site):
        print(f"ledger of {site}: {line}")
