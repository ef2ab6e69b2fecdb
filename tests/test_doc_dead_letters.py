"""docs/operations.md, "Dead letters": its Python example replays a malformed start the
worker dead-lettered (the real Postgres and Kafka) back to the inbox through the admin
API, and its shell lines name `saga dlq` commands and options that exist."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from aiokafka import AIOKafkaProducer

from saga_engine.protocol import Envelope, MessageType, StartBody, Topics, encode
from tests.cli.conftest import invoke
from tests.conftest import PgTarget
from tests.doc_blocks import ROOT, code_blocks, exec_blocks, shell_commands
from tests.edge.conftest import Checkout
from tests.served_worker import OPERATOR_TOKEN, real_settings, served_worker
from tests.waiting import eventually

DOC = ROOT / "docs" / "operations.md"
SECTION = "## Dead letters"
OPERATOR = {"Authorization": f"Bearer {OPERATOR_TOKEN}"}


def test_the_shell_lines_use_real_commands_and_options() -> None:
    [block] = code_blocks(DOC, "sh", under=SECTION)
    commands = shell_commands(block)
    assert [c[:3] for c in commands] == [["saga", "dlq", "list"]] + [["saga", "dlq", "replay"]] * 2
    for command in commands:
        shown = invoke([*command[1:3], "--help"])
        assert shown.exit_code == 0, shown.output
        for option in (t for t in command if t.startswith("--")):
            assert option in shown.stdout, f"saga dlq {command[2]} has no {option}"


@pytest.mark.integration
async def test_the_replay_example_runs(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> None:
    [block] = code_blocks(DOC, "python", under=SECTION)
    namespace: dict[str, Any] = {"__name__": "doc_dead_letters"}
    exec_blocks([block], DOC, namespace)
    settings = real_settings(pg, kafka_bootstrap, unique_id)
    inbox = Topics.of(settings.kafka).inbox
    async with served_worker(settings, [Checkout]) as served:
        start = Envelope(
            message_type=MessageType.START,
            source="/careless",
            saga_id="doc-1",
            saga_type="edge-checkout",
            subject="edge-checkout",
            body=StartBody(input={"customer": "c"}).model_dump(mode="json"),
        )
        key, _, headers = encode(start)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(inbox, b"{not json", key=key, headers=headers)
        finally:
            await producer.stop()

        async def listed() -> bool:
            answer = await served.http.get("/dead-letters", headers=OPERATOR)
            return bool(answer.json())

        await eventually(listed)
        async with httpx.AsyncClient(base_url=served.url, headers=OPERATOR) as admin:
            replayed = await namespace["replay_malformed"](admin, "the producer is fixed")
    assert [(r["topic"], r["saga_id"], r["principal"]) for r in replayed] == [
        (inbox, "doc-1", "olivia")
    ]
