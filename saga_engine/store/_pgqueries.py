"""The Postgres store's reads: one saga, its history, and the queries over many.

Every query over many sagas is answered by SQL with an index (migrations 0001, 0004),
never by reading rows into Python to filter them there.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime
from typing import Final, TypeAlias

import asyncpg

from saga_engine.core.history._codec import CodecChain, Undecodable
from saga_engine.core.history._status import SagaStatus
from saga_engine.kernel._errors import SagaNotFound
from saga_engine.kernel._partitioning import key_hash, partition_for
from saga_engine.store._blobs import BlobStore
from saga_engine.store._pgbase import (
    _OPEN_STATUSES,
    _RECORD_COLUMNS,
    EventRow,
    _record,
    _unavailable_as_transient,
    unnest_rows,
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
# hold the events it wants, by the primary key (saga_id, seq), and Python unnests them
# (``unnest_rows``), keeping the events the read asks for. ``events::json``: the rows'
# events come as their text (``_pgbase._init_connection``), each event read from it
# straight into its type (``_stored_events``).

#: A saga's whole history, up to its record's last_seq ($2).
_WHOLE_HISTORY: Final = "SELECT seq, kinds, events::json AS events FROM saga_decisions WHERE saga_id = $1 AND seq <= $2 ORDER BY seq"
#: Its rows holding events after a seq ($2), of some kinds ($3, null: all), up to
#: last_seq ($4): from the row holding event $2 + 1 on (one backward probe of the primary
#: key finds where it starts).
_HISTORY_AFTER: Final = """
SELECT seq, kinds, events::json AS events FROM saga_decisions
WHERE saga_id = $1 AND seq <= $4 AND seq >= (
    SELECT coalesce(max(x.seq), 1) FROM saga_decisions AS x WHERE x.saga_id = $1 AND x.seq <= $2 + 1)
  AND ($3::text[] IS NULL OR kinds && $3)
ORDER BY seq
"""
#: Its current run, up to last_seq ($2): the row of seq 1 (its saga_started) and the rows
#: from the latest holding a run_continued on (migration 0022's partial index finds it;
#: the run starts at its last run_continued, ``_current_run``).
_CURRENT_RUN: Final = """
SELECT seq, kinds, events::json AS events FROM saga_decisions
WHERE saga_id = $1 AND seq <= $2 AND (seq = 1 OR seq >= coalesce((
    SELECT max(r.seq) FROM saga_decisions AS r
    WHERE r.saga_id = $1 AND 'run_continued' = ANY (r.kinds) AND r.seq <= $2), 1))
ORDER BY seq
"""
#: Where its runs begin (migration 0022's partial index).
_RUN_STARTS: Final = """
SELECT r.seq + k.n::int - 1 AS seq
FROM saga_decisions AS r CROSS JOIN LATERAL unnest(r.kinds) WITH ORDINALITY AS k (kind, n)
WHERE r.saga_id = $1 AND 'run_continued' = ANY (r.kinds) AND k.kind = 'run_continued'
ORDER BY 1
"""

#: Picks the events a read returns from the history rows it read and the record's last_seq.
_Pick: TypeAlias = Callable[[list[asyncpg.Record], int], list[EventRow]]


def _whole(rows: list[asyncpg.Record], last_seq: int) -> list[EventRow]:
    return unnest_rows(rows, lambda seq, _kind: seq <= last_seq)


def _current_run(rows: list[asyncpg.Record], last_seq: int) -> list[EventRow]:
    """Event 1 and the events from the last run_continued on."""
    start = 1
    for r in rows:
        for i, kind in enumerate(r["kinds"]):
            if kind == "run_continued" and r["seq"] + i <= last_seq:
                start = r["seq"] + i
    return unnest_rows(rows, lambda seq, _kind: seq <= last_seq and (seq == 1 or seq >= start))


class PostgresReads:
    """Mixed into PostgresEventStore: the reads, over its pool."""

    _pool: asyncpg.Pool[asyncpg.Record]
    _codec: CodecChain | None
    _blob_store: BlobStore | None

    async def load(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        return await self._load(saga_id, _WHOLE_HISTORY, (saga_id,), _whole, undecodable)

    async def load_run(
        self, saga_id: str, *, undecodable: Undecodable = Undecodable.RAISE
    ) -> LoadedSaga:
        return await self._load(saga_id, _CURRENT_RUN, (saga_id,), _current_run, undecodable)

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
        wanted = None if kinds is None else list(kinds)

        def pick(rows: list[asyncpg.Record], last_seq: int) -> list[EventRow]:
            return unnest_rows(
                rows,
                lambda seq, kind: (
                    after_seq < seq <= last_seq and (wanted is None or kind in wanted)
                ),
            )

        args = (saga_id, after_seq, wanted)
        return await self._load(saga_id, _HISTORY_AFTER, args, pick, undecodable)

    async def _load(
        self,
        saga_id: str,
        rows_sql: str,
        args: tuple[object, ...],
        pick: _Pick,
        undecodable: Undecodable,
    ) -> LoadedSaga:
        """The saga's record and the events ``pick`` keeps of the history rows
        ``rows_sql`` selects (its last parameter: the record's last_seq)."""
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
                rows = await conn.fetch(rows_sql, *args, record.last_seq)
                events = await stored_events_of(
                    conn,
                    pick(rows, record.last_seq),
                    [saga_id],
                    self._codec,
                    self._blob_store,
                    undecodable,
                )
        return LoadedSaga(record, events)

    async def first_event(self, saga_id: str) -> StoredEvent:
        check_lookup(saga_id)
        with _unavailable_as_transient():
            async with self._pool.acquire() as conn:
                # The primary key (saga_id, seq) finds the one row.
                data = await conn.fetchval(
                    "SELECT events -> 0 FROM saga_decisions WHERE saga_id = $1 AND seq = 1",
                    saga_id,
                )
                if data is None:
                    raise SagaNotFound(saga_id)
                found = await stored_events_of(
                    conn, [(1, data)], [saga_id], self._codec, self._blob_store
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
            # The open sagas through (status, saga_id), the partitions' a filter (migration
            # 0025); a saga created before migration 0004 has no hash yet: it is matched
            # here, hashed below, and given one.
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
