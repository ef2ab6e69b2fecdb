"""``ctx.wait_event`` over the real Postgres and Kafka, with two engines: a fact published
on an ``EventSource`` topic reaches the sagas waiting for its key, through their owner,
whichever engine consumed it; a fact published before the saga waits is matched; a
redelivered fact (the same ``ce_id``) is kept once; ``SagaClient.publish_event`` publishes
one as a Python service would; a malformed record is dead-lettered
with its reason and the consumer goes on."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from saga_engine import SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.events import DomainEventReceived
from saga_engine.protocol import ReplyBody
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.events.sagas import AwaitPayment, Order, PaymentCaptured, Shipped, payment_captured
from tests.integration.kafka_helpers import fake_participant, read_topic
from tests.waiting import eventually

pytestmark = pytest.mark.integration


def _settings(pg: PgTarget, bootstrap: str, uid: str) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap, topic_prefix=f"t{uid}", group_id=f"g{uid}", partitions=2
        ),
        admin=AdminSettings(enabled=False, port=0),
        # No poll: a fact must reach a waiting saga by its nudge, or by its own look.
        engine=EngineSettings(event_poll_s=3600),
    )


@contextlib.asynccontextmanager
async def _producer(bootstrap: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        yield producer
    finally:
        await producer.stop()


async def _publish(
    producer: AIOKafkaProducer, topic: str, body: object, ce_id: str | None = None
) -> None:
    value = body if isinstance(body, bytes) else orjson.dumps(body)
    headers = [("ce_id", ce_id.encode())] if ce_id else []
    await producer.send_and_wait(topic, value, headers=headers)


async def _status(worker: SagaWorker, saga_id: str) -> SagaStatus | None:
    assert worker.engine is not None
    with contextlib.suppress(Exception):
        return (await worker.engine.get(saga_id)).status
    return None


async def test_facts_reach_the_waiting_sagas_through_their_owner(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id)
    topic = f"t{unique_id}.payments.captured"
    source = type(payment_captured)(
        topic=topic,
        model=payment_captured.model,
        key="order_id",
        retention=payment_captured.retention,
    )
    shipped = ReplyBody(outcome="success", payload=Shipped(tracking="t").model_dump())
    # Only the second engine consumes the source: the sagas the first one owns get their
    # facts through the inbox (a nudge), from the store.
    first = SagaWorker(settings, [AwaitPayment], instance_id="engine-a")
    second = SagaWorker(settings, [AwaitPayment], instance_id="engine-b", event_sources=[source])
    try:
        await first.start()
        await second.start()
        async with (
            fake_participant(settings, "shipping", lambda _: shipped) as commands,
            SagaClient(settings) as client,
            _producer(kafka_bootstrap) as producer,
        ):
            await eventually(lambda: bool(first.owned_partitions and second.owned_partitions))
            # A fact before any saga waits for it (kept for the source's retention).
            await _publish(producer, topic, {"order_id": 1, "amount": 10}, ce_id="early")
            pool = await asyncpg.create_pool(pg.dsn, min_size=1, max_size=2)
            assert pool is not None

            async def kept(n: int) -> bool:
                return bool(await pool.fetchval("SELECT count(*) FROM saga_domain_events") == n)

            await eventually(lambda: kept(1))
            ids = {
                key: await client.start(
                    AwaitPayment, Order(order_id=key), idempotency_key=f"o{key}"
                )
                for key in range(1, 9)
            }
            twin = await client.start(AwaitPayment, Order(order_id=2), idempotency_key="twin")

            async def waiting(saga_id: str) -> bool:
                return await _status(first, saga_id) == SagaStatus.RUNNING

            # Not the first order's saga: its fact is already kept, so it may run to its
            # end between two polls (checked with the others below).
            for saga_id in [*(ids[key] for key in range(2, 9)), twin]:
                await eventually(lambda s=saga_id: waiting(s))  # type: ignore[misc]
            # Bad records: dead-lettered with their reason; the consumer goes on.
            await _publish(producer, topic, b"{nope")
            await _publish(producer, topic, {"order_id": "x", "amount": 1})
            await _publish(producer, topic, {"amount": 1})
            for key in range(2, 9):  # as a Python service publishes its facts
                captured = PaymentCaptured(order_id=key, amount=key * 10)
                assert await client.publish_event(source, captured, event_id=f"c{key}") == f"c{key}"
            # A redelivered fact: the same ce_id again.
            await _publish(producer, topic, {"order_id": 2, "amount": 20}, ce_id="c2")

            async def all_done() -> bool:
                got = await asyncio.gather(*(_status(first, s) for s in [*ids.values(), twin]))
                return all(s == SagaStatus.COMPLETED for s in got)

            await eventually(all_done, timeout=60)
            assert first.engine is not None
            owners = {first.owns(s) for s in ids.values()}
            assert owners == {True, False}, "both engines own some of the sagas"
            for key, saga_id in [*ids.items(), (2, twin)]:
                history = await first.engine.history(saga_id)
                received = [e for e in history if isinstance(e, DomainEventReceived)]
                assert len(received) == 1, (key, received)
                assert received[0].payload == {"order_id": key, "amount": key * 10}
            assert await kept(8)  # the early one, seven captures: the duplicate kept once
            assert (
                await pool.fetchval("SELECT count(*) FROM saga_domain_events WHERE NOT matched")
                == 0
            )
            await pool.close()
            await eventually(lambda: len({c.saga_id for c in commands}) == 9)
            dlq = await read_topic(settings.kafka, f"t{unique_id}.dlq", 3)
            assert sorted(dict(r.headers)["dlq_reason"].decode() for r in dlq) == [
                "invalid_body",
                "invalid_body",
                "malformed_json",
            ]
            assert {dict(r.headers)["dlq_topic"].decode() for r in dlq} == {topic}
    finally:
        await asyncio.gather(first.stop(), second.stop(), return_exceptions=True)
