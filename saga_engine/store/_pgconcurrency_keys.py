"""The Postgres store's per-key concurrency slots (migration 0012): ``KeySlotStore``
over its pool."""

from __future__ import annotations

from datetime import datetime
from typing import Final

import asyncpg

from saga_engine.store._keyslots import KeySlot, KeyTurn, promote, turn_of
from saga_engine.store._pgbase import _Conn, _unavailable_as_transient

_COLUMNS: Final = "saga_id, saga_type, key, held, lim, queued_at, acquired_at"
#: The first half of the advisory lock's two-integer key: this table's locks, apart
#: from any other advisory lock of the database (migrations take a one-integer key).
_LOCK_CLASS: Final = 0x5A6B


def _slot(row: asyncpg.Record) -> KeySlot:
    return KeySlot(
        saga_id=row["saga_id"],
        saga_type=row["saga_type"],
        key=row["key"],
        held=row["held"],
        limit=row["lim"],
        queued_at=row["queued_at"],
        acquired_at=row["acquired_at"],
    )


async def _lock(conn: _Conn, saga_type: str, key: str) -> None:
    # pg_advisory_xact_lock on a hash of (type, key), held to COMMIT: every engine that
    # queues for, grants or releases a slot of this key waits here, so the holders read
    # after it are still the holders when the grant is written (READ COMMITTED reads what
    # the previous holder of the lock committed). A hash collision only serialises two
    # keys. Taken before any write: FIFO positions follow the order of the lock.
    await conn.execute(
        "SELECT pg_advisory_xact_lock($1, hashtext($2 || chr(31) || $3))",
        _LOCK_CLASS,
        saga_type,
        key,
    )


async def _promote(
    conn: _Conn, saga_type: str, key: str, at: datetime
) -> tuple[list[KeySlot], list[str], list[str]]:
    """Under the key's lock: grants its free slots; (its rows, FIFO order, granted)."""
    found = await conn.fetch(
        f"SELECT {_COLUMNS} FROM saga_key_slots WHERE saga_type = $1 AND key = $2 "
        "ORDER BY position",
        saga_type,
        key,
    )
    rows = [_slot(r) for r in found]
    order = [r.saga_id for r in rows]
    granted = promote(rows, order)
    if granted:
        await conn.execute(
            "UPDATE saga_key_slots SET held = true, acquired_at = $2 WHERE saga_id = ANY($1)",
            granted,
            at,
        )
        rows = [
            KeySlot(r.saga_id, r.saga_type, r.key, True, r.limit, r.queued_at, at)
            if r.saga_id in granted
            else r
            for r in rows
        ]
    return rows, order, granted


class PostgresKeySlots:
    """Mixed into PostgresEventStore: ``KeySlotStore`` over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]

    async def acquire_key(
        self, saga_type: str, key: str, saga_id: str, limit: int, at: datetime
    ) -> KeyTurn:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                await _lock(conn, saga_type, key)
                # ON CONFLICT: asking again keeps the saga's place in the queue.
                await conn.execute(
                    "INSERT INTO saga_key_slots (saga_id, saga_type, key, lim, queued_at) "
                    "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (saga_id) DO NOTHING",
                    saga_id,
                    saga_type,
                    key,
                    limit,
                    at,
                )
                rows, order, _ = await _promote(conn, saga_type, key, at)
        return turn_of(saga_id, rows, order)

    async def release_key(self, saga_id: str, at: datetime) -> list[str]:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(
                    "SELECT saga_type, key FROM saga_key_slots WHERE saga_id = $1", saga_id
                )
                if row is None:
                    return []
                saga_type, key = row["saga_type"], row["key"]
                await _lock(conn, saga_type, key)
                await conn.execute("DELETE FROM saga_key_slots WHERE saga_id = $1", saga_id)
                _, _, granted = await _promote(conn, saga_type, key, at)
        return granted

    async def sweep_keys(self, at: datetime, limit: int = 500) -> list[str]:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                ended = await conn.fetch(
                    "SELECT k.saga_id FROM saga_key_slots k LEFT JOIN sagas s "
                    "ON s.saga_id = k.saga_id WHERE s.saga_id IS NULL "
                    "OR s.status IN ('completed', 'compensated', 'failed', 'cancelled') "
                    "LIMIT $1",
                    limit,
                )
        granted: list[str] = []
        for row in ended:
            granted += await self.release_key(row["saga_id"], at)
        return granted

    async def key_slots(
        self, saga_type: str | None = None, key: str | None = None
    ) -> list[KeySlot]:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(
                    f"SELECT {_COLUMNS} FROM saga_key_slots WHERE ($1::text IS NULL OR "
                    "saga_type = $1) AND ($2::text IS NULL OR key = $2) "
                    "ORDER BY saga_type, key, held DESC, position",
                    saga_type,
                    key,
                )
        return [_slot(r) for r in rows]
