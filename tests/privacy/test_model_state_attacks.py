"""Issue 38 (Major 4 and the Minor bullets on seeded keys and bad input): the attacks of
``shared/attacks/`` buffer_leak.py, clip_stateful.py, seed_collision.py and fuzz_new.py (its
``dpdl gossip account`` part), adapted to the API, each now refused upfront or failing.

Every test here failed on the main of 2026-12-03: the stateful models trained with status
"ok", the seeded keys collided, the gossip command raised raw errors or accepted node -1.
"""

from __future__ import annotations

import math
import sys

import networkx as nx
import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.algorithms.randomness import derive_key
from dpdl.cli import main
from dpdl.engine import checkpoint as checkpoints
from dpdl.engine.simulator import NodeData, Simulator
from dpdl.errors import DPDLError
from dpdl.topology import make_topology
from dpdl.training.trainer import DecentralizedTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


# ------------------------------------------------------------------ buffer_leak.py
class RunningCentre(nn.Module):
    """Centres features by a running mean tracked in train mode (BatchNorm-like, no class)."""

    def __init__(self, d):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(d))

    def forward(self, x):
        if self.training:
            self.running_mean = 0.9 * self.running_mean + 0.1 * x.detach().mean(0)
        return x - self.running_mean


def leak_data():
    g = torch.Generator().manual_seed(1)
    return [(torch.rand(20, 64, generator=g) * 10, torch.randint(0, 10, (20,), generator=g))
            for _ in range(2)]  # fmt: skip


LEAK_RUN = dict(topology="ring", algorithm="const-d2p", epsilon=1.0, delta=1e-5, steps=3,
                batch_size=2, lr=0.1, clip=1.0, eval_every=1)  # fmt: skip


def test_a_running_statistics_buffer_is_refused_before_anything_runs(tmp_path):
    """The attack: the released model carried 0.09 * the mean of node 0's first three
    records (the trainer's probe ran the user's module on them in train mode).  Now the
    model is refused upfront, naming the buffer; nothing is written and the user's module
    still holds its initial buffer (the refusing forwards ran on a copy, on synthetic
    records)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), RunningCentre(64), nn.Linear(64, 10))
    with pytest.raises(DPDLError) as excinfo:
        dpdl.train(model, leak_data(), output_dir=tmp_path / "runs", **LEAK_RUN)
    message = one_line(excinfo)
    assert "buffer 1.running_mean" in message and "changes across a forward" in message
    assert not (tmp_path / "runs").exists()
    assert torch.equal(model[1].running_mean, torch.zeros(64))


# A forward pre-hook that reports every module object a forward runs on, and what it is fed
# outside torch.func transforms.  Module-level state (not the model's own): the hook itself
# is part of the model and is copied with it, so copies report too.
RAN: list[tuple[int, torch.Tensor | None]] = []


def report_forward(module, args):
    plain = not torch._C._are_functorch_transforms_active()
    RAN.append((id(module), args[0].detach().clone() if plain else None))


def test_no_forward_runs_on_the_users_module_nor_on_private_records_before_training():
    """Probes and the structural trace run on throw-away copies, on synthetic records: the
    user's module is never run (not while the trainer checks it, not while it trains) and
    no forward before training sees a private record."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))
    model.register_forward_pre_hook(report_forward)
    data = leak_data()
    RAN.clear()
    trainer = DecentralizedTrainer(model, data, **LEAK_RUN)
    checked = list(RAN)
    assert checked, "the trainer's checks run the model (on copies)"
    assert all(who != id(model) for who, _ in checked)
    records = torch.cat([x for x, _ in data])
    for _, x in checked:
        if x is not None:  # no input row equals any node's record
            assert not (x.reshape(len(x), 1, -1) == records.reshape(1, len(records), -1)
                        ).all(-1).any()  # fmt: skip
    RAN.clear()
    result = trainer.fit()
    assert result.status == "ok" and RAN and all(who != id(model) for who, _ in RAN)


class ConstantShift(nn.Module):
    """A model with fixed buffers (one not persistent) and a plain attribute: what the
    released models may carry besides the trained parameters."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.register_buffer("shift", torch.linspace(-1, 1, 6))
        self.register_buffer("scale", torch.full((3,), 2.0), persistent=False)
        self.note = ["initial"]

    def forward(self, x):
        return self.fc(x - self.shift) * self.scale


def test_released_models_carry_the_trained_parameters_and_the_initial_state_only():
    torch.manual_seed(0)
    model = ConstantShift()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    data = [(torch.rand(12, 6, generator=g), torch.randint(0, 3, (12,), generator=g))
            for _ in range(3)]  # fmt: skip
    result = dpdl.train(model, data, topology="ring", algorithm="const-d2p", epsilon=2.0,
                        delta=1e-5, steps=4, batch_size=2, lr=0.5, clip=1.0, eval_every=4)
    for released in (result.model, *result.node_models):
        assert torch.equal(released.shift, initial["shift"])
        assert torch.equal(released.scale, torch.full((3,), 2.0)) and released.note == ["initial"]
        assert not torch.equal(released.fc.weight, initial["fc.weight"])  # trained
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())


# ------------------------------------------------------------------ clip_stateful.py
K, LR, CLIP, SIGMA, B = 40, 0.05, 5.0, 5.0, 0.3


class Annealed(nn.Module):
    """Logits sharpened as training goes on (a counter of forward calls in train mode)."""

    def __init__(self, counter: bool):
        super().__init__()
        self.fc = nn.Linear(8, 3)
        self.counter, self.calls = counter, 0

    def forward(self, x):
        if self.training and self.counter:
            self.calls += 1
        return self.fc(x) * (1.0 + 0.05 * self.calls)


def two_worlds_engine(counter: bool, node1_records: int) -> Simulator:
    """The attack's engine: two nodes, worlds that differ by one record at node 1 only."""
    g = torch.Generator().manual_seed(3)
    node0 = (torch.rand(3, 8, generator=g), torch.tensor([0, 1, 2]))
    node1 = (torch.rand(4, 8, generator=g), torch.tensor([2, 1, 0, 1]))
    torch.manual_seed(0)
    j = max(3, node1_records)
    xs, ys = torch.zeros((2, j, 8)), torch.zeros((2, j), dtype=torch.int64)
    mask = torch.zeros((2, j), dtype=torch.bool)
    xs[0, :3], ys[0, :3], mask[0, :3] = node0[0], node0[1], True
    xs[1, :node1_records] = node1[0][:node1_records]
    ys[1, :node1_records] = node1[1][:node1_records]
    mask[1, :node1_records] = True
    return Simulator(Annealed(counter), NodeData.from_arrays(xs, ys, mask),
                     make_topology("ring", 2), lr=LR, expected_batch_size=B,
                     seed=derive_key("root", 1))  # fmt: skip


def test_a_forward_counter_is_refused_by_the_engine_and_the_trainer():
    """The attack: node 0's model after 40 local steps differed by 0.159 between worlds that
    differ at node 1 only (the counter counted every hosted node's non-empty steps).  The
    control shows the setting: without the counter node 0's model is the same in both."""
    control = []
    for records in (3, 4):
        sim = two_worlds_engine(False, records)
        for _ in range(K):
            sim.step(private=True, clip=CLIP, sigma=SIGMA, mix=False)
        control.append(torch.cat([p[0].reshape(-1) for p in sim.params.values()]))
    assert torch.equal(control[0], control[1])
    with pytest.raises(DPDLError) as excinfo:
        two_worlds_engine(True, 3)
    assert "attribute model.calls" in one_line(excinfo)
    g = torch.Generator().manual_seed(3)
    data = [(torch.rand(6, 8, generator=g), torch.randint(0, 3, (6,), generator=g))
            for _ in range(2)]  # fmt: skip
    with pytest.raises(DPDLError, match="attribute model.calls"):
        dpdl.train(Annealed(True), data, topology="ring", epsilon=1.0, steps=3, batch_size=1)


class Recorder(nn.Module):
    """Keeps what it sees in a Python list."""

    def __init__(self):
        super().__init__()
        self.fc, self.seen = nn.Linear(8, 3), []

    def forward(self, x):
        self.seen.append(float(x.sum()))
        return self.fc(x)


class TensorAttribute(nn.Module):
    """A statistic kept as a plain tensor attribute (neither parameter nor buffer)."""

    def __init__(self):
        super().__init__()
        self.fc, self.peak = nn.Linear(8, 3), torch.zeros(8)

    def forward(self, x):
        self.peak = torch.maximum(self.peak, x.detach().amax(0))
        return self.fc(x)


class OwnGenerator(nn.Module):
    """Draws its dropout mask from a generator it holds: each forward moves its state."""

    def __init__(self):
        super().__init__()
        self.fc, self.gen = nn.Linear(8, 3), torch.Generator().manual_seed(0)

    def forward(self, x):
        keep = torch.rand(x.shape[-1], generator=self.gen) > 0.1
        return self.fc(x * keep)


class EvalCache(nn.Module):
    """Caches its last input in eval mode."""

    def __init__(self):
        super().__init__()
        self.fc, self.last = nn.Linear(8, 3), None

    def forward(self, x):
        if not self.training:
            self.last = x.detach().clone()
        return self.fc(x)


class Helper:
    def __init__(self):
        self.count = 0


class NestedCounter(nn.Module):
    """A counter inside a helper object held by a submodule."""

    def __init__(self):
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(8, 3))
        self.inner.helper = Helper()

    def forward(self, x):
        self.inner.helper.count += len(x)
        return self.inner(x)


@pytest.mark.parametrize(("model", "named"), [
    (Recorder, "attribute model.seen"),
    (TensorAttribute, "attribute model.peak"),
    (OwnGenerator, "attribute model.gen"),
    (EvalCache, "attribute model.last"),
    (NestedCounter, "attribute inner.helper"),
])  # fmt: skip
def test_every_kind_of_state_a_forward_changes_is_refused(model, named):
    g = torch.Generator().manual_seed(4)
    data = [(torch.rand(6, 8, generator=g), torch.randint(0, 3, (6,), generator=g))
            for _ in range(3)]  # fmt: skip
    with pytest.raises(DPDLError) as excinfo:
        DecentralizedTrainer(model(), data, topology="ring", epsilon=1.0, steps=2, batch_size=1)
    assert named in one_line(excinfo)


# ------------------------------------------------------------------ seed_collision.py
def collision_data():
    g = torch.Generator().manual_seed(1)
    return [(torch.rand(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g))
            for _ in range(4)]  # fmt: skip


SEEDED = dict(algorithm="const-d2p", epsilon=1.0, delta=1e-5, steps=4, batch_size=2, lr=0.5,
              clip=1.0, entropy="seed", seed=7, eval_every=4)  # fmt: skip


class Net(nn.Module):
    def __init__(self, act):
        super().__init__()
        self.fc1, self.fc2, self.act = nn.Linear(8, 16), nn.Linear(16, 3), act

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


def net(act=torch.relu):
    torch.manual_seed(0)
    return Net(act)


class Shifted(nn.Module):
    """A fixed input shift kept in a buffer that is not persistent (not in state_dict)."""

    def __init__(self, shift: float):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(8, 3)
        self.register_buffer("shift", torch.full((8,), shift), persistent=False)

    def forward(self, x):
        return self.fc(x - self.shift)


class WeightedLoss:
    """A per-record loss object: its weight is an attribute, its code one __call__."""

    def __init__(self, weight: float):
        self.weight = weight

    def __call__(self, out, y):
        return self.weight * nn.functional.cross_entropy(out, y, reduction="none")


def ring_of(order):
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(order)))  # node i = the i-th of graph.nodes: 0..n-1
    graph.add_edges_from(zip(order, order[1:] + order[:1], strict=True))
    return graph


def alternating(second):
    """A mixing function of period 2: the ring, then ``second``."""
    ring = np.zeros((4, 4))
    for i in range(4):
        ring[i, i] = ring[(i + 1) % 4, i] = 0.5
    return lambda k: ring if k % 2 == 0 else second


def keys(options) -> list[bytes]:
    """Every node's stream key (the first 32 bytes of a ChaCha20 stream's state)."""
    trainer = DecentralizedTrainer(options.pop("model"), collision_data(), **options, **SEEDED)
    sim, _ = trainer._engine()
    return [bytes(gen.get_state()[:32].tolist()) for gen in sim.generators]


# Each side built afresh at every call: the same run twice must get the same keys.
PAIRS = {
    "two directed rings, 4 nodes, 4 edges": (
        lambda: dict(model=net(), topology=ring_of([0, 1, 2, 3])),
        lambda: dict(model=net(), topology=ring_of([0, 2, 1, 3]))),
    "act = relu vs tanh": (lambda: dict(model=net(torch.relu)),
                           lambda: dict(model=net(torch.tanh))),
    "two mixing functions of one period": (
        lambda: dict(model=net(), topology=alternating(np.full((4, 4), 0.25)),
                     topology_params={"period": 2}),
        lambda: dict(model=net(), topology=alternating(np.eye(4)[[1, 2, 3, 0]] * 0.5
                                                       + np.eye(4) * 0.5),
                     topology_params={"period": 2})),
    "a non-persistent buffer": (lambda: dict(model=Shifted(0.0)),
                                lambda: dict(model=Shifted(1.0))),
    "a loss object's attribute": (lambda: dict(model=net(), loss=WeightedLoss(1.0)),
                                  lambda: dict(model=net(), loss=WeightedLoss(2.0))),
}  # fmt: skip


@pytest.mark.parametrize("pair", list(PAIRS))
def test_seeded_runs_that_train_different_things_never_share_streams(pair):
    """The attack: two runs that differ (in the graph, in an attribute of the model) derived
    identical node keys, so the difference of their released models was noise-free.  Now
    every such pair gets other keys, while the same run built twice gets the same keys
    (seeded runs stay reproducible: a key of a memory address would differ each time)."""
    a, b = PAIRS[pair]

    def run(side):
        options = side()
        return keys(dict(options, topology=options.get("topology", "ring")))

    first = run(a)
    assert first == run(a)
    assert first != run(b)


# ------------------------------------------------------------------ fuzz_new.py: dpdl gossip
@pytest.mark.parametrize(("args", "fragment"), [
    (["--target", "16", "--observer", "1"], "--target 16 is not a node of this 16-node graph"),
    (["--target", "-1", "--observer", "1"], "--target -1 is not a node"),
    (["--target", "99", "--observer", "1"], "--target 99 is not a node"),
    (["--target", "1", "--observer", "16"], "--observer 16 is not a node"),
    (["--calibrate", "1", "--beyond", "-3"], "--beyond must be a number of hops >= 0, got -3"),
    (["--calibrate", "0"], "--calibrate must be a finite epsilon > 0, got 0.0"),
    (["--calibrate", "nan"], "--calibrate must be a finite epsilon > 0, got nan"),
    (["--seed", "-1"], "--seed must be >= 0"),
    (["--plot", "no-such-folder/heat.png"], "folder 'no-such-folder' does not exist"),
    (["-u", "1", "-v", "0", "--rounds", "100000000"], "give fewer rounds or nodes"),
    (["--nodes", "100000", "--rounds", "1"], "mixing matrices do not fit in memory"),
])  # fmt: skip
def test_gossip_account_bad_input_is_one_line(args, fragment, capsys):
    """The attack: --target 16 (and 99) raised a raw IndexError, --target -1 was accepted
    (column -1 of the view: another node's), --beyond -3 was accepted, and sizes beyond
    memory raised a raw MemoryError.  Every one is now refused in one line."""
    assert main(["gossip", "account", *args]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_gossip_account_shows_its_progress_on_a_terminal(capsys, monkeypatch):
    """The attack: --nodes 300 --rounds 300 ran for minutes without a sign of life.  Now a
    progress bar (on a terminal: not in a pipe, not with --no-progress) counts the
    observers of every pair and of the calibration."""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    argv = ["gossip", "account", "-n", "6", "-T", "3", "--calibrate", "1"]
    assert main(argv) == 0
    err = capsys.readouterr().err
    assert "every pair (observers)" in err and "calibration (observers)" in err and "/6" in err
    assert main([*argv, "--no-progress"]) == 0
    assert "observers" not in capsys.readouterr().err


# ------------------------------------------------------------------ the other Minor bullets
def test_a_diverged_api_run_removes_its_checkpoint(tmp_path):
    """A checkpoint holds every node's secret stream keys: a run that diverged (nothing to
    resume: it would replay the same noise into the same divergence) must not leave it."""
    g = torch.Generator().manual_seed(5)
    data = [(torch.rand(8, 6, generator=g), torch.randint(0, 3, (8,), generator=g))
            for _ in range(3)]  # fmt: skip
    torch.manual_seed(0)
    result = dpdl.train(nn.Linear(6, 3), data, topology="ring", algorithm="const-d2p",
                        epsilon=1.0, steps=6, batch_size=2, lr=1e38, clip=1.0,
                        checkpoint_every=1, output_dir=tmp_path, run_name="boom")  # fmt: skip
    assert result.status == "diverged"
    saved = checkpoints.process_path(tmp_path / "boom" / "checkpoints" / "run.pt")
    assert (tmp_path / "boom" / "results.json").is_file() and not saved.exists()


def test_the_embedded_default_runs_no_non_private_baseline():
    """THREAT_MODEL: the non-private sgp runs only when a config or call names it, never by
    default; `dpdl run` with no config runs the embedded default preset."""
    from dpdl.commands.run import DEFAULT_PRESET
    from dpdl.experiments.config import parse_config
    from dpdl.experiments.registry import load_config_file
    from dpdl.training.settings import AlgorithmSpec

    cfg = parse_config(load_config_file(preset=DEFAULT_PRESET))
    names = [AlgorithmSpec.parse(a).name for a in cfg.experiment.algorithms]
    assert names and "sgp" not in names
    assert all(not math.isnan(e) for e in cfg.privacy.epsilons)
