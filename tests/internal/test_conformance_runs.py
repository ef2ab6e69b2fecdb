"""A second run of the conformance suite against a participant still draining an earlier
run's records (PROTOCOL.md section 16 allows it): white-box, as it replays the suite's own
hostile records (``DEAD_CASES``) as an earlier run would have sent them."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from saga_engine.conformance._cases import DEAD_CASES, Sender
from saga_engine.settings import KafkaSettings, Settings
from tests.conformance.test_conformance import NAME, _suite, conformance_participant
from tests.conformance.test_conformance import stack as stack

pytestmark = pytest.mark.integration


async def test_a_run_ignores_the_dead_letters_of_an_earlier_run_still_draining(
    stack: Settings,
) -> None:
    """An earlier run's hostile records wait on the command topic; the participant starts
    only once this run has started sending, so the earlier dead letters, with the same
    case names, arrive while this run collects its own."""
    kafka = stack.kafka
    topic = f"{kafka.topic_prefix}.cmd.{NAME}"
    earlier = Sender("conf-earlier", f"{kafka.topic_prefix}.inbox")
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await producer.start()
    try:
        for case in DEAD_CASES:
            key, value, headers = case.change(earlier.record(case.name), kafka.max_message_bytes)
            await producer.send_and_wait(topic, value, key=key, headers=headers)
    finally:
        await producer.stop()
    suite = asyncio.create_task(_suite(stack))
    await _until_more_than(kafka, topic, len(DEAD_CASES))
    participant = conformance_participant(stack)
    await participant.start()
    try:
        report = await suite
    finally:
        await participant.stop()
    failed = {r.name: r.detail for r in report.results if not r.passed}
    assert not failed, failed


async def _until_more_than(kafka: KafkaSettings, topic: str, count: int) -> None:
    """Reads ``topic`` until it held more than ``count`` records (a suite started sending)."""
    reader = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap_servers, group_id=None)
    await reader.start()
    try:
        reader.assign([TopicPartition(topic, p) for p in range(kafka.partitions)])
        await reader.seek_to_beginning()
        seen = 0
        async with asyncio.timeout(120):
            while seen <= count:
                batches = await reader.getmany(timeout_ms=1000)
                seen += sum(len(records) for records in batches.values())
    finally:
        await reader.stop()
