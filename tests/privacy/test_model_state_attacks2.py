"""Issue 38, second review (``/tmp/attacks2``): dropout_coupling.py and
dropout_coupling_readme.py (dropout masks from torch's global generator couple the nodes a
process hosts), stateful_bypass.py (stateful models and losses that the one-forward probe
missed) and seed_collision2.py (a class-level constant missing from the seeded digest).

Every test of a finding here failed on the main of 2026-12-03: the dropout and stateful models
trained, the seeded keys collided.  The last tests check what must stay accepted.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.algorithms.randomness import derive_key
from dpdl.engine.simulator import NodeData, Simulator, StepOptions, evaluation_mode
from dpdl.errors import DPDLError
from dpdl.models import make_model
from dpdl.models.validation import refuse_stateful
from dpdl.topology import make_topology
from dpdl.training.trainer import DecentralizedTrainer

pytestmark = pytest.mark.usefixtures("one_thread")


def one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def global_states() -> tuple:
    """torch's, numpy's and Python's process-wide generators' states."""
    legacy = np.random.get_state()  # noqa: NPY002 (the global generator a forward could use)
    return torch.random.get_rng_state(), legacy[1].copy(), legacy[2], random.getstate()


def same_states(a: tuple, b: tuple) -> bool:
    return (torch.equal(a[0], b[0]) and np.array_equal(a[1], b[1]) and a[2] == b[2]
            and a[3] == b[3])  # fmt: skip


# ------------------------------------------------------------------ the attacks' game
K, LR, CLIP, SIGMA, B = 40, 0.05, 5.0, 5.0, 0.3


def two_worlds(model: nn.Module, node1_records: int, loss="cross_entropy") -> Simulator:
    """Two nodes hosted by one process; the worlds differ only by one record at node 1."""
    g = torch.Generator().manual_seed(3)
    node0 = (torch.rand(3, 8, generator=g), torch.tensor([0, 1, 2]))
    node1 = (torch.rand(4, 8, generator=g), torch.tensor([2, 1, 0, 1]))
    j = max(3, node1_records)
    xs, ys = torch.zeros((2, j, 8)), torch.zeros((2, j), dtype=torch.int64)
    mask = torch.zeros((2, j), dtype=torch.bool)
    xs[0, :3], ys[0, :3], mask[0, :3] = node0[0], node0[1], True
    xs[1, :node1_records] = node1[0][:node1_records]
    ys[1, :node1_records] = node1[1][:node1_records]
    mask[1, :node1_records] = True
    return Simulator(model, NodeData.from_arrays(xs, ys, mask), make_topology("ring", 2),
                     lr=LR, expected_batch_size=B, seed=derive_key("root", 1),
                     options=StepOptions(loss=loss))  # fmt: skip


def node0_after_local_steps(make) -> list[torch.Tensor]:
    """Node 0's model after K local steps (no mixing) in each world."""
    out = []
    for records in (3, 4):
        torch.manual_seed(0)
        sim = two_worlds(make(), records)
        torch.manual_seed(1234)  # torch's global generator: public
        for _ in range(K):
            sim.step(private=True, clip=CLIP, sigma=SIGMA, mix=False)
        out.append(torch.cat([p[0].reshape(-1) for p in sim.params.values()]))
    return out


def with_dropout():
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))


# ------------------------------------------------------------------ dropout_coupling.py
def test_a_dropout_model_is_refused_by_the_engine_naming_the_layer_and_the_fix():
    """The attack: with nn.Dropout, node 0's clipped sum moved by 1.2-2.0 C between worlds
    that differ by one record at node 1 (torch's global generator, shared by the hosted
    nodes, advanced by a number of draws that follows their secret batch sizes).  Now the
    engine refuses the model before any step, in one line naming the layer and the fix, and
    leaves torch's global generator where it was."""
    model = with_dropout()
    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    with pytest.raises(DPDLError) as excinfo:
        two_worlds(model, 3)
    message = one_line(excinfo)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert "model layer '2' (Dropout) draws from torch's global random generator" in message
    assert "remove dropout" in message and "model[2].eval()" in message


def test_dropout_kept_in_eval_mode_couples_nothing():
    """The fix the error names: the layer kept in eval mode is accepted, and node 0's model
    is then the same in both worlds, bit for bit (as without the layer)."""
    def kept_off():
        model = with_dropout()
        model[2].eval()
        return model

    first, second = node0_after_local_steps(kept_off)
    assert torch.equal(first, second)


class SiteNet(nn.Module):
    """The README's example model as it was (Linear-LayerNorm-tanh-Dropout(0.1)-Linear)."""

    def __init__(self):
        super().__init__()
        self.hidden, self.norm = nn.Linear(64, 32), nn.LayerNorm(32)
        self.drop, self.out = nn.Dropout(0.1), nn.Linear(32, 10)

    def forward(self, x):
        return self.out(self.drop(torch.tanh(self.norm(self.hidden(x)))))


def test_the_old_readme_model_is_refused_before_anything_is_written(tmp_path):
    """dropout_coupling_readme.py: the README's SiteNet moved node 0's sums by 1.2-1.5 C a
    step.  dpdl.train now refuses it upfront: no run folder, the user's module untouched."""
    g = torch.Generator().manual_seed(7)
    data = [(torch.rand(20, 64, generator=g), torch.randint(0, 10, (20,), generator=g))
            for _ in range(3)]  # fmt: skip
    torch.manual_seed(0)
    model = SiteNet()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(DPDLError) as excinfo:
        dpdl.train(model, data, topology="ring", epsilon=1.0, steps=2, batch_size=2,
                   output_dir=tmp_path / "runs")  # fmt: skip
    assert "model layer 'drop' (Dropout)" in one_line(excinfo)
    assert not (tmp_path / "runs").exists()
    assert all(torch.equal(v, initial[k]) for k, v in model.state_dict().items())


def test_the_readme_example_model_holds_no_dropout():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    example = readme[readme.index("class SiteNet") : readme.index("def report_and_stop")]
    assert "Dropout" not in example
    assert "need not be secret" not in readme


class RandomForward(nn.Module):
    """Draws in its own forward code: from ``source`` (torch, numpy or Python's random)."""

    def __init__(self, source: str):
        super().__init__()
        self.fc, self.source = nn.Linear(8, 3), source

    def forward(self, x):
        if self.source == "torch":
            x = x + 0.01 * torch.randn_like(x)
        elif self.source == "numpy":
            x = x * float(np.random.uniform(0.9, 1.1))  # noqa: NPY002 (the global generator)
        elif self.source == "python" and self.training:
            x = x * random.uniform(0.9, 1.1)
        return self.fc(x)


class VmapOnlyNoise(nn.Module):
    """Draws only under the engine's transforms (not in a plain forward)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        if torch._C._are_functorch_transforms_active():
            x = torch.nn.functional.dropout(x, 0.2, training=True)
        return self.fc(x)


@pytest.mark.parametrize(("make", "named"), [
    (lambda: nn.Sequential(nn.Linear(8, 16), nn.RReLU(), nn.Linear(16, 3)),
     "model layer '1' (RReLU) draws from torch's global random generator"),
    (lambda: nn.Sequential(nn.Linear(8, 16), nn.AlphaDropout(0.2), nn.Linear(16, 3)),
     "model layer '1' (AlphaDropout)"),
    (lambda: RandomForward("torch"), "the model (RandomForward) draws from torch's global"),
    (lambda: RandomForward("numpy"), "draws from numpy's global random generator"),
    (lambda: RandomForward("python"), "draws from Python's random module"),
    (VmapOnlyNoise, "per-record gradients (vmap over records, each a batch of one)"),
])  # fmt: skip
def test_every_draw_from_a_process_wide_generator_is_refused(make, named):
    g = torch.Generator().manual_seed(4)
    data = [(torch.rand(6, 8, generator=g), torch.randint(0, 3, (6,), generator=g))
            for _ in range(3)]  # fmt: skip
    model = make()
    states = global_states()
    with pytest.raises(DPDLError) as excinfo:
        DecentralizedTrainer(model, data, topology="ring", epsilon=1.0, steps=2, batch_size=1)
    assert named in one_line(excinfo)
    assert same_states(states, global_states())


def test_a_loss_that_draws_is_refused_naming_the_loss():
    def noisy_loss(out, y):
        return nn.functional.cross_entropy(out + 0.1 * torch.randn_like(out), y,
                                           reduction="none")  # fmt: skip

    torch.manual_seed(0)
    with pytest.raises(DPDLError) as excinfo:
        two_worlds(nn.Linear(8, 3), 3, loss=noisy_loss)
    assert "the loss" in one_line(excinfo) and "noisy_loss" in one_line(excinfo)


# ------------------------------------------------------------------ stateful_bypass.py
class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)


class ShapeGated(Base):
    """Counts only batches of one record: the engine's (each record a batch of one)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        if self.training and x.shape[0] == 1:
            self.calls += 1
        return self.fc(x) * (1.0 + 0.05 * self.calls)


class FunctionalGated(Base):
    """Counts only under functional_call (the engine's parameters are plain tensors)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        if self.training and not isinstance(self.fc.weight, nn.Parameter):
            self.calls += 1
        return self.fc(x) * (1.0 + 0.05 * self.calls)


class ClassCounter(Base):
    """The count kept on the class."""

    calls = 0

    def forward(self, x):
        if self.training:
            type(self).calls += 1
        return self.fc(x) * (1.0 + 0.05 * type(self).calls)


class IterCounter(Base):
    """The count in an itertools.count (a C object: its state cannot be read)."""

    def __init__(self):
        super().__init__()
        self.ticks = itertools.count()

    def forward(self, x):
        k = next(self.ticks) if self.training else 0
        return self.fc(x) * (1.0 + 0.05 * k)


class CountingLoss:
    """A per-record loss object counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, out, y):
        self.calls += 1
        return nn.functional.cross_entropy(out * (1.0 + 0.05 * self.calls), y.long(),
                                           reduction="none")  # fmt: skip


class CountingLossModule(nn.Module):
    """The same as an nn.Module, counting in a buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, out, y):
        self.calls += 1
        return nn.functional.cross_entropy(out, y.long(), reduction="none")


@pytest.mark.parametrize(("make", "loss", "named"), [
    (ShapeGated, "cross_entropy",
     "across per-record gradients (vmap over records, each a batch of one) in train mode "
     "(attribute model.calls)"),
    (FunctionalGated, "cross_entropy",
     "across a forward under torch.func.functional_call in train mode (attribute model.calls)"),
    (ClassCounter, "cross_entropy", "class attribute model.calls ("),
    (IterCounter, "cross_entropy", "attribute model.ticks holds a value of type itertools.count"),
    (lambda: nn.Linear(8, 3), CountingLoss,
     "the loss's state changes across a forward in train mode (loss, loss attribute calls)"),
    (lambda: nn.Linear(8, 3), CountingLossModule, "the loss's state changes"),
])  # fmt: skip
def test_stateful_models_and_losses_that_slipped_through_are_refused(make, loss, named):
    """The attack: each of these trained, and node 0's model after 40 local steps differed by
    0.045 between worlds that differ at node 1 only.  Now the engine refuses each upfront."""
    before = ClassCounter.calls
    torch.manual_seed(0)
    with pytest.raises(DPDLError) as excinfo:
        two_worlds(make(), 3, loss=loss() if isinstance(loss, type) else loss)
    assert named in one_line(excinfo)
    ClassCounter.calls = before  # the probe ran on a copy, but a class is shared


def test_the_trainer_refuses_a_stateful_loss_too():
    g = torch.Generator().manual_seed(4)
    data = [(torch.rand(6, 8, generator=g), torch.randint(0, 3, (6,), generator=g))
            for _ in range(3)]  # fmt: skip
    loss = CountingLoss()
    with pytest.raises(DPDLError, match="loss attribute calls"):
        DecentralizedTrainer(nn.Linear(8, 3), data, topology="ring", epsilon=1.0, steps=2,
                             batch_size=1, loss=loss)  # fmt: skip
    assert loss.calls == 0  # the probe counted on a copy


# ------------------------------------------------------------------ seed_collision2.py
def make_net(scale: float) -> nn.Module:
    class Net(nn.Module):
        SCALE = scale  # a class-level constant

        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 3)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x) * self.SCALE))

    torch.manual_seed(0)
    return Net()


def seeded_keys(model) -> list[bytes]:
    g = torch.Generator().manual_seed(1)
    data = [(torch.rand(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g))
            for _ in range(4)]  # fmt: skip
    trainer = DecentralizedTrainer(model, data, algorithm="const-d2p", epsilon=1.0, steps=4,
                                   batch_size=2, lr=0.5, clip=1.0, entropy="seed", seed=7,
                                   topology="ring")  # fmt: skip
    sim, _ = trainer._engine()
    return [bytes(gen.get_state()[:32].tolist()) for gen in sim.generators]


def test_models_differing_only_in_a_class_constant_get_other_seeded_keys():
    """The attack: SCALE = 1.0 and 3.0 got identical keys, and the released models differed
    by 0.18 (the noise cancelled; independent noise: 8.4).  Now the class data attribute
    enters the digest; the same model built twice still gets the same keys."""
    first = seeded_keys(make_net(1.0))
    assert first == seeded_keys(make_net(1.0))
    assert first != seeded_keys(make_net(3.0))


def with_class_entry(value) -> nn.Module:
    class Net(nn.Module):
        ENTRY = value

        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(x)

    return Net()


@pytest.mark.parametrize(("a", "b"), [
    (1.0, 3.0),
    (staticmethod(torch.relu), staticmethod(torch.tanh)),  # a builtin kept as a method
    ([1, 2], [1, 3]),
    (torch.zeros(2), torch.ones(2)),
])  # fmt: skip
def test_every_kind_of_class_entry_enters_the_seeded_digest(a, b):
    from dpdl.training.fingerprints import state_digest

    first = state_digest(with_class_entry(a), "cross_entropy")
    assert first == state_digest(with_class_entry(a), "cross_entropy")
    assert first != state_digest(with_class_entry(b), "cross_entropy")


# ------------------------------------------------------------------ still accepted
class Normed(nn.Module):
    """GroupNorm and LayerNorm, a class constant, harmless attributes of every kind."""

    WIDTH = 16

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.group, self.layer = nn.GroupNorm(2, 4), nn.LayerNorm(4 * 8 * 8)
        self.head = nn.Linear(4 * 8 * 8, 3)
        self.act, self.window, self.config = torch.tanh, range(3), {"depth": [1, 2]}

    def forward(self, x):
        h = self.group(self.conv(x)).flatten(1)
        return self.head(self.act(self.layer(h)))


@pytest.mark.parametrize(("make", "shape"), [
    *[(lambda name=name: make_model(name, (1, 28, 28), 10), (1, 28, 28))
      for name in ("cnn", "logreg", "mlp")],
    (lambda: make_model("resnet18-gn", (3, 32, 32), 10), (3, 32, 32)),
    (lambda: nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.GELU(), nn.LayerNorm(32),
                           nn.Linear(32, 32), nn.SiLU(), nn.Linear(32, 10), nn.LogSoftmax(-1)),
     (8, 8)),
    (lambda: nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.ReLU(), nn.MaxPool2d(2),
                           nn.Flatten(), nn.Linear(36, 10)), (1, 8, 8)),
    (Normed, (1, 8, 8)),
])  # fmt: skip
def test_common_harmless_models_are_accepted_and_the_generators_left_alone(make, shape):
    torch.manual_seed(0)
    model = make()
    states = global_states()
    refuse_stateful(model, shape, loss=nn.CrossEntropyLoss(reduction="none"),
                    target_like=torch.zeros((), dtype=torch.int64))  # fmt: skip
    assert same_states(states, global_states())


def test_an_evaluation_leaves_every_layer_in_its_own_mode():
    """The engine trains each layer in the mode it is given; an evaluation (eval mode) must
    not turn on, when it ends, a dropout layer the user keeps off."""
    model = with_dropout()
    model[2].eval()
    with evaluation_mode(model):
        assert not any(m.training for m in model.modules())
    assert model.training and model[0].training and not model[2].training
