"""Every message a party's nodes sent, on the party's own disk, made durable (fsync) before
the message may leave: what a restart of the party is checked against.

A restarted party runs its run again from the start.  Each message it is about to send is
compared with the ledger: the very same bytes (a seeded run, or secret streams restored to
the same state) are no new release and may go out again; anything else would be a second
noisy release of records that already spent budget, and is refused in one line.  So a
restart can never re-spend privacy, whatever point it crashed at, and the steps the run
reports are every step ever sent.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from dpdl.errors import DPDLError, require

__all__ = ["SentLedger", "check_no_unfinished_run"]


def check_no_unfinished_run(folder: Path, party: str, path: Path) -> None:
    """Refuse to start a run (``path``, its ledger) beside an unfinished one of this party:
    a restart with another config would otherwise draw fresh noise over the records whose
    messages the unfinished run already sent."""
    own = re.compile(rf"{re.escape(party)}-[0-9a-f]{{16}}\.sent\.jsonl")
    for other in sorted(Path(folder).glob(f"{party}-*.sent.jsonl")):
        if other != path and own.fullmatch(other.name):
            ledger = SentLedger(other, party)
            require(ledger.finished or not ledger.entries,
                    f"party {party}: an unfinished run already sent {len(ledger.entries)} "
                    f"messages ({ledger.steps_sent} steps) from this folder ({other}); "
                    "restart it with its own config, or start a new run in another output "
                    "folder (which spends privacy of its own)")  # fmt: skip


class SentLedger:
    """Append-only JSON lines ``{"n", "step", "round", "sha256": {party: digest}}``."""

    def __init__(self, path: str | Path, party: str):
        self.path, self.party = Path(path), party
        self.entries: list[dict] = []
        self.finished = False  # the run ended cleanly (its last line says so)
        if self.path.is_file():
            self._load()
        self.replayed = 0

    def _load(self) -> None:
        text = self.path.read_text()
        lines = text.splitlines()
        for number, line in enumerate(lines):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                # a line torn by a crash while it was written: its fsync never returned, so
                # its message never left; it must be the last line, and is dropped
                require(number == len(lines) - 1,
                        f"sent ledger {self.path} is corrupt at line {number + 1}")
                self.path.write_text(text[: text.rindex(line)])
                return
            if entry.get("finished"):
                self.finished = True
            else:
                self.entries.append(entry)
        if text and not text.endswith("\n"):  # whole but unterminated: counted as sent
            with open(self.path, "a") as fh:
                fh.write("\n")

    @property
    def steps_sent(self) -> int:
        """Distinct steps of which a message left (the run's steps counted by its ε)."""
        return len({entry["step"] for entry in self.entries})

    def record(self, n: int, step: int, round_: int, digests: dict[str, str]) -> None:
        """Before message ``n`` leaves: durable, or identical to what already left."""
        if n < len(self.entries):
            sent = self.entries[n]
            if (sent["step"], sent["round"], sent["sha256"]) != (step, round_, digests):
                raise DPDLError(
                    f"party {self.party}: an earlier attempt of this run already sent message "
                    f"{n} (step {sent['step']}) with other contents ({self.path}: "
                    f"{len(self.entries)} messages, {self.steps_sent} steps sent); sending "
                    "again would release fresh noise over records that already spent budget: "
                    "refusing")  # fmt: skip
            self.replayed += 1
            return
        require(n == len(self.entries), f"party {self.party}: message {n} out of order")
        self._append({"n": n, "step": step, "round": round_, "sha256": digests})

    def finish(self) -> None:
        """Mark the run as ended cleanly (another run may then start from this folder)."""
        self._append({"finished": True})
        self.finished = True

    def _append(self, entry: dict) -> None:
        new = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as fh:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if new:  # the file's name must survive a crash too
            fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        if "n" in entry:
            self.entries.append(entry)
