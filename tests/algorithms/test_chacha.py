"""The torch ChaCha20 (dpdl.algorithms.chacha) against OpenSSL's, through ``cryptography``:
block by block (each reference block from a fresh OpenSSL encryptor, its 16-byte nonce the
128-bit little-endian block counter), across the 2^32 and 2^64 block boundaries and the
chunks the torch path works in; and a run's noise whichever path drew its words."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

import dpdl
from dpdl.algorithms import chacha, noise
from dpdl.algorithms.randomness import DEVICE_KEYSTREAM, SecretStream, fill_words

KEY = bytes(range(7, 39))


def openssl_blocks(key: bytes, first: int, count: int) -> bytes:
    """Blocks first .. first + count - 1, each from its own encryptor (OpenSSL refuses to run
    one encryptor past its 32-bit counter, so no block here relies on its carry)."""
    return b"".join(
        Cipher(algorithms.ChaCha20(key, (first + i).to_bytes(16, "little")), mode=None)
        .encryptor()
        .update(bytes(64))
        for i in range(count)
    )


def test_rfc8439_block_vector():
    """RFC 8439 §2.3.2: key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1; the
    RFC's 12-byte nonce above a 32-bit counter is the 128-bit counter 1 + nonce 2^32."""
    counter = 1 + (int.from_bytes(bytes.fromhex("000000090000004a00000000"), "little") << 32)
    got = chacha.blocks(bytes(range(32)), counter, 1).numpy().tobytes()
    assert got.hex().startswith("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e")
    assert got == openssl_blocks(bytes(range(32)), counter, 1)


@pytest.mark.parametrize("first", [0, 2**32 - 3, 2**64 - 2, 2**96 - 1])
def test_blocks_equal_openssl_across_counter_carries(first):
    """Six blocks from a few before a 32-bit limb of the counter wraps: the carry runs into the
    next limb as the stream's 128-bit counter (and SecretStream's fresh encryptors) say."""
    got = chacha.blocks(KEY, first, 6).numpy().tobytes()
    assert got == openssl_blocks(KEY, first, 6)


def test_secret_stream_reads_past_the_rollover_the_same_on_both_paths(monkeypatch):
    """A stream standing 3 blocks and 24 bytes before block 2^32 reads 9 blocks of words: the
    OpenSSL path (which changes encryptor at 2^32) and the torch path give the same words, and
    both streams stand at the same place afterwards."""
    position = (2**32 - 3) * 64 - 24

    def stream():
        s = SecretStream(KEY)
        state = s.get_state()
        state[32:] = torch.frombuffer(bytearray(position.to_bytes(32, "little")), dtype=torch.uint8)
        s.set_state(state)
        return s

    reference = stream().read(9 * 64)
    assert reference.tobytes() == openssl_blocks(KEY, 2**32 - 4, 10)[40 : 40 + 9 * 64]
    out = torch.empty((1, 9 * 8), dtype=torch.int64)
    monkeypatch.setitem(DEVICE_KEYSTREAM, "cpu", "torch")
    moved = stream()
    fill_words([moved], out)
    assert out.numpy().view(np.uint8).tobytes() == reference.tobytes()
    assert moved.words(5).tolist() == stream().words(9 * 8 + 5)[-5:].tolist()


def test_many_streams_at_uneven_positions_across_chunks(monkeypatch):
    """Five streams at different byte offsets (word-aligned or not) in one call, the torch path
    cut into chunks of 3 blocks per row: each row is its stream's own OpenSSL keystream."""
    monkeypatch.setattr(chacha, "_CPU_LANES", 15)
    offsets = [0, 8, 24, 64 * 5 + 3, 1000]
    keys = [bytes([k]) * 32 for k in range(5)]
    out = torch.empty((5, 777), dtype=torch.uint8)
    chacha.keystream(keys, offsets, out)
    for row, key, offset in zip(out, keys, offsets, strict=True):
        first, skip = divmod(offset, 64)
        assert row.numpy().tobytes() == openssl_blocks(key, first, 14)[skip : skip + 777]


def _run(entropy_seed: int):
    rng = np.random.default_rng(0)
    nodes = [(rng.normal(size=(12, 5)).astype(np.float32), rng.integers(0, 3, size=12))
             for _ in range(4)]  # fmt: skip
    torch.manual_seed(0)
    result = dpdl.train(torch.nn.Linear(5, 3), nodes, algorithm="const-d2p", epsilon=2.0,
                        calibrate="clt", certified_accountant="rdp", batch_size=4, lr=0.2,
                        steps=4, eval_every=50, entropy="seed", seed=entropy_seed)  # fmt: skip
    return [p.detach().clone() for m in result.node_models for p in m.parameters()]


def test_a_runs_noise_is_the_same_whichever_path_drew_it(monkeypatch):
    """A seeded private run with its words from OpenSSL, then from the torch ChaCha20 (as a GPU
    draws them): every node's trained parameters agree bit for bit.  A different seed differs,
    so the comparison can fail."""
    openssl = _run(3)
    monkeypatch.setitem(DEVICE_KEYSTREAM, "cpu", "torch")
    torch_path = _run(3)
    assert all(torch.equal(a, b) for a, b in zip(openssl, torch_path, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(openssl, _run(4), strict=True))


def test_a_draw_on_the_torch_path_equals_the_openssl_draw(monkeypatch):
    """noise.draw over three streams: the same words, the same noise in grid units."""
    def draw():
        return noise.draw([SecretStream(bytes([i]) * 32) for i in range(3)], 1000, 0.7)

    openssl = draw()
    monkeypatch.setitem(DEVICE_KEYSTREAM, "cpu", "torch")
    torch_path = draw()
    assert torch.equal(openssl.words, torch_path.words)
    assert torch.equal(openssl.whole, torch_path.whole)
    assert torch.equal(openssl.frac, torch_path.frac)
