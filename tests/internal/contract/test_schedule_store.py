"""The schedule-store contract, run against both adapters, with real Kafka sends.

``postgres``: two stores on two pools stand for two engines; their claims meet only in
Postgres (row locks). ``postgres-status-of``: the same, with the previous sagas' statuses
asked of a collaborator instead of read from ``sagas`` (past one database: the schedules
in the control database, the sagas in the shards). ``memory``: one in-memory store that both "engines" share. Their
start requests go to a real Kafka topic, read back and counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import orjson
import pytest
from pydantic import SecretStr

from saga_engine.core.planning._schedule import (
    CatchUp,
    Overlap,
    Schedule,
    ScheduleState,
    tick_saga_id,
)
from saga_engine.kernel._errors import ScheduleConflict, ScheduleNotFound
from saga_engine.kernel._settings import KafkaSettings, PostgresSettings, ScheduleSettings
from saga_engine.runner._scheduler import Scheduler
from saga_engine.store._memschedules import InMemoryScheduleStore
from saga_engine.store._migrations import migrate
from saga_engine.store._pgschedules import PostgresScheduleStore
from saga_engine.store._schedule_store import Firing, ScheduleStore
from saga_engine.transport._kafka import make_producer
from saga_engine.transport._wire import decode
from saga_engine.worker._schedules import KafkaStarts
from tests.conftest import PgTarget, TopicFactory
from tests.integration.kafka_helpers import read_topic_to_end

pytestmark = pytest.mark.integration

MINUTE = timedelta(minutes=1)


def floor_minute(t: datetime) -> datetime:
    return t.replace(second=0, microsecond=0)


@dataclass
class Adapter:
    """How a test reaches one adapter: stores (by grace period), and a saga's status."""

    make: Callable[[float], Awaitable[ScheduleStore]]
    set_status: Callable[[str, str], Awaitable[None]]


@pytest.fixture(params=["memory", "postgres", "postgres-status-of"])
async def adapter(request: pytest.FixtureRequest, pg: PgTarget) -> AsyncIterator[Adapter]:
    statuses: dict[str, str] = {}

    async def status_of(saga_id: str) -> str | None:
        return statuses.get(saga_id)

    async def set_status(saga_id: str, status: str) -> None:
        statuses[saga_id] = status

    if request.param == "memory":
        # Every store of one test shares the rows and locks (one "database").
        first = InMemoryScheduleStore(status_of)

        async def make_memory(grace_s: float) -> ScheduleStore:
            store = InMemoryScheduleStore(status_of, grace_s=grace_s)
            store._rows, store._locks, store._sent = first._rows, first._locks, first._sent
            return store

        yield Adapter(make_memory, set_status)
        return
    await migrate(pg.database_dsn, pg.schema)
    settings = PostgresSettings(dsn=SecretStr(pg.database_dsn), db_schema=pg.schema)
    opened: list[ScheduleStore] = []

    asked = status_of if request.param == "postgres-status-of" else None

    async def make_pg(grace_s: float) -> ScheduleStore:
        store = await PostgresScheduleStore.connect(
            settings, grace=timedelta(seconds=grace_s), status_of=asked
        )
        opened.append(store)
        return store

    async def set_pg(saga_id: str, status: str) -> None:
        conn = await asyncpg.connect(pg.database_dsn, server_settings={"search_path": pg.schema})
        try:
            # Only the row the overlap check reads: no engine runs here.
            await conn.execute(
                "INSERT INTO sagas (saga_id, saga_type, status, last_seq, created_at, updated_at) "
                "VALUES ($1, 'report', $2, 1, now(), now()) "
                "ON CONFLICT (saga_id) DO UPDATE SET status = $2",
                saga_id,
                status,
            )
        finally:
            await conn.close()

    try:
        yield Adapter(make_pg, set_pg if asked is None else set_status)
    finally:
        for store in opened:
            await store.close()


@pytest.fixture
async def stores(adapter: Adapter) -> tuple[ScheduleStore, ScheduleStore]:
    """Two engines' stores."""
    return await adapter.make(60.0), await adapter.make(60.0)


@pytest.fixture
async def inbox(
    kafka_topic: TopicFactory, kafka_bootstrap: str
) -> AsyncIterator[tuple[KafkaStarts, str, KafkaSettings]]:
    topic = await kafka_topic("inbox", partitions=4)
    kafka = KafkaSettings(bootstrap_servers=kafka_bootstrap)
    producer = make_producer(kafka)
    await producer.start()
    yield KafkaStarts(producer, topic, "/test/schedules"), topic, kafka
    await producer.stop()


async def started_ids(kafka: KafkaSettings, topic: str) -> list[str]:
    """The saga id of every start request the topic holds: ``KafkaStarts`` returns only
    once each send is acknowledged, so what the topic holds is all that was sent."""
    records = await read_topic_to_end(kafka, topic)
    return [decode(r.key, r.value, list(r.headers), max_bytes=1 << 20).saga_id for r in records]


def fixed(t: datetime) -> Callable[[], datetime]:
    return lambda: t


async def test_two_engines_racing_fire_each_tick_exactly_once(
    stores: tuple[ScheduleStore, ScheduleStore],
    inbox: tuple[KafkaStarts, str, KafkaSettings],
) -> None:
    a, b = stores
    fire, topic, kafka = inbox
    now = datetime.now(UTC)
    # Created 5.5 minutes ago: 5 or 6 ticks of each are due, and every one must fire.
    created = now - timedelta(minutes=5, seconds=30)
    for i in range(300):
        schedule = Schedule(
            id=f"s{i:03d}",
            saga="report",
            every_s=60,
            offset_s=i % 60,
            input={"n": i},
            catchup=CatchUp.ALL,
            catchup_max=100,
            overlap=Overlap.ALLOW,
        )
        await a.upsert(schedule, created, origin="api")
    # Small batches, so the two engines' claims interleave many times.
    config = ScheduleSettings(batch_size=20)
    sent: list[Firing] = []

    async def counting(firings: Any) -> None:
        sent.extend(firings)
        await fire(firings)

    engines = [Scheduler(s, counting, config, clock=fixed(now)) for s in (a, b)]
    fired = await asyncio.gather(*(e.run_due() for e in engines))
    # Both took part, and together they fired every due tick.
    assert all(n > 0 for n in fired)
    expected = {
        tick_saga_id("report", f"s{i:03d}", t)
        for i in range(300)
        for t in _ticks(created, now, i % 60)
    }
    assert sum(fired) == len(expected)
    ids = await started_ids(kafka, topic)
    assert Counter(ids).most_common(1)[0][1] == 1  # no tick sent twice
    assert set(ids) == expected
    # Nothing is due any more, and the rows say what was fired.
    assert (await a.fire_due(now, 500, counting, clock=fixed(now))).claimed == 0
    rows = await a.list(limit=1000)
    assert sum(r.fired_count for r in rows) == len(expected)
    assert all(r.next_fire_at > now for r in rows)
    assert all(r.last_fired_at == now for r in rows)


def _ticks(created: datetime, now: datetime, offset: int) -> list[datetime]:
    t = floor_minute(created) + timedelta(seconds=offset)
    if t <= created:
        t += MINUTE
    out = []
    while t <= now:
        out.append(t)
        t += MINUTE
    return out


@pytest.mark.parametrize(
    ("catchup", "cap", "fired_ticks", "skipped"),
    [
        (CatchUp.SKIP, 10, [], 10),
        (CatchUp.LAST, 10, [10], 9),
        (CatchUp.ALL, 3, [8, 9, 10], 7),
        (CatchUp.ALL, 20, list(range(1, 11)), 0),
    ],
)
async def test_catch_up_after_downtime(
    stores: tuple[ScheduleStore, ScheduleStore],
    inbox: tuple[KafkaStarts, str, KafkaSettings],
    adapter: Adapter,
    catchup: CatchUp,
    cap: int,
    fired_ticks: list[int],
    skipped: int,
) -> None:
    """The engines were down for ten minutes and a half: ten ticks are due, the last 30 s
    late (past a 20 s grace period)."""
    store, _ = stores
    fire, topic, kafka = inbox
    t0 = floor_minute(datetime.now(UTC)) - timedelta(minutes=11)
    schedule = Schedule(
        id="nightly",
        saga="report",
        every_s=60,
        catchup=catchup,
        catchup_max=cap,
        overlap=Overlap.ALLOW,
    )
    await store.upsert(schedule, t0, origin="code")
    now = t0 + timedelta(minutes=10, seconds=30)
    late = await adapter.make(20.0)
    result = await late.fire_due(now, 500, fire, clock=fixed(now))
    assert [f.tick for f in result.fired] == [t0 + MINUTE * i for i in fired_ticks]
    assert result.skipped == skipped
    row = await store.get("nightly")
    assert row.next_fire_at == t0 + MINUTE * 11
    assert (row.fired_count, row.skipped_count) == (len(fired_ticks), skipped)
    if fired_ticks:
        assert row.last_tick == t0 + MINUTE * fired_ticks[-1]
        assert row.last_saga_id == tick_saga_id("report", "nightly", row.last_tick)
    ids = await started_ids(kafka, topic)
    # One record per fired tick (the inbox's partitions do not keep their order).
    assert sorted(ids) == sorted(
        tick_saga_id("report", "nightly", t0 + MINUTE * i) for i in fired_ticks
    )


async def test_overlap_skip_waits_for_the_previous_saga_to_end(
    stores: tuple[ScheduleStore, ScheduleStore],
    inbox: tuple[KafkaStarts, str, KafkaSettings],
    adapter: Adapter,
) -> None:
    store, _ = stores
    fire, _, _ = inbox
    t0 = floor_minute(datetime.now(UTC))
    await store.upsert(
        Schedule(id="one-at-a-time", saga="report", every_s=60, overlap=Overlap.SKIP),
        t0,
        origin="api",
    )
    first = await store.fire_due(t0 + MINUTE, 500, fire, clock=fixed(t0 + MINUTE))
    [running] = [f.saga_id for f in first.fired]
    # Its start is on its way (no saga row yet): it counts as running.
    second = await store.fire_due(t0 + MINUTE * 2, 500, fire, clock=fixed(t0 + MINUTE * 2))
    assert (second.fired, second.skipped) == ([], 1)
    await adapter.set_status(running, "running")
    third = await store.fire_due(t0 + MINUTE * 3, 500, fire, clock=fixed(t0 + MINUTE * 3))
    assert (third.fired, third.skipped) == ([], 1)
    await adapter.set_status(running, "completed")
    fourth = await store.fire_due(t0 + MINUTE * 4, 500, fire, clock=fixed(t0 + MINUTE * 4))
    assert [f.tick for f in fourth.fired] == [t0 + MINUTE * 4]
    row = await store.get("one-at-a-time")
    assert (row.fired_count, row.skipped_count) == (2, 2)


async def test_definitions_pause_resume_delete_and_trigger(
    stores: tuple[ScheduleStore, ScheduleStore],
    inbox: tuple[KafkaStarts, str, KafkaSettings],
) -> None:
    store, _ = stores
    fire, topic, kafka = inbox
    now = datetime.now(UTC)
    schedule = Schedule(id="rec", saga="report", cron="0 3 * * *", timezone="Europe/Paris")
    assert await store.upsert(schedule, now, origin="code") == "created"
    assert await store.upsert(schedule, now, origin="code") == "unchanged"
    changed = schedule.model_copy(update={"cron": "0 4 * * *"})
    assert await store.upsert(changed, now, origin="code") == "updated"
    with pytest.raises(ScheduleConflict, match="another definition"):
        await store.upsert(schedule, now, origin="api")
    paused = await store.set_state("rec", ScheduleState.PAUSED, now)
    assert paused.state is ScheduleState.PAUSED
    # A paused schedule is not due, whatever its next_fire_at.
    later = now + timedelta(days=3)
    assert (await store.fire_due(later, 500, fire, clock=fixed(later))).claimed == 0
    resumed = await store.set_state("rec", ScheduleState.ACTIVE, later)
    assert resumed.next_fire_at > later  # the paused days are not caught up
    firing = await store.trigger("rec", now, fire)
    assert (await store.get("rec")).last_saga_id == firing.saga_id
    assert await started_ids(kafka, topic) == [firing.saga_id]
    assert orjson.loads(orjson.dumps(firing.input)) == {}
    await store.delete("rec")
    with pytest.raises(ScheduleNotFound):
        await store.get("rec")
    with pytest.raises(ScheduleNotFound):
        await store.delete("rec")
    with pytest.raises(ScheduleNotFound):
        await store.trigger("rec", now, fire)


async def test_a_failed_send_leaves_the_tick_due(
    stores: tuple[ScheduleStore, ScheduleStore],
) -> None:
    store, _ = stores
    t0 = floor_minute(datetime.now(UTC))
    await store.upsert(Schedule(id="s", saga="report", every_s=60), t0, origin="api")

    async def broken(firings: Any) -> None:
        raise RuntimeError("broker away")

    with pytest.raises(RuntimeError):
        await store.fire_due(t0 + MINUTE, 500, broken, clock=fixed(t0 + MINUTE))
    row = await store.get("s")
    assert row.next_fire_at == t0 + MINUTE
    assert row.fired_count == 0


class Crash(Exception):
    """Stands for the engine's death at the crash point (the claim never commits)."""


def crash_after_fire() -> None:
    raise Crash("SIGKILL between the acknowledged starts and the claim's commit")


@pytest.mark.parametrize("overlap", [Overlap.SKIP, Overlap.ALLOW])
async def test_a_tick_sent_by_a_claim_that_never_committed_keeps_the_overlap_policy(
    stores: tuple[ScheduleStore, ScheduleStore],
    inbox: tuple[KafkaStarts, str, KafkaSettings],
    adapter: Adapter,
    overlap: Overlap,
) -> None:
    """Issue 22 §3: the engine dies after Kafka acknowledged the 00:01 tick's start and
    before its claim committed; another engine claims after 00:02 is due, while the
    00:01 saga still runs. The 00:01 tick counts as fired (its start goes again, under
    its own saga id), and overlap=skip does not start 00:02 beside it."""
    a, b = stores
    fire, topic, kafka = inbox
    t0 = floor_minute(datetime.now(UTC))
    schedule = Schedule(id="nightly", saga="report", every_s=60, overlap=overlap)
    await a.upsert(schedule, t0, origin="api")
    t1, t2 = t0 + MINUTE, t0 + MINUTE * 2
    with pytest.raises(Crash):
        await a.fire_due(t1, 500, fire, clock=fixed(t1), after_fire=crash_after_fire)
    crashed = tick_saga_id("report", "nightly", t1)
    await adapter.set_status(crashed, "running")  # its start landed; the saga waits
    now = t2 + timedelta(seconds=5)
    result = await b.fire_due(now, 500, fire, clock=fixed(now))
    expected = [t1] if overlap is Overlap.SKIP else [t1, t2]
    assert [f.tick for f in result.fired] == expected
    assert result.skipped == 2 - len(expected)
    row = await b.get("nightly")
    assert (row.fired_count, row.skipped_count) == (len(expected), 2 - len(expected))
    assert row.last_tick == expected[-1]
    assert row.last_saga_id == tick_saga_id("report", "nightly", expected[-1])
    assert row.next_fire_at == t0 + MINUTE * 3
    # The crashed tick's start went out twice (the engine starts one saga from them).
    ids = Counter(await started_ids(kafka, topic))
    assert ids == Counter(
        {crashed: 2, **{tick_saga_id("report", "nightly", t2): len(expected) - 1}}
    )
    # Committed, the claim leaves nothing to send again: the next tick is planned as usual.
    await adapter.set_status(crashed, "completed")
    t3 = t0 + MINUTE * 3
    later = await a.fire_due(t3, 500, fire, clock=fixed(t3))
    assert [f.tick for f in later.fired] == [t3]
