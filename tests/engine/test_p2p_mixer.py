"""Point-to-point push-sum mixing across gloo processes equals the dense product P^k x."""

import os
import socket

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from dpdl.engine.comm import PointToPointMixer, block_bounds
from dpdl.errors import DPDLError


class _Shift:
    """Time-varying one-peer exponential graph of MATH.md §3, built here from its definition."""

    def __init__(self, n):
        self.n, self.m = n, (n - 1).bit_length()
        self.period = self.m

    def mixing_matrix(self, k):
        s = 2 ** (k % self.m)
        P = 0.5 * np.eye(self.n)
        P[(np.arange(self.n) + s) % self.n, np.arange(self.n)] += 0.5
        return P


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, n, steps, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    lo, hi = block_bounds(n, world, rank)
    rng = np.random.default_rng(0)
    x0 = torch.as_tensor(rng.normal(size=(n, 3, 2)), dtype=torch.float32)
    params = {"a": x0[lo:hi].clone(), "b": x0[lo:hi, :, 0].clone() * 2}
    w = torch.ones(hi - lo, dtype=torch.float64)
    mixer = PointToPointMixer(_Shift(n), n, rank, world, torch.device("cpu"))
    for k in range(steps):
        params, w = mixer.mix(params, w, k)
    torch.save(
        {"a": params["a"], "b": params["b"], "w": w, "bytes": mixer.bytes_sent,
         "node_messages": mixer.traffic.messages.tolist(),
         "node_bytes": mixer.traffic.bytes.tolist()},
        os.path.join(out_dir, f"{rank}.pt"),
    )
    dist.destroy_process_group()


@pytest.mark.parametrize("world", [3])  # uneven blocks: 3, 2, 2 nodes
def test_p2p_mixing_equals_dense_product(tmp_path, world):
    n, steps = 7, 6
    mp.start_processes(
        _worker, args=(world, _free_port(), n, steps, str(tmp_path)), nprocs=world,
        start_method="spawn",
    )  # fmt: skip
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3, 2))
    b = x[:, :, 0] * 2
    w = np.ones(n)
    graph = _Shift(n)
    for k in range(steps):
        P = graph.mixing_matrix(k)
        x, b, w = np.einsum("ij,j...->i...", P, x), P @ b, P @ w
    got_x = torch.cat([p["a"] for p in parts]).numpy()
    np.testing.assert_allclose(got_x, x, atol=1e-5)
    np.testing.assert_allclose(torch.cat([p["b"] for p in parts]).numpy(), b, atol=1e-5)
    np.testing.assert_allclose(torch.cat([p["w"] for p in parts]).numpy(), w, atol=1e-12)
    assert sum(p["bytes"] for p in parts) > 0


def test_what_each_node_sends_is_what_crosses_the_wire_and_the_simulator_counts(tmp_path):
    """Issue 43: one node per process, so every message of a node crosses between processes:
    the bytes handed to isend (the wire) equal the node's count, which equals the in-memory
    mixer's and the closed form (one out-neighbour per round: a float32 row of a (3, 2) and a
    (3,) tensor, 36 bytes, and the float64 weight, 8)."""
    from dpdl.engine.mixing import InMemoryMixer

    n = world = 2
    steps = 5
    mp.start_processes(
        _worker, args=(world, _free_port(), n, steps, str(tmp_path)), nprocs=world,
        start_method="spawn",
    )  # fmt: skip
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    per_message = 3 * 2 * 4 + 3 * 4 + 8
    for part in parts:
        assert part["node_messages"] == [steps]
        assert part["node_bytes"] == [steps * per_message] == [part["bytes"]]

    class Graph(_Shift):
        def circulant(self, k):
            return None  # the matrix path of the in-memory mixer

    mixer = InMemoryMixer(Graph(n), torch.device("cpu"))
    params = {"a": torch.zeros(n, 3, 2), "b": torch.zeros(n, 3)}
    w = torch.ones(n, dtype=torch.float64)
    for k in range(steps):
        params, w = mixer.mix(params, w, k)
    assert mixer.traffic.messages.tolist() == [steps] * n
    assert mixer.traffic.bytes.tolist() == [p["bytes"] for p in parts]


def test_block_bounds_cover_all_nodes_contiguously():
    for n in (1, 5, 8, 20):
        for world in range(1, n + 1):
            blocks = [block_bounds(n, world, r) for r in range(world)]
            assert blocks[0][0] == 0 and blocks[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(blocks, blocks[1:], strict=False))
            sizes = [hi - lo for lo, hi in blocks]
            assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    with pytest.raises(DPDLError, match="at least one node"):
        block_bounds(3, 4, 0)


def _share_worker(rank, world, port, n, out_dir):
    from dpdl.algorithms.correlated import CorrelatedStep, ZeroSumNoise, undirected_neighbours
    from dpdl.algorithms.dyn_d2p import GAUSSIAN_RELEASE
    from dpdl.algorithms.pairwise import HostedKeys

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    lo, hi = block_bounds(n, world, rank)
    keys = HostedKeys(lo, hi - lo, root=b"r" * 32)  # seeded: every rank knows the publics
    keys.learn_publics(HostedKeys(0, n, root=b"r" * 32).own_publics)
    mixer = PointToPointMixer(_Shift(n), n, rank, world, torch.device("cpu"))
    neighbours = undirected_neighbours(_Shift(n).mixing_matrix(1), range(lo, hi))
    step = CorrelatedStep(3, 1, lo, neighbours, keys, mixer)
    sums = ZeroSumNoise(2.0).at_step(GAUSSIAN_RELEASE, step).correlated_sums(16, 1.5)
    torch.save({"sums": sums, "bytes": mixer.bytes_sent}, os.path.join(out_dir, f"{rank}.pt"))
    dist.destroy_process_group()


def test_zero_sum_shares_cross_processes_point_to_point_and_match_one_process(tmp_path):
    """Three processes hand each other only the shares of the edges that cross them (one
    message per rank pair that the round's undirected graph connects) and hold bitwise the
    sums one process computes for all seven nodes."""
    from dpdl.algorithms.correlated import CorrelatedStep, ZeroSumNoise, undirected_neighbours
    from dpdl.algorithms.dyn_d2p import GAUSSIAN_RELEASE
    from dpdl.algorithms.pairwise import HostedKeys

    n, world = 7, 3
    mp.start_processes(_share_worker, args=(world, _free_port(), n, str(tmp_path)),
                       nprocs=world, start_method="spawn")  # fmt: skip
    parts = [torch.load(tmp_path / f"{r}.pt") for r in range(world)]
    keys = HostedKeys(0, n, root=b"r" * 32)
    keys.learn_publics(keys.own_publics)
    neighbours = undirected_neighbours(_Shift(n).mixing_matrix(1), range(n))
    whole = ZeroSumNoise(2.0).at_step(GAUSSIAN_RELEASE, CorrelatedStep(3, 1, 0, neighbours, keys))
    assert torch.equal(torch.cat([p["sums"] for p in parts]), whole.correlated_sums(16, 1.5))
    bounds = [block_bounds(n, world, r) for r in range(world)]
    crossing = sum(1 for i in range(n) for k in neighbours[i]
                   if not any(lo <= i < hi and lo <= k < hi for lo, hi in bounds))  # fmt: skip
    assert sum(p["bytes"] for p in parts) == crossing * 16 * 8 > 0  # float64 rows, no more
