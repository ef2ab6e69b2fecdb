"""The package's shape (docs/architecture.md, "Layers"): small modules and functions, so
that a newcomer reads each rule in one place. The direction of imports and the absence of
cycles are import-linter's contracts (`make lint`, pyproject.toml); this checks sizes."""

from __future__ import annotations

import ast
from pathlib import Path

import saga_engine

PACKAGE = Path(saga_engine.__file__).parent
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_modules_have_at_most_600_lines() -> None:
    long = {
        str(p.relative_to(PACKAGE.parent)): n
        for p in _modules()
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    }
    assert not long, f"split these modules by responsibility: {long}"


def test_functions_have_at_most_60_lines() -> None:
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}"] = lines
    assert not long, f"split these functions: {long}"


def test_the_checks_see_what_they_measure(tmp_path: Path) -> None:
    # A 61-line function and a 601-line module are found: the walk is not vacuous.
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    tree = ast.parse(f"def f():\n{body}\n")
    (fn,) = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]
    assert (fn.end_lineno or 0) - fn.lineno + 1 == 61
    assert len(_modules()) > 50
