"""A KafkaTrigger maps a message's fields to the saga's priority, fairness key and
concurrency key (issue 26 §5), on the real Kafka and Postgres: the start records them,
starts on one key queue behind each other, and a mapping that fails dead-letters the
message with its reason, starting nothing."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import BaseModel

from saga_engine import (
    ConcurrencyLimit,
    DefinitionError,
    Saga,
    SagaContext,
    SagaStatus,
    Settings,
    Signal,
    saga_id_for,
)
from saga_engine.client import SagaClient
from saga_engine.events import KeyAcquired, KeyQueued, SagaStarted
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.store import PostgresEventStore, StoreUnavailable
from saga_engine.triggers import KafkaTrigger
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.integration.kafka_helpers import read_topic
from tests.waiting import eventually

pytestmark = pytest.mark.integration


class Payment(BaseModel):
    account: str = ""
    amount: int


class Paid(BaseModel):
    ok: bool = True


class Pay(Saga[Payment, Paid]):
    name = "pay-by-account"
    concurrency = ConcurrencyLimit(key="account", limit=1)

    async def run(self, ctx: SagaContext, payment: Payment) -> Paid:
        await ctx.sleep(timedelta(milliseconds=300))
        return Paid()


class PaymentRequested(BaseModel):
    request_id: str
    account_no: str
    tenant: str
    urgent: bool = False
    amount: int = 1


def trigger(topic: str) -> KafkaTrigger[PaymentRequested]:
    return KafkaTrigger(
        topic=topic,
        saga=Pay,
        message=PaymentRequested,
        to_input=lambda m: Payment(amount=m.amount),
        idempotency_key=lambda m: f"pay-{m.request_id}",
        priority=lambda m: 10 if m.urgent else 0,
        fairness_key=lambda m: m.tenant,
        concurrency_key=lambda m: m.account_no,
    )


def _settings(pg: PgTarget, bootstrap: str, unique_id: str, **engine: float) -> Settings:
    return Settings(
        pg=PostgresSettings(dsn=pg.database_dsn, db_schema=pg.schema),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap,
            topic_prefix=f"t{unique_id}",
            group_id=f"engines-{unique_id}",
            partitions=2,
        ),
        engine=EngineSettings.model_validate(engine),
        admin=AdminSettings(enabled=False, port=0),
    )


def test_a_concurrency_key_needs_a_limited_saga() -> None:
    class Free(Saga[Payment, Paid]):
        name = "free-payment"

        async def run(self, ctx: SagaContext, payment: Payment) -> Paid:
            return Paid()

    with pytest.raises(DefinitionError, match="declares no `concurrency`"):
        KafkaTrigger(
            topic="t",
            saga=Free,
            message=PaymentRequested,
            to_input=lambda m: {},
            idempotency_key=lambda m: m.request_id,
            concurrency_key=lambda m: m.account_no,
        )


async def test_a_trigger_maps_priority_fairness_and_concurrency_keys(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id, key_poll_s=0.5)
    topic = f"t{unique_id}.payments.requested"
    messages = [
        PaymentRequested(request_id="1", account_no="A-1", tenant="acme", urgent=True),
        PaymentRequested(request_id="2", account_no="A-1", tenant="globex"),
        PaymentRequested(request_id="3", account_no="A-1", tenant="acme"),
    ]
    async with SagaWorker(settings, [Pay], triggers=[trigger(topic)]) as worker:
        assert worker.engine is not None
        engine = worker.engine
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        await producer.start()
        try:
            for m in messages:
                await producer.send_and_wait(topic, m.model_dump_json().encode())
            # A fairness key too long for the start request: dead-lettered, not started.
            bad = PaymentRequested(request_id="4", account_no="A-2", tenant="x" * 500)
            await producer.send_and_wait(topic, bad.model_dump_json().encode())
        finally:
            await producer.stop()
        ids = [f"pay-{m.request_id}" for m in messages]
        saga_ids = [saga_id_for(Pay.name, key) for key in ids]

        async def all_done() -> bool:
            try:
                records = [await engine.get(i) for i in saga_ids]
            except Exception:
                return False
            return all(r.status == SagaStatus.COMPLETED for r in records)

        await eventually(all_done, timeout=60)
        histories = [await engine.history(i) for i in saga_ids]
        [dead] = await read_topic(settings.kafka, f"t{unique_id}.dlq", 1)
        assert dict(dead.headers)["dlq_topic"].decode() == topic
        assert b"fairness key" in dict(dead.headers)["dlq_detail"]

    starts = [h[0] for h in histories]
    assert all(isinstance(s, SagaStarted) for s in starts)
    assert [(s.priority, s.fairness_key, s.input["account"]) for s in starts] == [  # type: ignore[union-attr]
        (10, "acme", "A-1"),
        (0, "globex", "A-1"),
        (0, "acme", "A-1"),
    ]
    # One key: they ran one at a time, and at least the later ones queued for it.
    assert all(any(isinstance(e, KeyAcquired) for e in h) for h in histories)
    assert sum(any(isinstance(e, KeyQueued) for e in h) for h in histories) >= 1


class Go(BaseModel):
    pass


class Locked(Saga[Payment, Paid]):
    """Holds its key until signalled."""

    name = "locked-until-go"
    concurrency = ConcurrencyLimit(key="account", limit=1)
    go = Signal(Go)

    async def run(self, ctx: SagaContext, payment: Payment) -> Paid:
        await ctx.wait_signal("go")
        return Paid()


async def test_the_client_sees_holders_and_queue_and_a_release_moves_it(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id)
    async with SagaWorker(settings, [Locked]), SagaClient(settings) as client:
        first = await client.start(Locked, Payment(account="A-9", amount=1))
        second = await client.start(Locked, Payment(account="A-9", amount=2))

        async def queue() -> list[tuple[str, bool, int]]:
            rows = await client.concurrency_slots(Locked, "A-9")
            return [(r["saga_id"], r["held"], r["position"]) for r in rows]

        await eventually(lambda: _is(queue, [(first, True, 0), (second, False, 1)]))
        await client.signal(first, "go", Go())
        await eventually(lambda: _is(queue, [(second, True, 0)]))
        await client.signal(second, "go", Go())
        assert await client.result(second, timeout=30) == {"ok": True}
        await eventually(lambda: _is(queue, []))


async def _is(read: Any, want: Any) -> bool:
    return bool(await read() == want)


async def test_housekeeping_sweeps_the_slot_of_a_saga_whose_release_was_lost(
    pg: PgTarget, kafka_bootstrap: str, unique_id: str
) -> None:
    settings = _settings(pg, kafka_bootstrap, unique_id, key_poll_s=0.3, key_sweep_s=0.5)
    async with SagaWorker(settings, [Locked]) as worker, SagaClient(settings) as client:
        store = worker.parts.store
        assert isinstance(store, PostgresEventStore)
        first = await client.start(Locked, Payment(account="A-7", amount=1))
        second = await client.start(Locked, Payment(account="A-7", amount=2))

        async def queue() -> list[tuple[str, bool, int]]:
            rows = await client.concurrency_slots(Locked, "A-7")
            return [(r["saga_id"], r["held"], r["position"]) for r in rows]

        await eventually(lambda: _is(queue, [(first, True, 0), (second, False, 1)]))
        release = store.release_key
        lost: list[str] = []

        async def lose_once(saga_id: str, at: Any) -> list[str]:
            if not lost:
                lost.append(saga_id)
                raise StoreUnavailable("as if the engine died before releasing")
            return await release(saga_id, at)

        store.release_key = lose_once  # type: ignore[method-assign]
        await client.signal(first, "go", Go())
        assert await client.result(first, timeout=30) == {"ok": True}
        assert lost == [first]
        # The sweep finds the ended saga's slot, releases it and wakes the second.
        await eventually(lambda: _is(queue, [(second, True, 0)]), timeout=30)
        # Counted once the sweep has woken the saga it granted, after the grant is visible.
        await eventually(lambda: worker.parts.stats.counts["key_swept"] >= 1)
        await client.signal(second, "go", Go())
        assert await client.result(second, timeout=30) == {"ok": True}
        await eventually(lambda: _is(queue, []))
