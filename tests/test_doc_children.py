"""docs/architecture.md's child-saga example runs as written."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

ARCHITECTURE = ROOT / "docs" / "architecture.md"


async def test_the_child_saga_example_runs() -> None:
    blocks = code_blocks(ARCHITECTURE, "python", under="## Child sagas")
    assert len(blocks) == 1
    assert "ctx.child(Shipment" in blocks[0].code
    namespace: dict[str, Any] = {"__name__": "doc_children"}
    exec_blocks(blocks, ARCHITECTURE, namespace)
    [test] = async_tests(namespace)
    await test()
