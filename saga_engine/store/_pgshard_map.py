"""The shard map in the control database (migration 0023): its current epoch, the first
start's seed from the settings, and the compare-and-set of a change.

One row per epoch, never updated; the current map is the highest epoch's. The settings
(``SAGA_PG__SHARDS``) name the shards and their first ranges; once a map is stored, its
ranges win (a move changes them, the settings do not follow), and the settings must
still name every shard it holds. A change (a move) writes epoch + 1 if and only if the
map is still at the epoch the writer read: a concurrent writer makes the second fail.

The statements pass the map as JSON text (``::jsonb``, read back with ``::text``), so any
pool serves, with or without the event store's jsonb codec.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import asyncpg

from saga_engine.kernel._errors import ShardMapError, StoreUnavailable
from saga_engine.kernel._serde import dumps, loads
from saga_engine.kernel._shards import ShardMap
from saga_engine.store._pgbase import _unavailable_as_transient

__all__ = ["PostgresShardMapStore", "StoredShardMap", "reconciled"]

_CURRENT = (
    "SELECT epoch, map::text AS map, written_at, moving::text AS moving "
    "FROM shard_map ORDER BY epoch DESC LIMIT 1"
)


@dataclass(frozen=True, slots=True)
class StoredShardMap:
    """The current row of ``shard_map``: the map, when it was written, and the move under
    way (None when none is)."""

    map: ShardMap
    written_at: datetime
    moving: dict[str, Any] | None


def _stored(row: asyncpg.Record) -> StoredShardMap:
    shard_map = ShardMap.from_data(loads(row["map"]))
    if shard_map.epoch != row["epoch"]:
        raise ShardMapError(
            f"the stored shard map of epoch {row['epoch']} says epoch {shard_map.epoch}: the "
            "shard_map table was edited by hand; restore the row"
        )
    moving = loads(row["moving"]) if row["moving"] is not None else None
    return StoredShardMap(shard_map, row["written_at"], moving)


@contextmanager
def _control_unavailable() -> Iterator[None]:
    """Connection trouble as ``StoreUnavailable`` (``_pgbase``), and a control database
    whose migrations have not run yet as well: a participant or a second engine started
    at the same moment as the first engine reads the map before that engine's start has
    migrated the control database; they wait for it (retried as any unreachable
    dependency at start) instead of failing."""
    try:
        with _unavailable_as_transient():
            yield
    except asyncpg.UndefinedTableError as exc:
        raise StoreUnavailable(
            "the control database has no shard_map table yet: its migrations have not run "
            "(an engine's start runs them, or `saga migrate`)"
        ) from exc


class PostgresShardMapStore:
    """The shard map of the control database, over a pool whose connections resolve the
    engine's schema (the ``search_path`` the event store's pool sets)."""

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        self._pool = pool

    @classmethod
    @asynccontextmanager
    async def opened(
        cls, dsn: str, schema: str, *, timeout_s: float = 10.0
    ) -> AsyncIterator[PostgresShardMapStore]:
        """A store over a small pool of its own (the CLI's, a test's), closed after."""
        with _unavailable_as_transient():
            pool = await asyncpg.create_pool(
                dsn,
                min_size=1,
                max_size=2,
                timeout=timeout_s,
                command_timeout=timeout_s,
                server_settings={"search_path": schema},
            )
        try:
            yield cls(pool)
        finally:
            await pool.close()

    async def current(self) -> StoredShardMap | None:
        """The highest epoch's row, or None before the first start seeded one."""
        with _control_unavailable():
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(_CURRENT)
        return None if row is None else _stored(row)

    async def epoch(self) -> int | None:
        """The epoch in force (a cheap read, to learn whether the map changed), or None
        before the first start seeded one."""
        with _control_unavailable():
            async with self._pool.acquire() as conn:
                found: int | None = await conn.fetchval("SELECT max(epoch) FROM shard_map")
        return found

    async def load(self) -> ShardMap | None:
        """The current map, or None before the first start seeded one."""
        stored = await self.current()
        return None if stored is None else stored.map

    async def seed(self, settings_map: ShardMap) -> ShardMap:
        """The map in force: the stored one, else ``settings_map`` written at epoch 1.

        A stored map wins over the settings' ranges (moves change them); shards the
        settings add and the stored map lacks join it holding no partition, until a move
        gives them some. A stored map holding a shard the settings lack, or dividing
        another number of partitions than ``SAGA_KAFKA__PARTITIONS``, is a
        ``ShardMapError`` naming it. Safe to call from several engines at once."""
        first = ShardMap(epoch=1, names=settings_map.names, owners=settings_map.owners)
        with _control_unavailable():
            async with self._pool.acquire() as conn:
                await conn.execute(
                    "INSERT INTO shard_map (epoch, map) VALUES (1, $1::text::jsonb) "
                    "ON CONFLICT (epoch) DO NOTHING",
                    dumps(first.to_data()).decode(),
                )
                row = await conn.fetchrow(_CURRENT)
        if row is None:  # written above, or by another engine before: deleted since
            raise ShardMapError("the shard map was deleted while it was seeded; start again")
        return reconciled(_stored(row).map, settings_map)

    async def advance(
        self, expected_epoch: int, new_map: ShardMap, *, moving: dict[str, Any] | None = None
    ) -> ShardMap:
        """Writes ``new_map`` (at ``expected_epoch + 1``) if the stored map is still at
        ``expected_epoch``; a ``ShardMapError`` saying which epoch it is at otherwise
        (another writer changed it: read it again and decide again). ``moving``: the move
        still under way in the new row (a move's cleanup, after its commit point)."""
        if new_map.epoch != expected_epoch + 1:
            raise ShardMapError(
                f"the map after epoch {expected_epoch} is epoch {expected_epoch + 1}, "
                f"not {new_map.epoch}: build it with ShardMap.moved"
            )
        with _control_unavailable():
            async with self._pool.acquire() as conn:
                written = await conn.fetchval(
                    "INSERT INTO shard_map (epoch, map, moving) "
                    "SELECT $2, $3::text::jsonb, $4::text::jsonb "
                    "WHERE (SELECT coalesce(max(epoch), 0) FROM shard_map) = $1 "
                    "ON CONFLICT (epoch) DO NOTHING RETURNING epoch",
                    expected_epoch,
                    new_map.epoch,
                    dumps(new_map.to_data()).decode(),
                    None if moving is None else dumps(moving).decode(),
                )
                if written is not None:
                    return new_map
                now = await conn.fetchval("SELECT max(epoch) FROM shard_map")
        raise ShardMapError(
            f"the shard map is at epoch {now if now is not None else '(none: not seeded)'}, "
            f"not {expected_epoch}: another writer changed it since it was read. Nothing "
            "was written; read the map again (`saga shard status`) and decide again"
        )

    async def set_moving(
        self, epoch: int, moving: dict[str, Any] | None, *, expected: dict[str, Any] | None
    ) -> bool:
        """Sets the move under way of the current map (``None``: clears it) if the map is
        still at ``epoch`` and its move is still ``expected`` (``None``: no move); False
        when either changed (another writer: read the map again)."""
        with _control_unavailable():
            async with self._pool.acquire() as conn:
                written = await conn.fetchval(
                    "UPDATE shard_map SET moving = $2::text::jsonb WHERE epoch = $1 "
                    "AND epoch = (SELECT max(epoch) FROM shard_map) "
                    "AND moving IS NOT DISTINCT FROM $3::text::jsonb RETURNING epoch",
                    epoch,
                    None if moving is None else dumps(moving).decode(),
                    None if expected is None else dumps(expected).decode(),
                )
        return written is not None


def reconciled(stored: ShardMap, settings_map: ShardMap) -> ShardMap:
    """The stored map, checked against the settings and joined by the shards they add."""
    if stored.partitions != settings_map.partitions:
        raise ShardMapError(
            f"the stored shard map (epoch {stored.epoch}) divides {stored.partitions} inbox "
            f"partitions, but SAGA_KAFKA__PARTITIONS is {settings_map.partitions}: a saga's "
            "partition, and so its shard, would change. Set SAGA_KAFKA__PARTITIONS back to "
            f"{stored.partitions}"
        )
    lacking = [name for name in stored.names if name not in settings_map.names]
    if lacking:
        held = {name: stored.ranges()[name] or "none" for name in lacking}
        raise ShardMapError(
            f"the stored shard map (epoch {stored.epoch}) has shard(s) "
            f"{', '.join(f'{n!r} (partitions {r})' for n, r in held.items())} that "
            "SAGA_PG__SHARDS lacks: their sagas would have no address. Add them to "
            "SAGA_PG__SHARDS with their DSN"
        )
    added = tuple(name for name in settings_map.names if name not in stored.names)
    if not added:
        return stored
    return ShardMap(epoch=stored.epoch, names=stored.names + added, owners=stored.owners)
