"""docs/races.md's examples run as written (issue 41, section 1)."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "races.md"


async def test_the_race_and_timeout_examples_run() -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 2
    assert "await ctx.first(" in blocks[0].code
    assert "async with ctx.timeout(" in blocks[1].code
    namespace: dict[str, Any] = {"__name__": "doc_races"}
    exec_blocks(blocks, DOC, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == [
        "test_the_first_of_payment_cancel_and_timeout_wins",
        "test_a_charge_that_outlives_its_deadline_is_refunded_once",
    ]
    for test in tests:
        await test()
