"""The shard map in the control database (store/_pgshard_map.py, migration 0023), on
real Postgres: the first start seeds the settings' map at epoch 1, a stored map wins over
the settings' ranges and must still be named by them, and a change is a compare-and-set
of the epoch that a concurrent writer makes fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from saga_engine.kernel._errors import ShardMapError, StoreUnavailable
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._migrations import migrate
from saga_engine.store._pgshard_map import PostgresShardMapStore
from tests.conftest import PgTarget

pytestmark = pytest.mark.integration

SETTINGS_MAP = ShardMap.build({"a": "0-3", "b": "4-7"}, 8)


@pytest.fixture
async def maps(pg: PgTarget) -> AsyncIterator[PostgresShardMapStore]:
    await migrate(pg.database_dsn, pg.schema)
    async with PostgresShardMapStore.opened(pg.database_dsn, pg.schema) as store:
        yield store


async def _rows(pg: PgTarget) -> list[int]:
    conn = await asyncpg.connect(pg.dsn)
    try:
        return [r["epoch"] for r in await conn.fetch("SELECT epoch FROM shard_map ORDER BY 1")]
    finally:
        await conn.close()


async def test_the_first_start_writes_the_settings_map_at_epoch_1(
    maps: PostgresShardMapStore, pg: PgTarget
) -> None:
    assert await maps.load() is None
    assert await maps.current() is None

    seeded = await maps.seed(SETTINGS_MAP)

    assert seeded == SETTINGS_MAP
    stored = await maps.current()
    assert stored is not None
    assert stored.map == SETTINGS_MAP
    assert stored.map.ranges() == {"a": "0-3", "b": "4-7"}
    assert stored.moving is None
    assert await _rows(pg) == [1]


async def test_engines_starting_together_seed_one_map(
    maps: PostgresShardMapStore, pg: PgTarget
) -> None:
    seeded = await asyncio.gather(*(maps.seed(SETTINGS_MAP) for _ in range(6)))
    assert all(m == SETTINGS_MAP for m in seeded)
    assert await _rows(pg) == [1]


async def test_a_stored_map_wins_over_the_settings_ranges(maps: PostgresShardMapStore) -> None:
    await maps.seed(SETTINGS_MAP)
    moved = await maps.advance(1, SETTINGS_MAP.moved([3], to="b"))

    # The settings still say a: 0-3; the move gave 3 to b, and the map stays as moved.
    again = await maps.seed(SETTINGS_MAP)
    assert again == moved
    assert again.epoch == 2
    assert again.ranges() == {"a": "0-2", "b": "3-7"}


async def test_a_shard_the_settings_add_joins_holding_no_partition(
    maps: PostgresShardMapStore,
) -> None:
    await maps.seed(SETTINGS_MAP)
    wider = ShardMap.build({"a": "0-3", "b": "4-5", "c": "6-7"}, 8)

    joined = await maps.seed(wider)

    assert joined.epoch == 1
    assert joined.names == ("a", "b", "c")
    assert joined.ranges() == {"a": "0-3", "b": "4-7", "c": ""}
    # A move may now name it; the stored map itself is unchanged until one does.
    assert await maps.load() == SETTINGS_MAP
    assert (await maps.advance(1, joined.moved([6, 7], to="c"))).ranges()["c"] == "6-7"


async def test_a_stored_shard_the_settings_lack_is_refused_by_name(
    maps: PostgresShardMapStore,
) -> None:
    await maps.seed(SETTINGS_MAP)
    with pytest.raises(ShardMapError) as caught:
        await maps.seed(ShardMap.build({"a": "0-7"}, 8))
    message = str(caught.value)
    assert "has shard(s) 'b' (partitions 4-7) that SAGA_PG__SHARDS lacks" in message
    assert "epoch 1" in message


async def test_another_partition_count_is_refused(maps: PostgresShardMapStore) -> None:
    await maps.seed(SETTINGS_MAP)
    with pytest.raises(ShardMapError) as caught:
        await maps.seed(ShardMap.build({"a": "0-7", "b": "8-15"}, 16))
    assert "divides 8 inbox partitions, but SAGA_KAFKA__PARTITIONS is 16" in str(caught.value)


async def test_advance_is_a_compare_and_set_of_the_epoch(
    maps: PostgresShardMapStore, pg: PgTarget
) -> None:
    await maps.seed(SETTINGS_MAP)
    # Two operators move different ranges from the map they both read at epoch 1.
    results = await asyncio.gather(
        maps.advance(1, SETTINGS_MAP.moved([0, 1], to="b")),
        maps.advance(1, SETTINGS_MAP.moved([6, 7], to="a")),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, ShardMap)]
    lost = [r for r in results if isinstance(r, ShardMapError)]
    assert len(won) == 1
    assert len(lost) == 1
    assert "the shard map is at epoch 2, not 1: another writer changed it" in str(lost[0])
    assert await maps.load() == won[0]
    assert await _rows(pg) == [1, 2]

    # A writer that read an old epoch is refused; nothing is written.
    with pytest.raises(ShardMapError, match="at epoch 2, not 1"):
        await maps.advance(1, SETTINGS_MAP.moved([2], to="b"))
    assert await _rows(pg) == [1, 2]


async def test_advance_needs_the_next_epoch_and_a_seeded_map(maps: PostgresShardMapStore) -> None:
    with pytest.raises(ShardMapError, match="at epoch \\(none: not seeded\\), not 1"):
        await maps.advance(1, SETTINGS_MAP.moved([0], to="b"))
    await maps.seed(SETTINGS_MAP)
    with pytest.raises(ShardMapError, match="is epoch 2, not 3"):
        await maps.advance(1, SETTINGS_MAP.moved([0], to="b").moved([1], to="b"))


async def test_a_hand_edited_epoch_is_refused(maps: PostgresShardMapStore, pg: PgTarget) -> None:
    await maps.seed(SETTINGS_MAP)
    conn = await asyncpg.connect(pg.dsn)
    try:
        await conn.execute("UPDATE shard_map SET epoch = 5")
    finally:
        await conn.close()
    with pytest.raises(ShardMapError, match="of epoch 5 says epoch 1"):
        await maps.load()


async def test_a_control_database_not_migrated_yet_is_waited_for_not_a_failure(
    pg: PgTarget,
) -> None:
    # A participant (or a second engine) started with the first engine reads the map
    # before that engine's start migrated the control database: a retryable error.
    async with PostgresShardMapStore.opened(pg.database_dsn, pg.schema) as early:
        with pytest.raises(StoreUnavailable, match="migrations have not run"):
            await early.seed(SETTINGS_MAP)
        with pytest.raises(StoreUnavailable, match="migrations have not run"):
            await early.epoch()
        await migrate(pg.database_dsn, pg.schema)
        assert await early.seed(SETTINGS_MAP) == SETTINGS_MAP
