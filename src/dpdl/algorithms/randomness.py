"""Public and secret randomness.

*Public* randomness (data split, model initialisation, evaluation subsamples) comes from the
config's ``seed``: anyone may rebuild it.  *Secret* randomness (every node's Poisson sampling
and noise, token walks, DECOR's pairwise secrets, Laplace noise) protects the data: an
observer who can rebuild it replays the batches and subtracts the noise, and the reported
epsilon protects nothing.  Every secret draw therefore comes from a :class:`SecretStream`, the
ChaCha20 keystream (RFC 8439, OpenSSL through ``cryptography``) under a 256-bit key:

* ``entropy="os"`` (the default): each stream's key is 32 bytes of ``os.urandom``, drawn in
  the process that owns the stream (a rank draws its own nodes' keys: no key crosses the
  network).  Keys live in memory and in checkpoint files only (owner-only).
* ``entropy="seed"``: keys are derived with SHA-256 from the seed and the run's settings
  (:func:`stream_root`), then per node from its index and its data's fingerprint
  (:func:`derive_key`): reproducible noise, an explicit research mode that every result
  records as ``"noise_entropy": "seed"``.  Runs that differ in any training setting or in the
  data never share a stream (two released models with shared noise would cancel it).

What a stream gives:

* :meth:`SecretStream.bernoulli` -- Poisson inclusion: a 64-bit word ``w`` includes the record
  iff ``w < floor(p 2^64)``, so the inclusion probability is ``floor(p 2^64) / 2^64 <= p``
  exactly (a float comparison can exceed p).
* :meth:`SecretStream.words` -- uniform 64-bit words: the noise of every private release is
  built from them by :mod:`dpdl.algorithms.noise` (exact in law: no floating-point sampler
  touches a released value).
* :func:`fill_words` -- the next words of many streams at once into a torch tensor, made on
  the tensor's device: OpenSSL on a CPU, the torch ChaCha20 of :mod:`dpdl.algorithms.chacha`
  on a GPU (the same bytes: a run's noise does not depend on which one drew it).
* :func:`secret_rng` -- a ``numpy.random.Generator`` on the same cipher (randomgen's
  ``ChaCha``, 20 rounds; its keystream is OpenSSL's, bit for bit) for the numpy algorithms'
  walks and secrets; their noise too goes through :mod:`dpdl.algorithms.noise`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from dpdl.errors import DPDLError, require

if TYPE_CHECKING:
    import torch

ENTROPY_MODES = ("os", "seed")
DEFAULT_ENTROPY = "os"
KEY_BYTES = 32
STATE_BYTES = 64  # key (32) + keystream position in bytes (32, little-endian)
_BLOCK = 64  # a ChaCha20 block: the counter advances one per 64 bytes of keystream
_SEGMENT_BLOCKS = 1 << 32  # blocks one OpenSSL encryptor may produce (its 32-bit counter)
_TWO_POW_64 = 1 << 64

__all__ = [
    "Randomness",
    "check_noise_std",
    "DEFAULT_ENTROPY",
    "ENTROPY_MODES",
    "SecretStream",
    "array_digest",
    "check_entropy",
    "derive_key",
    "DEVICE_KEYSTREAM",
    "fill_words",
    "KEYSTREAMS",
    "inclusion_threshold",
    "numpy_secret_rng",
    "secret_rng",
    "settings_digest",
    "stream_root",
]


def check_entropy(entropy: str) -> str:
    if entropy not in ENTROPY_MODES:
        raise DPDLError(f"unknown entropy {entropy!r}; use 'os' (secret, default) or 'seed'")
    return entropy


# --------------------------------------------------------------------------- keys
def derive_key(*parts: bytes | str | int) -> bytes:
    """SHA-256 of the length-prefixed ``parts``: a 256-bit key (seeded research mode only)."""
    digest = hashlib.sha256(b"dpdl secret stream v2")
    for part in parts:
        if isinstance(part, int):
            part = part.to_bytes(-(-max(part.bit_length(), 1) // 8) + 1, "little", signed=True)
        elif isinstance(part, str):
            part = part.encode()
        digest.update(len(part).to_bytes(8, "little") + part)
    return digest.digest()


def settings_digest(settings: Any) -> str:
    """A stable hex digest of JSON-able settings (sorted keys): what a seeded key depends on."""
    text = json.dumps(settings, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def array_digest(*arrays: Any) -> str:
    """SHA-256 of numpy arrays (dtype, shape and bytes): a seeded key of numpy data."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def stream_root(entropy: str, seed: int, settings: Any) -> bytes | None:
    """The root of one run's secret streams: None with ``entropy="os"`` (every stream draws
    its own key from the OS), else a key derived from ``seed`` and the run's ``settings``."""
    check_entropy(entropy)
    if entropy == "os":
        return None
    return derive_key("root", int(seed), settings_digest(settings))


# --------------------------------------------------------------------------- the stream
_ZEROS = np.zeros(0, dtype=np.uint8)


def _zeros(nbytes: int) -> memoryview:
    """A read-only view of ``nbytes`` zero bytes (the plaintext whose encryption is the
    keystream), grown on demand and shared."""
    global _ZEROS
    if _ZEROS.size < nbytes:
        _ZEROS = np.zeros(max(nbytes, 2 * _ZEROS.size), dtype=np.uint8)
    return memoryview(_ZEROS)[:nbytes]


class SecretStream:
    """One secret stream: the ChaCha20 keystream under a 256-bit key, read in order.

    ``key`` None draws 32 bytes from ``os.urandom``.  ``get_state()``/``set_state()`` mirror
    ``torch.Generator`` (a uint8 tensor: the key and the position in the keystream), so the
    engine checkpoints and restores a stream like a generator.  The state is the secret:
    never log or pickle it.
    """

    __slots__ = ("_key", "_position", "_cipher", "_segment_end")

    def __init__(self, key: bytes | None = None):
        self._key = os.urandom(KEY_BYTES) if key is None else bytes(key)
        require(len(self._key) == KEY_BYTES, f"a secret stream needs a {KEY_BYTES}-byte key")
        self._position = 0  # bytes of keystream handed out so far
        self._cipher = None
        self._segment_end = 0  # where the current encryptor's 32-bit block counter wraps

    def __repr__(self) -> str:  # the key is secret
        return f"SecretStream(position={self._position})"

    def __reduce__(self):
        raise TypeError("a SecretStream holds a secret key and is never pickled; "
                        "checkpoint it with get_state()")  # fmt: skip

    def _encryptor(self):
        """The encryptor at the current position.  Block b of the stream is the ChaCha20 block
        under the 128-bit little-endian counter b (words 12-15 of the state, as randomgen
        counts).  OpenSSL advances only the low 32 bits within one encryptor and refuses to
        wrap, so each encryptor serves one segment of 2^32 blocks; the next starts afresh."""
        if self._cipher is None or self._position == self._segment_end:
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

            block, skip = divmod(self._position, _BLOCK)
            nonce = block.to_bytes(16, "little")
            self._cipher = Cipher(algorithms.ChaCha20(self._key, nonce), mode=None).encryptor()
            self._segment_end = (block // _SEGMENT_BLOCKS + 1) * _SEGMENT_BLOCKS * _BLOCK
            if skip:
                self._cipher.update(bytes(skip))
        return self._cipher

    def read_into(self, out: np.ndarray) -> np.ndarray:
        """Fill the contiguous uint8 array ``out`` with the next keystream bytes."""
        require(out.dtype == np.uint8 and out.flags.c_contiguous, "read_into needs uint8 bytes")
        view, done = out.data.cast("B"), 0
        while done < out.size:
            cipher = self._encryptor()
            take = min(out.size - done, self._segment_end - self._position)
            cipher.update_into(_zeros(take), view[done : done + take])
            self._position += take
            done += take
        return out

    def read(self, nbytes: int) -> np.ndarray:
        """The next ``nbytes`` keystream bytes (uint8); no byte is ever handed out twice."""
        return self.read_into(np.empty(int(nbytes), dtype=np.uint8))

    def reserve(self, nbytes: int) -> tuple[bytes, int]:
        """Hand the next ``nbytes`` to a caller that computes them itself (the torch ChaCha20):
        returns the key and their position, and moves the stream past them."""
        start = self._position
        self._position += int(nbytes)
        self._cipher = None  # the OpenSSL encryptor restarts at the new position
        return self._key, start

    def words(self, count: int) -> np.ndarray:
        """``count`` uniform 64-bit words (uint64)."""
        return self.read(8 * int(count)).view(np.uint64)

    def bernoulli(self, count: int, p: float) -> np.ndarray:
        """``count`` independent inclusions, each with probability floor(p 2^64)/2^64 <= p."""
        threshold = inclusion_threshold(p)
        words = self.words(count)  # drawn even at p in {0, 1}: the stream's use is fixed
        if threshold == _TWO_POW_64:
            return np.ones(int(count), dtype=bool)
        return words < np.uint64(threshold)

    def doubles(self, count: int) -> np.ndarray:
        """``count`` uniforms on (0, 1], 53 random bits each: (k + 1) 2^-53."""
        return ((self.words(count) >> np.uint64(11)) + 1.0) * 2.0**-53

    def get_state(self) -> torch.Tensor:
        import torch

        packed = self._key + self._position.to_bytes(STATE_BYTES - KEY_BYTES, "little")
        return torch.frombuffer(bytearray(packed), dtype=torch.uint8).clone()

    def set_state(self, state: torch.Tensor) -> None:
        import torch

        raw = bytes(state.to(torch.uint8).cpu().numpy().tobytes())
        require(len(raw) == STATE_BYTES,
                f"a secret stream's state has {STATE_BYTES} bytes, got {len(raw)}")  # fmt: skip
        self._key = raw[:KEY_BYTES]
        self._position = int.from_bytes(raw[KEY_BYTES:], "little")
        self._cipher = None


def _fill_openssl(streams: Sequence[SecretStream], out: torch.Tensor) -> torch.Tensor:
    import torch

    host = out if out.device.type == "cpu" else torch.empty(out.shape, dtype=out.dtype)
    for row, stream in zip(host, streams, strict=True):
        stream.read_into(row.numpy().view(np.uint8))
    return out if host is out else out.copy_(host)


def _fill_torch(streams: Sequence[SecretStream], out: torch.Tensor) -> torch.Tensor:
    import torch

    from dpdl.algorithms import chacha

    nbytes = out[0].numel() * out.element_size()
    keys, positions = zip(*(s.reserve(nbytes) for s in streams), strict=True)
    chacha.keystream(keys, positions, out.view(torch.uint8).reshape(len(out), nbytes))
    return out


#: The keystream implementations (same bytes, checked in tests/algorithms/test_chacha.py).
KEYSTREAMS: dict[str, Callable[[Sequence[SecretStream], torch.Tensor], torch.Tensor]] = {
    "openssl": _fill_openssl,
    "torch": _fill_torch,
}
#: Which one fills a tensor on each device type; any other (cuda, ...) takes "torch": the words
#: are made where the noise is used (a GPU would otherwise wait on a CPU cipher and a copy).
#: OpenSSL is the faster on a CPU (``benchmarks/bench_keystream.py``).
DEVICE_KEYSTREAM: dict[str, str] = {"cpu": "openssl"}


def fill_words(streams: Sequence[SecretStream], out: torch.Tensor) -> torch.Tensor:
    """Row i of the contiguous int64 tensor ``out`` (m, d) gets the next d 64-bit words of
    ``streams[i]`` (their bit patterns), computed on ``out``'s device."""
    require(out.dim() == 2 and len(out) == len(streams) and out.is_contiguous(),
            f"fill_words needs a contiguous (streams, words) tensor, got {tuple(out.shape)} "
            f"for {len(streams)} streams")  # fmt: skip
    if not out.numel():
        return out
    return KEYSTREAMS[DEVICE_KEYSTREAM.get(out.device.type, "torch")](streams, out)


def inclusion_threshold(p: float) -> int:
    """floor(p 2^64), exact (p * 2^64 is exact in binary floating point)."""
    require(0.0 <= p <= 1.0, f"an inclusion probability must lie in [0, 1], got {p}")
    return math.floor(float(p) * 2.0**64)


# --------------------------------------------------------------------------- numpy
def secret_rng(seed: Any = None) -> np.random.Generator:
    """A ``numpy.random.Generator`` on ChaCha20 (randomgen's ``ChaCha``, 20 rounds).

    ``seed``: None -- a 256-bit key from ``os.urandom`` (secret); a Generator -- used as
    given (the caller's stream); a ``SeedSequence`` -- 256 bits of its state, and an int as
    ``SeedSequence(seed)`` (reproducible noise, for tests and research only).
    """
    if isinstance(seed, np.random.Generator):
        return seed
    if seed is None:
        return _chacha_generator(os.urandom(KEY_BYTES))
    if isinstance(seed, int | np.integer) and not isinstance(seed, bool):
        seed = np.random.SeedSequence(int(seed))
    if isinstance(seed, np.random.SeedSequence):
        return _chacha_generator(seed.generate_state(KEY_BYTES // 4, dtype=np.uint32).tobytes())
    raise DPDLError(f"secret randomness takes None, an int, a SeedSequence or a numpy "
                    f"Generator, got {type(seed).__name__}")  # fmt: skip


def _chacha_generator(key: bytes) -> np.random.Generator:
    from randomgen import ChaCha

    return np.random.Generator(ChaCha(key=int.from_bytes(key, "little"), counter=0, rounds=20))


def numpy_secret_rng(seed: int | None, entropy: str, cell: str = "") -> np.random.Generator:
    """The secret generator of one cell of a numpy experiment kind (tokens, linreg, DECOR):
    an OS key by default; with ``entropy="seed"`` a key derived from the seed and ``cell``
    (which names the cell and digests the run's settings: see :func:`settings_digest`)."""
    check_entropy(entropy)
    if entropy == "os":
        return secret_rng(None)
    return _chacha_generator(derive_key("numpy cell", 0 if seed is None else int(seed), cell))


#: What a ``seed`` argument accepts (see the module doc): None is OS entropy.
Randomness: TypeAlias = int | np.random.SeedSequence | np.random.Generator | None


def check_noise_std(sigma, unsafe_zero_noise: bool = False, name: str = "sigma") -> float:
    """A private mechanism's Gaussian noise std: finite and > 0.

    Zero only with the explicit ``unsafe_zero_noise=True`` (a non-private baseline, or a test
    of the clipping): such a run is not private and must not be reported as such.
    """
    number = isinstance(sigma, int | float | np.integer | np.floating) and not isinstance(
        sigma, bool
    )
    ok = number and math.isfinite(sigma) and (sigma > 0 or (sigma == 0 and unsafe_zero_noise))
    if not ok:
        allowed = "> 0 (0 only with unsafe_zero_noise=True)"
        raise DPDLError(f"{name} (the noise std) must be a finite number {allowed}, got {sigma!r}")
    return float(sigma)
