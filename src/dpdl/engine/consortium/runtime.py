"""The consortium runtime: one party per process, by name, whatever the start order.

:class:`ConsortiumRuntime` is a :class:`dpdl.engine.runtime.Runtime`: the party hosts the
nodes the consortium file gives it; its mixer (:class:`ConsortiumMixer`) sends each
neighbour party the push-sum contributions of the graph's edges into its nodes and fetches
theirs; the collectives (every node's size, sums of the models, per-node scores, whether
every party's checks passed) travel hop by hop over the same neighbour links, so no party
ever connects to a non-neighbour.  Every party is its own main process: it writes its own
run folder, scores and results.

Every mixing message is recorded in the party's :class:`~.sent_ledger.SentLedger` (fsync)
before it may leave; a restarted party re-runs from the start and may only re-send the very
same bytes (:mod:`.sent_ledger`).  ``DPDL_CONSORTIUM_FAULT="PARTY:STEP[:after-ledger]"`` kills
that party (SIGKILL) before the step, or once the step's messages are in its ledger but not
yet sent: a crash drill.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dpdl.algorithms.randomness import KEY_BYTES, settings_digest, stream_root
from dpdl.engine.comm import flatten_rows, unflatten_rows
from dpdl.engine.consortium.sent_ledger import SentLedger
from dpdl.engine.consortium.settings import Consortium
from dpdl.engine.consortium.transport import Credentials, Link, Outbox, serve
from dpdl.engine.consortium.wire import Message, decode, encode
from dpdl.errors import DPDLError, require

__all__ = ["ConsortiumMixer", "ConsortiumRuntime", "party_links"]

Params = dict[str, torch.Tensor]


def party_links(consortium: Consortium, topology,
                rounds: Iterable[int]) -> dict[str, frozenset]:  # fmt: skip
    """Each party's neighbour parties: those hosting a node that shares an edge of some
    round's graph with one of its nodes (over every round of the run)."""
    owner = np.empty(consortium.n_nodes, dtype=np.int64)
    for index, party in enumerate(consortium.parties):
        owner[party.nodes] = index
    pairs: set[tuple[int, int]] = set()
    for k in rounds:
        P = np.asarray(topology.mixing_matrix(k))
        rows, cols = np.nonzero(P)
        pairs |= {(int(a), int(b)) for a, b in zip(owner[rows], owner[cols], strict=True)
                  if a != b}
    names = [p.name for p in consortium.parties]
    return {name: frozenset(names[b] for a, b in pairs if a == i) | frozenset(
        names[a] for a, b in pairs if b == i) for i, name in enumerate(names)}  # fmt: skip


def _hops(links: dict[str, frozenset]) -> int:
    """The party graph's diameter (a collective's hops); refuses a disconnected one."""
    worst = 0
    for start in links:
        seen, frontier, depth = {start}, {start}, 0
        while frontier:
            frontier = {q for p in frontier for q in links[p]} - seen
            seen |= frontier
            depth += bool(frontier)
        require(len(seen) == len(links), f"parties {sorted(set(links) - seen)} share no edge "
                                         f"of the topology with party {start}'s side")
        worst = max(worst, depth)
    return max(worst, 1)


class ConsortiumRuntime:
    """Party ``party`` of ``consortium`` (see the module doc); ``links`` from
    :func:`party_links`; ``ledger_path`` the party's sent ledger of this run."""

    name = "consortium"
    holds_every_record = False
    carries_private_shares = False  # the transport carries each party's broadcast rows only

    def __init__(self, consortium: Consortium | None = None, party: str | None = None,
                 links: dict[str, frozenset] | None = None,
                 ledger_path: str | Path | None = None):  # fmt: skip
        if consortium is None or party is None or links is None or ledger_path is None:
            raise DPDLError("the consortium runtime is started by `dpdl run CONFIG "
                            "--consortium FILE --party NAME`")  # fmt: skip
        self.consortium, self.me = consortium, consortium.party(party)
        self.links, self.neighbours = links, sorted(links[party])
        self.hops = _hops(links)
        self.ledger = SentLedger(ledger_path, party)
        self.timeout_s = consortium.timeout_s
        self._seq = self._mixes = 0
        self._server = None
        self.outbox = Outbox()

    @property
    def rank(self) -> int:
        return self.consortium.parties.index(self.me)

    def stream_root(self, entropy: str, seed: int, settings: Any) -> bytes | None:
        """The root of a cell's secret streams.  With secret noise (``"os"``) 32 bytes of OS
        entropy, written (0600, fsync) beside the sent ledger before anything is sent and
        read back by a restart of the party, which so draws the very noise it already sent
        (the ledger checks every byte); seeded, :func:`stream_root`'s derivation."""
        if entropy != "os":
            return stream_root(entropy, seed, settings)
        folder = self.ledger.path.with_suffix(".keys")
        path = folder / f"{settings_digest([seed, settings])[:32]}.key"
        if path.is_file():
            key = path.read_bytes()
            require(len(key) == KEY_BYTES, f"party {self.me.name}: stream key {path} is "
                                           "damaged: refusing to draw other noise")
            return key
        # messages already left under a key now lost: fresh noise over them is refused here,
        # before anything (an evaluation's sums included) is computed from new noise
        require(not self.ledger.entries,
                f"party {self.me.name}: {len(self.ledger.entries)} messages of this run "
                f"already left ({self.ledger.path}) but its stream key {path} is gone: "
                "refusing to draw fresh noise over records that already spent budget")
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = os.urandom(KEY_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(key)
            fh.flush()
            os.fsync(fh.fileno())
        return key

    # ------------------------------------------------------------------ links
    def start(self) -> None:
        """Listen on the party's own address and open a link to each neighbour."""
        credentials = Credentials.from_files(self.me.key_path, self.me.certificate,
                                             self.consortium.ca_certificate)  # fmt: skip
        self._server, self.handler = serve(self.me.address, credentials, self.outbox,
                                           frozenset(self.neighbours))  # fmt: skip
        self._links = {q: Link(self.me.name, q, self.consortium.party(q).address, credentials)
                       for q in self.neighbours}  # fmt: skip

    def fetch(self, party: str, tag: str) -> Message:
        link = self._links[party]
        self.outbox.waiting = f"party {party} ({link.address}) for {tag}"
        message = decode(link.fetch(tag, self.timeout_s))
        self.outbox.waiting = None
        require(message.party == party and message.tag == tag,
                f"party {self.me.name}: party {party} answered {tag} with "
                f"{message.party}'s {message.tag}")  # fmt: skip
        return message

    def send(self, n: int, step: int, round_: int, items: dict[str, bytes]) -> None:
        """Mixing message ``n`` to each party of ``items``: in the ledger first (durable), then
        in the outbox (served to that neighbour only)."""
        self.ledger.record(n, step, round_, {q: hashlib.sha256(data).hexdigest()
                                             for q, data in sorted(items.items())})
        _fault(self.me.name, step, "after-ledger")
        for q, data in items.items():
            self.outbox.put(f"m{n}.k{round_}", q, data)

    def close(self) -> None:
        """A clean end: each neighbour is told and has heard (so none waits on a party that
        left before it fetched the last messages), then the server stops."""
        if self._server is None:
            return
        for q in self.neighbours:
            self.outbox.put("bye", q, encode(Message(self.me.name, "bye")))
        try:
            for q in self.neighbours:
                self.fetch(q, "bye")
            self.outbox.wait_served("bye", self.neighbours, self.timeout_s)
        finally:
            self.abort()

    def abort(self, reason: str | None = None) -> None:
        """Stop; with ``reason`` (an error), first tell each neighbour that asks why (for a
        few seconds at most), so that the first cause is named, not a chain of timeouts."""
        if self._server is not None:
            if reason:
                self.outbox.fail(f"{reason.splitlines()[0][:300]}", self.neighbours,
                                 min(self.timeout_s, 10.0))  # fmt: skip
            self._server.stop(grace=0.5).wait()
            for link in self._links.values():
                link.close()
            self._server = None

    # ------------------------------------------------------------------ collectives
    def exchange(self, tensors: dict[str, torch.Tensor], info: Any) -> dict[str, tuple]:
        """Every party's (tensors, info), flooded over the neighbour links in ``hops`` rounds."""
        seq, self._seq = self._seq, self._seq + 1
        known = {self.me.name: ({k: v.detach().cpu() for k, v in tensors.items()}, info)}
        for hop in range(self.hops):
            tag = f"c{seq}.h{hop}"
            data = encode(Message(self.me.name, tag, tensors={
                f"{p}/{k}": v for p, (ts, _) in known.items() for k, v in ts.items()},
                info={p: inf for p, (_, inf) in known.items()}))  # fmt: skip
            for q in self.neighbours:
                self.outbox.put(tag, q, data)
            for q in self.neighbours:
                message = self.fetch(q, tag)
                for p, inf in message.info.items():
                    known.setdefault(p, ({k.partition("/")[2]: v for k, v in
                                          message.tensors.items() if k.startswith(p + "/")},
                                         inf))  # fmt: skip
        require(len(known) == len(self.consortium.parties),
                f"party {self.me.name}: a collective reached only {sorted(known)}")
        return known

    def _in_node_order(self, known: dict[str, tuple]) -> list[tuple]:
        return [known[p.name] for p in sorted(self.consortium.parties, key=lambda p: p.nodes[0])]

    # ------------------------------------------------------------------ Runtime
    def local_device(self, device: torch.device) -> torch.device:
        return device

    def hosted_block(self, n_nodes: int, device: torch.device) -> tuple[int, int]:
        require(int(n_nodes) == self.consortium.n_nodes,
                f"the topology has {n_nodes} nodes but consortium {self.consortium.name!r} "
                f"hosts {self.consortium.n_nodes}")  # fmt: skip
        return self.me.nodes[0], len(self.me.nodes)

    def is_main_process(self) -> bool:
        return True  # every party writes its own run folder

    def agree(self, check: Callable[[], None]) -> None:
        error = None
        try:
            check()
        except DPDLError as err:
            error = err
        failed = [p for p, (_, bad) in self.exchange({}, error is not None).items() if bad]
        if error is not None:
            raise error
        if failed:
            raise DPDLError(f"party {failed[0]} refused its nodes' data or the model (its own "
                            "message is on its output)")  # fmt: skip

    def all_true(self, flag: bool) -> bool:
        return all(ok for _, ok in self.exchange({}, bool(flag)).values())

    def same_on_every_rank(self, value: int) -> bool:
        return len({v for _, v in self.exchange({}, int(value)).values()}) == 1

    def all_node_counts(self, local: list[int], n_nodes: int) -> list[int]:
        return [c for _, counts in self._in_node_order(self.exchange({}, list(local)))
                for c in counts]  # fmt: skip

    def reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [ts["v"] for ts, _ in self._in_node_order(self.exchange({"v": tensor}, None))]
        return torch.stack(parts).sum(dim=0).to(tensor.device)

    def gather_nodes(self, tensor: torch.Tensor, n_nodes: int) -> torch.Tensor:
        parts = [ts["v"] for ts, _ in self._in_node_order(self.exchange({"v": tensor}, None))]
        return torch.cat(parts).to(tensor.device)

    def from_main_process(self, value: Any) -> Any:
        return value  # each party its own main process

    def job_run_name(self, name: str) -> str | None:
        return None

    def restarted(self) -> bool:
        return False  # a restart re-runs from the start, checked message by message

    def mixer(self, topology, block: tuple[int, int], device: torch.device) -> ConsortiumMixer:
        return ConsortiumMixer(self, topology, block, device)

    def before_step(self, step: int) -> None:
        _fault(self.me.name, step, "")


def _fault(party: str, step: int, phase: str) -> None:
    spec = os.environ.get("DPDL_CONSORTIUM_FAULT")
    if spec:
        who, _, rest = spec.partition(":")
        at, _, when = rest.partition(":")
        if (who, at, when) == (party, str(step), phase):
            os.kill(os.getpid(), signal.SIGKILL)


class ConsortiumMixer:
    """Push-sum mixing of a party's nodes (a :class:`dpdl.engine.mixing.Mixer`): for each
    neighbour party the rows of P^k into its nodes from this party's, (P x, P w) and the
    row ids, one message; the neighbours' messages into this party's nodes are added."""

    def __init__(self, runtime: ConsortiumRuntime, topology, block: tuple[int, int],
                 device: torch.device):  # fmt: skip
        self.runtime, self.topology, self.device = runtime, topology, device
        self.lo, self.hi = block[0], block[0] + block[1]
        self._matrices: dict[int, np.ndarray] = {}

    def _matrix(self, k: int) -> np.ndarray:
        period = getattr(self.topology, "period", None)
        key = k % period if isinstance(period, int) and period > 0 else k
        if key not in self._matrices:
            self._matrices = {} if len(self._matrices) > 64 else self._matrices
            self._matrices[key] = np.asarray(self.topology.mixing_matrix(k), dtype=np.float64)
        return self._matrices[key]

    def mix(self, params: Params, weights: torch.Tensor, k: int, *, step: int | None = None,
            out: Params | None = None) -> tuple[Params, torch.Tensor]:  # fmt: skip
        """See :class:`dpdl.engine.mixing.Mixer` (``out`` is not written)."""
        rt, P, lo, hi = self.runtime, self._matrix(k), self.lo, self.hi
        step = k if step is None else step
        n, rt._mixes = rt._mixes, rt._mixes + 1
        flat = flatten_rows(params)
        local = torch.as_tensor(P[lo:hi, lo:hi], device=flat.device)
        mixed, mixed_w = local.to(flat.dtype) @ flat, local @ weights
        rt.send(n, step, k, self._outgoing(P, flat, weights, Message(rt.me.name,
                                                                     f"m{n}.k{k}", step, k)))
        self._add_incoming(P, f"m{n}.k{k}", (step, k), mixed, mixed_w)
        return unflatten_rows(mixed, params), mixed_w

    def _others(self, P: np.ndarray, into_mine: bool):
        """(party, rows) for each other party that this step's graph connects: into its nodes
        from this party's (global rows), or into this party's from its (local rows)."""
        rt = self.runtime
        for party in rt.consortium.parties:
            first, last = party.nodes[0], party.nodes[-1] + 1
            block = P[self.lo:self.hi, first:last] if into_mine else P[first:last, self.lo:self.hi]
            rows = np.flatnonzero((block != 0).any(axis=1))
            if party.name == rt.me.name or not rows.size:
                continue
            require(party.name in rt.links[rt.me.name],
                    f"the graph links party {rt.me.name} to {party.name}, not a neighbour "
                    "over the rounds the run was planned for")  # fmt: skip
            yield party, rows if into_mine else first + rows

    def _outgoing(self, P, flat: torch.Tensor, weights: torch.Tensor,
                  header: Message) -> dict[str, bytes]:  # fmt: skip
        """Each party's message: (P x, P w) of its rows fed by this party's nodes, row ids."""
        items = {}
        for party, rows in self._others(P, into_mine=False):
            coeff = torch.as_tensor(P[np.ix_(rows, np.arange(self.lo, self.hi))],
                                    device=flat.device)  # fmt: skip
            items[party.name] = encode(dataclasses.replace(header, tensors={
                "x": coeff.to(flat.dtype) @ flat, "w": coeff @ weights,
                "rows": torch.as_tensor(rows)}))  # fmt: skip
        return items

    def _add_incoming(self, P, tag: str, step_round: tuple[int, int], mixed: torch.Tensor,
                      mixed_w: torch.Tensor) -> None:  # fmt: skip
        """Add each neighbour's message into this party's rows (checked against the graph)."""
        rt = self.runtime
        for party, rows in self._others(P, into_mine=True):
            message = rt.fetch(party.name, tag)
            require((message.step, message.round) == step_round
                    and np.array_equal(message.tensors["rows"].numpy(), self.lo + rows),
                    f"party {rt.me.name}: party {party.name}'s message {tag} does not match "
                    "the graph")  # fmt: skip
            index = torch.as_tensor(rows, device=mixed.device)
            mixed.index_add_(0, index, message.tensors["x"].to(mixed.device, mixed.dtype))
            mixed_w.index_add_(0, index, message.tensors["w"].to(mixed_w.device, mixed_w.dtype))
