"""Helpers for tests on the real Kafka: a scripted participant and record polling."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from saga_engine.protocol import Envelope, MessageType, ReplyBody, Topics, decode, encode
from saga_engine.settings import KafkaSettings, Settings
from tests.waiting import eventually

Script = Callable[[Envelope], ReplyBody | None]


async def ensure_topics(
    kafka: KafkaSettings, names: list[str], *, partitions: int | None = None
) -> None:
    """Creates the topics that do not exist yet, and waits until the metadata lists them
    (so a consumer subscribing right after does not start without them)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        missing = sorted(set(names) - set(await admin.list_topics()))
        if missing:  # a topic another client created meanwhile is an error code, ignored
            await admin.create_topics(
                [
                    NewTopic(
                        name,
                        num_partitions=partitions or kafka.partitions,
                        replication_factor=kafka.replication_factor,
                    )
                    for name in missing
                ]
            )
        await eventually(
            admin.list_topics,
            until=lambda listed: set(missing) <= set(listed),
            what=f"topics {missing} to be listed",
        )
    finally:
        await admin.close()


@contextlib.asynccontextmanager
async def fake_participant(
    settings: Settings, name: str, script: Script | None = None
) -> AsyncIterator[list[Envelope]]:
    """A minimal participant speaking the wire protocol: replies as ``script`` says
    (default: success with an empty payload). Yields the commands it received."""
    kafka = settings.kafka
    topics = Topics.of(kafka)
    received: list[Envelope] = []
    consumer = AIOKafkaConsumer(
        topics.commands(name),
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=f"{topics.participant_group(name)}",
        auto_offset_reset="earliest",
        fetch_max_wait_ms=20,
    )
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, acks="all")
    await ensure_topics(kafka, [topics.commands(name)])
    await consumer.start()
    await producer.start()

    async def loop() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=100)
            for records in batch.values():
                for record in records:
                    command = decode(
                        record.key, record.value, list(record.headers), max_bytes=10_000_000
                    )
                    received.append(command)
                    body = (script or (lambda _: ReplyBody(outcome="success")))(command)
                    if body is None:
                        continue
                    reply = Envelope(
                        message_type=MessageType.REPLY,
                        source=f"/participants/{name}",
                        saga_id=command.saga_id,
                        saga_type=command.saga_type,
                        command_id=command.command_id,
                        causation_id=command.id,
                        correlation_id=command.saga_id,
                        body=body.model_dump(mode="json"),
                    )
                    key, value, headers = encode(reply)
                    await producer.send_and_wait(
                        command.reply_to or topics.inbox, value, key=key, headers=headers
                    )

    task = asyncio.get_running_loop().create_task(loop())
    try:
        yield received
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await consumer.stop()
        await producer.stop()


async def read_topic(
    kafka: KafkaSettings, topic: str, count: int, timeout: float = 30.0
) -> list[Any]:
    """Reads ``count`` records from the start of ``topic`` (no group)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=kafka.bootstrap_servers,
        auto_offset_reset="earliest",
        group_id=None,
        fetch_max_wait_ms=20,
    )
    await consumer.start()
    records: list[Any] = []

    async def more() -> list[Any]:
        for recs in (await consumer.getmany(timeout_ms=200)).values():
            records.extend(recs)
        return records

    try:
        return await eventually(
            more,
            until=lambda got: len(got) >= count,
            timeout=timeout,
            interval=0,
            what=f"{count} records in {topic}",
        )
    finally:
        await consumer.stop()


async def read_topic_to_end(kafka: KafkaSettings, topic: str, timeout: float = 30.0) -> list[Any]:
    """Every record ``topic`` holds now (see ``read_to_end``): for records whose sends
    were acknowledged, this proves that no other record came, without waiting to see
    whether one arrives."""
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap_servers)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    parts = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
    consumer = AIOKafkaConsumer(
        bootstrap_servers=kafka.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        fetch_max_wait_ms=20,
    )
    await consumer.start()
    try:
        async with asyncio.timeout(timeout):
            return await read_to_end(consumer, parts)
    finally:
        await consumer.stop()


async def read_to_end(consumer: AIOKafkaConsumer, parts: list[TopicPartition]) -> list[Any]:
    """The records of ``parts``, each read from its start to the end offset it had when
    the read began, with a started consumer of no group (the caller bounds the time)."""
    consumer.assign(parts)
    await consumer.seek_to_beginning(*parts)
    end = await consumer.end_offsets(parts)
    records: list[Any] = []
    while any([await consumer.position(tp) < end[tp] for tp in parts]):
        batch = await consumer.getmany(*parts, timeout_ms=200)
        records += [r for tp, recs in batch.items() for r in recs if r.offset < end[tp]]
    return records
