"""A minimal end-to-end check of the stack: a Kafka round trip and a Postgres row.

`make demo` runs this until the checkout demo services land.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

import asyncpg
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from saga_engine import Settings


async def main() -> int:
    settings = Settings()
    bootstrap = settings.kafka.bootstrap_servers
    topic = f"demo.smoke.{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)])
        print(f"kafka: created topic {topic}")
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        try:
            payload = {"hello": "saga-engine", "at": time.time()}
            await producer.send_and_wait(topic, orjson.dumps(payload), key=b"demo")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", group_id=None
        )
        await consumer.start()
        try:
            record = await asyncio.wait_for(consumer.getone(), timeout=30)
        finally:
            await consumer.stop()
        assert orjson.loads(record.value) == payload
        print(f"kafka: produced and consumed {payload['hello']!r} (partition {record.partition})")
        await admin.delete_topics([topic])
    finally:
        await admin.close()

    conn = await asyncpg.connect(settings.pg.dsn.get_secret_value())
    try:
        table = f"demo_smoke_{uuid.uuid4().hex[:8]}"
        await conn.execute(f"CREATE TEMP TABLE {table} (id int PRIMARY KEY, body jsonb)")
        await conn.execute(f"INSERT INTO {table} VALUES (1, $1::jsonb)", '{"ok": true}')
        body = orjson.loads(await conn.fetchval(f"SELECT body::text FROM {table} WHERE id = 1"))
        assert body == {"ok": True}
        print(f"postgres: wrote and read a jsonb row ({body})")
    finally:
        await conn.close()
    print("demo: the stack works end to end")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
