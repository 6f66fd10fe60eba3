"""privacy.correlation through the trainer and a run folder (issue 41): validated, digested
into the seeded noise key and the checkpoint digest, recorded in results.json; a default run
describes itself as before the setting existed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.errors import DPDLError
from dpdl.training.settings import PrivacySection, validate_config

pytestmark = pytest.mark.usefixtures("one_thread")

NODES, FEATURES, CLASSES = 5, 6, 3


def node_sets(seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(12, FEATURES)).astype(np.float32),
             rng.integers(0, CLASSES, size=12)) for _ in range(NODES)]  # fmt: skip


def trainer(**options):
    torch.manual_seed(0)
    settings = dict(topology="exp", algorithm="const-d2p", epsilon=4.0, steps=4, batch_size=3,
                    lr=0.3, eval_every=4, entropy="seed", seed=1, calibrate="clt",
                    certified_accountant="rdp")  # fmt: skip
    return dpdl.DecentralizedTrainer(nn.Linear(FEATURES, CLASSES), node_sets(),
                                     **(settings | options))  # fmt: skip


def one_line(excinfo) -> str:
    assert "\n" not in str(excinfo.value)
    return str(excinfo.value)


def test_bad_correlation_settings_are_refused_naming_the_value():
    with pytest.raises(DPDLError) as err:
        validate_config(PrivacySection, {"correlation": "pairwise"})
    assert "correlation_factor" in one_line(err) and "None" in one_line(err)
    with pytest.raises(DPDLError, match="unknown noise correlation 'zip'"):
        validate_config(PrivacySection, {"correlation": "zip"})
    with pytest.raises(DPDLError, match=r"correlation_factor \(2.0\) scales correlated noise"):
        validate_config(PrivacySection, {"correlation_factor": 2.0})
    with pytest.raises(DPDLError, match=r"correlation_factor: .*\(got -1.0\)"):
        validate_config(PrivacySection, {"correlation": "pairwise", "correlation_factor": -1.0})
    with pytest.raises(DPDLError) as err:
        trainer(algorithm="sgp", epsilon=None, correlation="pairwise", correlation_factor=1.0)
    assert "'sgp' is not private" in one_line(err)


def test_the_setting_enters_the_noise_key_and_digest_only_when_set():
    plain, decor = trainer(), trainer(correlation="pairwise", correlation_factor=2.0)
    assert "correlation" not in plain.describe()["privacy"]  # as before the setting existed
    assert "correlation_factor" not in plain.stream_settings()["privacy"]
    shown = decor.stream_settings()["privacy"]
    assert (shown["correlation"], shown["correlation_factor"]) == ("pairwise", 2.0)
    other = trainer(correlation="pairwise", correlation_factor=3.0)
    assert len({plain.run_digest(), decor.run_digest(), other.run_digest()}) == 3
    # the ledger accounts the independent part alone: the same schedule and sigma
    assert np.array_equal(plain.schedule.sigma, decor.schedule.sigma)


def test_a_seeded_decor_run_is_reproducible_differs_and_says_what_it_is(tmp_path):
    plain = trainer().fit()
    one = trainer(correlation="pairwise", correlation_factor=2.0, output_dir=tmp_path).fit()
    two = trainer(correlation="pairwise", correlation_factor=2.0).fit()
    for a, b, c in zip(one.model.parameters(), two.model.parameters(),
                       plain.model.parameters(), strict=True):  # fmt: skip
        assert torch.equal(a, b) and not torch.equal(a, c)
    assert one.epsilon == plain.epsilon  # the ledger: σ_k alone, as for independent noise
    record = json.loads((one.run_dir / "results.json").read_text())["cells"][0]
    assert record["noise_correlation"] == {"name": "pairwise", "correlation_factor": 2.0}
    assert record["trust_model"] == "curious-neighbours"
    assert plain.record.noise_correlation == {"name": "independent"}
    trainer_json = json.loads((one.run_dir / "trainer.json").read_text())
    assert trainer_json["privacy"]["correlation"] == "pairwise"
    assert not any("pairwise" in p.name for p in one.run_dir.rglob("*"))



def test_decor_then_r_gossip_rounds_with_the_muffliato_plugin(monkeypatch):
    """Noise once (DECOR's release), then R rounds without fresh noise: a registered step's
    first release is correlated; the run is reproducible and not independent noise's."""
    from pathlib import Path

    from dpdl.algorithms import registry

    plugin = Path(__file__).resolve().parents[2] / "examples" / "plugins" / "muffliato.py"
    monkeypatch.setenv(registry.PLUGINS_VARIABLE, str(plugin))
    registry.load_plugins()
    pairwise = {"correlation": "pairwise", "correlation_factor": 2.0}
    runs = [trainer(algorithm="muffliato(rounds=3)", **options).fit()
            for options in (pairwise, pairwise, {})]
    for a, b, c in zip(*(run.model.parameters() for run in runs), strict=True):
        assert torch.equal(a, b) and not torch.equal(a, c)
    assert runs[0].record.noise_correlation == {"name": "pairwise", "correlation_factor": 2.0}


def test_an_os_entropy_decor_run_resumes_with_its_checkpointed_pairwise_keys(tmp_path):
    """Crash after step 4's evaluation; the resume starts from step 2's checkpoint and replays
    steps 2-3: its row at 4 is the first run's only if the same pairwise secrets come back
    (fresh OS keys would give other ones)."""
    import csv

    settings = dict(entropy="os", correlation="pairwise", correlation_factor=3.0, steps=6,
                    eval_every=2, checkpoint_every=2, output_dir=tmp_path, run_name="r",
                    eval_data=node_sets(seed=5)[0])  # fmt: skip

    def crash_at_4(evaluation):
        if evaluation.iteration == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        trainer(callbacks=[crash_at_4], **settings).fit()
    first = list(csv.DictReader((tmp_path / "r" / "metrics.csv").open()))
    resumed = trainer(resume=True, **settings).fit()
    assert [row["iteration"] for row in resumed.history] == [0, 2, 4, 6]
    assert float(first[2]["test_loss"]) == resumed.history[2]["test_loss"]  # step 4 replayed
    assert not (tmp_path / "r" / "checkpoints" / "run.pt").exists()  # the keys do not outlive it


def test_zero_sum_noise_trains_and_is_refused_where_the_runtime_cannot_carry_shares():
    from dpdl.algorithms.correlated import undirected_neighbours
    from dpdl.engine.runtime import LocalRuntime

    run = trainer(correlation="neighbourhood-zero-sum", correlation_factor=1.0)
    described = run.describe()["privacy"]
    assert described["correlation"] == "neighbourhood-zero-sum"
    shares, plain = run.fit().record.communication, trainer().fit().record.communication
    # each step, one float64 share of the d = 21 parameters to every undirected neighbour
    from dpdl.topology.graphs import make_topology

    topology = make_topology("exp", NODES)
    degrees = sum(np.array([len(p) for p in undirected_neighbours(topology.mixing_matrix(k),
                                                                  range(NODES))])
                  for k in range(4))  # fmt: skip
    sent = {key: np.subtract(shares[key], plain[key]) for key in shares}
    assert np.array_equal(sent["messages_per_node"], degrees) and degrees.sum() > 0
    assert np.array_equal(sent["bytes_per_node"], degrees * 21 * 8)

    class Broadcasting(LocalRuntime):  # a runtime whose transport carries broadcast rows only
        name, carries_private_shares = "broadcasting", False

    with pytest.raises(DPDLError) as err:
        trainer(correlation="neighbourhood-zero-sum", correlation_factor=1.0,
                runtime=Broadcasting()).fit()
    assert "the broadcasting runtime cannot carry them" in one_line(err)
    with pytest.raises(DPDLError) as err:
        validate_config(PrivacySection, {"correlation": "neighbourhood-zero-sum",
                                         "correlation_factor": 1.0, "trust_model": "sec-ldp"})
    assert "needs correlation 'pairwise'" in one_line(err)
