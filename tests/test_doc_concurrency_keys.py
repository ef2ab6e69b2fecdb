"""docs/concurrency-keys.md's examples run as written: the declaration, the testing
kit's test of it, and the trigger that maps a message to the keys."""

from __future__ import annotations

from typing import Any

import pytest

from saga_engine import DefinitionError
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "concurrency-keys.md"


def _namespace() -> dict[str, Any]:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 3
    namespace: dict[str, Any] = {"__name__": "doc_concurrency_keys"}
    exec_blocks(blocks, DOC, namespace)
    return namespace


async def test_the_example_test_of_the_doc_passes() -> None:
    [test] = async_tests(_namespace())
    await test()


def test_the_trigger_maps_the_keys() -> None:
    namespace = _namespace()
    trigger = namespace["transfer_requested"]
    message = namespace["TransferRequested"](
        request_id="r1", account="acct-9", tenant="acme", amount=3, urgent=True
    )
    assert (trigger.priority(message), trigger.fairness_key(message)) == (10, "acme")
    assert trigger.concurrency_key(message) == "acct-9"
    assert namespace["Transfer"].concurrency.key == "account_id"


def test_the_trigger_refuses_a_key_for_an_unlimited_saga() -> None:
    namespace = _namespace()
    trigger = namespace["transfer_requested"]
    namespace["Transfer"].concurrency = None  # this namespace's class only
    with pytest.raises(DefinitionError, match="declares no `concurrency`"):
        type(trigger)(
            topic=trigger.topic,
            saga=namespace["Transfer"],
            message=trigger.message,
            to_input=trigger.to_input,
            idempotency_key=trigger.idempotency_key,
            concurrency_key=trigger.concurrency_key,
        )
