"""What crosses a consortium link: named tensors as raw bytes, with dtype, shape, the step,
the gossip round and the sending party; never a pickle, so a peer's bytes are only ever
read as numbers.

A message is ``len(header) (8 bytes, big-endian) | header (UTF-8 JSON) | payload``; the
header lists each tensor's name, dtype, shape and byte range of the payload.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np
import torch

from dpdl.errors import DPDLError, require

__all__ = ["Message", "decode", "encode"]

# The dtypes a message may carry, by name (what a peer sends is looked up, never evaluated).
DTYPES: dict[str, torch.dtype] = {"float64": torch.float64, "float32": torch.float32,
                                  "float16": torch.float16, "bfloat16": torch.bfloat16,
                                  "int64": torch.int64, "int32": torch.int32,
                                  "uint8": torch.uint8, "bool": torch.bool}  # fmt: skip
_NAMES = {v: k for k, v in DTYPES.items()}
_LENGTH = struct.Struct(">Q")


@dataclass(frozen=True)
class Message:
    party: str  # the sender
    tag: str  # what it answers (a mixing round of a step, a hop of a collective)
    step: int = -1
    round: int = -1
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    info: dict = field(default_factory=dict)  # JSON-able values (a collective's)


def encode(message: Message) -> bytes:
    entries, chunks, offset = [], [], 0
    for name, tensor in message.tensors.items():
        require(tensor.dtype in _NAMES, f"tensor {name!r}: dtype {tensor.dtype} cannot be sent")
        t = tensor.detach().to("cpu").contiguous()
        raw = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        entries.append({"name": name, "dtype": _NAMES[t.dtype], "shape": list(t.shape),
                        "offset": offset, "nbytes": len(raw)})  # fmt: skip
        chunks.append(raw)
        offset += len(raw)
    header = json.dumps({"party": message.party, "tag": message.tag, "step": message.step,
                         "round": message.round, "tensors": entries,
                         "info": message.info}).encode()  # fmt: skip
    return _LENGTH.pack(len(header)) + header + b"".join(chunks)


def decode(data: bytes) -> Message:
    """The message in ``data``; a malformed one is a one-line DPDLError."""
    try:
        (length,) = _LENGTH.unpack_from(data, 0)
        header = json.loads(data[_LENGTH.size:_LENGTH.size + length].decode())
        payload = memoryview(data)[_LENGTH.size + length:]
        tensors = {}
        for entry in header["tensors"]:
            dtype = DTYPES[entry["dtype"]]
            raw = payload[entry["offset"]:entry["offset"] + entry["nbytes"]]
            require(len(raw) == entry["nbytes"], f"tensor {entry['name']!r} is truncated")
            flat = torch.tensor(np.frombuffer(raw, dtype=np.uint8))
            tensors[entry["name"]] = flat.view(dtype).reshape(entry["shape"]).clone()
        return Message(str(header["party"]), str(header["tag"]), int(header["step"]),
                       int(header["round"]), tensors, dict(header["info"]))  # fmt: skip
    except DPDLError:
        raise
    except (ValueError, KeyError, TypeError, RuntimeError, struct.error) as err:
        raise DPDLError(f"a malformed consortium message ({type(err).__name__}: "
                        f"{str(err)[:100]})") from None
