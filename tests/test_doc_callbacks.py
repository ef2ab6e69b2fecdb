"""docs/callbacks.md's examples run as written (issue 41, section 2): the testing kit's,
and a trusted party's answer through ``SagaClient`` against a served admin API."""

from __future__ import annotations

from typing import Any

from saga_engine.client import SagaClient
from saga_engine.testing import SagaTestEnv
from tests.admin.conftest import admin_settings
from tests.admin.served import served_in_thread
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks

DOC = ROOT / "docs" / "callbacks.md"


async def test_the_callback_examples_run() -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 4
    assert 'ctx.callback("kyc-verdict"' in blocks[0].code
    assert 'completion="callback"' in blocks[1].code
    assert "ctx.first(" in blocks[2].code
    assert "client.complete_callback(url" in blocks[3].code
    for index, block in enumerate(blocks[:3]):
        namespace: dict[str, Any] = {"__name__": f"doc_callbacks_{index}"}
        exec_blocks([block], DOC, namespace)
        for test in async_tests(namespace):
            await test()


async def test_the_client_example_answers_a_served_wait() -> None:
    blocks = code_blocks(DOC, "python")
    kyc: dict[str, Any] = {"__name__": "doc_callbacks_kyc"}
    exec_blocks([blocks[0]], DOC, kyc)
    client_example: dict[str, Any] = {"__name__": "doc_callbacks_client"}
    exec_blocks([blocks[3]], DOC, client_example)
    assert [t.__name__ for t in async_tests(client_example)] == [
        "test_the_back_office_answers_the_kyc_wait"
    ]
    test = client_example["test_the_back_office_answers_the_kyc_wait"]
    onboard, applicant = kyc["Onboard"], kyc["Applicant"]

    async def seed(env: SagaTestEnv) -> dict[str, str]:
        run = await env.start(onboard, applicant(name="Ada"))
        return {"saga_id": run.saga_id, "url": env.commands("kyc")[0].payload["callback_url"]}

    settings = admin_settings(port=0)
    with served_in_thread(settings, seed, sagas=[onboard]) as served:
        client = SagaClient(settings, admin_url=served.url)  # no Kafka: only the admin API
        await test(client, served.seeded["url"])


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
        "test_a_check_that_loses_is_withdrawn_at_once",
        "test_the_back_office_answers_the_kyc_wait",
    ]
