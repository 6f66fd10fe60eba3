"""Issue 39, in one process: the consortium file, its PKI, the wire format, the sent ledger
and the mutual-TLS links (real TLS on loopback: who is refused, and what the wire shows)."""

from __future__ import annotations

import json
import socket
import stat
import threading

import grpc
import numpy as np
import pytest
import torch
from cryptography import x509
from cryptography.x509.oid import NameOID
from tests.engine.consortium_helpers import free_ports, write_consortium

from dpdl.engine.consortium.pki import issue, new_authority, provision
from dpdl.engine.consortium.sent_ledger import SentLedger
from dpdl.engine.consortium.settings import load_consortium
from dpdl.engine.consortium.transport import _PATH, Credentials, Link, Outbox, serve
from dpdl.engine.consortium.wire import DTYPES, Message, decode, encode
from dpdl.errors import DPDLError


@pytest.fixture
def consortium(tmp_path):
    path = write_consortium(tmp_path, parties=3, nodes_each=1, timeout_s=3)
    provision(load_consortium(path), tmp_path / "pki")
    return load_consortium(path)


# ------------------------------------------------------------------ the consortium file
@pytest.mark.parametrize("edit, named", [
    (lambda s: s.replace('name = "p1"', 'name = "p0"'), "'p0' appears twice"),
    (lambda s: s.replace("nodes = [1]", "nodes = [3]"), "0..n-1"),
    (lambda s: s.replace('name = "p2"', 'name = "P_2"'), "'P_2'"),
    (lambda s: s.replace('collector = "p0"', 'collector = "p9"'), "'p9'"),
    (lambda s: s.replace("timeout_s = 3", "timeout_s = -1"), "timeout_s"),
    (lambda s: s.replace('address = "127.0.0.1:', 'address = "127.0.0.1;', 1), "host:port"),
    (lambda s: s + "\n[extra]\n", "extra"),
])  # fmt: skip
def test_a_bad_consortium_file_is_one_line_naming_the_value(tmp_path, edit, named):
    path = write_consortium(tmp_path, parties=3, nodes_each=1, timeout_s=3)
    path.write_text(edit(path.read_text()))
    with pytest.raises(DPDLError) as err:
        load_consortium(path)
    assert named in str(err.value) and "\n" not in str(err.value)


def test_nodes_must_be_a_contiguous_range(tmp_path):
    path = write_consortium(tmp_path, parties=2, nodes_each=2)
    path.write_text(path.read_text().replace("nodes = [0, 1]", "nodes = [1, 0]"))
    with pytest.raises(DPDLError, match=r"nodes \[1, 0\] must be a contiguous"):
        load_consortium(path)


def test_an_unknown_party_is_refused_by_name(consortium):
    with pytest.raises(DPDLError, match="party 'p7' is not in consortium 'test'"):
        consortium.party("p7")


# ------------------------------------------------------------------ provisioning
def test_init_provisions_a_ca_and_named_party_certificates_with_private_keys(consortium):
    folder = consortium.ca_certificate.parent
    ca = x509.load_pem_x509_certificate((folder / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for party in consortium.parties:
        cert = x509.load_pem_x509_certificate(party.certificate.read_bytes())
        cert.verify_directly_issued_by(ca)  # raises unless the CA's signature is valid
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == party.name
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert san.get_values_for_type(x509.DNSName) == [party.name]
        assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    for key in [folder / "ca.key", *(p.key_path for p in consortium.parties)]:
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    with pytest.raises(DPDLError, match="exists: refusing to overwrite"):
        provision(consortium, folder)


def test_the_command_provisions_and_refuses_a_second_time(tmp_path, capsys):
    from dpdl.cli import main

    path = write_consortium(tmp_path, parties=2)
    assert main(["consortium", "init", str(path), str(tmp_path / "pki")]) == 0
    assert (tmp_path / "pki" / "p1.key").is_file()
    assert main(["consortium", "init", str(path), str(tmp_path / "pki")]) != 0
    assert "refusing to overwrite" in capsys.readouterr().err


# ------------------------------------------------------------------ the wire format
def test_tensors_cross_as_raw_bytes_with_dtype_shape_step_round_and_party():
    g = torch.Generator().manual_seed(0)
    tensors = {name: torch.randn(3, 2, generator=g).to(dtype) for name, dtype in DTYPES.items()}
    message = decode(encode(Message("p1", "m4.k3", 4, 3, tensors, {"a": [1, 2]})))
    assert (message.party, message.tag, message.step, message.round) == ("p1", "m4.k3", 4, 3)
    assert message.info == {"a": [1, 2]}
    for name, tensor in tensors.items():
        assert message.tensors[name].dtype == tensor.dtype
        assert torch.equal(message.tensors[name], tensor)
    raw = encode(Message("p1", "t", tensors={"x": tensors["float64"]}))
    assert tensors["float64"].numpy().tobytes() in raw  # the raw bytes, no pickle
    assert b"pickle" not in raw and b"\x80\x04" not in raw[:2]


@pytest.mark.parametrize("data", [b"", b"\x00" * 8 + b"{", encode(Message("p", "t"))[:-1] + b"x",
                                  b"\x00\x00\x00\x00\x00\x00\x00\x02{}"])  # fmt: skip
def test_a_malformed_message_is_one_line(data):
    with pytest.raises(DPDLError, match="malformed consortium message"):
        decode(data)


def test_an_unknown_dtype_is_refused():
    header = json.dumps({"party": "p", "tag": "t", "step": 0, "round": 0, "info": {},
                         "tensors": [{"name": "x", "dtype": "object", "shape": [1],
                                      "offset": 0, "nbytes": 8}]}).encode()  # fmt: skip
    with pytest.raises(DPDLError, match="malformed"):
        decode(len(header).to_bytes(8, "big") + header + bytes(8))


# ------------------------------------------------------------------ the sent ledger
def test_the_ledger_is_durable_before_sending_and_refuses_other_contents(tmp_path):
    path = tmp_path / "p1.sent.jsonl"
    ledger = SentLedger(path, "p1")
    ledger.record(0, 0, 0, {"p0": "aa"})
    ledger.record(1, 1, 1, {"p0": "bb", "p2": "cc"})
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [0, 1]
    again = SentLedger(path, "p1")  # a restarted party
    again.record(0, 0, 0, {"p0": "aa"})  # the very same message: no new release
    assert again.replayed == 1 and len(path.read_text().splitlines()) == 2
    with pytest.raises(DPDLError) as err:
        again.record(1, 1, 1, {"p0": "bb", "p2": "fresh noise"})
    assert "already sent message 1 (step 1)" in str(err.value)
    assert "2 steps sent" in str(err.value) and "\n" not in str(err.value)
    again.record(2, 2, 2, {"p0": "dd"})  # past what was sent: recorded
    assert SentLedger(path, "p1").steps_sent == 3


def test_a_line_torn_by_a_crash_was_never_sent_and_is_dropped(tmp_path):
    path = tmp_path / "p.jsonl"
    SentLedger(path, "p").record(0, 0, 0, {"q": "aa"})
    with open(path, "a") as fh:
        fh.write('{"n": 1, "step"')
    ledger = SentLedger(path, "p")
    assert len(ledger.entries) == 1
    ledger.record(1, 1, 1, {"q": "bb"})
    assert [json.loads(line)["n"] for line in path.read_text().splitlines()] == [0, 1]


# ------------------------------------------------------------------ the links
def _credentials(consortium, name: str) -> Credentials:
    party = consortium.party(name)
    return Credentials.from_files(party.key_path, party.certificate, consortium.ca_certificate)


@pytest.fixture
def p0_server(consortium):
    """p0 serving one item to its only neighbour p1 (p2 holds a valid certificate but is no
    neighbour)."""
    outbox = Outbox()
    secret = torch.arange(64, dtype=torch.float64) * np.pi
    outbox.put("m0.k0", "p1", encode(Message("p0", "m0.k0", 0, 0, {"x": secret})))
    server, handler = serve(consortium.party("p0").address, _credentials(consortium, "p0"),
                            outbox, frozenset({"p1"}))  # fmt: skip
    yield consortium.party("p0").address, handler, secret
    server.stop(0).wait()


def _raw_fetch(address: str, credentials, as_party: str, *, target: str = "p0"):
    options = [("grpc.ssl_target_name_override", target)]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        request = json.dumps({"party": as_party, "tag": "m0.k0"}).encode()
        return channel.unary_unary(_PATH)(request, timeout=5)


def test_a_neighbour_with_its_certificate_fetches_its_item(consortium, p0_server):
    address, _, secret = p0_server
    link = Link("p1", "p0", address, _credentials(consortium, "p1"))
    message = decode(link.fetch("m0.k0", timeout_s=5))
    assert message.party == "p0" and torch.equal(message.tensors["x"], secret)
    link.close()


def _client(ca: bytes, identity=None) -> grpc.ChannelCredentials:
    if identity is None:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=identity.key_pem,
                                        certificate_chain=identity.cert_pem)  # fmt: skip


def _self_signed(name: str):
    """A leaf certificate naming ``name`` (CN and SAN), signed by its own key."""
    import datetime

    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(1).not_valid_before(now)
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName(name)]), critical=False)
            .sign(key, hashes.SHA256()))  # fmt: skip
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())  # fmt: skip
    return type("Id", (), {"key_pem": pem,
                           "cert_pem": cert.public_bytes(serialization.Encoding.PEM)})


def test_clients_without_the_consortiums_certificate_are_refused(consortium, p0_server):
    address, handler, _ = p0_server
    ca = consortium.ca_certificate.read_bytes()
    other_ca = new_authority("intruders")
    self_signed = _self_signed("p1")
    for credentials in (_client(ca), _client(ca, self_signed),
                        _client(ca, issue(other_ca, "p1"))):  # another CA's "p1"
        with pytest.raises(grpc.RpcError) as err:
            _raw_fetch(address, credentials, "p1")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # the TLS handshake failed
    assert handler.refused == []  # refused by TLS: the handler never ran


def test_another_partys_certificate_is_refused_by_name(consortium, p0_server):
    address, handler, _ = p0_server
    p2 = _credentials(consortium, "p2")
    credentials = _client(p2.ca, type("Id", (), {"key_pem": p2.key, "cert_pem": p2.cert}))
    for claimed in ("p1", "p2"):  # p2 posing as p0's neighbour p1, or as itself (no neighbour)
        with pytest.raises(grpc.RpcError) as err:
            _raw_fetch(address, credentials, claimed)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert handler.refused == ["'p2' claimed 'p1'", "'p2' claimed 'p2'"]


def test_a_server_with_another_partys_certificate_is_refused_by_the_client(consortium,
                                                                          p0_server):
    address, handler, _ = p0_server  # p0's server, but p1 expects p2 at this address
    link = Link("p1", "p2", address, _credentials(consortium, "p1"))
    with pytest.raises(DPDLError, match=r"party p2 \(127.0.0.1:\d+\) sent nothing for m0.k0 "
                                        r"within 1 s"):  # fmt: skip
        link.fetch("m0.k0", timeout_s=1)
    link.close()
    assert handler.refused == []


def test_a_dead_neighbour_is_named_within_the_timeout(consortium):
    import time

    link = Link("p1", "p0", consortium.party("p0").address, _credentials(consortium, "p1"))
    start = time.monotonic()
    with pytest.raises(DPDLError, match=r"party p1: party p0 \(.*\) sent nothing for m3.k3 "
                                        r"within 1.5 s: it is down or unreachable"):
        link.fetch("m3.k3", timeout_s=1.5)
    assert time.monotonic() - start < 5
    link.close()


class _Relay:
    """A TCP relay on loopback that records every byte from the client to the server and
    back: what anyone on the path sees."""

    def __init__(self, target: str):
        host, port = target.rsplit(":", 1)
        self.target, self.seen = (host, int(port)), bytearray()
        self.listener = socket.create_server(("127.0.0.1", free_ports(1)[0]))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            for a, b in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src, dst):
        try:
            while data := src.recv(65536):
                self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_the_bytes_on_the_wire_are_tls_and_show_no_tensor(consortium, p0_server):
    address, _, secret = p0_server
    relay = _Relay(address)
    link = Link("p1", "p0", relay.address, _credentials(consortium, "p1"))
    message = decode(link.fetch("m0.k0", timeout_s=5))
    link.close()
    relay.listener.close()
    assert torch.equal(message.tensors["x"], secret)  # the message did cross the relay
    wire = bytes(relay.seen)
    assert wire[:1] == b"\x16" and wire[1:3] in (b"\x03\x01", b"\x03\x03")  # a TLS handshake
    raw = secret.numpy().tobytes()
    assert raw in encode(message)  # in the clear it would show ...
    for start in range(0, len(raw) - 16 + 1, 8):  # ... and no 16-byte piece of it does
        assert raw[start:start + 16] not in wire
    assert b'"tag"' not in wire and b"m0.k0" not in wire  # nor the request


def test_a_stopped_neighbour_tells_why_to_whoever_waits_for_it(consortium, p0_server):
    address, handler, _ = p0_server
    outbox = handler.outbox
    telling = threading.Thread(target=outbox.fail, args=("party p0 stopped: disk full",
                                                         ["p1"], 10))  # fmt: skip
    telling.start()
    link = Link("p1", "p0", address, _credentials(consortium, "p1"))
    with pytest.raises(DPDLError, match=r"^party p1: party p0 \(127.0.0.1:\d+\) stopped: "
                                        r"party p0 stopped: disk full$"):  # fmt: skip
        link.fetch("m9.k9", timeout_s=10)
    telling.join(timeout=10)
    assert not telling.is_alive()  # it returned once p1 had been told, not after 10 s
    link.close()


def test_a_waiting_neighbour_names_whom_it_waits_for(consortium, p0_server):
    address, handler, _ = p0_server
    handler.outbox.waiting = "party p2 (127.0.0.1:9) for m1.k1"
    link = Link("p1", "p0", address, _credentials(consortium, "p1"))
    with pytest.raises(DPDLError, match=r"sent nothing for m9.k9 within 1.5 s: it is down or "
                                        r"unreachable \(NOT_FOUND: m9.k9 not produced yet: it "
                                        r"waits for party p2 \(127.0.0.1:9\) for m1.k1\)"):
        link.fetch("m9.k9", timeout_s=1.5)
    link.close()


# ------------------------------------------------------------------ the runtime, in threads
def test_party_links_follow_the_graph_over_every_round(tmp_path):
    from dpdl.engine.consortium.runtime import party_links
    from dpdl.topology import make_topology

    consortium = load_consortium(write_consortium(tmp_path, parties=4, nodes_each=2))
    ring = make_topology("ring", 8, seed=0)  # i hears i-1: parties next to each other
    assert party_links(consortium, ring, range(1)) == {
        "p0": {"p1", "p3"}, "p1": {"p0", "p2"}, "p2": {"p1", "p3"}, "p3": {"p2", "p0"}}
    # the exponential graph's round k joins i and i - 2^k: round 2 joins p0 and p2 as well
    exp = make_topology("exp", 8, seed=0)
    assert party_links(consortium, exp, range(2))["p0"] == {"p1", "p3"}
    assert party_links(consortium, exp, range(3))["p0"] == {"p1", "p2", "p3"}


def _parties_in_threads(tmp_path, topology, work):
    """Four ConsortiumRuntimes (2 nodes each) in threads, each with its own server; each runs
    ``work(runtime)``; their results by party (an exception is re-raised)."""
    from dpdl.engine.consortium.runtime import ConsortiumRuntime, party_links

    path = write_consortium(tmp_path, parties=4, nodes_each=2, timeout_s=20)
    provision(load_consortium(path), tmp_path / "pki")
    consortium = load_consortium(path)
    links = party_links(consortium, topology, range(topology.period))
    results, errors = {}, []

    def party(name):
        runtime = ConsortiumRuntime(consortium, name, links, tmp_path / f"{name}.jsonl")
        runtime.start()
        try:
            results[name] = work(runtime)
            runtime.close()
        except BaseException as err:  # noqa: BLE001 -- handed to the test below
            errors.append(err)
            runtime.abort(str(err))

    threads = [threading.Thread(target=party, args=(f"p{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


def test_the_parties_mix_as_the_in_memory_mixer_and_agree_on_the_collectives(tmp_path):
    from dpdl.engine.mixing import InMemoryMixer
    from dpdl.topology import make_topology

    topology = make_topology("exp", 8, seed=0)
    g = torch.Generator().manual_seed(1)
    params = {"a": torch.randn(8, 3, 2, generator=g), "b": torch.randn(8, 5, generator=g)}
    weights = torch.rand(8, generator=g, dtype=torch.float64) + 0.5
    want = [InMemoryMixer(topology, torch.device("cpu")).mix(params, weights, k) for k in (0, 1)]

    def work(runtime):
        lo, m = runtime.hosted_block(8, torch.device("cpu"))
        mixer = runtime.mixer(topology, (lo, m), torch.device("cpu"))
        mine = {k: v[lo:lo + m] for k, v in params.items()}
        mixed = [mixer.mix(mine, weights[lo:lo + m], k) for k in (0, 1)]
        return lo, m, mixed, runtime.all_node_counts([lo, lo + 1], 8), \
            runtime.reduce_sum(mine["b"].sum(0)), runtime.gather_nodes(mine["a"], 8)

    for lo, m, mixed, counts, total, every in _parties_in_threads(tmp_path, topology,
                                                                  work).values():
        for (got_p, got_w), (want_p, want_w) in zip(mixed, want, strict=True):
            for name in params:
                torch.testing.assert_close(got_p[name], want_p[name][lo:lo + m])
            torch.testing.assert_close(got_w, want_w[lo:lo + m])
        assert counts == list(range(8))
        torch.testing.assert_close(total, params["b"].sum(0))
        assert torch.equal(every, params["a"])
    # every message left only after its line in the party's ledger
    ledger = SentLedger(tmp_path / "p0.jsonl", "p0")
    fed = [sorted({f"p{i // 2}" for i in np.flatnonzero(topology.mixing_matrix(k)[:, :2].any(1))
                   if i >= 2}) for k in (0, 1)]  # the other parties nodes 0 and 1 feed
    assert fed == [["p1"], ["p1"]]  # round k: node i -> i + 2^k
    assert [(e["step"], sorted(e["sha256"])) for e in ledger.entries] == [(0, fed[0]),
                                                                          (1, fed[1])]


def test_a_party_that_refuses_stops_every_party_naming_it(tmp_path):
    from dpdl.topology import make_topology

    def work(runtime):
        def check():
            if runtime.me.name == "p2":
                raise DPDLError("node 5's file is missing")
        try:
            runtime.agree(check)
        except DPDLError as err:
            return str(err)
        return "agreed"

    said = _parties_in_threads(tmp_path, make_topology("exp", 8, seed=0), work)
    assert said["p2"] == "node 5's file is missing"
    assert {said[p] for p in ("p0", "p1", "p3")} == {
        "party p2 refused its nodes' data or the model (its own message is on its output)"}


def test_the_runtime_needs_the_consortium_command():
    from dpdl.engine.runtime import make_runtime

    with pytest.raises(DPDLError, match=r"started by `dpdl run CONFIG --consortium FILE "
                                        r"--party NAME`"):  # fmt: skip
        make_runtime("consortium")


@pytest.mark.parametrize("flags, said", [
    (["--party", "p1"], "--consortium FILE and --party NAME go together"),
    (["--consortium", "{file}", "--party", "p9"], "party 'p9' is not in consortium 'test'"),
    (["--consortium", "{file}", "--party", "p1", "--procs", "2"], "--procs does not apply"),
    (["--consortium", "{file}", "--party", "p1", "--runtime", "distributed"],
     "not --runtime distributed"),
])  # fmt: skip
def test_a_party_command_is_refused_in_one_line_before_anything_runs(tmp_path, capsys, flags,
                                                                      said):
    from dpdl.cli import main

    path = write_consortium(tmp_path, parties=2)
    argv = ["run", "--output", str(tmp_path / "out")] + [f.format(file=path) for f in flags]
    assert main(argv) != 0
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_a_run_with_another_config_beside_an_unfinished_one_is_refused(tmp_path):
    from dpdl.engine.consortium.sent_ledger import check_no_unfinished_run

    first = tmp_path / f"p1-{'a' * 16}.sent.jsonl"
    second = tmp_path / f"p1-{'b' * 16}.sent.jsonl"
    SentLedger(first, "p1").record(0, 0, 0, {"p0": "aa"})
    SentLedger(tmp_path / f"p1-x-{'c' * 16}.sent.jsonl", "p1-x").record(0, 0, 0, {"p0": "aa"})
    check_no_unfinished_run(tmp_path, "p1", first)  # its own restart: the ledger checks it
    with pytest.raises(DPDLError, match=r"party p1: an unfinished run already sent 1 messages "
                                        r"\(1 steps\) from this folder"):  # fmt: skip
        check_no_unfinished_run(tmp_path, "p1", second)
    SentLedger(first, "p1").finish()
    assert SentLedger(first, "p1").finished and len(SentLedger(first, "p1").entries) == 1
    check_no_unfinished_run(tmp_path, "p1", second)  # p1-x's ledger is another party's


def test_secret_stream_roots_are_kept_on_the_partys_disk_for_its_restart(tmp_path):
    from dpdl.algorithms.randomness import stream_root
    from dpdl.engine.consortium.runtime import ConsortiumRuntime

    consortium = load_consortium(write_consortium(tmp_path, parties=2, nodes_each=1))
    links = {"p0": frozenset({"p1"}), "p1": frozenset({"p0"})}
    ledger = tmp_path / "out" / "p0-0123456789abcdef.sent.jsonl"
    first = ConsortiumRuntime(consortium, "p0", links, ledger)
    key = first.stream_root("os", 3, {"lr": 0.1})
    (path,) = ledger.with_suffix(".keys").iterdir()
    assert len(key) == 32 and path.read_bytes() == key
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    restarted = ConsortiumRuntime(consortium, "p0", links, ledger)  # a new process's
    assert restarted.stream_root("os", 3, {"lr": 0.1}) == key  # the noise it already sent
    other = restarted.stream_root("os", 3, {"lr": 0.2})
    assert other != key and len(list(ledger.with_suffix(".keys").iterdir())) == 2
    seeded = restarted.stream_root("seed", 3, {"lr": 0.1})
    assert seeded == stream_root("seed", 3, {"lr": 0.1})  # research mode: derived, not kept
    path.write_bytes(key[:5])
    with pytest.raises(DPDLError, match="is damaged: refusing to draw other noise"):
        restarted.stream_root("os", 3, {"lr": 0.1})
    # messages already left and the key lost: refused before any fresh noise is drawn (an
    # attacker's finding: the refusal used to wait for the first mixing message)
    path.unlink()
    restarted.ledger.record(0, 0, 0, {"p1": "00"})
    again = ConsortiumRuntime(consortium, "p0", links, ledger)
    with pytest.raises(DPDLError, match="already left .* is gone: refusing to draw fresh"):
        again.stream_root("os", 3, {"lr": 0.1})


def test_zero_sum_noise_is_refused_before_the_party_listens(tmp_path, capsys):
    """Its shares travel point to point, which the consortium's transport cannot carry: the
    party says so in one line before it listens, talks or writes anything."""
    from tests.engine.test_runtime import CONFIG

    from dpdl.cli import main

    path = write_consortium(tmp_path, parties=2)
    config = tmp_path / "zero-sum.toml"
    config.write_text(CONFIG + 'correlation = "neighbourhood-zero-sum"\ncorrelation_factor = 1.0\n')
    argv = ["run", str(config), "--output", str(tmp_path / "out"), "--consortium", str(path),
            "--party", "p0"]  # fmt: skip
    assert main(argv) != 0
    err = capsys.readouterr().err
    refusal = [line for line in err.splitlines() if not line.startswith("warning: entropy")]
    assert len(refusal) == 1 and "the consortium runtime cannot carry them" in refusal[0], err
    assert not (tmp_path / "out").exists()
