"""The Postgres store's rollouts (migration 0008): the rows every engine applies, and
their append-only audit trail. Mixed into the event store of one database; past one
database they live in the control database (``PostgresRolloutStore``, on a pool of its
own), and the sharded store hands its rollout calls there."""

from __future__ import annotations

from datetime import datetime
from typing import Final

import asyncpg

from saga_engine.core.planning._rollout import Rollout, RolloutChange, RolloutSpec, spec_of
from saga_engine.kernel._settings import PostgresSettings
from saga_engine.store._pgbase import _json, _unavailable_as_transient, side_pool
from saga_engine.store._pgshard_map import PostgresShardMapStore

__all__ = ["PostgresRolloutStore", "PostgresRollouts"]

_ROLLOUT_COLUMNS: Final = "saga_type, version, percent, predicate, updated_at, updated_by"


def _rollout(row: asyncpg.Record) -> Rollout:
    return Rollout(**{k: row[k] for k in _ROLLOUT_COLUMNS.split(", ")})


def _change(row: asyncpg.Record) -> RolloutChange:
    return RolloutChange(
        saga_type=row["saga_type"],
        at=row["at"],
        principal=row["principal"],
        reason=row["reason"],
        before=row["before"],
        after=row["after"],
    )


class PostgresRollouts:
    """Mixed into PostgresEventStore: ``RolloutStore`` over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]

    async def rollouts(self) -> list[Rollout]:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(
                    f"SELECT {_ROLLOUT_COLUMNS} FROM saga_rollouts ORDER BY saga_type"
                )
        return [_rollout(r) for r in rows]

    async def set_rollout(
        self,
        saga_type: str,
        spec: RolloutSpec | None,
        *,
        principal: str,
        reason: str,
        at: datetime,
    ) -> RolloutChange:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn, conn.transaction():
                # Two operators changing one type at once: the second waits on this row
                # lock, then reads the first's row as its "before", so the audit trail
                # chains (each row's before is the previous row's after). A type with no
                # row yet has nothing to lock; the INSERT's ON CONFLICT below then
                # serialises the two on the primary key, and at worst both audit rows say
                # "before: none" (READ COMMITTED suffices for everything else).
                old = await conn.fetchrow(
                    f"SELECT {_ROLLOUT_COLUMNS} FROM saga_rollouts WHERE saga_type = $1 FOR UPDATE",
                    saga_type,
                )
                if spec is None:
                    await conn.execute("DELETE FROM saga_rollouts WHERE saga_type = $1", saga_type)
                else:
                    # ON CONFLICT: setting a type's rollout replaces its row (one per type).
                    await conn.execute(
                        "INSERT INTO saga_rollouts (saga_type, version, percent, predicate, "
                        "updated_at, updated_by) VALUES ($1, $2, $3, $4, $5, $6) "
                        "ON CONFLICT (saga_type) DO UPDATE SET version = EXCLUDED.version, "
                        "percent = EXCLUDED.percent, predicate = EXCLUDED.predicate, "
                        "updated_at = EXCLUDED.updated_at, updated_by = EXCLUDED.updated_by",
                        saga_type,
                        spec.version,
                        spec.percent,
                        spec.predicate,
                        at,
                        principal,
                    )
                before = spec_of(_rollout(old)) if old is not None else None
                change = RolloutChange(
                    saga_type=saga_type,
                    at=at,
                    principal=principal,
                    reason=reason,
                    before=before,
                    after=spec,
                )
                await conn.execute(
                    "INSERT INTO saga_rollout_audit (saga_type, at, principal, reason, before, "
                    "after) VALUES ($1, $2, $3, $4, $5, $6)",
                    saga_type,
                    at,
                    principal,
                    reason,
                    _json(before.model_dump()) if before else None,
                    _json(spec.model_dump()) if spec else None,
                )
        return change

    async def rollout_audit(
        self, saga_type: str | None = None, limit: int = 50
    ) -> list[RolloutChange]:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                rows = await conn.fetch(
                    "SELECT saga_type, at, principal, reason, before, after "
                    "FROM saga_rollout_audit WHERE $1::text IS NULL OR saga_type = $1 "
                    "ORDER BY id DESC LIMIT $2",
                    saga_type,
                    limit,
                )
        return [_change(r) for r in rows]


class PostgresRolloutStore(PostgresRollouts):
    """``RolloutStore`` on a database of its own: past one database, the control
    database's rollouts and flow policies (``saga_rollouts``), which every shard's
    engines apply. Open it with :meth:`connect` (a small pool: read every
    ``engine.rollout_refresh_s``, written by an operator)."""

    def __init__(self, pool: asyncpg.Pool[asyncpg.Record]) -> None:
        self._pool = pool

    @classmethod
    async def connect(cls, settings: PostgresSettings) -> PostgresRolloutStore:
        return cls(await side_pool(settings, max_size=2))

    def shard_maps(self) -> PostgresShardMapStore:
        """The shard map of the same control database, over this store's pool."""
        return PostgresShardMapStore(self._pool)

    async def close(self) -> None:
        await self._pool.close()
