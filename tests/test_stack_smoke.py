"""Proves the servers under test are the real ones: Kafka 4 and Postgres 15."""

from __future__ import annotations

from typing import Any

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from tests.conftest import PgTarget, TopicFactory
from tests.waiting import eventually

pytestmark = pytest.mark.integration


async def _consume_exactly(
    consumer: AIOKafkaConsumer, count: int, deadline_s: float = 30.0
) -> list[Any]:
    """Polls until `count` records arrived or the deadline passed (no fixed sleeps)."""
    records: list[Any] = []

    async def more() -> list[Any]:
        for recs in (await consumer.getmany(timeout_ms=500)).values():
            records.extend(recs)
        return records

    return await eventually(
        more,
        until=lambda got: len(got) >= count,
        timeout=deadline_s,
        interval=0,
        what=f"{count} records",
    )


def _consumer(bootstrap: str, topic: str, group: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_wait_ms=50,
    )


async def test_kafka_keyed_messages_and_committed_offsets(
    kafka_bootstrap: str, kafka_topic: TopicFactory, unique_id: str
) -> None:
    topic = await kafka_topic("smoke", partitions=3)

    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
        assert len(described[0]["partitions"]) == 3
    finally:
        await admin.close()

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        first = [(f"key-{i % 5}", f"a{i}") for i in range(20)]
        for key, value in first:
            await producer.send_and_wait(topic, value.encode(), key=key.encode())
    finally:
        await producer.stop()

    group = f"g-{unique_id}"
    consumer = _consumer(kafka_bootstrap, topic, group)
    await consumer.start()
    try:
        got = await _consume_exactly(consumer, 20)
        await consumer.commit()
    finally:
        await consumer.stop()
    assert sorted(r.value.decode() for r in got) == sorted(v for _, v in first)
    # Same key -> same partition, and per-key order preserved.
    by_key: dict[bytes, set[int]] = {}
    for r in got:
        by_key.setdefault(r.key, set()).add(r.partition)
    assert all(len(parts) == 1 for parts in by_key.values())
    for partition_key in by_key:
        in_offset_order = sorted(got, key=lambda r: r.offset)
        seq = [int(r.value.decode()[1:]) for r in in_offset_order if r.key == partition_key]
        assert seq == sorted(seq)

    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(7):
            await producer.send_and_wait(topic, f"b{i}".encode(), key=f"key-{i}".encode())
    finally:
        await producer.stop()

    # A restarted consumer in the same group resumes after the committed offsets.
    consumer = _consumer(kafka_bootstrap, topic, group)
    await consumer.start()
    try:
        second = await _consume_exactly(consumer, 7)
        extra = await consumer.getmany(timeout_ms=300)
        committed = {p: await consumer.committed(TopicPartition(topic, p)) for p in range(3)}
    finally:
        await consumer.stop()
    assert sorted(r.value.decode() for r in second) == sorted(f"b{i}" for i in range(7))
    assert not any(extra.values()), "nothing from before the committed offsets is re-delivered"
    assert sum(c or 0 for c in committed.values()) == 20


async def test_postgres_jsonb_round_trip(pg: PgTarget) -> None:
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.set_type_codec(
            "jsonb",
            encoder=lambda v: orjson.dumps(v).decode(),
            decoder=orjson.loads,
            schema="pg_catalog",
        )
        version = await conn.fetchval("SHOW server_version_num")
        assert int(version) >= 150000
        assert await conn.fetchval("SELECT current_schema()") == pg.schema
        await conn.execute("CREATE TABLE doc (id int PRIMARY KEY, body jsonb NOT NULL)")
        body = {"saga": "checkout", "amount": 12.5, "items": [1, 2, 3], "ok": True, "n": None}
        await conn.execute("INSERT INTO doc VALUES ($1, $2)", 1, body)
        assert await conn.fetchval("SELECT body FROM doc WHERE id = 1") == body
        # The server really parsed it as jsonb: query inside it.
        assert await conn.fetchval("SELECT body->'items'->>2 FROM doc WHERE id = 1") == "3"
    finally:
        await conn.close()


async def test_fixtures_isolate_schemas(pg: PgTarget, pg_database: str) -> None:
    conn = await asyncpg.connect(pg_database)
    try:
        schemas = await conn.fetch("SELECT nspname FROM pg_namespace WHERE nspname LIKE 's\\_%'")
    finally:
        await conn.close()
    assert [r["nspname"] for r in schemas] == [pg.schema]
