"""docs/progress.md, "Reporting from a participant": its participant runs as written on
the real Kafka and Postgres, behind an engine worker, and its handler's reports are on
``{prefix}.progress`` as PROTOCOL.md 5b describes: one per item, numbered from 1."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer

from saga_engine import Settings
from saga_engine.client import SagaClient
from saga_engine.participant import Participant
from saga_engine.settings import AdminSettings
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.doc_blocks import ROOT, code_blocks, exec_blocks
from tests.participant.helpers import engine_settings
from tests.progress.test_step_progress_kafka import Packing, Parcel
from tests.waiting import eventually

pytestmark = pytest.mark.integration

DOC = ROOT / "docs" / "progress.md"


@pytest.fixture
async def settings(pg: PgTarget, kafka_bootstrap: str, unique_id: str) -> AsyncIterator[Settings]:
    ddl = "CREATE TABLE packed (item int NOT NULL)"
    async with engine_settings(pg, kafka_bootstrap, unique_id, "warehouse", ddl=ddl) as s:
        yield s.model_copy(update={"admin": AdminSettings(port=0)})


async def test_the_participant_example_reports_each_item(settings: Settings) -> None:
    (block,) = code_blocks(DOC, "python", under="## Reporting from a participant: `tx.progress`")
    assert "tx.progress(" in block.code
    namespace: dict[str, Any] = {"__name__": "doc_step_progress"}
    exec_blocks([block], DOC, namespace)
    warehouse: Participant = namespace["warehouse"](settings)

    worker = SagaWorker(settings, [Packing])
    await worker.start()
    reports = AIOKafkaConsumer(
        f"{settings.kafka.topic_prefix}.progress",
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
    )
    await reports.start()
    try:
        await warehouse.start()
        async with SagaClient(settings) as client:
            saga_id = await client.start(Packing, Parcel(items=3))
            assert (await client.result(saga_id, timeout=60))["boxes"] == 3
        seen: list[dict[str, Any]] = []

        async def three() -> list[dict[str, Any]] | None:
            for records in (await reports.getmany(timeout_ms=200)).values():
                seen.extend(json.loads(r.value) for r in records if r.key == saga_id.encode())
            return seen if len(seen) >= 3 else None

        await eventually(three, what="three reports on the topic")
        assert [(r["seq"], r["attempt"], r["step"], r["body"]) for r in seen] == [
            (n, 1, "pack", {"packed": n, "of": 3}) for n in (1, 2, 3)
        ]
        # Counted once the broker acknowledged each (after a consumer may read it).
        await eventually(lambda: warehouse.stats["step_progress_sent"] == 3 or None)
    finally:
        await reports.stop()
        await warehouse.stop()
        await worker.stop()
