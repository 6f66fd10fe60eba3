"""Issue 38, ``tune_validation_union.py``: the validation records of ``dpdl tune`` must be one
set for every seed of the tuning.

The attack counts the training-split records that are a "public" validation record in one
run and a private training record in another run of the same tuning (on main: 50.1 % of
Fashion-MNIST's training split, over the tune-table2 preset's eight seeds).  Here it runs on
the very cell configs ``dpdl tune`` gives its selection and test sweeps, through the run's
own ``prepare_workload``, on a 60000-record stand-in of the loader whose record i carries i
in its first pixel (so the held-out ids are visible and no download is needed).  The union
of the validation sets over the seeds must equal each seed's set.
"""

from __future__ import annotations

import numpy as np
import pytest

import dpdl.data as data_module
import dpdl.experiments.runner as runner
from dpdl.data.dataset import Dataset
from dpdl.experiments.config import parse_config
from dpdl.experiments.registry import load_config_file
from dpdl.experiments.sweep import cell_config, expand_grid, split_sweep
from dpdl.experiments.tune import _selection_sweep, _test_sweep, split_tune

N = 60000


def stand_in(name, *, data_dir=None, download=False, seed=0):
    """Fashion-MNIST's sizes; record i's first pixel is i."""
    x = np.zeros((N, 1, 2, 2), dtype=np.float32)
    x[:, 0, 0, 0] = np.arange(N)
    y = np.arange(N) % 10
    return Dataset(name="fashion-mnist", task="classification", x_train=x, y_train=y,
                   x_test=x[:100], y_test=y[:100], num_classes=10, input_shape=(1, 2, 2))


@pytest.fixture
def tune_cells(monkeypatch):
    """Every seed's cell config of the tune-table2 preset's sweeps: a selection cell per
    selection seed and a test cell per test seed (the first grid point and baseline)."""
    monkeypatch.setattr(data_module, "load_dataset", stand_in)  # prepare_workload's import
    base, tune = split_tune(load_config_file(preset="tune-table2"))
    cand = next(iter(tune["candidates"].values()))
    baseline = next(iter(tune["baselines"].values()))
    cells = {}
    for sweep_config in (_selection_sweep(base, tune, cand),
                         _test_sweep(base, tune, baseline["algorithm"], baseline["set"], 1.0)):
        b, sweep = split_sweep(sweep_config)
        for cell in expand_grid(sweep):
            config = parse_config(cell_config(b, cell))
            config.model.name = "logreg"  # the split does not depend on the model
            cells.setdefault(config.experiment.seed, config)
    assert sorted(cells) == sorted(tune["selection_seeds"] + tune["test_seeds"])
    return cells


def validation_ids(config, seed: int) -> set[int]:
    work = runner.prepare_workload(config, seed)
    train = work.node_data.inputs[work.node_data.mask][:, 0, 0, 0].long().tolist()
    held = work.x_val[:, 0, 0, 0].long().tolist()
    assert not set(train) & set(held)  # within one run, the hold-out is never trained on
    return set(held)


def test_no_record_is_validation_in_one_run_and_training_in_another(tune_cells):
    validation = {seed: validation_ids(cfg, seed) for seed, cfg in tune_cells.items()}
    sizes = {len(v) for v in validation.values()}
    assert sizes == {5000}
    union = set().union(*validation.values())
    trained_elsewhere = {i for i in union if any(i not in v for v in validation.values())}
    assert not trained_elsewhere, (
        f"{len(trained_elsewhere)} of {N} records are validation records in one seed's run "
        f"and training records in another's ({len(union)} in the union of the hold-outs)")


def test_the_hold_out_does_not_follow_max_train_records_either(tune_cells):
    """A run that also caps its training records (a seeded subsample) holds out the same
    validation records as one that does not."""
    seed, config = next(iter(tune_cells.items()))
    full = validation_ids(config, seed)
    for other in (seed, seed + 1):
        capped = config.model_copy(deep=True)
        capped.data.max_train_records = 20000
        assert validation_ids(capped, other) == full
