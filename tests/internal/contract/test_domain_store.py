"""The domain event store's contract, run against both adapters (in memory over the
in-memory event store; Postgres, with and without a payload codec; sharded over two
Postgres clusters, each fact in its key's shard and the waits in their sagas'): facts kept once by
id, the kept ones of a key oldest first until they expire, the open sagas whose history
waits for a source and key, matched marks, expiry counts, the operator's listing and
which sagas received a fact."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from pydantic import SecretStr

from saga_engine.core.history._codec import CodecChain, GzipCodec
from saga_engine.core.history._decision import Projection
from saga_engine.core.history._events import (
    DomainEventReceived,
    EventAwaited,
    SagaCompleted,
    SagaStarted,
)
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import ShardUnavailable
from saga_engine.kernel._settings import KafkaSettings, PostgresSettings, Settings
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._connect import connect_event_store
from saga_engine.store._coverage import coverage
from saga_engine.store._domain_store import (
    DomainEventStore,
    Expired,
    InMemoryDomainEventStore,
    StoredFact,
)
from saga_engine.store._memstore import InMemoryEventStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgdomain import PostgresDomainEventStore
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._sharded_domain import ShardedDomainEventStore
from saga_engine.store._store import Append, EventStore, NewSaga
from tests.conftest import PgTarget, _drop_schemas, _schema_in

pytestmark = pytest.mark.integration

T0 = datetime(2030, 1, 1, tzinfo=UTC)
HOUR = timedelta(hours=1)


@dataclass
class Stores:
    events: EventStore
    facts: DomainEventStore


@pytest.fixture(params=["memory", "postgres", "postgres-codec", "sharded"])
async def stores(
    request: pytest.FixtureRequest, pg: PgTarget, pg_shard_databases: tuple[str, ...]
) -> AsyncIterator[Stores]:
    if request.param == "memory":
        memory = InMemoryEventStore()

        async def histories() -> dict[str, list[object]]:
            loaded = await memory.histories(await memory.open_saga_ids())
            return {h.record.saga_id: [e.event for e in h.events] for h in loaded}

        yield Stores(memory, InMemoryDomainEventStore(histories))
        return
    if request.param == "sharded":
        shards = [await _schema_in(database, pg.schema) for database in pg_shard_databases]
        try:
            async for sharded in _sharded(pg, tuple(shards)):
                yield sharded
        finally:
            for shard in shards:
                await _drop_schemas(shard)
        return
    await migrate(pg.database_dsn, pg.schema)
    settings = PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    codec = CodecChain.of(GzipCodec()) if request.param.endswith("codec") else None
    events = await PostgresEventStore.connect(settings)
    facts = await PostgresDomainEventStore.connect(settings, codec)
    try:
        yield Stores(events, facts)
    finally:
        await facts.close()
        await events.close()


#: Two shards of two partitions each: the contract's keys and saga ids fall in both.
RANGES = {"a": "0-1", "b": "2-3"}
#: A shard's address with nothing listening.
DEAD = "postgresql://postgres@127.0.0.1:9/saga"


async def _sharded(pg: PgTarget, shards: tuple[PgTarget, ...]) -> AsyncIterator[Stores]:
    for target in (pg, *shards):
        await migrate(target.database_dsn, target.schema)
    settings = Settings(
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
        kafka=KafkaSettings(partitions=4),
    )
    events = await connect_event_store(settings)
    assert isinstance(events, ShardedEventStore)
    facts = ShardedDomainEventStore(lambda: events.shard_map, settings.pg, None)
    try:
        yield Stores(events, facts)
    finally:
        await facts.close()
        await events.close()


def _fact(event_id: str, key: str = "42", at: datetime = T0, **kw: object) -> StoredFact:
    return StoredFact(
        source="PaymentCaptured",
        key=key,
        event_id=event_id,
        payload={"order_id": key, "n": event_id},
        received_at=at,
        expires_at=at + HOUR,
        topic="t",
        partition=0,
        offset=1,
        **kw,  # type: ignore[arg-type]
    )


async def _waiting_saga(store: EventStore, saga_id: str, source: str, key: str) -> None:
    started = SagaStarted(at=T0, saga_type="checkout", input={})
    awaited = EventAwaited(at=T0, wait_id=f"event:{source}:1", source=source, key=key)
    running = Projection(SagaStatus.RUNNING)
    assert await store.create(NewSaga(saga_id, "checkout", [started, awaited], running))


async def test_a_fact_is_kept_once_and_offered_oldest_first_until_it_expires(
    stores: Stores,
) -> None:
    facts = stores.facts
    assert await facts.record(_fact("b", at=T0 + timedelta(minutes=1)))
    assert await facts.record(_fact("a"))
    assert not await facts.record(_fact("a", at=T0 + timedelta(minutes=5)))  # kept already
    assert await facts.record(_fact("other", key="7"))
    kept = await facts.kept("PaymentCaptured", "42", T0 + timedelta(minutes=2))
    assert [(f.event_id, f.received_at) for f in kept] == [
        ("a", T0),
        ("b", T0 + timedelta(minutes=1)),
    ]
    assert kept[0].payload == {"order_id": "42", "n": "a"}
    assert await facts.kept("PaymentCaptured", "42", T0 + HOUR) == [
        f for f in kept if f.event_id == "b"
    ]
    assert await facts.kept("Other", "42", T0) == []


async def test_the_open_sagas_whose_history_waits_for_a_key(stores: Stores) -> None:
    await _waiting_saga(stores.events, "s1", "PaymentCaptured", "42")
    await _waiting_saga(stores.events, "s2", "PaymentCaptured", "42")
    await _waiting_saga(stores.events, "s3", "PaymentCaptured", "7")
    await _waiting_saga(stores.events, "s4", "Refunded", "42")
    assert await stores.facts.waiting("PaymentCaptured", "42") == ["s1", "s2"]
    done = SagaCompleted(at=T0, output={})
    await stores.events.append(Append("s2", 2, [done], Projection(SagaStatus.COMPLETED)))
    assert await stores.facts.waiting("PaymentCaptured", "42") == ["s1"]
    assert await stores.facts.waiting("PaymentCaptured", "nobody") == []


async def test_matched_marks_expiry_and_the_listing(stores: Stores) -> None:
    facts = stores.facts
    for event_id, at in (("a", T0), ("b", T0 + timedelta(minutes=1)), ("c", T0 + 2 * HOUR)):
        await facts.record(_fact(event_id, at=at))
    await facts.mark_matched("PaymentCaptured", "a", key="42")
    await facts.mark_matched("PaymentCaptured", "a", key="42")  # again: no change
    assert [f.event_id for f in await facts.recent()] == ["c", "b", "a"]
    assert [f.event_id for f in await facts.recent(unmatched=True)] == ["c", "b"]
    assert [f.event_id for f in await facts.recent(limit=1)] == ["c"]
    assert await facts.recent(source="Other") == []
    assert await facts.expire(T0 + HOUR + timedelta(minutes=1)) == Expired(2, 1)
    assert await facts.expire(T0 + HOUR + timedelta(minutes=1)) == Expired(0, 0)
    assert [f.event_id for f in await facts.recent()] == ["c"]


async def test_the_sagas_that_received_a_fact(stores: Stores) -> None:
    facts = stores.facts
    for saga_id in ("s1", "s2", "s3"):
        await _waiting_saga(stores.events, saga_id, "PaymentCaptured", "42")
    for saga_id, event_id in (("s2", "a"), ("s1", "a"), ("s3", "b")):
        got = DomainEventReceived(
            at=T0,
            wait_id="event:PaymentCaptured:1",
            source="PaymentCaptured",
            key="42",
            event_id=event_id,
            payload={"n": event_id},
        )
        await stores.events.append(Append(saga_id, 2, [got], Projection(SagaStatus.RUNNING)))
    kept = [_fact("a", matched=True), _fact("b", matched=True), _fact("c"), _fact("d", key="7")]
    assert await facts.receivers(kept) == {
        ("PaymentCaptured", "a"): ["s1", "s2"],
        ("PaymentCaptured", "b"): ["s3"],
    }
    assert await facts.receivers([_fact("c", matched=True)]) == {}
    assert await facts.receivers([]) == {}


async def test_waits_receivers_and_the_listing_across_keys_and_sagas(stores: Stores) -> None:
    # Sharded: key "42" is kept in shard a, "7" in shard b; saga "on-a" lives in shard a,
    # "on-b" in shard b. Each waits for a key of the other shard as well as its own.
    for saga_id in ("on-a", "on-b"):
        await _waiting_saga(stores.events, saga_id, "PaymentCaptured", "42")
        await _waiting_saga(stores.events, f"{saga_id}-7", "PaymentCaptured", "7")
    assert await stores.facts.waiting("PaymentCaptured", "42") == ["on-a", "on-b"]
    assert await stores.facts.waiting("PaymentCaptured", "7") == ["on-a-7", "on-b-7"]
    facts = stores.facts
    minute = timedelta(minutes=1)
    for n, (event_id, key) in enumerate((("p", "42"), ("q", "7"), ("r", "42"), ("s", "7"))):
        assert await facts.record(_fact(event_id, key=key, at=T0 + n * minute))
    await facts.mark_matched("PaymentCaptured", "q", key="7")
    assert [f.event_id for f in await facts.recent()] == ["s", "r", "q", "p"]
    assert [f.event_id for f in await facts.recent(limit=3)] == ["s", "r", "q"]
    assert [f.event_id for f in await facts.recent(unmatched=True)] == ["s", "r", "p"]
    for saga_id, event_id, key in (("on-b", "p", "42"), ("on-a-7", "q", "7")):
        got = DomainEventReceived(
            at=T0,
            wait_id="event:PaymentCaptured:1",
            source="PaymentCaptured",
            key=key,
            event_id=event_id,
            payload={},
        )
        await stores.events.append(Append(saga_id, 2, [got], Projection(SagaStatus.RUNNING)))
    # As the matcher does after the append: saga on-b's shard cannot mark fact p in its
    # transaction, p is kept in shard a.
    await facts.mark_matched("PaymentCaptured", "p", key="42")
    kept = [f for f in await facts.recent() if f.event_id in "pq"]
    assert all(f.matched for f in kept)
    assert await facts.receivers(kept) == {
        ("PaymentCaptured", "p"): ["on-b"],
        ("PaymentCaptured", "q"): ["on-a-7"],
    }
    assert await facts.expire(T0 + HOUR + 2 * minute) == Expired(3, 1)  # p, q, r: r unmatched


async def test_a_shard_that_does_not_answer_holds_what_may_need_it_and_only_that(
    pg: PgTarget, pg_shard_databases: tuple[str, ...]
) -> None:
    # Shard b's address has nothing listening; key "42" is kept in shard a, "7" in b.
    shard_a = await _schema_in(pg_shard_databases[0], pg.schema)
    try:
        await migrate(shard_a.database_dsn, shard_a.schema)
        settings = PostgresSettings.model_validate(
            {
                "dsn": pg.database_dsn,
                "db_schema": pg.schema,
                "control_dsn": pg.database_dsn,
                "shards": [
                    {"name": "a", "partitions": RANGES["a"], "dsn": shard_a.database_dsn},
                    {"name": "b", "partitions": RANGES["b"], "dsn": DEAD},
                ],
            }
        )
        shard_map = ShardMap.build(RANGES, 4)
        facts = ShardedDomainEventStore(lambda: shard_map, settings, None)
        try:
            assert await facts.record(_fact("a", key="42"))
            with pytest.raises(ShardUnavailable, match="shard 'b'"):
                await facts.record(_fact("b", key="7"))
            # A waiter may live in shard b: the question fails rather than miss it (the
            # consumer asks again, the record's offset unmoved).
            with pytest.raises(ShardUnavailable, match="shard 'b'"):
                await facts.waiting("PaymentCaptured", "42")
            assert [f.event_id for f in await facts.kept("PaymentCaptured", "42", T0)] == ["a"]
            await facts.mark_matched("PaymentCaptured", "a", key="42")
            with coverage() as seen:
                listed = await facts.recent()
                assert await facts.expire(T0 + 2 * HOUR) == Expired(1, 0)
            assert [f.event_id for f in listed] == ["a"]
            assert list(seen.missing) == ["b"]
        finally:
            await facts.close()
    finally:
        await _drop_schemas(shard_a)
