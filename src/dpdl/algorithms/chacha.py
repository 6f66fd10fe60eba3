"""The ChaCha20 keystream (RFC 8439 block function) as vectorised torch integer operations.

One lane per 64-byte block: the sixteen 32-bit state words of every block are rows of an
int64 tensor holding values in [0, 2^32) (torch has no unsigned 32-bit arithmetic on every
device, and wrapping signed overflow is undefined in C++), so each addition is masked back to
32 bits and each rotation is two shifts of a non-negative value.  It runs wherever torch runs
(CPU, CUDA) and gives, bit for bit, the keystream that :class:`~dpdl.algorithms.randomness.
SecretStream` reads through OpenSSL: block b of a stream is the block under the 128-bit
little-endian counter b in state words 12-15 (``tests/algorithms/test_chacha.py`` checks it
against OpenSSL, across the 2^32 and 2^64 block boundaries).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["blocks", "key_words", "keystream"]

_MASK = 0xFFFFFFFF
_SIGMA = (0x61707865, 0x3320646E, 0x79622D32, 0x6B206574)  # "expand 32-byte k"
_BLOCK = 64
# A double round's quarter-rounds: the four columns, then the four diagonals of the 4x4 state.
_ROUNDS = ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15),
           (0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14))  # fmt: skip
# The lanes processed together: small enough that the ~1000 temporaries of the rounds stay in
# the CPU's cache, large enough that a GPU kernel launch is amortised.
_CPU_LANES = 1 << 15
_DEVICE_LANES = 1 << 21


def key_words(key: bytes) -> list[int]:
    """The key's eight little-endian 32-bit words (state words 4-11)."""
    return [int.from_bytes(key[4 * i : 4 * i + 4], "little") for i in range(8)]


def _counter_words(first: torch.Tensor, count: int) -> list[torch.Tensor]:
    """State words 12-15 of blocks first + 0 .. first + count - 1, the 128-bit counter carried
    across all four words.  ``first`` (rows, 4): each row's first block as 32-bit limbs."""
    step = torch.arange(count, dtype=torch.int64, device=first.device)
    words, carry = [], step.unsqueeze(0)
    for limb in range(4):
        total = first[:, limb : limb + 1] + carry
        words.append(total & _MASK)
        carry = total >> 32
    return [w.reshape(-1) for w in words]


def _quarter(x: list[torch.Tensor], a: int, b: int, c: int, d: int) -> None:
    """One quarter-round, in place on the lanes' words (fewer temporaries: faster on a CPU)."""
    for p, q, r, shift in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
        x[p].add_(x[q]).bitwise_and_(_MASK)
        mixed = x[r].bitwise_xor_(x[p])
        low = mixed >> (32 - shift)
        mixed.bitwise_left_shift_(shift).bitwise_and_(_MASK).bitwise_or_(low)


def _block_function(keys: torch.Tensor, counters: list[torch.Tensor]) -> torch.Tensor:
    """ChaCha20 blocks (lanes, 16) int64 in [0, 2^32) for per-lane ``keys`` (lanes, 8) and
    counter words; state words 0-3 are the constant."""
    lanes = counters[0].numel()
    constant = [torch.full((lanes,), c, dtype=torch.int64, device=keys.device) for c in _SIGMA]
    start = constant + [keys[:, i] for i in range(8)] + counters
    x = [w.clone() for w in start]
    for _ in range(10):  # twenty rounds: a column round and a diagonal round, ten times
        for a, b, c, d in _ROUNDS:
            _quarter(x, a, b, c, d)
    return torch.stack([(w + s) & _MASK for w, s in zip(x, start, strict=True)], dim=1)


def keystream(keys: Sequence[bytes], positions: Sequence[int], out: torch.Tensor) -> torch.Tensor:
    """Fill row i of the contiguous uint8 tensor ``out`` (m, nbytes) with the keystream of
    ``keys[i]`` from byte ``positions[i]`` on, on ``out``'s device, every row in one pass (a
    GPU runs the m streams of a step as one set of kernels).  Little-endian words, as RFC 8439
    serialises them."""
    m, nbytes = out.shape
    if not out.numel():
        return out
    firsts, skips = zip(*(divmod(int(p), _BLOCK) for p in positions), strict=True)
    count = -(-(max(skips) + nbytes) // _BLOCK)  # blocks per row, from each row's first
    device = out.device
    key_table = torch.tensor([key_words(k) for k in keys], dtype=torch.int64, device=device)
    per_row = max(1, (_CPU_LANES if device.type == "cpu" else _DEVICE_LANES) // m)
    by_skip: dict[int, list[int]] = {}
    for row, skip in enumerate(skips):
        by_skip.setdefault(skip, []).append(row)
    for lo in range(0, count, per_row):  # a chunk of blocks at a time: bounded temporaries
        n = min(per_row, count - lo)
        limbs = [[(f + lo) >> (32 * i) & _MASK for i in range(4)] for f in firsts]
        counters = _counter_words(torch.tensor(limbs, dtype=torch.int64, device=device), n)
        words = _block_function(key_table.repeat_interleave(n, dim=0), counters)
        # each int64 word's low four bytes (little-endian): the block's serialised bytes
        raw = words.view(torch.uint8).reshape(m, n * 16, 8)[:, :, :4].reshape(m, n * _BLOCK)
        for skip, rows in by_skip.items():  # this chunk's bytes land at [a, b) of the rows
            a, b = max(lo * _BLOCK - skip, 0), min((lo + n) * _BLOCK - skip, nbytes)
            if a < b:
                src = raw[:, a + skip - lo * _BLOCK : b + skip - lo * _BLOCK]
                if len(rows) == m:
                    out[:, a:b] = src
                else:
                    index = torch.tensor(rows, device=device)
                    out[index, a:b] = src[index]
    return out


def blocks(key: bytes, first: int, count: int, device=None) -> torch.Tensor:
    """``count`` keystream blocks of ``key`` from block ``first``: (count, 64) uint8."""
    out = torch.empty((1, count * _BLOCK), dtype=torch.uint8, device=device)
    return keystream([key], [first * _BLOCK], out).reshape(count, _BLOCK)
