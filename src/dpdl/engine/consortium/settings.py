"""The consortium file: who the parties are, which nodes each hosts, where each listens, and
the certificates that prove who is who.

```toml
[consortium]
name = "hospitals"
ca_certificate = "pki/ca.pem"   # paths are relative to this file
collector = "hospital-0"        # who may collect scores / write a shared report (optional)
timeout_s = 60                  # a neighbour silent this long is named as down

[[party]]
name = "hospital-0"             # the certificate's CN and DNS SAN
nodes = [0, 1]                  # a contiguous range of the topology's nodes
address = "10.0.0.1:50051"      # the one address it listens on
certificate = "pki/hospital-0.pem"
key = "pki/hospital-0.key"      # default: the certificate's path with suffix .key
```
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from dpdl.errors import DPDLError, require

__all__ = ["Consortium", "Party", "load_consortium"]

# A DNS label: the name is the certificate's DNS SAN and the TLS target name of its links.
_NAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class Party(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    nodes: list[int] = Field(min_length=1)
    address: str
    certificate: Path
    key: Path | None = None

    @field_validator("name")
    @classmethod
    def _dns_label(cls, name: str) -> str:
        if not _NAME.match(name):
            raise ValueError(f"party name {name!r} must be a DNS label (a-z, 0-9, '-')")
        return name

    @field_validator("nodes")
    @classmethod
    def _contiguous(cls, nodes: list[int]) -> list[int]:
        if min(nodes) < 0 or nodes != list(range(nodes[0], nodes[0] + len(nodes))):
            raise ValueError(f"nodes {nodes} must be a contiguous increasing range of "
                             "non-negative node ids")  # fmt: skip
        return nodes

    @field_validator("address")
    @classmethod
    def _host_port(cls, address: str) -> str:
        host, sep, port = address.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"address {address!r} must be host:port (port 1-65535)")
        return address

    @property
    def key_path(self) -> Path:
        return self.key if self.key is not None else self.certificate.with_suffix(".key")


class Consortium(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    ca_certificate: Path
    collector: str | None = None
    timeout_s: float = Field(60.0, gt=0)
    parties: list[Party] = Field(min_length=2)

    @model_validator(mode="after")
    def _consistent(self) -> Consortium:
        names = [p.name for p in self.parties]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"party names must be unique, {dup[0]!r} appears twice")
        addresses = [p.address for p in self.parties]
        dup = sorted({a for a in addresses if addresses.count(a) > 1})
        if dup:
            raise ValueError(f"two parties listen on {dup[0]!r}")
        nodes = sorted(i for p in self.parties for i in p.nodes)
        if nodes != list(range(len(nodes))):
            raise ValueError(f"the parties' nodes must be 0..n-1, each hosted once; got {nodes}")
        if self.collector is not None and self.collector not in names:
            raise ValueError(f"collector {self.collector!r} is not a party ({names})")
        return self

    @property
    def n_nodes(self) -> int:
        return sum(len(p.nodes) for p in self.parties)

    def party(self, name: str) -> Party:
        found = [p for p in self.parties if p.name == name]
        require(bool(found), f"party {name!r} is not in consortium {self.name!r} "
                             f"({', '.join(p.name for p in self.parties)})")  # fmt: skip
        return found[0]

    def host_of(self, node: int) -> Party:
        return next(p for p in self.parties if node in p.nodes)


def load_consortium(path: str | Path) -> Consortium:
    """The consortium file at ``path``, validated; relative paths resolved against its folder."""
    path = Path(path)
    require(path.is_file(), f"consortium file {str(path)!r} does not exist")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise DPDLError(f"consortium file {path}: not TOML: {err}") from None
    unknown = sorted(set(raw) - {"consortium", "party"})
    require(not unknown, f"consortium file {path}: unknown table(s) {unknown}")
    base = path.resolve().parent
    table = dict(raw.get("consortium", {}))
    table["parties"] = raw.get("party", [])
    try:
        consortium = Consortium.model_validate(table)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise DPDLError(f"consortium file {path}: {where}: {first['msg']}") from None
    return _resolved(consortium, base)


def _resolved(consortium: Consortium, base: Path) -> Consortium:
    def at(p: Path | None) -> Path | None:
        return None if p is None else (p if p.is_absolute() else base / p)

    parties = [p.model_copy(update={"certificate": at(p.certificate), "key": at(p.key)})
               for p in consortium.parties]  # fmt: skip
    return consortium.model_copy(update={"ca_certificate": at(consortium.ca_certificate),
                                         "parties": parties})  # fmt: skip
