"""docs/callbacks.md's examples run as written (issue 41, section 2)."""

from __future__ import annotations

from typing import Any

from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "callbacks.md"


async def test_the_callback_examples_run() -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 2
    assert 'ctx.callback("kyc-verdict"' in blocks[0].code
    assert 'completion="callback"' in blocks[1].code
    for index, block in enumerate(blocks):
        namespace: dict[str, Any] = {"__name__": f"doc_callbacks_{index}"}
        exec_blocks([block], DOC, namespace)
        for test in async_tests(namespace):
            await test()


def test_the_examples_name_their_tests() -> None:
    names: list[str] = []
    for index, block in enumerate(code_blocks(DOC, "python")):
        namespace: dict[str, Any] = {"__name__": f"doc_callbacks_names_{index}"}
        exec_blocks([block], DOC, namespace)
        names += [t.__name__ for t in async_tests(namespace)]
    assert names == [
        "test_the_vendor_posts_its_verdict",
        "test_no_verdict_before_the_timeout",
        "test_the_fraud_service_answers_202_then_calls_back",
        "test_a_failure_posted_to_the_fail_url_fails_the_step",
    ]
