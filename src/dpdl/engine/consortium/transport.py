"""The consortium's links: gRPC with mutual TLS under the consortium CA.

Each party runs one server, on the one address the consortium file gives it, holding an
*outbox* of what it produced for each neighbour (a mixing message, a hop of a collective),
and fetches what its neighbours produced for it from their servers (pull: a restarted
party asks again for what it needs, and a peer that is late is simply waited for).

Who is who is settled by TLS before any tensor moves:

* the server asks every client for a certificate signed by the consortium CA (no
  certificate, a self-signed one or one of another CA: the handshake fails), and then
  serves a request only when the certificate's CN is a neighbour of this party and the
  party the request claims to be (``context.auth_context()``);
* a client trusts only the consortium CA and checks that the server's certificate names the
  party it meant to reach (its DNS SAN, as the TLS target name): another party's server, even
  with a valid certificate, is refused.
"""

from __future__ import annotations

import json
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import grpc

from dpdl.errors import DPDLError

__all__ = ["Credentials", "Link", "Outbox", "serve"]

SERVICE, METHOD = "dpdl.consortium.Link", "Fetch"
_PATH = f"/{SERVICE}/{METHOD}"
_WAIT_S = 1.0  # how long a server holds a request for an item not yet produced
_RETRYABLE = (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.UNAVAILABLE,
              grpc.StatusCode.DEADLINE_EXCEEDED)  # fmt: skip


@dataclass(frozen=True)
class Credentials:
    """A party's PEM key and certificate, and the consortium CA's certificate."""

    key: bytes
    cert: bytes
    ca: bytes

    @classmethod
    def from_files(cls, key: Path, cert: Path, ca: Path) -> Credentials:
        for what, path in (("key", key), ("certificate", cert), ("CA certificate", ca)):
            if not Path(path).is_file():
                raise DPDLError(f"consortium {what} {str(path)!r} does not exist "
                                "(`dpdl consortium init` provisions it)")  # fmt: skip
        return cls(Path(key).read_bytes(), Path(cert).read_bytes(), Path(ca).read_bytes())


class Outbox:
    """What this party produced, by (tag, receiving party); waited on by the server.  Every
    item is kept for the whole run, since a restarted neighbour asks again from the start:
    memory grows with steps x model size x neighbours (a known limit for large models)."""

    def __init__(self):
        self._items: dict[tuple[str, str], bytes] = {}
        self._served: set[tuple[str, str]] = set()
        self._cond = threading.Condition()
        self.failure: str | None = None  # why this party stopped, told to whoever asks
        self.waiting: str | None = None  # whom this party waits for (told to whoever waits)
        self._told: set[str] = set()

    def put(self, tag: str, party: str, data: bytes) -> None:
        with self._cond:
            self._items[(tag, party)] = data
            self._cond.notify_all()

    def take(self, tag: str, party: str, wait_s: float) -> bytes | None:
        with self._cond:
            self._cond.wait_for(lambda: (tag, party) in self._items or self.failure,
                                timeout=wait_s)  # fmt: skip
            data = self._items.get((tag, party))
            if data is None and self.failure:
                self._told.add(party)
                self._cond.notify_all()
            if data is not None:
                self._served.add((tag, party))
                self._cond.notify_all()
            return data

    def fail(self, reason: str, parties, timeout_s: float) -> None:
        """From now on answer what is not produced with ``reason``; wait (up to
        ``timeout_s``) until each of ``parties`` asked once and was told."""
        with self._cond:
            self.failure = reason
            self._cond.notify_all()
            self._cond.wait_for(lambda: set(parties) <= self._told, timeout=timeout_s)

    def wait_served(self, tag: str, parties, timeout_s: float) -> bool:
        with self._cond:
            return self._cond.wait_for(
                lambda: all((tag, p) in self._served for p in parties), timeout=timeout_s)


class _Handler:
    """Serves a neighbour the items addressed to it, once its certificate says who it is."""

    def __init__(self, outbox: Outbox, neighbours: frozenset[str]):
        self.outbox, self.neighbours = outbox, neighbours
        self.refused: list[str] = []  # why requests were refused (for the operator and tests)

    def __call__(self, request: bytes, context) -> bytes:
        names = context.auth_context().get("x509_common_name") or [b""]
        peer = names[0].decode(errors="replace")
        try:
            asked = json.loads(request.decode())
            claimed, tag = str(asked["party"]), str(asked["tag"])
        except (ValueError, KeyError, UnicodeDecodeError):
            self.refused.append(f"{peer}: malformed request")
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "malformed request")
        if peer not in self.neighbours or claimed != peer:
            self.refused.append(f"{peer!r} claimed {claimed!r}")
            context.abort(grpc.StatusCode.PERMISSION_DENIED,
                          f"certificate {peer!r} is not the neighbour {claimed!r}")
        data = self.outbox.take(tag, peer, _WAIT_S)
        if data is None and self.outbox.failure:
            context.abort(grpc.StatusCode.ABORTED, self.outbox.failure)
        if data is None:
            waiting = self.outbox.waiting
            context.abort(grpc.StatusCode.NOT_FOUND, f"{tag} not produced yet" + (
                f": it waits for {waiting}" if waiting else ""))  # fmt: skip
        return data


def serve(address: str, credentials: Credentials, outbox: Outbox,
          neighbours: frozenset[str]) -> tuple[grpc.Server, _Handler]:  # fmt: skip
    """A started server on ``address`` only, requiring client certificates of the CA."""
    handler = _Handler(outbox, neighbours)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4 + 2 * len(neighbours)))
    method = grpc.unary_unary_rpc_method_handler(handler)  # bytes in, bytes out: no codec
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE,
                                                                          {METHOD: method}),))
    creds = grpc.ssl_server_credentials([(credentials.key, credentials.cert)],
                                        root_certificates=credentials.ca,
                                        require_client_auth=True)  # fmt: skip
    try:
        port = server.add_secure_port(address, creds)
    except RuntimeError as err:
        raise DPDLError(f"cannot listen on {address}: {err}") from None
    if port == 0:
        raise DPDLError(f"cannot listen on {address} (in use, or not this machine's address)")
    server.start()
    return server, handler


class Link:
    """This party's client of one neighbour's server (mutual TLS; the server must prove it is
    ``party``)."""

    def __init__(self, me: str, party: str, address: str, credentials: Credentials):
        self.me, self.party, self.address = me, party, address
        creds = grpc.ssl_channel_credentials(root_certificates=credentials.ca,
                                             private_key=credentials.key,
                                             certificate_chain=credentials.cert)  # fmt: skip
        self.channel = grpc.secure_channel(address, creds,
                                           options=[("grpc.ssl_target_name_override", party)])
        self._fetch = self.channel.unary_unary(_PATH)

    def fetch(self, tag: str, timeout_s: float) -> bytes:
        """The item ``tag`` the neighbour produced for this party, waiting for it up to
        ``timeout_s`` (then the neighbour is named as down, in one line)."""
        request = json.dumps({"party": self.me, "tag": tag}).encode()
        deadline, last = time.monotonic() + timeout_s, "no answer"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DPDLError(
                    f"party {self.me}: party {self.party} ({self.address}) sent nothing for "
                    f"{tag} within {timeout_s:g} s: it is down or unreachable ({last[:240]})")
            try:
                return self._fetch(request, timeout=min(left, _WAIT_S + 2.0))
            except grpc.RpcError as err:
                code, detail = err.code(), (err.details() or "").splitlines()[0:1]
                if code != grpc.StatusCode.DEADLINE_EXCEEDED or last == "no answer":
                    # (a deadline of the last try says less than the server's last answer)
                    last = f"{code.name}: {detail[0] if detail else ''}"
                if code == grpc.StatusCode.ABORTED:  # it stopped, and says why
                    raise DPDLError(f"party {self.me}: party {self.party} ({self.address}) "
                                    f"stopped: {detail[0] if detail else ''}") from None
                if code not in _RETRYABLE:
                    raise DPDLError(f"party {self.me}: party {self.party} ({self.address}) "
                                    f"refused {tag}: {last[:160]}") from None  # fmt: skip
                if code != grpc.StatusCode.NOT_FOUND:
                    time.sleep(min(0.2, max(left, 0)))

    def close(self) -> None:
        self.channel.close()
