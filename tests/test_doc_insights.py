"""docs/operations.md's "Insights per saga type" example runs as written."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

OPERATIONS = ROOT / "docs" / "operations.md"


async def test_the_insights_example_runs() -> None:
    blocks = code_blocks(OPERATIONS, "python", under="## Insights per saga type")
    assert len(blocks) == 2  # the report, and (its subsection) the learned costs
    assert "sla = timedelta(minutes=2)" in blocks[0].code
    namespace: dict[str, Any] = {"__name__": "doc_insights"}
    exec_blocks(blocks[:1], OPERATIONS, namespace)
    [test] = async_tests(namespace)
    await test()


async def test_the_learned_costs_example_runs() -> None:
    blocks = code_blocks(OPERATIONS, "python", under="### Learned costs, read in code")
    assert len(blocks) == 1
    assert "learned_costs(" in blocks[0].code
    namespace: dict[str, Any] = {"__name__": "doc_learned_costs"}
    exec_blocks(blocks, OPERATIONS, namespace)
    [test] = async_tests(namespace)
    await test()
