"""The experiment-kind registry (issue 40, item 4): one ExperimentKind per kind, each shipping
its presets in its own package, and a kind registered in one call."""

import importlib.util
import json
import re
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

import dpdl
from dpdl.errors import DPDLError
from dpdl.experiments.registry import (
    DEFAULT_KIND,
    EXPERIMENT_KINDS,
    PRESETS_DIR,
    ExperimentKind,
    experiment_kind,
    experiment_module,
    load_config_file,
    preset_names,
    preset_path,
    register_experiment_kind,
    unregister_experiment_kind,
    validate_experiment_config,
)

SRC = Path(dpdl.__file__).parent
# Every preset shipped before the presets moved into their kinds' packages.
SHIPPED = {
    "default", "fashion-mnist", "figure4", "figure5a", "figure5b", "figure5b-per-node",
    "select-rho", "table1", "table2", "table2-quick", "tune-table2", "linreg",
    "linreg-rates-1", "linreg-rates-sqrt", "netdp-figure2", "netdp-logreg", "fdp-decor-figure3",
    "fdp-rw-digits", "fdp-rw-fashion-2048", "fdp-rw-fashion-256", "fdp-rw-fashion-mlp-256",
    "fdp-rw-logreg",
}  # fmt: skip


def test_the_shipped_kinds_are_one_registry():
    assert list(EXPERIMENT_KINDS) == [DEFAULT_KIND, "linreg", "netdp-logreg", "fdp-random-walk"]
    for name, kind in EXPERIMENT_KINDS.items():
        assert kind.name == name and importlib.util.find_spec(kind.module) is not None
        module, _, function = kind.validator.partition(":")
        assert importlib.util.find_spec(module) is not None and function
    tuned = [name for name, kind in EXPERIMENT_KINDS.items() if kind.tunes]
    assert tuned == [DEFAULT_KIND] == [n for n, k in EXPERIMENT_KINDS.items() if k.distributed]
    with pytest.raises(DPDLError, match="unknown experiment kind 'nope'"):
        experiment_kind("nope")
    plugin = experiment_kind("mylab.experiments.custom")  # a module path: a plugin kind
    assert (plugin.module, plugin.validator, plugin.presets_dir()) == (
        "mylab.experiments.custom", None, None)


def test_every_kind_ships_its_own_presets():
    assert set(preset_names()) == SHIPPED
    for name, kind in EXPERIMENT_KINDS.items():
        folder = kind.presets_dir()
        package = SRC.joinpath(*kind.presets.split(".")[1:])
        assert folder == package / "presets"
        for path in folder.glob("*.toml"):
            assert preset_path(path.stem) == path
            config = tomllib.loads(path.read_text())
            assert config.get("kind", DEFAULT_KIND) == name, path  # a kind's presets are its
    assert EXPERIMENT_KINDS[DEFAULT_KIND].presets_dir() == PRESETS_DIR
    for extension in ("linreg", "netdp", "fdp"):  # each extension's, inside its package
        assert list((SRC / "extensions" / extension / "presets").glob("*.toml"))
    assert not list(PRESETS_DIR.glob("linreg*.toml")) + list(PRESETS_DIR.glob("netdp*.toml"))


def test_the_presets_travel_with_the_wheel():
    data = tomllib.loads((SRC.parents[1] / "pyproject.toml").read_text())
    globs = data["tool"]["setuptools"]["package-data"]["dpdl"]
    for path in SRC.rglob("presets/*.toml"):
        relative = path.relative_to(SRC)
        assert any(relative.match(glob) for glob in globs), relative


@pytest.fixture
def my_kind(tmp_path, monkeypatch):
    """A plugin package outside dpdl: its experiment module and its presets folder."""
    package = tmp_path / "mykinds"
    (package / "presets").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "experiment.py").write_text(textwrap.dedent('''
        import json
        from pathlib import Path

        def check(config):
            from dpdl.errors import require
            require(isinstance(config.get("message"), str), "message: a string, please")
            return config

        def run_experiment(config, output_dir, *, progress=True):
            check(config)
            folder = Path(output_dir) / "echo"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "echo.json").write_text(json.dumps(config))
            return {"run_dir": str(folder)}
    '''))
    (package / "presets" / "echo-hello.toml").write_text(
        '# Says hello. Nothing else.\nkind = "echo"\nmessage = "hello"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    kind = register_experiment_kind(ExperimentKind(
        "echo", "mykinds.experiment", "mykinds.experiment:check", presets="mykinds"))
    yield kind
    unregister_experiment_kind("echo")
    for name in [m for m in sys.modules if m.split(".")[0] == "mykinds"]:
        del sys.modules[name]  # the next test's package lies in another folder


def test_a_kind_registers_in_one_call_with_its_presets(my_kind, tmp_path, capsys):
    from dpdl.cli import main

    assert "echo-hello" in preset_names()
    assert load_config_file(preset="echo-hello") == {"kind": "echo", "message": "hello"}
    assert experiment_module("echo").__name__ == "mykinds.experiment"
    with pytest.raises(DPDLError, match="message: a string"):
        validate_experiment_config({"kind": "echo", "message": 3})
    assert main(["run", "--list-presets"]) == 0
    assert re.search(r"^echo-hello +Says hello\.$", capsys.readouterr().out, re.M)
    assert main(["run", "--preset", "echo-hello", "--output", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "echo" / "echo.json").read_text())
    assert written["message"] == "hello"
    with pytest.raises(DPDLError, match="already registered"):
        register_experiment_kind(my_kind)


def test_a_preset_name_shipped_twice_is_refused(my_kind, tmp_path):
    (tmp_path / "mykinds" / "presets" / "default.toml").write_text('kind = "echo"\n')
    with pytest.raises(DPDLError, match="preset 'default' is shipped twice"):
        preset_names()
