"""The reproduction presets (issue 5): every cell of every sweep preset is a valid config,
and the presets encode the paper's settings (MATH.md §4)."""

import pytest

from dpdl.experiments.config import parse_config
from dpdl.experiments.registry import load_config_file, preset_names
from dpdl.experiments.sweep import cell_config, expand_grid, split_sweep

SWEEP_PRESETS = ("table1", "table2", "table2-quick", "figure4", "figure5a", "figure5b")
TABLE2_ALGORITHMS = {"sgp"} | {
    f"{name}@{calibration}"
    for name in ("const-d2p", "dyn-c-d2p", "dyn-mu-d2p", "dyn-d2p")
    for calibration in ("clt", "pld")
}


def _cells(preset: str):
    base, sweep = split_sweep(load_config_file(preset=preset))
    return [parse_config(cell_config(base, cell)) for cell in expand_grid(sweep)]


def test_the_sweep_presets_are_shipped():
    assert set(SWEEP_PRESETS) <= set(preset_names())


@pytest.mark.parametrize("preset", SWEEP_PRESETS)
def test_every_cell_of_a_preset_validates(preset):
    cells = _cells(preset)
    assert cells
    for cfg in cells:
        assert cfg.privacy.delta == 1e-4
        assert cfg.topology.name in ("ring", "exp", "complete")


def _covered(cells):
    """Every (algorithm, seed, epsilon) run the cells produce; SGP has no epsilon."""
    return {
        (algorithm, seed, None if algorithm == "sgp" else eps)
        for cfg in cells
        for algorithm in cfg.experiment.algorithms
        for seed in cfg.experiment.seeds
        for eps in cfg.privacy.epsilons
    }


@pytest.mark.parametrize(
    "preset, epsilons", [("table2", (0.3, 1.0)), ("table1", (0.3, 0.5, 1.0, 2.0))]
)
def test_tables_cover_five_algorithms_both_calibrations_five_seeds(preset, epsilons):
    cells = _cells(preset)
    runs = _covered(cells)
    expected = {
        (a, s, None if a == "sgp" else e)
        for a in TABLE2_ALGORITHMS
        for s in range(5)
        for e in epsilons
    }
    assert runs == expected
    # no run is trained twice by two cells
    trained = sum(
        len(c.experiment.seeds) * (1 if a == "sgp" else len(c.privacy.epsilons))
        for c in cells
        for a in c.experiment.algorithms
    )
    assert trained == len(runs)
    for cfg in cells:
        assert cfg.topology.nodes == 20 and cfg.topology.name == "exp"
        assert cfg.training.batch_size == 1


def test_table2_is_the_shallow_cnn_on_fashion_mnist():
    for cfg in _cells("table2"):
        assert (cfg.data.dataset, cfg.model.name, cfg.training.lr) == ("fashion-mnist", "cnn", 0.03)


def test_table1_is_resnet18_groupnorm_on_cifar10_for_a_gpu():
    for cfg in _cells("table1"):
        assert (cfg.data.dataset, cfg.model.name, cfg.training.lr) == (
            "cifar10",
            "resnet18-gn",
            0.05,
        )
        assert cfg.experiment.device == "cuda"


def test_table2_quick_is_small_and_covers_both_calibrations():
    cells = _cells("table2-quick")
    assert len(cells) >= 2  # two workers have something to share
    for cfg in cells:
        assert set(cfg.experiment.algorithms) == TABLE2_ALGORITHMS
        assert cfg.privacy.epsilons == [0.3, 0.5, 1.0, 2.0]
        assert cfg.data.dataset == "digits" and cfg.training.steps <= 500


def test_figure_grids():
    figure4 = _cells("figure4")
    pairs = {(c.privacy.rho_c, c.privacy.rho_mu) for c in figure4}
    assert len(pairs) >= 9 and all(rc > 1 and rm > 1 for rc, rm in pairs)
    assert all("dyn-d2p@clt" in c.experiment.algorithms for c in figure4)
    assert {c.topology.name for c in _cells("figure5a")} == {"ring", "complete"}
    assert {c.topology.nodes for c in _cells("figure5b")} == {10, 40}
    per_node = {(c.topology.nodes, c.data.max_train_records) for c in _cells("figure5b-per-node")}
    assert per_node == {(10, 15000), (20, 30000)}


def _run_settings(cfg, **changes):
    """Everything that decides a run's numbers, less the experiment's name and algorithm list."""
    settings = cfg.model_copy(update=changes).model_dump()
    settings["experiment"].pop("name")
    settings["experiment"].pop("algorithms")
    return settings


def test_the_figure5_points_shared_with_table2_are_the_same_runs():
    # Figure 5a's exponential graph and figure 5b's n = 20 are read from the table2 sweep, and
    # figure5b-per-node's n = 40 (all 60 000 records) from figure5b: only valid while the
    # settings agree.
    table2 = {
        s: c
        for c in _cells("table2")
        for s in c.experiment.seeds
        if c.experiment.algorithms == ["const-d2p@pld"]
    }
    for preset in ("figure5a", "figure5b"):
        for cfg in _cells(preset):
            assert cfg.experiment.algorithms == ["const-d2p@pld", "dyn-d2p@pld"]
            assert cfg.privacy.epsilons == [0.3]
            (seed,) = cfg.experiment.seeds
            assert seed in table2
            as_table2 = cfg.model_copy(
                update={"topology": table2[seed].topology, "privacy": table2[seed].privacy}
            )
            assert _run_settings(as_table2) == _run_settings(table2[seed])
            assert cfg.privacy.model_dump() == {
                **table2[seed].privacy.model_dump(),
                "epsilon": cfg.privacy.epsilon,
            }
    figure5b = {c.experiment.seeds[0]: c for c in _cells("figure5b") if c.topology.nodes == 40}
    for cfg in _cells("figure5b-per-node"):
        (seed,) = cfg.experiment.seeds
        whole = cfg.model_copy(
            update={"topology": figure5b[seed].topology, "data": figure5b[seed].data}
        )
        assert _run_settings(whole) == _run_settings(figure5b[seed])
