"""The extensions' independence contract (docs/ARCHITECTURE.md): each package under
``dpdl/extensions`` imports no other extension, not even inside a function or by a dotted
string handed to importlib; and import-linter's contract names every one of them."""

import ast
import tomllib
from pathlib import Path

import dpdl

EXTENSIONS = Path(dpdl.__file__).parent / "extensions"


def _packages() -> list[str]:
    return sorted(p.name for p in EXTENSIONS.iterdir() if (p / "__init__.py").is_file())


def _imported(path: Path, package: str) -> set[str]:
    """Every module ``path`` imports (relative imports resolved), and every string constant
    that names a dpdl module (what importlib.import_module would be handed)."""
    parts = ["dpdl", "extensions", package, *path.relative_to(EXTENSIONS / package).parts]
    here = parts[:-1]  # the package a relative import starts from (a module's, __init__'s own)
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names |= {f"{module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("dpdl."):
            names.add(node.value.partition(":")[0])
    return names


def test_there_are_extensions_to_check():
    assert {"fdp", "linreg", "netdp"} <= set(_packages())


def test_no_extension_imports_another():
    packages = _packages()
    offences = []
    for package in packages:
        others = [f"dpdl.extensions.{other}" for other in packages if other != package]
        for path in sorted((EXTENSIONS / package).rglob("*.py")):
            for name in _imported(path, package):
                if any(name == other or name.startswith(other + ".") for other in others):
                    offences.append(f"{path.relative_to(EXTENSIONS)} imports {name}")
    assert not offences, offences


def test_the_relative_import_resolution_catches_an_offence(tmp_path):
    """The checker itself: a relative import reaching a sibling extension is found."""
    fake = tmp_path / "linreg"
    fake.mkdir()
    module = fake / "algorithm.py"
    module.write_text("from ..netdp import accounting\nimport dpdl.extensions.fdp.tradeoff\n")
    global EXTENSIONS
    saved, EXTENSIONS = EXTENSIONS, tmp_path
    try:
        names = _imported(module, "linreg")
    finally:
        EXTENSIONS = saved
    assert {"dpdl.extensions.netdp", "dpdl.extensions.fdp.tradeoff"} <= names


def test_import_linter_guards_every_extension():
    pyproject = tomllib.loads((EXTENSIONS.parents[2] / "pyproject.toml").read_text())
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    independence = [c for c in contracts if c["type"] == "independence"
                    and all(m.startswith("dpdl.extensions.") for m in c["modules"])]  # fmt: skip
    assert len(independence) == 1
    assert sorted(independence[0]["modules"]) == [f"dpdl.extensions.{p}" for p in _packages()]
