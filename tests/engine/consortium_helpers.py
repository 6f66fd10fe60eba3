"""Shared by the consortium tests: a consortium file on loopback with free ports."""

from __future__ import annotations

import socket
from pathlib import Path


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def write_consortium(folder: Path, parties: int = 4, nodes_each: int = 2,
                     timeout_s: float = 60) -> Path:  # fmt: skip
    lines = ["[consortium]", 'name = "test"', 'ca_certificate = "pki/ca.pem"',
             'collector = "p0"', f"timeout_s = {timeout_s}", ""]  # fmt: skip
    for i, port in enumerate(free_ports(parties)):
        nodes = list(range(i * nodes_each, (i + 1) * nodes_each))
        lines += ["[[party]]", f'name = "p{i}"', f"nodes = {nodes}",
                  f'address = "127.0.0.1:{port}"', f'certificate = "pki/p{i}.pem"', ""]
    path = folder / "consortium.toml"
    path.write_text("\n".join(lines))
    return path
