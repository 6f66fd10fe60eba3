"""One prepared check of a device (a lent GPU: at most 5 minutes), one line per check.

* ``seeded-run``: five seeded private steps on the device against the same steps on the CPU:
  every node's parameters within 1e-5 (on the CPU the "device" run draws its words with the
  torch ChaCha20, as a GPU does, and the reference with OpenSSL);
* ``chacha20``: the torch ChaCha20 on the device equals OpenSSL's keystream (three streams at
  uneven offsets across the 2^32 block-counter carry and the kernel's chunks), and its
  words/s against OpenSSL's on one CPU thread;
* ``floor n=N b=B``: bench_floor's interleaved rounds on the device: the private step, the
  non-private step and both Opacus modes (if installed) as ratios to the compute floor;
* ``resnet18-gn``: a ResNet-18 (GroupNorm) on 32x32 images, n nodes, b records per node:
  images/s and peak memory of the private step (``dp``), the non-private one (``sgp``) and the
  plain forward + backward over the same n·b images (``floor``).  Peak memory: CUDA's
  allocator counters over what was allocated before the step; on a CPU the growth of the
  process's resident high-water mark over one step (rough: memory freed by an earlier check
  is reused unseen; bench_floor.py --memory measures in fresh processes).

A line starts PASS (the check held, or the measurement ran) or FAIL (with why); the exit
status is 1 if any failed.  ``--device cpu`` runs every check at smaller sizes (≤ 5 minutes on
2 cores), so the script is known to work before a device is lent:

    .venv/bin/python benchmarks/gpu_check.py --device cuda
    .venv/bin/python benchmarks/gpu_check.py --device cpu --threads 1
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_floor import CONTENDERS, REFERENCES, case  # noqa: E402  (a sibling script)
from bench_vs_opacus import _high_water_reset, _status_kib  # noqa: E402
from dpdl.algorithms import chacha  # noqa: E402
from dpdl.algorithms.randomness import DEVICE_KEYSTREAM, SecretStream, fill_words  # noqa: E402
from dpdl.engine import NodeData, Simulator  # noqa: E402
from dpdl.models import make_model  # noqa: E402
from dpdl.topology import make_topology  # noqa: E402

TOLERANCE = 1e-5


@dataclass(frozen=True)
class Sizes:
    """How big each check runs."""

    nodes: tuple[int, ...]  # the floor cases' n
    batches: tuple[int, ...]  # and b
    records: int  # J per node in the floor cases
    rounds: int
    seconds: float  # per contender per round
    resnet_nodes: int
    resnet_batch: int
    resnet_steps: int
    keystream_words: int  # per stream, for the words/s figure


SIZES = {
    "cuda": Sizes((20, 64), (1, 16, 64), 300, 3, 0.5, 16, 16, 3, 1 << 24),
    "cpu": Sizes((4, 8), (1, 4), 100, 2, 0.2, 2, 2, 2, 1 << 17),
}
#: --tiny: what the test suite runs (tests/test_gpu_check.py), so the script cannot rot
TINY = Sizes((2,), (1,), 20, 1, 0.01, 2, 1, 1, 1 << 11)


class Device:
    """Synchronisation and peak memory on one device (CUDA's counters; on a CPU the growth of
    the resident set's high-water mark: rough, in one process)."""

    def __init__(self, name: str):
        self.device = torch.device(name)
        self.cuda = self.device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def seconds(self, fn: Callable[[], object], calls: int) -> float:
        self.sync()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        self.sync()
        return (time.perf_counter() - start) / calls

    def peak_mb(self, fn: Callable[[], object]) -> float | None:
        """Peak memory of one call of ``fn`` over what was allocated before it."""
        if self.cuda:
            self.sync()
            torch.cuda.reset_peak_memory_stats(self.device)
            before = torch.cuda.memory_allocated(self.device)
            fn()
            self.sync()
            return (torch.cuda.max_memory_allocated(self.device) - before) / 2**20
        base = _status_kib("VmRSS")
        if not _high_water_reset():
            fn()
            return None
        fn()
        return (_status_kib("VmHWM") - base) / 1024


# --------------------------------------------------------------------------- checks
def seeded_run(device: Device, sizes: Sizes) -> Iterator[tuple[bool, str]]:
    """Five private steps of the shallow CNN, seeded streams, sigma = 1e-3: a grid step of the
    release (about sigma 2^-10) moves a parameter by ~1e-7, so the rounding of the sums, which
    differs between devices, stays far below the tolerance, while the noise itself (lr sigma X,
    ~1e-4) lies far above it: another keystream (key, counter or offset) fails the check."""
    n, j = 4, 24
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, j, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, size=(n, j))

    def run(where: torch.device) -> list[torch.Tensor]:
        data = NodeData.from_arrays(x, y, np.ones((n, j), bool))
        data = NodeData(data.inputs.to(where), data.targets.to(where), data.mask.to(where))
        sim = Simulator(make_model("cnn", (1, 28, 28), 10, seed=0).to(where), data,
                        make_topology("exp", n), lr=0.1, expected_batch_size=4, seed=7,
                        device=where)  # fmt: skip
        for _ in range(5):
            sim.step(private=True, clip=1.0, sigma=1e-3)
        return [p.detach().cpu() for p in sim.params.values()]

    reference = run(torch.device("cpu"))
    saved = DEVICE_KEYSTREAM.get("cpu")
    DEVICE_KEYSTREAM["cpu"] = "torch"  # the device's path, also where the device is the CPU
    try:
        on_device = run(device.device)
    finally:
        DEVICE_KEYSTREAM["cpu"] = saved
    worst = max(float((a - b).abs().max()) for a, b in zip(reference, on_device, strict=True))
    yield worst <= TOLERANCE, (f"seeded-run: {device.device} (torch keystream) vs cpu (OpenSSL), "
                               f"max |parameter difference| {worst:.1e} (<= {TOLERANCE:g})")


def _openssl(key: bytes, position: int, nbytes: int) -> bytes:
    stream = SecretStream(key)
    state = stream.get_state()
    state[32:] = torch.frombuffer(bytearray(position.to_bytes(32, "little")), dtype=torch.uint8)
    stream.set_state(state)
    return stream.read(nbytes).tobytes()


def keystream(device: Device, sizes: Sizes) -> Iterator[tuple[bool, str]]:
    keys = [os.urandom(32) for _ in range(3)]
    positions = [(2**32 - 5) * 64 - 8, (2**32 - 2) * 64 + 16, 123 * 64]
    out = torch.empty((3, 1500), dtype=torch.uint8, device=device.device)
    saved = chacha._CPU_LANES, chacha._DEVICE_LANES
    chacha._CPU_LANES = chacha._DEVICE_LANES = 10  # several chunks in 1500 bytes
    try:
        chacha.keystream(keys, positions, out)
    finally:
        chacha._CPU_LANES, chacha._DEVICE_LANES = saved
    got = out.cpu().numpy()
    same = all(got[i].tobytes() == _openssl(keys[i], positions[i], 1500) for i in range(3))
    yield same, f"chacha20: torch on {device.device} equals OpenSSL across the 2^32 carry: {same}"
    words = torch.empty((4, sizes.keystream_words), dtype=torch.int64, device=device.device)
    saved_path = DEVICE_KEYSTREAM.get(device.device.type)
    DEVICE_KEYSTREAM[device.device.type] = "torch"
    streams = [SecretStream() for _ in range(4)]
    try:
        fill_words(streams, words[:, :1024].clone())  # warm-up (kernels, allocator)
        seconds = device.seconds(lambda: fill_words(streams, words), 1)
    finally:
        DEVICE_KEYSTREAM.pop(device.device.type)
        if saved_path is not None:
            DEVICE_KEYSTREAM[device.device.type] = saved_path
    host = np.empty(8 * words.numel(), dtype=np.uint8)
    start = time.perf_counter()
    SecretStream().read_into(host)
    openssl = time.perf_counter() - start
    rate, reference = words.numel() / seconds / 1e6, words.numel() / openssl / 1e6
    yield True, (f"chacha20: torch on {device.device} {rate:.1f} M words/s, "
                 f"OpenSSL (CPU, 1 thread) {reference:.1f} M words/s")


def floor(device: Device, sizes: Sizes) -> Iterator[tuple[bool, str]]:
    who = ("floor", *CONTENDERS[1:], *REFERENCES)
    if importlib.util.find_spec("opacus") is None:
        who = tuple(name for name in who if not name.startswith("opacus"))
    for n in sizes.nodes:
        for b in sizes.batches:
            times = case(n, b, sizes.records, sizes.rounds, sizes.seconds, device.device, who)
            ratios = " ".join(f"{k} {np.median(times[k] / times['floor']):.2f}x"
                              for k in times if k != "floor")  # fmt: skip
            yield True, (f"floor n={n} b={b}: {ratios} (floor "
                         f"{np.median(times['floor']) * 1e3:.1f} ms/step)")


def _images(n: int, j: int, device) -> NodeData:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, j, 3, 32, 32)).astype(np.float32)
    y = rng.integers(0, 10, size=(n, j))
    data = NodeData.from_arrays(x, y, np.ones((n, j), bool))
    return NodeData(data.inputs.to(device), data.targets.to(device), data.mask.to(device))


def resnet_steps(n: int, b: int, device: torch.device) -> dict[str, Callable[[], object]]:
    """The private and non-private dpdl steps and the plain step of ResNet-18-GN on 32x32."""
    model = make_model("resnet18-gn", (3, 32, 32), 10, seed=0).to(device)
    data = _images(n, 4 * b, device)
    sim = Simulator(model, data, make_topology("exp", n), lr=0.03, expected_batch_size=b,
                    device=device)  # fmt: skip
    plain = make_model("resnet18-gn", (3, 32, 32), 10, seed=0).to(device)
    inputs, targets = data.inputs[:, :b].reshape(n * b, 3, 32, 32), data.targets[:, :b].reshape(-1)

    def floor_step():
        plain.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(plain(inputs), targets, reduction="sum").backward()

    return {"dp": lambda: sim.step(private=True, clip=1.0, sigma=0.5),
            "sgp": lambda: sim.step(private=False), "floor": floor_step}  # fmt: skip


def resnet(device: Device, sizes: Sizes) -> Iterator[tuple[bool, str]]:
    n, b = sizes.resnet_nodes, sizes.resnet_batch
    parts = []
    for name, step in resnet_steps(n, b, device.device).items():
        peak = device.peak_mb(step)  # the first step: it allocates the engine's buffers
        seconds = device.seconds(step, sizes.resnet_steps)
        memory = "n/a" if peak is None else f"{max(peak, 0.0):.0f} MB"
        parts.append(f"{name} {n * b / seconds:.1f} images/s, peak {memory}")
    yield True, f"resnet18-gn n={n} b={b} 32x32: " + "; ".join(parts)


CHECKS: dict[str, Callable[[Device, Sizes], Iterator[tuple[bool, str]]]] = {
    "seeded-run": seeded_run,
    "chacha20": keystream,
    "floor": floor,
    "resnet18-gn": resnet,
}


def run_checks(device: str, sizes: Sizes, names=tuple(CHECKS), emit=print) -> bool:
    """Every named check, one line each (a check that raises is one FAIL line); True if all
    passed."""
    where, passed = Device(device), True
    for name in names:
        try:
            for ok, line in CHECKS[name](where, sizes):
                passed &= ok
                emit(f"{'PASS' if ok else 'FAIL'} {line}")
        except Exception as err:  # a broken check must not hide the others
            passed = False
            first = str(err).splitlines()[0] if str(err) else ""
            emit(f"FAIL {name}: {type(err).__name__}: {first}")
    return passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--checks", nargs="+", choices=tuple(CHECKS), default=tuple(CHECKS))
    parser.add_argument("--tiny", action="store_true", help="the test suite's sizes")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print(f"FAIL device: {args.device} asked for, but torch sees no CUDA device")
        return 1
    sizes = TINY if args.tiny else SIZES.get(torch.device(args.device).type, SIZES["cuda"])
    start = time.perf_counter()
    print(f"gpu_check on {args.device} (torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}, load {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
    passed = run_checks(args.device, sizes, args.checks, lambda line: print(line, flush=True))
    print(f"{'all passed' if passed else 'FAILED'} in {time.perf_counter() - start:.0f} s")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
