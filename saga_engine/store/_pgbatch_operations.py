"""Batch operations in Postgres (migration 0013): the rows, their progress, and the lease
by which one engine works on each.

A claim takes a running operation whose lease has expired and sets a new one; every
progress write renews it and is conditional on still holding it (``lease_owner`` and
``state = 'running'`` in its WHERE), so an engine that lost the operation (cancelled by
an operator, or taken over after its lease expired) records nothing more and stops.
"""

from __future__ import annotations

from datetime import datetime
from typing import Final

import asyncpg

from saga_engine.core.planning._batch_operations import BatchSpec, BatchState, check_batch_move
from saga_engine.kernel._errors import BatchNotFound
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.store._batch_operation_store import MAX_ERRORS, BatchRow, Dealt, Lease
from saga_engine.store._pgbase import _json, _unavailable_as_transient, side_pool

__all__ = ["PostgresBatchStore"]

_COLUMNS: Final = (
    "operation_id, spec, principal, state, total, acted, skipped, failed, cursor, errors, "
    "lease_owner, lease_until, created_at, updated_at, finished_at"
)


def _row(r: asyncpg.Record) -> BatchRow:
    return BatchRow(
        operation_id=r["operation_id"],
        # Validated when it was created (the admin API's checks stand behind it).
        spec=BatchSpec.model_validate(r["spec"]),
        principal=r["principal"],
        state=BatchState(r["state"]),
        total=r["total"],
        acted=r["acted"],
        skipped=r["skipped"],
        failed=r["failed"],
        cursor=r["cursor"],
        errors=list(r["errors"]),
        lease_owner=r["lease_owner"],
        lease_until=r["lease_until"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
        finished_at=r["finished_at"],
    )


# FOR UPDATE SKIP LOCKED: every idle engine polls for an operation. Each takes one no
# other claim holds, skipping locked rows instead of queueing behind them; the lease it
# writes in the same statement keeps the others off it once the row lock is released.
_CLAIM: Final = f"""
UPDATE saga_batch_operations AS o SET lease_owner = $1, lease_until = $2
FROM (
    SELECT operation_id FROM saga_batch_operations
    WHERE state = 'running' AND (lease_until IS NULL OR lease_until <= $3 OR lease_owner = $1)
    ORDER BY created_at, operation_id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
) AS free
WHERE o.operation_id = free.operation_id
RETURNING {", ".join(f"o.{c.strip()}" for c in _COLUMNS.split(","))}
"""

_ADVANCE: Final = """
UPDATE saga_batch_operations SET
    acted = acted + $5, skipped = skipped + $6, failed = failed + $7,
    cursor = coalesce($8, cursor),
    errors = CASE WHEN $9::jsonb IS NOT NULL AND jsonb_array_length(errors) < $10
                  THEN errors || $9::jsonb ELSE errors END,
    lease_until = $4, updated_at = $3
WHERE operation_id = $1 AND lease_owner = $2 AND state = 'running'
"""


class PostgresBatchStore:
    """The ``saga_batch_operations`` table. Open it with :meth:`connect` (a small pool
    of its own: the event store's writer keeps its pool for the hot path)."""

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, settings: PostgresSettings) -> PostgresBatchStore:
        # The runner's writes and the admin API's reads.
        return cls(await side_pool(settings, max_size=3))

    async def close(self) -> None:
        await self._pool.close()

    async def migrated(self) -> bool:
        with _unavailable_as_transient():
            found: bool = await self._pool.fetchval(
                "SELECT to_regclass('saga_batch_operations') IS NOT NULL"
            )
        return found

    async def create(
        self, operation_id: str, spec: BatchSpec, principal: str, total: int, now: datetime
    ) -> BatchRow:
        with _unavailable_as_transient():
            r = await self._pool.fetchrow(
                "INSERT INTO saga_batch_operations "
                "(operation_id, spec, principal, state, total, created_at, updated_at) "
                f"VALUES ($1, $2, $3, 'running', $4, $5, $5) RETURNING {_COLUMNS}",
                operation_id,
                _json(spec.model_dump(mode="json")),
                principal,
                total,
                now,
            )
        assert r is not None
        return _row(r)

    async def get(self, operation_id: str) -> BatchRow:
        with _unavailable_as_transient():
            r = await self._pool.fetchrow(
                f"SELECT {_COLUMNS} FROM saga_batch_operations WHERE operation_id = $1",
                operation_id,
            )
        if r is None:
            raise BatchNotFound(operation_id)
        return _row(r)

    async def list(self, *, limit: int = 50) -> list[BatchRow]:
        with _unavailable_as_transient():
            rows = await self._pool.fetch(
                f"SELECT {_COLUMNS} FROM saga_batch_operations "
                "ORDER BY created_at DESC, operation_id DESC LIMIT $1",
                limit,
            )
        return [_row(r) for r in rows]

    async def claim(self, lease: Lease) -> BatchRow | None:
        with _unavailable_as_transient():
            r = await self._pool.fetchrow(_CLAIM, lease.owner, lease.until, lease.now)
        return None if r is None else _row(r)

    async def advance(self, operation_id: str, lease: Lease, dealt: Dealt | None = None) -> bool:
        entry = dealt.error_entry() if dealt is not None else None
        acted, skipped, failed = dealt.tallies() if dealt is not None else (0, 0, 0)
        with _unavailable_as_transient():
            status = await self._pool.execute(
                _ADVANCE,
                operation_id,
                lease.owner,
                lease.now,
                lease.until,
                acted,
                skipped,
                failed,
                dealt.saga_id if dealt is not None else None,
                _json([entry]) if entry is not None else None,  # type: ignore[arg-type]
                MAX_ERRORS,
            )
        return bool(status == "UPDATE 1")

    async def finish(self, operation_id: str, owner: str, now: datetime) -> bool:
        with _unavailable_as_transient():
            status = await self._pool.execute(
                "UPDATE saga_batch_operations SET state = 'completed', updated_at = $3, "
                "finished_at = $3, lease_owner = NULL, lease_until = NULL "
                "WHERE operation_id = $1 AND lease_owner = $2 AND state = 'running'",
                operation_id,
                owner,
                now,
            )
        return bool(status == "UPDATE 1")

    async def cancel(self, operation_id: str, now: datetime) -> BatchRow:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                # FOR UPDATE: the state checked is the state changed (a finish racing
                # with this cancel commits first or finds the row cancelled).
                state = await conn.fetchval(
                    "SELECT state FROM saga_batch_operations WHERE operation_id = $1 FOR UPDATE",
                    operation_id,
                )
                if state is None:
                    raise BatchNotFound(operation_id)
                check_batch_move(BatchState(state), BatchState.CANCELLED)
                await conn.execute(
                    "UPDATE saga_batch_operations SET state = 'cancelled', updated_at = $2, "
                    "finished_at = $2, lease_owner = NULL, lease_until = NULL "
                    "WHERE operation_id = $1",
                    operation_id,
                    now,
                )
        return await self.get(operation_id)
