"""Issue 40: no function in src/dpdl takes more than 12 parameters (positional, keyword-only,
*args and **kwargs, self included); related settings travel as one small frozen dataclass."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_PARAMETERS = 12
SRC = Path(__file__).resolve().parents[1] / "src" / "dpdl"

# Over the limit and not yet bundled: none left (the set may only shrink).
NOT_YET: set[str] = set()


def _count(args: ast.arguments) -> int:
    return (len(args.posonlyargs) + len(args.args) + len(args.kwonlyargs)
            + (args.vararg is not None) + (args.kwarg is not None))  # fmt: skip


def _functions(tree: ast.AST, prefix: str = ""):
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield f"{prefix}{node.name}", node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def _over_the_limit() -> dict[str, int]:
    found = {}
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node in _functions(tree):
            count = _count(node.args)
            if count > MAX_PARAMETERS:
                found[f"{path.relative_to(SRC).as_posix()}:{name}"] = count
    return found


def test_no_function_takes_more_than_twelve_parameters():
    offenders = {k: v for k, v in _over_the_limit().items() if k not in NOT_YET}
    assert not offenders, (
        f"functions with more than {MAX_PARAMETERS} parameters (bundle related ones into a "
        "frozen dataclass): " + ", ".join(f"{k} ({v})" for k, v in sorted(offenders.items()))
    )


def test_the_not_yet_list_only_shrinks():
    stale = NOT_YET - set(_over_the_limit())
    assert not stale, f"now within the limit, remove from NOT_YET: {sorted(stale)}"
