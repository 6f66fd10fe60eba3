"""Reader for the IDX binary format used by (Fashion-)MNIST, plain or gzip-compressed.

Layout: two zero bytes, a type code, the number of dimensions d, then d big-endian uint32
sizes, then the values in C order (big-endian for multi-byte types).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from dpdl.errors import DPDLError

# IDX type code -> big-endian numpy dtype
IDX_DTYPES = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
GZIP_MAGIC = b"\x1f\x8b"


def _read_bytes(path: Path) -> bytes:
    with open(path, "rb") as handle:
        head = handle.read(2)
    try:
        if head == GZIP_MAGIC:
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError) as exc:  # truncated / corrupt gzip stream
        raise DPDLError(f"cannot read IDX file {path}: {exc} (corrupt or truncated?)") from exc


def parse_idx(
    raw: bytes, *, source: str = "<bytes>", expected_ndim: int | None = None
) -> np.ndarray:
    """Decode IDX bytes into a native-endian array, validating magic number and size."""
    if len(raw) < 4:
        raise DPDLError(f"IDX file {source} is too short ({len(raw)} bytes) to hold a header")
    zero0, zero1, type_code, ndim = raw[0], raw[1], raw[2], raw[3]
    if zero0 != 0 or zero1 != 0 or type_code not in IDX_DTYPES:
        raise DPDLError(
            f"IDX file {source} has a bad magic number 0x{raw[:4].hex()} "
            "(expected 0x0000 then a type code such as 0x08 for uint8)"
        )
    if expected_ndim is not None and ndim != expected_ndim:
        raise DPDLError(
            f"IDX file {source} has {ndim} dimensions (magic 0x{raw[:4].hex()}), "
            f"expected {expected_ndim}"
        )
    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise DPDLError(f"IDX file {source} is truncated inside its header")
    shape = tuple(int(s) for s in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = IDX_DTYPES[type_code]
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual_bytes = len(raw) - header_len
    if actual_bytes != expected_bytes:
        raise DPDLError(
            f"IDX file {source} declares shape {shape} ({expected_bytes} data bytes) but holds "
            f"{actual_bytes} data bytes (corrupt or truncated?)"
        )
    values = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    return values.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | Path, *, expected_ndim: int | None = None) -> np.ndarray:
    """Read an IDX file (gzip detected by content, not by name)."""
    path = Path(path)
    return parse_idx(_read_bytes(path), source=str(path), expected_ndim=expected_ndim)


def write_idx(path: str | Path, array: np.ndarray, *, compress: bool | None = None) -> None:
    """Write an array as IDX (gzip if ``compress`` or the name ends in .gz); for tests/tools."""
    path = Path(path)
    array = np.asarray(array)
    codes = {dt.newbyteorder("="): code for code, dt in IDX_DTYPES.items()}
    native = array.dtype.newbyteorder("=")
    if native not in codes:
        raise DPDLError(f"IDX cannot store dtype {array.dtype}")
    big = IDX_DTYPES[codes[native]]
    payload = (
        bytes([0, 0, codes[native], array.ndim])
        + np.asarray(array.shape, dtype=">u4").tobytes()
        + array.astype(big).tobytes()
    )
    if compress is None:
        compress = path.suffix == ".gz"
    if compress:
        with gzip.open(path, "wb") as handle:
            handle.write(payload)
    else:
        path.write_bytes(payload)
