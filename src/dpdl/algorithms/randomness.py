"""Public and secret randomness.

*Public* randomness (data split, model initialisation, evaluation subsamples) comes from the
config's ``seed``: anyone may rebuild it.  *Secret* randomness (every node's Poisson sampling
and noise, and any pairwise secret) protects the data: if an observer can rebuild it, they can
replay the batches and subtract the noise, and the reported epsilon protects nothing.  Secret
streams therefore come from the operating system's entropy (``entropy="os"``, the default) and
live only in memory and in checkpoint files (owner-only, secret material like the model).
``entropy="seed"`` derives them from the seed instead: reproducible noise, an explicit research
choice that every result records as ``"noise_entropy": "seed"``.

Either way every (algorithm, epsilon) cell has its own streams (:func:`cell_noise_root`): two
released models trained on one seed must not share noise, or their difference cancels it.

:class:`SecureGenerator` is the hardened sampler (``privacy.secure_noise``): a CSPRNG
(AES-256 in counter mode, key from ``os.urandom``) and Gaussian draws that are each the sum of
four Box-Muller draws of variance sigma^2/4, the construction of Opacus's secure mode (Holohan &
Braghin 2021, against the floating-point attack of Mironov 2012 that reads the noise off the
gaps of a textbook sampler's output).  It guarantees that the noise cannot be predicted from
anything but the key, and it smooths (it does not prove away) the floating-point support of
the output; it is several times slower than torch's Mersenne-Twister normals.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets

import numpy as np
import torch

from dpdl.errors import DPDLError, require

ENTROPY_MODES = ("os", "seed")
DEFAULT_ENTROPY = "os"

__all__ = [
    "DEFAULT_ENTROPY",
    "ENTROPY_MODES",
    "SecureGenerator",
    "cell_noise_root",
    "check_entropy",
    "numpy_secret_rng",
    "standard_normals_",
    "uniforms",
]


def check_entropy(entropy: str) -> str:
    if entropy not in ENTROPY_MODES:
        raise DPDLError(f"unknown entropy {entropy!r}; use 'os' (secret, default) or 'seed'")
    return entropy


def _cell_tag(cell: str) -> int:
    """A stable 64-bit tag of a cell's name (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.sha256(cell.encode()).digest()[:8], "little")


def cell_noise_root(entropy: str, seed: int, cell: str) -> np.random.SeedSequence:
    """The root of one cell's secret streams (every node's generator is spawned from it).

    ``entropy="os"``: 128 bits of fresh OS entropy (never derivable from the seed);
    ``"seed"``: the config's seed (reproducible).  ``cell`` names the cell (algorithm label
    and target epsilon): its tag is the spawn key, so cells of one seed never share a stream.
    """
    check_entropy(entropy)
    root = secrets.randbits(128) if entropy == "os" else int(seed)
    return np.random.SeedSequence(root, spawn_key=(_cell_tag(cell),))


def numpy_secret_rng(seed: int | None, entropy: str, cell: str = "") -> np.random.Generator:
    """A numpy generator for the secret randomness of the numpy algorithms (tokens, linreg,
    DECOR): OS entropy by default, the seed only with ``entropy="seed"``."""
    return np.random.default_rng(cell_noise_root(entropy, 0 if seed is None else seed, cell))


# --------------------------------------------------------------------------- hardened sampler
_TWO_PI = 2.0 * math.pi
_BLOCK = 16  # AES block: the counter advances one per 16 bytes of keystream


class SecureGenerator:
    """A per-node CSPRNG (AES-256-CTR keystream) with checkpointable state (key, counter).

    ``get_state()``/``set_state()`` mirror ``torch.Generator`` (a uint8 tensor), so the engine
    checkpoints and restores it like any generator.  The state is the secret: never log it.
    """

    def __init__(self, key: bytes | None = None, counter: int = 0):
        self._key = os.urandom(32) if key is None else bytes(key)
        require(len(self._key) == 32, "SecureGenerator needs a 32-byte key")
        self._counter = int(counter)

    def __repr__(self) -> str:  # the key is secret
        return f"SecureGenerator(counter={self._counter})"

    def keystream(self, nbytes: int) -> bytes:
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        blocks = -(-nbytes // _BLOCK)
        start = (self._counter % (1 << 128)).to_bytes(16, "big")
        encryptor = Cipher(algorithms.AES(self._key), modes.CTR(start)).encryptor()
        out = encryptor.update(bytes(blocks * _BLOCK))
        self._counter += blocks  # never reuse a counter block under this key
        return out[:nbytes]

    def _unit_doubles(self, count: int) -> np.ndarray:
        """``count`` uniforms on (0, 1]: 53 random bits each, (k + 1) * 2^-53."""
        words = np.frombuffer(self.keystream(8 * count), dtype=np.uint64)
        return ((words >> np.uint64(11)) + 1.0) * 2.0**-53

    def uniform(self, count: int) -> np.ndarray:
        return self._unit_doubles(count)

    def normal(self, count: int) -> np.ndarray:
        """Standard normals: each the sum of four Box-Muller normals, divided by 2."""
        half = -(-4 * count // 2)  # Box-Muller pairs needed for 4 * count normals
        u = self._unit_doubles(2 * half).reshape(2, half)
        radius = np.sqrt(-2.0 * np.log(u[0]))
        angle = _TWO_PI * u[1]
        draws = np.concatenate((radius * np.cos(angle), radius * np.sin(angle)))
        return draws[: 4 * count].reshape(4, count).sum(axis=0) * 0.5

    def get_state(self) -> torch.Tensor:
        packed = self._key + self._counter.to_bytes(32, "little")
        return torch.frombuffer(bytearray(packed), dtype=torch.uint8).clone()

    def set_state(self, state: torch.Tensor) -> None:
        raw = bytes(state.to(torch.uint8).cpu().numpy().tobytes())
        require(len(raw) == 64, f"a SecureGenerator state has 64 bytes, got {len(raw)}")
        self._key, self._counter = raw[:32], int.from_bytes(raw[32:], "little")


def uniforms(generator, count: int, device: torch.device | str) -> torch.Tensor:
    """``count`` uniforms from a node's generator (torch's or a :class:`SecureGenerator`)."""
    if isinstance(generator, SecureGenerator):
        return torch.as_tensor(generator.uniform(count), device=device)
    return torch.rand(count, generator=generator, device=device)


def standard_normals_(generator, row: torch.Tensor) -> torch.Tensor:
    """Fill ``row`` with standard normals from a node's generator, in place."""
    if isinstance(generator, SecureGenerator):
        row.copy_(torch.as_tensor(generator.normal(row.numel())).view(row.shape))
        return row
    return torch.randn(row.shape, generator=generator, out=row)


def secure_generators(count: int) -> list[SecureGenerator]:
    return [SecureGenerator() for _ in range(count)]

