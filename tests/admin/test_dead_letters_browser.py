"""The dead-letter pages in headless Chromium, over a dead-letter topic on the real
Kafka: the header's link, the table and its reason filter, a record's page (payload,
headers), and its replay form (the record arrives at its origin topic; one with no origin
is refused with the reason). Screenshots; no console error under the unchanged CSP."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from saga_engine.protocol import Topics
from saga_engine.settings import AdminSettings, KafkaSettings, Settings
from saga_engine.testing import SagaTestEnv
from saga_engine.worker import DeadLetterTopic
from tests.admin.served import served_in_thread
from tests.admin.test_web import PNG_MAGIC, _chromium
from tests.integration.kafka_helpers import ensure_topics

pytestmark = pytest.mark.integration

PAYLOAD = b'{"answer": 42, "note": "' + b"n" * 400 + b'"'


@pytest.fixture
def kafka(kafka_bootstrap: str, unique_id: str) -> Iterator[KafkaSettings]:
    """Its own inbox and dead-letter topic (one partition each), holding two dead letters:
    a malformed reply from the inbox (offset 0) and one that names no origin (offset 1)."""
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap, topic_prefix=f"t{unique_id}")
    topics = Topics.of(kafka)

    async def setup() -> None:
        await ensure_topics(kafka, [topics.inbox, topics.dlq], partitions=1)
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait(
                topics.dlq,
                PAYLOAD,
                key=b"saga-7",
                headers=[
                    ("ce_sagaid", b"saga-7"),
                    ("ce_type", b"saga.reply"),
                    ("dlq_reason", b"malformed_json"),
                    ("dlq_detail", b"the body is not JSON"),
                    ("dlq_topic", topics.inbox.encode()),
                    ("dlq_partition", b"0"),
                    ("dlq_offset", b"17"),
                ],
            )
            await producer.send_and_wait(
                topics.dlq, b"{}", key=b"k", headers=[("dlq_reason", b"rejected")]
            )
        finally:
            await producer.stop()

    async def teardown() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            await admin.delete_topics([topics.inbox, topics.dlq])
        finally:
            await admin.close()

    asyncio.run(setup())
    yield kafka
    asyncio.run(teardown())


async def _inbox_record(kafka: KafkaSettings, offset: int) -> Any:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(Topics.of(kafka).inbox, 0)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        return await asyncio.wait_for(consumer.getone(tp), 15)
    finally:
        await consumer.stop()


async def _seed(env: SagaTestEnv) -> dict[str, str]:
    return {}


def test_the_dead_letter_pages_in_headless_chromium(kafka: KafkaSettings, tmp_path: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    # Auth off: loopback and no tokens (the local operator may replay).
    settings = Settings(admin=AdminSettings(host="127.0.0.1", port=0), kafka=kafka)
    inbox = Topics.of(kafka).inbox
    with (
        served_in_thread(settings, _seed, dead_letters=DeadLetterTopic(kafka)) as served,
        sync_playwright() as pw,
    ):
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            problems: list[str] = []
            page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(f"{served.url}/ui/sagas")
            page.locator("#nav-dead-letters").click()
            rows = page.locator("tr.dead-letter")
            expect(rows).to_have_count(2)
            expect(rows.first).to_contain_text("rejected")  # newest first
            expect(rows.nth(1)).to_contain_text(f"{inbox}[0]@17")
            expect(rows.nth(1).locator("a.saga-link")).to_have_text("saga-7")
            page.screenshot(path=str(tmp_path / "dead-letters.png"), full_page=True)

            page.locator("#dlq-reason").select_option("malformed_json")
            with page.expect_navigation():
                page.locator("#dlq-filter").click()
            expect(rows).to_have_count(1)
            rows.first.locator("a.dlq-link").click()
            expect(page.locator("h1")).to_have_text("Dead letter 0@0")
            expect(page.locator("#dlq-payload")).to_have_text(PAYLOAD.decode())
            expect(page.locator("table.dlq-headers")).to_contain_text("dlq_detail")

            page.locator("#replay-reason").fill("the consumer is fixed")
            with page.expect_navigation():
                page.locator("#replay-submit").click()
            expect(page.locator("#dlq-replayed")).to_have_text(f"Replayed to {inbox}[0]@0.")
            shot = tmp_path / "dead-letter.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == PNG_MAGIC
            assert problems == []

            # No origin: refused with the reason (the page's own status is the API's 409).
            page.goto(f"{served.url}/ui/dead-letters/0/1")
            page.locator("#replay-reason").fill("try it")
            with page.expect_navigation():
                page.locator("#replay-submit").click()
            expect(page.locator("#dlq-refused")).to_contain_text("no dlq_topic header")
            assert all("409" in p for p in problems), problems
        finally:
            browser.close()

    record = asyncio.run(_inbox_record(kafka, 0))
    assert (record.key, record.value) == (b"saga-7", PAYLOAD)
    assert dict(record.headers)["ce_sagaid"] == b"saga-7"
    assert not [k for k, _ in record.headers if k.startswith("dlq_")]
