"""docs/domain-events.md's example runs as written: the source, the saga, the testing
kit's test (an event after the wait, and one before it), and the client's publisher."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "domain-events.md"


async def test_the_domain_events_example_runs() -> None:
    blocks = code_blocks(DOC, "python", under="## Example")
    assert len(blocks) == 3
    assert "ctx.wait_event(" in blocks[0].code
    assert "publish_event" in blocks[2].code
    namespace: dict[str, Any] = {"__name__": "doc_domain_events"}
    exec_blocks(blocks, DOC, namespace)
    [test] = async_tests(namespace)
    await test()
    assert callable(namespace["capture"])
