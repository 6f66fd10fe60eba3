"""Benchmark: secret words and normals per second from the two keystream paths, on one device.

* ``openssl`` -- the ChaCha20 of OpenSSL through ``cryptography`` on the CPU (the CPU default);
* ``torch`` -- the vectorised torch ChaCha20 (``dpdl.algorithms.chacha``), which makes the
  words on the device where the parameters live (the default off the CPU).

Both give the same bits (tests/algorithms/test_chacha.py).  Rounds interleave the two paths in
one process; prints the median rate of each with [min .. max] over rounds and the ratio, for
the words alone (``fill_words``) and for the data-free half of a release (``noise.draw``: the
words and their Gaussian quantiles in grid units, i.e. the normals of a private step).

    .venv/bin/python benchmarks/bench_keystream.py [--words 4194304] [--nodes 4] [--rounds 5]
        [--threads 1] [--device cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

from dpdl.algorithms import noise
from dpdl.algorithms.randomness import DEVICE_KEYSTREAM, SecretStream, fill_words

PATHS = ("openssl", "torch")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def rates(path: str, kind: str, nodes: int, words: int, device: torch.device) -> float:
    """Words (or normals) per second of one timed call on ``path``."""
    DEVICE_KEYSTREAM[device.type] = path
    streams = [SecretStream() for _ in range(nodes)]
    per = words // nodes
    out = torch.empty((nodes, per), dtype=torch.int64, device=device)
    _sync(device)
    start = time.perf_counter()
    if kind == "words":
        fill_words(streams, out)
    else:
        noise.draw(streams, per, 0.8, device=device)
    _sync(device)
    return nodes * per / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=1 << 22, help="words per call, all nodes")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    saved = DEVICE_KEYSTREAM.get(device.type)
    for kind in ("words", "normals"):
        rates(PATHS[1], kind, args.nodes, 1 << 12, device)  # warm-up (kernels, allocator)
        got: dict[str, list[float]] = {p: [] for p in PATHS}
        for _ in range(args.rounds):
            for path in PATHS:
                got[path].append(rates(path, kind, args.nodes, args.words, device))
        med = {p: statistics.median(v) for p, v in got.items()}
        for path in PATHS:
            print(f"{kind:8s} {path:8s} {med[path] / 1e6:9.2f} M/s  "
                  f"[{min(got[path]) / 1e6:.2f} .. {max(got[path]) / 1e6:.2f}]")  # fmt: skip
        print(f"{kind:8s} torch/openssl rate ratio {med['torch'] / med['openssl']:.3f}")
    if saved is None:
        DEVICE_KEYSTREAM.pop(device.type, None)
    else:
        DEVICE_KEYSTREAM[device.type] = saved
    print(f"device {device}, threads {args.threads}, load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
