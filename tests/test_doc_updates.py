"""docs/updates-queries.md's example runs as written."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "updates-queries.md"


async def test_the_updates_and_queries_example_runs() -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 2
    assert "@update(AddItem)" in blocks[0].code
    namespace: dict[str, Any] = {"__name__": "doc_updates"}
    exec_blocks(blocks, DOC, namespace)
    [test] = async_tests(namespace)
    await test()
