"""The two example plugins of examples/plugins (Muffliato-style gossip, gradient tracking with
two releases per step), each one file outside src/, run by name through the trainer, the
engine, the ledger, `dpdl run/sweep/tune/report/audit/account/gossip account`."""

import json
import math
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
import torch

import dpdl
from dpdl.algorithms import registry
from dpdl.cli import main

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = [ROOT / "examples" / "plugins" / "muffliato.py",
           ROOT / "examples" / "plugins" / "gradient_tracking.py"]


@pytest.fixture(autouse=True)
def plugins(monkeypatch):
    """The plugins load from DPDL_PLUGINS, as every command (and a sweep's workers) loads them."""
    monkeypatch.setenv(registry.PLUGINS_VARIABLE, ",".join(str(p) for p in PLUGINS))
    registry.load_plugins()


def _nodes(n=4, records=60, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(records, 5)).astype(np.float32)
        out.append((x, (x[:, 0] > 0).astype(np.int64)))
    return out


def _train(algorithm, **options):
    data = _nodes()
    settings = dict(topology="ring", algorithm=algorithm, epsilon=4.0, steps=12, batch_size=4,
                    lr=0.3, entropy="seed", seed=1, eval_data=data[0])
    return dpdl.train(torch.nn.Linear(5, 2), data, **(settings | options))


def test_the_plugins_are_registered_by_name_and_their_settings_validated():
    assert {"muffliato", "dsgt"} <= set(registry.algorithm_names())
    with pytest.raises(dpdl.DPDLError, match="rounds.*greater than or equal to 1"):
        _train("muffliato(rounds=0)")
    with pytest.raises(dpdl.DPDLError, match="unknown algorithm 'nope'"):
        _train("nope")


def test_gradient_tracking_records_two_releases_per_step_as_dp_accounting_composes_them():
    """Under add/remove (dp_accounting's relation for Poisson sampling): the ledger's ε is
    dp_accounting's PLD of the same events, z_k and rho z_k per step (rho = 1.5)."""
    result = _train("dsgt(tracker_noise=1.5)", neighboring="add-remove", sample_rate=0.05,
                    steps=20)
    ledger = result.ledger
    assert ledger.releases == ("model", "tracker") and ledger.steps_taken == 20
    z = float(result.schedule.noise_multipliers[0])
    np.testing.assert_array_equal(ledger.recorded_multipliers.reshape(20, 2),
                                  np.tile([z, 1.5 * z], (20, 1)))
    accountant = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    for factor in (1.0, 1.5):
        event = dp_accounting.PoissonSampledDpEvent(
            0.05, dp_accounting.GaussianDpEvent(z * factor))
        accountant.compose(event, 20)
    reference = accountant.get_epsilon(result.delta)
    assert result.epsilon == pytest.approx(reference, rel=2e-3)
    assert result.epsilon <= 4.0 * (1 + 1e-9)
    # the tracker's release is not free: one release of z alone spends less
    alone = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    gaussian = dp_accounting.GaussianDpEvent(z)
    alone.compose(dp_accounting.PoissonSampledDpEvent(0.05, gaussian), 20)
    assert alone.get_epsilon(result.delta) < reference - 0.05


def test_settings_key_the_noise_the_label_and_the_checkpoints():
    """Two settings of one algorithm never share seeded noise: R = 1 and R = 4 derive other
    streams, carry other labels and other run digests."""
    data = _nodes()

    def trainer(algorithm):
        torch.manual_seed(0)  # one initial model (it keys seeded noise too)
        return dpdl.DecentralizedTrainer(torch.nn.Linear(5, 2), data, topology="ring",
                                         algorithm=algorithm, epsilon=4.0, steps=12,
                                         batch_size=4, lr=0.3, entropy="seed", seed=1)

    from dpdl.training.plan import noise_root

    one, four, again = (trainer(a) for a in ("muffliato(rounds=1)", "muffliato(rounds=4)",
                                             "muffliato(rounds=4)"))
    roots = [noise_root("seed", 1, t.stream_settings()) for t in (one, four, again)]
    assert roots[0] != roots[1] and roots[1] == roots[2]
    assert one.run_digest() != four.run_digest() == again.run_digest()
    assert four.describe()["algorithm"] == "muffliato(rounds=4)"


def _engine(algorithm=None):
    from dpdl.engine.simulator import NodeData, Simulator
    from dpdl.topology import make_topology

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 2)
    data = _nodes()
    from dpdl.data.nodes import stack_local_datasets

    sim = Simulator(model, NodeData.from_arrays(*stack_local_datasets(data)),
                    make_topology("ring", 4), lr=0.3,
                    expected_batch_size=4, seed=7)
    if algorithm is not None:
        sim.use_algorithm(*registry.resolve(algorithm))
    return sim


def test_muffliato_is_the_local_update_then_r_rounds_on_the_engine():
    """R = 1 is Algorithm 1's step exactly; R = 3 is that step then two more push-sum rounds
    (a static ring: every round's graph is the same)."""
    step = dict(private=True, clip=1.0, sigma=0.5)
    base, one = _engine(), _engine("muffliato(rounds=1)")
    base.step(**step)
    one.step(**step)
    for name in base.params:
        torch.testing.assert_close(one.params[name], base.params[name], rtol=0, atol=0)
    three = _engine("muffliato(rounds=3)")
    three.step(**step)
    base.mix_only()
    base.mix_only()
    for name in base.params:
        torch.testing.assert_close(three.params[name], base.params[name], rtol=0, atol=0)
    torch.testing.assert_close(three.weights, base.weights, rtol=0, atol=0)


def test_gradient_tracking_keeps_its_state_in_the_checkpoint():
    step = dict(private=True, clip=1.0, sigma=0.5)
    first = _engine("dsgt")
    for _ in range(2):
        first.step(**step)
    saved = first.state_dict()
    assert set(saved["algorithm_state"]) == {"tracker", "last_release"}
    first.step(**step)
    second = _engine("dsgt")
    second.load_state_dict(saved)
    second.step(**step)
    for name in first.params:
        torch.testing.assert_close(second.params[name], first.params[name], rtol=0, atol=0)
        torch.testing.assert_close(second.algorithm_state["tracker"][name],
                                   first.algorithm_state["tracker"][name], rtol=0, atol=0)
    # the tracker tracks: its network sum is the sum of the last releases (doubly stochastic)
    y, g = first.algorithm_state["tracker"], first.algorithm_state["last_release"]
    for name in y:
        torch.testing.assert_close(y[name].sum(0), g[name].sum(0), rtol=1e-5, atol=1e-5)
    plain = _engine()
    with pytest.raises(dpdl.DPDLError, match="algorithm state"):
        plain.load_state_dict(saved)


def _brute_force_mu(P, steps, rounds, target, observer, sigma):
    """μ of `target` against `observer` by explicit propagation: every (node, round) input's
    effect on every message the observer receives, inputs only at each step's first round."""
    n = P.shape[0]
    T = steps * rounds
    columns = {}
    for s in range(0, T, rounds):
        for node in range(n):
            m = np.zeros(n)
            m[node] = 1.0
            trace = []
            for _ in range(s, T):
                trace.append(m.copy())
                m = P @ m
            columns[(s, node)] = trace
    rows = [(t, j) for t in range(T) for j in range(n) if P[observer, j] > 0 and j != observer]

    def seen(s, node):
        return np.array([columns[(s, node)][t - s][j] if t >= s else 0.0 for t, j in rows])

    c = sum(seen(s, target) for s in range(0, T, rounds))
    B = np.stack([seen(s, u) for s in range(0, T, rounds) for u in range(n) if u != observer],
                 axis=1)
    return math.sqrt(float(c @ np.linalg.pinv(B @ B.T) @ c)) / sigma


def test_gossip_account_models_muffliato_rounds_exactly(capsys):
    from dpdl.topology import make_topology

    P = np.asarray(make_topology("ring", 6).mixing_matrix(0))
    assert main(["gossip", "account", "-t", "ring", "-n", "6", "--rounds", "2", "--sigma", "2",
                 "-u", "0", "-v", "3", "--algorithm", "muffliato(rounds=3)", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["rounds"] == 6 and out["rounds_per_step"] == 3
    assert out["mu"] == pytest.approx(_brute_force_mu(P, 2, 3, 0, 3, 2.0), rel=1e-7)
    # DSGT's two coupled streams: the local-DP bound of its releases, stated as such
    assert main(["gossip", "account", "-t", "ring", "-n", "6", "--rounds", "2", "--sigma", "2",
                 "-u", "0", "-v", "3", "--algorithm", "dsgt(tracker_noise=2.0)", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert not out["exact_view"]
    assert out["local_dp_mu"] == pytest.approx(math.sqrt(2 * (1 + 1 / 4)) / 2)


def test_the_commands_take_the_plugins_by_name(tmp_path, capsys):
    config = tmp_path / "plugins.toml"
    config.write_text(CONFIG)
    assert main(["run", str(config), "--output", str(tmp_path / "run"), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "muffliato(rounds=3)" in printed and "dsgt(tracker_noise=2.0)" in printed
    results = json.loads(next((tmp_path / "run").rglob("results.json")).read_text())
    labels = {cell["algorithm"] for cell in results["cells"]}
    assert labels == {"muffliato(rounds=3)", "dsgt(tracker_noise=2.0)"}
    assert main(["account", "--algorithm", "dsgt(tracker_noise=2.0)", "--epsilon", "1",
                 "--steps", "50", "--sample-rate", "0.05", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["releases"] == {"model": 1.0, "tracker": 2.0}
    assert summary["epsilon"]["pld"] <= 1.0
    assert main(["audit", "--algorithm", "muffliato(rounds=3)", "--threat", "observer",
                 "--observer", "2", "--nodes", "6", "--topology", "ring", "--epsilon", "2",
                 "--steps", "3", "--sample-rate", "1", "--trials", "20", "--seed", "0",
                 "--no-progress", "--json"]) == 0
    audit = json.loads(capsys.readouterr().out)
    assert audit["design"]["rounds_per_step"] == 3 and audit["epsilon_view"] is not None
    assert main(["audit", "--algorithm", "dsgt", "--threat", "observer", "--observer", "2",
                 "--nodes", "6", "--epsilon", "2", "--steps", "3", "--sample-rate", "1",
                 "--trials", "20", "--seed", "0", "--no-progress", "--json"]) == 0
    audit = json.loads(capsys.readouterr().out)
    assert audit["algorithm"] == "dsgt" and audit["epsilon_view"] is None
    assert main(["audit", "--algorithm", "dsgt", "--threat", "final", "--nodes", "6",
                 "--epsilon", "2", "--steps", "3", "--sample-rate", "1", "--no-progress"]) == 2
    assert "not 'final'" in capsys.readouterr().err


@pytest.mark.parametrize("noise_scale", [1.0, 0.5])
def test_the_observer_audit_scores_both_of_dsgts_releases(noise_scale):
    """At p = 1 the white-box score Σ_k,r (μ_kr s_kr/σ_kr − μ_kr²/2) of the trials' releases
    is N(∓μ²/2, μ²) with μ² = Σ_k,r 1/z_kr² the ledger's claim (every release of every step)
    when the engine adds the claimed noise; at half the noise its spread halves (the scores
    use the claimed σ).  Scoring the model's release alone would give μ/√2 at
    tracker_noise = 1."""
    from dpdl.audit.runner import AuditExecution, run_audit
    from dpdl.audit.trials import AuditDesign

    result = run_audit(
        "dsgt(tracker_noise=1.0)", epsilon=4, delta=1e-5, steps=3, sample_rate=1.0,
        trials=600, design=AuditDesign(threat="observer", nodes=4, topology="ring",
                                       observers=(2,)),
        execution=AuditExecution(seed=3, noise_scale=noise_scale),
    )
    schedule = dpdl.accounting.make_schedule(
        "const-d2p", epsilon=4, delta=1e-5, steps=3, sample_rate=1.0,
        releases={"model": 1.0, "tracker": 1.0})
    mu = math.sqrt(float(np.sum(1 / schedule.release_multipliers ** 2)))
    assert schedule.release_multipliers.size == 6
    scores, members = np.asarray(result.scores), np.asarray(result.members)
    for group in (scores[members], scores[~members]):
        assert np.std(group) == pytest.approx(mu * noise_scale, rel=0.1)
    assert np.mean(scores[~members]) == pytest.approx(-mu * mu / 2, abs=0.25 * mu)
    assert np.mean(scores[members]) == pytest.approx(mu * mu / 2, abs=0.25 * mu)


def test_sweep_tune_and_report_take_the_plugins(tmp_path, capsys):
    config = tmp_path / "tune.toml"
    config.write_text(TUNE)
    assert main(["tune", str(config), "--output", str(tmp_path / "tune"), "--no-progress"]) == 0
    summary = json.loads((tmp_path / "tune" / "tune.json").read_text())
    assert set(summary["candidates"]) == {"muff", "gt"}
    # the released ε composes both of DSGT's releases of every run (more than one each)
    assert summary["privacy"]["runs"] >= 3 and summary["privacy"]["epsilon"] > 4.0
    sweep = tmp_path / "sweep.toml"
    sweep.write_text(CONFIG + '[sweep]\ngrid = { "privacy.epsilon" = [4.0] }\n')
    assert main(["sweep", str(sweep), "--output", str(tmp_path / "sweep"), "--workers", "1",
                 "--no-progress", "--report"]) == 0
    report = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "muffliato(rounds=3)" in report and "dsgt(tracker_noise=2.0)" in report


def test_no_file_under_src_names_the_example_plugins():
    for path in (ROOT / "src" / "dpdl").rglob("*.py"):
        text = path.read_text()
        for name in ("examples/plugins", "examples.plugins", "dsgt", "GradientTracking",
                     "class Muffliato"):
            assert name not in text, f"{path} names {name}"


CONFIG = """
kind = "decentralized"
[experiment]
name = "plugins"
seed = 0
entropy = "seed"
algorithms = ["muffliato(rounds=3)", "dsgt(tracker_noise=2.0)"]
[data]
dataset = "digits"
max_train_records = 200
validation_records = 40
[model]
name = "logreg"
[topology]
name = "ring"
nodes = 4
[training]
steps = 4
batch_size = 4
lr = 0.3
eval_every = 100
[privacy]
epsilon = 4.0
"""

TUNE = CONFIG.replace('algorithms = ["muffliato(rounds=3)", "dsgt(tracker_noise=2.0)"]\n', "") + """
[tune]
selection_seeds = [0]
test_seeds = [5]
workers = 1
[tune.candidates.muff]
algorithm = "muffliato(rounds=3)"
grid = { "training.lr" = [0.3] }
[tune.candidates.gt]
algorithm = "dsgt(tracker_noise=2.0)"
grid = { "training.lr" = [0.3] }
"""


@pytest.mark.xdist_group("multi-process")
def test_the_plugins_run_across_processes_as_in_the_simulator(tmp_path, capsys):
    """Two torchrun-style processes, two nodes each: DSGT's tracker and Muffliato's extra
    rounds go through the point-to-point mixer and give the simulator's numbers."""
    config = tmp_path / "plugins.toml"
    config.write_text(CONFIG)
    finals = {}
    for runtime in ("simulator", "distributed"):
        extra = ["--runtime", "distributed", "--procs", "2"] if runtime == "distributed" else []
        assert main(["run", str(config), "--output", str(tmp_path / runtime), "--no-progress",
                     *extra]) == 0
        results = json.loads(next((tmp_path / runtime).rglob("results.json")).read_text())
        finals[runtime] = {c["algorithm"]: c["final"]["test_accuracy"] for c in results["cells"]}
    capsys.readouterr()
    assert set(finals["simulator"]) == {"muffliato(rounds=3)", "dsgt(tracker_noise=2.0)"}
    assert finals["distributed"] == pytest.approx(finals["simulator"], abs=1e-6)


REPEATS = '''
from dpdl import Algorithm, Release, register_algorithm
from pydantic import BaseModel, ConfigDict


class RefreshSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    refreshes: int = 1


class Twice(Algorithm):
    """Two local updates per step, one release declared: must be refused."""

    name = "twice-test"

    def step(self, context):
        context.local_update()
        half = context.local_update()
        context.mix_model(half.params, context.arguments.mixing_round)
        return half.batch_sizes


class Refresh(Algorithm):
    """Release names distinct only at the default setting."""

    name, Settings = "refresh-test", RefreshSettings

    def releases(self, settings):
        return (Release("model"),) + (Release("tracker"),) * settings.refreshes


register_algorithm(Twice())
register_algorithm(Refresh())
'''


def test_a_step_cannot_draw_a_release_twice_nor_declare_one_name_twice(tmp_path, monkeypatch):
    """The attacker review's F1 and F2: a second draw of a declared release would go
    unrecorded by the ledger; duplicate names would merge in the schedule."""
    plugin = tmp_path / "repeats.py"
    plugin.write_text(REPEATS)
    monkeypatch.setenv(registry.PLUGINS_VARIABLE, str(plugin))
    registry.load_plugins()
    with pytest.raises(dpdl.DPDLError, match="made release 'update' twice"):
        _train("twice-test", steps=2)
    with pytest.raises(dpdl.DPDLError, match="releases must be distinct"):
        _train("refresh-test(refreshes=3)", steps=2)


EDITED = '''
from dpdl import Algorithm, register_algorithm


class Mine(Algorithm):
    name = "mine-test"

    def step(self, context):
        half = context.local_update()
        for name in half.params:
            half.params[name].mul_(SHRINK)
        context.mix_model(half.params, context.arguments.mixing_round)
        return half.batch_sizes


register_algorithm(Mine(), replace=True)
'''


def test_a_plugin_edited_under_its_name_keys_other_noise_and_other_checkpoints(tmp_path):
    """The attacker review's F3: the plugin's code is part of the seeded-noise key."""
    from dpdl.training.plan import noise_root

    digests = []
    for shrink in ("1.0", "0.99"):
        plugin = tmp_path / f"mine_{shrink.replace('.', '_')}.py"
        plugin.write_text(EDITED.replace("SHRINK", shrink))
        registry._import(str(plugin))
        torch.manual_seed(0)
        trainer = dpdl.DecentralizedTrainer(torch.nn.Linear(5, 2), _nodes(), topology="ring",
                                            algorithm="mine-test", epsilon=4.0, steps=4,
                                            batch_size=4, lr=0.3, entropy="seed", seed=1)
        digests.append((noise_root("seed", 1, trainer.stream_settings()), trainer.run_digest()))
    assert digests[0][0] != digests[1][0] and digests[0][1] != digests[1][1]


def test_the_mixing_digest_covers_every_round_of_a_multi_round_step():
    """The attacker review's F4: R rounds per step use graphs past the step count."""
    from dpdl.training.fingerprints import mixing_digest

    class Phases:
        n, period = 4, 4

        def __init__(self, last):
            self.last = last

        def circulant(self, k):
            return None

        def mixing_matrix(self, k):
            return np.eye(4) if k < 3 else self.last

    a, b = Phases(np.eye(4)), Phases(np.full((4, 4), 0.25))
    assert mixing_digest(a, 2) == mixing_digest(b, 2)  # 2 rounds: phase 3 unused
    assert mixing_digest(a, 2 * 2) != mixing_digest(b, 2 * 2)  # R = 2: it is used
