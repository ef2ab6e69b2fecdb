"""The README's Python examples run, as written, in order."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_the_saga_example() -> None:
    blocks = _python_blocks()
    assert len(blocks) >= 2
    assert "class PlaceOrder(Saga[OrderRequest, OrderResult])" in blocks[0]
    assert len(blocks[0].splitlines()) < 80


async def test_readme_examples_run() -> None:
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    for block in _python_blocks():
        exec(compile(block, str(README), "exec"), namespace)
    tests = [
        fn
        for name, fn in namespace.items()
        if name.startswith("test_") and inspect.iscoroutinefunction(fn)
    ]
    assert len(tests) >= 2
    for test in tests:
        await test()
