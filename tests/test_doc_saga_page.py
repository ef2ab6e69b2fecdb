"""docs/operations.md's "The saga page" example runs as written."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

OPERATIONS = ROOT / "docs" / "operations.md"


async def test_the_saga_page_example_runs() -> None:
    blocks = code_blocks(OPERATIONS, "python", under="## The saga page")
    assert len(blocks) == 1
    assert "/retry" in blocks[0].code
    namespace: dict[str, Any] = {"__name__": "doc_saga_page"}
    exec_blocks(blocks, OPERATIONS, namespace)
    [test] = async_tests(namespace)
    await test()
