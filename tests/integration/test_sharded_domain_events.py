"""Domain events past one database: a real worker whose store is sharded over two
Postgres clusters (the devstack's), with the control database on a third. A fact is kept
in the shard of its key; a saga waits in its own shard. A saga of shard a waiting for a
key of shard b (and the reverse) receives its fact once, through Kafka, whether the fact
arrives after its wait or before it; the admin API lists the facts of both shards; the
expiry counts the matched and the unmatched of both."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import asyncpg
import httpx
import pytest

from saga_engine import EventSource, SagaStatus, Settings
from saga_engine.client import SagaClient
from saga_engine.events import DomainEventReceived
from saga_engine.protocol import ReplyBody, partition_for
from saga_engine.settings import AdminSettings, EngineSettings, KafkaSettings, PostgresSettings
from saga_engine.store import migrate
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.events.sagas import AwaitPayment, Order, PaymentCaptured, Shipped, payment_captured
from tests.integration.kafka_helpers import fake_participant
from tests.waiting import eventually

pytestmark = pytest.mark.integration

PARTITIONS = 4
RANGES = {"a": "0-1", "b": "2-3"}
#: saga id -> the order (the key) it waits for, each key on the other shard than its saga.
LATE = {"s-7": 3, "s-1": 2}  # s-7 on a waits for key 3 on b; s-1 on b for key 2 on a
EARLY = {"s-6": 1, "s-3": 4}  # the same, their facts published before they start
NOBODY = 11  # a key of shard a no saga waits for
#: A shard's address with nothing listening (a cluster stopped for good).
DEAD = "postgresql://postgres@127.0.0.1:9/saga"


def _shard(text: str) -> str:
    return "a" if partition_for(text, PARTITIONS) <= 1 else "b"


def _settings(pg: PgTarget, shards: tuple[PgTarget, ...], bootstrap: str, uid: str) -> Settings:
    return Settings(
        pg=PostgresSettings.model_validate(
            {
                "dsn": pg.database_dsn,
                "db_schema": pg.schema,
                "control_dsn": pg.database_dsn,
                "shards": [
                    {"name": name, "partitions": RANGES[name], "dsn": shard.database_dsn}
                    for name, shard in zip(RANGES, shards, strict=True)
                ],
            }
        ),
        kafka=KafkaSettings(
            bootstrap_servers=bootstrap,
            topic_prefix=f"t{uid}",
            group_id=f"g{uid}",
            partitions=PARTITIONS,
        ),
        admin=AdminSettings(port=0),
        # No poll: a fact must reach a waiting saga by its nudge, or by its own look.
        engine=EngineSettings(event_poll_s=3600),
    )


async def _facts(target: PgTarget) -> dict[str, bool]:
    """The facts a database keeps: event id -> matched."""
    conn = await asyncpg.connect(
        target.database_dsn, server_settings={"search_path": target.schema}
    )
    try:
        rows = await conn.fetch("SELECT event_id, matched FROM saga_domain_events")
    finally:
        await conn.close()
    return {r["event_id"]: r["matched"] for r in rows}


def _source(unique_id: str) -> EventSource[PaymentCaptured]:
    return EventSource(
        topic=f"t{unique_id}.payments.captured",
        model=PaymentCaptured,
        key="order_id",
        retention=payment_captured.retention,
    )


async def _status(worker: SagaWorker, saga_id: str) -> SagaStatus | None:
    assert worker.engine is not None
    with contextlib.suppress(Exception):
        return (await worker.engine.get(saga_id)).status
    return None


async def test_facts_live_in_their_keys_shard_and_reach_waiters_of_every_shard(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    # The cases are what the test says they are: each saga on the other shard than its key.
    for saga_id, key in (LATE | EARLY).items():
        assert _shard(saga_id) != _shard(str(key)), saga_id
    assert {_shard(s) for s in LATE} == {_shard(s) for s in EARLY} == {"a", "b"}
    shard_a, shard_b = pg_shards[:2]
    settings = _settings(pg, (shard_a, shard_b), kafka_bootstrap, unique_id)
    source = _source(unique_id)
    shipped = ReplyBody(outcome="success", payload=Shipped(tracking="t").model_dump())
    worker = SagaWorker(settings, [AwaitPayment], event_sources=[source])
    await worker.start()
    try:
        async with (
            fake_participant(settings, "shipping", lambda _: shipped),
            SagaClient(settings) as client,
        ):
            for key in (*EARLY.values(), NOBODY):
                captured = PaymentCaptured(order_id=key, amount=key * 10)
                await client.publish_event(source, captured, event_id=f"c{key}")

            async def kept_early() -> bool:
                facts = {**await _facts(shard_a), **await _facts(shard_b)}
                return len(facts) == len(EARLY) + 1

            await eventually(kept_early)
            for saga_id, key in (LATE | EARLY).items():
                await client.start(AwaitPayment, Order(order_id=key), saga_id=saga_id)
            for saga_id in LATE:
                await eventually(
                    lambda s=saga_id: _is(worker, s, SagaStatus.RUNNING)  # type: ignore[misc]
                )
            for key in LATE.values():
                captured = PaymentCaptured(order_id=key, amount=key * 10)
                await client.publish_event(source, captured, event_id=f"c{key}")
            for saga_id in LATE | EARLY:
                await client.result(saga_id, timeout=60)
            assert worker.engine is not None
            for saga_id, key in (LATE | EARLY).items():
                history = await worker.engine.history(saga_id)
                received = [e for e in history if isinstance(e, DomainEventReceived)]
                assert [(e.event_id, e.payload) for e in received] == [
                    (f"c{key}", {"order_id": key, "amount": key * 10})
                ], saga_id
                assert await _status(worker, saga_id) == SagaStatus.COMPLETED
            # Each fact in its key's shard, none in the control database; every fact a
            # saga received is marked, in its own shard, though no saga of it received it.
            in_a, in_b = await _facts(shard_a), await _facts(shard_b)
            everyone = [*LATE.values(), *EARLY.values(), NOBODY]
            assert sorted(in_a) == sorted(f"c{k}" for k in everyone if _shard(str(k)) == "a")
            assert sorted(in_b) == sorted(f"c{k}" for k in everyone if _shard(str(k)) == "b")
            assert await _facts(pg) == {}
            assert {**in_a, **in_b} == {f"c{k}": k != NOBODY for k in everyone}
            assert worker.admin_url is not None
            async with httpx.AsyncClient(base_url=worker.admin_url, timeout=30) as http:
                listed = (await http.get("/domain-events")).json()
                unmatched = (await http.get("/domain-events", params={"unmatched": "true"})).json()
                page = await http.get("/ui/domain-events")
            assert worker.parts.matcher is not None
            expired = await worker.parts.matcher.store.expire(
                worker.parts.clock.now() + timedelta(hours=2)
            )
    finally:
        await worker.stop()
    # Newest first, from both shards: the late facts after the early ones.
    events = listed["events"]
    assert sorted(e["event_id"] for e in events) == sorted(f"c{k}" for k in everyone)
    assert [e["received_at"] for e in events] == sorted(
        (e["received_at"] for e in events), reverse=True
    )
    assert {e["event_id"] for e in events[: len(LATE)]} == {f"c{k}" for k in LATE.values()}
    assert [e["event_id"] for e in unmatched["events"]] == [f"c{NOBODY}"]
    # The page names each fact's receiver, read from the receiver's shard.
    assert page.status_code == 200
    for saga_id in LATE | EARLY:
        assert saga_id in page.text
    assert (expired.dropped, expired.unmatched) == (len(everyone), 1)


async def _is(worker: SagaWorker, saga_id: str, status: SagaStatus) -> bool:
    return await _status(worker, saga_id) == status


async def test_while_a_shard_does_not_answer_the_facts_of_the_others_are_listed_and_it_is_named(
    pg: PgTarget, pg_shards: tuple[PgTarget, ...], kafka_bootstrap: str, unique_id: str
) -> None:
    shard_a = pg_shards[0]
    dead = PgTarget(database_dsn=DEAD, schema=pg.schema, dsn=DEAD)
    settings = _settings(pg, (shard_a, dead), kafka_bootstrap, unique_id)
    # Migrated by hand: the engine's own migration would wait for shard b.
    settings = settings.model_copy(
        update={"engine": settings.engine.model_copy(update={"auto_migrate": False})}
    )
    await migrate(pg.database_dsn, pg.schema)
    await migrate(shard_a.database_dsn, shard_a.schema)
    source = _source(unique_id)
    worker = SagaWorker(settings, [AwaitPayment], event_sources=[source])
    await worker.start()
    try:
        # Kept in shard a; its waiters cannot all be asked (shard b may hold some), so
        # the consumer tries the record again until b answers.
        assert _shard("2") == "a"
        async with SagaClient(settings) as client:
            await client.publish_event(
                source, PaymentCaptured(order_id=2, amount=20), event_id="c2"
            )
        assert worker.admin_url is not None
        async with httpx.AsyncClient(base_url=worker.admin_url, timeout=30) as http:

            async def listed_c2() -> bool:
                got = (await http.get("/domain-events")).json()
                return [e["event_id"] for e in got["events"]] == ["c2"]

            await eventually(listed_c2)
            listed = await http.get("/domain-events")
            page = await http.get("/ui/domain-events")
    finally:
        await worker.stop()
    assert listed.status_code == 200
    body = listed.json()
    assert [e["event_id"] for e in body["events"]] == ["c2"]
    assert [m["shard"] for m in body["missing_shards"]] == ["b"]
    assert page.status_code == 200
    assert 'id="missing-shards"' in page.text
    assert "c2" in page.text
    # The dead shard's address never shows in an answer.
    assert "127.0.0.1:9" not in listed.text + page.text
