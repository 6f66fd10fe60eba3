"""A site's ledger across runs (issue 39, Build item 4): every run on the same records is
recorded before it trains and composed with the others; the reference ε is dp_accounting's
own PLD accountant over the concatenated events, built here from the runs' schedules."""

from __future__ import annotations

import json

import dp_accounting
import numpy as np
import pytest
import torch
from torch import nn

import dpdl
from dpdl.cli import main
from dpdl.training.site_ledger import LEDGER_FILE, compose_site, read_entries

pytestmark = pytest.mark.usefixtures("one_thread")

DELTA = 1e-5
RATE = 0.2  # add-remove: the rate is a hyper-parameter, the same at every node


def records(seed, n=60):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.integers(0, 2, size=n)


def split(x, y, nodes):
    return [(x[i::nodes], y[i::nodes]) for i in range(nodes)]


def trainer(data, site, epsilon, steps, **options):
    torch.manual_seed(0)
    return dpdl.DecentralizedTrainer(
        nn.Linear(4, 2), data, topology="complete", algorithm="const-d2p", epsilon=epsilon,
        delta=DELTA, neighboring="add-remove", sample_rate=RATE, batch_size=4, lr=0.1,
        steps=steps, output_dir=site, entropy="seed", seed=0, **options)  # fmt: skip


def events(trainer_):
    schedule = trainer_.schedule
    assert schedule.sample_rate == RATE
    # const-d2p: one multiplier, repeated (a self-composition: dp_accounting's fast path)
    (z,) = set(schedule.noise_multipliers.tolist())
    step = dp_accounting.PoissonSampledDpEvent(RATE, dp_accounting.GaussianDpEvent(z))
    return [dp_accounting.SelfComposedDpEvent(step, schedule.steps)]


def reference_epsilon(all_events):
    # the site ledger's grid (3e-4); dp_accounting's own pessimistic PLD on it
    accountant = dp_accounting.pld.PLDAccountant(
        dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE, value_discretization_interval=3e-4)
    accountant.compose(dp_accounting.ComposedDpEvent(all_events))
    return accountant.get_epsilon(DELTA)


class Crash(RuntimeError):
    pass


def crash(_evaluation):
    raise Crash("the site lost power")


def test_runs_on_the_same_records_compose_and_another_data_set_is_its_own(tmp_path, capsys):
    site = tmp_path / "site"
    x, y = records(0)
    first = trainer(split(x, y, 3), site, 1.0, 6)
    # the same records split otherwise (a sweep's other seed): the same data set
    second = trainer(split(x[::-1], y[::-1], 2), site / "sweep" / "cell", 0.5, 4)
    crashed = trainer(split(x, y, 3), site, 0.7, 5, eval_every=1,
                      eval_data=(x[:8], y[:8]), callbacks=[crash])  # fmt: skip
    other = trainer(split(*records(1), 3), site, 1.0, 6)
    first.fit()
    second.fit()
    with pytest.raises(Crash):
        crashed.fit()
    other.fit()

    entries = read_entries(site)
    # the site's own file (first, crashed, other), then the subfolder's (second)
    assert [e.records for e in entries] == [60] * 4
    assert (site / "sweep" / "cell" / LEDGER_FILE).is_file()
    assert entries[0].fingerprint == entries[1].fingerprint == entries[3].fingerprint
    assert entries[2].fingerprint != entries[0].fingerprint

    totals, site_total = compose_site(site)
    by_runs = {t.runs: t for t in totals}
    same = by_runs[3]
    expected = reference_epsilon(events(first) + events(crashed) + events(second))
    assert same.epsilon == pytest.approx(expected, rel=2e-3)
    # more than the largest run's own target: the composition is not one run relabelled
    assert same.epsilon > 1.0 + 0.1
    assert by_runs[1].epsilon == pytest.approx(reference_epsilon(events(other)), rel=2e-3)
    assert site_total.runs == 4 and site_total.epsilon == pytest.approx(
        reference_epsilon(events(first) + events(crashed) + events(second) + events(other)),
        rel=2e-3)  # fmt: skip

    assert main(["ledger", str(site), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert sorted(d["runs"] for d in printed["data_sets"]) == [1, 3]
    assert printed["site_total"]["epsilon"] == pytest.approx(site_total.epsilon)


def test_a_non_private_run_makes_its_data_set_unbounded(tmp_path):
    x, y = records(0)
    torch.manual_seed(0)
    dpdl.train(nn.Linear(4, 2), split(x, y, 2), topology="complete", algorithm="sgp",
               batch_size=4, lr=0.1, steps=2, output_dir=tmp_path)  # fmt: skip
    (total,), _ = compose_site(tmp_path)
    assert total.non_private == 1 and total.epsilon == float("inf")


def test_a_torn_last_line_is_a_run_that_never_trained(tmp_path):
    x, y = records(0)
    trainer(split(x, y, 2), tmp_path, 1.0, 3).fit()
    with open(tmp_path / LEDGER_FILE, "a") as fh:
        fh.write('{"schema": 1, "run": "tor')
    assert len(read_entries(tmp_path)) == 1
    with open(tmp_path / LEDGER_FILE, "a") as fh:
        fh.write('\n{}\n')  # the torn line is no longer the last: the file was tampered with
    with pytest.raises(dpdl.DPDLError, match="corrupt site-ledger line"):
        read_entries(tmp_path)


def test_repeated_schedules_and_rates_compose_as_dp_accounting_says(tmp_path):
    """A sweep's seeds repeat a schedule (composed as one PLD with itself), another run samples
    at another rate: the total is dp_accounting's for the concatenated events."""
    from dpdl.training.site_ledger import SiteEntry, append_entry

    def entry(rate, runs):
        return SiteEntry("r", "d", "f" * 64, 50, True, rate, "add-remove", DELTA, ("update",),
                         tuple(runs))  # fmt: skip

    seeds = entry(0.1, [(1.2, 6), (0.9, 3)])
    other = entry(0.05, [(0.8, 8)])
    for one in (seeds, seeds, seeds, other):
        append_entry(tmp_path, one)

    def events(rate, runs):
        step = [dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(
            rate, dp_accounting.GaussianDpEvent(z)), count) for z, count in runs]
        return step

    three_seeds = dp_accounting.SelfComposedDpEvent(
        dp_accounting.ComposedDpEvent(events(0.1, [(1.2, 6), (0.9, 3)])), 3)
    expected = reference_epsilon([three_seeds, *events(0.05, [(0.8, 8)])])
    (total,), _ = compose_site(tmp_path)
    assert total.runs == 4 and total.epsilon == pytest.approx(expected, rel=2e-3)
