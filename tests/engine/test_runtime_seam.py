"""The runtime seam (issue 40, item 3): a Runtime hosts, agrees, gathers and hands the engine
its Mixer; one Simulator.step serves every runtime; a transport of one's own is a Mixer."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

import dpdl
from dpdl.engine import NodeData, Simulator
from dpdl.engine import distributed as distributed_module
from dpdl.engine.comm import PointToPointMixer
from dpdl.engine.distributed import DistributedSimulator, TorchDistributedRuntime
from dpdl.engine.mixing import InMemoryMixer, Mixer
from dpdl.engine.runtime import (
    RUNTIMES,
    LocalRuntime,
    Runtime,
    make_runtime,
    register_runtime,
)
from dpdl.errors import DPDLError
from dpdl.topology.graphs import directed_ring
from dpdl.training import trainer as trainer_module


def test_both_runtimes_and_both_mixers_satisfy_their_protocols():
    for runtime in (LocalRuntime(), TorchDistributedRuntime()):
        assert isinstance(runtime, Runtime)
    assert isinstance(InMemoryMixer(directed_ring(3), torch.device("cpu")), Mixer)
    assert all(callable(getattr(PointToPointMixer, name)) for name in ("mix",))
    assert set(inspect.signature(PointToPointMixer.mix).parameters) == set(
        inspect.signature(InMemoryMixer.mix).parameters)  # fmt: skip


def test_runtimes_are_made_by_name_and_unknown_names_are_one_line_errors():
    assert isinstance(make_runtime("simulator"), LocalRuntime)
    assert isinstance(make_runtime("distributed"), TorchDistributedRuntime)
    assert set(RUNTIMES) >= {"simulator", "distributed"}
    with pytest.raises(DPDLError, match=r"runtime must be one of \('simulator', 'distributed'"):
        make_runtime("mpi")
    with pytest.raises(DPDLError, match="or a Runtime"):
        make_runtime(42)


def test_one_step_serves_both_runtimes():
    """DistributedSimulator is the Simulator on another runtime, not a copy of its step."""
    for name in ("step", "mix_only", "_all_node_counts", "_reduce_sum", "_gather_nodes",
                 "node_block"):  # fmt: skip
        assert name not in DistributedSimulator.__dict__, name
    assert "_maybe_inject_fault" not in inspect.getsource(Simulator)


def test_the_trainer_and_the_runner_ask_their_runtime_never_its_name():
    """No `runtime == "distributed"` branch: the trainer and the runner hold no comparison
    with a runtime's name."""
    from dpdl.experiments import runner

    for module in (trainer_module, runner):
        tree = ast.parse(inspect.getsource(module))
        names = [node.value for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and node.value == "distributed"]  # fmt: skip
        assert names == [], module.__name__
    assert "distributed" not in {n.split(".")[-1] for n in _imported(trainer_module)}


def _imported(module) -> set[str]:
    tree = ast.parse(inspect.getsource(module))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return out


class _CountingMixer:
    """A transport of one's own: here the in-memory one, counting its rounds."""

    def __init__(self, topology, device):
        self.inner, self.rounds = InMemoryMixer(topology, device), []

    def mix(self, params, weights, k, *, step=None, out=None):
        self.rounds.append((k, step))
        return self.inner.mix(params, weights, k, step=step, out=out)


class _CountingRuntime(LocalRuntime):
    name = "counting"

    def __init__(self):
        self.steps = []

    def mixer(self, topology, block, device):
        self.made = _CountingMixer(topology, device)
        return self.made

    def before_step(self, step):
        self.steps.append(step)


def _engine(h, runtime=None, **kw):
    x, y, mask = h.tiny_data(5, [6, 7, 8, 6, 9])
    return Simulator(h.tiny_model(), NodeData.from_arrays(x, y, mask), h.ExpGraph(5), lr=0.3,
                     expected_batch_size=2.0, seed=11, runtime=runtime, **kw)  # fmt: skip


def test_a_mixer_of_ones_own_is_what_step_and_mix_only_call(h):
    """Same numbers as the default runtime's; the engine's rounds go through the mixer."""
    plain, counted = _engine(h), _engine(h, runtime=_CountingRuntime())
    for sim in (plain, counted):
        sim.step(private=True, clip=1.0, sigma=0.5)
        sim.step(private=True, clip=1.0, sigma=0.5, mix=False)
        sim.step(private=True, clip=1.0, sigma=0.5, mixing_round=0)
        sim.mix_only()
    for name in plain.params:
        assert torch.equal(plain.params[name], counted.params[name])
    assert torch.equal(plain.weights, counted.weights)
    assert counted.runtime.made.rounds == [(0, 0), (0, 2), (3, 3)]
    assert counted.runtime.steps == [0, 1, 2]  # the hook before every step (not mix_only)


def test_the_in_memory_mixer_writes_into_the_buffers_it_is_given(h):
    sim = _engine(h)
    params = {k: v + 1.0 for k, v in sim.params.items()}
    out = {k: torch.empty_like(v) for k, v in params.items()}
    mixed, _ = sim.mixer.mix(params, sim.weights, 0, out=out)
    assert all(mixed[k].data_ptr() == out[k].data_ptr() for k in out)


def test_a_runtime_of_ones_own_runs_the_trainer_by_instance_and_by_registered_name():
    import numpy as np

    rng = np.random.default_rng(0)
    data = [(rng.normal(size=(12, 4)).astype(np.float32), rng.integers(0, 2, size=12))
            for _ in range(4)]  # fmt: skip
    base = dict(algorithm="const-d2p", epsilon=2.0, calibrate="clt", certified_accountant="rdp",
                batch_size=3, lr=0.2, steps=4, eval_every=50, entropy="seed", seed=1)  # fmt: skip
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    plain = dpdl.train(model, data, **base)
    runtime = _CountingRuntime()
    counted = dpdl.train(model, data, runtime=runtime, **base)
    assert runtime.steps == [0, 1, 2, 3]
    for a, b in zip(plain.node_models, counted.node_models, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    register_runtime("counting-test", _CountingRuntime)
    try:
        trainer = dpdl.DecentralizedTrainer(model, data, runtime="counting-test", **base)
        assert trainer.describe()["runtime"] == "counting"
        # where it runs is not what it computes: the noise key leaves the runtime out
        assert "runtime" not in trainer.stream_settings()
        from dpdl.experiments.config import parse_config

        config = parse_config({"experiment": {"runtime": "counting-test"}})
        assert config.experiment.runtime == "counting-test"
    finally:
        RUNTIMES.pop("counting-test")
    from dpdl.errors import DPDLError

    with pytest.raises((DPDLError, ValueError), match="unknown runtime 'counting-test'"):
        parse_config({"experiment": {"runtime": "counting-test"}})


def test_fault_injection_is_the_distributed_runtimes_hook(monkeypatch):
    seen = []
    monkeypatch.setattr(distributed_module, "_maybe_inject_fault",
                        lambda rank, step: seen.append((rank, step)))  # fmt: skip
    monkeypatch.setattr(distributed_module.dist, "get_rank", lambda: 1)
    TorchDistributedRuntime().before_step(7)
    assert seen == [(1, 7)]
