"""docs/progress.md's examples run as written (issue 41, section 5): the saga's items in
the testing kit, and the client following the same saga through a served admin API."""

from __future__ import annotations

from typing import Any

from saga_engine.client import SagaClient
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import READER_TOKEN, admin_settings
from tests.admin.served import served_in_thread
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "progress.md"


async def test_the_progress_examples_run() -> None:
    # The third, a participant's tx.progress, runs on the real servers
    # (tests/progress/test_doc_step_progress.py).
    *blocks, _ = code_blocks(DOC, "python")
    assert len(blocks) == 2
    assert 'await ctx.emit("status", Status(stage="reserving"))' in blocks[0].code
    assert "client.stream(saga_id" in blocks[1].code
    namespace: dict[str, Any] = {"__name__": "doc_progress"}
    exec_blocks(blocks, DOC, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == [
        "test_each_item_is_numbered_once",
        "test_the_client_follows_the_saga_to_its_end",
    ]
    await tests[0]()
    following = namespace["test_the_client_follows_the_saga_to_its_end"]
    saga, order = namespace["PlaceOrder"], namespace["Order"]

    async def seed(env: SagaTestEnv) -> dict[str, str]:
        return {"saga_id": (await env.start(saga, order(order_id="o-2"))).saga_id}

    settings = admin_settings(port=0)
    with served_in_thread(settings, seed, sagas=[saga]) as served:
        client = SagaClient(settings, admin_url=served.url, admin_token=READER_TOKEN)
        await following(client, served.seeded["saga_id"])
