"""docs/operations.md's "Graph sagas on the console" example runs as written."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

OPERATIONS = ROOT / "docs" / "operations.md"


async def test_the_graph_console_example_runs() -> None:
    blocks = code_blocks(OPERATIONS, "python", under="## Graph sagas on the console")
    assert len(blocks) == 1
    assert "/graph" in blocks[0].code
    namespace: dict[str, Any] = {"__name__": "doc_graph_console"}
    exec_blocks(blocks, OPERATIONS, namespace)
    [test] = async_tests(namespace)
    await test()
