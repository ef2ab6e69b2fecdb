"""docs/continue-as-new.md's example runs as written (issue 41, section 4)."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "continue-as-new.md"


async def test_the_continue_as_new_example_runs() -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 1
    assert "return await ctx.continue_as_new(billing)" in blocks[0].code
    namespace: dict[str, Any] = {"__name__": "doc_continue_as_new"}
    exec_blocks(blocks, DOC, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == ["test_a_subscription_runs_run_after_run_under_one_id"]
    await tests[0]()
