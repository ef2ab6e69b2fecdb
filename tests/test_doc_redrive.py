"""docs/redrive-and-pivots.md: its Python examples run as written (the client's against a
real worker on the real Postgres and Kafka, with participants over Kafka), and its shell
examples name `saga` commands and options that exist."""

from __future__ import annotations

from typing import Any

import pytest

from saga_engine import SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.protocol import Envelope, ReplyBody
from tests.cli.conftest import invoke
from tests.conftest import PgTarget
from tests.doc_blocks import ROOT, async_tests, code_blocks, exec_blocks, shell_commands
from tests.integration.kafka_helpers import fake_participant
from tests.served_worker import OPERATOR_TOKEN, ServedWorker, real_settings, served_worker
from tests.waiting import eventually

DOC = ROOT / "docs" / "redrive-and-pivots.md"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


async def test_the_python_examples_run() -> None:
    blocks = code_blocks(DOC, "python")
    assert len(blocks) == 4  # the last one, the client's, runs below
    namespace: dict[str, Any] = {"__name__": "doc_redrive"}
    exec_blocks(blocks[:3], DOC, namespace)
    tests = async_tests(namespace)
    assert [t.__name__ for t in tests] == [
        "test_a_parked_step_retried_with_an_edited_command",
        "test_past_the_pivot_the_saga_only_goes_forward",
        "test_a_child_as_the_pivot",
    ]
    for test in tests:
        await test()


def test_the_shell_examples_use_real_commands_and_options() -> None:
    [block] = code_blocks(DOC, "sh")
    commands = shell_commands(block)
    assert [c[1] for c in commands] == ["retry", "skip", "show", "rerun"]
    for command in commands:
        assert command[0] == "saga"
        shown = invoke([command[1], "--help"])
        assert shown.exit_code == 0, shown.output
        for option in (t for t in command if t.startswith("--")):
            assert option in shown.stdout, f"saga {command[1]} has no {option}"


def _shipping(command: Envelope) -> ReplyBody:
    if command.subject == "Ship" and command.body["address"] == "Nowhere 0":
        return ReplyBody(outcome="failure", error="unknown address")
    return ReplyBody(outcome="success", payload={"tracking": "T-1"})


async def _saga(served: ServedWorker, saga_id: str) -> Any:
    return (await served.http.get(f"/sagas/{saga_id}", headers=OPERATOR)).json()


async def _parked(served: ServedWorker, order_id: str) -> str:
    answer = await served.http.post(
        "/sagas/checkout", json={"order_id": order_id, "address": "Nowhere 0"}, headers=OPERATOR
    )
    assert answer.status_code == 202, answer.text
    saga_id: str = answer.json()["saga_id"]

    async def parked() -> bool:
        return bool((await _saga(served, saga_id)).get("status") == "step_stuck")

    await eventually(parked, timeout=30)
    return saga_id


async def _completed(served: ServedWorker, saga_id: str) -> Any:
    async def done() -> bool:
        return bool((await _saga(served, saga_id)).get("status") == "completed")

    await eventually(done, timeout=30)
    return (await _saga(served, saga_id))["output"]


@pytest.mark.integration
async def test_the_client_example_retries_and_skips_on_a_real_worker(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    namespace: dict[str, Any] = {"__name__": "doc_redrive"}
    exec_blocks(code_blocks(DOC, "python"), DOC, namespace)
    settings: Settings = real_settings(pg, kafka_bootstrap, unique_id)
    async with (
        served_worker(settings, [namespace["Checkout"]]) as served,
        fake_participant(settings, "stock"),
        fake_participant(settings, "shipping", _shipping),
        SagaClient(settings, admin_url=served.url, admin_token=OPERATOR_TOKEN) as client,
    ):
        fixed = await _parked(served, "o-1")
        status = await namespace["fix_the_address"](client, fixed)
        assert status in (SagaStatus.RUNNING, SagaStatus.COMPLETED)
        assert await _completed(served, fixed) == {"tracking": "T-1"}
        by_hand = await _parked(served, "o-2")
        status = await namespace["shipped_by_hand"](client, by_hand)
        assert status in (SagaStatus.RUNNING, SagaStatus.COMPLETED)
        assert await _completed(served, by_hand) == {"tracking": "T-9"}
