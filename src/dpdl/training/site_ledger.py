"""A site's ledger across runs: every run that touched the site's records, per data set.

A site is an output folder (where ``dpdl run/sweep/tune --output`` and ``dpdl.train(...,
output_dir=)`` write).  Before a run trains (or sends anything), the trainer appends one line
to ``<output folder>/dpdl-ledger.jsonl`` and fsyncs it: the run's data fingerprint, its
sampling rate, every noise multiplier of its approved plan (step by step, release by
release), the neighbouring relation and δ.  A run that crashes after the line still counts
(the whole plan, fail closed); a run resumed from its own checkpoint is the same release and
is counted once.

The fingerprint is the SHA-256 of the sorted per-record digests of the records the process
hosts: the same records give the same fingerprint however they are split into nodes (a
sweep's seeds re-split the same data set), and a record set that differs in any record is
another data set.  Runs on overlapping but unequal record sets (a tuning's train split
without its validation records) are separate entries; the site total (every run at the site
composed, at the largest rate) bounds any record whatever the overlap.

:func:`compose_site` composes, per fingerprint, every run found under a folder (its
``dpdl-ledger.jsonl`` files, recursively: a sweep's cells and a tuning's runs live in
subfolders) with the certified PLD accountant (:func:`dpdl.accounting.certified.
privacy_loss_distribution` per run at its own rate, the runs' PLDs composed) and states the
total ε at a δ.  A non-private run (no noise) makes its data set's ε infinite.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpdl.accounting import validators as check
from dpdl.accounting.ledger import run_length_decode, run_length_encode
from dpdl.errors import DPDLError, require

__all__ = ["LEDGER_FILE", "SiteEntry", "SiteTotal", "append_entry", "compose_site",
           "read_entries", "remove_keeping_ledger", "record_set_fingerprint",
           "format_totals"]  # fmt: skip

LEDGER_FILE = "dpdl-ledger.jsonl"
SCHEMA = 1
# One discretization for every run's PLD (PLDs compose only on the same grid): the binned
# accountant's, so a run of thousands of distinct multipliers takes seconds, not minutes.
DISCRETIZATION = 3e-4
REPLACE_ONE = "replace-one"


def record_set_fingerprint(node_data: Any, first: int = 0, count: int | None = None) -> str:
    """Hex SHA-256 of the sorted per-record digests of nodes ``first .. first + count - 1``
    (inputs and targets, with dtypes and shapes): independent of how records are split into
    nodes.  Secret like the data (it confirms a guess of them); it stays on the site."""
    count = node_data.n_nodes - first if count is None else count
    sizes = [int(c) for c in np.asarray(node_data.counts).tolist()]
    digests: list[bytes] = []
    for i in range(first, first + count):
        parts = [np.ascontiguousarray(part[i, : sizes[i]].detach().cpu().numpy())
                 for part in (node_data.inputs, node_data.targets)]  # fmt: skip
        header = "".join(f"{p.dtype.str}{p.shape[1:]}" for p in parts).encode()
        rows = [p.reshape(sizes[i], -1) for p in parts]
        digests.extend(hashlib.sha256(header + x.tobytes() + y.tobytes()).digest()
                       for x, y in zip(*rows, strict=True))  # fmt: skip
    total = hashlib.sha256(b"dpdl record set v1")
    for digest in sorted(digests):
        total.update(digest)
    return total.hexdigest()


@dataclass(frozen=True)
class SiteEntry:
    """One run that touched a site's records (a line of the site's ledger)."""

    run: str                     # the run's folder / cell, as the trainer names it
    run_digest: str              # its settings' digest (a resume of it is the same release)
    fingerprint: str             # record_set_fingerprint of the records it trained on
    records: int
    private: bool
    sample_rate: float           # the largest rate of the hosted nodes (bounds each record)
    neighboring: str
    delta: float | None
    releases: tuple[str, ...]
    multipliers: tuple[tuple[float, int], ...]  # run-length (z, count), release by release

    def to_dict(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "run": self.run, "run_digest": self.run_digest,
                "fingerprint": self.fingerprint, "records": self.records,
                "private": self.private, "sample_rate": self.sample_rate,
                "neighboring": self.neighboring, "delta": self.delta,
                "releases": list(self.releases),
                "multipliers": [list(run) for run in self.multipliers],
                "written": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> SiteEntry:
        require(isinstance(data, dict) and data.get("schema") == SCHEMA,
                f"{where}: not a dpdl site-ledger line (schema {SCHEMA})")  # fmt: skip
        try:
            multipliers = tuple((float(z), int(c)) for z, c in data["multipliers"])
            entry = cls(str(data["run"]), str(data["run_digest"]), str(data["fingerprint"]),
                        int(data["records"]), bool(data["private"]),
                        float(data["sample_rate"]), str(data["neighboring"]),
                        None if data["delta"] is None else float(data["delta"]),
                        tuple(data["releases"]), multipliers)  # fmt: skip
        except (KeyError, TypeError, ValueError) as err:
            raise DPDLError(f"{where}: malformed site-ledger line ({err})") from None
        require(not entry.private or (entry.multipliers and all(
            math.isfinite(z) and z >= 0 and c >= 1 for z, c in entry.multipliers)),
            f"{where}: a private run's multipliers must be finite, >= 0, counts >= 1")
        return entry


def append_entry(folder: str | Path, entry: SiteEntry) -> Path:
    """Append ``entry`` to ``folder``'s ledger and make it durable (file and folder fsync'd)
    before returning: only then may the run train."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LEDGER_FILE
    _append_durably(path, (json.dumps(entry.to_dict(), sort_keys=True) + "\n").encode())
    return path


def _append_durably(path: Path, data: bytes) -> None:
    created = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)  # one write with O_APPEND: processes sharing a file never interleave
        os.fsync(fd)
    finally:
        os.close(fd)
    if created:  # the file's name must survive a crash too
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def remove_keeping_ledger(folder: str | Path, into: str | Path) -> None:
    """Delete ``folder`` (a failed cell's partial folder, a private selection's losing run)
    but first move the runs it recorded into ``into``'s ledger (durably): deleting a run's
    files never forgets that it trained.  A crash between the two counts the runs twice
    (fail closed), never zero times."""
    import shutil

    folder, into = Path(folder), Path(into)
    if not folder.exists():
        return
    lines = b"".join(
        b"".join(line for line in path.read_bytes().splitlines(keepends=True)
                 if line.endswith(b"\n"))  # a torn last line never trained
        for path in sorted(folder.rglob(LEDGER_FILE)))  # fmt: skip
    if lines:
        into.mkdir(parents=True, exist_ok=True)
        _append_durably(into / LEDGER_FILE, lines)
    shutil.rmtree(folder) if folder.is_dir() else folder.unlink()


def read_entries(site: str | Path) -> list[SiteEntry]:
    """Every entry of every ledger under ``site`` (recursively), in path and line order.  A
    last line torn by a crash (no newline, not JSON) was never fsync'd: its run never
    trained, and it is skipped; any other malformed line is refused."""
    site = Path(site)
    require(site.is_dir(), f"site folder {str(site)!r} does not exist")
    entries = []
    for path in sorted(site.rglob(LEDGER_FILE)):
        text = path.read_text()
        lines = text.splitlines()
        for number, line in enumerate(lines, 1):
            try:
                data = json.loads(line)
            except json.JSONDecodeError:
                require(number == len(lines) and not text.endswith("\n"),
                        f"{path}:{number}: corrupt site-ledger line")
                continue
            entries.append(SiteEntry.from_dict(data, f"{path}:{number}"))
    return entries


@dataclass(frozen=True)
class SiteTotal:
    """The composed privacy of a set of runs on one data set (or the whole site)."""

    fingerprint: str | None      # None: every run at the site
    runs: int
    records: tuple[int, ...]
    epsilon: float
    delta: float
    neighboring: str
    non_private: int

    def to_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, "runs": self.runs,
                "records": list(self.records), "epsilon": self.epsilon,
                "delta": self.delta, "neighboring": self.neighboring,
                "non_private": self.non_private}  # fmt: skip


def _relation(entries: list[SiteEntry]) -> str:
    """The relation the total is stated for: the runs' one, or replace-one when they differ
    (the same mechanisms analysed under replace-one bound a replace-one neighbour of any
    run)."""
    relations = {e.neighboring for e in entries if e.private}
    return relations.pop() if len(relations) == 1 else REPLACE_ONE


def compose(entries: list[SiteEntry], delta: float, fingerprint: str | None) -> SiteTotal:
    """ε at ``delta`` of every run of ``entries`` composed (certified PLD, each run at its
    own rate, the PLDs composed on one grid); ∞ with a non-private run."""
    from dpdl.accounting.certified import accountant_options, privacy_loss_distribution

    delta = check.delta(delta)
    relation = _relation(entries)
    non_private = sum(not e.private for e in entries)
    records = tuple(sorted({e.records for e in entries}))
    epsilon = math.inf if non_private else 0.0
    if not non_private:
        # runs of the same schedule at the same rate (a sweep's seeds) are one PLD composed
        # with itself: a handful of compositions, whatever the number of runs
        same: dict[tuple, int] = {}
        for entry in entries:
            key = (entry.sample_rate, entry.multipliers)
            same[key] = same.get(key, 0) + 1
        composed = None
        for (rate, multipliers), count in same.items():
            zs = run_length_decode([list(run) for run in multipliers])
            # the ledger's own composition options (binned beyond 200 distinct multipliers:
            # a certified upper bound), on the one grid every run's PLD shares
            options = accountant_options("pld", zs)
            pld = privacy_loss_distribution(zs, rate, neighboring=relation,
                                            value_discretization=DISCRETIZATION,
                                            **options)  # fmt: skip
            pld = pld if count == 1 else pld.self_compose(count)
            composed = pld if composed is None else composed.compose(pld)
        epsilon = float(composed.get_epsilon_for_delta(delta))
    return SiteTotal(fingerprint, len(entries), records, epsilon, delta, relation, non_private)


def compose_site(site: str | Path, delta: float | None = None) -> tuple[list[SiteTotal],
                                                                        SiteTotal | None]:
    """(one total per fingerprint, the site's total over every run) of the runs under
    ``site``; ``delta`` defaults to the smallest δ any run was stated at."""
    entries = read_entries(site)
    if not entries:
        return [], None
    if delta is None:
        deltas = [e.delta for e in entries if e.delta is not None]
        require(deltas, "no run of this site states a delta: give --delta")
        delta = min(deltas)
    by_print: dict[str, list[SiteEntry]] = {}
    for entry in entries:
        by_print.setdefault(entry.fingerprint, []).append(entry)
    totals = [compose(group, delta, key) for key, group in by_print.items()]
    site_total = None
    if len(by_print) > 1:
        # any record, whichever data sets hold it: every run, each at its own rate
        site_total = compose(entries, delta, None)
    return totals, site_total


def format_totals(totals: list[SiteTotal], site_total: SiteTotal | None) -> list[str]:
    """One line per data set and one for the site (what ``dpdl ledger`` prints)."""
    lines = []
    for total in [*totals, *([site_total] if site_total else [])]:
        what = ("every data set at this site" if total.fingerprint is None
                else f"data set {total.fingerprint[:16]} ({'/'.join(map(str, total.records))} "
                     "records)")  # fmt: skip
        note = f", {total.non_private} non-private" if total.non_private else ""
        lines.append(f"{what}: {total.runs} run(s){note}: epsilon {total.epsilon:.6g} at delta "
                     f"{total.delta:g} ({total.neighboring}, certified PLD)")  # fmt: skip
    return lines


def entry_for(run: str, run_digest: str, fingerprint: str, records: int, schedule: Any,
              sample_rate: float) -> SiteEntry:
    """The entry of a run about to train with ``schedule`` (its approved plan, every
    release's multiplier) at ``sample_rate``."""
    private = bool(schedule.private)
    zs = getattr(schedule, "release_multipliers", None) if private else None
    if private and zs is None:
        zs = schedule.noise_multipliers
    return SiteEntry(run, run_digest, fingerprint, int(records), private, float(sample_rate),
                     schedule.neighboring, schedule.delta,
                     tuple(getattr(schedule, "releases", ("update",))),
                     tuple((float(z), int(c)) for z, c in run_length_encode(zs))
                     if private else ())  # fmt: skip
