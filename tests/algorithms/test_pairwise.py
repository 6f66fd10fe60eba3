"""Pairwise secrets (issue 41): X25519 key agreement, HKDF edge keys, per-round streams.

References: RFC 7748 §6.1's X25519 test vector, RFC 5869's HKDF test case 1 for a
hand-rolled HMAC-SHA256 HKDF, and that hand-rolled HKDF for the edge and round keys."""

from __future__ import annotations

import hashlib
import hmac
import pickle

import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

from dpdl.algorithms.pairwise import (
    DECOR_PURPOSE,
    HostedKeys,
    NodeKeyPair,
    edge_info,
    round_info,
    round_stream,
)
from dpdl.algorithms.randomness import SecretStream
from dpdl.errors import DPDLError

# RFC 7748 §6.1
ALICE_PRIVATE = bytes.fromhex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
ALICE_PUBLIC = bytes.fromhex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
BOB_PRIVATE = bytes.fromhex("5dab087e624a8a4b79e17f8b83800ee66f3bb1292618b6fd1c2f8b27ff88e0eb")
BOB_PUBLIC = bytes.fromhex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f")
SHARED = bytes.fromhex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")


def hkdf_sha256(ikm: bytes, info: bytes, length: int = 32, salt: bytes | None = None) -> bytes:
    """RFC 5869 by hand on HMAC-SHA256: extract (salt default: 32 zero bytes), expand."""
    prk = hmac.new(salt if salt is not None else bytes(32), ikm, hashlib.sha256).digest()
    return hkdf_expand(prk, info, length)


def hkdf_expand(prk: bytes, info: bytes, length: int = 32) -> bytes:
    out, block, counter = b"", b"", 1
    while len(out) < length:
        block = hmac.new(prk, block + info + bytes([counter]), hashlib.sha256).digest()
        out, counter = out + block, counter + 1
    return out[:length]


def test_the_hand_rolled_hkdf_meets_rfc_5869_case_1():
    okm = hkdf_sha256(bytes([0x0B] * 22), bytes(range(0xF0, 0xFA)), 42, salt=bytes(range(13)))
    assert okm.hex() == ("3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf"
                         "34007208d5b887185865")


def test_node_key_pairs_meet_rfc_7748_and_both_ends_derive_the_same_edge_key():
    alice, bob = NodeKeyPair(3, ALICE_PRIVATE), NodeKeyPair(8, BOB_PRIVATE)
    assert alice.public == ALICE_PUBLIC and bob.public == BOB_PUBLIC
    expected = hkdf_sha256(SHARED, edge_info(3, 8, DECOR_PURPOSE))
    assert alice.edge_key(8, bob.public) == expected
    assert bob.edge_key(3, alice.public) == expected
    # the info names the unordered pair and the purpose, length-prefixed
    assert edge_info(8, 3, "p") == edge_info(3, 8, "p") != edge_info(3, 9, "p")
    assert edge_info(3, 8, "p") != edge_info(3, 8, "q")
    assert alice.edge_key(8, bob.public, "another purpose") != expected


def test_the_round_stream_is_chacha20_under_hkdf_expand_of_the_edge_key():
    edge = bytes(range(32))
    want = SecretStream(hkdf_expand(edge, round_info(5, 2))).words(4)
    got = round_stream(edge, 5, 2).words(4)
    assert (got == want).all()
    assert not (round_stream(edge, 5, 3).words(4) == want).any()
    assert not (round_stream(edge, 6, 2).words(4) == want).any()


def test_hosted_keys_give_both_endpoints_the_same_stream_and_edges_differ():
    # two "processes": nodes 0-1 and nodes 2-3; only public keys cross
    left, right = HostedKeys(0, 2), HostedKeys(2, 2)
    publics = left.own_publics + right.own_publics
    for keys in (left, right):
        keys.learn_publics(publics)
    assert left.edge_key(1, 2) == right.edge_key(2, 1)
    assert (left.stream(1, 2, 7, 0).words(8) == right.stream(2, 1, 7, 0).words(8)).all()
    first = left.stream(0, 1, 7, 0).words(8)
    assert (first == left.stream(1, 0, 7, 0).words(8)).all()
    for other in (left.stream(0, 1, 8, 0), left.stream(0, 1, 7, 1), right.stream(2, 0, 7, 0),
                  right.stream(3, 1, 7, 0)):
        assert not (other.words(8) == first).any()
    # the shared secret is what the X25519 exchange of the two raw keys gives
    raw = [left.state()[1], right.state()[0]]
    shared = X25519PrivateKey.from_private_bytes(raw[0]).exchange(
        X25519PublicKey.from_public_bytes(publics[2]))
    assert left.edge_key(1, 2) == hkdf_sha256(shared, edge_info(1, 2, DECOR_PURPOSE))


def test_seeded_keys_are_reproducible_and_os_keys_are_not():
    one, two = HostedKeys(0, 3, root=b"r" * 32), HostedKeys(0, 3, root=b"r" * 32)
    assert one.own_publics == two.own_publics
    assert HostedKeys(0, 3, root=b"s" * 32).own_publics != one.own_publics
    salted = HostedKeys(0, 3, root=b"r" * 32, salts=[b"a", b"b", b"c"])
    assert salted.own_publics != one.own_publics
    assert HostedKeys(0, 3).own_publics != HostedKeys(0, 3).own_publics
    # a node's key does not depend on which block hosts it
    assert HostedKeys(1, 2, root=b"r" * 32).own_publics == one.own_publics[1:]


def test_keys_round_trip_through_a_checkpoint_and_are_never_pickled():
    keys = HostedKeys(0, 2)
    keys.learn_publics(keys.own_publics)
    edge = keys.edge_key(0, 1)
    restored = HostedKeys(0, 2)
    restored.load_state(keys.state())
    assert restored.own_publics == keys.own_publics
    restored.learn_publics(restored.own_publics)
    assert restored.edge_key(0, 1) == edge
    for secret in (keys, keys.pairs[0]):
        with pytest.raises(TypeError):
            pickle.dumps(secret)
        assert keys.state()[0].hex() not in repr(secret)


def test_bad_exchanges_and_edges_are_refused_in_one_line():
    keys = HostedKeys(0, 2)
    with pytest.raises(DPDLError, match="exchange the public keys first"):
        keys.edge_key(0, 1)
    with pytest.raises(DPDLError, match="do not hold node 0's own"):
        keys.learn_publics([bytes(32), keys.own_publics[1]])
    keys.learn_publics(keys.own_publics)
    with pytest.raises(DPDLError, match="node 5 is not hosted here"):
        keys.edge_key(5, 0)
    with pytest.raises(DPDLError, match="two different nodes"):
        keys.edge_key(1, 1)
    with pytest.raises(DPDLError, match="node 9's public key is not a valid X25519 key"):
        keys.pairs[0].edge_key(9, bytes(32))  # the zero point: its shared secret is zero
    with pytest.raises(DPDLError, match="2 pairwise keys, this process hosts 3"):
        HostedKeys(0, 3).load_state(keys.state())
