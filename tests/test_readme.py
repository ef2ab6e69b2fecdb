"""The README's Python examples run, as written, in order."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

README = ROOT / "README.md"


def test_readme_has_the_saga_example() -> None:
    blocks = code_blocks(README, "python")
    assert len(blocks) >= 2
    assert "class PlaceOrder(Saga[OrderRequest, OrderResult])" in blocks[0].code
    assert len(blocks[0].code.splitlines()) < 80


async def test_readme_examples_run() -> None:
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec_blocks(code_blocks(README, "python"), README, namespace)
    tests = async_tests(namespace)
    assert len(tests) >= 2
    for test in tests:
        await test()
