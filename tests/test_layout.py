"""The package's shape (docs/architecture.md, "Layers"): small functions, one name per
class, so that a newcomer reads each rule in one place and finds it by its name. The
direction of imports and the absence of cycles are import-linter's contracts (`make lint`,
pyproject.toml); this checks what they do not.

A module's size is a guide, not a check (docs/architecture.md, "Module size"): about 800
lines is a hint to look for a seam, never a reason to split or to pack code. A function's
size is counted in statements, which the formatter cannot change, so code is never bent
onto fewer lines to pass."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import saga_engine

PACKAGE = Path(saga_engine.__file__).parent
MAX_FUNCTION_STATEMENTS = 55


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def _statements(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    return sum(1 for node in ast.walk(fn) if isinstance(node, ast.stmt)) - 1


def _long_functions(tree: ast.AST, where: str) -> dict[str, int]:
    long = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if (n := _statements(node)) > MAX_FUNCTION_STATEMENTS:
            long[f"{where}:{node.lineno} {node.name}"] = n
    return long


def _class_homes(paths: list[Path], root: Path) -> dict[str, list[str]]:
    homes: dict[str, list[str]] = defaultdict(list)
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                homes[node.name].append(f"{path.relative_to(root)}:{node.lineno}")
    return homes


def test_functions_have_at_most_55_statements() -> None:
    long: dict[str, int] = {}
    for path in _modules():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        long |= _long_functions(tree, str(path.relative_to(PACKAGE.parent)))
    assert not long, f"split these functions where their steps part: {long}"


def test_no_two_classes_share_a_name() -> None:
    shared = {
        name: homes
        for name, homes in _class_homes(_modules(), PACKAGE.parent).items()
        if len(homes) > 1
    }
    assert not shared, f"give each class a name of its own: {shared}"


def test_no_fmt_skip_bends_the_formatting() -> None:
    marked = [
        f"{p.relative_to(PACKAGE.parent)}:{i}"
        for p in _modules()
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert not marked, f"let the formatter format these: {marked}"


def test_the_checks_see_what_they_measure(tmp_path: Path) -> None:
    # A function of 56 statements is found, however its lines are packed; two classes of
    # one name in two modules are found; the walk is not vacuous.
    body = "; ".join(f"x{i} = {i}" for i in range(56))
    assert _long_functions(ast.parse(f"def f():\n    {body}\n"), "m") == {"m:1 f": 56}
    assert (
        _long_functions(ast.parse(f"def f():\n    {body.replace('; x55 = 55', '')}\n"), "m") == {}
    )
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text("class Twice:\n    pass\n")
    homes = _class_homes(sorted(tmp_path.glob("*.py")), tmp_path)
    assert homes == {"Twice": ["a.py:1", "b.py:1"]}
    assert len(_modules()) > 50
