"""The comparisons a sweep declares for its report: the ``[report]`` table of its config.

    [report]
    pairs = [["dyn-d2p@pld", "const-d2p@pld"], ["dyn-c-d2p@pld", "const-d2p@pld"]]

Each pair (A, B) asks the report for the gain of A over B, the claim "A > B at equal ε"
(paired by seed) and whether the gap grows as ε falls, and ``paired`` compares A - B when no
``--pair`` is given.  Without the table both derive their pairs from the schedule families'
registry (``ScheduleFamily.rivals`` and ``baseline``), as before.  The table is the sweep's,
like ``[sweep]``: it is split from the config before any cell is made (a cell never sees it)
and kept in sweep.json, so a report of the finished sweep reads what was declared.
"""

from __future__ import annotations

import copy
from typing import Any

from dpdl.errors import DPDLError, require

__all__ = ["REPORT_TABLE", "split_report", "swept_algorithms"]

REPORT_TABLE = "report"
_ALGORITHMS_KEY = "experiment.algorithms"
_REPORT_KEYS = {"pairs"}


def swept_algorithms(base: dict[str, Any], sweep: dict[str, Any] | None) -> list[str]:
    """Every algorithm label a sweep runs: the lists its grid (or zip) gives
    ``experiment.algorithms``, else the base config's (else the core kind's default)."""
    from dpdl.experiments.config import ExperimentSection

    lists = [values for table in ("grid", "zip") for key, values
             in ((sweep or {}).get(table) or {}).items() if key == _ALGORITHMS_KEY]  # fmt: skip
    if not lists:
        field = ExperimentSection.model_fields["algorithms"]
        default = field.get_default(call_default_factory=True)
        return list((base.get("experiment") or {}).get("algorithms", default))
    labels: list[str] = []
    for values in lists:
        for value in values:
            listed = value if isinstance(value, list) else [value]
            labels += [a for a in listed if a not in labels]
    return labels


def split_report(config: dict[str, Any], sweep: dict[str, Any] | None = None,
                 ) -> tuple[dict[str, Any], list[tuple[str, str]] | None]:  # fmt: skip
    """(the config without its ``[report]`` table, the declared pairs or None).

    A pair must name two different algorithms the config runs (:func:`swept_algorithms`);
    anything else is a one-line error naming it."""
    config = copy.deepcopy(config)
    table = config.pop(REPORT_TABLE, None)
    if table is None:
        return config, None
    require(isinstance(table, dict), f"[{REPORT_TABLE}] must be a table, got {table!r}")
    unknown = set(table) - _REPORT_KEYS
    require(not unknown, f"unknown key(s) in [{REPORT_TABLE}]: {', '.join(sorted(unknown))}")
    pairs = table.get("pairs", [])
    require(isinstance(pairs, list) and bool(pairs),
            f"{REPORT_TABLE}.pairs must be a non-empty list of [A, B] pairs, "
            f"got {pairs!r}")  # fmt: skip
    runs = swept_algorithms(config, sweep)
    checked = []
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(a, str) for a in pair)
                and pair[0] != pair[1]):  # fmt: skip
            raise DPDLError(f"{REPORT_TABLE}.pairs: {pair!r} is not a pair of two different "
                            "algorithm labels")  # fmt: skip
        missing = [a for a in pair if a not in runs]
        require(not missing,
                f"{REPORT_TABLE}.pairs: {pair!r} names {', '.join(map(repr, missing))}, which the "
                f"config does not run (it runs {', '.join(runs)})")  # fmt: skip
        checked.append((pair[0], pair[1]))
    return config, checked
