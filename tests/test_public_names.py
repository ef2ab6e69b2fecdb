"""Tests use public names, except the white-box tests in tests/internal/.

A private module is one whose dotted path has a ``_``-prefixed part below
``saga_engine`` (``saga_engine.transport._wire``, ``saga_engine.admin._auth``). Outside
tests/internal/, no test may import one (``import x``, ``from x import y``, or a ``_x``
name imported from a saga_engine package), reach one through an attribute chain, name
one as a monkeypatch or mock target (or to ``importlib.import_module``), or run one from
a string of code (a subprocess's ``-c``) or with ``-m``. docs/architecture.md ("Public names") lists
the front doors to use instead.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
INTERNAL = TESTS / "internal"

#: Calls whose string arguments name what they patch or import.
TARGETING = {
    "setattr",
    "delattr",
    "setitem",
    "delitem",
    "patch",
    "import_module",
    "__import__",
    "importorskip",
    "find_spec",
}
PRIVATE_PATH = re.compile(r"^saga_engine(\.\w+)*\._[A-Za-z]\w*(\.\w+)*$")
#: Code in a string: an import of a private module, or running one with ``-m``.
PRIVATE_IN_CODE = re.compile(
    r"(?:\bfrom\s+|\bimport\s+|-m\s+)(saga_engine(?:\.\w+)*\._[A-Za-z]\w*)"
    r"|\bfrom\s+saga_engine(?:\.\w+)*\s+import\s+\(?\s*(_[A-Za-z]\w*)"
)


def _private(dotted: str) -> bool:
    parts = dotted.split(".")
    return parts[0] == "saga_engine" and any(
        p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in parts[1:]
    )


def _dotted(node: ast.expr) -> str | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _call_name(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def private_uses(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) for every use of a private saga_engine name in ``source``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _private(alias.name):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                if _private(f"{node.module}.{alias.name}"):
                    yield node.lineno, f"from {node.module} import {alias.name}"
        elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Del):
            dotted = _dotted(node)
            if dotted is not None and _private(dotted):
                # Report the chain once: at its outermost private attribute.
                inner = _dotted(node.value)
                if inner is None or not _private(inner):
                    yield node.lineno, dotted
        elif isinstance(node, ast.Call) and _call_name(node) in TARGETING:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                if (
                    isinstance(arg, ast.Constant)
                    and isinstance(arg.value, str)
                    and PRIVATE_PATH.match(arg.value)
                ):
                    yield node.lineno, f"{_call_name(node)}({arg.value!r})"
        elif isinstance(node, ast.List | ast.Tuple):
            items = [e.value if isinstance(e, ast.Constant) else None for e in node.elts]
            for flag, target in itertools.pairwise(items):
                if flag == "-m" and isinstance(target, str) and PRIVATE_PATH.match(target):
                    yield node.lineno, f"-m {target}"
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in PRIVATE_IN_CODE.finditer(node.value):
                yield node.lineno, f"code in a string: {match.group(0).strip()!r}"


def public_test_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if INTERNAL not in p.parents)


def test_tests_outside_internal_use_public_names_only() -> None:
    found = [
        f"{path.relative_to(TESTS.parent)}:{line}: {what}"
        for path in public_test_files()
        for line, what in sorted(set(private_uses(path.read_text(encoding="utf-8"))))
    ]
    assert not found, (
        "tests outside tests/internal/ must use public names (docs/architecture.md, "
        "'Public names'); use the front door that re-exports the name, or move the test "
        "into tests/internal/:\n" + "\n".join(found)
    )


def test_the_scan_finds_every_form() -> None:
    # Built from pieces, so that this file's own strings hold no private import.
    pkg, private, auth = "saga_engine", "saga_engine.transport._wire", "saga_engine.admin._auth"
    source = "\n".join(
        [
            f"import {private}",
            f"import {private} as wire",
            f"from {private} import Envelope",
            f"from {pkg} import _wire",
            f"from {pkg}.admin import _timeline",
            f"from {auth} import COOKIE",
            f"import {pkg}",
            f"{pkg}._engine.Engine",
            f"monkeypatch.setattr('{private}.encode', None)",
            f"mock.patch('{auth}.COOKIE', 'x')",
            f"importlib.import_module('{private}')",
            f"subprocess.run(['python', '-c', 'from {private} import encode'])",
            f"subprocess.run(['python', '-m', 'x'], input='import {private}')",
            f"subprocess.run(['python', '-m', '{private}'])",
        ]
    )
    assert sorted(line for line, _ in private_uses(source)) == [
        1,
        2,
        3,
        4,
        5,
        6,
        8,
        9,
        10,
        11,
        12,
        13,
        14,
    ]


def test_public_names_pass_the_scan() -> None:
    source = "\n".join(
        [
            "import saga_engine",
            "import saga_engine.admin",
            "from saga_engine import __version__, Saga",
            "from saga_engine.protocol import Envelope",
            "from saga_engine.admin import create_admin_app",
            "saga_engine.admin.create_admin_app",
            "monkeypatch.setattr('saga_engine.settings.Settings', None)",
            "engine._cache.clear()",  # a private attribute of an object: not a module
            "HEAVY = ('saga_engine.runner._engine',)",  # a name in data, not an import
        ]
    )
    assert list(private_uses(source)) == []


def test_internal_is_marked() -> None:
    assert (INTERNAL / "__init__.py").is_file()
    assert "only here" in (INTERNAL / "README.md").read_text(encoding="utf-8")
    assert public_test_files()
    assert not [p for p in public_test_files() if "internal" in p.relative_to(TESTS).parts]
