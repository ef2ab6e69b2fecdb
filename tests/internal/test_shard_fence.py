"""The fence of a sharded store on real Postgres clusters (store/_pgfence, migration 0024,
issue 43): each group commit reads ``shard_partitions`` for its batch's partitions and
refuses the writes of a partition the shard does not hold 'active' (``StaleShardMap``),
the rest of the batch committing; the seeding of a shard's rows on its first open; a
sharded store under an old map following a finished move; and a move's lock and mark
'moving' while group commits run. The shards are clusters 2 and 3 (``pg_shards``), the
control database the test's ``pg``."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import orjson
import pytest
from pydantic import BaseModel, SecretStr

from saga_engine import Saga, SagaContext, Signal
from saga_engine.client import SagaClient
from saga_engine.core.history._events import Event, SagaStarted, SignalReceived
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import StaleShardMap
from saga_engine.kernel._partitioning import partition_for
from saga_engine.kernel._settings import KafkaSettings, PostgresSettings, Settings
from saga_engine.settings import AdminSettings
from saga_engine.store._connect import connect_event_store
from saga_engine.store._migrations import migrate
from saga_engine.store._pgfence import (
    READ_FENCE,
    ShardFence,
    activate,
    fence_states,
    mark_moving,
    release,
    seed_partitions,
)
from saga_engine.store._pgshard_map import PostgresShardMapStore
from saga_engine.store._pgstore import PostgresEventStore
from saga_engine.store._sharded import ShardedEventStore
from saga_engine.store._store import Append, NewSaga, Projection
from saga_engine.worker import SagaWorker
from tests.conftest import PgTarget
from tests.internal.test_pool_reset import log_statements
from tests.waiting import eventually

pytestmark = pytest.mark.integration

PARTITIONS = 8
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def ids_in(partition: int, n: int, prefix: str = "s") -> list[str]:
    found = (f"{prefix}-{i}" for i in itertools.count())
    return list(
        itertools.islice((i for i in found if partition_for(i, PARTITIONS) == partition), n)
    )


def started() -> list[Event]:
    return [SagaStarted(at=T0, saga_type="order", input={})]


def new(saga_id: str) -> NewSaga:
    return NewSaga(saga_id, "order", started(), Projection(SagaStatus.RUNNING))


def step(saga_id: str, seq: int) -> Append:
    event = SignalReceived(at=T0, signal_id=f"{saga_id}-{seq}", name="go")
    return Append(saga_id, seq, [event], Projection(SagaStatus.RUNNING))


def pg_settings(target: PgTarget) -> PostgresSettings:
    return PostgresSettings(dsn=SecretStr(target.database_dsn), db_schema=target.schema)


async def fenced(target: PgTarget, **kw: Any) -> PostgresEventStore:
    return await PostgresEventStore.connect(
        pg_settings(target), fence=ShardFence(PARTITIONS, "a"), **kw
    )


async def set_states(target: PgTarget, states: dict[int, str], epoch: int = 1) -> None:
    conn = await asyncpg.connect(target.dsn)
    try:
        await conn.execute("DELETE FROM shard_partitions")
        await conn.executemany(
            "INSERT INTO shard_partitions (partition, state, epoch) VALUES ($1, $2, $3)",
            [(p, s, epoch) for p, s in states.items()],
        )
    finally:
        await conn.close()


async def fetchval(target: PgTarget, sql: str, *args: Any) -> Any:
    conn = await asyncpg.connect(target.dsn)
    try:
        return await conn.fetchval(sql, *args)
    finally:
        await conn.close()


# --------------------------------------------------------------------------- the check


async def test_the_fence_refuses_an_absent_and_a_moving_partition_and_the_batch_commits(
    pg: PgTarget,
) -> None:
    await migrate(pg.database_dsn, pg.schema)
    active, moving, absent = ids_in(1, 2), ids_in(2, 2), ids_in(3, 2)
    await set_states(pg, {1: "active", 2: "active"})
    store = await fenced(pg)
    try:
        # The appends' sagas exist: created while their partitions were active.
        assert all([await store.create(new(active[0])), await store.create(new(moving[0]))])
        await set_states(pg, {1: "active", 2: "moving"})
        batches = store.stats.batches
        results = await asyncio.gather(
            store.append(step(active[0], 1)),
            store.create(new(active[1])),
            store.append(step(moving[0], 1)),
            store.create(new(moving[1])),
            store.create(new(absent[0])),
            store.append(step(absent[1], 1)),
            return_exceptions=True,
        )
        assert store.stats.batches == batches + 1  # one group commit
        assert list(results[:2]) == [2, True]
        refused = [r for r in results[2:] if isinstance(r, StaleShardMap)]
        assert len(refused) == 4, results
        assert [(r.partition, r.moving) for r in refused] == [
            (2, True),
            (2, True),
            (3, False),
            (3, False),
        ]
        assert "being moved" in str(refused[0])
        assert "does not hold" in str(refused[2])
    finally:
        await store.close()
    assert await fetchval(pg, "SELECT last_seq FROM sagas WHERE saga_id = $1", active[0]) == 2
    assert await fetchval(pg, "SELECT last_seq FROM sagas WHERE saga_id = $1", moving[0]) == 1
    written = await fetchval(
        pg,
        "SELECT array_agg(saga_id ORDER BY saga_id) FROM sagas WHERE saga_id <> ALL($1)",
        [active[0], moving[0]],
    )
    assert written == [active[1]]  # no refused create made a row


async def test_a_store_without_a_fence_sends_the_statements_it_always_did(
    pg: PgTarget, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One database never reads shard_partitions; a fenced store reads it once per batch
    and sends nothing else more."""
    await migrate(pg.database_dsn, pg.schema)
    await set_states(pg, dict.fromkeys(range(PARTITIONS), "active"))
    logged = log_statements(monkeypatch)

    async def writes(store: PostgresEventStore, prefix: str) -> list[str]:
        try:
            for round in (1, 2):  # the second: asyncpg's type introspection is done
                ids = [f"{prefix}-{round}-{i}" for i in range(4)]
                logged.clear()
                assert all(await asyncio.gather(*(store.create(new(i)) for i in ids)))
                assert await asyncio.gather(*(store.append(step(i, 1)) for i in ids)) == [2] * 4
            return list(logged)
        finally:
            await store.close()

    plain = await writes(await PostgresEventStore.connect(pg_settings(pg)), "plain")
    checked = await writes(await fenced(pg), "fenced")
    fence = " ".join(READ_FENCE.split())
    assert not any("shard_partitions" in q for q in plain)
    assert checked.count(fence) == 2  # a batch of creates, a batch of appends
    assert [q for q in checked if q != fence] == plain


# --------------------------------------------------------------------------- sharded


def sharded_settings(pg: PgTarget, a: PgTarget, b: PgTarget) -> Settings:
    shards = [
        {"name": "a", "partitions": "0-3", "dsn": a.database_dsn},
        {"name": "b", "partitions": "4-7", "dsn": b.database_dsn},
    ]
    return Settings(
        pg=PostgresSettings.model_validate(
            {
                "dsn": pg.database_dsn,
                "db_schema": pg.schema,
                "control_dsn": pg.database_dsn,
                "shards": orjson.loads(orjson.dumps(shards)),
            }
        ),
        kafka=KafkaSettings(partitions=PARTITIONS),
    )


@pytest.fixture
async def migrated(pg: PgTarget, pg_shards: tuple[PgTarget, ...]) -> tuple[PgTarget, ...]:
    for target in (pg, *pg_shards):
        await migrate(target.database_dsn, target.schema)
    return pg_shards


@pytest.fixture
async def sharded(pg: PgTarget, migrated: tuple[PgTarget, ...]) -> AsyncIterator[ShardedEventStore]:
    a, b = migrated
    store = await connect_event_store(sharded_settings(pg, a, b))
    assert isinstance(store, ShardedEventStore)
    try:
        yield store
    finally:
        await store.close()


async def copy_saga(saga_id: str, source: PgTarget, target: PgTarget) -> None:
    """A move's copy of one saga's rows, by hand."""
    src, dst = await asyncpg.connect(source.dsn), await asyncpg.connect(target.dsn)
    try:
        for table in ("sagas", "saga_decisions"):
            for row in await src.fetch(f"SELECT * FROM {table} WHERE saga_id = $1", saga_id):
                cols = list(row.keys())
                marks = ", ".join(f"${i}" for i in range(1, len(cols) + 1))
                await dst.execute(
                    f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({marks})",
                    *row.values(),
                )
    finally:
        await src.close()
        await dst.close()


async def delete_saga(saga_id: str, source: PgTarget) -> None:
    """A move's cleanup of one saga's rows on its source, by hand."""
    conn = await asyncpg.connect(source.dsn)
    try:
        for table in ("saga_decisions", "sagas"):
            await conn.execute(f"DELETE FROM {table} WHERE saga_id = $1", saga_id)
    finally:
        await conn.close()


async def test_a_store_under_an_old_map_is_refused_reloads_it_and_writes_to_the_new_shard(
    pg: PgTarget, migrated: tuple[PgTarget, ...], sharded: ShardedEventStore
) -> None:
    a, b = migrated
    [moved, created] = ids_in(2, 2)  # partition 2: shard a at epoch 1
    [on_b] = ids_in(5, 1)
    assert await sharded.create(new(moved))
    assert await sharded.create(new(on_b))  # both shards opened, so both seeded
    assert set((await fence_states_of(a)).keys()) == {0, 1, 2, 3}
    # A move of partition 2 to b, finished: copied, active on b, the map advanced,
    # released on a. This store still routes by epoch 1.
    await copy_saga(moved, a, b)
    await set_states(b, {4: "active", 5: "active", 6: "active", 7: "active", 2: "active"}, 2)
    async with PostgresShardMapStore.opened(pg.database_dsn, pg.schema) as maps:
        current = await maps.load()
        assert current is not None
        await maps.advance(1, current.moved([2], "b"))
    await set_states(a, {0: "active", 1: "active", 3: "active"})
    assert sharded.shard_map.epoch == 1
    assert await sharded.append(step(moved, 1)) == 2
    assert await sharded.create(new(created))
    assert sharded.shard_map.epoch == 2
    assert await fetchval(b, "SELECT last_seq FROM sagas WHERE saga_id = $1", moved) == 2
    assert await fetchval(a, "SELECT last_seq FROM sagas WHERE saga_id = $1", moved) == 1
    assert await fetchval(b, "SELECT count(*) FROM sagas WHERE saga_id = $1", created) == 1
    assert await fetchval(a, "SELECT count(*) FROM sagas WHERE saga_id = $1", created) == 0
    assert (await sharded.load(moved)).record.last_seq == 2  # reads follow the map too


async def fence_states_of(target: PgTarget) -> dict[int, tuple[str, int]]:
    conn = await asyncpg.connect(target.dsn)
    try:
        return dict(await fence_states(conn))
    finally:
        await conn.close()


async def test_engines_opening_a_shard_together_seed_its_partitions_once(
    pg: PgTarget, migrated: tuple[PgTarget, ...]
) -> None:
    a, b = migrated
    settings = sharded_settings(pg, a, b)
    stores = await asyncio.gather(*(connect_event_store(settings) for _ in range(2)))
    try:
        ids = ids_in(1, 2)
        assert all(
            await asyncio.gather(*(s.create(new(i)) for s, i in zip(stores, ids, strict=False)))
        )
        assert await fence_states_of(a) == dict.fromkeys(range(4), ("active", 1))
        assert await fence_states_of(b) == {}  # not opened yet
        # A move recorded as under way: a shard opened now is not seeded.
        conn = await asyncpg.connect(pg.dsn)
        try:
            await conn.execute('UPDATE shard_map SET moving = \'{"partitions": "4"}\'')
        finally:
            await conn.close()
        with pytest.raises(StaleShardMap):
            await stores[0].create(new(ids_in(5, 1)[0]))
        assert await fence_states_of(b) == {}
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    # Seeded once: a shard holding rows is never seeded again (no move recorded now).
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute("UPDATE shard_map SET moving = NULL")
    finally:
        await conn.close()
    await set_states(a, {0: "active", 1: "moving"}, 1)
    again = await connect_event_store(settings)
    try:
        with pytest.raises(StaleShardMap):
            await again.create(new(ids_in(1, 1, prefix="x")[0]))
    finally:
        await again.close()
    assert await fence_states_of(a) == {0: ("active", 1), 1: ("moving", 1)}


# --------------------------------------------------------------------------- a move


async def test_after_a_move_marks_a_range_moving_none_of_its_appends_commits(
    pg: PgTarget,
) -> None:
    """The move's LOCK TABLE + UPDATE while group commits of two partitions run: from
    its commit on, no append of the moving partition commits; the other's go on."""
    await migrate(pg.database_dsn, pg.schema)
    await set_states(pg, {1: "active", 2: "active"})
    store = await fenced(pg)
    moving_ids, other_ids = ids_in(2, 8), ids_in(1, 8)
    stop = asyncio.Event()
    refused: list[StaleShardMap] = []

    async def writer(saga_id: str) -> None:
        assert await store.create(new(saga_id))
        seq = 1
        while not stop.is_set():
            try:
                seq = await store.append(step(saga_id, seq))
            except StaleShardMap as exc:
                refused.append(exc)
                await asyncio.sleep(0.01)  # a retry's pause, not a synchronisation

    count = "SELECT count(*) FROM saga_decisions WHERE saga_id = ANY($1)"
    writers = [asyncio.create_task(writer(i)) for i in moving_ids + other_ids]
    try:
        await eventually(
            lambda: _above(pg, count, moving_ids, 200), what="appends of partition 2 commit"
        )
        conn = await asyncpg.connect(pg.dsn)
        try:
            async with conn.transaction():
                assert await mark_moving(conn, [2]) == 1
            at_move = await conn.fetchval(count, moving_ids)
            others_at_move = await conn.fetchval(count, other_ids)
        finally:
            await conn.close()
        await eventually(
            lambda: _above(pg, count, other_ids, others_at_move + 200),
            what="the other partition's appends go on",
        )
        await eventually(lambda: asyncio.sleep(0, len(refused) >= 8), what="refusals")
    finally:
        stop.set()
        await asyncio.gather(*writers, return_exceptions=True)
        await store.close()
    assert await fetchval(pg, count, moving_ids) == at_move
    assert all(r.moving and r.partition == 2 for r in refused)


async def _above(target: PgTarget, sql: str, ids: list[str], n: int) -> bool:
    return int(await fetchval(target, sql, ids)) > n


async def test_the_moves_lock_waits_for_a_group_commit_that_read_the_fence(pg: PgTarget) -> None:
    """A batch that read 'active' and is still writing (held at its guard by a row lock)
    commits before the move marks the range 'moving': the move's LOCK TABLE waits for
    it. Without the lock the batch would commit after the move, under the old state."""
    await migrate(pg.database_dsn, pg.schema)
    await set_states(pg, {2: "active"})
    store = await fenced(pg)
    [saga_id] = ids_in(2, 1)
    blocker, mover = await asyncpg.connect(pg.dsn), await asyncpg.connect(pg.dsn)
    count = "SELECT count(*) FROM saga_decisions WHERE saga_id = $1"
    try:
        assert await store.create(new(saga_id))
        holding = blocker.transaction()
        await holding.start()
        await blocker.execute("SELECT 1 FROM sagas WHERE saga_id = $1 FOR UPDATE", saga_id)
        append = asyncio.create_task(store.append(step(saga_id, 1)))
        await eventually(
            lambda: _waiting(pg, "%UPDATE sagas AS s%"), what="the batch waits at its guard"
        )

        async def move() -> int:
            async with mover.transaction():
                await mark_moving(mover, [2])
            return int(await mover.fetchval(count, saga_id))

        moving = asyncio.create_task(move())
        await eventually(
            lambda: (
                asyncio.sleep(0, moving.done())
                if moving.done()
                else _waiting(pg, "%LOCK TABLE shard_partitions%")
            ),
            what="the move waits for the batch (or, without its lock, is done)",
        )
        await holding.commit()
        at_move = await moving
        assert await append == 2  # it read 'active' before the move
    finally:
        await blocker.close()
        await mover.close()
        await store.close()
    assert at_move == 2  # the batch's append committed before the move did
    assert await fetchval(pg, count, saga_id) == 2


async def _waiting(target: PgTarget, query_like: str) -> bool:
    return bool(
        await fetchval(
            target,
            "SELECT count(*) > 0 FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND query LIKE $1",
            query_like,
        )
    )


# --------------------------------------------------------------------------- a worker


class Go(BaseModel):
    n: int = 1


class Order(BaseModel):
    n: int = 1


class Done(BaseModel):
    n: int = 0


class Waiting(Saga[Order, Done]):
    name = "fence-waiting"
    go = Signal(Go)

    async def run(self, ctx: SagaContext, order: Order) -> Done:
        got = await ctx.wait_signal(self.go)
        return Done(n=got.n + order.n)


async def test_a_worker_retries_an_input_its_moving_range_refused_and_ends_on_the_new_shard(
    pg: PgTarget,
    migrated: tuple[PgTarget, ...],
    kafka_bootstrap: str,
    unique_id: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A signal to a saga whose range is 'moving' is refused: nothing is written, the
    input is retried (not dead-lettered); once the move is over the retry lands on the
    new shard, where the saga completes."""
    a, b = migrated
    base = sharded_settings(pg, a, b)
    settings = base.model_copy(
        update={
            "kafka": KafkaSettings(
                bootstrap_servers=kafka_bootstrap,
                topic_prefix=f"t{unique_id}",
                group_id=f"engines-{unique_id}",
                partitions=PARTITIONS,
            ),
            "admin": AdminSettings(enabled=False),
        }
    )
    [saga_id] = ids_in(2, 1, prefix="order")  # partition 2: shard a
    status = "SELECT status FROM sagas WHERE saga_id = $1"
    worker = SagaWorker(settings, [Waiting])
    await worker.start()
    try:
        async with SagaClient(settings) as client:
            await client.start(Waiting, Order(n=1), saga_id=saga_id)
            await eventually(lambda: fetchval(a, status, saga_id), what="the saga on shard a")
            conn = await asyncpg.connect(a.dsn)
            try:
                async with conn.transaction():
                    assert await mark_moving(conn, [2]) == 1
            finally:
                await conn.close()
            await client.signal(saga_id, Waiting.go, Go(n=41))
            await eventually(
                lambda: asyncio.sleep(
                    0, any("being moved" in r.getMessage() for r in caplog.records)
                ),
                what="the signal refused while its range moves",
            )
            # The move's steps 3-6, by hand.
            await copy_saga(saga_id, a, b)
            await set_states(
                b, {4: "active", 5: "active", 6: "active", 7: "active", 2: "active"}, 2
            )
            async with PostgresShardMapStore.opened(pg.database_dsn, pg.schema) as maps:
                current = await maps.load()
                assert current is not None
                await maps.advance(1, current.moved([2], "b"))
            await set_states(a, {0: "active", 1: "active", 3: "active"})
            await delete_saga(saga_id, a)
            done = await client.result(saga_id, timeout=60)
    finally:
        await worker.stop()
    assert done == {"n": 42}
    assert await fetchval(b, status, saga_id) == "completed"
    assert worker.stats_dead_lettered == 0


async def test_the_moves_steps_on_the_fence_can_each_run_again(
    migrated: tuple[PgTarget, ...],
) -> None:
    """mark_moving, activate and release: what each leaves, and the same again."""
    a, b = migrated
    source, target = await asyncpg.connect(a.dsn), await asyncpg.connect(b.dsn)
    try:
        assert await seed_partitions(source, [0, 1, 2, 3], 1) == 4
        assert await seed_partitions(source, [0, 1, 2, 3], 1) == 0
        assert await seed_partitions(target, [4, 5, 6, 7], 1) == 4
        for expected in (2, 0):
            async with source.transaction():
                assert await mark_moving(source, [2, 3]) == expected
        assert (await fence_states(source))[2] == ("moving", 1)
        for _ in range(2):
            async with target.transaction():
                await activate(target, [2, 3], 2)
        assert await fence_states(target) == {
            **dict.fromkeys((4, 5, 6, 7), ("active", 1)),
            2: ("active", 2),
            3: ("active", 2),
        }
        for expected in (2, 0):
            async with source.transaction():
                assert await release(source, [2, 3]) == expected
        assert await fence_states(source) == {0: ("active", 1), 1: ("active", 1)}
    finally:
        await source.close()
        await target.close()
