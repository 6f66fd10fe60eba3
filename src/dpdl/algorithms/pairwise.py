"""Pairwise secrets: a 256-bit key per edge that only its two endpoints can compute.

Correlated noise that cancels across the network (DECOR, issue 41) needs a secret per edge
{i, j} that i and j share and nobody else knows.  Each node holds an X25519 key pair (RFC
7748, OpenSSL through ``cryptography``); only the public keys are exchanged (the engine
gathers them over its runtime's collective at start-up: in memory in the simulator, over the
process group in the distributed runtime).  Then, for an edge {i, j}:

* shared = X25519(private_i, public_j) = X25519(private_j, public_i) (Diffie-Hellman);
* edge key = HKDF-SHA256(shared, salt = none, info = purpose | min(i, j) | max(i, j)), 32
  bytes (RFC 5869): the info names the unordered pair and what the key is for, so two edges,
  or two purposes of one edge, never share a key;
* the stream of step k and round r = ChaCha20 under HKDF-Expand(edge key, info = "round" |
  k | r) (:class:`~dpdl.algorithms.randomness.SecretStream`): both endpoints read the same
  keystream, and no two (step, round) pairs share one.

A node's zero-sum shares (``privacy.correlation = "neighbourhood-zero-sum"``) come from a key
only the node itself can compute: HKDF-SHA256(its private scalar, info = label | node |
purpose), read per (step, round) the same way (:meth:`HostedKeys.own_stream`).

Keys: a node's private key is 32 bytes of ``os.urandom`` (``entropy = "os"``, the default),
or, in the labelled research mode ``entropy = "seed"``, derived from the run's stream root,
the node's index and its data's fingerprint (:func:`~dpdl.algorithms.randomness.derive_key`):
anyone who knows the seed can rebuild every edge key then.  A node's private key stays in the
object of the node that owns it (:class:`NodeKeyPair`) and in that process's own checkpoint
(:meth:`HostedKeys.state`), never in shared results.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF, HKDFExpand

from dpdl.algorithms.randomness import KEY_BYTES, SecretStream, derive_key
from dpdl.errors import DPDLError, require

__all__ = [
    "DECOR_PURPOSE",
    "ZERO_SUM_PURPOSE",
    "HostedKeys",
    "NodeKeyPair",
    "edge_info",
    "round_info",
    "round_stream",
]

#: What the edge keys of DECOR's pairwise-cancelling noise are for (HKDF's info).
DECOR_PURPOSE = "decor pairwise noise"
#: What a node's own key for its zero-sum shares is for (HKDF's info).
ZERO_SUM_PURPOSE = "neighbourhood zero-sum shares"
_EDGE_LABEL = b"dpdl pairwise edge key v1"
_OWN_LABEL = b"dpdl node own key v1"
_ROUND_LABEL = b"dpdl pairwise round stream v1"
_RAW = serialization.Encoding.Raw


def _u64(value: int, what: str) -> bytes:
    require(isinstance(value, int) and 0 <= value < 1 << 64,
            f"{what} must be an integer in [0, 2^64), got {value!r}")  # fmt: skip
    return value.to_bytes(8, "big")


def edge_info(i: int, j: int, purpose: str) -> bytes:
    """HKDF's info of edge {i, j}: the label, the pair in increasing order (both endpoints
    write the same bytes) and the purpose, length-prefixed."""
    require(i != j, f"an edge joins two different nodes, got {i} and {j}")
    lo, hi = sorted((i, j))
    text = purpose.encode()
    return _EDGE_LABEL + _u64(lo, "a node index") + _u64(hi, "a node index") + \
        _u64(len(text), "a purpose's length") + text  # fmt: skip


def round_info(step: int, round_: int) -> bytes:
    """HKDF-Expand's info of the stream of step ``step``, gossip round ``round_``."""
    return _ROUND_LABEL + _u64(step, "a step") + _u64(round_, "a round")


class NodeKeyPair:
    """One node's X25519 key pair.  ``private`` None draws 32 bytes from ``os.urandom``; 32
    bytes given are the private scalar (RFC 7748 clamps it).  Never pickled or printed."""

    __slots__ = ("node", "_private", "public")

    def __init__(self, node: int, private: bytes | None = None):
        raw = os.urandom(KEY_BYTES) if private is None else bytes(private)
        require(len(raw) == KEY_BYTES, f"an X25519 private key has {KEY_BYTES} bytes, "
                f"got {len(raw)} (node {node})")  # fmt: skip
        self.node = int(node)
        self._private = X25519PrivateKey.from_private_bytes(raw)
        #: the 32-byte public key: what the node tells the others
        self.public = self._private.public_key().public_bytes(_RAW, serialization.PublicFormat.Raw)

    def __repr__(self) -> str:  # the private key is secret
        return f"NodeKeyPair(node={self.node}, public={self.public.hex()[:16]}...)"

    def __reduce__(self):
        raise TypeError("a NodeKeyPair holds a private key and is never pickled; checkpoint "
                        "it with private_bytes()")  # fmt: skip

    def private_bytes(self) -> bytes:
        """The raw private key: for this process's own checkpoint only."""
        return self._private.private_bytes(_RAW, serialization.PrivateFormat.Raw,
                                           serialization.NoEncryption())  # fmt: skip

    def edge_key(self, peer: int, peer_public: bytes, purpose: str = DECOR_PURPOSE) -> bytes:
        """The 256-bit key of edge {node, peer}: HKDF-SHA256 of the X25519 shared secret.  The
        peer computes the same key from its private key and this node's public one."""
        require(len(peer_public) == KEY_BYTES,
                f"node {peer}'s public key has {len(peer_public)} bytes, not {KEY_BYTES}")
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(bytes(peer_public)))
        except ValueError:  # OpenSSL refuses a low-order point (an all-zero shared secret)
            raise DPDLError(f"node {peer}'s public key is not a valid X25519 key (a low-order "
                            "point): refusing a pairwise secret anyone could compute") from None
        return HKDF(hashes.SHA256(), KEY_BYTES, salt=None,
                    info=edge_info(self.node, peer, purpose)).derive(shared)  # fmt: skip

    def own_key(self, purpose: str) -> bytes:
        """A 256-bit key only this node can compute: HKDF-SHA256 of its private scalar, named
        by the node and ``purpose`` (so it is no edge key, and no other purpose's key)."""
        return HKDF(hashes.SHA256(), KEY_BYTES, salt=None,
                    info=own_info(self.node, purpose)).derive(self.private_bytes())


def own_info(node: int, purpose: str) -> bytes:
    """HKDF's info of a node's own key for ``purpose``: the label, the node, the purpose."""
    text = purpose.encode()
    return _OWN_LABEL + _u64(node, "a node index") + _u64(len(text), "a purpose's length") + text


def round_stream(edge_key: bytes, step: int, round_: int) -> SecretStream:
    """The ChaCha20 stream of one edge (or one node's own key) at step ``step``, gossip round
    ``round_``: under the key HKDF-Expand(key, round_info(step, round_)), read from its
    start."""
    key = HKDFExpand(hashes.SHA256(), KEY_BYTES, info=round_info(step, round_)).derive(edge_key)
    return SecretStream(key)


class HostedKeys:
    """The key pairs of the nodes one process hosts (``first``, ``first + 1``, ...) and every
    node's public key once exchanged (:meth:`learn_publics`).

    ``root`` None: OS keys (secret); a root key (bytes, the run's stream root) or an int:
    seeded keys derived from it, each node's index and ``salts[i]`` (its data's
    fingerprint), a research mode.  Edge keys are computed on first use and kept in memory.
    """

    def __init__(self, first: int, count: int, root: bytes | int | None = None,
                 salts: Sequence[bytes] | None = None, purpose: str = DECOR_PURPOSE):  # fmt: skip
        salts = [b""] * count if salts is None else list(salts)
        require(len(salts) == count, f"need one salt per hosted node: {len(salts)} for {count}")
        if isinstance(root, int) and not isinstance(root, bool):
            root = derive_key("int root", int(root))
        require(root is None or isinstance(root, bytes),
                f"pairwise keys take None, a root key (bytes) or an int, got {type(root).__name__}")
        self.first, self.purpose = int(first), purpose
        self.pairs = [NodeKeyPair(node, None if root is None else
                                  derive_key(root, "x25519 node key", node, salt))
                      for node, salt in zip(range(first, first + count), salts, strict=True)]
        self._publics: dict[int, bytes] = {}
        self._edges: dict[tuple[int, int], bytes] = {}

    def __repr__(self) -> str:
        return f"HostedKeys(first={self.first}, count={len(self.pairs)})"

    def __reduce__(self):
        raise TypeError("HostedKeys hold private keys and are never pickled; checkpoint "
                        "them with state()")  # fmt: skip

    @property
    def own_publics(self) -> list[bytes]:
        """The hosted nodes' public keys, in node order: what this process sends."""
        return [pair.public for pair in self.pairs]

    def learn_publics(self, publics: Mapping[int, bytes] | Sequence[bytes]) -> None:
        """Every node's public key (a sequence in node order, or node -> key); the hosted
        nodes' own must be theirs (a mix-up of the exchange is refused)."""
        table = dict(enumerate(publics)) if not isinstance(publics, Mapping) else dict(publics)
        for pair in self.pairs:
            require(table.get(pair.node) == pair.public,
                    f"the public keys exchanged do not hold node {pair.node}'s own")
        self._publics = {int(k): bytes(v) for k, v in table.items()}
        self._edges.clear()

    def edge_key(self, node: int, peer: int) -> bytes:
        """The key of edge {node, peer}, computed by hosted ``node`` alone (its private key,
        the peer's public key)."""
        local = node - self.first
        require(0 <= local < len(self.pairs), f"node {node} is not hosted here")
        if (node, peer) not in self._edges:
            require(peer in self._publics,
                    f"node {peer}'s public key is unknown: exchange the public keys first")
            self._edges[node, peer] = self.pairs[local].edge_key(peer, self._publics[peer],
                                                                 self.purpose)  # fmt: skip
        return self._edges[node, peer]

    def stream(self, node: int, peer: int, step: int, round_: int) -> SecretStream:
        """Edge {node, peer}'s stream of (step, round), as hosted ``node`` computes it."""
        return round_stream(self.edge_key(node, peer), step, round_)

    def own_stream(self, node: int, step: int, round_: int,
                   purpose: str = ZERO_SUM_PURPOSE) -> SecretStream:  # fmt: skip
        """Hosted ``node``'s own stream of (step, round) for ``purpose``: what no other node
        can read (its zero-sum shares are drawn from it)."""
        local = node - self.first
        require(0 <= local < len(self.pairs), f"node {node} is not hosted here")
        return round_stream(self.pairs[local].own_key(purpose), step, round_)

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> list[bytes]:
        """The hosted nodes' private keys (this process's own checkpoint file only)."""
        return [pair.private_bytes() for pair in self.pairs]

    def load_state(self, state: Sequence[bytes]) -> None:
        """Put :meth:`state` back; the public keys must then be exchanged again."""
        require(len(state) == len(self.pairs),
                f"the checkpoint holds {len(state)} pairwise keys, this process hosts "
                f"{len(self.pairs)} nodes")  # fmt: skip
        self.pairs = [NodeKeyPair(pair.node, bytes(raw))
                      for pair, raw in zip(self.pairs, state, strict=True)]  # fmt: skip
        self._publics, self._edges = {}, {}
