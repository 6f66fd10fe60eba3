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

Samplers on a stream, all vectorised (bytes in bulk, transforms as torch ops on the device of
the output):

* :meth:`SecretStream.bernoulli` -- Poisson inclusion: a 64-bit word ``w`` includes the record
  iff ``w < floor(p 2^64)``, so the inclusion probability is ``floor(p 2^64) / 2^64 <= p``
  exactly (a float comparison can exceed p).
* :func:`fill_normals` -- the default Gaussian: Box-Muller with a 63-bit radius uniform and a
  32-bit angle.  Its support reaches 9.42 sigma (a 24-bit uniform, as torch's CPU sampler
  uses, stops at 5.8 sigma, which a canary aligned with one coordinate can detect): the mass
  beyond is < 5e-21 per draw.  It is a floating-point sampler, not an exact real Gaussian.
* the hardened Gaussian (``privacy.secure_noise``, ``SecretStream(hardened=True)``): each
  normal the sum of four Box-Muller draws of variance sigma^2/4 from 53-bit uniforms in
  float64, the construction of Opacus's secure mode (Holohan & Braghin 2021, against
  Mironov's 2012 attack that reads the noise off the gaps of a textbook sampler's output).
  It smooths the floating-point support; it does not make the output an exact Gaussian.
* :func:`secret_rng` -- a ``numpy.random.Generator`` on the same cipher (randomgen's
  ``ChaCha``, 20 rounds; its keystream is OpenSSL's, bit for bit) for the numpy algorithms.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Iterator, Sequence
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
    "fill_normals",
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

    ``key`` None draws 32 bytes from ``os.urandom``.  ``hardened`` selects the hardened
    Gaussian sampler (see the module doc).  ``get_state()``/``set_state()`` mirror
    ``torch.Generator`` (a uint8 tensor: the key and the position in the keystream), so the
    engine checkpoints and restores a stream like a generator.  The state is the secret:
    never log or pickle it.
    """

    __slots__ = ("_key", "_position", "_cipher", "_segment_end", "hardened")

    def __init__(self, key: bytes | None = None, *, hardened: bool = False):
        self._key = os.urandom(KEY_BYTES) if key is None else bytes(key)
        require(len(self._key) == KEY_BYTES, f"a secret stream needs a {KEY_BYTES}-byte key")
        self._position = 0  # bytes of keystream handed out so far
        self._cipher = None
        self._segment_end = 0  # where the current encryptor's 32-bit block counter wraps
        self.hardened = bool(hardened)

    def __repr__(self) -> str:  # the key is secret
        return f"SecretStream(position={self._position}, hardened={self.hardened})"

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

    def hardened_normals(self, count: int) -> np.ndarray:
        """Standard normals (float64), each the sum of four Box-Muller draws, halved (the
        sampler of :func:`fill_normals` for a hardened stream)."""
        import torch

        words = torch.from_numpy(self.read(_HARDENED_BYTES * int(count))).view(torch.int64)
        return _hardened_normals(words.view(1, -1), int(count))[0].numpy()

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


def inclusion_threshold(p: float) -> int:
    """floor(p 2^64), exact (p * 2^64 is exact in binary floating point)."""
    require(0.0 <= p <= 1.0, f"an inclusion probability must lie in [0, 1], got {p}")
    return math.floor(float(p) * 2.0**64)


# --------------------------------------------------------------------------- normals
def fill_normals(streams: Sequence[SecretStream], out: torch.Tensor) -> torch.Tensor:
    """Fill ``out`` (m, d), row i from ``streams[i]``, with standard normals, in place.

    Each row costs its stream 12 bytes per pair of normals (the fast sampler) or 32 bytes per
    normal (hardened); the bytes of all rows are read first, then transformed at once.
    """
    import torch

    m, d = out.shape
    require(len(streams) == m, f"need one stream per row: {len(streams)} for {m}")
    hardened = {s.hardened for s in streams}
    require(len(hardened) <= 1, "all streams of one draw must use the same sampler")
    if m == 0 or d == 0:
        return out
    if hardened == {True}:
        words = np.empty((m, _HARDENED_BYTES * d), dtype=np.uint8)
        for i, stream in enumerate(streams):
            stream.read_into(words[i])
        words = torch.from_numpy(words).view(torch.int64).to(out.device)
        return out.copy_(_hardened_normals(words, d))
    pairs = -(-d // 2)
    # rows in groups: the keystream bytes (1.5x the normals' size) never exist for all rows
    # at once; each row's bytes and transform are the same whatever the grouping
    rows = _rows_per_group(d, hardened=False)
    radius = np.empty((min(rows, m), 8 * pairs), dtype=np.uint8)
    angle = np.empty((min(rows, m), 4 * pairs), dtype=np.uint8)
    for lo in range(0, m, rows):
        group = streams[lo : lo + rows]
        for i, stream in enumerate(group):
            stream.read_into(radius[i])
            stream.read_into(angle[i])
        _box_muller_(
            out[lo : lo + len(group)],
            torch.from_numpy(radius[: len(group)]).view(torch.int64).to(out.device),
            torch.from_numpy(angle[: len(group)]).view(torch.int32).to(out.device),
        )
    return out


def _normal_row_groups(streams: Sequence[SecretStream], d: int, *, dtype=None,
                       device=None) -> Iterator[tuple[int, int, torch.Tensor]]:  # fmt: skip
    """``(lo, hi, normals)`` for consecutive groups of streams: row r of ``normals`` (hi - lo,
    d) holds stream lo + r's next d standard normals, exactly what :func:`fill_normals` writes
    into row lo + r.  One small block, **reused**: the next group overwrites it, so no (m, d)
    tensor of normals ever exists.  Use each group before asking for the next (never collect
    them: every collected block would be the last group's noise)."""
    import torch

    m = len(streams)
    hardened = {s.hardened for s in streams}
    require(len(hardened) <= 1, "all streams of one draw must use the same sampler")
    if m == 0:
        return
    rows = _rows_per_group(d, hardened=hardened == {True})
    block = torch.empty((min(rows, m), d), dtype=dtype or torch.float32, device=device)
    for lo in range(0, m, rows):
        hi = min(lo + rows, m)
        yield lo, hi, fill_normals(streams[lo:hi], block[: hi - lo])


def _rows_per_group(d: int, *, hardened: bool) -> int:
    """Rows of normals whose keystream bytes fit in ``_BYTES_PER_GROUP`` (at least one):
    :func:`fill_normals` transforms the fast sampler's rows in these groups, so
    :func:`_normal_row_groups`, drawing the same groups, reproduces its bits."""
    per_row = _HARDENED_BYTES * d if hardened else 12 * -(-d // 2)
    return max(1, _BYTES_PER_GROUP // max(per_row, 1))


_HARDENED_BYTES = 32  # four 53-bit uniforms per hardened normal
# Keystream bytes read for a group of rows of the fast sampler: small, since a private step
# draws while its gradients are at their peak (2 MiB: 3 rows of the shallow CNN, the same
# reads and about as many transform calls as 8 MiB, 6 MB less at that peak).
_BYTES_PER_GROUP = 2 << 20
_TWO_LN_2_POW_63 = 126.0 * math.log(2.0)
# The transforms run over column blocks of about this many elements: temporaries small enough
# to stay in cache and to be reused, instead of fresh multi-megabyte tensors whose page faults
# cost more than the arithmetic.
_BLOCK_ELEMENTS = 1 << 18


def _column_blocks(rows: int, columns: int):
    width = max(1, _BLOCK_ELEMENTS // max(rows, 1))
    for lo in range(0, columns, width):
        yield lo, min(lo + width, columns)


def _hardened_normals(words: torch.Tensor, count: int) -> torch.Tensor:
    """(m, count) float64 normals from (m, 4 count) words: per row, 4 count uniforms on
    (0, 1] of 53 bits, (k + 1) 2^-53, give 2 count Box-Muller pairs (radii from the first
    half, angles from the second); the 4 count normals are summed in fours and halved."""
    import torch

    m = len(words)
    halves = words.view(m, 2, 2 * count)
    out = torch.empty((m, count), dtype=torch.float64, device=words.device)
    for lo, hi in _column_blocks(4 * m, count):
        # the pairs feeding outputs lo..hi: 4 normals each, pairs j and j + count in a half
        cols = torch.cat((torch.arange(lo, hi), torch.arange(count + lo, count + hi)))
        cols = cols.to(words.device)
        u = ((halves[:, :, cols] >> 11) & ((1 << 53) - 1)).add_(1).to(torch.float64)
        u.mul_(2.0**-53)
        radius = u[:, 0].log_().mul_(-2.0).sqrt_()
        angle = u[:, 1].mul_(2.0 * math.pi)
        cos, sin = torch.cos(angle).mul_(radius), angle.sin_().mul_(radius)
        width = hi - lo  # draws r cos | r sin, each (2 count); output q sums draws q + k count
        out[:, lo:hi] = (cos[:, :width] + cos[:, width:] + sin[:, :width] + sin[:, width:]) * 0.5
    return out


def _box_muller_(out: torch.Tensor, radius: torch.Tensor, angle: torch.Tensor) -> None:
    """out[:, :P] = r cos(theta), out[:, P:] = r sin(theta) from signed words:
    u = (|w| + 1/2) 2^-63 in (0, 1] (never 0: r <= 9.42), theta = w' pi 2^-31 in [-pi, pi)."""
    import torch

    (m, d), pairs = out.shape, radius.shape[1]
    dtype = out.dtype if out.dtype in (torch.float32, torch.float64) else torch.float32
    width = min(pairs, max(1, _BLOCK_ELEMENTS // max(m, 1)))
    r_buf = torch.empty((m, width), dtype=dtype, device=out.device)
    t_buf = torch.empty((m, width), dtype=dtype, device=out.device)
    for lo, hi in _column_blocks(m, pairs):
        r, theta = r_buf[:, : hi - lo], t_buf[:, : hi - lo]
        # r^2 = -2 ln u = 126 ln 2 - 2 ln(|w| + 1/2)
        r.copy_(radius[:, lo:hi]).abs_().add_(0.5).log_()
        r.mul_(-2.0).add_(_TWO_LN_2_POW_63).clamp_min_(0.0).sqrt_()  # u <= 1 up to rounding
        theta.copy_(angle[:, lo:hi]).mul_(math.pi * 2.0**-31)
        out[:, lo:hi] = torch.cos(theta).mul_(r)
        k = min(hi, d - pairs) - lo  # the sines fill columns pairs .. d - 1
        if k > 0:
            out[:, pairs + lo : pairs + lo + k] = torch.sin(theta[:, :k]).mul_(r[:, :k])


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
