"""The Postgres store's reads: one saga, its history, and the queries over many.

Every query over many sagas is answered by SQL with an index (migrations 0001, 0004),
never by reading rows into Python to filter them there.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import datetime
from typing import Final

import asyncpg

from saga_engine.core.history._codec import CodecChain, Undecodable
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import SagaNotFound
from saga_engine.kernel._partitioning import key_hash, partition_for
from saga_engine.store._blobs import BlobStore
from saga_engine.store._pgbase import (
    _OPEN_STATUSES,
    _RECORD_COLUMNS,
    _record,
    _unavailable_as_transient,
    history_sql,
)
from saga_engine.store._pgblobs import stored_events_of
from saga_engine.store._store import (
    LoadedSaga,
    OpenSummary,
    RunSpan,
    SagaRecord,
    StoredEvent,
    as_utc,
    check_lookup,
    run_spans,
)

_PARKED_STATUSES: Final = [s.value for s in SagaStatus if s.is_parked]


# The history is one row per decision (migration 0022): each query reads the rows that
# hold the events it wants, by the primary key (saga_id, seq), and unnests them.

#: A saga's whole history, up to its record's last_seq ($2).
_WHOLE_HISTORY: Final = (
    f"SELECT seq, data FROM ({history_sql('d.saga_id = $1 AND d.seq <= $2')}) AS h "
    "WHERE seq <= $2 ORDER BY seq"
)
#: Its events after a seq ($2), of some kinds ($3, null: all), up to last_seq ($4): the
#: rows from the one holding event $2 + 1 on (one backward probe finds where it starts).
_HISTORY_AFTER: Final = f"""
SELECT seq, data FROM ({
    history_sql(
        "d.saga_id = $1 AND d.seq <= $4 AND d.seq >= (SELECT coalesce(max(x.seq), 1) "
        "FROM saga_decisions AS x WHERE x.saga_id = $1 AND x.seq <= $2 + 1)"
    )
}) AS h
WHERE seq > $2 AND seq <= $4 AND ($3::text[] IS NULL OR kind = ANY($3)) ORDER BY seq
"""

#: Its current run: seq 1 (its saga_started) and the events from its latest
#: run_continued on, up to last_seq ($2). The latest row holding a run_continued is one
#: probe of migration 0022's partial index; the run starts at its last run_continued.
_CURRENT_RUN: Final = f"""
WITH latest AS (
    SELECT r.seq, r.kinds FROM saga_decisions AS r
    WHERE r.saga_id = $1 AND 'run_continued' = ANY (r.kinds) AND r.seq <= $2
    ORDER BY r.seq DESC LIMIT 1
), run AS (
    SELECT coalesce(max(l.seq), 1) AS first_row,
           coalesce(max(l.seq + k.n::int - 1) FILTER (WHERE k.kind = 'run_continued'), 1)
               AS start
    FROM latest AS l CROSS JOIN LATERAL unnest(l.kinds) WITH ORDINALITY AS k (kind, n)
)
SELECT h.seq, h.data FROM run CROSS JOIN LATERAL ({
    history_sql("d.saga_id = $1 AND d.seq <= $2 AND (d.seq = 1 OR d.seq >= run.first_row)")
}) AS h
WHERE h.seq <= $2 AND (h.seq = 1 OR h.seq >= run.start)
ORDER BY h.seq
"""
#: Where its runs begin (migration 0022's partial index).
_RUN_STARTS: Final = """
SELECT r.seq + k.n::int - 1 AS seq
FROM saga_decisions AS r CROSS JOIN LATERAL unnest(r.kinds) WITH ORDINALITY AS k (kind, n)
WHERE r.saga_id = $1 AND 'run_continued' = ANY (r.kinds) AND k.kind = 'run_continued'
ORDER BY 1
"""


class PostgresReads:
    """Mixed into PostgresEventStore: the reads, over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]
    _codec: CodecChain | None
    _blob_store: BlobStore | None

    async def load(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        return await self._load(saga_id, _WHOLE_HISTORY, (saga_id,), undecodable)

    async def load_run(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        return await self._load(saga_id, _CURRENT_RUN, (saga_id,), undecodable)

    async def runs(self, saga_id: str) -> list[RunSpan]:
        check_lookup(saga_id)
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow("SELECT last_seq FROM sagas WHERE saga_id = $1", saga_id)
                if row is None:
                    raise SagaNotFound(saga_id)
                starts = await conn.fetch(_RUN_STARTS, saga_id)
        return run_spans([r["seq"] for r in starts if r["seq"] <= row["last_seq"]], row["last_seq"])

    async def load_after(
        self,
        saga_id: str,
        after_seq: int,
        *,
        kinds: Collection[str] | None = None,
        undecodable: Undecodable = Undecodable.RAISE,
    ) -> LoadedSaga:
        # The primary key (saga_id, seq) bounds the scan to the new rows.
        args = (saga_id, after_seq, None if kinds is None else list(kinds))
        return await self._load(saga_id, _HISTORY_AFTER, args, undecodable)

    async def _load(
        self, saga_id: str, events_sql: str, args: tuple[object, ...], undecodable: Undecodable
    ) -> LoadedSaga:
        """The saga's record and its events that ``events_sql`` selects (its last
        parameter: the record's last_seq)."""
        check_lookup(saga_id)
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(
                    f"SELECT {_RECORD_COLUMNS} FROM sagas WHERE saga_id = $1", saga_id
                )
                if row is None:
                    raise SagaNotFound(saga_id)
                record = _record(row, self._codec)
                # Consistent without a snapshot transaction: events up to last_seq were
                # committed with (or before) the row version just read, and history is
                # append-only, so this returns exactly the history the record describes,
                # ignoring any event appended since.
                event_rows = await conn.fetch(events_sql, *args, record.last_seq)
                events = await stored_events_of(
                    conn, event_rows, [saga_id], self._codec, self._blob_store, undecodable
                )
        return LoadedSaga(record, events)

    async def first_event(self, saga_id: str) -> StoredEvent:
        check_lookup(saga_id)
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                # The primary key (saga_id, seq) finds the one row.
                row = await conn.fetchrow(
                    "SELECT 1 AS seq, events -> 0 AS data FROM saga_decisions "
                    "WHERE saga_id = $1 AND seq = 1",
                    saga_id,
                )
                if row is None:
                    raise SagaNotFound(saga_id)
                found = await stored_events_of(
                    conn, [row], [saga_id], self._codec, self._blob_store
                )
        return found[0]

    async def get(self, saga_id: str) -> SagaRecord:
        check_lookup(saga_id)
        with _unavailable_as_transient():
            row = await self._pool.fetchrow(
                f"SELECT {_RECORD_COLUMNS} FROM sagas WHERE saga_id = $1", saga_id
            )
        if row is None:
            raise SagaNotFound(saga_id)
        return _record(row, self._codec)

    async def open_saga_ids(
        self, partitions: Collection[int] | None = None, partition_count: int = 0
    ) -> list[str]:
        if partitions is None:
            with _unavailable_as_transient():
                rows = await self._pool.fetch(
                    "SELECT saga_id FROM sagas WHERE status = ANY($1::text[]) ORDER BY saga_id",
                    _OPEN_STATUSES,
                )
            return [r["saga_id"] for r in rows]
        wanted = sorted(set(partitions))
        with _unavailable_as_transient():
            # The partial index on open sagas' key_hash; a saga created before migration
            # 0004 has no hash yet: it is matched here, hashed below, and given one.
            rows = await self._pool.fetch(
                "SELECT saga_id, key_hash FROM sagas WHERE status = ANY($1::text[]) "
                "AND (key_hash % $2 = ANY($3::int[]) OR key_hash IS NULL) ORDER BY saga_id",
                _OPEN_STATUSES,
                partition_count,
                wanted,
            )
            unhashed = [r["saga_id"] for r in rows if r["key_hash"] is None]
            if unhashed:
                await self._pool.execute(
                    "UPDATE sagas SET key_hash = u.h FROM unnest($1::text[], $2::int[]) "
                    "AS u(id, h) WHERE saga_id = u.id AND key_hash IS NULL",
                    unhashed,
                    [key_hash(i) for i in unhashed],
                )
        mine = set(wanted)
        return [
            r["saga_id"]
            for r in rows
            if r["key_hash"] is not None or partition_for(r["saga_id"], partition_count) in mine
        ]

    async def open_summary(self) -> OpenSummary:
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                # Index-only over (status, saga_id), open statuses only.
                counts = await conn.fetch(
                    "SELECT status, count(*) AS n FROM sagas WHERE status = ANY($1::text[]) "
                    "GROUP BY status",
                    _OPEN_STATUSES,
                )
                oldest = await conn.fetchval(
                    "SELECT min(updated_at) FROM sagas WHERE status = ANY($1::text[])",
                    _PARKED_STATUSES,
                )
        return OpenSummary(
            by_status={SagaStatus(r["status"]): int(r["n"]) for r in counts},
            oldest_parked_at=oldest,
        )

    async def due_wakeups(
        self,
        until: datetime,
        partitions: Collection[int] | None = None,
        partition_count: int = 0,
        limit: int = 1000,
        after: tuple[datetime, str] | None = None,
    ) -> list[tuple[str, datetime]]:
        # A range of the partial wake_at index (only sagas with a wake-up have one),
        # keyset-paged by (wake_at, saga_id): the slot, not the exact time, so that a
        # running saga's row is updated without touching the index (migration 0010). A
        # saga parked as nondeterministic keeps its wake-up but cannot act on it.
        clauses = ["wake_at <= $1", "status <> 'nondeterministic'"]
        args: list[object] = [as_utc(until)]

        def arg(value: object) -> str:
            args.append(value)
            return f"${len(args)}"

        if after is not None:
            clauses.append(f"(wake_at, saga_id) > ({arg(as_utc(after[0]))}, {arg(after[1])})")
        if partitions is not None:
            clauses.append(
                f"(key_hash % {arg(partition_count)} = ANY({arg(sorted(set(partitions)))}::int[]) "
                "OR key_hash IS NULL)"
            )
        sql = (
            f"SELECT saga_id, key_hash, wake_at FROM sagas WHERE {' AND '.join(clauses)} "
            f"ORDER BY wake_at, saga_id LIMIT {arg(limit)}"
        )
        with _unavailable_as_transient():
            rows = await self._pool.fetch(sql, *args)
        mine = set(partitions) if partitions is not None else None
        return [
            (r["saga_id"], r["wake_at"])
            for r in rows
            if mine is None
            or r["key_hash"] is not None
            or partition_for(r["saga_id"], partition_count) in mine
        ]
